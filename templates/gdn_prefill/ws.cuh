// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill in one warp-specialized kernel (sm_90a, K = V = 128): one block
// of three warpgroups per (sequence, value head) walks the sequence's chunks, and nothing of a
// chunk but its outputs leaves the SM.
//
//   warpgroup 2 (the chunk role, below): copies each chunk's raw q, k and v rows into a ring of
//     three stages (cp.async, 128-byte swizzled; k and q one pair tile, sw128::kPairSlice, so that
//     the state warpgroups' S_w [K; Q]^T is one n = 128 wgmma) and computes, one chunk ahead of the
//     state warpgroups, most of what the chunk kernel (chunk.cuh) writes to the workspace: A (into
//     one tile; f32, its off-diagonal blocks f16 where the inverse takes f16 operands) and P
//     transposed (decay_col_block, from K Q^T, so that each warp's rows of P^T and of A balance)
//     into a ring of two swizzled T' / P^T slots, and the decay scales into the stage; from K K^T
//     and K Q^T on wgmma, k's norms from the diagonal of K K^T, q's norms (Q Q^T's diagonal blocks
//     on mma.sync, into the stage: both state warpgroups scale O's columns by them) and the gates.
//   warpgroups 0 and 1 (state.cuh, state_wide with a chunk role): the state recurrence on wgmma,
//     64 rows of V each (first products S_w [K; Q]^T, S_w as register A fragments). By chunk
//     parity one issues its products at once while the other turns A into T' = (I + A)^-1
//     diag(beta) before its own (invert: the forward substitution and the tf32 block products),
//     and goes first on the next chunk; no turns order their issue any more (docs/performance.md,
//     "No turns, and the decay pass in one body"). The inverse moved off the chunk warpgroup, which
//     paced the kernel (docs/performance.md, "The inverse and q's norms on the state warpgroups");
//     q's norms went with it and came back once the chunk warpgroup's gate loads no longer waited
//     ("Gate loads without a wait, q's norms back", docs/performance.md); the alternation since
//     warpgroup 1 alone, inverting every chunk, was busy ~90% of its loop while warpgroup 0
//     waited (docs/performance.md, "Where the warpgroups wait").
//
// Three mbarriers per stage hand the stages around: full (the chunk warpgroup's copies landed),
// chunk_ready (its A, P^T and scales are in), empty (every state thread is done with the stage
// and with the chunk's T' / P^T slot); t_ready by chunk parity: the chunk's T' is in and A's
// tile free again. The chunk warpgroup fetches chunk c + 1 while it works on
// chunk c, into the stage of chunk c - 2, which the state warpgroups (on chunk c - 1) have
// released; chunk c's T' / P^T slot is chunk c - 2's. Compared with the two kernels, the T', P
// and scale rows (~0.57 GB at 128k tokens, H = HV = 16) are never written, and q and k are read
// once instead of twice.
//
// Registers: 2 x 128 x 192 + 128 x 120 = the block's 168 per thread (setmaxnreg, state.cuh;
// 200 / 104, where the chunk warpgroup no longer spills, was 0.5-1% slower).
// With 184 for the state warpgroups ptxas serialized every wgmma of the kernel (C7512, each
// waited for itself) while S's A fragments were in registers beside P; at 192 it keeps them in
// flight with S's fragments as the first products' register A (the shared S tile they replaced
// cost ~2% at HV = H and ~8% at HV = 2H on the H200, docs/performance.md "S as register A").
#pragma once

#include "templates/common/tma.cuh"
#include "templates/gdn_prefill/chunk.cuh"
#include "templates/gdn_prefill/state.cuh"

