// SPDX-License-Identifier: Apache-2.0
// Float64 CPU reference of the Gated DeltaNet recurrence (reference/kernels.md sections 2 and
// 3.3), for tests and benchmarks. gdn_step is one (token, value head) step on a double state,
// so a token-by-token prefill reference is a loop over it.
#pragma once

#include <span>

#include "kjit/ops/gdn_decode.hpp"
#include "kjit/types.hpp"

namespace kjit::reference {

/// x above `threshold`, else log1p(exp(x)).
double gdn_softplus(double x, double threshold);
/// 1 / (1 + exp(-x)).
double gdn_sigmoid(double x);
/// g = -exp(a_log) * softplus(a + dt_bias): the log of the state's decay factor.
double gdn_log_decay(double a, double a_log, double dt_bias, double softplus_threshold);

/// One step of one (token, value head) on `state` [V][K] (K contiguous, updated in place):
/// q, k are normalized (x / sqrt(sum x^2 + 1e-6)) when `l2norm`, q is scaled by `scale`, then
/// H = exp(g) H; u = beta (v - H k); H += u k^T; out = H q. q and k have K elements, v and out V.
void gdn_step(std::span<double> state, std::span<const double> q, std::span<const double> k,
              std::span<const double> v, double g, double beta, double scale, bool l2norm,
              std::span<double> out);

/// gdn_decode on host memory: every view's data is a host pointer; same shapes, dtypes and
/// strides as the op accepts (not re-validated beyond what indexing needs). Invalid rows
/// (options.invalid_index, or index >= slots) write zeros and leave the pool untouched.
/// `out_f64`, when not empty, receives the unrounded outputs [B, HV, V] contiguous.
void gdn_decode_reference(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                          const TensorView& a_log, const TensorView& dt_bias,
                          const TensorView& state, const TensorView& state_indices,
                          const TensorView& out, const GdnDecodeOptions& options,
                          std::span<double> out_f64 = {});

/// gdn_decode_gated on host memory (g, beta f32 [B, HV]).
void gdn_decode_gated_reference(const TensorView& mixed_qkv, const TensorView& g,
                                const TensorView& beta, const TensorView& state,
                                const TensorView& state_indices, const TensorView& out,
                                const GdnDecodeOptions& options, std::span<double> out_f64 = {});

/// The fused decode step (options.conv set) on host memory, composed of the two references it
/// fuses: causal_conv1d_update's on mixed_qkv (as x [B, D]; options.conv's weight, bias,
/// conv_state and activation, options.invalid_index, state_indices), whose output is rounded to
/// mixed_qkv's dtype (as the two-kernel sequence stores it), then gdn_decode's (a_log and
/// dt_bias non-null) or gdn_decode_gated's (a, b = g, beta; a_log and dt_bias null) on that
/// output. Updates both pools in place.
void gdn_decode_conv_reference(const TensorView& mixed_qkv, const TensorView& a,
                               const TensorView& b, const TensorView* a_log,
                               const TensorView* dt_bias, const TensorView& state,
                               const TensorView& state_indices, const TensorView& out,
                               const GdnDecodeOptions& options, std::span<double> out_f64 = {});

}  // namespace kjit::reference
