// SPDX-License-Identifier: Apache-2.0
// Parameter block of the fused Gated DeltaNet decode step (templates/gdn_decode/conv.cuh: the
// causal conv update and the delta rule in one kernel), shared with host code
// (lib/ops/gdn_decode/conv.cpp).
#pragma once

#include "templates/common/types.h"
#include "templates/gdn_decode/params.h"

namespace kjit {

/// Arguments of one fused decode step. Pointers are typed by the kernel's template parameters;
/// strides are in elements of the tensor they belong to.
struct GdnDecodeConvParams {
  /// [B, D] rows of [q | k | v] *before* the convolution, D = 2*H*K + HV*V; last dim contiguous.
  const void* qkv;
  /// As GdnDecodeParams: a, b [B, HV] (raw form) or g, beta (gated form); a_log, dt_bias [HV].
  const void* a;
  const void* b;
  const void* a_log;
  const void* dt_bias;
  /// [num_slots, HV, V, K] pool, inner [HV, V, K] contiguous; updated in place.
  void* state;
  /// [B] slot of each row, in both pools.
  const void* indices;
  /// [B, HV, V]; inner [HV, V] contiguous.
  void* out;
  /// [D, W] conv weight, [D] bias (nullptr: none), [num_slots, D, L] conv pool (in place).
  const void* conv_weight;
  const void* conv_bias;
  void* conv_state;
  i64 qkv_row_stride;
  i64 a_row_stride;
  i64 b_row_stride;
  i64 state_slot_stride;
  i64 index_stride;
  i64 out_row_stride;
  i64 weight_channel_stride;
  i64 weight_tap_stride;
  i64 bias_stride;
  i64 conv_slot_stride;
  i64 conv_channel_stride;
  i64 conv_column_stride;
  /// Slots in each pool: an index >= num_slots is treated as invalid (neither pool written).
  i64 num_slots;
  u32 batch;
  u32 num_heads;
  u32 num_value_heads;
  /// HV / H: value heads per q/k head (the value heads of one block).
  u32 heads_per_group;
  float scale;
  float softplus_threshold;
};

/// The fused step's cluster sizes (blocks per (row, q/k head); 1: no cluster): the template's
/// and the op's checks of a size, one list.
constexpr bool gdn_decode_conv_cluster_size(long long c) {
  return c == 1 || c == 2 || c == 4 || c == 8;
}

/// State rows a warp of the fused step holds per register set (two sets in flight): 4 up to
/// K = 128, 1 at K = 256 (64 registers a thread). The kernel's kRows; the planner sizes clustered
/// blocks' warps by it.
constexpr int gdn_decode_conv_rows_per_set(int k) { return k <= 128 ? 4 : 1; }

/// The fused step's ring stages (0: no ring, the state rows in two register sets).
constexpr bool gdn_decode_conv_stage_count(long long s) { return s == 0 || (s >= 2 && s <= 4); }

#ifndef __CUDACC_RTC__
/// Shared-memory floats of one block of the fused step: q [K], k [K], v [G V], alpha [G],
/// beta [G] (G = HV / H), and in a cluster of `cluster` > 1 blocks the new pool columns of the
/// block's share of the q/k channels, [2K / cluster][W - 1].
constexpr long long gdn_decode_conv_smem_floats(long long k, long long v, long long group,
                                                long long width, long long cluster) {
  return 2 * k + group * (v + 2) + (cluster > 1 ? 2 * k / cluster * (width - 1) : 0);
}

/// Shared-memory bytes of one block of the fused step: the floats above, and with a ring of
/// `stages` > 0 (unclustered) from the next 16-byte boundary `stages` sets of
/// gdn_decode_conv_rows_per_set(k) state rows of K elements of `state_bytes` per warp.
constexpr long long gdn_decode_conv_smem_bytes(long long k, long long v, long long group,
                                               long long width, long long cluster, long long warps,
                                               long long stages, long long state_bytes) {
  const long long floats = gdn_decode_conv_smem_floats(k, v, group, width, cluster);
  if (stages == 0) return 4 * floats;
  return (floats + 3) / 4 * 16 +
         stages * warps * gdn_decode_conv_rows_per_set(static_cast<int>(k)) * k * state_bytes;
}
#endif

}  // namespace kjit
