// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill, chunked path, kernel 2 of 2: the sequential part. One block
// per (sequence n, value head hv, value tile of kBV rows) walks the sequence's chunks carrying
// the f32 state tile S [kBV, K] in registers (mma accumulator layout, as in the fused kernel of
// gdn_prefill.cuh). Per chunk, with T', P and the scales from the chunk kernel
// (chunk.cuh) and q, k the raw bf16 rows:
//   R   = V - diag(e^gamma / |k|) K S^T                         (mma over K)
//   Vn  = T' R                    (= U - W S^T of the WY form; T' = (I + A)^-1 diag(beta))
//   O   = scale (diag(e^gamma / |q|) Q S^T + P Vn)
//   S  <- e^gamma_last S + sum_j (e^(gamma_last - gamma_j) / |k_j|) Vn_j k_j^T
// Only this S-dependent work is on the sequential path; the chunk's inputs (q, k, v, T', P and
// the scales) stream into shared memory with cp.async while earlier chunks compute.
//
// Two layouts (gdn_prefill_state_wide): the wide tiles (64 and 128 rows, K <= 128) give each
// warp 16 rows of V and keep every product of the chain in registers (state_wide, one barrier
// per chunk); the tiles of 16 and 32 rows split each product over 4 warps and pass R^T, Vn^T and
// the state copy through shared memory (state_tiles, three barriers per chunk). Compiled for
// sm_90a, the wide tiles run the same chain on warpgroup wgmma instead of mma.sync.
//
// Rows past the end of a sequence are zero-filled (q, k, v, T', P and scales): their R, Vn
// and contributions are exactly zero, and their outputs are not stored.
#pragma once

#include <cuda_bf16.h>

#include "templates/common/cp_async.cuh"
#include "templates/common/grid_dependency.cuh"
#include "templates/common/mbarrier.cuh"
#include "templates/common/mma.cuh"
#include "templates/common/named_barrier.cuh"
#include "templates/common/swizzle.cuh"
#include "templates/common/tma.cuh"
#include "templates/common/vec.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "templates/common/wgmma.cuh"
// sm_90a (the planner's choice for the whole-V tile at K = V = 128 on compute capability 9.0,
// or asked for by a "_wgmma" mode): the wide tiles' products run as warpgroup wgmma, which reads
// each B tile (k, q, T', P) from 128-byte-swizzled shared memory once per four warps instead of
// once per warp through ldmatrix. On the H200 6-17% less per call than the mma.sync tile that
// forms P itself (docs/performance.md, "The wgmma state kernel's tiles, swizzled").
#define KJIT_GDN_STATE_WGMMA 1
#else
#define KJIT_GDN_STATE_WGMMA 0
#endif
#include "templates/gdn_prefill/gdn_prefill.cuh"
#include "templates/gdn_prefill/params.h"

