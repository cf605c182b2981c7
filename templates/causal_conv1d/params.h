// SPDX-License-Identifier: Apache-2.0
// Parameter block of the causal_conv1d kernels (templates/causal_conv1d/causal_conv1d.cuh), shared
// with host code (lib/ops/causal_conv1d/). Plain data only: passed by value as the one kernel
// argument.
#pragma once

#include "templates/common/types.h"

namespace kjit {

/// How threads map to work.
enum class ConvMode : int {
  /// Prefill, out of place: one item per (span of kSpan tokens of a sequence, channel group).
  /// Span ids of sequence n start at floor(cu[n] / span) + n, so the ids of all sequences are
  /// disjoint and number floor(T / span) + N without knowing lengths on the host.
  chunked = 0,
  /// Prefill: one item per (sequence, channel group) walking the whole sequence; the in-place
  /// mode (each x row is read before the same thread overwrites it).
  sequential = 1,
  /// Decode update: one item per (row, channel group); rows of S tokens, or varlen rows of x
  /// [T, D] delimited by query_start_loc.
  rows = 2,
};

/// How a thread reads and writes the pool columns of its kVec channels.
enum class ConvStateAccess : int {
  /// One element at a time through any strides.
  scalar = 0,
  /// Channel-contiguous pool ([slots, L, D] buffers): one vector of kVec channels per column.
  channels = 1,
  /// [slots, D, W-1] contiguous (vLLM's layout, L = W - 1): the thread's kVec x (W - 1) elements
  /// are one contiguous block, moved as 16-byte vectors.
  block = 2,
};

/// Everything one launch reads. Strides in elements; offsets formed in 64 bits.
struct CausalConv1dParams {
  const void* x;
  void* out;
  const void* weight;
  /// nullptr: no bias.
  const void* bias;
  void* state;
  /// Prefill only.
  const void* cu_seqlens;
  const void* state_indices;
  /// Prefill; nullptr: every sequence has an initial state.
  const unsigned char* has_initial_state;
  /// Update; nullptr: no speculative offsets.
  const void* num_accepted;
  /// Update; nullptr: every row has num_tokens tokens at x_row_stride. Else x is [T, D] and row
  /// b is tokens query_start_loc[b]..query_start_loc[b + 1] - 1 (x_row_stride unused).
  const void* query_start_loc;

  /// Update: x[b, s, c] at b * x_row_stride + s * x_token_stride + c * x_channel_stride.
  /// Prefill and varlen update: x[t, c] at t * x_token_stride + c * x_channel_stride.
  i64 x_row_stride;
  i64 x_token_stride;
  i64 x_channel_stride;
  i64 out_row_stride;
  i64 out_token_stride;
  i64 out_channel_stride;
  i64 weight_channel_stride;
  i64 weight_tap_stride;
  i64 bias_stride;
  i64 state_slot_stride;
  i64 state_channel_stride;
  i64 state_col_stride;
  i64 cu_stride;
  i64 index_stride;
  i64 has_initial_stride;
  i64 accepted_stride;
  i64 query_start_stride;

  /// Slots of the pool; indices >= this are padding.
  i64 num_slots;
  /// Columns of the pool (L >= W - 1).
  i64 state_len;
  /// Prefill and varlen update: T. Update: S (tokens per row).
  i64 num_tokens;
  /// Prefill: N sequences. Update: B rows.
  i64 num_seqs;
  /// Work items: (spans or sequences or rows) x channel groups.
  u64 num_items;
  /// D / vec.
  u32 channel_groups;
  /// 1: index <= 0 is padding; 0: index < 0 is.
  u32 nonpositive_invalid;
  /// Element sizes (4 or 8) of cu_seqlens, the indices, num_accepted_tokens and
  /// query_start_loc.
  u32 cu_bytes;
  u32 index_bytes;
  u32 accepted_bytes;
  u32 query_start_bytes;
  /// kConvWeightBlock | kConvBiasVector, set per call from the weight and bias layouts.
  u32 vector_flags;
};

/// vector_flags: weight is a contiguous [D, W] whose vec x W blocks are whole, aligned 16-byte
/// vectors.
inline constexpr u32 kConvWeightBlock = 1;
/// vector_flags: bias is contiguous (stride 1) and aligned to vec elements (vec > 1).
inline constexpr u32 kConvBiasVector = 2;

/// Threads per block of every causal_conv1d kernel (the planner launches exactly this many).
inline constexpr int kConvBlockThreads = 128;

/// The staged chunked prefill: at most this many tokens of stages x chunk per thread, 16 bytes
/// each (48 KiB of shared memory per block of kConvBlockThreads). One rule for the template,
/// the spec check and the planner.
inline constexpr int kConvMaxStagedTokens = 24;

/// Shared memory of the staged prefill's batches for `tokens` = stages x chunk per thread.
inline constexpr i64 conv_staged_bytes(i64 tokens) { return tokens * 16 * kConvBlockThreads; }

}  // namespace kjit
