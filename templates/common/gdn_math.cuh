// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet helpers shared by the decode and prefill templates: element conversions,
// the gating (softplus decay, sigmoid beta) and sub-warp reductions. All arithmetic is f32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/common/types.h"
#include "templates/common/vec.cuh"

namespace kjit {
namespace gdn {

/// Element <-> f32 (round to nearest even): common/vec.cuh's, under the names the GDN templates
/// use.
using vec::from_f32;
using vec::to_f32;

/// softplus with the usual linear cut-off: x above `threshold` returns x (log1p(exp(x)) == x
/// there to f32 precision, and exp would overflow further up).
__device__ __forceinline__ float softplus(float x, float threshold) {
  return x > threshold ? x : log1pf(expf(x));
}

/// 1 / (1 + e^-x); expf overflow to inf gives the correct limit 0.
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/// Log-space decay g = -exp(A_log) * softplus(a + dt_bias); the state is scaled by exp(g).
__device__ __forceinline__ float log_decay(float a, float a_log, float dt_bias,
                                           float softplus_threshold) {
  return -expf(a_log) * softplus(a + dt_bias, softplus_threshold);
}

/// The gates from the hardware approximations (ex2, lg2 and a reciprocal, ~2 ulp each) instead of
/// the accurate library calls, for the prefill chunk kernel, where each warp computes a chunk's
/// gates inside the latency of one chunk step (expf's range reduction, log1pf's polynomial and
/// an IEEE division's slow path are on that path). Below x = -5, where 1 + e^x would lose e^x's
/// low bits before the log, softplus is the series y - y^2 / 2 + y^3 / 3 of log(1 + y),
/// y = e^x < 0.0068 (relative error < y^3 / 4, under 1e-7), so a slowly decaying gate keeps its
/// relative precision over 100k tokens; above it the log's absolute error (2^-21.4) is under
/// 6e-5 of the value. Measured against float64 on the H200: 1.4e-5 / 3.6e-6 worst relative
/// error (docs/performance.md, "The chunk kernel's instructions per chunk step").
__device__ __forceinline__ float fast_softplus(float x, float threshold) {
  const float y = __expf(x);
  const float series = y * (1.f - y * (0.5f - y * (1.f / 3.f)));
  return x > threshold ? x : (x < -5.f ? series : __logf(1.f + y));
}

/// 1 / (1 + e^-x) from the approximations; e^-x = inf (x < -88) gives 0 as the limit.
__device__ __forceinline__ float fast_sigmoid(float x) { return __fdividef(1.f, 1.f + __expf(-x)); }

/// log_decay from the approximations (fast_softplus).
__device__ __forceinline__ float fast_log_decay(float a, float a_log, float dt_bias,
                                                float softplus_threshold) {
  return -__expf(a_log) * fast_softplus(a + dt_bias, softplus_threshold);
}

/// 1 / sqrt(sum_sq + 1e-6): the L2-norm factor with eps inside the root (fla, vLLM, SGLang).
__device__ __forceinline__ float l2_inv_norm(float sum_sq) { return rsqrtf(sum_sq + 1e-6f); }

/// l2_inv_norm by the hardware approximation without rsqrtf's denormal guard (a compare and two
/// predicated multiplies): the argument is at least 1e-6, never denormal, so the results are the
/// same. The prefill kernels' form (measured there, docs/performance.md "The decay pass's loads
/// behind its stores"); the decode kernels keep l2_inv_norm.
__device__ __forceinline__ float l2_inv_norm_unguarded(float sum_sq) {
#if defined(__CUDA_ARCH__) && !defined(KJIT_EMULATED_PTX)  // (the CPU emulation: rsqrtf)
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(sum_sq + 1e-6f));
  return y;
#else
  return rsqrtf(sum_sq + 1e-6f);
#endif
}

/// Sum over aligned groups of kWidth lanes (a power of two <= 32); every lane of the group gets
/// the total. All 32 lanes of the warp must call it.
template <int kWidth>
__device__ __forceinline__ float group_sum(float x) {
  static_assert(kWidth >= 1 && kWidth <= 32 && (kWidth & (kWidth - 1)) == 0,
                "group width must be a power of two <= 32");
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

}  // namespace gdn
}  // namespace kjit