namespace kjit {
namespace gdn_prefill_detail {

/// What a state-kernel block works on, the same for both layouts: its sequence n (in rank order
/// when the chunk kernel ranked them: longest first, see rank_sequences_longest_first), value
/// head hv with its key head h, value tile vt starting at row v0; the sequence's tokens
/// [bos, eos), pool slot and whether it is padding or starts from the pool; and where the
/// chunks' rows come from (raw q, k, v; T', P and scales in the workspace).
struct StateWork {
  u64 n;
  u32 hv, h;
  int vt, v0;
  i64 bos, eos, slot;
  bool padded, has_init;
  const __nv_bfloat16 *q_g, *k_g, *v_g, *t_g, *p_g;
  const float4* sc_g;
};

/// The sequence of rank `rank` among the first p.num_seqs (<= kThreads), longest first (by chunk
/// count, ties by index: the order rank_sequences_longest_first gives), found by the block's
/// threads, one per sequence, through `scratch` (kThreads + 1 i64 of shared memory, free again
/// when this returns). Reads only cu_seqlens, so it runs before the wait for the chunk kernel.
template <typename Tcu, int kThreads>
__device__ __forceinline__ u64 ranked_sequence(const GdnPrefillParams& p, u64 rank, i64* scratch) {
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const int seqs = static_cast<int>(p.num_seqs);
  const int i = static_cast<int>(threadIdx.x);
  i64 chunks = 0;
  if (i < seqs) {
    chunks = (i64(cu[i + 1]) - i64(cu[i]) + kGdnPrefillChunk - 1) / kGdnPrefillChunk;
    scratch[i] = chunks;
  }
  __syncthreads();
  if (i < seqs) {
    u64 mine = 0;
    for (int j = 0; j < seqs; ++j) {
      const i64 other = scratch[j];
      mine += (other > chunks || (other == chunks && j < i)) ? 1 : 0;
    }
    if (mine == rank) scratch[kThreads] = i;
  }
  __syncthreads();
  const u64 n = u64(scratch[kThreads]);
  __syncthreads();  // the caller's first shared-memory writes may overlap the scratch
  return n;
}

/// The block's work. Sequences ranked by the block itself (2 to kGdnPrefillRankInStateMaxSeqs,
/// whatever ws_order says) or in index order (ws_order null) need nothing from the chunk kernel;
/// ranks from the workspace are read after waiting for it. `scratch`: shared memory for
/// ranked_sequence.
template <typename Tcu, typename Tidx, int kThreads>
__device__ __forceinline__ StateWork state_work(const GdnPrefillParams& p, int bv, i64* scratch) {
  static_assert(kThreads >= int(kGdnPrefillRankInStateMaxSeqs),
                "every state-kernel block must be able to rank the sequences it is given");
  StateWork w;
  const u64 tiles = p.v_tiles;
  const u64 block = blockIdx.x;
  const u64 rank = block / (tiles * p.num_value_heads);
  if (p.num_seqs > 1 && p.num_seqs <= kGdnPrefillRankInStateMaxSeqs) {
    w.n = ranked_sequence<Tcu, kThreads>(p, rank, scratch);
  } else if (p.ws_order != nullptr) {
    grid_dependency::wait_for_previous_grid();
    w.n = u64(static_cast<const int*>(p.ws_order)[rank]);
  } else {
    w.n = rank;
  }
  w.hv = static_cast<u32>((block / tiles) % p.num_value_heads);
  w.h = w.hv / p.heads_per_group;
  w.vt = static_cast<int>(block % tiles);
  w.v0 = w.vt * bv;
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  w.bos = static_cast<i64>(cu[w.n]);
  w.eos = static_cast<i64>(cu[w.n + 1]);
  w.slot = static_cast<i64>(static_cast<const Tidx*>(p.state_indices)[i64(w.n) * p.index_stride]);
  w.padded = w.slot < 0 || w.slot >= p.num_slots;
  w.has_init = !w.padded && (p.has_initial_state == nullptr ||
                             p.has_initial_state[i64(w.n) * p.has_init_stride] != 0);
  w.q_g = static_cast<const __nv_bfloat16*>(p.q) + i64(w.h) * p.q_stride_h;
  w.k_g = static_cast<const __nv_bfloat16*>(p.k) + i64(w.h) * p.k_stride_h;
  w.v_g = static_cast<const __nv_bfloat16*>(p.v) + i64(w.hv) * p.v_stride_h + w.v0;
  w.t_g = static_cast<const __nv_bfloat16*>(p.ws_t) + i64(w.hv) * 64;
  w.p_g = static_cast<const __nv_bfloat16*>(p.ws_p) + i64(w.hv) * 64;
  w.sc_g = static_cast<const float4*>(p.ws_scales) + w.hv;
  return w;
}

/// Context-parallel path (kPhase 1: segment pass, 2: resume pass): what a block works on beyond
/// StateWork. A sequence's chunks are cut into segments of p.cp_segment_chunks chunks; segment s
/// of sequence n has the id z = floor(cu[n] / (64 L)) + n + s, collision-free and below
/// p.cp_segments = floor(T / (64 L)) + N without the host knowing the lengths. Blocks are
/// (z, value head, tile); the segment pass has V / bv tiles of state rows and then K / bv
/// "identity" tiles that carry the segment's linear map M (K rows starting from I, with v = 0).
struct CpWork {
  bool run;       // false: the id is past its sequence's segments, or this pass skips it
  bool identity;  // an identity tile (segment pass only)
  bool out;       // the block stores its outputs (exact initial state)
  i64 z, s, segments;
  i64 first_chunk;  // the segment's first chunk within its sequence
};

/// The largest n in [0, N) with floor(cu[n] / span) + n <= z (the function is increasing in n),
/// or -1.
template <typename Tcu>
__device__ __forceinline__ i64 cp_sequence_of(const GdnPrefillParams& p, i64 z, i64 span) {
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  i64 lo = 0, hi = i64(p.num_seqs) - 1, found = -1;
  while (lo <= hi) {
    const i64 mid = (lo + hi) >> 1;
    if (i64(cu[mid]) / span + mid <= z) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

/// The block's work on the context-parallel path: fills `w` (its token range is the segment's)
/// and says whether and how the block runs. kPhase 1 runs segment 0's state rows exactly (the
/// sequence's initial state, outputs stored) and, for the middle segments 1 .. S - 2, the state
/// rows from zero and the identity rows, storing only their end states (B, M); the last
/// segment's B and M are never needed. kPhase 2 reruns segments 1 .. S - 1 from the exact
/// initial states the scan kernel wrote (X), storing outputs.
template <typename Tcu, typename Tidx, int kPhase>
__device__ __forceinline__ CpWork cp_state_work(const GdnPrefillParams& p, int bv, StateWork& w) {
  CpWork c{};
  const u64 v_tiles = p.v_tiles;
  const u64 tiles = kPhase == 1 ? v_tiles + p.k_tiles : v_tiles;
  const u64 block = blockIdx.x;
  const int tile = static_cast<int>(block % tiles);
  w.hv = static_cast<u32>((block / tiles) % p.num_value_heads);
  c.z = static_cast<i64>(block / (tiles * p.num_value_heads));
  c.identity = u64(tile) >= v_tiles;
  w.vt = c.identity ? tile - static_cast<int>(v_tiles) : tile;
  w.v0 = w.vt * bv;
  const i64 span = p.cp_segment_chunks * kGdnPrefillChunk;
  const i64 n = cp_sequence_of<Tcu>(p, c.z, span);
  if (n < 0) return c;
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const i64 bos = i64(cu[n]), eos = i64(cu[n + 1]);
  c.s = c.z - (bos / span + n);
  // A sequence without tokens is one empty segment: its block still stores the final state (its
  // initial state, or zeros), as the sequential kernel does.
  c.segments = eos > bos ? (eos - bos + span - 1) / span : 1;
  if (c.s >= c.segments) return c;
  if (kPhase == 1) {
    c.run = c.s == 0 ? !c.identity : c.s < c.segments - 1;
    c.out = c.s == 0;
  } else {
    c.run = c.s >= 1;
    c.out = true;
  }
  if (!c.run) return c;
  c.first_chunk = c.s * p.cp_segment_chunks;
  w.n = u64(n);
  w.h = w.hv / p.heads_per_group;
  w.bos = bos + c.s * span;
  w.eos = w.bos + span < eos ? w.bos + span : eos;
  w.slot = static_cast<i64>(static_cast<const Tidx*>(p.state_indices)[n * p.index_stride]);
  w.padded = w.slot < 0 || w.slot >= p.num_slots;
  w.has_init = !w.padded &&
               (p.has_initial_state == nullptr || p.has_initial_state[n * p.has_init_stride] != 0);
  w.q_g = static_cast<const __nv_bfloat16*>(p.q) + i64(w.h) * p.q_stride_h;
  w.k_g = static_cast<const __nv_bfloat16*>(p.k) + i64(w.h) * p.k_stride_h;
  w.v_g = static_cast<const __nv_bfloat16*>(p.v) + i64(w.hv) * p.v_stride_h + w.v0;
  w.t_g = static_cast<const __nv_bfloat16*>(p.ws_t) + i64(w.hv) * 64;
  w.p_g = static_cast<const __nv_bfloat16*>(p.ws_p) + i64(w.hv) * 64;
  w.sc_g = static_cast<const float4*>(p.ws_scales) + w.hv;
  return c;
}

/// A compile-time int as a value (for the parts count of the generic cp.async row issue).
template <int N>
struct IntC {
  static constexpr int value = N;
};

/// The tiles of 16 and 32 rows (4 warps): warp w owns rows 16 w .. 15 of every 64-row product,
/// and the state update splits the [kBV, K] tile over the warps; R^T, Vn^T, the decayed Vn^T
/// and the state's bf16 copy pass through shared memory. Three barriers per chunk.
template <typename Tin, typename Tstate, typename Tout, typename Tcu, typename Tidx, int kK, int kV,
          int kBV, bool kCkpt, bool kKMajor = false>
__device__ __forceinline__ void state_tiles(const GdnPrefillParams& p) {
  static_assert(kK == 64 || kK == 128 || kK == 256, "K must be 64, 128 or 256");
  static_assert(kV % kBV == 0 && kV <= 256, "the value tile must divide V");
  static_assert(kBV == 16 || kBV == 32 || kBV == 64 || kBV == 128,
                "the value tile must be 16, 32, 64 or 128");
  constexpr int kWarps = gdn_prefill_state_warps(kBV);
  constexpr int kThreads = 32 * kWarps;
  static_assert(kBV * kK <= 2048 * kWarps, "the f32 state tile must fit 64 registers per thread");
  constexpr int kColWarps = kWarps / 4;  // warps sharing the columns of a 64-row product
  constexpr int kBVW = kBV / kColWarps;  // columns of a product per warp
  constexpr int kLdK = kK + 8;
  constexpr int kLdV = kBV + 8;
  constexpr int kLd = 72;
  constexpr int kKSteps = kK / 16;
  constexpr int kVT8 = kBVW / 8;
  constexpr int kSWarpsM = kBV / 16 < kWarps ? kBV / 16 : kWarps;
  constexpr int kSWarpsN = kWarps / kSWarpsM;
  constexpr int kSMTiles = kBV / 16 / kSWarpsM;
  constexpr int kSNTiles = kK / 8 / kSWarpsN;
  static_assert(kSNTiles % 2 == 0, "state n-tiles are loaded in pairs");
  constexpr GdnPrefillStateSmem kSmem = gdn_prefill_state_smem(kK, kBV);
  static_assert(kSmem.total >= (kThreads + 1) * sizeof(i64), "ranked_sequence's scratch");

  extern __shared__ __align__(16) unsigned char smem[];
  // Double buffers are selected by arithmetic, not by indexing a local array (which would live
  // on the stack).
  unsigned char* const s_k0 = smem + kSmem.k0;
  constexpr u32 kKBufStride = kSmem.k1 - kSmem.k0;
  unsigned char* const s_sc0 = smem + kSmem.sc0;
  constexpr u32 kScBufStride = kSmem.sc1 - kSmem.sc0;
  const auto k_buf = [&](int i) {
    return reinterpret_cast<__nv_bfloat16*>(s_k0 + i * kKBufStride);
  };
  const auto sc_buf = [&](int i) { return reinterpret_cast<float4*>(s_sc0 + i * kScBufStride); };
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.q);
  __nv_bfloat16* s_v = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.v);
  unsigned char* const s_t0 = smem + kSmem.t0;
  constexpr u32 kTBufStride = kSmem.t1 - kSmem.t0;
  const auto t_buf = [&](int i) {
    return reinterpret_cast<__nv_bfloat16*>(s_t0 + i * kTBufStride);
  };
  __nv_bfloat16* s_p = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.p);
  __nv_bfloat16* s_s = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.s);
  __nv_bfloat16* s_r = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.r);
  __nv_bfloat16* s_vn = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.vn);
  __nv_bfloat16* s_vd = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.vd);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int rw = warp & 3;              // row block of the 64-row products
  const int col0 = (warp >> 2) * kBVW;  // first column of this warp's share of them
  const int row0 = rw * 16;

  const auto [n, hv, h, vt, v0, bos, eos, slot, padded, has_init, q_g, k_g, v_g, t_g, p_g, sc_g] =
      state_work<Tcu, Tidx, kThreads>(p, kBV, reinterpret_cast<i64*>(smem));
  const u32 hv_count = p.num_value_heads;

  // cp.async issue helpers for the chunk starting at token t (rows >= `rows` zero-filled).
  const auto issue_rows = [&](__nv_bfloat16* dst, int ld, const __nv_bfloat16* src, i64 stride,
                              int parts, i64 t, int rows) {
    for (int c = tid; c < 64 * parts; c += kThreads) {
      const int r = c / parts, part = c % parts;
      const bool ok = r < rows;
      cp_async::copy16(dst + r * ld + part * 8, ok ? src + (t + r) * stride + part * 8 : src, ok);
    }
  };
  const auto issue_scales = [&](float4* dst, i64 t, int rows) {
    if (tid < 64) {
      const bool ok = tid < rows;
      cp_async::copy16(dst + tid, ok ? sc_g + (t + tid) * i64(hv_count) : sc_g, ok);
    }
  };
  const auto rows_at = [&](i64 t) { return static_cast<int>(eos - t < 64 ? eos - t : 64); };

  // The state tile: element (v, kk) of warp (wm, wn), m-tile mi, n-tile ni, half hf, pair e at
  // v = (wm * kSMTiles + mi) * 16 + g + 8 hf, kk = (wn * kSNTiles + ni) * 8 + 2 t4 + e.
  const int wm = warp % kSWarpsM, wn = warp / kSWarpsM;
  float s_acc[kSMTiles][kSNTiles][4];
  {
    const Tstate* src = has_init
                            ? static_cast<const Tstate*>(p.state) + slot * p.state_slot_stride +
                                  state_tile_offset<kKMajor, kK, kV>(hv, v0)
                            : nullptr;
#pragma unroll
    for (int mi = 0; mi < kSMTiles; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kSNTiles; ++ni) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int v = (wm * kSMTiles + mi) * 16 + g + 8 * hf;
          const int kk = (wn * kSNTiles + ni) * 8 + 2 * t4;
          const float2 x =
              src != nullptr ? load_state_pair<kKMajor, kK, kV>(src, v, kk) : make_float2(0.f, 0.f);
          s_acc[mi][ni][2 * hf] = x.x;
          s_acc[mi][ni][2 * hf + 1] = x.y;
          *reinterpret_cast<u32*>(s_s + v * kLdK + kk) = mma::pack_bf16(x.x, x.y);
        }
      }
    }
  }

  Tout* o_base = static_cast<Tout*>(p.out) + i64(hv) * p.out_stride_h + v0;
  i64 ckpt_row = 0, ckpt_countdown = 0;
  if constexpr (kCkpt) {
    ckpt_row = p.checkpoint_starts[n];
    ckpt_countdown = p.ckpt_every_chunks;
  }

  // Everything above read only the caller's inputs; the chunks' T', P and scales come from the
  // chunk kernel, which may still be running (programmatic dependent launch).
  grid_dependency::wait_for_previous_grid();
  if (bos < eos) {
    const int rows = rows_at(bos);
    issue_rows(k_buf(0), kLdK, k_g, p.k_stride_t, kK / 8, bos, rows);
    issue_scales(sc_buf(0), bos, rows);
    issue_rows(s_q, kLdK, q_g, p.q_stride_t, kK / 8, bos, rows);
    issue_rows(s_v, kLdV, v_g, p.v_stride_t, kBV / 8, bos, rows);
    issue_rows(t_buf(0), kLd, t_g, i64(hv_count) * 64, 8, bos, rows);
    cp_async::commit();
  }

  int buf = 0;
  for (i64 t0 = bos; t0 < eos; t0 += kGdnPrefillChunk, buf ^= 1) {
    const int rows = rows_at(t0);
    const i64 t1 = t0 + kGdnPrefillChunk;
    const bool next = t1 < eos;
    const int rows1 = next ? rows_at(t1) : 0;
    __nv_bfloat16* s_k = k_buf(buf);
    const float4* s_sc = sc_buf(buf);
    const __nv_bfloat16* s_t = t_buf(buf);

    // This chunk's q, k, v, T' and scales have landed; the previous chunk's state update (the
    // last reader of the other k and scale buffers, of P and of the state copy) is done.
    cp_async::wait<0>();
    __syncthreads();
    if (next) {
      issue_rows(k_buf(buf ^ 1), kLdK, k_g, p.k_stride_t, kK / 8, t1, rows1);
      issue_scales(sc_buf(buf ^ 1), t1, rows1);
      issue_rows(t_buf(buf ^ 1), kLd, t_g, i64(hv_count) * 64, 8, t1, rows1);
    }
    issue_rows(s_p, kLd, p_g, i64(hv_count) * 64, 8, t0, rows);
    cp_async::commit();

    // 1. K S^T and Q S^T (one pass over the state copy); R^T to shared memory, O in registers.
    float acc_o[kVT8][4];
    {
      float acc_r[kVT8][4];
#pragma unroll
      for (int i = 0; i < kVT8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_r[i][e] = acc_o[i][e] = 0.f;
      }
#pragma unroll 2
      for (int ks = 0; ks < kKSteps; ++ks) {
        u32 ak[4], aq[4];
        mma::load_a(ak, s_k + row0 * kLdK + ks * 16, kLdK);
        mma::load_a(aq, s_q + row0 * kLdK + ks * 16, kLdK);
#pragma unroll
        for (int np = 0; np < kVT8 / 2; ++np) {
          u32 b[4];
          mma::load_b2(b, s_s + (col0 + np * 16) * kLdK + ks * 16, kLdK);
          mma::mma_bf16(acc_r[2 * np], ak, b[0], b[1]);
          mma::mma_bf16(acc_r[2 * np + 1], ak, b[2], b[3]);
          mma::mma_bf16(acc_o[2 * np], aq, b[0], b[1]);
          mma::mma_bf16(acc_o[2 * np + 1], aq, b[2], b[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float4 sc = s_sc[i];
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          const int c = col0 + nt * 8 + 2 * t4;
          const float2 vv = load_pair(s_v + i * kLdV + c);
          s_r[c * kLd + i] = __float2bfloat16_rn(vv.x - sc.y * acc_r[nt][2 * hf]);
          s_r[(c + 1) * kLd + i] = __float2bfloat16_rn(vv.y - sc.y * acc_r[nt][2 * hf + 1]);
          acc_o[nt][2 * hf] *= sc.x;
          acc_o[nt][2 * hf + 1] *= sc.x;
        }
      }
    }
    __syncthreads();
    if (next) {
      issue_rows(s_q, kLdK, q_g, p.q_stride_t, kK / 8, t1, rows1);
      issue_rows(s_v, kLdV, v_g, p.v_stride_t, kBV / 8, t1, rows1);
    }
    cp_async::commit();

    // 2. Vn = T' R (T' lower triangular: column blocks <= the warp's); Vn^T and the decayed,
    // 1/|k|-scaled Vn^T for the state update.
    {
      float acc_v[kVT8][4];
#pragma unroll
      for (int i = 0; i < kVT8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_v[i][e] = 0.f;
      }
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (s <= rw) {
          u32 a[4];
          mma::load_a(a, s_t + row0 * kLd + s * 16, kLd);
#pragma unroll
          for (int np = 0; np < kVT8 / 2; ++np) {
            u32 b[4];
            mma::load_b2(b, s_r + (col0 + np * 16) * kLd + s * 16, kLd);
            mma::mma_bf16(acc_v[2 * np], a, b[0], b[1]);
            mma::mma_bf16(acc_v[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float kd = s_sc[i].z;
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          const int c = col0 + nt * 8 + 2 * t4;
          const float x0 = acc_v[nt][2 * hf], x1 = acc_v[nt][2 * hf + 1];
          s_vn[c * kLd + i] = __float2bfloat16_rn(x0);
          s_vn[(c + 1) * kLd + i] = __float2bfloat16_rn(x1);
          s_vd[c * kLd + i] = __float2bfloat16_rn(x0 * kd);
          s_vd[(c + 1) * kLd + i] = __float2bfloat16_rn(x1 * kd);
        }
      }
    }
    // P (issued at the top) must have landed; the next chunk's q and v may still be in flight.
    cp_async::wait<1>();
    __syncthreads();

    // 3. O += P Vn; store the chunk's rows.
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (s <= rw) {
        u32 a[4];
        mma::load_a(a, s_p + row0 * kLd + s * 16, kLd);
#pragma unroll
        for (int np = 0; np < kVT8 / 2; ++np) {
          u32 b[4];
          mma::load_b2(b, s_vn + (col0 + np * 16) * kLd + s * 16, kLd);
          mma::mma_bf16(acc_o[2 * np], a, b[0], b[1]);
          mma::mma_bf16(acc_o[2 * np + 1], a, b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = row0 + g + 8 * hf;
      if (i < rows) {
        Tout* orow = o_base + (t0 + i) * p.out_stride_t;
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          store_pair(orow + col0 + nt * 8 + 2 * t4, acc_o[nt][2 * hf], acc_o[nt][2 * hf + 1]);
        }
      }
    }

    // 4. S <- e^gamma_last S + Vd^T K, and its bf16 copy for the next chunk.
    update_state_tile<kLd, kLdK>(s_acc, s_sc[0].w, s_vd, s_k, s_s, wm, wn, g, t4);

    // 5. Checkpoints, as in the fused kernel.
    if constexpr (kCkpt) {
      if (rows == kGdnPrefillChunk && --ckpt_countdown == 0) {
        ckpt_countdown = p.ckpt_every_chunks;
        if (ckpt_row >= 0 && ckpt_row < p.ckpt_rows) {
          store_state_tile<Tstate, kK, kKMajor, kV>(static_cast<Tstate*>(p.checkpoints) +
                                                        ckpt_row * p.ckpt_slot_stride +
                                                        state_tile_offset<kKMajor, kK, kV>(hv, v0),
                                                    s_acc, wm, wn, g, t4);
        }
        ++ckpt_row;
      }
    }
  }

  store_final_state<Tstate, kK, kV, kKMajor>(p, n, slot, padded, hv, v0, s_acc, wm, wn, g, t4);
}

/// The wide tiles (bv = 64, 128; K <= 128): warp w owns rows 16 w .. 16 w + 15 of the value tile
/// and carries them through the whole chunk in registers, with no exchange between warps. With
/// S_w its [16, K] state rows (f32, accumulator layout), per chunk:
///   R_w^T  = V_w^T - S_w K^T diag(e^gamma / |k|)    A = S_w (registers), B = k rows
///   O_w    = diag(e^gamma / |q|) Q S_w^T             A = q rows, B = S_w (registers)
///   Vn_w^T = R_w^T T'^T                              A = R_w^T (registers), B = T' rows
///   O_w   += P Vn_w                                  A = P rows, B = Vn_w^T (registers)
///   S_w   <- e^gamma_last S_w + Vn_w^T diag(e^(gamma_last - gamma_j) / |k_j|) K
/// The accumulator of each product is, packed to bf16, the A or B fragment of the next: the
/// [16, n] tile of rows g, g + 8 and column pairs 2 t4 is the A fragment of a 16-row operand
/// and the B fragment of two 8-column ones. Only the chunk's inputs live in shared memory, in
/// kStages stages, fetched by every thread (cp.async). Two stages: one block barrier per chunk,
/// after which chunk c + 1 is fetched into the stage chunk c - 1 used. Three stages on sm_90 and
/// later (kHandoff: the planner's choice there for the sequential kernel and the
/// context-parallel passes alike): no block barrier in the loop; each stage has a
/// full mbarrier (every thread's copies landed: cp.async.mbarrier.arrive.noinc) and an empty one
/// (every warp done reading it), and chunk c + 1 goes into the stage chunk c - 2 used, so a warp
/// waits for the others only to have finished the chunk before its previous one. Measured on
/// the H200 against two stages with the barrier: 1-3.6% less GPU time per call on the
/// sequential path, 8.5-10% on the context-parallel one (docs/performance.md).
///
/// Measured on the H200 (128k tokens, 16 uneven sequences, H = HV = 16) against the two-stage
/// layout: a ninth warp that only copies, handing stages over by mbarriers, was ~20% slower per
/// chunk (9 warps cap registers at 168 a thread: 3 warps share a scheduler's register file);
/// bulk copies (cp.async.bulk, one per row and tensor, ~384 a chunk) slower still, whoever
/// issues them (the copy engine took ~7 cycles per small copy); a third stage with the block
/// barrier kept changed nothing.
/// The A fragment (mma.cuh layout) of k-step ks of a warp's 16 state rows held as accumulators
/// (s[ni][e]: row g + 8 (e / 2), column 8 ni + 2 t4 + e % 2), rounded to bf16.
// Whether the outputs are bf16 (the wgmma tiles store them as transposed pairs).
template <typename T>
struct OutIsBf16 {
  static constexpr bool value = false;
};
template <>
struct OutIsBf16<__nv_bfloat16> {
  static constexpr bool value = true;
};

template <int kSN>
__device__ __forceinline__ void state_fragment(const float (&s)[kSN][4], int ks, u32 (&a)[4]) {
  a[0] = mma::pack_bf16(s[2 * ks][0], s[2 * ks][1]);
  a[1] = mma::pack_bf16(s[2 * ks][2], s[2 * ks][3]);
  a[2] = mma::pack_bf16(s[2 * ks + 1][0], s[2 * ks + 1][1]);
  a[3] = mma::pack_bf16(s[2 * ks + 1][2], s[2 * ks + 1][3]);
}

/// Step 2 of the wide tiles: R_w^T = V_w^T - S_w K^T diag(e^gamma / |k|) as the A fragments of
/// its four 16-column blocks (ra), from S_w K^T (acc_r: rows v, columns j = 8 nt + 2 t4 + e)
/// and the warp's rows of V^T (s_v + vw, row stride ld); kd takes the state update's column
/// scales e^(gamma_last - gamma_j) / |k_j| of the same columns.
/// `load_vt(jb, vt)` gives the A fragment of token block jb of the warp's V^T (the layout's own
/// addressing: padded rows below, the ws kernel's swizzled tile in state_wide).
template <typename LoadVt>
__device__ __forceinline__ void form_r(const float (&acc_r)[8][4], LoadVt&& load_vt,
                                       const float4* s_sc, int t4, u32 (&ra)[4][4],
                                       float (&kd)[4][2][2]) {
#pragma unroll
  for (int jb = 0; jb < 4; ++jb) {
    u32 vt[4];
    load_vt(jb, vt);
#pragma unroll
    for (int hj = 0; hj < 2; ++hj) {
      const int j = jb * 16 + hj * 8 + 2 * t4;
      const float4 c0 = s_sc[j], c1 = s_sc[j + 1];
      kd[jb][hj][0] = c0.z;
      kd[jb][hj][1] = c1.z;
      const float* acc = acc_r[2 * jb + hj];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const u32 x = vt[2 * hj + hf];
        ra[jb][2 * hj + hf] =
            mma::pack_bf16(vec::Bits<__nv_bfloat16>::to_f32(x) - c0.y * acc[2 * hf],
                           vec::Bits<__nv_bfloat16>::to_f32(x >> 16) - c1.y * acc[2 * hf + 1]);
      }
    }
  }
}

/// form_r on V rows of pitch `ld` elements (s_v: the warp's first column).
__device__ __forceinline__ void form_r(const float (&acc_r)[8][4], const __nv_bfloat16* s_v, int ld,
                                       const float4* s_sc, int t4, u32 (&ra)[4][4],
                                       float (&kd)[4][2][2]) {
  form_r(
      acc_r, [&](int jb, u32(&vt)[4]) { mma::load_a_trans(vt, s_v + jb * 16 * ld, ld); }, s_sc, t4,
      ra, kd);
}

/// Vn_w^T (acc_v, the layout of acc_r) as bf16 fragments: vb for P Vn_w, and vd decayed and
/// 1/|k|-scaled by kd (form_r) for the state update.
__device__ __forceinline__ void pack_vn(const float (&acc_v)[8][4], const float (&kd)[4][2][2],
                                        u32 (&vb)[4][4], u32 (&vd)[4][4]) {
#pragma unroll
  for (int jb = 0; jb < 4; ++jb) {
#pragma unroll
    for (int hj = 0; hj < 2; ++hj) {
      const float* x = acc_v[2 * jb + hj];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        vb[jb][2 * hj + hf] = mma::pack_bf16(x[2 * hf], x[2 * hf + 1]);
        vd[jb][2 * hj + hf] =
            mma::pack_bf16(x[2 * hf] * kd[jb][hj][0], x[2 * hf + 1] * kd[jb][hj][1]);
      }
    }
  }
}

/// kStateP: P = tril(s rq_i rk_j (Q K^T)_ij 2^(x_i - x_j)) of a chunk into its stage (bf16 rows
/// of pitch 72), from the raw q and k tiles and each row's factors {x, s rq, rk}
/// (gdn_prefill_p_factors), which the stage keeps in the 16 bytes past each P row (columns
/// 64..71, which no product reads). The ten lower 16 x 16 blocks of chunk `chunk` are dealt to
/// the warps in turn, counting on from the previous chunk's last (block b of chunk c goes to warp
/// (10 c + b) mod warps), so that no warp always takes the extra blocks. The zeros above the
/// diagonal, and rows past the chunk's end, are selected, not multiplied (a zero-filled row's
/// factors could make 0 * inf).
template <int kK, int kWarps>
__device__ __forceinline__ void form_p(const __nv_bfloat16* s_q, const __nv_bfloat16* s_k,
                                       __nv_bfloat16* s_p, int rows, int warp, int g, int t4,
                                       i64 chunk) {
  constexpr int kLdK = kK + 8, kLd = 72;
  const auto factors = [&](int r) { return *reinterpret_cast<const float4*>(s_p + r * kLd + 64); };
  const int first = static_cast<int>((warp + kWarps - (10 * chunk) % kWarps) % kWarps);
#pragma unroll 1
  for (int blk = first; blk < 10; blk += kWarps) {
    const int mt = blk < 1 ? 0 : (blk < 3 ? 1 : (blk < 6 ? 2 : 3));
    const int jb = blk - mt * (mt + 1) / 2;
    float acc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks) {
      u32 a[4], b[4];
      mma::load_a(a, s_q + mt * 16 * kLdK + ks * 16, kLdK);
      mma::load_b2(b, s_k + jb * 16 * kLdK + ks * 16, kLdK);
      mma::mma_bf16(acc[0], a, b[0], b[1]);
      mma::mma_bf16(acc[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = mt * 16 + g + 8 * hf;
      const float4 fi = factors(i);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int j = jb * 16 + nt * 8 + 2 * t4;
        const float4 f0 = factors(j), f1 = factors(j + 1);
        const float y0 = fi.y * f0.z * ex2(fi.x - f0.x) * acc[nt][2 * hf];
        const float y1 = fi.y * f1.z * ex2(fi.x - f1.x) * acc[nt][2 * hf + 1];
        const bool row_ok = i < rows;
        *reinterpret_cast<u32*>(s_p + i * kLd + j) =
            mma::pack_bf16(row_ok && i >= j ? y0 : 0.f, row_ok && i >= j + 1 ? y1 : 0.f);
      }
    }
  }
}

#if KJIT_GDN_STATE_WGMMA
/// Where the P tile of a wgmma stage keeps each row's factors {x, s rq, rk} (kStateP): the 64 x 64
/// bf16 tile takes 8 KiB of its 9 KiB region, the float4 of row r sits at 8 KiB + 16 r.
inline constexpr u32 kWgmmaPFactors = 64 * 128;

/// Issues (without waiting) the Q K^T half of warpgroup `wg` of two for kStateP on wgmma: its 32
/// columns j = 32 wg .. of the 64 x 64 product, from the stage's 128-byte-swizzled q and k tiles
/// (`q_addr`, `k_addr`, a pair tile: sw128::kPairSlice; one SS wgmma per k-step, both operands
/// read by the tensor cores).
template <int kK>
__device__ __forceinline__ void issue_qk_half(float (&acc)[4][4], u32 q_addr, u32 k_addr, int wg) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
  const u64 q_desc = wgmma::descriptor_sw128(q_addr, 16, sw128::kAtom);
  // Rows 32 wg .. of k start four 8-row atoms further per warpgroup (the swizzle stays aligned).
  const u64 k_desc = wgmma::descriptor_sw128(k_addr + u32(wg) * 32 * 128, 16, sw128::kAtom);
  wgmma::hold_registers(acc);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    wgmma::mma_m64n32k16_ss<0>(acc, wgmma::advance(q_desc, sw128::k_step<sw128::kPairSlice>(0, ks)),
                               wgmma::advance(k_desc, sw128::k_step<sw128::kPairSlice>(0, ks)));
  }
  wgmma::commit();
}

