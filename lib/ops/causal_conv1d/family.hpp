// SPDX-License-Identifier: Apache-2.0
// causal_conv1d on the op skeleton (ops/op.hpp): the varlen prefill (causal_conv1d), the update
// (causal_conv1d_update) and the varlen update share one Problem, one planner and one kernel
// family. check.cpp validates a call into a Problem, plan.cpp plans it, launch.cpp fills the
// parameter block and holds the entry points; the kernel family and the catalog entries register
// themselves from catalog.cpp; causal_conv1d_reference.cpp is the float64 CPU reference.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/types.hpp"
#include "ops/op.hpp"
#include "ops/tensor_checks.hpp"
// After kjit/types.hpp: the params header declares kjit::i32 and friends.
#include "templates/causal_conv1d/params.h"

namespace kjit::ops::conv1d {

/// Tokens per work item of the chunked mode (the spec's `span`): the longest the planner picks,
/// the shortest it picks, and the longest options.force_span accepts (plan.cpp says why).
inline constexpr std::int64_t kSpanLongest = 64;
inline constexpr std::int64_t kSpanShortest = 8;
/// Below this DRAM bandwidth per SM (bytes per second) the prefill's longest span on Hopper is
/// kSpanLongest / 2 (the H100's 25.4 GB/s per SM: yes; the H200's 36.4: no).
inline constexpr std::int64_t kSpan32BelowBytesPerSmSecond = 30'000'000'000;
inline constexpr std::int64_t kSpanForcedLongest = 256;

/// Which op a call came through: the prefill, or the update (varlen or not: Problem::varlen).
enum class Op : std::uint8_t { prefill, update };

inline const char* op_name(Op op) {
  return op == Op::prefill ? "causal_conv1d" : "causal_conv1d_update";
}

/// The argument checks of a call of `op` (its errors name the op).
inline ArgChecks checks(Op op) { return ArgChecks(op_name(op)); }

/// A refusal of a call of `op` that no single argument's check expresses.
[[noreturn]] inline void fail(Op op, const std::string& message) { checks(op).fail(message); }

/// The pool's layout, read from its strides: `block` when each slot is a contiguous [D, W-1]
/// (vLLM's layout, L = W - 1), `channels` when channel-contiguous (the transposed [slots, L, D]
/// buffer), `other` for any other strides.
enum class PoolLayout : std::uint8_t { other = 0, channels = 1, block = 2 };

/// The arguments of one call, as the entry point received them. cu_seqlens and
/// has_initial_state are the prefill's (null otherwise), num_accepted_tokens the update's,
/// query_start_loc the varlen update's.
struct Args {
  Op op = Op::prefill;
  bool varlen = false;
  const TensorView* x = nullptr;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;
  const TensorView* conv_state = nullptr;
  const TensorView* cu_seqlens = nullptr;
  const TensorView* query_start_loc = nullptr;
  const TensorView* state_indices = nullptr;
  const TensorView* has_initial_state = nullptr;
  const TensorView* num_accepted_tokens = nullptr;
  const TensorView* out = nullptr;
  const CausalConv1dOptions* options = nullptr;
};

/// Everything a plan depends on: sizes, dtypes, options and what the pointers and strides allow
/// (not the pointers). The memo key.
struct Problem {
  std::int64_t width = 4;
  std::int64_t dim = 0;
  std::int64_t state_len = 0;
  /// Prefill and varlen update: T; update: S.
  std::int64_t tokens = 0;
  /// Prefill: N; update: B.
  std::int64_t seqs = 0;
  /// Widest channel vector the layouts of x and out allow (1 when either is not
  /// channel-contiguous), and what the plan says about it: the channel strides of x and out
  /// and, when both are 1, the alignment in bytes of their addresses and stepped-over strides.
  std::int64_t max_vec = 1;
  std::int64_t x_channel_stride = 1;
  std::int64_t out_channel_stride = 1;
  std::int64_t vec_align = 16;
  /// Alignment in bytes of the pool's address and of the strides its vector accesses step by.
  std::int64_t state_align = 1;
  /// -1: the planner picks; else an index into kCausalConv1dModes.
  std::int32_t forced_mode = -1;
  std::int32_t force_vec = 0;
  std::int32_t force_chunk = 0;
  std::int32_t force_span = 0;
  std::int32_t force_min_blocks = 0;
  std::int32_t force_stages = 0;
  Op op = Op::prefill;
  DType in = DType::bf16, out = DType::bf16, weight = DType::bf16, state = DType::bf16;
  PoolLayout state_layout = PoolLayout::other;
  bool in_place = false;
  bool silu = false;
  /// Update: rows delimited by query_start_loc (x [T, D]; `tokens` is T).
  bool varlen = false;
  /// Keeps the size a multiple of 8 with every byte a member (the memo hashes the bytes).
  std::uint8_t unused[7] = {};
};
static_assert(std::has_unique_object_representations_v<Problem> && sizeof(Problem) % 8 == 0);

/// The planner's decisions the launch needs, as values.
struct Choice {
  /// Channels per thread.
  std::int32_t vec = 1;
  /// Tokens per batch of loads.
  std::int32_t chunk = 0;
  /// Tokens per work item of the chunked mode (0 in the others).
  std::int32_t span = 0;
  ConvMode mode = ConvMode::rows;
};

struct Family {
  static constexpr const char* kName = "causal_conv1d";
  using Problem = conv1d::Problem;
  using Choice = conv1d::Choice;

  /// Validates a call (InvalidArgument naming the argument, its value and what is accepted).
  static Problem check(const Args& args);
  /// Pure: the plan for `problem` on a device with `limits` (PlanError for forced values that
  /// cannot run it).
  static Planned<Choice> plan(const Problem& problem, const DeviceLimits& limits);
  static std::size_t workspace_bytes(const Problem&, const Choice&) { return 0; }
  /// N or B = 0, or T = 0 where x is [T, D]: nothing to launch, no device needed.
  static bool launches_nothing(const Problem& p) {
    return p.seqs == 0 || ((p.op == Op::prefill || p.varlen) && p.tokens == 0);
  }
  static CausalConv1dParams params(const Args& args, const Problem& problem, const Choice& choice,
                                   void* workspace);
};

/// Work items of a mode: (span ids, sequences or rows) x channel groups.
std::uint64_t items_of(const Problem& p, ConvMode mode, std::int64_t vec, std::int64_t span);

/// The update's x or out as [B, S, D]: [B, D] is [B, 1, D] (the token stride is never stepped
/// over).
inline TensorView as_rows(const TensorView& v) {
  if (v.rank == 3) return v;
  TensorView t = v;
  t.rank = 3;
  t.shape[2] = v.shape[1];
  t.strides[2] = v.strides[1];
  t.shape[1] = 1;
  t.strides[1] = 0;
  return t;
}

/// Alignment in bytes (a power of two <= 16) of an address or a stride in bytes; 0 is 16.
inline std::int64_t align_of(std::uint64_t bytes) {
  return bytes == 0 ? 16 : std::min<std::int64_t>(16, std::int64_t{1} << std::countr_zero(bytes));
}

}  // namespace kjit::ops::conv1d

namespace kjit::reference {

// float64 CPU reference of the causal_conv1d family on host buffers described by TensorViews
// (any supported dtype, any strides): the ground truth of the unit and GPU tests and of the
// benchmark's check. Written from the formula in kjit/ops/causal_conv1d.hpp, independent of the
// kernel; the unit tests check it against a plain full convolution of each sequence.

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