namespace kjit {
namespace gdn_prefill_detail {

#if KJIT_GDN_STATE_WGMMA

/// x, through an empty asm the compiler cannot see into: values derived from it count as computed
/// where this is called (not hoisted above it).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

/// Measurement only (KJIT_GDN_WS_PROFILE): the block's start and end (%globaltimer, ns) and its SM
/// into warp 0's profile cells (kWsProfBlockStart..Sm), by thread 0: where the call's time goes
/// between the blocks (bench_gdn_prefill's timeline line). Without the macro, nothing.
struct WsBlockTimeline {
  unsigned long long* cell = nullptr;
  __device__ __forceinline__ explicit WsBlockTimeline(const GdnPrefillParams& p) {
#if KJIT_GDN_WS_PROFILE && defined(__CUDA_ARCH__)
    if (p.profile != nullptr && threadIdx.x == 0) {
      cell = p.profile + u64(blockIdx.x) * (kGdnPrefillWsThreads / 32) * u64(kGdnWsProfileSites);
      cell[kWsProfBlockStart] = now();
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      cell[kWsProfBlockSm] = sm;
    }
#else
    (void)p;
#endif
  }
  __device__ __forceinline__ void end() const {
    if (cell != nullptr) cell[kWsProfBlockEnd] = now();
  }
  static __device__ __forceinline__ unsigned long long now() {
    unsigned long long t = 0;
#if KJIT_GDN_WS_PROFILE && defined(__CUDA_ARCH__)  // (host builds of the template: the emulation)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
  }
};

/// The named barrier of the chunk warpgroup's four warps (0 is __syncthreads, 2 and 3 the two
/// kernels' turns, 5 and 6 the state warpgroups' barriers).
__device__ __forceinline__ void chunk_group_sync() { named_barrier::sync<4, 128>(); }

/// The chunk warpgroup of gdn_prefill_ws_kernel (see the top of the file). Template parameters
/// as gdn_prefill_chunk_kernel's.
template <typename Tin, typename Tgate, typename Tparam, int kK, bool kGated, bool kL2NormQK>
struct WsChunkRole {
  static constexpr bool kActive = true;
  static constexpr bool kL2Norm = kL2NormQK;

  /// T' = (I + A)^-1 diag(beta) of the chunk of parity `parity` into its T' tile at `t_tile`,
  /// from the chunk warpgroup's A tile and beta: run by the state warpgroup going second on the
  /// chunk (`warp` 0..3 of it) once the chunk is ready, `sync()` its warpgroup barrier. The chunk
  /// warpgroup, which paced the kernel, did it itself until the inverse was measured at 24% of its
  /// time (docs/performance.md).
  template <typename Sync>
  static __device__ __forceinline__ void invert(unsigned char* smem, unsigned char* t_tile,
                                                int parity, int warp, int lane, Sync&& sync) {
    using namespace gdn_prefill_chunk_detail;
    constexpr GdnPrefillWsSmem kWsSmem = gdn_prefill_ws_smem(kK);
    float* const s_a = reinterpret_cast<float*>(smem + kWsSmem.a);
    const float* const s_beta0 =
        reinterpret_cast<const float*>(smem + kWsSmem.beta_t) + 64 * parity;
    invert_chunk<kL2NormQK, kGated>(
        s_a, s_beta0, warp, lane, [&](int r, int c) { return sw128_element(t_tile, r, c); }, sync);
  }

