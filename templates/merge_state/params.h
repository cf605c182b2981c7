// SPDX-License-Identifier: Apache-2.0
// Parameter block of the merge_state kernels (templates/merge_state/merge_state.cuh), shared with
// host code (lib/ops/merge_state.cpp). Plain data only: it is passed by value as the one kernel
// argument.
#pragma once

#include "templates/common/types.h"

#if defined(__CUDACC__)
#define KJIT_MERGE_HD __host__ __device__ __forceinline__
#else
#define KJIT_MERGE_HD inline
#endif

namespace kjit {

/// How threads map to (token, head) rows.
enum class MergeGridMode : int {
  /// grid (T, head groups), block (lanes, heads per group): one block per token and head tile.
  token_major = 0,
  /// grid (ceil(T*H / rows per block)), block (lanes, rows per block): rows packed densely.
  flat = 1,
};

/// Which of the three entry points the kernel implements.
enum class MergeOp : int {
  /// (v_a, s_a) + (v_b, s_b) -> (v_out, s_out).
  pair = 0,
  /// (v_a, s_a) += (v_b, s_b) where mask[t] != 0 (v_out == v_a, s_out == s_a).
  in_place = 1,
  /// num_states states at v_a + i * v_state_stride -> (v_out, s_out).
  many = 2,
};

/// Base of the log-sum-exp values.
enum class MergeBase : int { two = 0, e = 1 };

/// Everything one merge_state launch reads. Strides are in elements; the last dimension of
/// every v tensor is contiguous. Offsets are computed in 64 bits.
struct MergeStateParams {
  const void* v_a;
  const void* v_b;
  void* v_out;
  const float* s_a;
  const float* s_b;
  /// nullptr: the merged LSE is not written.
  float* s_out;
  /// in_place only; nullptr: every row is merged.
  const unsigned char* mask;

  i64 v_a_token_stride;
  i64 v_a_head_stride;
  i64 v_b_token_stride;
  i64 v_b_head_stride;
  i64 v_out_token_stride;
  i64 v_out_head_stride;
  i64 s_a_token_stride;
  i64 s_a_head_stride;
  i64 s_b_token_stride;
  i64 s_b_head_stride;
  i64 s_out_token_stride;
  i64 s_out_head_stride;
  i64 mask_stride;
  /// many only: distance between consecutive states of v_a / s_a.
  i64 v_state_stride;
  i64 s_state_stride;

  i64 num_tokens;
  /// flat mode: num_tokens * num_heads (< 2^32, checked by the planner).
  u64 num_rows;
  u32 num_heads;
  u32 num_states;
  /// flat mode: row / num_heads == merge_fast_div(row, head_div_magic, head_div_shift).
  u32 head_div_magic;
  u32 head_div_shift;
};

/// Division of a 32-bit numerator by a fixed divisor d >= 1 with one multiply-high: with
/// s = ceil(log2 d) and magic = floor(2^32 * (2^s - d) / d) + 1, n / d == (mulhi(n, magic) + n)
/// >> s for every n < 2^32 when the sum is formed in 64 bits (the "round-up" method of Granlund
/// and Montgomery). Avoids a division per thread in flat mode.
struct MergeDivMagic {
  u32 magic;
  u32 shift;
};

KJIT_MERGE_HD MergeDivMagic merge_div_magic(u32 divisor) {
  u32 shift = 0;
  while (shift < 32 && (u64(1) << shift) < u64(divisor)) ++shift;
  const u64 magic = ((u64(1) << 32) * ((u64(1) << shift) - u64(divisor))) / u64(divisor) + 1;
  return MergeDivMagic{u32(magic), shift};
}

KJIT_MERGE_HD u32 merge_fast_div(u32 numerator, u32 magic, u32 shift) {
  const u64 high = (u64(numerator) * u64(magic)) >> 32;
  return u32((high + u64(numerator)) >> shift);
}

}  // namespace kjit