/// P from the finished Q K^T half of issue_qk_half (after the wait and hold_registers): element
/// (i, j) = s rq_i rk_j (Q K^T)_ij 2^(x_i - x_j) for j <= i < rows, else 0 (selected, not
/// multiplied: above the diagonal the exponential may overflow), stored as bf16 pairs into the
/// stage's swizzled P tile at `p_tile`, whose factors sit at kWgmmaPFactors. Warp `wq` (of its
/// warpgroup) holds rows 16 wq + g (+ 8).
__device__ __forceinline__ void store_p_half(const float (&acc)[4][4], unsigned char* p_tile,
                                             int rows, int wg, int wq, int g, int t4) {
  const float4* factors = reinterpret_cast<const float4*>(p_tile + kWgmmaPFactors);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = 16 * wq + g + 8 * hf;
    const float4 fi = factors[i];
    const bool row_ok = i < rows;
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int j = 32 * wg + 8 * nt + 2 * t4;
      const float4 f0 = factors[j], f1 = factors[j + 1];
      const float y0 = fi.y * f0.z * ex2(fi.x - f0.x) * acc[nt][2 * hf];
      const float y1 = fi.y * f1.z * ex2(fi.x - f1.x) * acc[nt][2 * hf + 1];
      *reinterpret_cast<u32*>(p_tile + sw128::offset(i, j >> 3) + (j & 7) * 2) =
          mma::pack_bf16(row_ok && i >= j ? y0 : 0.f, row_ok && i >= j + 1 ? y1 : 0.f);
    }
  }
}
#endif