  static __device__ __forceinline__ void run(const GdnPrefillParams& p, const StateWork& w,
                                             unsigned char* smem) {
    using namespace gdn_prefill_chunk_detail;
    static_assert(kK == 128, "the stages are laid out for K = V = 128");
    constexpr GdnPrefillWsSmem kWsSmem = gdn_prefill_ws_smem(kK);
    constexpr GdnPrefillStateSmem kS = kWsSmem.state;
    static_assert(kS.q == kS.k0 + sw128::kSlice, "k and q: one pair tile (kPairSlice)");
    constexpr int kStages = kGdnPrefillWsStages;
    constexpr u32 kStage = kS.k1 - kS.k0;
    constexpr int kKSteps = kK / 16;
    constexpr int kV = 128;
    constexpr int kRowCopies = kK / 8;                             // 16-byte copies per row
    constexpr int kRowsPerPass = kGdnPrefillThreads / kRowCopies;  // 8
    static_assert(kV / 8 == kRowCopies && kRowsPerPass == 8, "q, k and v rows copied alike");

    u64* const full = reinterpret_cast<u64*>(smem + kS.barriers);
    u64* const empty = full + kStages;
    u64* const chunk_ready = reinterpret_cast<u64*>(smem + kWsSmem.chunk_ready);

    const int ctid = static_cast<int>(threadIdx.x) - 2 * kGdnPrefillThreads;
    const int warp = ctid >> 5, lane0 = ctid & 31;
    float* const s_a = reinterpret_cast<float*>(smem + kWsSmem.a);
    // k's inverse norms, by chunk parity: a warp's next chunk writes the other copy while a slower
    // warp may still read this one (no barrier behind the decay pass).
    float* const s_rk_base = reinterpret_cast<float*>(smem + kWsSmem.rk);
    // Every warp computes the gates itself (as the chunk kernel): its own copies.
    float* const s_gamma = reinterpret_cast<float*>(smem + kWsSmem.gamma) + 64 * warp;
    float* const s_beta = reinterpret_cast<float*>(smem + kWsSmem.beta) + 64 * warp;
    float* const s_cf = reinterpret_cast<float*>(smem + kWsSmem.cf) + 64 * warp;
    float* const s_ref = reinterpret_cast<float*>(smem + kWsSmem.ref) + 4 * warp;
    // beta of each chunk for the state warpgroups' inverse (warp 0's), by chunk parity.
    float* const s_beta_t = reinterpret_cast<float*>(smem + kWsSmem.beta_t);
    // t_ready[c & 1]: the state warpgroups' inverse of chunk c is done (T' in, A's tile read).
    u64* const t_ready = reinterpret_cast<u64*>(smem + kWsSmem.t_ready);

    // The blocks of T' above its diagonal blocks and those of P^T left of them, with the lower-left
    // quarter of P^T's diagonal blocks, are zero in both slots (nothing else writes them; the
    // first chunk_ready arrival publishes them).
    for (int slot = 0; slot < 2; ++slot) {
      unsigned char* const t_tile = smem + kS.t0 + slot * kWsSmem.tp_stride;
      unsigned char* const pt_tile = smem + kS.p + slot * kWsSmem.tp_stride;
      for (int e = ctid; e < 64 * 64; e += kGdnPrefillThreads) {
        const int r = e >> 6, c = e & 63;
        if ((c >> 4) > (r >> 4)) *sw128_element(t_tile, r, c) = __float2bfloat16_rn(0.f);
        if ((c >> 4) < (r >> 4) || ((c >> 4) == (r >> 4) && pt_zero_quarter(r & 15, c & 15))) {
          *sw128_element(pt_tile, r, c) = __float2bfloat16_rn(0.f);
        }
      }
    }
    const i64 bos = w.bos, eos = w.eos;
    if (bos >= eos) return;
    if (ctid == 0 && p.tma_inputs != 0) {
      tma::prefetch_map(&p.k_map);
      tma::prefetch_map(&p.q_map);
      tma::prefetch_map(&p.v_map);
    }
    const auto rows_at = [&](i64 t) { return static_cast<int>(eos - t < 64 ? eos - t : 64); };

    // A chunk's raw q, k and v rows (swizzled, rows in order) into stage st, rows
    // past the sequence zero-filled; the stage's full barrier counts this thread's copies.
    const int copy_part = ctid % kRowCopies, copy_r0 = ctid / kRowCopies;
    const u32 sw_base = u32(sw128::offset(copy_r0, copy_part));
    // (k and q: one pair tile, slices sw128::kPairSlice apart; v: a tile of its own.)
    const u32 sw_base_kq = u32(sw128::offset<sw128::kPairSlice>(copy_r0, copy_part));
    const auto fill = [&](int st, i64 t) {
      if constexpr (kGdnWsNoCopies) {  // measurement only: the stages keep stale data
        mbarrier::arrive(full + st);
        return;
      }
      const int rows = rows_at(t);
      unsigned char* const base = smem + st * kStage;
      if (rows == kGdnPrefillChunk && p.tma_inputs != 0) {
        // A whole chunk by six TMA boxes (k, q and v, two 64-column slices each: exactly the
        // sw128 slices the copies below fill), issued by one thread, which also tells the stage's
        // full barrier their bytes; the others arrive at once (128 arrivals, as the copies').
        // The copy engine then computes every address: no per-thread copies, no row pointers.
        if (ctid == 0) {
          mbarrier::arrive_expect_tx(full + st, 6u * sw128::kSlice);
          const int qk_head = int(w.h), v_head = int(w.hv), token = int(t);
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            tma::load_3d(base + kS.k0 + s * sw128::kPairSlice, &p.k_map, 64 * s, qk_head, token,
                         full + st);
            tma::load_3d(base + kS.q + s * sw128::kPairSlice, &p.q_map, 64 * s, qk_head, token,
                         full + st);
            tma::load_3d(base + kS.v + s * sw128::kSlice, &p.v_map, 64 * s, v_head, token,
                         full + st);
          }
        } else {
          mbarrier::arrive(full + st);
        }
        return;
      }
      const __nv_bfloat16* src_q = w.q_g + (t + copy_r0) * p.q_stride_t + copy_part * 8;
      const __nv_bfloat16* src_k = w.k_g + (t + copy_r0) * p.k_stride_t + copy_part * 8;
      const __nv_bfloat16* src_v = w.v_g + (t + copy_r0) * p.v_stride_t + copy_part * 8;
      unsigned char* const dst_q = base + kS.q + sw_base_kq;
      unsigned char* const dst_k = base + kS.k0 + sw_base_kq;
      // v swizzled as q and k: its copies then take 4 shared-memory wavefronts each, where the
      // padded rows (pitch 272 bytes) took 10.5 (Nsight Compute, ~5% of the kernel's shared
      // wavefronts).
      unsigned char* const dst_v = base + kS.v + sw_base;
      if (rows == kGdnPrefillChunk) {
        // A whole chunk (all but a sequence's last): no zero fill, no predicates, no pointers
        // carried across the rows: the chunk warpgroup's spills went 180 / 224 -> 96 / 112 bytes
        // and the call 16% faster (128k/16 2129.3 -> 1785.4 us, docs/performance.md).
#pragma unroll
        for (int i = 0; i < 64 / kRowsPerPass; ++i) {
          cp_async::copy16(dst_q + i * kRowsPerPass * 128, src_q + i * kRowsPerPass * p.q_stride_t);
          cp_async::copy16(dst_k + i * kRowsPerPass * 128, src_k + i * kRowsPerPass * p.k_stride_t);
          cp_async::copy16(dst_v + i * kRowsPerPass * 128, src_v + i * kRowsPerPass * p.v_stride_t);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 64 / kRowsPerPass; ++i) {
          const bool ok = copy_r0 + i * kRowsPerPass < rows;
          // Rows kRowsPerPass (8) apart keep their swizzle.
          cp_async::copy16(dst_q + i * kRowsPerPass * 128, ok ? src_q : w.q_g, ok);
          cp_async::copy16(dst_k + i * kRowsPerPass * 128, ok ? src_k : w.k_g, ok);
          cp_async::copy16(dst_v + i * kRowsPerPass * 128, ok ? src_v : w.v_g, ok);
          src_q += kRowsPerPass * p.q_stride_t;
          src_k += kRowsPerPass * p.k_stride_t;
          src_v += kRowsPerPass * p.v_stride_t;
        }
      }
      mbarrier::cp_async_arrive_noinc(full + st);
    };

