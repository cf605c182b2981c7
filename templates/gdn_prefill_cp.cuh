// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill, context-parallel path: the scan between the two passes of the
// state kernel over segments (gdn_prefill_state_cp_kernel, see CpWork in gdn_prefill_state.cuh).
//
// The state recurrence is affine in the state: over a segment, S_end = S_start M + B, where M
// [K, K] is the segment's end state from the identity with v = 0 and B [V, K] its end state from
// zero (both computed by the segment pass). Segment 0 ran from the sequence's real initial state,
// so its B is the exact state at its end. This kernel walks each sequence's segments in order,
// X_1 = B_0, X_{s+1} = X_s M_s + B_s, in f32, and stores every X_s (s >= 1), the exact initial
// state from which the resume pass reruns segment s. Nothing is approximated: no segment starts
// from an assumed state.
#pragma once

#include "kjit/common/types.h"
#include "kjit/gdn_prefill_params.h"

namespace kjit {

/// One block per (sequence n, value head hv, group of kGdnPrefillCpScanRows rows of V); a
/// sequence of fewer than 3 segments needs no product (X_1 = B_0) but still stores X_1.
template <typename Tcu, int kK, int kV>
__global__ void __launch_bounds__(kGdnPrefillCpScanThreads)
    gdn_prefill_cp_scan_kernel(const GdnPrefillParams p) {
  static_assert(kK == 64 || kK == 128, "the context-parallel path runs the wide state tiles");
  static_assert(kV % kGdnPrefillCpScanRows == 0, "row groups divide V");
  constexpr int kCols = kK / 16;
  constexpr int kGroups = kV / kGdnPrefillCpScanRows;
  __shared__ __align__(16) float s_rows[kGdnPrefillCpScanRows][kK];

  const u64 block = blockIdx.x;
  const int group = static_cast<int>(block % kGroups);
  const u32 hv = static_cast<u32>((block / kGroups) % p.num_value_heads);
  const i64 n = static_cast<i64>(block / (u64(kGroups) * p.num_value_heads));
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const i64 bos = i64(cu[n]), eos = i64(cu[n + 1]);
  const i64 span = p.cp_segment_chunks * kGdnPrefillChunk;
  const i64 segments = eos > bos ? (eos - bos + span - 1) / span : 0;
  if (segments < 2) return;
  const i64 z0 = bos / span + n;

  const int tid = static_cast<int>(threadIdx.x);
  const int r = tid / 16, c0 = (tid % 16) * kCols;
  const i64 hv_count = p.num_value_heads;
  // Element offset of this thread's columns in row (group rows + r) of a [V, K] state.
  const i64 row = (i64(hv) * kV + group * kGdnPrefillCpScanRows + r) * kK + c0;
  const auto vk = [&](float* base, i64 z) { return base + z * hv_count * kV * kK + row; };

  float acc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; c += 4) {
    const float4 x = *reinterpret_cast<const float4*>(vk(p.cp_b, z0) + c);
    acc[c] = x.x, acc[c + 1] = x.y, acc[c + 2] = x.z, acc[c + 3] = x.w;
  }
  for (i64 s = 1; s < segments; ++s) {
    const i64 z = z0 + s;
#pragma unroll
    for (int c = 0; c < kCols; c += 4) {
      *reinterpret_cast<float4*>(vk(p.cp_x, z) + c) =
          make_float4(acc[c], acc[c + 1], acc[c + 2], acc[c + 3]);
    }
    if (s == segments - 1) break;  // the resume pass computes the last segment's end itself
#pragma unroll
    for (int c = 0; c < kCols; ++c) s_rows[r][c0 + c] = acc[c];
    __syncthreads();
    // acc = B_z + X_z M_z: each thread's columns of its row, M's rows read through L1 (the
    // block's 8 rows read the same M row at once).
#pragma unroll
    for (int c = 0; c < kCols; c += 4) {
      const float4 x = *reinterpret_cast<const float4*>(vk(p.cp_b, z) + c);
      acc[c] = x.x, acc[c + 1] = x.y, acc[c + 2] = x.z, acc[c + 3] = x.w;
    }
    const float* m = p.cp_m + (z * hv_count + hv) * i64(kK) * kK + c0;
#pragma unroll 4
    for (int kk = 0; kk < kK; ++kk) {
      const float xs = s_rows[r][kk];
#pragma unroll
      for (int c = 0; c < kCols; c += 4) {
        const float4 mv = __ldg(reinterpret_cast<const float4*>(m + i64(kk) * kK + c));
        acc[c] = fmaf(xs, mv.x, acc[c]);
        acc[c + 1] = fmaf(xs, mv.y, acc[c + 1]);
        acc[c + 2] = fmaf(xs, mv.z, acc[c + 2]);
        acc[c + 3] = fmaf(xs, mv.w, acc[c + 3]);
      }
    }
    __syncthreads();
  }
}

}  // namespace kjit