/// The chunk role of state_wide's blocks: none (the chunk kernel ran before). The warp-specialized
/// kernel (ws.cuh) passes its chunk warpgroup's role instead.
struct NoChunkRole {
  static constexpr bool kActive = false;
  static constexpr bool kL2Norm = false;
  template <typename Sync>
  static __device__ __forceinline__ void invert(unsigned char*, unsigned char*, int, int, int,
                                                Sync&&) {}
  static __device__ __forceinline__ void run(const GdnPrefillParams&, const StateWork&,
                                             unsigned char*) {}
};

/// bf16 element (r, c) of a 64-row 128-byte-swizzled tile (swizzle.cuh).
__device__ __forceinline__ __nv_bfloat16* sw128_element(unsigned char* tile, int r, int c) {
  return reinterpret_cast<__nv_bfloat16*>(tile + sw128::offset(r, c >> 3) + (c & 7) * 2);
}

/// Measurement only (KJIT_GDN_WS_PROFILE, params.h): a warp's cycle sums per site of the
/// warp-specialized kernel's loop. Without the macro every member is a constant and nothing is
/// read or written.
struct WsProfile {
  unsigned long long* cell = nullptr;
  __device__ __forceinline__ explicit WsProfile(const GdnPrefillParams& p) {
#if KJIT_GDN_WS_PROFILE
    if (p.profile != nullptr && (threadIdx.x & 31) == 0) {
      cell = p.profile + (u64(blockIdx.x) * (kGdnPrefillWsThreads / 32) + (threadIdx.x >> 5)) *
                             u64(kGdnWsProfileSites);
    }
#else
    (void)p;
#endif
  }
  __device__ __forceinline__ long long now() const {
#if KJIT_GDN_WS_PROFILE
    return clock64();
#else
    return 0;
#endif
  }
  /// Adds the cycles since `since` to `site` and returns the time: the next stretch's start.
  __device__ __forceinline__ long long add([[maybe_unused]] int site, long long since) const {
#if KJIT_GDN_WS_PROFILE
    const long long t = clock64();
    if (cell != nullptr) atomicAdd(cell + site, static_cast<unsigned long long>(t - since));
    return t;
#else
    return since;
#endif
  }
  __device__ __forceinline__ void count_chunk() const {
#if KJIT_GDN_WS_PROFILE
    if (cell != nullptr) atomicAdd(cell + kWsProfChunks, 1ull);
#endif
  }
};

/// The named barrier of warpgroup `wg`'s four warps in the warp-specialized kernel (5 and 6; 0 is
/// __syncthreads, 1 the mma.sync tiles' P, 2 and 3 the turns, 4 the chunk warpgroup's).
__device__ __forceinline__ void warpgroup_sync(int wg) { named_barrier::sync<128>(5 + wg); }

template <typename Tin, typename Tstate, typename Tout, typename Tcu, typename Tidx, int kK, int kV,
          int kBV, bool kCkpt, int kPhase = 0, int kStagesWanted = 0, bool kKMajor = false,
          bool kStateP = false, typename ChunkRole = NoChunkRole>
__device__ __forceinline__ void state_wide(const GdnPrefillParams& p) {
  static_assert(kK == 64 || kK == 128, "wide tiles carry 16 rows of a K <= 128 state per warp");
  static_assert(kPhase == 0 || (kK % kBV == 0 && (!KJIT_GDN_STATE_WGMMA || kBV == 128)),
                "the context-parallel passes run tiles that divide K, on wgmma the whole-V tile");
  static_assert(kV % kBV == 0 && kV <= 256, "the value tile must divide V");
  constexpr int kWarps = kBV / 16;
  static_assert(kWarps == gdn_prefill_state_warps(kBV), "one warp per 16 rows of the tile");
  constexpr int kThreads = 32 * kWarps;
  [[maybe_unused]] constexpr int kLdK = kK + 8;  // padded rows (mma.sync path)
  constexpr int kLdV = kBV + 8;
  [[maybe_unused]] constexpr int kLd = 72;
  constexpr int kKSteps = kK / 16;
  constexpr int kSN = kK / 8;  // n-tiles of the warp's state rows
  constexpr int kStages = kStagesWanted > 0 ? kStagesWanted : gdn_prefill_state_stages(kBV);
  static_assert(kStages >= 2, "the wide tiles fetch chunk c + stages - 1 during chunk c");
  // Three stages on sm_90 hand them over by mbarriers instead of a block barrier per chunk:
  // chunk c + 1 is fetched into the stage chunk c - 2 used, so warps may drift a chunk apart.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kHandoff = kStages >= 3;
#else
  constexpr bool kHandoff = false;
#endif
  // With the handoff and P formed here, chunk c + kStages - 1 is fetched during chunk c, after
  // the chunk's first products, into the stage chunk c - 1 used (fetch_ahead); otherwise chunk
  // c + 1 at the top of chunk c into the stage of chunk c - 2. Measured on the H200 (same call,
  // docs/performance.md "Fetching two chunks ahead"): 1.4% less per call with P formed here,
  // 2-3% more on the context-parallel passes and the wgmma tiles, which keep the top fetch.
  constexpr bool kFetchAhead = kHandoff && kStateP && kStages >= 3 && !KJIT_GDN_STATE_WGMMA;
  static_assert(!(kStateP && KJIT_GDN_STATE_WGMMA) || (kWarps == 8 && kHandoff),
                "on wgmma, P is formed by the whole-V tile's two warpgroups (half the columns "
                "each), during the chunk before (3 stages, handed over by mbarriers)");
  // The warp-specialized kernel (ws.cuh): a third warpgroup copies each chunk's q, k and v rows
  // into the stages and computes its T', P^T and scales into them while the state warpgroups walk
  // the chunks. No chunk kernel, no workspace.
  constexpr bool kWs = ChunkRole::kActive;
  static_assert(!kWs || (KJIT_GDN_STATE_WGMMA && !kStateP && kPhase == 0 && kStages == 3),
                "the warp-specialized kernel runs the whole-V wgmma tile, 3 stages, P given");
  [[maybe_unused]] constexpr GdnPrefillWsSmem kWsSmem = gdn_prefill_ws_smem(kK);
  constexpr GdnPrefillStateSmem kSmem =
      kWs ? kWsSmem.state : gdn_prefill_state_smem(kK, kBV, kStages, KJIT_GDN_STATE_WGMMA != 0);
  static_assert(kSmem.total >= (kThreads + 1) * sizeof(i64), "ranked_sequence's scratch");
  constexpr u32 kStage = kSmem.k1 - kSmem.k0;

#if KJIT_GDN_STATE_WGMMA
  // The swizzled tiles (swizzle.cuh) take their swizzle from address bits 4..9: every tile
  // starts on 1024 bytes.
  constexpr u32 kSwAtom = sw128::kAtom;
  static_assert(kSmem.k0 % kSwAtom == 0 && kSmem.q % kSwAtom == 0 && kSmem.t0 % kSwAtom == 0 &&
                    kSmem.p % kSwAtom == 0 && kStage % kSwAtom == 0,
                "the wgmma tiles start on 1024-byte boundaries");
  static_assert(kSmem.q == kSmem.k0 + sw128::kSlice, "k and q: one pair tile (kPairSlice)");
  extern __shared__ __align__(1024) unsigned char smem[];
#else
  extern __shared__ __align__(16) unsigned char smem[];
#endif

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int vw = warp * 16;  // the warp's first row of the value tile

  StateWork work{};
  CpWork cp{};
  if constexpr (kPhase == 0) {
    work = state_work<Tcu, Tidx, kThreads>(p, kBV, reinterpret_cast<i64*>(smem));
    cp.out = true;
#if KJIT_GDN_STATE_WGMMA
    if constexpr (kWs) {
      // full[s]: the chunk warpgroup's copies into stage s have landed (its 128 threads'
      // cp.async.mbarrier.arrive.noinc); empty[s]: every state warp is done with it (and with its
      // chunk's T' / P^T slot); chunk_ready[s]: the chunk warpgroup stored the chunk's T', P^T
      // and scales. (p_ready, initialized with the others, is the mma.sync tiles'.)
      u64* const bars = reinterpret_cast<u64*>(smem + kSmem.barriers);
      if (tid == 0) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
          mbarrier::init(bars + s, kGdnPrefillThreads);
          // (Every state thread arrives on empty: racecheck reported the chunk warpgroup's refills
          // against the state warps' reads of v once the refills followed the releases closely,
          // with one arrival per warp after __syncwarp.)
          mbarrier::init(bars + kStages + s, kThreads);
          mbarrier::init(bars + 2 * kStages + s, kThreads);
          mbarrier::init(reinterpret_cast<u64*>(smem + kSmem.total) + s, kGdnPrefillThreads);
        }
        // t_ready[c & 1]: the inverse of chunk c (ChunkRole::invert) by the state warpgroup
        // going second on it.
        mbarrier::init(reinterpret_cast<u64*>(smem + kWsSmem.t_ready), kGdnPrefillThreads);
        mbarrier::init(reinterpret_cast<u64*>(smem + kWsSmem.t_ready) + 1, kGdnPrefillThreads);
        // The full barriers, to the async proxy: TMA boxes complete their bytes on them.
        mbarrier::fence_init();
      }
      __syncthreads();
      if (warp >= kWarps) {
        // The chunk warpgroup gives registers to the state warpgroups (setmaxnreg moves them
        // within the block's allocation, params.h kGdnPrefillWs*Registers).
        wgmma::release_registers<kGdnPrefillWsChunkRegisters>();
        ChunkRole::run(p, work, smem);
        return;
      }
      wgmma::claim_registers<kGdnPrefillWsStateRegisters>();
    }