    // The raw gates of the next chunk in registers, loaded one chunk ahead (as the chunk kernel);
    // the head's A_log and dt_bias once.
    ChunkGates<Tgate, Tparam, kGated> gates;
    const u32 hv = w.hv;

    fill(0, bos);
    gates.load(p, bos, rows_at(bos), hv, lane0);
    u32 full_phase = 0, empty_phase = 0, t_ready_phase = 0;
    int st = 0;
    i64 chunk = 0;
    // Measurement only (KJIT_GDN_WS_PROFILE): the loop's stretches.
    [[maybe_unused]] const WsProfile prof(p);
#pragma unroll 1
    for (i64 t0 = bos; t0 < eos; t0 += kGdnPrefillChunk, ++chunk) {
      const int rows = rows_at(t0);
      // The lane and its parts are read anew every chunk, through an empty asm: ptxas can then no
      // longer hoist the shared-memory addresses and offsets derived from them out of the loop,
      // where ~30 of them lived across it and were spilled at 120 registers (96 / 112 bytes,
      // reloaded every chunk). Recomputed in the loop, nothing spills: 128k/16 1771.3 -> 1461.2
      // us (docs/performance.md, "Where the chunk warpgroup's time goes, and its hoisted
      // addresses").
      const int lane = opaque(ctid & 31), g = opaque(lane >> 2), t4 = opaque(lane & 3);
      // The warp's lanes are done with the previous chunk's per-warp gates and factors before
      // this chunk's scan rewrites them (no warpgroup barrier behind the decay pass).
      __syncwarp();
      [[maybe_unused]] long long tp = prof.now();
      mbarrier::wait(full + st, (full_phase >> st) & 1u);
      full_phase ^= 1u << st;
      wgmma::fence_shared_writes();  // the landed copies, before wgmma reads them
      tp = prof.add(kWsProfChunkFull, tp);
      unsigned char* const base = smem + st * kStage;
      if constexpr (kL2Norm && !kGdnWsStateAlone) {
        // q's norms of the warp's 16 rows for the state warpgroups' O (the stage's copy, published
        // by chunk_ready): the diagonal blocks of Q Q^T on mma.sync. Here, not on the state
        // warpgroup going first, since the gate loads stopped waiting (ChunkGates::load_rows):
        // this warpgroup then waited on `empty` while the state warpgroups paced the call. And
        // before that wait, not after the fill: the mma.sync wait for the tensor pipe, which the
        // state warpgroups' wgmma keep busy, then overlaps the wait for the state warpgroups
        // (3.3% off the call at 128k/16; docs/performance.md, "q's norms before the wait for
        // empty"). The stage's copy is free: chunk c - 3 read it before the `empty` arrival that
        // this warpgroup waited for before filling the stage with chunk c.
        float qq[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
        mma::gram_diagonal_block_sw128<kKSteps, true, sw128::kPairSlice>(
            qq, mma::smem_addr(base + kS.q), 16 * warp);
        float* const s_rq = reinterpret_cast<float*>(smem + kWsSmem.rq) + st * 64;
        // (The lane holding each diagonal element stores its norm: no quad sum of shuffles.)
        if (mma::holds_diagonal(g, t4)) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) store_inverse_q_norm<true>(qq, hf, warp, s_rq, p.scale, g);
        }
      }
      tp = prof.add(kWsProfChunkQNorms, tp);
      // The next chunk's rows into the next stage, once every state warp has released it (it
      // held chunk c - 2; the state warpgroups are on chunk c - 1 by now).
      const i64 tn = t0 + kGdnPrefillChunk;
      const int sn = st + 1 == kStages ? 0 : st + 1;
      // Chunk c - 2's stage is also the one whose T' / P^T slot chunk c takes: waited for even
      // when nothing is left to fill. Before chunk c's work, not before its first write into the
      // slot: the copies then had ~35% of a step less to land, and the call took 45% longer
      // (docs/performance.md, "The chunk warpgroup's copies and gates").
      if (chunk + 1 >= kStages) {
        mbarrier::wait(empty + sn, (empty_phase >> sn) & 1u);
        empty_phase ^= 1u << sn;
      }
      if (tn < eos) fill(sn, tn);
      tp = prof.add(kWsProfChunkEmpty, tp);
      const u32 slot_off = u32(chunk & 1) * kWsSmem.tp_stride;
      float* const s_rk = s_rk_base + (chunk & 1) * 64;
      if constexpr (kGdnWsStateAlone) {  // measurement only: the state side's pace alone
        if (tn < eos) gates.load_rows(p, tn, rows_at(tn), hv, lane);
        mbarrier::arrive(chunk_ready + st);
        st = sn;
        continue;
      }

