// SPDX-License-Identifier: Apache-2.0
// merge_state: combines partial attention outputs (v, lse) of the same rows, e.g. the prefix
// and suffix halves of cascade or split-KV attention. Per (token t, head h) with base b:
//   m = max(s_i);  w_i = b^(s_i - m) / sum_j b^(s_j - m);  v = sum_i w_i v_i;  s = m + log_b(d)
// Empty states (s = -inf) get weight 0 and their v is never multiplied in (it may hold garbage);
// all states empty -> v = 0, s = -inf. With kPosInfAsEmpty an s of +inf means empty too
// (FlashAttention-2 marks empty rows that way); without it the +inf states share the weight.
//
// Memory bound: every thread moves kChunks vectors of kVec elements of each input row, issues
// all its loads before any arithmetic, and computes the row's weights itself (the LSE loads of
// the lanes of one row hit the same address, so they cost one transaction per warp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/common/vec.cuh"
#include "templates/merge_state/params.h"

namespace kjit {

/// Threads per block never exceed this (the planner sizes blocks to 128-512 threads).
inline constexpr int kMergeMaxBlockThreads = 512;

namespace merge_detail {

/// kN elements of T held as raw 32-bit words (one 16-bit element alone when kN * sizeof(T) is
/// 2): integer arrays are what the compiler turns into single vector loads and stores, arrays
/// of __half / __nv_bfloat16 are not. The planner guarantees min(16, kN * sizeof(T)) bytes of
/// alignment for every access.
template <typename T, int kN>
struct Frag {
  static constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned int w[kWords];