#endif
  } else {
    cp = cp_state_work<Tcu, Tidx, kPhase>(p, kBV, work);
    if (!cp.run) return;  // uniform over the block, before any barrier
  }
  const auto [n, hv, h, vt, v0, bos, eos, slot, padded, has_init, q_g, k_g, v_g, t_g, p_g, sc_g] =
      work;
  const u32 hv_count = p.num_value_heads;
  // kStateP: P's row factors of this value head ([T, HV] float4 in ws_p).
  [[maybe_unused]] const float4* const pf_g = static_cast<const float4*>(p.ws_p) + hv;
  // Identity tiles (segment pass) multiply v = 0: their rows are zero-filled.
  const bool zero_v = kPhase == 1 && cp.identity;
  // Whether this block's outputs are stored (always, but in the segment pass only for segment
  // 0's state rows): blocks that store none skip the products that only feed O.
  const bool want_out = cp.out;
  // The warp-specialized kernel stores a whole chunk of bf16 out by TMA when the call has a map
  // of out (tma_out; a sequence's last partial chunk keeps the plain stores).
  [[maybe_unused]] const auto ws_tma_store = [&](int rows) {
    return kWs && rows == kGdnPrefillChunk && p.tma_out != 0;
  };

  // The chunk starting at token t into stage `st` (cp.async, 16 bytes per thread and copy; rows
  // past the end of the sequence zero-filled), one commit group per chunk.
  const auto rows_at = [&](i64 t) { return static_cast<int>(eos - t < 64 ? eos - t : 64); };
  // Each thread copies the same 16-byte piece of rows r0, r0 + kRowsPerPass, ... of every
  // chunk: one 64-bit row address per tensor and chunk, the others a block-uniform step away,
  // and no zero-fill predicate when the chunk is full (all but a sequence's last). Computing
  // (t + r) * stride for every copy took ~20 instructions a copy, a quarter of the loop's
  // instructions (kjit inspect --sass).
  const auto issue_rows = [&](unsigned char* dst_bytes, int ld, const __nv_bfloat16* src,
                              i64 stride, auto parts_c, i64 t, int rows) {
    constexpr int kParts = decltype(parts_c)::value;
    static_assert(kThreads % kParts == 0 && 64 * kParts >= kThreads,
                  "every thread copies whole passes of kThreads / kParts rows");
    constexpr int kRowsPerPass = kThreads / kParts;
    const int r0 = tid / kParts, part = tid % kParts;
    __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(dst_bytes) + r0 * ld + part * 8;
    const __nv_bfloat16* row = src + (t + r0) * stride + part * 8;
    if (rows == kGdnPrefillChunk) {
#pragma unroll
      for (int it = 0; it < 64 / kRowsPerPass; ++it) {
        cp_async::copy16(dst + it * kRowsPerPass * ld, row + it * kRowsPerPass * stride);
      }
    } else {
#pragma unroll
      for (int it = 0; it < 64 / kRowsPerPass; ++it) {
        const bool ok = r0 + it * kRowsPerPass < rows;
        cp_async::copy16(dst + it * kRowsPerPass * ld, ok ? row + it * kRowsPerPass * stride : src,
                         ok);
      }
    }
  };
#if KJIT_GDN_STATE_WGMMA
  // The wgmma operands k, q, T' and P go to shared memory 128-byte swizzled (swizzle.cuh,
  // wgmma::descriptor_sw128). Eight consecutive threads copy one
  // 128-byte line of a row into one 128-byte line of shared memory. The no-swizzle core matrices
  // had eight threads copy eight rows' 16 bytes each (Nsight Compute on the H200: 32 shared-memory
  // wavefronts and 32 L2 sectors per copy instruction, against 4 and 16 ideal;
  // docs/performance.md).
  const auto issue_core = [&](unsigned char* dst, const __nv_bfloat16* src, i64 stride,
                              auto parts_c, i64 t, int rows) {
    constexpr int kParts = decltype(parts_c)::value;
    static_assert(kThreads % kParts == 0 && (kThreads / kParts) % 8 == 0 && 64 * kParts >= kThreads,
                  "every thread copies whole passes of rows, a multiple of 8 apart");
    // As issue_rows: one row address per tensor and chunk, the others a block-uniform step
    // away; rows kRowsPerPass apart keep their swizzle (a multiple of 8).
    constexpr int kRowsPerPass = kThreads / kParts;
    const int r0 = tid / kParts, part = tid % kParts;
    // (Slices of a pair tile: k and q are; T' and P have one slice.)
    unsigned char* const d = dst + sw128::offset<sw128::kPairSlice>(r0, part);
    const __nv_bfloat16* row = src + (t + r0) * stride + part * 8;
#pragma unroll
    for (int it = 0; it < 64 / kRowsPerPass; ++it) {
      const bool ok = rows == kGdnPrefillChunk || r0 + it * kRowsPerPass < rows;
      cp_async::copy16(d + it * kRowsPerPass * 128, ok ? row + it * kRowsPerPass * stride : src,
                       ok);
    }
  };
#endif
  const auto fill = [&](int st, i64 t) {
    const int rows = rows_at(t);
    unsigned char* const base = smem + st * kStage;
#if KJIT_GDN_STATE_WGMMA
    // (As below: q and P zero-filled where no output is stored, v where it is zero.)
    issue_core(base + kSmem.k0, k_g, p.k_stride_t, IntC<kK / 8>{}, t, rows);
    issue_core(base + kSmem.q, q_g, p.q_stride_t, IntC<kK / 8>{}, t, want_out ? rows : 0);
    issue_rows(base + kSmem.v, kLdV, v_g, p.v_stride_t, IntC<kBV / 8>{}, t, zero_v ? 0 : rows);
    issue_core(base + kSmem.t0, t_g, i64(hv_count) * 64, IntC<8>{}, t, rows);
    if constexpr (!kStateP) {
      issue_core(base + kSmem.p, p_g, i64(hv_count) * 64, IntC<8>{}, t, want_out ? rows : 0);
    }
#else
    issue_rows(base + kSmem.k0, kLdK, k_g, p.k_stride_t, IntC<kK / 8>{}, t, rows);
    // q and P feed only the outputs: blocks that store none zero-fill them instead of loading.
    issue_rows(base + kSmem.q, kLdK, q_g, p.q_stride_t, IntC<kK / 8>{}, t, want_out ? rows : 0);
    issue_rows(base + kSmem.v, kLdV, v_g, p.v_stride_t, IntC<kBV / 8>{}, t, zero_v ? 0 : rows);
    issue_rows(base + kSmem.t0, kLd, t_g, i64(hv_count) * 64, IntC<8>{}, t, rows);
    if constexpr (!kStateP) {
      issue_rows(base + kSmem.p, kLd, p_g, i64(hv_count) * 64, IntC<8>{}, t, want_out ? rows : 0);
    }
#endif
    if (tid < 64) {
      const bool ok = tid < rows;
      cp_async::copy16(reinterpret_cast<float4*>(base + kSmem.sc0) + tid,
                       ok ? sc_g + (t + tid) * i64(hv_count) : sc_g, ok);
    } else if (kStateP && tid < 128) {
      // P's row factors, past each row of the stage's P tile (form_p).
      const int r = tid - 64;
      const bool ok = want_out && r < rows;
#if KJIT_GDN_STATE_WGMMA
      unsigned char* const dst = base + kSmem.p + kWgmmaPFactors + r * 16;
#else
      unsigned char* const dst = base + kSmem.p + r * (kLd * 2) + 128;
#endif
      cp_async::copy16(dst, ok ? pf_g + (t + r) * i64(hv_count) : pf_g, ok);
    }
  };
  // kStateP: the P of the chunk starting at token t (`rows` rows), from and into the stage at
  // `base` (form_p).
  [[maybe_unused]] const auto form_stage_p = [&](unsigned char* base, i64 t, int rows) {
#if KJIT_GDN_STATE_WGMMA
    // The stage's copies have landed (the caller waited for them); the tensor cores read them.
    wgmma::fence_shared_writes();
    float acc_qk[4][4];
    issue_qk_half<kK>(acc_qk, mma::smem_addr(base + kSmem.q), mma::smem_addr(base + kSmem.k0),
                      warp >> 2);
    wgmma::wait<0>();
    wgmma::hold_registers(acc_qk);
    store_p_half(acc_qk, base + kSmem.p, rows, warp >> 2, warp & 3, g, t4);
    wgmma::fence_shared_writes();  // P's stores, before the output products read them
#else
    form_p<kK, kWarps>(reinterpret_cast<const __nv_bfloat16*>(base + kSmem.q),
                       reinterpret_cast<const __nv_bfloat16*>(base + kSmem.k0),
                       reinterpret_cast<__nv_bfloat16*>(base + kSmem.p), rows, warp, g, t4,
                       (t - bos) / kGdnPrefillChunk);
#endif
  };
  // The warp's state rows: element (vw + g + 8 hf, kk) with kk = ni * 8 + 2 t4 + e at
  // s_acc[0][ni][2 hf + e] (the layout of store_state_tile with wm = warp, wn = 0).
  float s_acc[1][kSN][4];
  if (kPhase == 0 || (kPhase == 1 && cp.s == 0)) {
    const Tstate* src = has_init
                            ? static_cast<const Tstate*>(p.state) + slot * p.state_slot_stride +
                                  state_tile_offset<kKMajor, kK, kV>(hv, v0)
                            : nullptr;
#pragma unroll
    for (int ni = 0; ni < kSN; ++ni) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int v = vw + g + 8 * hf;
        const int kk = ni * 8 + 2 * t4;
        const float2 x =
            src != nullptr ? load_state_pair<kKMajor, kK, kV>(src, v, kk) : make_float2(0.f, 0.f);
        s_acc[0][ni][2 * hf] = x.x;
        s_acc[0][ni][2 * hf + 1] = x.y;
      }
    }
  } else {
    // Segment pass, s >= 1: state rows from zero, identity rows (K rows v0 ..) from I. Resume
    // pass: the exact initial state the scan kernel wrote (X). The scan kernel ran before this
    // launch started (no programmatic overlap), so X is read here.
    const float* src =
        kPhase == 2 ? p.cp_x + ((cp.z * hv_count + hv) * kV + v0) * i64(kK) : nullptr;
#pragma unroll
    for (int ni = 0; ni < kSN; ++ni) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int v = vw + g + 8 * hf;
        const int kk = ni * 8 + 2 * t4;
        float2 x = make_float2(0.f, 0.f);
        if (src != nullptr) {
          x = *reinterpret_cast<const float2*>(src + v * kK + kk);
        } else if (cp.identity) {
          x = make_float2(v0 + v == kk ? 1.f : 0.f, v0 + v == kk + 1 ? 1.f : 0.f);
        }
        s_acc[0][ni][2 * hf] = x.x;
        s_acc[0][ni][2 * hf + 1] = x.y;
      }
    }
  }

  Tout* o_base = static_cast<Tout*>(p.out) + i64(hv) * p.out_stride_h + v0 + vw;
  i64 ckpt_row = 0, ckpt_countdown = 0;
  // Checkpoints come from blocks with the exact state only (those that store outputs); a
  // segment starting at chunk c0 (all chunks before it are full) has written floor(c0 / E).
  const bool ckpt_here = kCkpt && want_out;
  if constexpr (kCkpt && kPhase == 0) {
    ckpt_row = p.checkpoint_starts[n];
    ckpt_countdown = p.ckpt_every_chunks;
  } else if constexpr (kCkpt) {
    ckpt_row = p.checkpoint_starts[n] + cp.first_chunk / p.ckpt_every_chunks;
    ckpt_countdown = p.ckpt_every_chunks - cp.first_chunk % p.ckpt_every_chunks;
  }

  // Everything above read only the caller's inputs (the state loads are still in flight); the
  // chunks' T', P and scales come from the chunk kernel, which may still be running
  // (programmatic dependent launch).
  grid_dependency::wait_for_previous_grid();
  // kHandoff: full[s] completes when every thread's copies into stage s have landed
  // (cp.async.mbarrier.arrive.noinc, kThreads arrivals), empty[s] when every warp is done
  // reading it (kWarps arrivals). Bit s of the phase masks: the parity of the next wait on s.
  [[maybe_unused]] u64* const full = reinterpret_cast<u64*>(smem + kSmem.barriers);
  [[maybe_unused]] u64* const empty = full + kStages;
  // kStateP: p_ready[s] completes when every thread has stored its share of stage s's P (each
  // thread's arrival releases its own stores), which the warps form during the chunk before
  // (form_p), so that no warp waits for P on its own chain.
  [[maybe_unused]] u64* const p_ready = empty + kStages;
  [[maybe_unused]] u32 full_phase = 0, empty_phase = 0, p_ready_phase = 0;
  // kWs: chunk_ready[s] (see above), after the stages' barriers.
  [[maybe_unused]] u64* const chunk_ready = reinterpret_cast<u64*>(smem + kSmem.total);
  [[maybe_unused]] u32 chunk_ready_phase = 0;
  // kWs: t_ready[c & 1] (T' of chunk c, by the warpgroup going second), and chunk c's parity
  // (warpgroup `parity` goes first on the chunk).
  [[maybe_unused]] u64* const t_ready = reinterpret_cast<u64*>(smem + kWsSmem.t_ready);
  [[maybe_unused]] u32 t_ready_phase = 0, ws_par = 0;
  // kWs: waits until the chunk warpgroup's T', P^T and scales of stage s's chunk are in (once per
  // chunk, before form_r reads the scales).
  [[maybe_unused]] const auto wait_chunk_ready = [&](int s) {
#if KJIT_GDN_STATE_WGMMA
    if constexpr (kWs) {
      mbarrier::wait(chunk_ready + s, (chunk_ready_phase >> s) & 1u);
      chunk_ready_phase ^= 1u << s;
    }
#endif
  };
