// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill, context-parallel path: the scan between the two passes of the
// state kernel over segments (gdn_prefill_state_cp_kernel, see CpWork in state.cuh).
//
// The state recurrence is affine in the state: over a segment, S_end = S_start M + B, where M
// [K, K] is the segment's end state from the identity with v = 0 and B [V, K] its end state from
// zero (both computed by the segment pass). Segment 0 ran from the sequence's real initial state,
// so its B is the exact state at its end. This kernel walks each sequence's segments in order,
// X_1 = B_0, X_{s+1} = X_s M_s + B_s, in f32, and stores every X_s (s >= 1), the exact initial
// state from which the resume pass reruns segment s. Nothing is approximated: no segment starts
// from an assumed state.
#pragma once

#include "templates/common/cp_async.cuh"
#include "templates/common/types.h"
#include "templates/gdn_prefill/params.h"

namespace kjit {

/// One block per (sequence n, value head hv, kGdnPrefillCpScanRows rows of the state); a sequence
/// of fewer than 3 segments needs no product (X_1 = B_0) but still stores X_1. The chain is
/// latency-bound (one product per segment, each waiting for the last): M streams through a ring
/// of kGdnPrefillCpScanStages shared-memory tiles of 32 of its rows by cp.async, issued
/// kGdnPrefillCpScanStages - 1 tiles ahead across segments, and B_(z+1) is loaded during the
/// product of segment z. Each lane holds 4 columns of several rows, so every float4 of M read
/// from shared memory feeds that many rows: with one row per thread the block re-read all of M
/// per row, and the scan was bound by shared-memory bandwidth (H200, Nsight Compute: L1 88% busy,
/// 72 us for 7 segments at 16 value heads).
template <typename Tcu, int kK, int kV>
__global__ void __launch_bounds__(kGdnPrefillCpScanThreads)
    gdn_prefill_cp_scan_kernel(const GdnPrefillParams p) {
  static_assert(kK == 64 || kK == 128, "the context-parallel path runs the wide state tiles");
  constexpr int kRows = kGdnPrefillCpScanRows, kThreads = kGdnPrefillCpScanThreads;
  constexpr int kStages = kGdnPrefillCpScanStages;
  static_assert(kV % kRows == 0, "row groups divide V");
  constexpr int kColGroups = kK / 4;                 // lanes over K, 4 columns each
  constexpr int kRowGroups = kThreads / kColGroups;  // 4 (K = 128) or 8 (K = 64)
  constexpr int kRowsPer = kRows / kRowGroups;       // rows per thread
  static_assert(kRowsPer * kRowGroups == kRows, "row groups tile the block's rows");
  constexpr int kRowTiles = kV / kRows;
  constexpr int kTileRows = 32;                 // rows of M per stage
  constexpr int kTiles = kK / kTileRows;        // stages per segment
  constexpr int kTileVec = kTileRows * kK / 4;  // float4 per stage
  static_assert(kTileVec % kThreads == 0, "whole float4 copies per thread");
  static_assert(gdn_prefill_cp_scan_smem(kK) == u32(kStages) * kTileRows * kK * 4, "smem size");
  __shared__ __align__(16) float s_rows[kRows][kK + 4];  // +4: rows start on distinct banks
  extern __shared__ __align__(16) float s_m[];           // [kStages][kTileRows][kK]

  const u64 block = blockIdx.x;
  const int row_tile = static_cast<int>(block % kRowTiles);
  const u32 hv = static_cast<u32>((block / kRowTiles) % p.num_value_heads);
  const i64 n = static_cast<i64>(block / (u64(kRowTiles) * p.num_value_heads));
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const i64 bos = i64(cu[n]), eos = i64(cu[n + 1]);
  const i64 span = p.cp_segment_chunks * kGdnPrefillChunk;
  const i64 segments = eos > bos ? (eos - bos + span - 1) / span : 1;
  if (segments < 2) return;
  const i64 z0 = bos / span + n;

  const int tid = static_cast<int>(threadIdx.x);
  const int r0 = (tid / kColGroups) * kRowsPer, c0 = (tid % kColGroups) * 4;
  const i64 hv_count = p.num_value_heads;
  // This thread's 4 columns of row r0 + i of the block's rows in a [V, K] state.
  const auto vk = [&](float* base, i64 z, int i) {
    return base + z * hv_count * kV * kK + (i64(hv) * kV + row_tile * kRows + r0 + i) * kK + c0;
  };
  // Products needed: segments 1 .. S - 2 (X_1 = B_0; the last segment's map is never used).
  const i64 tiles_total = (segments - 2) * kTiles;
  const auto issue_tile = [&](i64 q) {
    if (q < tiles_total) {
      const i64 z = z0 + 1 + q / kTiles;
      const float4* src = reinterpret_cast<const float4*>(
          p.cp_m + (z * hv_count + hv) * i64(kK) * kK + (q % kTiles) * kTileRows * kK);
      float4* dst = reinterpret_cast<float4*>(s_m + (q % kStages) * kTileRows * kK);
#pragma unroll
      for (int it = 0; it < kTileVec / kThreads; ++it) {
        const int e = tid + it * kThreads;
        cp_async::copy16(dst + e, src + e);
      }
    }
    cp_async::commit();  // (empty past the last tile: the wait counts stay uniform)
  };
#pragma unroll
  for (int q = 0; q < kStages - 1; ++q) issue_tile(q);

  const auto load_b = [&](float4(&x)[kRowsPer], i64 z) {
#pragma unroll
    for (int i = 0; i < kRowsPer; ++i) x[i] = *reinterpret_cast<const float4*>(vk(p.cp_b, z, i));
  };
  float4 acc[kRowsPer], b_next[kRowsPer];
  load_b(acc, z0);
  if (segments > 2) load_b(b_next, z0 + 1);
  i64 q = 0;
  for (i64 s = 1; s < segments; ++s) {
    const i64 z = z0 + s;
#pragma unroll
    for (int i = 0; i < kRowsPer; ++i) *reinterpret_cast<float4*>(vk(p.cp_x, z, i)) = acc[i];
    if (s == segments - 1) break;  // the resume pass computes the last segment's end itself
#pragma unroll
    for (int i = 0; i < kRowsPer; ++i) *reinterpret_cast<float4*>(&s_rows[r0 + i][c0]) = acc[i];
      // acc = B_z + X_z M_z; B_(z+1) is loaded meanwhile.
#pragma unroll
    for (int i = 0; i < kRowsPer; ++i) acc[i] = b_next[i];
    if (s + 1 < segments - 1) load_b(b_next, z + 1);
#pragma unroll 1
    for (int tile = 0; tile < kTiles; ++tile, ++q) {
      issue_tile(q + kStages - 1);
      cp_async::wait<kStages - 1>();
      __syncthreads();  // stage q (every thread's copies) and s_rows are visible
      const float* m = s_m + (q % kStages) * kTileRows * kK + c0;
#pragma unroll 8
      for (int kr = 0; kr < kTileRows; ++kr) {
        const float4 mv = *reinterpret_cast<const float4*>(m + kr * kK);
#pragma unroll
        for (int i = 0; i < kRowsPer; ++i) {
          const float xs = s_rows[r0 + i][tile * kTileRows + kr];
          acc[i].x = fmaf(xs, mv.x, acc[i].x);
          acc[i].y = fmaf(xs, mv.y, acc[i].y);
          acc[i].z = fmaf(xs, mv.z, acc[i].z);
          acc[i].w = fmaf(xs, mv.w, acc[i].w);
        }
      }
      __syncthreads();  // stage q's buffer and s_rows are free again
    }
  }
  cp_async::wait<0>();
}

}  // namespace kjit