      // 1. G = K K^T and P's raw transpose K Q^T on wgmma (warp w holds block row w of both).
      // (K Q^T issued after the A pass instead, so that the two accumulators are never live at
      // once, spilled as much at 120 registers: 264 / 288 bytes against 244 / 288.)
      // (acc_qq stays unused: q's norms are formed before the wait for empty, above.)
      float acc_g[8][4], acc_p[8][4], acc_qq[2][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_g[i][e] = acc_p[i][e] = 0.f;
      }
      const auto load_next_gates = [&] {
        if (tn < eos) gates.load_rows(p, tn, rows_at(tn), hv, lane);
      };
      // 3a. The gates' scan (each warp its own copy of gamma; the next chunk's gates loaded once
      // these are converted) while the tensor cores run the products: ~4% of the call.
      typename ChunkGates<Tgate, Tparam, kGated>::Scanned scanned;
      chunk_products_wgmma<kKSteps, false, kChunkPKQ, true>(
          acc_g, acc_p, acc_qq, mma::smem_addr(base + kS.k0), mma::smem_addr(base + kS.q), warp,
          [&] { scanned = gates.scan_gates(p, rows, lane, s_gamma, s_ref, load_next_gates); });
      tp = prof.add(kWsProfChunkProducts, tp);
      // 2. k's inverse norms from G's diagonal.
      store_inverse_norms<kL2Norm, false>(acc_g, acc_qq, warp, warp, s_rk, nullptr, 0.f, g, t4);
      // The norms are visible.
      chunk_group_sync();