#if KJIT_GDN_STATE_WGMMA
  // Two warpgroups (the whole-V tile) take turns issuing a chunk's first products (named
  // barriers 2 and 3, 256 threads: one warpgroup waits, the other arrives): warpgroup 1 issues
  // after warpgroup 0, and warpgroup 0 its next chunk's only after warpgroup 1 has issued this
  // one's. Each warpgroup's element-wise work (R, Vn, the outputs) then runs while the other's
  // products hold the tensor cores, instead of both waiting on the tensor cores at once.
  // Not in the warp-specialized kernel: since S became its register A operand (no shared S tile
  // between the warpgroups) the turns only made one warpgroup wait for the other's issue; without
  // them the call took 0-1.6% less at 128k/16 and -1.1 to +0.3% at HV = 2H (three H100 calls,
  // docs/performance.md, "No turns, and the decay pass in one body").
  constexpr bool kTakeTurns = kWarps == 8 && kHandoff && !kWs;
  const int wg = warp >> 2;
  const auto turn_wait = [&] {
    if constexpr (kTakeTurns) named_barrier::sync<256>(2 + wg);
  };
  const auto turn_pass = [&] {
    if constexpr (kTakeTurns) named_barrier::arrive<256>(3 - wg);
  };
  // Warpgroup 0 goes first; the arrivals balance at the end (warpgroup 0 waits once more).
  if (wg == 1) turn_pass();
#endif
  if constexpr (kHandoff) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (!kWs && tid == 0) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        mbarrier::init(full + s, kThreads);
        mbarrier::init(empty + s, kWarps);
        mbarrier::init(p_ready + s, kThreads);
      }
    }
    // (kWs: initialized before the roles split; the chunk warpgroup is gone from block barriers.)
    if constexpr (!kWs) __syncthreads();
    if (bos < eos) {
      if constexpr (!kWs) {
        fill(0, bos);
        mbarrier::cp_async_arrive_noinc(full);
      }
      if constexpr (kFetchAhead) {
        // Chunks 1 .. kStages - 2 before the loop too.
#pragma unroll
        for (int c = 1; c < kStages - 1; ++c) {
          const i64 t = bos + i64(c) * kGdnPrefillChunk;
          if (t < eos) {
            fill(c, t);
            mbarrier::cp_async_arrive_noinc(full + c);
          }
        }
      }
      if constexpr (kStateP) {
        // The first chunk's P, before the loop; each later chunk's during the chunk before it.
        if (want_out) {
          mbarrier::wait(full, 0u);
          form_stage_p(smem, bos, rows_at(bos));
          mbarrier::arrive(p_ready);
        }
      }
    }
#endif
  } else {
    // Prologue: chunks 0 .. kStages - 2, one commit group each (empty past the end).
#pragma unroll
    for (int c = 0; c < kStages - 1; ++c) {
      const i64 t = bos + i64(c) * kGdnPrefillChunk;
      if (t < eos) fill(c, t);
      cp_async::commit();
    }
  }

  int st = 0;
  // kWs: the byte offset of this chunk's T' / P^T slot (two slots, chunks alternate).
  [[maybe_unused]] u32 tp_off = 0;
  // kWs, measurement only (KJIT_GDN_WS_PROFILE): the loop's stretches, each closed by mark().
  [[maybe_unused]] const WsProfile prof(p);
  [[maybe_unused]] long long tp = 0;
  [[maybe_unused]] const auto mark = [&](int site) {
    if constexpr (kWs) tp = prof.add(site, tp);
  };
  for (i64 t0 = bos; t0 < eos; t0 += kGdnPrefillChunk) {
    const int rows = rows_at(t0);
    [[maybe_unused]] const int cur = st;
    if constexpr (kWs) tp = prof.now();
#if KJIT_GDN_STATE_WGMMA
    // kWs: the warpgroups alternate by chunk: on chunk c warpgroup c & 1 issues its first products
    // at once while the other inverts (I + A) for T' before its own, and goes first on chunk
    // c + 1. With warpgroup 1 inverting every chunk it was busy ~90% of its loop and warpgroup 0
    // waited a quarter of its own for T' (docs/performance.md).
    [[maybe_unused]] const bool goes_first = wg == int(ws_par);
    if constexpr (kWs && kGdnWsChunkAlone) {  // measurement only: the chunk side's pace
      mbarrier::wait(full + st, (full_phase >> st) & 1u);
      full_phase ^= 1u << st;
      wait_chunk_ready(st);
      if (!goes_first) mbarrier::arrive(t_ready + ws_par);  // (the inverse left out)
      ws_par ^= 1u;
      mbarrier::arrive(empty + st);
      st = st + 1 == kStages ? 0 : st + 1;
      continue;
    }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kHandoff) {
      mbarrier::wait(full + st, (full_phase >> st) & 1u);
      full_phase ^= 1u << st;
#if KJIT_GDN_STATE_WGMMA
      // The stage's bytes came through cp.async (the generic proxy); wgmma reads them through
      // the async proxy. The barrier made every thread's copies visible to this thread.
      wgmma::fence_shared_writes();
#endif
      mark(kWsProfStateFull);
      const int sn = st + 1 == kStages ? 0 : st + 1;
      const i64 tn = t0 + kGdnPrefillChunk;
      if (!kWs && !kFetchAhead && tn < eos) {
        // Stage sn last held chunk c + 1 - kStages: wait until every warp has released it.
        if (t0 - bos >= i64(kStages - 1) * kGdnPrefillChunk) {
          mbarrier::wait(empty + sn, (empty_phase >> sn) & 1u);
          empty_phase ^= 1u << sn;
        }
        fill(sn, tn);
        mbarrier::cp_async_arrive_noinc(full + sn);
      }
    }
#endif
    // kFetchAhead: chunk c + kStages - 1 into the stage chunk c - 1 used, once every warp has
    // released it; called after the chunk's first products, by when the other warps are almost
    // always past chunk c - 1. The copies then have about one and a half chunk steps to land.
    [[maybe_unused]] const auto fetch_ahead = [&] {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const i64 ta = t0 + i64(kStages - 1) * kGdnPrefillChunk;
      if (ta < eos) {
        const int sa = cur == 0 ? kStages - 1 : cur - 1;
        if (t0 > bos) {
          mbarrier::wait(empty + sa, (empty_phase >> sa) & 1u);
          empty_phase ^= 1u << sa;
        }
        fill(sa, ta);
        mbarrier::cp_async_arrive_noinc(full + sa);
      }
#endif
    };
    // This chunk's inputs have landed (every thread's copies, after the barrier); every warp is
    // done with chunk c - 1, whose stage now takes chunk c + kStages - 1.
    if constexpr (!kHandoff) {
      const i64 ta = t0 + i64(kStages - 1) * kGdnPrefillChunk;
      const int sa = st == 0 ? kStages - 1 : st - 1;
      cp_async::wait<kStages - 2>();
#if KJIT_GDN_STATE_WGMMA
      wgmma::fence_shared_writes();  // this thread's copies, before wgmma reads them
#endif
      __syncthreads();
      if (ta < eos) fill(sa, ta);
      cp_async::commit();
    }
    unsigned char* const base = smem + st * kStage;
    const __nv_bfloat16* s_k = reinterpret_cast<const __nv_bfloat16*>(base + kSmem.k0);
    const __nv_bfloat16* s_q = reinterpret_cast<const __nv_bfloat16*>(base + kSmem.q);
    const __nv_bfloat16* s_v = reinterpret_cast<const __nv_bfloat16*>(base + kSmem.v);
    unsigned char* const tp_base = kWs ? smem + tp_off : base;
    // kWs: this chunk's 1 / |q_i| (times the output scale), one copy per stage: the chunk
    // warpgroup writes it before its chunk_ready arrival, both state warpgroups read it after
    // their wait for chunk_ready, and the stage's next chunk rewrites it only after every state
    // thread released the stage.
    [[maybe_unused]] float* const s_rqw = reinterpret_cast<float*>(smem + kWsSmem.rq) + cur * 64;
    const __nv_bfloat16* s_t = reinterpret_cast<const __nv_bfloat16*>(tp_base + kSmem.t0);
    __nv_bfloat16* const s_p = reinterpret_cast<__nv_bfloat16*>(tp_base + kSmem.p);
    const float4* s_sc = reinterpret_cast<const float4*>(base + kSmem.sc0);
    st = st + 1 == kStages ? 0 : st + 1;
    [[maybe_unused]] const int par = int(ws_par);
    if constexpr (kWs) {
      tp_off = kWsSmem.tp_stride - tp_off;
      ws_par ^= 1u;
    }
#if !KJIT_GDN_STATE_WGMMA
    // kStateP without the handoff (2 stages, or before sm_90): this chunk's P here, shared by
    // every warp's O through a block barrier before step 5.
    if constexpr (kStateP && !kHandoff) {
      if (want_out) form_p<kK, kWarps>(s_q, s_k, s_p, rows, warp, g, t4, (t0 - bos) / 64);
    }
#endif

