// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill in one warp-specialized kernel (sm_90a, K = V = 128): one block
// of three warpgroups per (sequence, value head) walks the sequence's chunks, and nothing of a
// chunk but its outputs leaves the SM.
//
//   warpgroup 2 (the chunk role, below): copies each chunk's raw q, k and v rows into a ring of
//     three stages (cp.async, q and k 128-byte swizzled) and computes, one chunk ahead of the state
//     warpgroups, what the chunk kernel (chunk.cuh) writes to the workspace: T' = (I + A)^-1
//     diag(beta) into the stage's swizzled T' tile, the decay scales, and P's row factors
//     (gdn_prefill_p_factors), from K K^T on wgmma, the norms from the diagonals of K K^T and
//     Q Q^T, the gates, the forward substitution and the inverse's tf32 block products.
//   warpgroups 0 and 1 (state.cuh, state_wide with kStateP): the state recurrence on wgmma, 64
//     rows of V each, forming each chunk's P from the stage's q and k tiles during the chunk
//     before.
//
// Four mbarriers per stage hand the stages around: full (the chunk warpgroup's copies landed),
// chunk_ready (its T', scales and factors are in), p_ready (both halves of P are in), empty
// (every state warp is done with the stage). The chunk warpgroup fetches chunk c + 1 while it
// works on chunk c, into the stage of chunk c - 2, which the state warpgroups (on chunk c - 1)
// have released. Compared with the two kernels, the T', P and scale rows (~0.57 GB at 128k
// tokens, H = HV = 16) are never written, and q and k are read once instead of twice.
#pragma once

#include "templates/gdn_prefill/chunk.cuh"
#include "templates/gdn_prefill/state.cuh"

namespace kjit {
namespace gdn_prefill_detail {

#if KJIT_GDN_STATE_WGMMA

/// bf16 element (r, c) of a 64 x 64 128-byte-swizzled tile (rows of 128 bytes, K-major).
__device__ __forceinline__ __nv_bfloat16* sw128_element(unsigned char* tile, int r, int c) {
  return reinterpret_cast<__nv_bfloat16*>(tile + sw128::offset(r, c >> 3) + (c & 7) * 2);
}

/// The named barrier of the chunk warpgroup's four warps (0 is __syncthreads, 2 and 3 the state
/// warpgroups' turns).
__device__ __forceinline__ void chunk_group_sync() {
  asm volatile("bar.sync 4, 128;" ::: "memory");
}

/// The chunk warpgroup of gdn_prefill_ws_kernel (see the top of the file). Template parameters
/// as gdn_prefill_chunk_kernel's.
template <typename Tin, typename Tgate, typename Tparam, int kK, bool kGated, bool kL2Norm>
struct WsChunkRole {
  static constexpr bool kActive = true;