      // 3b. Beta and the column factors, which need the norms.
      gates.store_beta_and_factors(scanned, lane, s_rk, s_beta, s_cf);
      tp = prof.add(kWsProfChunkKNorms, tp);
      // 4. The decay pass: P^T's block row `warp` (decay_col_block) into the slot's swizzled tile,
      // and A (strictly lower) of block row `warp` (decay_row_block) computed into acc_g,
      // once per warp index. Everything but A's stores runs before the wait for A's tile: the
      // decay pass of chunk c + 1 and the inverse of chunk c were one cycle through that tile, as
      // long as the loop (docs/performance.md, "Where the warpgroups wait").
      if (warp == 0) {
        // (Beta's copy of this parity was last read by the inverse of chunk c - 2.)
        *reinterpret_cast<float2*>(s_beta_t + (chunk & 1) * 64 + 2 * lane) =
            make_float2(scanned.beta[0], scanned.beta[1]);
      }
      // The lanes' beta and column factors (store_beta_and_factors), before the warp reads them.
      __syncwarp();
      unsigned char* const pt_tile = smem + kS.p + slot_off;
      if constexpr (!kGdnWsNoDecay) {
        per_warp_index(warp, [&](auto warp_index) {
          constexpr int kW = decltype(warp_index)::value;
          decay_col_block<kW>(
              acc_p, s_gamma, s_ref, s_cf, s_rk, g, t4, [&](int j, int i, float x0, float x1) {
                // Row j = 16 kW + g + 8 hf (row % 8 = g), column i = 8 nt + 2 t4 in chunk nt
                // (sw128::offset_first_slice). The lane is read anew here, as at the loop's top,
                // so that g and t4 are not carried across the chunk's products (the measured
                // form).
                const int sl = opaque(ctid & 31);
                const u32 off = sw128::offset_first_slice(j, i >> 3, sl >> 2) + u32(sl & 3) * 4u;
                *reinterpret_cast<u32*>(pt_tile + off) = mma::pack_bf16(x0, x1);
              });
          decay_row_block<kW, 0>(acc_g, s_gamma, s_ref, s_cf, s_rk, g, t4,
                                 [&](int i) { return s_beta[i] * s_rk[i]; });
        });
      }
      // The chunk's scales into the stage: every row (rows past the end have zero q, k and gates,
      // so their scales are finite).
      if (ctid < 64) {
        const float gi = s_gamma[ctid], g_last = s_gamma[63];
        const float eg = ex2(gi);
        reinterpret_cast<float4*>(base + kS.sc0)[ctid] =
            make_float4(eg, s_rk[ctid] * eg, s_rk[ctid] * ex2(g_last - gi), ex2(g_last));
      }
      tp = prof.add(kWsProfChunkDecay, tp);
      // P^T, the only one of this chunk's writes that the state warpgroups read through the async
      // proxy (their wgmma), to that proxy: here, before the wait for A's tile, where its stores
      // have long been done, not in front of the chunk_ready arrival, where the fence waited for
      // A's stores just issued (Nsight Compute: ~4% of this warpgroup's samples at the fence and
      // the arrival). A, beta and the scales are read by plain loads: the arrival's release
      // orders them.
      wgmma::fence_shared_writes();
      // A's tile is free once the state warpgroups' inverse of the previous chunk is done.
      if (chunk > 0) {
        const int pp = int((chunk - 1) & 1);
        mbarrier::wait(t_ready + pp, (t_ready_phase >> pp) & 1u);
        t_ready_phase ^= 1u << pp;
      }
      tp = prof.add(kWsProfChunkTReady, tp);
      if constexpr (!kGdnWsNoDecay) {
        per_warp_index(warp, [&](auto warp_index) {
          store_row_block<decltype(warp_index)::value>(
              acc_g, g, t4, [&](int i, int j, float x0, float x1, bool off_diagonal) {
                store_a_pair<inverse_f16(kL2NormQK, kGated)>(s_a, i, j, x0, x1, off_diagonal);
              });
        });
      }
      // This thread's A, beta, P^T and scales of the chunk, to the state warpgroups (the second
      // inverts (I + A) into the slot's T' tile, see invert; both run wgmma on P^T, fenced above).
      // No barrier: what the next chunk overwrites before its norms' barrier is per warp or by
      // parity.
      mbarrier::arrive(chunk_ready + st);
      prof.add(kWsProfChunkAStore, tp);
      prof.count_chunk();
      st = sn;
    }
  }
};