  __device__ __forceinline__ void load(const T* src) {
    if constexpr (kBytes >= 4) {
      vec::load_words<kWords>(src, w);
    } else {
      w[0] = *reinterpret_cast<const unsigned short*>(src);
    }
  }
  /// Zeroes every element unless `keep`: an unused state's v never reaches the arithmetic, so
  /// garbage (NaN, inf) in it cannot leak into the result. Branch-free.
  __device__ __forceinline__ void keep_if(bool keep) {
    const unsigned int m = keep ? 0xffffffffu : 0u;
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] &= m;
  }
  __device__ __forceinline__ float get(int k) const {
    if constexpr (sizeof(T) == 4) {
      return __uint_as_float(w[k]);
    } else {
      // The half as an unsigned short (not vec::get's u32): NVVM schedules the unpacking of a
      // masked fragment (keep_if) differently for the two, and this is the measured order.
      const unsigned int word = w[k / 2];
      const unsigned short half =
          static_cast<unsigned short>((k % 2 == 0) ? (word & 0xffffu) : (word >> 16));
      return vec::Bits<T>::to_f32(half);
    }
  }
};

/// Stores kN floats as T: converted, packed into 32-bit words, one vector store per 16 bytes.
template <typename T, int kN>
__device__ __forceinline__ void store_frag(T* dst, const float (&x)[kN]) {
  if constexpr (sizeof(T) == 4) {
    unsigned int w[kN];
#pragma unroll
    for (int k = 0; k < kN; ++k) w[k] = __float_as_uint(x[k]);
    vec::store_words_wb<kN>(dst, w);
  } else if constexpr (kN % 2 == 0) {
    unsigned int w[kN / 2];
#pragma unroll
    for (int k = 0; k < kN / 2; ++k) {
      w[k] = vec::pack2<T>(x[2 * k], x[2 * k + 1]);
    }
    vec::store_words_wb<kN / 2>(dst, w);
  } else {
    static_assert(kN == 1, "odd fragments are single 16-bit elements");
    *reinterpret_cast<unsigned short*>(dst) =
        static_cast<unsigned short>(vec::Bits<T>::from_f32(x[0]));
  }
}

template <MergeBase kBase>
__device__ __forceinline__ float lse_exp(float x) {
  if constexpr (kBase == MergeBase::two) {
    return exp2f(x);
  } else {
    return expf(x);
  }
}

template <MergeBase kBase>
__device__ __forceinline__ float lse_log(float x) {
  if constexpr (kBase == MergeBase::two) {
    return log2f(x);
  } else {
    return logf(x);
  }
}

template <bool kPosInfAsEmpty>
__device__ __forceinline__ float canonical_lse(float s) {
  if constexpr (kPosInfAsEmpty) {
    return s == __int_as_float(0x7f800000) ? __int_as_float(0xff800000) : s;
  } else {
    return s;
  }
}

/// Unnormalized weight of a state of LSE `s` when the largest LSE is `m` (finite or +inf,
/// never -inf): the +inf states share the weight when m is +inf, which never makes a NaN.
template <MergeBase kBase, bool kPosInfAsEmpty>
__device__ __forceinline__ float raw_weight(float s, float m) {
  if constexpr (!kPosInfAsEmpty) {
    if (m == __int_as_float(0x7f800000)) return s == m ? 1.0f : 0.0f;
  }
  return lse_exp<kBase>(s - m);
}

/// Merged LSE from the largest LSE and the sum of raw weights.
template <MergeBase kBase>
__device__ __forceinline__ float merged_lse(float m, float d) {
  // m == +inf: log(d) is finite, the sum stays +inf.
  return m + lse_log<kBase>(d);
}

template <typename TIn, typename TOut, int kHeadDim, int kVec, int kChunks, MergeOp kOp,
          MergeBase kBase, bool kPosInfAsEmpty>
__device__ __forceinline__ void merge_row(const MergeStateParams& p, i64 t, u32 h, u32 lane) {
  constexpr int kLanes = kHeadDim / kVec / kChunks;
  static_assert(kHeadDim % (kVec * kChunks) == 0, "head_dim must split into kChunks vectors");
  using InFrag = Frag<TIn, kVec>;
  const float kNegInf = __int_as_float(0xff800000);
  const i64 head = i64(h);
  const i64 lane_offset = i64(lane) * kVec;

  float acc[kChunks][kVec];
  float s_merged;

  if constexpr (kOp == MergeOp::many) {
    const float* s_row = p.s_a + t * p.s_a_token_stride + head * p.s_a_head_stride;
    const TIn* v_row = static_cast<const TIn*>(p.v_a) + t * p.v_a_token_stride +
                       head * p.v_a_head_stride + lane_offset;
    float m = kNegInf;
    for (u32 i = 0; i < p.num_states; ++i) {
      m = fmaxf(m, canonical_lse<kPosInfAsEmpty>(s_row[i64(i) * p.s_state_stride]));
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[c][k] = 0.0f;
    }
    if (m == kNegInf) {
      s_merged = kNegInf;
    } else {
      float d = 0.0f;
      for (u32 i = 0; i < p.num_states; ++i) {
        d += raw_weight<kBase, kPosInfAsEmpty>(
            canonical_lse<kPosInfAsEmpty>(s_row[i64(i) * p.s_state_stride]), m);
      }
      // d >= 1: the largest state contributes b^0 = 1.
      const float inv_d = __frcp_rn(d);
      s_merged = merged_lse<kBase>(m, d);
#pragma unroll 2
      for (u32 i = 0; i < p.num_states; ++i) {
        const float w = raw_weight<kBase, kPosInfAsEmpty>(
                            canonical_lse<kPosInfAsEmpty>(s_row[i64(i) * p.s_state_stride]), m) *
                        inv_d;
        const TIn* v_state = v_row + i64(i) * p.v_state_stride;
        InFrag in[kChunks];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          in[c].load(v_state + i64(c) * kLanes * kVec);
        }
        // An empty state's v is never read into the sum: it may be uninitialized or NaN.
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          in[c].keep_if(w > 0.0f);
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[c][k] = fmaf(w, in[c].get(k), acc[c][k]);
        }
      }
    }
  } else {
    const TIn* a_row = static_cast<const TIn*>(p.v_a) + t * p.v_a_token_stride +
                       head * p.v_a_head_stride + lane_offset;
    const TIn* b_row = static_cast<const TIn*>(p.v_b) + t * p.v_b_token_stride +
                       head * p.v_b_head_stride + lane_offset;
    // Every load of the row is issued before the first use, so each thread has
    // 2 * kChunks vectors in flight.
    InFrag in_a[kChunks];
    InFrag in_b[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      in_a[c].load(a_row + i64(c) * kLanes * kVec);
      in_b[c].load(b_row + i64(c) * kLanes * kVec);
    }
    const float sa =
        canonical_lse<kPosInfAsEmpty>(p.s_a[t * p.s_a_token_stride + head * p.s_a_head_stride]);
    const float sb =
        canonical_lse<kPosInfAsEmpty>(p.s_b[t * p.s_b_token_stride + head * p.s_b_head_stride]);
    if constexpr (kOp == MergeOp::in_place) {
      // Masked rows keep v and s untouched.
      if (p.mask != nullptr && p.mask[t * p.mask_stride] == 0) return;
    }
    const float m = fmaxf(sa, sb);
    float wa = 0.0f;
    float wb = 0.0f;
    if (m == kNegInf) {
      s_merged = kNegInf;
    } else {
      const float ra = raw_weight<kBase, kPosInfAsEmpty>(sa, m);
      const float rb = raw_weight<kBase, kPosInfAsEmpty>(sb, m);
      const float d = ra + rb;
      const float inv_d = __frcp_rn(d);
      wa = ra * inv_d;
      wb = rb * inv_d;
      s_merged = merged_lse<kBase>(m, d);
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      in_a[c].keep_if(wa > 0.0f);
      in_b[c].keep_if(wb > 0.0f);
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[c][k] = fmaf(wb, in_b[c].get(k), wa * in_a[c].get(k));
    }
  }

  TOut* out_row = static_cast<TOut*>(p.v_out) + t * p.v_out_token_stride +
                  head * p.v_out_head_stride + lane_offset;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    store_frag<TOut, kVec>(out_row + i64(c) * kLanes * kVec, acc[c]);
  }
  // One lane per row writes the LSE.
  if (p.s_out != nullptr && lane == 0) {
    p.s_out[t * p.s_out_token_stride + head * p.s_out_head_stride] = s_merged;
  }
}

}  // namespace merge_detail