  static __device__ __forceinline__ void run(const GdnPrefillParams& p, const StateWork& w,
                                             unsigned char* smem) {
    using namespace gdn_prefill_chunk_detail;
    static_assert(kK == 128, "the stages are laid out for K = V = 128");
    constexpr GdnPrefillWsSmem kWsSmem = gdn_prefill_ws_smem(kK);
    constexpr GdnPrefillStateSmem kS = kWsSmem.state;
    constexpr int kStages = kGdnPrefillWsStages;
    constexpr u32 kStage = kS.k1 - kS.k0;
    constexpr int kKSteps = kK / 16;
    constexpr int kV = 128, kLdV = kV + 8;
    constexpr int kRowCopies = kK / 8;                             // 16-byte copies per row
    constexpr int kRowsPerPass = kGdnPrefillThreads / kRowCopies;  // 8
    static_assert(kV / 8 == kRowCopies && kRowsPerPass == 8, "q, k and v rows copied alike");

    u64* const full = reinterpret_cast<u64*>(smem + kS.barriers);
    u64* const empty = full + kStages;
    u64* const chunk_ready = reinterpret_cast<u64*>(smem + kWsSmem.chunk_ready);

    const int ctid = static_cast<int>(threadIdx.x) - 2 * kGdnPrefillThreads;
    const int warp = ctid >> 5, lane = ctid & 31, g = lane >> 2, t4 = lane & 3;
    float* const s_a = reinterpret_cast<float*>(smem + kWsSmem.a);
    float* const s_rq = reinterpret_cast<float*>(smem + kWsSmem.rq);
    float* const s_rk = reinterpret_cast<float*>(smem + kWsSmem.rk);
    // Every warp computes the gates itself (as the chunk kernel): its own copies.
    float* const s_gamma = reinterpret_cast<float*>(smem + kWsSmem.gamma) + 64 * warp;
    float* const s_beta = reinterpret_cast<float*>(smem + kWsSmem.beta) + 64 * warp;
    float* const s_cf = reinterpret_cast<float*>(smem + kWsSmem.cf) + 64 * warp;
    float* const s_ref = reinterpret_cast<float*>(smem + kWsSmem.ref) + 4 * warp;
    const float* const s_beta0 = reinterpret_cast<const float*>(smem + kWsSmem.beta);
    const auto parked = [&](int r, int c) { return s_a + (16 * r) * kLdA + 16 * c; };
    const auto t_diag = [&](int i) { return i < 3 ? parked(0, i + 1) : parked(1, 2); };
    float* const t10 = parked(1, 3);
    float* const t32 = parked(2, 3);
    const auto a_blk = [&](int r, int c) { return static_cast<const float*>(parked(r, c)); };

    // The blocks of T' above its diagonal blocks are zero in every stage (nothing else writes
    // them; the first chunk_ready arrival publishes them).
    for (int st = 0; st < kStages; ++st) {
      unsigned char* const t_tile = smem + st * kStage + kS.t0;
      for (int e = ctid; e < 64 * 64; e += kGdnPrefillThreads) {
        const int r = e >> 6, c = e & 63;
        if ((c >> 4) > (r >> 4)) *sw128_element(t_tile, r, c) = __float2bfloat16_rn(0.f);
      }
    }
    const i64 bos = w.bos, eos = w.eos;
    if (bos >= eos) return;
    const auto rows_at = [&](i64 t) { return static_cast<int>(eos - t < 64 ? eos - t : 64); };

    // A chunk's raw q, k (swizzled, rows in order) and v rows (pitch kLdV) into stage st, rows
    // past the sequence zero-filled; the stage's full barrier counts this thread's copies.
    const int copy_part = ctid % kRowCopies, copy_r0 = ctid / kRowCopies;
    const u32 sw_base = u32(sw128::offset(copy_r0, copy_part));
    const auto fill = [&](int st, i64 t) {
      const int rows = rows_at(t);
      unsigned char* const base = smem + st * kStage;
      const __nv_bfloat16* src_q = w.q_g + (t + copy_r0) * p.q_stride_t + copy_part * 8;
      const __nv_bfloat16* src_k = w.k_g + (t + copy_r0) * p.k_stride_t + copy_part * 8;
      const __nv_bfloat16* src_v = w.v_g + (t + copy_r0) * p.v_stride_t + copy_part * 8;
      unsigned char* const dst_q = base + kS.q + sw_base;
      unsigned char* const dst_k = base + kS.k0 + sw_base;
      unsigned char* const dst_v = base + kS.v + (copy_r0 * kLdV + copy_part * 8) * 2;
#pragma unroll
      for (int i = 0; i < 64 / kRowsPerPass; ++i) {
        const bool ok = copy_r0 + i * kRowsPerPass < rows;
        // Rows kRowsPerPass (8) apart keep their swizzle.
        cp_async::copy16(dst_q + i * kRowsPerPass * 128, ok ? src_q : w.q_g, ok);
        cp_async::copy16(dst_k + i * kRowsPerPass * 128, ok ? src_k : w.k_g, ok);
        cp_async::copy16(dst_v + i * kRowsPerPass * kLdV * 2, ok ? src_v : w.v_g, ok);
        src_q += kRowsPerPass * p.q_stride_t;
        src_k += kRowsPerPass * p.k_stride_t;
        src_v += kRowsPerPass * p.v_stride_t;
      }
      mbarrier::cp_async_arrive_noinc(full + st);
    };

    // The raw gates of the next chunk in registers, loaded one chunk ahead (as the chunk kernel).
    Tgate gate_a[2] = {Tgate{}, Tgate{}}, gate_b[2] = {Tgate{}, Tgate{}};
    Tparam gate_a_log{}, gate_dt_bias{};
    const u32 hv = w.hv;
    const auto load_gates = [&](i64 t0, int rows) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int r = 2 * lane + x;
        if (r < rows) {
          gate_a[x] = static_cast<const Tgate*>(p.a)[(t0 + r) * p.a_stride_t + hv];
          gate_b[x] = static_cast<const Tgate*>(p.b)[(t0 + r) * p.b_stride_t + hv];
        }
      }
      if constexpr (!kGated) {
        gate_a_log = static_cast<const Tparam*>(p.a_log)[hv];
        gate_dt_bias = static_cast<const Tparam*>(p.dt_bias)[hv];
      }
    };

