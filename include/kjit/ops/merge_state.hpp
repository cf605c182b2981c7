// SPDX-License-Identifier: Apache-2.0
// merge_state: combines partial attention outputs of the same (token, head) rows, computed over
// disjoint key sets (cascade / split-KV / prefix + suffix attention), using their log-sum-exp.
//
// Per (t, h) with base b: m = max(s_i), w_i = b^(s_i - m) / sum_j b^(s_j - m),
// v = sum_i w_i v_i (fp32 math, rounded to v_out's dtype), s = m + log_b(sum_j b^(s_j - m)).
// A state with s = -inf is empty: weight 0, its v is never read into the result. All states
// empty -> v = 0, s = -inf. No finite or infinite LSE produces a NaN.
#pragma once

#include <optional>
#include <string>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"
#include "kjit/types.hpp"

namespace kjit {

class Runtime;

/// Base of the log-sum-exp values. It must be the base the attention kernel that produced them
/// used: FlashInfer returns base 2, FlashAttention / SGLang / vLLM base e.
enum class LseBase : std::uint8_t { two, e };

/// Memory order of the LSE tensors.
enum class LseLayout : std::uint8_t {
  /// s[T, H] (FlashInfer, SGLang); merge_states: s[T, S, H].
  token_major,
  /// s[H, T] (vLLM, FlashAttention varlen softmax_lse); merge_states: s[H, T, S].
  head_major,
};

/// Options shared by the merge_state entry points.
struct MergeStateOptions {
  /// Required. Unset -> InvalidArgument: both bases are in wide use and a wrong guess is silently
  /// wrong (weights e^s instead of 2^s), so there is no safe default.
  std::optional<LseBase> lse_base;
  LseLayout lse_layout = LseLayout::token_major;
  /// true: an LSE of +inf marks an empty state, like -inf (FlashAttention-2 returns +inf for
  /// rows without keys). false: +inf is kept; the +inf states then share all the weight equally
  /// and the merged LSE is +inf.
  bool pos_inf_as_empty = true;
  /// Empty: the planner picks the fastest legal grid mode. Otherwise "token_major" or "flat"
  /// (for tests and benchmarks); PlanError if that mode is not legal for the problem. Either
  /// may be followed by ":c<n>" (n vectors per thread: 1, 2, 4) and ":t<n>" (blocks of n
  /// threads, a power of 2 in 32..512; a block still holds at least one row), e.g.
  /// "flat:c1:t128", to A/B a geometry the planner would not pick.
  std::string force_mode;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
};

/// The grid modes force_mode accepts.
inline constexpr const char* kMergeStateModes[] = {"token_major", "flat"};

/// Out of place: (v_a, s_a) and (v_b, s_b) -> (v_out, s_out). v_*: [T, H, D] with D a multiple
/// of 8 in 8..1024, dtype f16, bf16 or f32 (v_a and v_b alike); v_out has v_a's dtype or f32.
/// s_*: f32 [T, H] or [H, T] per options.lse_layout. s_out may be a view with data == nullptr:
/// the merged LSE is then not written. Any token and head strides; the last dimension must be
/// contiguous. Enqueued on `stream`; T == 0 launches nothing.
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 const MergeStateOptions& options, Stream stream = nullptr);

/// In place: (v, s) <- merge((v, s), (v_other, s_other)) for the tokens whose mask[t] != 0.
/// mask: u8 [T], or a view with data == nullptr for all tokens. Rows with mask 0 are untouched.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask,
                          const MergeStateOptions& options, Stream stream = nullptr);

/// S states at once: v [T, S, H, D], s f32 [T, S, H] (token_major) or [H, T, S] (head_major)
/// -> v_out [T, H, D], s_out [T, H] / [H, T] (optional as in merge_state). S == 0 gives v = 0,
/// s = -inf; S == 1 copies (an empty state still becomes v = 0, s = -inf).
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, const MergeStateOptions& options,
                  Stream stream = nullptr);

/// The plan merge_state would launch on a device with `limits`; launches nothing, needs no GPU.
/// options.device and options.runtime are ignored.
Plan plan_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                      const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                      const MergeStateOptions& options, const DeviceLimits& limits);

/// The plan merge_state_in_place would launch (see plan_merge_state).
Plan plan_merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                               const TensorView& s_other, const TensorView& mask,
                               const MergeStateOptions& options, const DeviceLimits& limits);

/// The plan merge_states would launch (see plan_merge_state).
Plan plan_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                       const TensorView& s_out, const MergeStateOptions& options,
                       const DeviceLimits& limits);

}  // namespace kjit
