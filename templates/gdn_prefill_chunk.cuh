// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill, chunked path, kernel 1 of 2: everything of a chunk that does
// not depend on the recurrent state, for every chunk of every sequence at once.
//
// One block of 4 warps per (chunk, q/k head h). With q^, k^ the L2-normalized rows (bf16),
// G = K^ K^^T and Q^ K^^T are computed once per key head; then for each of the HV / H value
// heads hv of the group, with gamma the chunk-local cumulative log decay and beta of hv:
//   A  = strictly-lower beta_i G_ij e^(gamma_i - gamma_j)         (f32, from the mma registers)
//   T  = (I + A)^-1                (f32 forward substitution, one column per thread)
//   T' = T diag(beta)              -> workspace, bf16 rows [token, hv, 64]
//   P  = tril(Q^ K^^T e^(gamma_i - gamma_j))                  -> workspace, bf16 rows
//   scales_i = {e^gamma_i / |q_i|, e^gamma_i / |k_i|, e^(gamma_last - gamma_i) / |k_i|,
//               e^gamma_last}                                 -> workspace, float4
// The state kernel (gdn_prefill_state.cuh) multiplies raw bf16 q and k with the state and
// applies the norms and decays through these scales, so normalized q/k are never stored.
//
// Chunks are numbered without knowing the lengths on the host: chunk c of sequence n is block
// floor(cu[n] / 64) + n + c. These ids never collide (floor((bos + L) / 64) + 1 >=
// floor(bos / 64) + ceil(L / 64)) and stay below floor(T / 64) + N, the grid size; a block
// finds its sequence by binary search on cu_seqlens (a few L1 hits) and exits when its id is a
// hole. The workspace is indexed by token, so holes cost no memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kjit/common/gdn_math.cuh"
#include "kjit/common/mma.cuh"
#include "kjit/gdn_prefill.cuh"
#include "kjit/gdn_prefill_params.h"

namespace kjit {

/// Template parameters: element types of q/k, of the raw gates a/b (f32 for precomputed g and
/// beta), of A_log/dt_bias and of cu_seqlens; K; kGated: a/b hold g and beta; kL2Norm.
template <typename Tin, typename Tgate, typename Tparam, typename Tcu, int kK, bool kGated,
          bool kL2Norm>
// Three blocks per SM (<= 170 registers): the chunk kernel is throughput-bound, and its
// forward substitution's latency is hidden by the other resident blocks.
__global__ void __launch_bounds__(kGdnPrefillThreads, 3)
    gdn_prefill_chunk_kernel(const GdnPrefillParams p) {
  using namespace gdn_prefill_detail;
  static_assert(kK == 64 || kK == 128 || kK == 256, "K must be 64, 128 or 256");
  constexpr int kLdK = kK + 8;  // bf16 row pitch of q and k
  constexpr int kLd = 72;       // bf16 row pitch of the staging tiles
  constexpr int kLdA = 68;      // f32 row pitch of A: 16-byte rows for float4 broadcasts
  constexpr int kPerLane = kK / 32;
  constexpr int kKSteps = kK / 16;
  constexpr GdnPrefillChunkSmem kSmem = gdn_prefill_chunk_smem(kK);

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.q);
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.k);
  float* s_a = reinterpret_cast<float*>(smem + kSmem.a);
  __nv_bfloat16* s_p = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.p);
  __nv_bfloat16* s_t = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.t);
  float* s_gamma = reinterpret_cast<float*>(smem + kSmem.gamma);
  float* s_beta = reinterpret_cast<float*>(smem + kSmem.beta);
  float* s_rq = reinterpret_cast<float*>(smem + kSmem.rq);
  float* s_rk = reinterpret_cast<float*>(smem + kSmem.rk);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int row0 = warp * 16;
  const u32 h = blockIdx.y;
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const auto base = [&](i64 m) { return static_cast<i64>(__ldg(cu + m)) / 64 + m; };
  if (p.num_seqs == 0) return;
  if (blockIdx.y == 0 && p.ws_order != nullptr) {
    rank_sequences_longest_first<Tcu>(p, i64(blockIdx.x) * kGdnPrefillThreads + tid,
                                      i64(gridDim.x) * kGdnPrefillThreads);
  }
  const i64 chunk_ids = p.num_tokens / 64 + i64(p.num_seqs);

  // A grid-stride loop over chunk ids (the grid does not depend on T). Shared buffers are reused
  // across iterations without a trailing barrier: each is rewritten only after a barrier that
  // follows its last read in the previous iteration.
