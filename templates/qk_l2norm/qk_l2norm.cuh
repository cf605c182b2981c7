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

#include "templates/common/gdn_math.cuh"
#include "templates/common/vec.cuh"
#include "templates/qk_l2norm/params.h"

namespace kjit {
namespace l2norm_detail {

/// kVec elements of T at `src` (aligned to kVec * sizeof(T) bytes) as f32.
template <typename T, int kVec>
__device__ __forceinline__ void load(const T* src, float (&x)[kVec]) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned int w[kWords];
  // __ldcs / __stwb: with a plain dereference the compiler splits the 16-byte access into
  // narrower ones (every input element is read once, so evict-first costs nothing).
  vec::to_words(__ldcs(reinterpret_cast<const typename vec::Word<kBytes>::type*>(src)), w);
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) x[i] = __uint_as_float(w[i]);
  } else if constexpr (kVec == 1) {
    x[0] = vec::to_f32(vec::Bits<T>::elem(w[0]));
  } else {
#pragma unroll
    for (int i = 0; i < kVec / 2; ++i) {
      x[2 * i] = vec::to_f32(vec::Bits<T>::elem(w[i] & 0xffffu));
      x[2 * i + 1] = vec::to_f32(vec::Bits<T>::elem(w[i] >> 16));
    }
  }
}

/// kVec f32 values, each times `scale`, stored at `dst` as T in one access.
template <typename T, int kVec>
__device__ __forceinline__ void store(T* dst, const float (&x)[kVec], float scale) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  if constexpr (sizeof(T) == 2 && kVec == 1) {
    __stwb(reinterpret_cast<unsigned short*>(dst),
           static_cast<unsigned short>(vec::Bits<T>::from_f32(x[0] * scale)));
  } else {
    unsigned int w[kWords];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kVec; ++i) w[i] = __float_as_uint(x[i] * scale);
    } else {
#pragma unroll
      for (int i = 0; i < kVec / 2; ++i) {
        w[i] = vec::pack2<T>(x[2 * i] * scale, x[2 * i + 1] * scale);
      }
    }
    vec::store_wb<kBytes>(dst, w);
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
