// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill (varlen, state pool) on tensor cores.
//
// One block of 4 warps owns one (sequence n, value head hv, value tile of kBV rows) and walks
// the sequence's chunks of 64 tokens in order, carrying the state tile S [kBV, K] (f32, in
// registers, mma accumulator layout). Per chunk, with local rows i, j in 0..63, gamma the
// chunk-local cumulative log decay, q and k L2-normalized (bf16), beta the write strength:
//   A   = strictly-lower beta_i (k_i . k_j) e^(gamma_i - gamma_j)            (mma, K-reduction)
//   T   = (I + A)^-1              (f32: 16x16 diagonal blocks by columns, then block rows)
//   R   = diag(beta) (V - diag(e^gamma) K S^T)                                (mma)
//   Vn  = T R                     (= U - W S^T of the WY form, without storing W and U)
//   O   = scale (diag(e^gamma) Q S^T + tril(Q K^T . e^(gamma_i - gamma_j)) Vn)  (mma)
//   S  <- e^gamma_last S + sum_j e^(gamma_last - gamma_j) Vn_j k_j^T          (mma)
// Rows past the end of the sequence are zero (k, q, v, beta = 0, g = 0), which makes their
// rows and columns of A, R and Vn zero: they change nothing, and their outputs are not stored.
//
// Every mma operand is bf16 with f32 accumulation (f16 inputs are normalized in f32 and
// rounded to bf16 too); T and S stay f32 and are rounded only as operands.
//
// Warp w owns rows 16w..16w+15 of every 64-row product; products with a causal mask skip the
// column blocks above the diagonal. The state update splits the [kBV, K] tile over the warps.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/common/gdn_math.cuh"
#include "templates/common/mma.cuh"
#include "templates/common/vec.cuh"
#include "templates/gdn_prefill/params.h"

namespace kjit {
namespace gdn_prefill_detail {

/// kW 32-bit words (2 kW consecutive 16-bit elements) with one vector load when `valid`, zeros
/// otherwise (the host checks the alignment).
template <typename T, int kW>
__device__ __forceinline__ void load_words(const T* ptr, bool valid, u32 (&w)[kW]) {
  if constexpr (kW == 4) {
    const uint4 v = valid ? *reinterpret_cast<const uint4*>(ptr) : make_uint4(0u, 0u, 0u, 0u);
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else if constexpr (kW == 2) {
    const uint2 v = valid ? *reinterpret_cast<const uint2*>(ptr) : make_uint2(0u, 0u);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kW == 1, "K / 32 must be 2, 4 or 8");
    w[0] = valid ? *reinterpret_cast<const u32*>(ptr) : 0u;
  }
}

template <typename T, int kW>
__device__ __forceinline__ void unpack_words(const u32 (&w)[kW], float (&x)[2 * kW]) {
#pragma unroll
  for (int i = 0; i < kW; ++i) {
    x[2 * i] = vec::Bits<T>::to_f32(w[i] & 0xffffu);
    x[2 * i + 1] = vec::Bits<T>::to_f32(w[i] >> 16);
  }
}

/// kN / 2 packed bf16 words into shared memory with one vector store.
template <int kN>
__device__ __forceinline__ void store_row_bf16(__nv_bfloat16* ptr, const float (&x)[kN]) {
  u32 w[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) w[i] = mma::pack_bf16(x[2 * i], x[2 * i + 1]);
  vec::store<2 * kN>(ptr, w);
}

template <typename T>
__device__ __forceinline__ float2 load_pair(const T* ptr);
template <>
__device__ __forceinline__ float2 load_pair<float>(const float* ptr) {
  return *reinterpret_cast<const float2*>(ptr);
}
template <>
__device__ __forceinline__ float2 load_pair<__nv_bfloat16>(const __nv_bfloat16* ptr) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ptr));
}
template <>
__device__ __forceinline__ float2 load_pair<__half>(const __half* ptr) {
  return __half22float2(*reinterpret_cast<const __half2*>(ptr));
}

template <typename T>
__device__ __forceinline__ void store_pair(T* ptr, float x0, float x1);
template <>
__device__ __forceinline__ void store_pair<float>(float* ptr, float x0, float x1) {
  *reinterpret_cast<float2*>(ptr) = make_float2(x0, x1);
}
template <>
__device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* ptr, float x0, float x1) {
  *reinterpret_cast<__nv_bfloat162*>(ptr) = __floats2bfloat162_rn(x0, x1);
}
template <>
__device__ __forceinline__ void store_pair<__half>(__half* ptr, float x0, float x1) {
  *reinterpret_cast<__half2*>(ptr) = __floats2half2_rn(x0, x1);
}