#pragma unroll 1
  for (i64 b = blockIdx.x; b < chunk_ids; b += gridDim.x) {
    // The sequence this chunk id belongs to: the largest n with base(n) <= b.
    if (b < base(0)) continue;
    i64 lo = 0, hi = i64(p.num_seqs) - 1;
    while (lo < hi) {
      const i64 mid = (lo + hi + 1) >> 1;
      if (base(mid) <= b) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const i64 bos = static_cast<i64>(__ldg(cu + lo));
    const i64 eos = static_cast<i64>(__ldg(cu + lo + 1));
    const i64 t0 = bos + 64 * (b - base(lo));
    if (t0 >= eos) continue;
    const int rows = static_cast<int>(eos - t0 < 64 ? eos - t0 : 64);

    // Warp 0 holds the raw gates of the next value head in registers, loaded one step ahead
    // (here for the first, during the previous head's inversion for the others), so no gate
    // load latency sits between the barriers.
    float gate_a[2] = {0.f, 0.f}, gate_b[2] = {0.f, 0.f};
    const auto load_gates = [&](u32 hv) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int r = 2 * lane + x;
        gate_a[x] = 0.f;
        gate_b[x] = 0.f;
        if (r < rows) {
          gate_a[x] = gdn::to_f32(static_cast<const Tgate*>(p.a)[(t0 + r) * p.a_stride_t + hv]);
          gate_b[x] = gdn::to_f32(static_cast<const Tgate*>(p.b)[(t0 + r) * p.b_stride_t + hv]);
        }
      }
    };
    if (warp == 0) load_gates(h * p.heads_per_group);

    // 1. q, k rows L2-normalized to bf16 (rows past the end are zero), and their inverse norms.
    {
      const Tin* q_base = static_cast<const Tin*>(p.q) + i64(h) * p.q_stride_h + lane * kPerLane;
      const Tin* k_base = static_cast<const Tin*>(p.k) + i64(h) * p.k_stride_h + lane * kPerLane;
      constexpr int kBatch = kPerLane <= 4 ? 16 : 8;
#pragma unroll 1
      for (int rb = 0; rb < 16; rb += kBatch) {
        u32 wq[kBatch][kPerLane / 2], wk[kBatch][kPerLane / 2];
#pragma unroll
        for (int rr = 0; rr < kBatch; ++rr) {
          const int r = row0 + rb + rr;
          load_words(q_base + (t0 + r) * p.q_stride_t, r < rows, wq[rr]);
          load_words(k_base + (t0 + r) * p.k_stride_t, r < rows, wk[rr]);
        }
#pragma unroll
        for (int rr = 0; rr < kBatch; ++rr) {
          const int r = row0 + rb + rr;
          float xq[kPerLane], xk[kPerLane];
          unpack_words<Tin>(wq[rr], xq);
          unpack_words<Tin>(wk[rr], xk);
          float iq = 1.f, ik = 1.f;
          if constexpr (kL2Norm) {
            float sq = 0.f, sk = 0.f;
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) {
              sq = fmaf(xq[e], xq[e], sq);
              sk = fmaf(xk[e], xk[e], sk);
            }
            iq = gdn::l2_inv_norm(gdn::group_sum<32>(sq));
            ik = gdn::l2_inv_norm(gdn::group_sum<32>(sk));
#pragma unroll
            for (int e = 0; e < kPerLane; ++e) {
              xq[e] *= iq;
              xk[e] *= ik;
            }
          }
          store_row_bf16(s_q + r * kLdK + lane * kPerLane, xq);
          store_row_bf16(s_k + r * kLdK + lane * kPerLane, xk);
          if (lane == 0) {
            s_rq[r] = iq;
            s_rk[r] = ik;
          }
        }
      }
    }
    __syncthreads();

    // 2. G = K^ K^^T and Q^ K^^T, lower block triangle (warp w: rows 16w.., column blocks <= w).
    float acc_g[8][4], acc_p[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_g[i][e] = acc_p[i][e] = 0.f;
    }
#pragma unroll 2
    for (int ks = 0; ks < kKSteps; ++ks) {
      u32 ak[4], aq[4];
      mma::load_a(ak, s_k + row0 * kLdK + ks * 16, kLdK);
      mma::load_a(aq, s_q + row0 * kLdK + ks * 16, kLdK);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (np <= warp) {
          u32 bk[4];
          mma::load_b2(bk, s_k + np * 16 * kLdK + ks * 16, kLdK);
          mma::mma_bf16(acc_g[2 * np], ak, bk[0], bk[1]);
          mma::mma_bf16(acc_g[2 * np + 1], ak, bk[2], bk[3]);
          mma::mma_bf16(acc_p[2 * np], aq, bk[0], bk[1]);
          mma::mma_bf16(acc_p[2 * np + 1], aq, bk[2], bk[3]);
        }
      }
    }

    const u32 hv_count = p.num_value_heads;
    const i64 ws_row0 = t0 * hv_count;