/// One merge_state launch. Block x is always kHeadDim / kVec / kChunks lanes (one row);
/// token_major: grid (T, head groups), block y = heads per group; flat: grid x = row groups,
/// block y = rows per block. The host (lib/ops/merge_state.cpp) proves the geometry legal.
template <typename TIn, typename TOut, int kHeadDim, int kVec, int kChunks, MergeGridMode kMode,
          MergeOp kOp, MergeBase kBase, bool kPosInfAsEmpty>
__global__ void __launch_bounds__(kMergeMaxBlockThreads)
    merge_state_kernel(const MergeStateParams p) {
  static_assert(kHeadDim % 8 == 0 && kHeadDim >= 8 && kHeadDim <= 1024, "head_dim 8..1024");
  static_assert(kVec * sizeof(TIn) <= 16, "at most 16-byte input vectors");
  i64 t;
  u32 h;
  if constexpr (kMode == MergeGridMode::token_major) {
    h = blockIdx.y * blockDim.y + threadIdx.y;
    if (h >= p.num_heads) return;
    t = i64(blockIdx.x);
  } else {
    const u64 row = u64(blockIdx.x) * blockDim.y + threadIdx.y;
    if (row >= p.num_rows) return;
    // row < 2^32 (planner), so the 32-bit magic division is exact.
    const u32 token = merge_fast_div(u32(row), p.head_div_magic, p.head_div_shift);
    h = u32(row) - token * p.num_heads;
    t = i64(token);
  }
  merge_detail::merge_row<TIn, TOut, kHeadDim, kVec, kChunks, kOp, kBase, kPosInfAsEmpty>(
      p, t, h, threadIdx.x);
}

}  // namespace kjit