/// One element, rounded to T (outputs stored along a column, as the wgmma state path does).
template <typename T>
__device__ __forceinline__ void store_one(T* ptr, float x);
template <>
__device__ __forceinline__ void store_one<float>(float* ptr, float x) {
  *ptr = x;
}
template <>
__device__ __forceinline__ void store_one<__nv_bfloat16>(__nv_bfloat16* ptr, float x) {
  *ptr = __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ void store_one<__half>(__half* ptr, float x) {
  *ptr = __float2half_rn(x);
}

/// Offset of a state tile (value head hv, rows v0 ..) from its slot: where the tile's element
/// (v0, 0) is in a [V, K] row-major state (V-major), or in its transpose [K, V] (kKMajor, fla's
/// layout: element (v, k) at k * kV + v).
template <bool kKMajor, int kK, int kV>
__device__ __forceinline__ i64 state_tile_offset(u32 hv, int v0) {
  if constexpr (kKMajor) {
    return i64(hv) * kV * kK + v0;
  } else {
    return (i64(hv) * kV + v0) * kK;
  }
}

/// Elements (v, kk) and (v, kk + 1) of a state tile (state_tile_offset) as f32: one pair load
/// (V-major), or two loads a line of kV apart (kKMajor; lanes of consecutive v read
/// consecutive addresses).
template <bool kKMajor, int kK, int kV, typename T>
__device__ __forceinline__ float2 load_state_pair(const T* tile, int v, int kk) {
  if constexpr (kKMajor) {
    return make_float2(gdn::to_f32(tile[kk * kV + v]), gdn::to_f32(tile[(kk + 1) * kV + v]));
  } else {
    return load_pair(tile + v * kK + kk);
  }
}

/// Stores the f32 state tile (accumulator layout, see the kernel) to `dst`, the tile's element
/// (v0, 0) (state_tile_offset) in a [V, K] row-major state or, kKMajor, its transpose, rounded to
/// Tstate. Used for the final state and checkpoints.
template <typename Tstate, int kK, bool kKMajor = false, int kV = 0, int kSMTiles, int kSNTiles>
__device__ __forceinline__ void store_state_tile(Tstate* dst,
                                                 const float (&s)[kSMTiles][kSNTiles][4], int wm,
                                                 int wn, int g, int t4) {
  static_assert(!kKMajor || kV > 0, "a K-major tile needs its line length V");
#pragma unroll
  for (int mi = 0; mi < kSMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kSNTiles; ++ni) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int v = (wm * kSMTiles + mi) * 16 + g + 8 * hf;
        const int kk = (wn * kSNTiles + ni) * 8 + 2 * t4;
        if constexpr (kKMajor) {
          store_one(dst + kk * kV + v, s[mi][ni][2 * hf]);
          store_one(dst + (kk + 1) * kV + v, s[mi][ni][2 * hf + 1]);
        } else {
          store_pair(dst + v * kK + kk, s[mi][ni][2 * hf], s[mi][ni][2 * hf + 1]);
        }
      }
    }
  }
}

/// S <- decay S + Vd^T K on this warp's part of the state tile (accumulator layout, see the
/// kernels), then the tile's bf16 copy `s_s` that the next chunk's products read. `vd`: the
/// decayed Vn^T [kBV][kLd]; `k`: the chunk's bf16 k rows [64][kLdK]. Shared by the fused kernel
/// and the chunked path's state kernel.
template <int kLd, int kLdK, int kSMTiles, int kSNTiles>
__device__ __forceinline__ void update_state_tile(float (&s)[kSMTiles][kSNTiles][4], float decay,
                                                  const __nv_bfloat16* vd, const __nv_bfloat16* k,
                                                  __nv_bfloat16* s_s, int wm, int wn, int g,
                                                  int t4) {
#pragma unroll
  for (int mi = 0; mi < kSMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kSNTiles; ++ni) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mi][ni][e] *= decay;
    }
  }
