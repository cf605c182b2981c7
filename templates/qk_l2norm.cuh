// SPDX-License-Identifier: Apache-2.0
// qk_l2norm: out = x * rsqrt(sum(x^2) + eps) over each [D] row of q and k, in f32 (fla's
// l2norm_fwd and the in-kernel q/k normalization of GDN kernels: eps inside the root).
//
// Memory bound: a row is kLanes consecutive lanes of one warp (kLanes = 32 or fewer when the
// row has fewer vectors), each holding kPer vectors of kVec elements in registers between the
// sum and the scaled store, so every element is read once and written once. The grid is 1-D
// and strides over rows in 64 bits: no grid dimension grows with T.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kjit/common/gdn_math.cuh"
#include "kjit/qk_l2norm_params.h"

namespace kjit {
namespace l2norm_detail {

/// The raw word type of one kBytes access (a single vector instruction).
template <int kBytes>
struct Raw;
template <>
struct Raw<16> {
  using type = uint4;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<4> {
  using type = unsigned int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};

__device__ __forceinline__ void words(const uint4& r, unsigned int (&w)[4]) {
  w[0] = r.x;
  w[1] = r.y;
  w[2] = r.z;
  w[3] = r.w;
}
__device__ __forceinline__ void words(const uint2& r, unsigned int (&w)[2]) {
  w[0] = r.x;
  w[1] = r.y;
}
__device__ __forceinline__ void words(unsigned int r, unsigned int (&w)[1]) { w[0] = r; }
__device__ __forceinline__ void words(unsigned short r, unsigned int (&w)[1]) { w[0] = r; }

__device__ __forceinline__ uint4 pack(const unsigned int (&w)[4]) {
  return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ uint2 pack(const unsigned int (&w)[2]) { return make_uint2(w[0], w[1]); }
__device__ __forceinline__ unsigned int pack(const unsigned int (&w)[1]) { return w[0]; }

/// A 16-bit element's bits -> f32, and f32 -> bits rounded to nearest even.
template <typename T>
struct Bits16;
template <>
struct Bits16<__half> {
  static __device__ __forceinline__ float to_f32(unsigned int bits) {
    return gdn::to_f32(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
  static __device__ __forceinline__ unsigned int from_f32(float x) {
    return __half_as_ushort(gdn::from_f32<__half>(x));
  }
};
template <>
struct Bits16<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f32(unsigned int bits) {
    return gdn::to_f32(__ushort_as_bfloat16(static_cast<unsigned short>(bits)));
  }
  static __device__ __forceinline__ unsigned int from_f32(float x) {
    return __bfloat16_as_ushort(gdn::from_f32<__nv_bfloat16>(x));
  }
};

/// kVec elements of T at `src` (aligned to kVec * sizeof(T) bytes) as f32.
template <typename T, int kVec>
__device__ __forceinline__ void load(const T* src, float (&x)[kVec]) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned int w[kWords];
  // __ldcs / __stwb: with a plain dereference the compiler splits the 16-byte access into
  // narrower ones (every input element is read once, so evict-first costs nothing).
  words(__ldcs(reinterpret_cast<const typename Raw<kBytes>::type*>(src)), w);
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = __uint_as_float(w[i]);
  } else if constexpr (kVec == 1) {
    x[0] = Bits16<T>::to_f32(w[0]);
  } else {
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      x[2 * i] = Bits16<T>::to_f32(w[i] & 0xffffu);
      x[2 * i + 1] = Bits16<T>::to_f32(w[i] >> 16);
    }
  }
}

/// kVec f32 values, each times `scale`, stored at `dst` as T in one access.
template <typename T, int kVec>
__device__ __forceinline__ void store(T* dst, const float (&x)[kVec], float scale) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  using RawT = typename Raw<kBytes>::type;
  if constexpr (sizeof(T) == 2 && kVec == 1) {
    __stwb(reinterpret_cast<unsigned short*>(dst),
           static_cast<unsigned short>(Bits16<T>::from_f32(x[0] * scale)));
  } else {
    unsigned int w[kWords];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) w[i] = __float_as_uint(x[i] * scale);
    } else {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        w[i] = Bits16<T>::from_f32(x[2 * i] * scale) |
               (Bits16<T>::from_f32(x[2 * i + 1] * scale) << 16);
      }
    }
    __stwb(reinterpret_cast<RawT*>(dst), pack(w));
  }
}

}  // namespace l2norm_detail

/// A 1-D block of kQkL2NormBlockThreads threads: rows of kLanes consecutive threads. kLanes is
/// a power of two <= 32, so a row's lanes are an aligned group of one warp.
template <typename T, int kHeadDim, int kVec, int kLanes>
__global__ void __launch_bounds__(kQkL2NormBlockThreads) qk_l2norm_kernel(const QkL2NormParams p) {
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0,
                "lanes must be a power of two <= 32");
  static_assert(kHeadDim % kVec == 0, "head_dim must be a multiple of vec");
  constexpr int kVectors = kHeadDim / kVec;
  constexpr int kPer = (kVectors + kLanes - 1) / kLanes;
  const int lane = static_cast<int>(threadIdx.x) & (kLanes - 1);
  const u64 row_in_block = threadIdx.x / kLanes;
  const u64 rows_per_block = blockDim.x / kLanes;
  // The loop runs while the block's first row exists, the same trip count for every thread of
  // the block: group_sum needs all 32 lanes of each warp, rows past the end included.
  for (u64 first = static_cast<u64>(blockIdx.x) * rows_per_block; first < p.rows;
       first += static_cast<u64>(gridDim.x) * rows_per_block) {
    const u64 row = first + row_in_block;
    const bool valid = row < p.rows;
    const bool is_q = row < p.q_rows;
    const u64 r = is_q ? row : row - p.q_rows;
    const u64 heads = is_q ? p.q_heads : p.k_heads;
    const u64 t = valid ? r / heads : 0;
    const u64 h = valid ? r - t * heads : 0;
    const i64 ti = static_cast<i64>(t);
    const i64 hi = static_cast<i64>(h);
    const T* src = static_cast<const T*>(is_q ? p.q : p.k) +
                   (is_q ? ti * p.q_token_stride + hi * p.q_head_stride
                         : ti * p.k_token_stride + hi * p.k_head_stride);
    T* dst = static_cast<T*>(is_q ? p.q_out : p.k_out) +
             (is_q ? ti * p.q_out_token_stride + hi * p.q_out_head_stride
                   : ti * p.k_out_token_stride + hi * p.k_out_head_stride);
    float x[kPer][kVec];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int v = lane + i * kLanes;
      if (valid && (kVectors % kLanes == 0 || v < kVectors)) {
        l2norm_detail::load<T, kVec>(src + v * kVec, x[i]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[i][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) sum = fmaf(x[i][e], x[i][e], sum);
    }
    sum = gdn::group_sum<kLanes>(sum);
    const float scale = rsqrtf(sum + p.eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int v = lane + i * kLanes;
      if (valid && (kVectors % kLanes == 0 || v < kVectors)) {
        l2norm_detail::store<T, kVec>(dst + v * kVec, x[i], scale);
      }
    }
  }
}

}  // namespace kjit