    fill(0, bos);
    load_gates(bos, rows_at(bos));
    u32 full_phase = 0, empty_phase = 0;
    int st = 0;
    i64 chunk = 0;
#pragma unroll 1
    for (i64 t0 = bos; t0 < eos; t0 += kGdnPrefillChunk, ++chunk) {
      const int rows = rows_at(t0);
      mbarrier::wait(full + st, (full_phase >> st) & 1u);
      full_phase ^= 1u << st;
      wgmma::fence_shared_writes();  // the landed copies, before wgmma reads them
      // The next chunk's rows into the next stage, once every state warp has released it (it
      // held chunk c - 2; the state warpgroups are on chunk c - 1 by now).
      const i64 tn = t0 + kGdnPrefillChunk;
      const int sn = st + 1 == kStages ? 0 : st + 1;
      if (tn < eos) {
        if (chunk + 1 >= kStages) {
          mbarrier::wait(empty + sn, (empty_phase >> sn) & 1u);
          empty_phase ^= 1u << sn;
        }
        fill(sn, tn);
      }
      unsigned char* const base = smem + st * kStage;

      // 1. G = K K^T on wgmma (warp w holds block row w) and, for |q_i|^2, the diagonal block of
      // Q Q^T of block row w on mma.sync while it runs.
      float acc_g[8][4], acc_qq[2][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc_g[i][0] = acc_g[i][1] = acc_g[i][2] = acc_g[i][3] = 0.f;
      zero_acc(acc_qq);
      const u32 k_addr = mma::smem_addr(base + kS.k0), q_addr = mma::smem_addr(base + kS.q);
      {
        const u64 k_desc = wgmma::descriptor_sw128(k_addr, 16, sw128::kAtom);
        wgmma::hold_registers(acc_g);
        wgmma::fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          const u64 kd = wgmma::advance(k_desc, sw128::k_step(0, ks));
          wgmma::mma_m64n64k16_ss<0>(acc_g, kd, kd);
        }
        wgmma::commit();
        if constexpr (kL2Norm) {
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks) {
            u32 aq[4];
            mma::load_a_sw128(aq, q_addr, 16 * warp, 16 * ks);
            mma::mma_bf16(acc_qq[0], aq, aq[0], aq[2]);
            mma::mma_bf16(acc_qq[1], aq, aq[1], aq[3]);
          }
        }
        wgmma::wait<0>();
        wgmma::hold_registers(acc_g);
      }
      // 2. Inverse norms from the diagonals (as the chunk kernel; q's rows are in order here).
      {
        float dk[2] = {0.f, 0.f}, dq[2] = {0.f, 0.f};
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
          for (int jb = 0; jb < 4; ++jb) {
            if (jb == warp) {
              const float(&c)[4] = acc_g[2 * jb + hf];
              dk[hf] = 2 * t4 == g ? c[2 * hf] : (2 * t4 + 1 == g ? c[2 * hf + 1] : 0.f);
            }
          }
          dq[hf] =
              2 * t4 == g ? acc_qq[hf][2 * hf] : (2 * t4 + 1 == g ? acc_qq[hf][2 * hf + 1] : 0.f);
#pragma unroll
          for (int off = 1; off < 4; off *= 2) {
            dk[hf] += __shfl_xor_sync(0xffffffffu, dk[hf], off);
            dq[hf] += __shfl_xor_sync(0xffffffffu, dq[hf], off);
          }
        }
        if (t4 == 0) {
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            s_rk[16 * warp + g + 8 * hf] = kL2Norm ? gdn::l2_inv_norm(dk[hf]) : 1.f;
            s_rq[16 * warp + g + 8 * hf] = p.scale * (kL2Norm ? gdn::l2_inv_norm(dq[hf]) : 1.f);
          }
        }
      }
      // The norms are visible; the previous chunk's readers of A, the parked blocks and beta are
      // past their last use.
      chunk_group_sync();

      // 3. Gates: g (log decay) and beta per row, the inclusive scan gamma (each warp its own
      // copy), the column factors of the off-diagonal blocks.
      {
        float gl[2], bl[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int r = 2 * lane + x;
          gl[x] = 0.f;
          bl[x] = 0.f;
          if (r < rows) {
            if constexpr (kGated) {
              gl[x] = gdn::to_f32(gate_a[x]);
              bl[x] = gdn::to_f32(gate_b[x]);
            } else {
              gl[x] = gdn::fast_log_decay(gdn::to_f32(gate_a[x]), gdn::to_f32(gate_a_log),
                                          gdn::to_f32(gate_dt_bias), p.softplus_threshold);
              bl[x] = gdn::fast_sigmoid(gdn::to_f32(gate_b[x]));
            }
          }
        }
        if (tn < eos) load_gates(tn, rows_at(tn));
        const float local = gl[0] + gl[1];
        float incl = local;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const float y = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += y;
        }
        const float g0 = incl - local + gl[0];
        s_gamma[2 * lane] = g0;
        s_gamma[2 * lane + 1] = incl;
        s_beta[2 * lane] = bl[0];
        s_beta[2 * lane + 1] = bl[1];
        const float ref = __shfl_sync(0xffffffffu, incl, (lane & ~7) | 7);
        const float2 rk = *reinterpret_cast<const float2*>(s_rk + 2 * lane);
        *reinterpret_cast<float2*>(s_cf + 2 * lane) =
            make_float2(rk.x * ex2((ref - g0) * kLog2e), rk.y * ex2((ref - incl) * kLog2e));
        if ((lane & 7) == 0) s_ref[lane >> 3] = ref;
      }
      __syncwarp();

      // 4. A (f32, strictly lower) of block row `warp`, compiled once per warp index: the
      // off-diagonal blocks take the decay as a row factor times the column factor, the diagonal
      // block one exponential per element (the upper part selected away: it may overflow).
      const auto a_pass = [&](auto row_block) {
        constexpr int kRow = decltype(row_block)::value;
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int i = kRow * 16 + g + 8 * hf;
          const float gi = s_gamma[i], fi = s_beta[i] * s_rk[i];
#pragma unroll
          for (int jb = 0; jb <= kRow; ++jb) {
#pragma unroll
            for (int h2 = 0; h2 < 2; ++h2) {
              const int nt = 2 * jb + h2, j = nt * 8 + 2 * t4;
              float x0, x1;
              if (jb < kRow) {
                const float rf = fi * ex2((gi - s_ref[jb]) * kLog2e);
                const float2 cf = *reinterpret_cast<const float2*>(s_cf + j);
                x0 = rf * cf.x * acc_g[nt][2 * hf];
                x1 = rf * cf.y * acc_g[nt][2 * hf + 1];
              } else {
                const float2 gj = *reinterpret_cast<const float2*>(s_gamma + j);
                const float2 kj = *reinterpret_cast<const float2*>(s_rk + j);
                const float y0 = fi * kj.x * ex2((gi - gj.x) * kLog2e) * acc_g[nt][2 * hf];
                const float y1 = fi * kj.y * ex2((gi - gj.y) * kLog2e) * acc_g[nt][2 * hf + 1];
                x0 = i > j ? y0 : 0.f;
                x1 = i > j + 1 ? y1 : 0.f;
              }
              *reinterpret_cast<float2*>(s_a + i * kLdA + j) = make_float2(x0, x1);
            }
          }
        }
      };
      switch (warp) {
        case 0:
          a_pass(Constant<0>{});
          break;
        case 1:
          a_pass(Constant<1>{});
          break;
        case 2:
          a_pass(Constant<2>{});
          break;
        default:
          a_pass(Constant<3>{});
          break;
      }
      // The chunk's scales and P's row factors into the stage: every row (rows past the end have
      // zero q, k and gates, so their factors are finite and their P entries are masked).
      if (ctid < 64) {
        const float gi = s_gamma[ctid], g_last = s_gamma[63];
        const float eg = __expf(gi);
        reinterpret_cast<float4*>(base + kS.sc0)[ctid] = make_float4(
            s_rq[ctid] * eg, s_rk[ctid] * eg, s_rk[ctid] * __expf(g_last - gi), __expf(g_last));
        reinterpret_cast<float4*>(base + kS.p + kWgmmaPFactors)[ctid] =
            gdn_prefill_p_factors(gi, s_rq[ctid], s_rk[ctid]);
      }
      chunk_group_sync();

      unsigned char* const t_tile = base + kS.t0;
      // T' block (bi, bj) as bf16 from c = -(T_ij)^T (store_t_block's arithmetic, swizzled).
      const auto store_t = [&](int bi, int bj, const float(&c)[2][4]) {
        const float b0 = s_beta0[16 * bj + g], b1 = s_beta0[16 * bj + g + 8];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int m = g + 8 * (e >> 1), n = 8 * nt + 2 * t4 + (e & 1);
            *sw128_element(t_tile, 16 * bi + n, 16 * bj + m) =
                __float2bfloat16_rn(-c[nt][e] * (e < 2 ? b0 : b1));
          }
        }
      };

      // 5a. T_ww = (I + A_ww)^-1 by forward substitution (lane c mod 16 owns column c).
      {
        const int c = lane & 15;
        const float* ab = s_a + (16 * warp) * kLdA + 16 * warp;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          float acc = 0.f;
#pragma unroll
          for (int m4 = 0; m4 < r; m4 += 4) {
            const float4 av = *reinterpret_cast<const float4*>(ab + r * kLdA + m4);
            acc = fmaf(av.x, x[m4], acc);
            if (m4 + 1 < r) acc = fmaf(av.y, x[m4 + 1], acc);
            if (m4 + 2 < r) acc = fmaf(av.z, x[m4 + 2], acc);
            if (m4 + 3 < r) acc = fmaf(av.w, x[m4 + 3], acc);
          }
          x[r] = r < c ? 0.f : (r == c ? 1.f : -acc);
        }
        if (lane < 16) {
          float* td = t_diag(warp);
          const float bc = s_beta0[16 * warp + c];
#pragma unroll
          for (int r = 0; r < 16; ++r) {
            td[r * kLdA + c] = x[r];
            *sw128_element(t_tile, 16 * warp + r, 16 * warp + c) = __float2bfloat16_rn(x[r] * bc);
          }
        }
      }
      chunk_group_sync();

      // 5b / 5c. The off-diagonal blocks of T, as the chunk kernel (transposed products on tf32).
      float z1[2][4], z2[2][4];
      zero_acc(z1);
      zero_acc(z2);
      {
        float c[2][4];
        zero_acc(c);
        if (warp == 0) {
          mma_bt(z1, load_a_transposed(t_diag(0), g, t4), a_blk(1, 0), g, t4);
          mma_bt(c, a_from_acc(z1), t_diag(1), g, t4);
          park_neg_transposed(t10, c, g, t4);
          store_t(1, 0, c);
        } else if (warp == 1) {
          mma_bt(z1, load_a_transposed(t_diag(2), g, t4), a_blk(3, 2), g, t4);
          mma_bt(c, a_from_acc(z1), t_diag(3), g, t4);
          park_neg_transposed(t32, c, g, t4);
          store_t(3, 2, c);
        } else if (warp == 2) {
          const TfA t11 = load_a_transposed(t_diag(1), g, t4);
          mma_bt(z1, t11, a_blk(2, 1), g, t4);
          mma_bt(z2, t11, a_blk(3, 1), g, t4);
          mma_bt(c, a_from_acc(z1), t_diag(2), g, t4);
          store_t(2, 1, c);
        } else {
          const TfA t00 = load_a_transposed(t_diag(0), g, t4);
          mma_bt(z1, t00, a_blk(2, 0), g, t4);
          mma_bt(z2, t00, a_blk(3, 0), g, t4);
        }
      }
      chunk_group_sync();
      {
        float c[2][4];
        zero_acc(c);
        if (warp == 0) {
          zero_acc(z1);
          mma_bt(z1, load_a_transposed(t_diag(0), g, t4), a_blk(2, 0), g, t4);
          mma_bt(z1, load_a_transposed(t10, g, t4), a_blk(2, 1), g, t4);
          mma_bt(c, a_from_acc(z1), t_diag(2), g, t4);
          store_t(2, 0, c);
        } else if (warp == 2) {
          mma_bt(c, a_from_acc(z1), t32, g, t4);
          mma_bt(c, a_from_acc(z2), t_diag(3), g, t4);
          store_t(3, 1, c);
        } else if (warp == 3) {
          const TfA t10a = load_a_transposed(t10, g, t4);
          mma_bt(z1, t10a, a_blk(2, 1), g, t4);
          mma_bt(z2, t10a, a_blk(3, 1), g, t4);
          mma_bt(c, a_from_acc(z1), t32, g, t4);
          mma_bt(c, a_from_acc(z2), t_diag(3), g, t4);
          store_t(3, 0, c);
        }
      }
      // This thread's T', scales and factors of the stage, to the state warpgroups' wgmma.
      wgmma::fence_shared_writes();
      mbarrier::arrive(chunk_ready + st);
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
    gdn_prefill_ws_kernel(const GdnPrefillParams p) {
#if KJIT_GDN_STATE_WGMMA
  static_assert(kK == 128 && kV == 128, "the warp-specialized kernel is laid out for K = V = 128");
  gdn_prefill_detail::state_wide<
      Tin, Tstate, Tout, Tcu, Tidx, kK, kV, 128, kCkpt, 0, kGdnPrefillWsStages,
      kStateLayout == kGdnStateKMajor, true,
      gdn_prefill_detail::WsChunkRole<Tin, Tgate, Tparam, kK, kGated, kL2Norm>>(p);
#endif
}

}  // namespace kjit