#pragma unroll
  for (int st = 0; st < 4; ++st) {
#pragma unroll
    for (int mi = 0; mi < kSMTiles; ++mi) {
      u32 a[4];
      mma::load_a(a, vd + ((wm * kSMTiles + mi) * 16) * kLd + st * 16, kLd);
#pragma unroll
      for (int np = 0; np < kSNTiles / 2; ++np) {
        u32 b[4];
        mma::load_b2_trans(b, k + (st * 16) * kLdK + (wn * kSNTiles + 2 * np) * 8, kLdK);
        mma::mma_bf16(s[mi][2 * np], a, b[0], b[1]);
        mma::mma_bf16(s[mi][2 * np + 1], a, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int mi = 0; mi < kSMTiles; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kSNTiles; ++ni) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int v = (wm * kSMTiles + mi) * 16 + g + 8 * hf;
        const int kk = (wn * kSNTiles + ni) * 8 + 2 * t4;
        *reinterpret_cast<u32*>(s_s + v * kLdK + kk) =
            mma::pack_bf16(s[mi][ni][2 * hf], s[mi][ni][2 * hf + 1]);
      }
    }
  }
}

/// The final state tile: into the separate output when given (padded sequences included), else
/// back into the pool slot unless the sequence is padding.
template <typename Tstate, int kK, int kV, bool kKMajor = false, int kSMTiles, int kSNTiles>
__device__ __forceinline__ void store_final_state(const GdnPrefillParams& p, u64 n, i64 slot,
                                                  bool padded, u32 hv, int v0,
                                                  const float (&s)[kSMTiles][kSNTiles][4], int wm,
                                                  int wn, int g, int t4) {
  Tstate* dst = nullptr;
  if (p.final_state != nullptr) {
    dst = static_cast<Tstate*>(p.final_state) + i64(n) * p.final_seq_stride;
  } else if (!padded) {
    dst = static_cast<Tstate*>(p.state) + slot * p.state_slot_stride;
  }
  if (dst == nullptr) return;
  store_state_tile<Tstate, kK, kKMajor, kV>(dst + state_tile_offset<kKMajor, kK, kV>(hv, v0), s, wm,
                                            wn, g, t4);
}

/// Longest-first scheduling for the state kernel, whose blocks each walk one sequence's chunks
/// in order, so a long sequence whose blocks start late bounds the time of the whole batch.
/// Sequence i gets rank r = #{j : c_j > c_i or (c_j = c_i and j < i)} with c the chunk counts
/// (a strict total order, so order[] is a permutation even for a malformed cu_seqlens), and
/// order[r] = i. Blocks are dispatched in about index order: the longest sequences start first
/// and short ones fill the SMs that free up (LPT). Threads first, first + step, ... rank one
/// sequence each against all N, reading cu_seqlens through the read-only cache (broadcasts).
template <typename Tcu>
__device__ void rank_sequences_longest_first(const GdnPrefillParams& p, i64 first, i64 step) {
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const i64 seqs = i64(p.num_seqs);
  const auto chunks = [](i64 len) { return (len + kGdnPrefillChunk - 1) / kGdnPrefillChunk; };
  for (i64 i = first; i < seqs; i += step) {
    const i64 ci = chunks(i64(__ldg(cu + i + 1)) - i64(__ldg(cu + i)));
    i64 rank = 0, prev = i64(__ldg(cu));
#pragma unroll 4
    for (i64 j = 0; j < seqs; ++j) {
      const i64 next = i64(__ldg(cu + j + 1));
      const i64 cj = chunks(next - prev);
      prev = next;
      rank += (cj > ci || (cj == ci && j < i)) ? 1 : 0;
    }
    static_cast<int*>(p.ws_order)[rank] = static_cast<int>(i);
  }
}

constexpr float kLog2e = 1.4426950408889634f;

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// 2^x (MUFU, flushing results below 2^-126 to zero): the chunked path's decay factors.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#endif
/// What the state kernel needs of row i to form P itself (kStateP):
/// P_ij = s rq_i rk_j (Q K^T)_ij 2^(x_i - x_j) for i >= j, with x = gamma log2(e) (the gamma
/// scan is non-increasing, so 2^(x_i - x_j) <= 1 and no factor can overflow, whatever the
/// gates); {x_i, s rq_i (the output scale included), rk_i, 0}.
__device__ __forceinline__ float4 gdn_prefill_p_factors(float gamma_log2, float scaled_rq,
                                                        float rk) {
  return make_float4(gamma_log2, scaled_rq, rk, 0.f);
}

}  // namespace gdn_prefill_detail