#pragma unroll 1
    for (u32 e = 0; e < p.heads_per_group; ++e) {
      const u32 hv = h * p.heads_per_group + e;

      // 3. Gates of hv: g (log decay) and beta per row, then the inclusive scan gamma.
      if (warp == 0) {
        float gl[2], bl[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const int r = 2 * lane + x;
          gl[x] = 0.f;
          bl[x] = 0.f;
          if (r < rows) {
            if constexpr (kGated) {
              gl[x] = gate_a[x];
              bl[x] = gate_b[x];
            } else {
              const float a_log = gdn::to_f32(static_cast<const Tparam*>(p.a_log)[hv]);
              const float dt_bias = gdn::to_f32(static_cast<const Tparam*>(p.dt_bias)[hv]);
              gl[x] = gdn::log_decay(gate_a[x], a_log, dt_bias, p.softplus_threshold);
              bl[x] = gdn::sigmoid(gate_b[x]);
            }
          }
        }
        if (e + 1 < p.heads_per_group) load_gates(hv + 1);
        const float local = gl[0] + gl[1];
        float incl = local;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const float y = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += y;
        }
        s_gamma[2 * lane] = incl - local + gl[0];
        s_gamma[2 * lane + 1] = incl;
        s_beta[2 * lane] = bl[0];
        s_beta[2 * lane + 1] = bl[1];
      }
      __syncthreads();

      // 4. A (f32, strictly lower) and P (bf16, lower with the diagonal) of hv; the blocks above
      // the warp's diagonal block are zero in P and never read in A. The per-row scales.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float gi = s_gamma[i], bi = s_beta[i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const int j = nt * 8 + 2 * t4;
          float y0 = 0.f, y1 = 0.f;
          if (nt / 2 <= warp) {
            const float d0 = __expf(gi - s_gamma[j]), d1 = __expf(gi - s_gamma[j + 1]);
            const float x0 = i > j ? bi * d0 * acc_g[nt][2 * hf] : 0.f;
            const float x1 = i > j + 1 ? bi * d1 * acc_g[nt][2 * hf + 1] : 0.f;
            *reinterpret_cast<float2*>(s_a + i * kLdA + j) = make_float2(x0, x1);
            y0 = i >= j ? d0 * acc_p[nt][2 * hf] : 0.f;
            y1 = i >= j + 1 ? d1 * acc_p[nt][2 * hf + 1] : 0.f;
          }
          *reinterpret_cast<u32*>(s_p + i * kLd + j) = mma::pack_bf16(y0, y1);
        }
      }
      if (tid < 64 && tid < rows) {
        const float gi = s_gamma[tid], g_last = s_gamma[63];
        const float eg = __expf(gi);
        const float4 sc = make_float4(s_rq[tid] * eg, s_rk[tid] * eg,
                                      s_rk[tid] * __expf(g_last - gi), __expf(g_last));
        static_cast<float4*>(p.ws_scales)[ws_row0 + i64(tid) * hv_count + hv] = sc;
      }
      __syncthreads();

      // 5. Warps 0-1: T = (I + A)^-1 by forward substitution, thread j owning column j:
      // x_i = -sum_{k<i} A_ik x_k (i > j), x_j = 1, x_i = 0 above. x starts at zero so the
      // float4 groups that reach past k = i - 1 (A is zero there up to the diagonal block's end)
      // add exact zeros. Then T' = T diag(beta) as bf16. Warps 2-3 meanwhile store P's rows.
      if (warp < 2) {
        const int j = tid;
        float x[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) x[i] = 0.f;
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          const float* arow = s_a + i * kLdA;
          float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
          for (int k4 = 0; k4 < (i + 3) / 4; ++k4) {
            const float4 av = *reinterpret_cast<const float4*>(arow + 4 * k4);
            a0 = fmaf(av.x, x[4 * k4], a0);
            a1 = fmaf(av.y, x[4 * k4 + 1], a1);
            a2 = fmaf(av.z, x[4 * k4 + 2], a2);
            a3 = fmaf(av.w, x[4 * k4 + 3], a3);
          }
          const float sum = (a0 + a1) + (a2 + a3);
          x[i] = i < j ? 0.f : (i == j ? 1.f : -sum);
        }
        const float bj = s_beta[j];
#pragma unroll
        for (int i = 0; i < 64; ++i) s_t[i * kLd + j] = __float2bfloat16_rn(x[i] * bj);
      } else {
        __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ws_p) + (ws_row0 + hv) * 64;
        for (int c = tid - 64; c < 64 * 8; c += 64) {
          const int r = c >> 3, part = c & 7;
          if (r < rows) {
            *reinterpret_cast<uint4*>(dst + i64(r) * hv_count * 64 + part * 8) =
                *reinterpret_cast<const uint4*>(s_p + r * kLd + part * 8);
          }
        }
      }
      __syncthreads();
      {
        __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.ws_t) + (ws_row0 + hv) * 64;
        for (int c = tid; c < 64 * 8; c += kGdnPrefillThreads) {
          const int r = c >> 3, part = c & 7;
          if (r < rows) {
            *reinterpret_cast<uint4*>(dst + i64(r) * hv_count * 64 + part * 8) =
                *reinterpret_cast<const uint4*>(s_t + r * kLd + part * 8);
          }
        }
      }
      // The next value head rewrites gamma, A, P and T' only after its own two barriers, which
      // every thread reaches after its share of these copies.
    }
  }
}

}  // namespace kjit