#if KJIT_GDN_STATE_WGMMA
    // The same chain on warpgroup products: each warpgroup's four warps (64 rows of V) give
    // their state rows as A fragments and the tensor cores read k, q, T' and P once per
    // warpgroup from the swizzled tiles. O comes out transposed (rows v, columns i).
    const u32 k_addr = mma::smem_addr(s_k), q_addr = mma::smem_addr(s_q);
    // k and q: a pair tile (gdn_prefill_state_smem's paired_kq), slices kPairSlice apart.
    constexpr u32 kPair = sw128::kPairSlice;
    const u32 t_addr = mma::smem_addr(s_t), p_addr = mma::smem_addr(s_p);
    // Each tile's descriptor once; a k-step's is it advanced by a constant (wgmma::advance).
    const u64 k_desc = wgmma::descriptor_sw128(k_addr, 16, kSwAtom),
              q_desc = wgmma::descriptor_sw128(q_addr, 16, kSwAtom),
              t_desc = wgmma::descriptor_sw128(t_addr, 16, kSwAtom),
              p_desc = wgmma::descriptor_sw128(p_addr, 16, kSwAtom),
              pt_desc = wgmma::descriptor_sw128(p_addr, sw128::kSlice, kSwAtom),
              kn_desc = wgmma::descriptor_sw128(k_addr, sw128::kPairSlice, kSwAtom);

    // 1. S_w K^T (acc_r: rows v, columns j) and S_w Q^T (acc_o: rows v, columns i), over K.
    float acc_r[8][4], acc_o[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_r[i][e] = acc_o[i][e] = 0.f;
    }
    wgmma::hold_registers(acc_r);
    wgmma::hold_registers(acc_o);
    if constexpr (kWs) {
      // S_w as register A fragments beside one n = 128 product of the pair tile [k; q] (k's
      // descriptor spans both): the tensor cores read only the pair tile. A shared S tile, which
      // every warp stored (stmatrix) and the tensor cores read back each chunk, made the call ~2%
      // slower at HV = H and ~8% at HV = 2H on the H200 (docs/performance.md, "S as register A").
      // (q's norms, which only O needs, are the chunk warpgroup's: WsChunkRole::run.)
      // T' of this chunk: the second warpgroup inverts (I + A) from the chunk warpgroup's A tile
      // before its products (the first issues its own meanwhile); its arrivals also hand A's tile
      // back.
      if (!goes_first) {
        wait_chunk_ready(cur);
        mark(kWsProfStateChunkReady);
        if constexpr (!kGdnWsNoInverse) {
          // (The profile splits it at its two barriers.)
          int inverse_phase = 0;
          ChunkRole::invert(smem, tp_base + kSmem.t0, par, warp & 3, lane, [&] {
            warpgroup_sync(wg);
            mark(inverse_phase++ == 0 ? kWsProfStateInvDiag : kWsProfStateInvFirst);
          });
        }
        wgmma::fence_shared_writes();  // this thread's T' stores, before wgmma reads them
        mbarrier::arrive(t_ready + par);
        mark(kWsProfStateInverse);
      }
      u32 s_frag[kKSteps][4];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) state_fragment(s_acc[0], ks, s_frag[ks]);
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        wgmma::mma_m64n128k16<0>(acc_r, acc_o, s_frag[ks],
                                 wgmma::advance(k_desc, sw128::k_step<kPair>(0, ks)));
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::hold_registers(acc_r);
      wgmma::hold_registers(acc_o);
      mark(kWsProfStateFirst);
      // This chunk's P^T and scales from the chunk warpgroup (the second warpgroup waited above).
      if (goes_first) wait_chunk_ready(cur);
      mark(kWsProfStateChunkReady);
    } else {
      u32 s_frag[kKSteps][4];
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) state_fragment(s_acc[0], ks, s_frag[ks]);
      turn_wait();
      wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        wgmma::mma_m64n64k16<0>(acc_r, s_frag[ks],
                                wgmma::advance(k_desc, sw128::k_step<kPair>(0, ks)));
      }
      // With the handoff, R is formed while S_w Q^T runs on (needed only for O, in step 5); the
      // 2-stage form waits for both (the split spilled 24 bytes there at K = 128).
      if constexpr (kHandoff) wgmma::commit();
      // (Context-parallel blocks without outputs skip the products that feed only O; the
      // commit groups stay the same, empty.)
      if (want_out) {
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          wgmma::mma_m64n64k16<0>(acc_o, s_frag[ks],
                                  wgmma::advance(q_desc, sw128::k_step<kPair>(0, ks)));
        }
      }
      wgmma::commit();
      turn_pass();
      wgmma::wait<kHandoff ? 1 : 0>();
      wgmma::hold_registers(acc_r);
    }

    // 2. R_w^T and the update's column scales.
    u32 ra[4][4];
    float kd[4][2][2];
    if constexpr (kWs) {
      // (The ws stage's v rows are 128-byte swizzled, as q and k.)
      const u32 v_tile = mma::smem_addr(s_v);
      form_r(
          acc_r, [&](int jb, u32(&vt)[4]) { mma::load_a_trans_sw128(vt, v_tile, jb * 16, vw); },
          s_sc, t4, ra, kd);
    } else {
      form_r(acc_r, s_v + vw, kLdV, s_sc, t4, ra, kd);
    }
    if constexpr (kWs) {
      mark(kWsProfStateR);
      mbarrier::wait(t_ready + par, (t_ready_phase >> par) & 1u);
      t_ready_phase ^= 1u << par;
      mark(kWsProfStateTReady);
    }

    // 3. Vn_w^T = R_w^T T'^T (T''s zero upper blocks are multiplied too).
    float acc_v[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_v[i][e] = 0.f;
    }
    wgmma::hold_registers(acc_v);
    wgmma::fence();
#pragma unroll
    for (int jb = 0; jb < 4; ++jb) {
      wgmma::mma_m64n64k16<0>(acc_v, ra[jb], wgmma::advance(t_desc, jb * 32));
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::hold_registers(acc_v);
    wgmma::hold_registers(acc_o);
    u32 vb[4][4], vd[4][4];
    pack_vn(acc_v, kd, vb, vd);
    mark(kWsProfStateVn);

    // 4 and 5 in one group: S_w <- e^gamma_last S_w + Vd_w^T K (k read N-major) and
    // O_w^T = diag(e^gamma / |q|) (S_w Q^T) + Vn_w^T P^T.
    {
      const float decay = s_sc[0].w;
#pragma unroll
      for (int ni = 0; ni < kSN; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[0][ni][e] *= decay;
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float sx0 = s_sc[nt * 8 + 2 * t4].x, sx1 = s_sc[nt * 8 + 2 * t4 + 1].x;
        acc_o[nt][0] *= sx0;
        acc_o[nt][1] *= sx1;
        acc_o[nt][2] *= sx0;
        acc_o[nt][3] *= sx1;
      }
      wgmma::hold_registers(s_acc[0]);
      wgmma::hold_registers(acc_o);
      if constexpr (kStateP) {
        // This chunk's P, formed by both warpgroups during the chunk before.
        mbarrier::wait(p_ready + cur, (p_ready_phase >> cur) & 1u);
        p_ready_phase ^= 1u << cur;
        wgmma::fence_shared_writes();
      }
      wgmma::fence();
#pragma unroll
      for (int jb = 0; jb < 4 && want_out; ++jb) {
        if constexpr (kWs) {
          // P^T from the chunk warpgroup: N-major, 16 token rows (two atoms) per k-step.
          wgmma::mma_m64n64k16<1>(acc_o, vb[jb], wgmma::advance(pt_desc, jb * 2 * kSwAtom));
        } else {
          wgmma::mma_m64n64k16<0>(acc_o, vb[jb], wgmma::advance(p_desc, jb * 32));
        }
      }
      wgmma::commit();
#pragma unroll
      for (int jb = 0; jb < 4; ++jb) {
        // N-major: 16 token rows (two atoms) per k-step, k's column slices kPairSlice apart.
        const u64 kn = wgmma::advance(kn_desc, jb * 2 * kSwAtom);
        if constexpr (kK == 128) {
          wgmma::mma_m64n128k16<1>(s_acc[0], vd[jb], kn);
        } else {
          wgmma::mma_m64n64k16<1>(s_acc[0], vd[jb], kn);
        }
      }
      wgmma::commit();
      // Column i of O^T times 1 / |q_i| (and the output scale), below: neither the chunk
      // warpgroup's P^T nor the scales hold it. Loaded before the wait (whose asm clobbers memory,
      // so that a load written after it is issued after it): their latency then overlaps the
      // products' instead of following it (Nsight Compute: the first multiply waited ~1.5% of
      // the state warpgroups' samples).
      [[maybe_unused]] float2 rq_cols[8];
      if constexpr (kWs) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          rq_cols[nt] = ChunkRole::kL2Norm
                            ? *reinterpret_cast<const float2*>(s_rqw + nt * 8 + 2 * t4)
                            : make_float2(p.scale, p.scale);
        }
      }
      // O is done; the state update runs on while the outputs are stored.
      wgmma::wait<1>();
      wgmma::hold_registers(acc_o);
      if constexpr (kWs) {
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float2 rq = rq_cols[nt];
          acc_o[nt][0] *= rq.x;
          acc_o[nt][1] *= rq.y;
          acc_o[nt][2] *= rq.x;
          acc_o[nt][3] *= rq.y;
        }
        mark(kWsProfStateUpdate);
      }
    }

    // The chunk's outputs: element (v = vw + g + 8 hf, i = 8 nt + 2 t4 + e) of O^T. bf16 rows
    // go out as pairs of v: each 8 x 8 tile packed and transposed in registers (movmatrix), so
    // that a lane holds (i = 8 nt + g, v = 2 t4 + 8 hf and + 1) and stores 4 bytes, not 2 x 2.
    if (!want_out) {
      // (A context-parallel segment from zero or from the identity: no outputs.)
    } else if (OutIsBf16<Tout>::value && ws_tma_store(rows)) {
#if KJIT_GDN_STATE_WGMMA
      // The ws kernel's whole chunks of bf16 out by one TMA box per warp: its 64 tokens x 16
      // values into its own tile by four stmatrix .trans (a lane's pairs of v at token rows; no
      // movmatrix, no 64-bit addresses), then one lane hands the tile to the copy engine. The
      // warp's own tile and __syncwarp: no warpgroup barrier (a box per warpgroup, two barriers a
      // chunk, lost ~1% at HV = H, docs/performance.md "The outputs by TMA").
      unsigned char* const tile = smem + kWsSmem.out_tiles + u32(warp) * kGdnPrefillWsOutTileBytes;
      // The previous chunk's store has read the tile (issued a whole chunk ago).
      if (lane == 0) tma::wait_group_read<0>();
      __syncwarp();
      const int m = lane >> 3, k = lane & 7;
#pragma unroll
      for (int pair = 0; pair < 4; ++pair) {
        // Matrix m: token rows 8 (2 pair + m / 2) .. + 7, values 8 (m % 2) .. + 7 (hf).
        u32 r[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int nt = 2 * pair + (j >> 1), hf = j & 1;
          r[j] = mma::pack_bf16(acc_o[nt][2 * hf], acc_o[nt][2 * hf + 1]);
        }
        // Token row i at 32 i bytes, its two 16-byte halves swapped where bit 2 of i is set (the
        // map's 32-byte swizzle: the eight rows of a matrix in eight bank groups).
        const int i = 8 * (2 * pair + (m >> 1)) + k;
        mma::stmatrix_x4_trans(mma::smem_addr(tile + 32 * i + ((((m & 1) ^ (i >> 2)) & 1) << 4)),
                               r);
      }
      wgmma::fence_shared_writes();  // the stmatrix writes, before the copy engine reads them
      __syncwarp();
      if (lane == 0) {
        tma::store_3d(&p.out_map, int(v0 + vw), int(hv), int(t0), tile);
        tma::commit_group();
      }
#endif
    } else if constexpr (OutIsBf16<Tout>::value) {
      Tout* const o_rows = o_base + (t0 + g) * p.out_stride_t + 2 * t4;
      // Without checkpoints the row pointer advances by 8 rows a tile: two adds, where o_rows + 8
      // nt stride took a multiply and a 64-bit shift-add to bytes per tile. With them the state
      // role spilled more with that pointer carried across the tiles (40 / 56 -> 68 / 100 bytes),
      // so each tile's row is computed from o_rows.
      Tout* orow = o_rows;
      const i64 tile_step = 8 * p.out_stride_t;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const u32 lo = mma::transpose8x8(mma::pack_bf16(acc_o[nt][0], acc_o[nt][1]));
        const u32 hi = mma::transpose8x8(mma::pack_bf16(acc_o[nt][2], acc_o[nt][3]));
        // (Measurement only, kGdnWsNoOutStores: a test no row passes, for the ws kernel.)
        if (nt * 8 + g < ((kWs && kGdnWsNoOutStores) ? rows - 4096 : rows)) {
          u32* const dst = reinterpret_cast<u32*>(kCkpt ? o_rows + nt * 8 * p.out_stride_t : orow);
          dst[0] = lo;
          dst[4] = hi;
        }
        if constexpr (!kCkpt) orow += tile_step;
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = nt * 8 + 2 * t4 + e;
          if (i < rows) {
            Tout* orow = o_base + (t0 + i) * p.out_stride_t + g;
            store_one(orow, acc_o[nt][e]);
            store_one(orow + 8, acc_o[nt][2 + e]);
          }
        }
      }
    }
    // kStateP: the next chunk's half of Q K^T behind the state update, once its copies have
    // landed (issued a whole chunk ago); its P goes to the next stage when both are done.
    [[maybe_unused]] float acc_qk[4][4];
    [[maybe_unused]] const i64 t_next = t0 + kGdnPrefillChunk;
    [[maybe_unused]] const int s_next = cur + 1 == kStages ? 0 : cur + 1;
    if constexpr (kStateP) {
      if (t_next < eos) {
        mbarrier::wait(full + s_next, (full_phase >> s_next) & 1u);
        wgmma::fence_shared_writes();
        unsigned char* const nb = smem + s_next * kStage;
        issue_qk_half<kK>(acc_qk, mma::smem_addr(nb + kSmem.q), mma::smem_addr(nb + kSmem.k0),
                          warp >> 2);
      }
    }
    wgmma::wait<0>();
    wgmma::hold_registers(s_acc[0]);
    // The warp's last read of this chunk's stage is done (the products have completed): release
    // it before forming the next chunk's P, so that whoever refills it (the next fill here, the
    // chunk warpgroup of the warp-specialized kernel) need not wait for that too.
    if constexpr (kWs) {
      mbarrier::arrive(empty + cur);
      mark(kWsProfStateStore);
      prof.count_chunk();
    } else if constexpr (kHandoff) {
      __syncwarp();
      if (lane == 0) mbarrier::arrive(empty + cur);
    }
    if constexpr (kStateP) {
      if (t_next < eos) {
        wgmma::hold_registers(acc_qk);
        unsigned char* const nb = smem + s_next * kStage;
        store_p_half(acc_qk, nb + kSmem.p, rows_at(t_next), warp >> 2, warp & 3, g, t4);
        wgmma::fence_shared_writes();  // P's stores, before the output products read them
        mbarrier::arrive(p_ready + s_next);
      }
    }