/// Template parameters: element types of q/k/v, of the raw gates a/b (f32 for precomputed g and
/// beta), of A_log/dt_bias, of the state pool, of out, of cu_seqlens and of state_indices; K, V,
/// the value tile kBV; kGated: a/b hold g and beta; kL2Norm: normalize q and k; kCkpt: write
/// the state after every p.ckpt_every_chunks full chunks to p.checkpoints (a template flag so the
/// kernel without checkpoints carries no trace of them).
template <typename Tin, typename Tgate, typename Tparam, typename Tstate, typename Tout,
          typename Tcu, typename Tidx, int kK, int kV, int kBV, bool kGated, bool kL2Norm,
          bool kCkpt, int kStateLayout = kGdnStateVMajor>
__global__ void __launch_bounds__(kGdnPrefillThreads) gdn_prefill_kernel(const GdnPrefillParams p) {
  using namespace gdn_prefill_detail;
  constexpr bool kKMajor = kStateLayout == kGdnStateKMajor;
  static_assert(kK == 64 || kK == 128 || kK == 256, "K must be 64, 128 or 256");
  static_assert(kV % kBV == 0 && kV <= 256, "the value tile must divide V");
  static_assert(kBV == 16 || kBV == 32 || kBV == 64, "the value tile must be 16, 32 or 64");
  static_assert(kBV * kK <= 8192, "the f32 state tile must fit 64 registers per thread");
  constexpr int kLdK = kK + 8;  // bf16 row pitch of q, k and the state copy
  constexpr int kLd = 72;       // bf16 / f32 row pitch of the 64-wide tiles
  constexpr int kPerLane = kK / 32;
  constexpr int kKSteps = kK / 16;
  constexpr int kVT8 = kBV / 8;  // n-tiles of a [64, kBV] product
  constexpr int kSWarpsM = kBV / 16 < 4 ? kBV / 16 : 4;
  constexpr int kSWarpsN = 4 / kSWarpsM;
  constexpr int kSMTiles = kBV / 16 / kSWarpsM;
  constexpr int kSNTiles = kK / 8 / kSWarpsN;
  static_assert(kSNTiles % 2 == 0, "state n-tiles are loaded in pairs");
  constexpr GdnPrefillSmem kSmem = gdn_prefill_smem(kK, kBV);

  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.q);
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.k);
  __nv_bfloat16* s_s = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.s);
  float* s_a = reinterpret_cast<float*>(smem + kSmem.a);
  // After T is built, A's buffer holds Vn^T [kBV][72] and the decayed Vn^T right after it.
  __nv_bfloat16* s_vn = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.a);
  __nv_bfloat16* s_vg = s_vn + kBV * kLd;
  float* s_t = reinterpret_cast<float*>(smem + kSmem.t);
  __nv_bfloat16* s_p = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.p);
  __nv_bfloat16* s_r = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.r);
  float* s_gamma = reinterpret_cast<float*>(smem + kSmem.gamma);
  float* s_beta = reinterpret_cast<float*>(smem + kSmem.beta);

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int row0 = warp * 16;

  const u64 tiles = p.v_tiles;
  const u64 block = blockIdx.x;
  const int vt = static_cast<int>(block % tiles);
  const u32 hv = static_cast<u32>((block / tiles) % p.num_value_heads);
  const u64 n = block / (tiles * p.num_value_heads);
  const u32 h = hv / p.heads_per_group;
  const int v0 = vt * kBV;

  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const i64 bos = static_cast<i64>(cu[n]);
  const i64 eos = static_cast<i64>(cu[n + 1]);
  const i64 slot =
      static_cast<i64>(static_cast<const Tidx*>(p.state_indices)[i64(n) * p.index_stride]);
  const bool padded = slot < 0 || slot >= p.num_slots;
  const bool has_init = !padded && (p.has_initial_state == nullptr ||
                                    p.has_initial_state[i64(n) * p.has_init_stride] != 0);

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

  const Tin* q_base = static_cast<const Tin*>(p.q) + i64(h) * p.q_stride_h + lane * kPerLane;
  const Tin* k_base = static_cast<const Tin*>(p.k) + i64(h) * p.k_stride_h + lane * kPerLane;
  const Tin* v_base = static_cast<const Tin*>(p.v) + i64(hv) * p.v_stride_h + v0;
  Tout* o_base = static_cast<Tout*>(p.out) + i64(hv) * p.out_stride_h + v0;

  // Checkpoints: the next row this sequence writes and how many chunks remain until it. Padding
  // sequences write theirs too (from their zero start): the caller's prefix gives them rows,
  // which would otherwise hold garbage.
  i64 ckpt_row = 0, ckpt_countdown = 0;
  if constexpr (kCkpt) {
    ckpt_row = p.checkpoint_starts[n];
    ckpt_countdown = p.ckpt_every_chunks;
  }

  for (i64 t0 = bos; t0 < eos; t0 += kGdnPrefillChunk) {
    const int rows = static_cast<int>(eos - t0 < 64 ? eos - t0 : 64);
    // The previous chunk's state update still reads s_k.
    __syncthreads();

    // 1. q, k rows (L2-normalized, bf16), gates and the cumulative decay. Every global load of
    // the chunk (q, k, this thread's v pairs, gates) is issued before any is consumed: one
    // memory latency per chunk instead of one per row.
    u32 v_raw[2][kVT8];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int i = row0 + g + 8 * hf;
#pragma unroll
      for (int nt = 0; nt < kVT8; ++nt) {
        v_raw[hf][nt] =
            i < rows
                ? *reinterpret_cast<const u32*>(v_base + (t0 + i) * p.v_stride_t + nt * 8 + 2 * t4)
                : 0u;
      }
    }
    float gate_a[2] = {0.f, 0.f}, gate_b[2] = {0.f, 0.f};
    if (warp == 0) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 2 * lane + e;
        if (r < rows) {
          gate_a[e] = gdn::to_f32(static_cast<const Tgate*>(p.a)[(t0 + r) * p.a_stride_t + hv]);
          gate_b[e] = gdn::to_f32(static_cast<const Tgate*>(p.b)[(t0 + r) * p.b_stride_t + hv]);
        }
      }
    }
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
        if constexpr (kL2Norm) {
          float sq = 0.f, sk = 0.f;
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) {
            sq = fmaf(xq[e], xq[e], sq);
            sk = fmaf(xk[e], xk[e], sk);
          }
          const float iq = gdn::l2_inv_norm_unguarded(gdn::group_sum<32>(sq));
          const float ik = gdn::l2_inv_norm_unguarded(gdn::group_sum<32>(sk));
