// SPDX-License-Identifier: Apache-2.0
// A test kernel for the planner and driver: writes a value per thread, optionally touches a
// dynamic shared-memory buffer, and optionally needs many registers (to hit the
// registers x threads limit without __launch_bounds__ capping it).
#pragma once

#include "templates/probe/params.h"

namespace kjit {

template <bool kRegisterHeavy>
__global__ void probe_kernel(const ProbeParams p) {
  extern __shared__ float smem[];
  const u64 block = (u64(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const u32 threads = blockDim.x * blockDim.y * blockDim.z;
  const u32 tid = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  const u64 id = block * threads + tid;
  float extra = 0.0f;
  if (p.smem_floats > 0) {
    for (u32 i = tid; i < p.smem_floats; i += threads) smem[i] = float(i);
    __syncthreads();
    extra = smem[(tid * 7u) % p.smem_floats] - float((tid * 7u) % p.smem_floats);
  }
  if constexpr (kRegisterHeavy) {
    // 160 live accumulators with data-dependent updates: ptxas cannot fold them, so the
    // kernel needs well over 64 registers per thread.
    float acc[160];
#pragma unroll
    for (int i = 0; i < 160; ++i) acc[i] = p.value * float(i + 1) + float(id);
#pragma unroll 1
    for (int round = 0; round < 4; ++round) {
#pragma unroll
      for (int i = 0; i < 160; ++i) acc[i] = acc[i] * acc[(i + 1) % 160] + 1.0f;
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < 160; ++i) sum += acc[i];
    // Never true for finite inputs; keeps the accumulators alive without changing the result.
    if (sum == 1234567.0f) extra += 1.0f;
  }
  if (id < p.count) p.out[id] = p.value + float(id) + extra;
}

}  // namespace kjit
