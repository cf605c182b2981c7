// SPDX-License-Identifier: Apache-2.0
// Parameter block and shared-memory layout of the Gated DeltaNet chunked prefill kernel
// (templates/gdn_prefill/gdn_prefill.cuh), shared with host code (lib/ops/gdn_prefill/): the host
// sizes the dynamic shared memory with the same function the kernel carves it with.
#pragma once

#include "templates/common/gdn_state_layout.h"
#include "templates/common/tensor_map.h"
#include "templates/common/types.h"

// The layout function runs on both sides; host compilers do not know __host__ __device__.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KJIT_GDN_PREFILL_HD __host__ __device__
#else
#define KJIT_GDN_PREFILL_HD
#endif

namespace kjit {

/// Tokens per chunk of the WY algorithm.
inline constexpr int kGdnPrefillChunk = 64;
/// Threads per block (4 warps: each owns 16 rows of a 64-row chunk product).
inline constexpr int kGdnPrefillThreads = 128;

/// Byte offsets of the kernel's shared-memory buffers for key dim `k` and value tile `bv`.
/// bf16 tiles have 8 elements of row padding (16 bytes) so ldmatrix rows land on distinct bank
/// groups; f32 tiles are [64][72].
struct GdnPrefillSmem {
  u32 q;      // bf16 [64][k + 8]: L2-normalized q of the chunk
  u32 k;      // bf16 [64][k + 8]: L2-normalized k of the chunk
  u32 s;      // bf16 [bv][k + 8]: the state tile at chunk start (mma operand copy)
  u32 a;      // f32 [64][72]: gated strictly-lower beta K K^T; later Vn^T and decayed Vn^T
  u32 t;      // f32 [64][72]: (I + A)^-1, lower blocks; upper blocks are scratch
  u32 p;      // bf16 [64][72]: causal gated q k^T
  u32 r;      // bf16 [bv][72]: R^T = (beta (v - e^gamma k S^T))^T
  u32 gamma;  // f32 [64]: chunk-local cumulative log decay
  u32 beta;   // f32 [64]
  u32 total;  // bytes in all
};

KJIT_GDN_PREFILL_HD constexpr u32 gdn_prefill_align16(u32 bytes) { return (bytes + 15u) & ~15u; }

KJIT_GDN_PREFILL_HD constexpr GdnPrefillSmem gdn_prefill_smem(int k, int bv) {
  GdnPrefillSmem m{};
  const u32 row_k = u32(k + 8) * 2u;
  const u32 tile64_f32 = 64u * 72u * 4u;
  const u32 vn_pair = 2u * u32(bv) * 72u * 2u;
  u32 at = 0;
  m.q = at;
  at += gdn_prefill_align16(64u * row_k);
  m.k = at;
  at += gdn_prefill_align16(64u * row_k);
  m.s = at;
  at += gdn_prefill_align16(u32(bv) * row_k);
  m.a = at;
  at += gdn_prefill_align16(tile64_f32 > vn_pair ? tile64_f32 : vn_pair);
  m.t = at;
  at += tile64_f32;
  m.p = at;
  at += 64u * 72u * 2u;
  m.r = at;
  at += gdn_prefill_align16(u32(bv) * 72u * 2u);
  m.gamma = at;
  at += 64u * 4u;
  m.beta = at;
  at += 64u * 4u;
  m.total = at;
  return m;
}

/// Rows of the chunked path's workspace per (token, value head): T' and P rows (64 bf16 each,
/// 128 bytes) and one float4 of per-row scales. The workspace is indexed by token, not by chunk,
/// so its size follows from T alone: the host never needs the (device-side) chunk counts.
inline constexpr u32 kGdnPrefillWsRowBytes = 64u * 2u;
inline constexpr u32 kGdnPrefillWsScaleBytes = 16u;

/// Byte offsets of the chunked path's workspace regions for T tokens and HV value heads: T' =
/// T diag(beta) [T, HV, 64] bf16, P = scale tril(Q K^T e^(gamma_i - gamma_j)) [T, HV, 64] bf16,
/// and scales [T, HV] float4 {scale e^gamma_i / |q_i|, e^gamma_i / |k_i|, e^(gamma_last - gamma_i)
/// / |k_i|, e^gamma_last}, and the state kernel's sequence order [kGdnPrefillOrderMaxSeqs] int32.
/// Regions start on 256-byte boundaries.
struct GdnPrefillWorkspace {
  u64 t;
  u64 p;
  u64 scales;
  u64 order;
  u64 total;
};

/// The state kernel's longest-first order (int32 sequence ids by descending chunk count) is
/// kept for up to this many sequences, in a fixed region after the scales; a batch of more
/// sequences keeps their index order. A fixed size keeps the workspace a function of T and HV.
inline constexpr u32 kGdnPrefillOrderMaxSeqs = 4096;

/// Up to this many sequences (the smallest state-kernel block's thread count) every state-kernel
/// block ranks them itself, one thread per sequence, before it waits for the chunk kernel: the
/// order is then known while the chunk kernel's last blocks still run, and the block loads its
/// initial state early (programmatic dependent launch). Longer batches take the chunk kernel's
/// ranks from the workspace after the wait.
inline constexpr u32 kGdnPrefillRankInStateMaxSeqs = 128;

KJIT_GDN_PREFILL_HD constexpr u64 gdn_prefill_align256(u64 bytes) {
  return (bytes + 255u) & ~u64{255u};
}

KJIT_GDN_PREFILL_HD constexpr GdnPrefillWorkspace gdn_prefill_workspace(u64 tokens,
                                                                        u64 value_heads) {
  GdnPrefillWorkspace w{};
  const u64 rows = tokens * value_heads;
  w.t = 0;
  w.p = gdn_prefill_align256(rows * kGdnPrefillWsRowBytes);
  w.scales = w.p + gdn_prefill_align256(rows * kGdnPrefillWsRowBytes);
  w.order = w.scales + gdn_prefill_align256(rows * kGdnPrefillWsScaleBytes);
  w.total = w.order + (rows > 0 ? u64{kGdnPrefillOrderMaxSeqs} * 4u : 0u);
  return w;
}

/// Shared memory of the chunked path's chunk kernel (templates/gdn_prefill/chunk.cuh) for key
/// dim `k`: the raw q and k rows (cp.async targets), the f32 matrix A (pitch 68 floats: 16-byte
/// rows for float4 broadcasts; its upper blocks hold f32 blocks of the inverse), two bf16 staging
/// tiles for P and T' (coalesced stores), per-row vectors.
struct GdnPrefillChunkSmem {
  u32 q;      // bf16 [64][k + 8]
  u32 k;      // bf16 [64][k + 8]
  u32 a;      // f32 [64][68]
  u32 p;      // bf16 [64][72]
  u32 t;      // bf16 [64][72]
  u32 gamma;  // f32 [4][64]: one copy per warp
  u32 beta;   // f32 [4][64]: one copy per warp
  u32 rq;     // f32 [64]: 1 / |q_i| (1 without L2 norm)
  u32 rk;     // f32 [64]
  u32 cf;     // f32 [4][64]: rk_j e^(gamma_ref - gamma_j), gamma_ref the last of j's 16-row block
  u32 ref;    // f32 [4][4]: gamma at the end of each 16-row block
  u32 total;
};

KJIT_GDN_PREFILL_HD constexpr GdnPrefillChunkSmem gdn_prefill_chunk_smem(int k) {
  GdnPrefillChunkSmem m{};
  const u32 row_k = u32(k + 8) * 2u;
  u32 at = 0;
  m.q = at;
  at += 64u * row_k;
  m.k = at;
  at += 64u * row_k;
  m.a = at;
  at += 64u * 68u * 4u;
  m.p = at;
  at += 64u * 72u * 2u;
  m.t = at;
  at += 64u * 72u * 2u;
  m.gamma = at;
  at += 1024u;
  m.beta = at;
  at += 1024u;
  m.rq = at;
  at += 256u;
  m.rk = at;
  at += 256u;
  m.cf = at;
  at += 1024u;
  m.ref = at;
  at += 64u;
  m.total = at;
  return m;
}

/// Warps of a state-kernel block: 8 for the whole-V tile of 128 rows (its 64 KiB f32 state
/// needs 256 threads' registers), 4 otherwise.
KJIT_GDN_PREFILL_HD constexpr int gdn_prefill_state_warps(int bv) { return bv == 128 ? 8 : 4; }

/// Whether the state kernel's value tile `bv` takes the wide layout: one warp per 16 rows of V
/// carries its rows of the state and every product of them through the chunk in registers
/// (bv = 64 and 128, K <= 128). Tiles of 16 and 32 rows split each product over 4 warps and
/// exchange R^T, Vn^T and the state copy through shared memory.
KJIT_GDN_PREFILL_HD constexpr bool gdn_prefill_state_wide(int bv) { return bv >= 64; }

/// Input stages of the wide layout by default: chunk c + stages - 1 is fetched while chunk c
/// computes, one block barrier per chunk. The state kernels take 3 where the planner says so
/// (spec stages=3: sm_90 and later, mbarrier handoff; see state_wide).
KJIT_GDN_PREFILL_HD constexpr int gdn_prefill_state_stages(int bv) {
  return gdn_prefill_state_wide(bv) ? 2 : 1;
}

/// Shared memory of the chunked path's state kernel (templates/gdn_prefill/state.cuh) for key
/// dim `k` and value tile `bv`. Wide tiles: every input of a chunk (k, q, v, T', P, scales) in
/// each of gdn_prefill_state_stages(bv) stages of equal size (stage i's buffer = stage 0's + i
/// (k1 - k0)), one barrier per chunk. Tiles of 16 and 32:
/// k, T' and the scales are double-buffered (chunk c + 1's arrive during all of chunk c); q, v
/// and P are single buffers refilled as soon as the stage that reads them has passed a barrier;
/// then the state copy and the R^T, Vn^T and decayed Vn^T tiles.
struct GdnPrefillStateSmem {
  u32 k0, k1;    // bf16 [64][k + 8] raw k of the chunk (two buffers)
  u32 q;         // bf16 [64][k + 8] raw q
  u32 v;         // bf16 [64][bv + 8]
  u32 t0, t1;    // bf16 [64][72] T' (two buffers: issued a whole chunk ahead)
  u32 p;         // bf16 [64][72] P
  u32 sc0, sc1;  // float4 [64] scales (two buffers)
  u32 s;         // bf16 [bv][k + 8] the state tile at chunk start (tiles of 16 and 32)
  u32 r;         // bf16 [bv][72] R^T (tiles of 16 and 32)
  u32 vn;        // bf16 [bv][72] Vn^T (tiles of 16 and 32)
  u32 vd;        // bf16 [bv][72] Vn^T scaled by e^(gamma_last - gamma_j) / |k_j| (16 and 32)
  u32 barriers;  // u64 full[stages], empty[stages], p_ready[stages] (wide, 3 or more stages)
  u32 total;
};

/// Bytes from k to q in a pair tile of a stage (k's first 64-column slice of 64 bf16 rows:
/// sw128::kSlice), and the stride of both tiles' slices twice that (sw128::kPairSlice).
inline constexpr u32 kGdnPrefillPairQOffset = 64u * 128u;

/// `stages`: input stages of the wide tiles (0: gdn_prefill_state_stages(bv); the
/// context-parallel passes may take 3). `paired_kq` (the wide tiles on wgmma, sm_90a): k and q
/// of a stage are one pair tile (sw128::kPairSlice: k's 64-column slice s at k0 + 2 s 8 KiB, q's
/// right behind it, q = k0 + 8 KiB), so that a wgmma reads [k; q] as one 128-row B operand; the
/// same bytes as the padded rows (64 (k + 8) 2 each), the sizes unchanged.
KJIT_GDN_PREFILL_HD constexpr GdnPrefillStateSmem gdn_prefill_state_smem(int k, int bv,
                                                                         int stages = 0,
                                                                         bool paired_kq = false) {
  GdnPrefillStateSmem m{};
  const u32 row_k = u32(k + 8) * 2u;
  const u32 tile64 = 64u * 72u * 2u;
  const u32 tile_bv = u32(bv) * 72u * 2u;
  u32 at = 0;
  if (gdn_prefill_state_wide(bv)) {
    m.k0 = at;
    at += 64u * row_k;
    m.q = paired_kq ? m.k0 + kGdnPrefillPairQOffset : at;
    at += 64u * row_k;
    m.v = at;
    at += 64u * u32(bv + 8) * 2u;
    m.t0 = at;
    at += tile64;
    m.p = at;
    at += tile64;
    m.sc0 = at;
    at += 64u * 16u;
    m.k1 = m.k0 + at;
    m.t1 = m.t0 + at;
    m.sc1 = m.sc0 + at;
    const u32 count = u32(stages > 0 ? stages : gdn_prefill_state_stages(bv));
    m.total = at * count;
    if (count >= 3) {
      // The full, empty and P-ready mbarrier of each stage (the handoff, sm_90 and later).
      m.barriers = m.total;
      m.total += 24u * count;
    }
    return m;
  }
  m.k0 = at;
  at += 64u * row_k;
  m.k1 = at;
  at += 64u * row_k;
  m.q = at;
  at += 64u * row_k;
  m.v = at;
  at += 64u * u32(bv + 8) * 2u;
  m.t0 = at;
  at += tile64;
  m.t1 = at;
  at += tile64;
  m.p = at;
  at += tile64;
  m.sc0 = at;
  at += 64u * 16u;
  m.sc1 = at;
  at += 64u * 16u;
  m.s = at;
  at += u32(bv) * row_k;
  m.r = at;
  at += tile_bv;
  m.vn = at;
  at += tile_bv;
  m.vd = at;
  at += tile_bv;
  m.total = at;
  return m;
}

/// The warp-specialized kernel (ws.cuh, sm_90a, K = V = 128): three stages of a chunk's k, q, v
/// and scales, two slots of T' and P^T, the full / empty / p_ready mbarriers per stage and
/// chunk_ready (the chunk warpgroup's T', P^T and scales of the stage's chunk are in), and the
/// chunk warpgroup's own tiles.
struct GdnPrefillWsSmem {
  GdnPrefillStateSmem state;  // the stages (k0, q, v, sc0; k1 - k0 apart); t0 and p: slot 0 below
  u32 tp_stride;              // bytes from one T' / P^T slot to the next (two slots)
  u32 chunk_ready;            // u64 [3]
  u32 t_ready;                // u64 [2]: the state side's T' of a chunk is in (by chunk parity)
  u32 a;                      // f32 [64][68]: A, and the parked f32 blocks of T above its diagonal
  u32 gamma;                  // f32 [4][64]: one copy per warp
  u32 beta;                   // f32 [4][64]: one copy per warp
  u32 cf;                     // f32 [4][64]: rk_j e^(gamma_ref - gamma_j)
  u32 ref;                    // f32 [4][4]
  u32 rq;                     // f32 [3][64]: 1 / |q_i| by stage (state warpgroup 0 writes it)
  u32 rk;                     // f32 [2][64], by chunk parity
  u32 beta_t;                 // f32 [2][64]: beta for the state side's inverse, by chunk parity
  u32 out_tiles;              // bf16 [8 warps][64][16]: each state warp's O of a chunk for its
                              // TMA store (32-byte swizzle, kGdnPrefillWsOutTileBytes apart)
  u32 total;
};

inline constexpr int kGdnPrefillWsStages = 3;
/// A state warp's tile of O for the TMA store of bf16 out: 64 tokens x its 16 values.
inline constexpr u32 kGdnPrefillWsOutTileBytes = 64u * 16u * 2u;

/// A measurement switch of the warp-specialized kernel, 0 (the kernel) unless a build defines it:
/// 1, the chunk warpgroup only copies and signals (the state warpgroups' pace alone); 2, the
/// state warpgroups only wait and release (the chunk warpgroup's pace alone). The results are
/// then wrong; bench_gdn_prefill runs them with KJIT_PREFILL_BENCH_NO_VERIFY=1
/// (docs/performance.md, "The state warpgroups' turns, ... the first warp-specialized kernel").
/// 3, 4 and 5 take one part out: the chunk warpgroup's copies (the stages keep what they held),
/// its decay pass (A and P^T), the inverse (since e0d91e9 a state warpgroup's); 8, 6
/// and 7 take the same part out of the chunk warpgroup alone (as 2, where the inverse no longer
/// runs at all); 9 the state warpgroups' output stores of bf16 out, the bench's (O is still
/// computed: each tile's store stays behind a row test that never holds, what a store through the
/// bulk copy engine could save at most; f16 and f32 out keep their stores). Values from 10 on are
/// the whole kernel with a switch of their own (branches' measurement builds); the chunk warpgroup
/// runs alone only at 2, 6, 7 and 8.
#ifndef KJIT_GDN_WS_PACE
#define KJIT_GDN_WS_PACE 0
#endif
/// What a KJIT_GDN_WS_PACE build leaves out.
inline constexpr bool kGdnWsStateAlone = KJIT_GDN_WS_PACE == 1;
inline constexpr bool kGdnWsChunkAlone =
    KJIT_GDN_WS_PACE == 2 || (KJIT_GDN_WS_PACE >= 6 && KJIT_GDN_WS_PACE <= 8);
inline constexpr bool kGdnWsNoCopies = KJIT_GDN_WS_PACE == 3 || KJIT_GDN_WS_PACE == 8;
inline constexpr bool kGdnWsNoDecay = KJIT_GDN_WS_PACE == 4 || KJIT_GDN_WS_PACE == 6;
inline constexpr bool kGdnWsNoInverse = KJIT_GDN_WS_PACE == 5 || KJIT_GDN_WS_PACE == 7;
inline constexpr bool kGdnWsNoOutStores = KJIT_GDN_WS_PACE == 9;

/// Threads of the warp-specialized kernel: two state warpgroups, then the chunk warpgroup.
inline constexpr int kGdnPrefillWsThreads = 384;

/// Measurement only: a build with KJIT_GDN_WS_PROFILE 1 (inserted like KJIT_GDN_WS_PACE) makes
/// every warp of the warp-specialized kernel add, through its lane 0, the clock cycles of each
/// stretch of its chunk loop into GdnPrefillParams::profile (when not null): u64 [blocks, 12
/// warps, kGdnWsProfileSites], the stretches below in loop order, so that a role's sites add up
/// to its loop. bench_gdn_prefill with KJIT_PREFILL_BENCH_PROFILE=1 prints them per role. The
/// results stay right; the timing moves a little (two clock reads and a reduction per site).
#ifndef KJIT_GDN_WS_PROFILE
#define KJIT_GDN_WS_PROFILE 0
#endif
enum GdnWsProfileSite : int {
  kWsProfChunks = 0,  // chunk iterations (a count, not cycles)
  // The chunk warpgroup's sites, then the state warpgroups' (the bench reads them as two ranges).
  kWsProfChunkFull,      // waiting for its copies of the chunk (full)
  kWsProfChunkEmpty,     // waiting for the next stage and the T' / P^T slot (empty), the fill
  kWsProfChunkQNorms,    // q's norms (Q Q^T's diagonal blocks on mma.sync), into the stage
  kWsProfChunkProducts,  // K K^T and K Q^T on wgmma issued, the gates' scan, the wait
  kWsProfChunkKNorms,    // k's norms from K K^T's diagonal, the group barrier, beta, factors
  kWsProfChunkDecay,     // the decay pass (P^T stored, A computed), beta's copy, the scales
  kWsProfChunkTReady,    // waiting for A's tile (the state side's inverse of the chunk before)
  kWsProfChunkAStore,    // A's stores, chunk_ready
  // The state warpgroups.
  kWsProfStateFull,        // waiting for the chunk's copies (full)
  kWsProfStateChunkReady,  // waiting for the chunk warpgroup's A, P^T and scales
  kWsProfStateInvDiag,     // the inverse's diagonal blocks and the barrier behind them
  kWsProfStateInvFirst,    // its first block products and the barrier behind them
  kWsProfStateInverse,     // its second block products, T' stored (on every other chunk)
  kWsProfStateFirst,       // S [K; Q]^T (S as register A, one n = 128 product a k-step)
  kWsProfStateR,           // R
  kWsProfStateTReady,      // waiting for T' (the other warpgroup's inverse)
  kWsProfStateVn,          // Vn = R T'^T
  kWsProfStateUpdate,      // O's and the state's products until O is done, O's scales
  kWsProfStateStore,       // O's stores, the update done, the stage released
  // Per block, in warp 0's cells, written (not added) by thread 0: %globaltimer (ns) when the
  // block starts and when that thread leaves, and the SM it ran on (the bench's timeline line).
  kWsProfBlockStart,
  kWsProfBlockEnd,
  kWsProfBlockSm,
  kGdnWsProfileSites
};
/// The short name bench_gdn_prefill prints for a profile site (one list, beside the enum).
KJIT_GDN_PREFILL_HD constexpr const char* gdn_ws_profile_site_name(int site) {
  switch (site) {
    case kWsProfChunks:
      return "chunks";
    case kWsProfChunkFull:
      return "full";
    case kWsProfChunkEmpty:
      return "empty+fill";
    case kWsProfChunkQNorms:
      return "q norms";
    case kWsProfChunkProducts:
      return "products";
    case kWsProfChunkKNorms:
      return "k norms";
    case kWsProfChunkDecay:
      return "decay";
    case kWsProfChunkTReady:
      return "t_ready";
    case kWsProfChunkAStore:
      return "A stores";
    case kWsProfStateFull:
      return "full";
    case kWsProfStateChunkReady:
      return "chunk_ready";
    case kWsProfStateInvDiag:
      return "inv diag";
    case kWsProfStateInvFirst:
      return "inv first";
    case kWsProfStateInverse:
      return "inv second";
    case kWsProfStateFirst:
      return "S products";
    case kWsProfStateR:
      return "R";
    case kWsProfStateTReady:
      return "t_ready";
    case kWsProfStateVn:
      return "Vn";
    case kWsProfStateUpdate:
      return "O+update";
    case kWsProfStateStore:
      return "store";
    case kWsProfBlockStart:
      return "block start";
    case kWsProfBlockEnd:
      return "block end";
    case kWsProfBlockSm:
      return "block SM";
    default:
      return nullptr;
  }
}
/// Registers per thread the warp-specialized kernel's block holds (65,536 over its threads, in
/// steps of 8), and what setmaxnreg gives each role of it: the two state warpgroups and the chunk
/// warpgroup together may not ask for more (setmaxnreg.inc would wait forever). At 184 for the
/// state warpgroups ptxas serialized every wgmma of the kernel (C7512); at 192 it does not.
inline constexpr int kGdnPrefillWsBlockRegisters = 65536 / kGdnPrefillWsThreads / 8 * 8;  // 168
inline constexpr int kGdnPrefillWsStateRegisters = 192;
inline constexpr int kGdnPrefillWsChunkRegisters = 120;
static_assert(2 * 128 * kGdnPrefillWsStateRegisters + 128 * kGdnPrefillWsChunkRegisters <=
                  kGdnPrefillWsBlockRegisters * kGdnPrefillWsThreads,
              "setmaxnreg cannot hand out more than the block's allocation");

KJIT_GDN_PREFILL_HD constexpr GdnPrefillWsSmem gdn_prefill_ws_smem(int k) {
  GdnPrefillWsSmem m{};
  // Three stages of the chunk's rows (k, q swizzled without the mma.sync padding, v padded as the
  // state kernel's, the scales), then the chunk warpgroup's T' and P^T in a ring of two slots:
  // chunk c's slot is chunk c - 2's, whose stage the chunk warpgroup waits for anyway before it
  // fills chunk c + 1.
  GdnPrefillStateSmem& st = m.state;
  u32 at = 0;
  // k and q: one pair tile (sw128::kPairSlice), q's slices right behind k's (q = k0 + 8 KiB).
  st.k0 = at;
  st.q = at + kGdnPrefillPairQOffset;
  at += 2u * 64u * u32(k) * 2u;
  st.v = at;  // 128-byte swizzled like q and k (two 64-column slices), not padded
  at += 64u * 128u * 2u;
  st.sc0 = at;
  at += 64u * 16u;
  st.k1 = st.k0 + at;
  st.sc1 = st.sc0 + at;
  at *= u32(kGdnPrefillWsStages);
  st.t0 = at;  // 1024-byte aligned: the stage is a multiple of 1024 bytes at k = 128
  st.p = at + 64u * 64u * 2u;
  m.tp_stride = 2u * 64u * 64u * 2u;
  st.t1 = st.t0 + m.tp_stride;
  at += 2u * m.tp_stride;
  st.barriers = at;
  at += 24u * u32(kGdnPrefillWsStages);
  st.total = at;  // (state_wide finds chunk_ready here)
  m.chunk_ready = at;
  m.t_ready = at + 8u * kGdnPrefillWsStages;
  at = gdn_prefill_align16(m.t_ready + 8u * 2u);
  m.a = at;
  at += 64u * 68u * 4u;
  m.gamma = at;
  at += 1024u;
  m.beta = at;
  at += 1024u;
  m.cf = at;
  at += 1024u;
  m.ref = at;
  at += 64u;
  m.rq = at;
  at += u32(kGdnPrefillWsStages) * 256u;
  m.rk = at;
  at += 2u * 256u;
  m.beta_t = at;
  at += 2u * 256u;
  at = (at + 1023u) & ~1023u;
  m.out_tiles = at;
  at += 8u * kGdnPrefillWsOutTileBytes;
  m.total = at;
  return m;
}

/// Arguments of one prefill call. Pointers are typed by the kernel's template parameters; all
/// strides are in elements of the tensor they belong to; the last dimension of every tensor is
/// contiguous.
struct GdnPrefillParams {
  /// The warp-specialized kernel's TMA maps of q, k and v (boxes of 64 columns x 1 head x 64
  /// tokens, 128-byte swizzle: ops/gdn_prefill input_tensor_maps), encoded per call; read only
  /// when tma_inputs != 0. First, so that their 128-byte alignment (CUDA 13's CUtensorMap) costs no
  /// padding.
  TensorMap q_map, k_map, v_map;
  /// Its map of bf16 out {V, HV, T} (boxes of 16 values x 1 head x 64 tokens, 32-byte swizzle: a
  /// state warp's part of a chunk, output_tensor_map); read only when tma_out != 0.
  TensorMap out_map;
  /// q, k [T, H, K]; v [T, HV, V].
  const void* q;
  const void* k;
  const void* v;
  /// Raw gates: a, b [T, HV]; precomputed: g (log decay) and beta [T, HV], f32.
  const void* a;
  const void* b;
  /// [HV] each; unused with precomputed gates.
  const void* a_log;
  const void* dt_bias;
  /// [N + 1] token offsets of the sequences.
  const void* cu_seqlens;
  /// [N] pool slot of each sequence; < 0 (or >= num_slots): padding, runs from a zero state
  /// and never touches the pool.
  const void* state_indices;
  /// [N] u8, 0: the sequence starts from a zero state. nullptr: every sequence has one.
  const unsigned char* has_initial_state;
  /// [slots, HV, V, K] pool, inner [HV, V, K] contiguous.
  void* state;
  /// [N, HV, V, K] final states; nullptr: written back into the pool slot in place.
  void* final_state;
  /// [T, HV, V].
  void* out;
  /// Checkpoint kernels only (kCkpt): [ckpt_rows, HV, V, K] states, inner [HV, V, K]
  /// contiguous; sequence n writes its state after every ckpt_every_chunks full chunks to row
  /// checkpoint_starts[n] + j.
  void* checkpoints;
  /// [N + 1] i64: first checkpoint row of each sequence.
  const i64* checkpoint_starts;
  /// Chunked path only: the workspace regions (see gdn_prefill_workspace). When the state
  /// kernel forms P itself (kStateP), ws_p holds instead, densely, a float4 of P's factors per
  /// token and value head (gdn_prefill_p_factors, [T, HV]).
  void* ws_t;
  void* ws_p;
  void* ws_scales;
  /// [num_seqs] int32 when the state kernel is to take the sequences longest first (num_seqs
  /// <= kGdnPrefillOrderMaxSeqs), else null. The chunk kernel writes the ranks there only for
  /// more than kGdnPrefillRankInStateMaxSeqs sequences; 2 to that many are ranked by the state
  /// kernel's (or the warp-specialized kernel's) blocks themselves, whatever this holds.
  void* ws_order;
  /// Context-parallel path only (gdn_prefill_cp_workspace): per segment id z and value head,
  /// f32 [Z, HV, V, K] states at the segment's end from a zero start (B), [Z, HV, K, K] the
  /// segment's linear map of the state (M: its end state from an identity start with v = 0),
  /// and [Z, HV, V, K] each segment's exact initial state (X, written by the scan kernel).
  float* cp_b;
  float* cp_m;
  float* cp_x;
  i64 q_stride_t, q_stride_h;
  i64 k_stride_t, k_stride_h;
  i64 v_stride_t, v_stride_h;
  i64 a_stride_t, b_stride_t;
  i64 out_stride_t, out_stride_h;
  i64 state_slot_stride;
  i64 final_seq_stride;
  i64 index_stride;
  i64 has_init_stride;
  i64 num_slots;
  i64 ckpt_slot_stride;
  /// Rows of `checkpoints`: a row outside [0, ckpt_rows) is not written (device-side starts are
  /// not checked on the host; this keeps a wrong prefix from writing out of bounds).
  i64 ckpt_rows;
  /// checkpoint_every_n_tokens / kGdnPrefillChunk (>= 1 with checkpoints).
  i64 ckpt_every_chunks;
  u32 num_seqs;
  u32 num_value_heads;
  /// HV / H: value heads per q/k head.
  u32 heads_per_group;
  /// V / BV.
  u32 v_tiles;
  /// Context-parallel segment pass only: K / BV identity tiles after the V / BV state tiles.
  u32 k_tiles;
  /// Chunked path only: q/k heads H.
  u32 num_heads;
  /// Chunked path only: tokens T (the chunk kernel's ids run to floor(T / 64) + N).
  i64 num_tokens;
  /// Context-parallel path only: chunks per segment L, and the segment ids Z = floor(T / (64 L))
  /// + N (segment s of sequence n has id floor(cu[n] / (64 L)) + n + s).
  i64 cp_segment_chunks;
  i64 cp_segments;
  float scale;
  float softplus_threshold;
  /// 1: q_map, k_map and v_map hold this call's maps (the warp-specialized kernel then loads
  /// whole chunks by TMA boxes); 0: every kernel copies with cp.async.
  u32 tma_inputs;
  /// 1: out_map holds this call's map (the warp-specialized kernel stores whole chunks of bf16
  /// out by TMA boxes); 0: plain stores.
  u32 tma_out;
  /// Measurement only (KJIT_GDN_WS_PROFILE builds of the warp-specialized kernel): u64 [blocks,
  /// 12, kGdnWsProfileSites] cycle sums, or null. Every other build ignores it.
  unsigned long long* profile;
};

/// The context-parallel scan (cp.cuh): each block owns kGdnPrefillCpScanRows rows of
/// the [V, K] state (all K columns: the product sums over them); a warp takes a group of rows and
/// each lane 4 columns of them; its blocks are (sequence, value head, V / rows). M streams
/// through a ring of kGdnPrefillCpScanStages tiles of 32 of its rows (dynamic shared memory,
/// gdn_prefill_cp_scan_smem).
inline constexpr int kGdnPrefillCpScanRows = 16;
inline constexpr int kGdnPrefillCpScanThreads = 128;
inline constexpr int kGdnPrefillCpScanStages = 6;

KJIT_GDN_PREFILL_HD constexpr u32 gdn_prefill_cp_scan_smem(int k) {
  return u32(kGdnPrefillCpScanStages) * 32u * u32(k) * 4u;
}

/// Byte offsets of the context-parallel path's regions, placed after the chunked path's
/// workspace (gdn_prefill_workspace): B, X [Z, HV, V, K] f32 and M [Z, HV, K, K] f32 for Z segment
/// ids. Regions start on 256-byte boundaries.
struct GdnPrefillCpWorkspace {
  u64 b;
  u64 m;
  u64 x;
  u64 total;
};

KJIT_GDN_PREFILL_HD constexpr GdnPrefillCpWorkspace gdn_prefill_cp_workspace(u64 base, u64 segments,
                                                                             u64 value_heads, u64 k,
                                                                             u64 v) {
  GdnPrefillCpWorkspace w{};
  const u64 vk = segments * value_heads * v * k * 4u;
  const u64 kk = segments * value_heads * k * k * 4u;
  w.b = gdn_prefill_align256(base);
  w.m = w.b + gdn_prefill_align256(vk);
  w.x = w.m + gdn_prefill_align256(kk);
  w.total = w.x + vk;
  return w;
}

}  // namespace kjit

#undef KJIT_GDN_PREFILL_HD