#pragma unroll
          for (int e = 0; e < kPerLane; ++e) {
            xq[e] *= iq;
            xk[e] *= ik;
          }
        }
        store_row_bf16(s_q + r * kLdK + lane * kPerLane, xq);
        store_row_bf16(s_k + r * kLdK + lane * kPerLane, xk);
      }
    }
    if (warp == 0) {
      float gl[2], bl[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int r = 2 * lane + e;
        gl[e] = 0.f;
        bl[e] = 0.f;
        if (r < rows) {
          if constexpr (kGated) {
            gl[e] = gate_a[e];
            bl[e] = gate_b[e];
          } else {
            const float a_log = gdn::to_f32(static_cast<const Tparam*>(p.a_log)[hv]);
            const float dt_bias = gdn::to_f32(static_cast<const Tparam*>(p.dt_bias)[hv]);
            gl[e] = gdn::log_decay(gate_a[e], a_log, dt_bias, p.softplus_threshold);
            bl[e] = gdn::sigmoid(gate_b[e]);
          }
        }
      }
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

    // 2a. A = gated strictly-lower beta K K^T (f32) and R^T = (beta (V - e^gamma K S^T))^T.
    {
      float acc_g[8][4], acc_r[kVT8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc_g[i][0] = acc_g[i][1] = acc_g[i][2] = acc_g[i][3] = 0.f;
#pragma unroll
      for (int i = 0; i < kVT8; ++i) acc_r[i][0] = acc_r[i][1] = acc_r[i][2] = acc_r[i][3] = 0.f;
#pragma unroll 2
      for (int ks = 0; ks < kKSteps; ++ks) {
        u32 a[4];
        mma::load_a(a, s_k + row0 * kLdK + ks * 16, kLdK);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np <= warp) {
            u32 b[4];
            mma::load_b2(b, s_k + np * 16 * kLdK + ks * 16, kLdK);
            mma::mma_bf16(acc_g[2 * np], a, b[0], b[1]);
            mma::mma_bf16(acc_g[2 * np + 1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kVT8 / 2; ++np) {
          u32 b[4];
          mma::load_b2(b, s_s + np * 16 * kLdK + ks * 16, kLdK);
          mma::mma_bf16(acc_r[2 * np], a, b[0], b[1]);
          mma::mma_bf16(acc_r[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float gi = s_gamma[i], bi = s_beta[i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (nt / 2 <= warp) {
            const int j = nt * 8 + 2 * t4;
            const float x0 = i > j ? bi * __expf(gi - s_gamma[j]) * acc_g[nt][2 * hf] : 0.f;
            const float x1 =
                i > j + 1 ? bi * __expf(gi - s_gamma[j + 1]) * acc_g[nt][2 * hf + 1] : 0.f;
            *reinterpret_cast<float2*>(s_a + i * kLd + j) = make_float2(x0, x1);
          }
        }
        const float eg = __expf(gi);
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          const int c = nt * 8 + 2 * t4;
          float r0 = 0.f, r1 = 0.f;
          if (i < rows) {
            r0 = bi * (vec::Bits<Tin>::to_f32(v_raw[hf][nt] & 0xffffu) - eg * acc_r[nt][2 * hf]);
            r1 = bi * (vec::Bits<Tin>::to_f32(v_raw[hf][nt] >> 16) - eg * acc_r[nt][2 * hf + 1]);
          }
          s_r[c * kLd + i] = __float2bfloat16_rn(r0);
          s_r[(c + 1) * kLd + i] = __float2bfloat16_rn(r1);
        }
      }
    }

    // 2b. P = causal gated Q K^T (bf16) and O = e^gamma Q S^T (kept in registers).
    float acc_o[kVT8][4];
    {
      float acc_p[8][4];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc_p[i][0] = acc_p[i][1] = acc_p[i][2] = acc_p[i][3] = 0.f;
#pragma unroll
      for (int i = 0; i < kVT8; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
#pragma unroll 2
      for (int ks = 0; ks < kKSteps; ++ks) {
        u32 a[4];
        mma::load_a(a, s_q + row0 * kLdK + ks * 16, kLdK);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np <= warp) {
            u32 b[4];
            mma::load_b2(b, s_k + np * 16 * kLdK + ks * 16, kLdK);
            mma::mma_bf16(acc_p[2 * np], a, b[0], b[1]);
            mma::mma_bf16(acc_p[2 * np + 1], a, b[2], b[3]);
          }
        }
#pragma unroll
        for (int np = 0; np < kVT8 / 2; ++np) {
          u32 b[4];
          mma::load_b2(b, s_s + np * 16 * kLdK + ks * 16, kLdK);
          mma::mma_bf16(acc_o[2 * np], a, b[0], b[1]);
          mma::mma_bf16(acc_o[2 * np + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float gi = s_gamma[i];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          if (nt / 2 <= warp) {
            const int j = nt * 8 + 2 * t4;
            const float x0 = i >= j ? __expf(gi - s_gamma[j]) * acc_p[nt][2 * hf] : 0.f;
            const float x1 = i >= j + 1 ? __expf(gi - s_gamma[j + 1]) * acc_p[nt][2 * hf + 1] : 0.f;
            *reinterpret_cast<u32*>(s_p + i * kLd + j) = mma::pack_bf16(x0, x1);
          }
        }
        const float eg = __expf(gi);
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          acc_o[nt][2 * hf] *= eg;
          acc_o[nt][2 * hf + 1] *= eg;
        }
      }
    }
    __syncthreads();

    // 3. T = (I + A)^-1. Diagonal 16x16 blocks first, one column per thread (x[j] = 0 above
    // the diagonal makes the unpredicated sums exact); then block row i from the rows above:
    // T_ij = -T_ii sum_{k=j}^{i-1} A_ik T_kj, the inner sums parked in T's unused upper blocks.
    if (tid < 64) {
      const int bb = tid >> 4, c = tid & 15;
      const float* ab = s_a + (16 * bb) * kLd + 16 * bb;
      float* tb = s_t + (16 * bb) * kLd + 16 * bb;
      float x[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < r; ++j) acc = fmaf(ab[r * kLd + j], x[j], acc);
        x[r] = r < c ? 0.f : (r == c ? 1.f : -acc);
        tb[r * kLd + c] = x[r];
      }
    }
    __syncthreads();
#pragma unroll 1
    for (int bi = 1; bi < 4; ++bi) {
      for (int e = tid; e < bi * 256; e += kGdnPrefillThreads) {
        const int bj = e >> 8, r = (e >> 4) & 15, c = e & 15;
        const float* arow = s_a + (16 * bi + r) * kLd;
        float acc = 0.f;
        for (int kb = bj; kb < bi; ++kb) {
#pragma unroll
          for (int m = 0; m < 16; ++m) {
            acc = fmaf(arow[16 * kb + m], s_t[(16 * kb + m) * kLd + 16 * bj + c], acc);
          }
        }
        s_t[(16 * bj + r) * kLd + 16 * bi + c] = acc;
      }
      __syncthreads();
      for (int e = tid; e < bi * 256; e += kGdnPrefillThreads) {
        const int bj = e >> 8, r = (e >> 4) & 15, c = e & 15;
        const float* trow = s_t + (16 * bi + r) * kLd + 16 * bi;
        float acc = 0.f;
#pragma unroll
        for (int m = 0; m < 16; ++m)
          acc = fmaf(trow[m], s_t[(16 * bj + m) * kLd + 16 * bi + c], acc);
        s_t[(16 * bi + r) * kLd + 16 * bj + c] = -acc;
      }
      __syncthreads();
    }

    // 4. Vn = T R; stored transposed (and decayed to the chunk end) over A's buffer.
    {
      float acc_v[kVT8][4];
#pragma unroll
      for (int i = 0; i < kVT8; ++i) acc_v[i][0] = acc_v[i][1] = acc_v[i][2] = acc_v[i][3] = 0.f;
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        if (s <= warp) {
          u32 a[4];
          mma::load_a_f32(a, s_t + row0 * kLd + s * 16, kLd);
#pragma unroll
          for (int np = 0; np < kVT8 / 2; ++np) {
            u32 b[4];
            mma::load_b2(b, s_r + np * 16 * kLd + s * 16, kLd);
            mma::mma_bf16(acc_v[2 * np], a, b[0], b[1]);
            mma::mma_bf16(acc_v[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
      const float g_last = s_gamma[63];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = row0 + g + 8 * hf;
        const float decay = __expf(g_last - s_gamma[i]);
#pragma unroll
        for (int nt = 0; nt < kVT8; ++nt) {
          const int c = nt * 8 + 2 * t4;
          const float x0 = acc_v[nt][2 * hf], x1 = acc_v[nt][2 * hf + 1];
          s_vn[c * kLd + i] = __float2bfloat16_rn(x0);
          s_vn[(c + 1) * kLd + i] = __float2bfloat16_rn(x1);
          s_vg[c * kLd + i] = __float2bfloat16_rn(x0 * decay);
          s_vg[(c + 1) * kLd + i] = __float2bfloat16_rn(x1 * decay);
        }
      }
    }
    __syncthreads();

    // 5. O += P Vn; store the chunk's rows.
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (s <= warp) {
        u32 a[4];
        mma::load_a(a, s_p + row0 * kLd + s * 16, kLd);
#pragma unroll
        for (int np = 0; np < kVT8 / 2; ++np) {
          u32 b[4];
          mma::load_b2(b, s_vn + np * 16 * kLd + s * 16, kLd);
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
          store_pair(orow + nt * 8 + 2 * t4, p.scale * acc_o[nt][2 * hf],
                     p.scale * acc_o[nt][2 * hf + 1]);
        }
      }
    }

    // 6. S <- e^gamma_last S + (decayed Vn)^T K, and its bf16 copy for the next chunk.
    update_state_tile<kLd, kLdK>(s_acc, __expf(s_gamma[63]), s_vg, s_k, s_s, wm, wn, g, t4);

    // 7. A checkpoint after every ckpt_every_chunks full chunks: checkpoints are multiples of
    // 64 tokens, so only a full chunk can end at one, and a trailing partial chunk never does.
    // (Kept inline, not in a helper shared with the state kernel: as a helper it changed the
    // ckpt=1 kernels' code layout, and only byte-identical cubins could be checked here.)
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

}  // namespace kjit
