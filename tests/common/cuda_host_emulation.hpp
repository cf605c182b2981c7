// SPDX-License-Identifier: Apache-2.0
// Just enough of CUDA to compile a kernel template as host C++ and run its threads one after
// another on the CPU: for testing a kernel's indexing and arithmetic where no GPU exists. It
// cannot find races, barrier or memory-model bugs (threads never overlap), and only templates
// that use the few intrinsics below compile. Include it before the template, in a translation
// unit of its own: it defines __device__ & co. away and claims the CUDA half-precision headers'
// include guards so that the template's #include <cuda_fp16.h> / <cuda_bf16.h> are empty.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "support/numeric.hpp"

#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
#define __device__
#define __host__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(...)
#define __grid_constant__
// Shared memory is ordinary memory here (a test that needs it static redefines __shared__).
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
/// Only for name lookup of the cp.async helpers (templates/common/cp_async.cuh), which the host
/// compile never calls: their *_portable forms copy plainly here.
#if !defined(KJIT_EMULATED_PTX)  // (sm90_emulation.hpp has a real one)
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }
#endif
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float x, float y) { return x / y; }
/// st.global.wb: a plain store on the host.
template <typename T>
inline void __stwb(T* p, T v) {
  *p = v;
}

struct __half {
  unsigned short bits;
};
struct __nv_bfloat16 {
  unsigned short bits;
};
inline float __half2float(__half h) { return kjit::support::f16_to_float(h.bits); }
inline __half __ushort_as_half(unsigned short b) { return __half{b}; }
inline __half __float2half_rn(float f) { return __half{kjit::support::float_to_f16(f)}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float __bfloat162float(__nv_bfloat16 h) { return kjit::support::bf16_to_float(h.bits); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __nv_bfloat16{kjit::support::float_to_bf16(f)};
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short b) { return __nv_bfloat16{b}; }

/// blockIdx & co.: set by emulated_launch before each thread runs (per OS thread, so that
/// cuda_warp_emulation.hpp can run a block's threads at once).
struct EmulatedDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmulatedDim3 blockIdx, blockDim, gridDim, threadIdx;

/// Runs every thread of a 1-D launch of `kernel(params)`, one after another.
template <typename Params>
void emulated_launch(void (*kernel)(Params), unsigned grid, unsigned block, const Params& params) {
  gridDim.x = grid;
  blockDim.x = block;
  for (unsigned b = 0; b < grid; ++b) {
    for (unsigned t = 0; t < block; ++t) {
      blockIdx.x = b;
      threadIdx.x = t;
      kernel(params);
    }
  }
}
