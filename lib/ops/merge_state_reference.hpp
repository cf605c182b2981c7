// SPDX-License-Identifier: Apache-2.0
// float64 CPU reference of the merge_state family, on host buffers described by TensorViews
// (any supported dtype, any strides). The ground truth of the unit and GPU tests and of the
// benchmark's correctness check; written from the formula, independent of the kernel.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kjit/ops/merge_state.hpp"
#include "kjit/types.hpp"

namespace kjit::reference {

/// Normalized weights of merged states and the merged LSE.
struct MergeWeights {
  std::vector<double> weights;
  double lse = 0.0;
};

/// The weights of states with log-sum-exps `lse` in `base`: the definition every entry point
/// follows. -inf (and +inf when pos_inf_as_empty) is empty: weight 0. All empty: weights 0,
/// lse -inf. Otherwise, if some LSE is +inf (pos_inf_as_empty false), the +inf states share
/// the weight equally and lse is +inf; else w_i = b^(s_i - m) / sum_j b^(s_j - m),
/// lse = m + log_b(sum_j b^(s_j - m)).
MergeWeights merge_weights(std::span<const double> lse, LseBase base, bool pos_inf_as_empty);

/// A merged result in float64, contiguous: v [T, H, D], s [T, H] (token-major whatever the
/// LSE layout of the inputs).
struct MergeResult {
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::vector<double> v;
  std::vector<double> s;

  double v_at(std::int64_t t, std::int64_t h, std::int64_t d) const {
    return v[static_cast<std::size_t>((t * heads + h) * head_dim + d)];
  }
  double s_at(std::int64_t t, std::int64_t h) const {
    return s[static_cast<std::size_t>(t * heads + h)];
  }
};

/// merge_state on host tensors (shapes as in kjit::merge_state; options.lse_base must be set).
MergeResult merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                        const TensorView& s_b, const MergeStateOptions& options);

/// The values (v, s) hold after merge_state_in_place: rows of tokens with mask 0 keep their
/// old values. `mask` may have data == nullptr (every token merged).
MergeResult merge_state_in_place(const TensorView& v, const TensorView& s,
                                 const TensorView& v_other, const TensorView& s_other,
                                 const TensorView& mask, const MergeStateOptions& options);

/// merge_states on host tensors: v [T, S, H, D], s [T, S, H] or [H, T, S].
MergeResult merge_states(const TensorView& v, const TensorView& s,
                         const MergeStateOptions& options);

/// Writes a result into host tensors of any supported dtype (round to nearest even); s_out may
/// have data == nullptr. s_out's layout follows `layout`.
void store(const MergeResult& result, const TensorView& v_out, const TensorView& s_out,
           LseLayout layout);

}  // namespace kjit::reference