#endif  // KJIT_GDN_STATE_WGMMA

}  // namespace gdn_prefill_detail

/// Template parameters: element types of q/k/v (bf16), of the raw gates a/b (f32 for precomputed
/// g and beta), of A_log/dt_bias, of the state pool, of out, of cu_seqlens and of state_indices;
/// K = V = 128; kGated, kL2Norm as the chunk kernel's; kCkpt and kStateLayout as the state
/// kernel's. One block per (sequence, value head), sequences longest first as the state kernel.
template <typename Tin, typename Tgate, typename Tparam, typename Tstate, typename Tout,
          typename Tcu, typename Tidx, int kK, int kV, bool kGated, bool kL2Norm, bool kCkpt,
          int kStateLayout = kGdnStateVMajor>
__global__ void __launch_bounds__(kGdnPrefillWsThreads, 1)
    gdn_prefill_ws_kernel(const __grid_constant__ GdnPrefillParams p) {
#if KJIT_GDN_STATE_WGMMA
  static_assert(kK == 128 && kV == 128, "the warp-specialized kernel is laid out for K = V = 128");
  // Measurement only (KJIT_GDN_WS_PROFILE): the block's place in the call's timeline.
  const gdn_prefill_detail::WsBlockTimeline timeline(p);
  gdn_prefill_detail::state_wide<
      Tin, Tstate, Tout, Tcu, Tidx, kK, kV, 128, kCkpt, 0, kGdnPrefillWsStages,
      kStateLayout == kGdnStateKMajor, false,
      gdn_prefill_detail::WsChunkRole<Tin, Tgate, Tparam, kK, kGated, kL2Norm>>(p);
  timeline.end();
#endif
}

}  // namespace kjit
