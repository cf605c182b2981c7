// SPDX-License-Identifier: Apache-2.0
// float64 CPU reference of the causal_conv1d family on host buffers described by TensorViews
// (any supported dtype, any strides): the ground truth of the unit and GPU tests and of the
// benchmark's check. Written from the formula in kjit/ops/causal_conv1d.hpp, independent of the
// kernel; the unit tests check it against a plain full convolution of each sequence.
#pragma once

#include <vector>

#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/types.hpp"

namespace kjit::reference {

/// causal_conv1d on host tensors: returns out [T, D] as row-major doubles (zero rows for
/// padding sequences) and updates `conv_state` in place the way the op updates the device pool
/// (values rounded to the pool's dtype, so a correct kernel's pool matches bytewise).
std::vector<double> causal_conv1d(const TensorView& x, const TensorView& weight,
                                  const TensorView& bias, const TensorView& conv_state,
                                  const TensorView& cu_seqlens, const TensorView& state_indices,
                                  const TensorView& has_initial_state,
                                  const CausalConv1dOptions& options);

/// causal_conv1d_update on host tensors: returns out [B, S, D] as row-major doubles and updates
/// `conv_state` in place. num_accepted_tokens may have data == nullptr.
std::vector<double> causal_conv1d_update(const TensorView& x, const TensorView& weight,
                                         const TensorView& bias, const TensorView& conv_state,
                                         const TensorView& state_indices,
                                         const TensorView& num_accepted_tokens,
                                         const CausalConv1dOptions& options);

/// causal_conv1d_update_varlen on host tensors: returns out [T, D] as row-major doubles (zero
/// rows for padding rows; `untouched` for tokens outside every row, which the op does not
/// write) and updates `conv_state` in place.
std::vector<double> causal_conv1d_update_varlen(
    const TensorView& x, const TensorView& weight, const TensorView& bias,
    const TensorView& conv_state, const TensorView& query_start_loc,
    const TensorView& state_indices, const TensorView& num_accepted_tokens,
    const CausalConv1dOptions& options, double untouched = 0.0);

}  // namespace kjit::reference