#else
    // 1. S_w K^T (rows v, columns j: acc_r[nt], j = 8 nt + 2 t4 + e) and Q S_w^T (rows i,
    // columns v: acc_o[mt][nv], i = 16 mt + g + 8 hf, v = 8 nv + 2 t4 + e) in one pass over K.
    float acc_r[8][4], acc_o[4][2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_r[i][e] = acc_o[i / 2][i % 2][e] = 0.f;
    }
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      u32 sa[4];
      state_fragment(s_acc[0], ks, sa);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        u32 b[4];
        mma::load_b2(b, s_k + np * 16 * kLdK + ks * 16, kLdK);
        mma::mma_bf16(acc_r[2 * np], sa, b[0], b[1]);
        mma::mma_bf16(acc_r[2 * np + 1], sa, b[2], b[3]);
      }
      if (want_out) {
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          u32 a[4];
          mma::load_a(a, s_q + mt * 16 * kLdK + ks * 16, kLdK);
          mma::mma_bf16(acc_o[mt][0], a, sa[0], sa[2]);
          mma::mma_bf16(acc_o[mt][1], a, sa[1], sa[3]);
        }
      }
    }

    if constexpr (kFetchAhead) fetch_ahead();

    // 2. R_w^T = V_w^T - S_w K^T diag(e^gamma / |k|), packed as the A fragments of its four
    // 16-column blocks; the state update's scales e^(gamma_last - gamma_j) / |k_j| of the same
    // columns.
    u32 ra[4][4];
    float kd[4][2][2];
    form_r(acc_r, s_v + vw, kLdV, s_sc, t4, ra, kd);

    // 3. Vn_w^T = R_w^T T'^T (T' lower triangular: column blocks <= the row block).
    float acc_v[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_v[i][e] = 0.f;
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
#pragma unroll
      for (int jb = 0; jb <= np; ++jb) {
        u32 b[4];
        mma::load_b2(b, s_t + np * 16 * kLd + jb * 16, kLd);
        mma::mma_bf16(acc_v[2 * np], ra[jb], b[0], b[1]);
        mma::mma_bf16(acc_v[2 * np + 1], ra[jb], b[2], b[3]);
      }
    }
    // Vn_w^T as bf16 fragments (B of P Vn_w) and decayed, 1/|k|-scaled (A of the update).
    u32 vb[4][4], vd[4][4];
    pack_vn(acc_v, kd, vb, vd);

    // 4. S_w <- e^gamma_last S_w + Vd_w^T K (the order of update_state_tile).
    {
      const float decay = s_sc[0].w;
#pragma unroll
      for (int ni = 0; ni < kSN; ++ni) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[0][ni][e] *= decay;
      }
#pragma unroll
      for (int jb = 0; jb < 4; ++jb) {
#pragma unroll
        for (int np = 0; np < kSN / 2; ++np) {
          u32 b[4];
          mma::load_b2_trans(b, s_k + jb * 16 * kLdK + np * 16, kLdK);
          mma::mma_bf16(s_acc[0][2 * np], vd[jb], b[0], b[1]);
          mma::mma_bf16(s_acc[0][2 * np + 1], vd[jb], b[2], b[3]);
        }
      }
    }

    // 5. O_w = diag(e^gamma / |q|) Q S_w^T + P Vn_w (P lower triangular); store the chunk's rows
    // (the thread's rows g + 8 hf + 16 mt: one row address per chunk, the rest a block-uniform
    // step away).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kStateP && kHandoff) {
      // The next chunk's P, formed now that its inputs have (almost certainly) landed: work off
      // this chunk's chain, which the state update's products are still draining.
      const i64 tn = t0 + kGdnPrefillChunk;
      if (want_out && tn < eos) {
        const int sn = cur + 1 == kStages ? 0 : cur + 1;
        mbarrier::wait(full + sn, (full_phase >> sn) & 1u);
        form_stage_p(smem + sn * kStage, tn, rows_at(tn));
        mbarrier::arrive(p_ready + sn);
      }
      // This chunk's P, formed by every warp during the chunk before.
      if (want_out) {
        mbarrier::wait(p_ready + cur, (p_ready_phase >> cur) & 1u);
        p_ready_phase ^= 1u << cur;
      }
    }
#endif
    if constexpr (kStateP && !kHandoff) {
      // Every warp's share of P is in shared memory (bar.sync 1: barrier 0 is __syncthreads').
      if (want_out) named_barrier::sync_count<1>(kThreads);
    }
    if (want_out) {
      Tout* const o_rows = o_base + (t0 + g) * p.out_stride_t + 2 * t4;
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float sx = s_sc[mt * 16 + g + 8 * hf].x;
#pragma unroll
          for (int nv = 0; nv < 2; ++nv) {
            acc_o[mt][nv][2 * hf] *= sx;
            acc_o[mt][nv][2 * hf + 1] *= sx;
          }
        }
#pragma unroll
        for (int jb = 0; jb <= mt; ++jb) {
          u32 a[4];
          mma::load_a(a, s_p + mt * 16 * kLd + jb * 16, kLd);
          mma::mma_bf16(acc_o[mt][0], a, vb[jb][0], vb[jb][2]);
          mma::mma_bf16(acc_o[mt][1], a, vb[jb][1], vb[jb][3]);
        }
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (mt * 16 + g + 8 * hf < rows) {
            Tout* orow = o_rows + (mt * 16 + 8 * hf) * p.out_stride_t;
#pragma unroll
            for (int nv = 0; nv < 2; ++nv) {
              store_pair(orow + nv * 8, acc_o[mt][nv][2 * hf], acc_o[mt][nv][2 * hf + 1]);
            }
          }
        }
      }
    }

#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !KJIT_GDN_STATE_WGMMA
    if constexpr (kHandoff) {
      __syncwarp();
      if (lane == 0) mbarrier::arrive(empty + cur);
    }
#endif

    // 6. Checkpoints, as in the fused kernel.
    if constexpr (kCkpt) {
      if (ckpt_here && rows == kGdnPrefillChunk && --ckpt_countdown == 0) {
        ckpt_countdown = p.ckpt_every_chunks;
        if (ckpt_row >= 0 && ckpt_row < p.ckpt_rows) {
          store_state_tile<Tstate, kK, kKMajor, kV>(static_cast<Tstate*>(p.checkpoints) +
                                                        ckpt_row * p.ckpt_slot_stride +
                                                        state_tile_offset<kKMajor, kK, kV>(hv, v0),
                                                    s_acc, warp, 0, g, t4);
        }
        ++ckpt_row;
      }
    }
  }
#if KJIT_GDN_STATE_WGMMA
  if (wg == 0) turn_wait();
  // The warp's TMA stores of out have written global memory before the block ends.
  if (kWs && lane == 0 && p.tma_out != 0) tma::wait_group<0>();
#endif
  // No copies are in flight at exit: none is issued past the end of the sequence.
  if constexpr (kPhase == 0) {
    store_final_state<Tstate, kK, kV, kKMajor>(p, n, slot, padded, hv, v0, s_acc, warp, 0, g, t4);
  } else {
    // The sequence's last segment holds its final state (segment pass: a sequence of one
    // segment); segment-pass blocks of a longer sequence leave B (state rows) or M (identity
    // rows) for the scan kernel, in f32.
    if (cp.s == cp.segments - 1) {
      store_final_state<Tstate, kK, kV, kKMajor>(p, n, slot, padded, hv, v0, s_acc, warp, 0, g, t4);
    } else if (kPhase == 1) {
      float* dst = cp.identity ? p.cp_m + ((cp.z * hv_count + hv) * kK + v0) * i64(kK)
                               : p.cp_b + ((cp.z * hv_count + hv) * kV + v0) * i64(kK);
      store_state_tile<float, kK>(dst, s_acc, warp, 0, g, t4);
    }
  }
}

}  // namespace gdn_prefill_detail

/// Template parameters: element types of q/k/v (bf16: raw rows are mma operands), of the state
/// pool, of out, of cu_seqlens and of state_indices; K, V, the value tile kBV; kCkpt as in the
/// fused kernel. A tile of all of V (kBV = 128) loads each chunk's q, k, T' and P once per
/// (sequence, value head) instead of once per tile: the smaller tiles spend their time moving
/// those bytes into shared memory. kStateLayout (GdnStateLayout): the layout of the pool, the
/// final states and the checkpoints. kStages: input stages of the wide tiles (3: handed over by
/// mbarriers on sm_90 and later, see state_wide).
template <typename Tin, typename Tstate, typename Tout, typename Tcu, typename Tidx, int kK, int kV,
          int kBV, bool kCkpt, int kStateLayout = kGdnStateVMajor, int kStages = 2,
          bool kStateP = false>
__global__ void __launch_bounds__(32 * gdn_prefill_state_warps(kBV))
    gdn_prefill_state_kernel(const GdnPrefillParams p) {
  constexpr bool kKMajor = kStateLayout == kGdnStateKMajor;
  static_assert(!kStateP || gdn_prefill_state_wide(kBV), "P is formed by the wide tiles only");
  if constexpr (gdn_prefill_state_wide(kBV)) {
    gdn_prefill_detail::state_wide<Tin, Tstate, Tout, Tcu, Tidx, kK, kV, kBV, kCkpt, 0, kStages,
                                   kKMajor, kStateP>(p);
  } else {
    gdn_prefill_detail::state_tiles<Tin, Tstate, Tout, Tcu, Tidx, kK, kV, kBV, kCkpt, kKMajor>(p);
  }
}

/// The context-parallel path's two passes over segments of the sequences (see CpWork): kPhase 1
/// the segment pass, kPhase 2 the resume pass. The wide tiles only (kBV = 64 or 128 dividing K
/// and V), on mma.sync, or compiled for sm_90a with the whole-V tile on warpgroup wgmma.
template <typename Tin, typename Tstate, typename Tout, typename Tcu, typename Tidx, int kK, int kV,
          int kBV, bool kCkpt, int kPhase, int kStages, int kStateLayout = kGdnStateVMajor,
          bool kStateP = false>
__global__ void __launch_bounds__(32 * gdn_prefill_state_warps(kBV))
    gdn_prefill_state_cp_kernel(const GdnPrefillParams p) {
  static_assert(gdn_prefill_state_wide(kBV), "the context-parallel passes use the wide tiles");
  static_assert(kPhase == 1 || kPhase == 2, "phase 1 (segments) or 2 (resume)");
  // The pool, final states and checkpoints in kStateLayout; the f32 scratch between the passes
  // (segment end states, maps, exact initial states) stays V-major.
  gdn_prefill_detail::state_wide<Tin, Tstate, Tout, Tcu, Tidx, kK, kV, kBV, kCkpt, kPhase, kStages,
                                 kStateLayout == kGdnStateKMajor, kStateP>(p);
}

}  // namespace kjit
