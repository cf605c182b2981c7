// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc). Two questions about gdn_decode's
// targets on the H200, answered with the step's memory traffic alone (no decode arithmetic):
//
// 1. Floors at small batches. What does an in-place read-modify-write of B random state slots
//    (HV = 32, K = V = 128, f32: 2 MiB per slot) cost when timed the way bench_gdn_decode times
//    (each call between two events, cold data: L2 flushed, slots rotated through >= 512 MB),
//    next to an empty kernel and a cold copy of the same bytes? If the RMW alone cannot reach
//    a target, no decode kernel can.
// 2. Slot order at large batches. Does visiting the slots in address order (sorted indices)
//    recover what a random permutation costs, also when the batch holds only part of the pool?
//
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/experiments/decode_floor.cu -o /tmp/floor && /tmp/floor
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_check.h"

constexpr int kHv = 32;
constexpr long long kSlotFloats = 1LL * kHv * 128 * 128;
constexpr size_t kSlotBytes = kSlotFloats * 4;
constexpr size_t kRotationBytes = size_t{512} << 20;

__global__ void empty_kernel() {}

/// One warp per block, kRows state rows of 128 f32 (16 bytes per lane), slot through idx.
template <int kRows>
__global__ void __launch_bounds__(32) rmw(float* pool, const int* idx) {
  constexpr int kTiles = 128 / kRows;
  const long long t = blockIdx.x + (long long)gridDim.x * blockIdx.y;
  const int vt = t % kTiles;
  const int hv = (t / kTiles) % kHv;
  const long long b = t / kTiles / kHv;
  const int slot = idx[b];
  float4* tile = reinterpret_cast<float4*>(pool + slot * kSlotFloats +
                                           ((long long)hv * 128 + vt * kRows) * 128);
  const int lane = threadIdx.x;
  float4 x[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) x[r] = __ldcs(tile + r * 32 + lane);
  float s = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) s += x[r].x + x[r].y + x[r].z + x[r].w;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float u = 1e-7f * s;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    __stcs(tile + r * 32 + lane, make_float4(0.999f * x[r].x + u, 0.999f * x[r].y + u,
                                             0.999f * x[r].z + u, 0.999f * x[r].w + u));
  }
}

/// Median of 51 calls, each between two events, queued behind a spin so host time is excluded.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
template <typename F>
float median_us(F f, int reps = 51) {
  std::vector<cudaEvent_t> a(reps), b(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventCreate(&a[i]));
    CK(cudaEventCreate(&b[i]));
  }
  for (int i = 0; i < 5; ++i) f(i);
  CK(cudaDeviceSynchronize());
  spin<<<1, 1>>>(20000000LL);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a[i]));
    f(i);
    CK(cudaEventRecord(b[i]));
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> v(reps);
  for (int i = 0; i < reps; ++i) CK(cudaEventElapsedTime(&v[i], a[i], b[i]));
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventDestroy(a[i]));
    CK(cudaEventDestroy(b[i]));
  }
  std::sort(v.begin(), v.end());
  return v[reps / 2] * 1000.f;
}

dim3 grid_of(long long blocks) { return dim3(1024, (unsigned)((blocks + 1023) / 1024)); }

template <int kRows>
float time_rmw(float* pool, const int* idx, long long batch, long long rotations) {
  const long long blocks = batch * kHv * (128 / kRows);
  return median_us(
      [&](int i) { rmw<kRows><<<grid_of(blocks), 32>>>(pool, idx + (i % rotations) * batch); });
}

int main() {
  void* flush;
  CK(cudaMalloc(&flush, size_t{256} << 20));
  const auto flush_l2 = [&] { CK(cudaMemset(flush, 0x5a, size_t{256} << 20)); };

  std::printf("-- part 1: cold floors, HV=32 K=V=128 f32 state, event-timed median of 51\n");
  flush_l2();
  std::printf("empty kernel                          %8.2f us\n",
              median_us([&](int) { empty_kernel<<<1, 32>>>(); }));
  for (long long batch : {1LL, 8LL, 32LL}) {
    const size_t step = batch * kSlotBytes;
    const long long rotations = std::max<long long>(1, kRotationBytes / step);
    const long long slots = rotations * batch;
    float* pool;
    CK(cudaMalloc(&pool, slots * kSlotBytes));
    CK(cudaMemset(pool, 0, slots * kSlotBytes));
    std::vector<int> h(slots);
    std::iota(h.begin(), h.end(), 0);
    std::shuffle(h.begin(), h.end(), std::mt19937_64(11));
    int* idx;
    CK(cudaMalloc(&idx, slots * 4));
    CK(cudaMemcpy(idx, h.data(), slots * 4, cudaMemcpyHostToDevice));
    // Cold copy: src and dst windows of the step's size, rotated through the pool.
    const long long windows = std::max<long long>(1, slots / 2 / batch);
    flush_l2();
    const float copy = median_us([&](int i) {
      const long long w = i % windows;
      char* base = reinterpret_cast<char*>(pool);
      CK(cudaMemcpyAsync(base + (2 * w) * step, base + (2 * w + 1) * step, step,
                         cudaMemcpyDeviceToDevice));
    });
    flush_l2();
    const float r1 = time_rmw<1>(pool, idx, batch, rotations);
    flush_l2();
    const float r4 = time_rmw<4>(pool, idx, batch, rotations);
    flush_l2();
    const float r8 = time_rmw<8>(pool, idx, batch, rotations);
    std::printf(
        "B=%-3lld %6.1f MB moved: cold copy %7.2f us | rmw 1 row/warp %7.2f | 4 rows %7.2f | 8 "
        "rows %7.2f us (best %.3f of the copy)\n",
        batch, 2.0 * step / 1e6, copy, r1, r4, r8, copy / std::min({r1, r4, r8}));
    CK(cudaFree(pool));
    CK(cudaFree(idx));
  }

  std::printf(
      "-- part 2: slot order, rmw 1 warp x 8 rows (.cs), ratio to cudaMemcpy of the bytes\n");
  for (long long batch : {256LL, 2048LL}) {
    for (int spread : {1, 4}) {
      // spread 1: the batch is the whole pool; 4: a random quarter of a pool 4x the batch.
      const long long slots = batch * spread;
      float *pool, *copy_dst;
      CK(cudaMalloc(&pool, slots * kSlotBytes));
      CK(cudaMemset(pool, 0, slots * kSlotBytes));
      CK(cudaMalloc(&copy_dst, batch * kSlotBytes));
      std::vector<int> h(slots);
      std::iota(h.begin(), h.end(), 0);
      std::shuffle(h.begin(), h.end(), std::mt19937_64(7));
      h.resize(batch);
      std::vector<int> sorted = h;
      std::sort(sorted.begin(), sorted.end());
      int *random_idx, *sorted_idx;
      CK(cudaMalloc(&random_idx, batch * 4));
      CK(cudaMalloc(&sorted_idx, batch * 4));
      CK(cudaMemcpy(random_idx, h.data(), batch * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(sorted_idx, sorted.data(), batch * 4, cudaMemcpyHostToDevice));
      const float copy = median_us([&](int) {
        CK(cudaMemcpyAsync(copy_dst, pool, batch * kSlotBytes, cudaMemcpyDeviceToDevice));
      });
      const float random_us = time_rmw<8>(pool, random_idx, batch, 1);
      const float sorted_us = time_rmw<8>(pool, sorted_idx, batch, 1);
      std::printf(
          "B=%-4lld pool %5lld slots: copy %8.1f us | random order %8.1f (%.3f) | sorted %8.1f "
          "(%.3f)\n",
          batch, slots, copy, random_us, copy / random_us, sorted_us, copy / sorted_us);
      CK(cudaFree(pool));
      CK(cudaFree(copy_dst));
      CK(cudaFree(random_idx));
      CK(cudaFree(sorted_idx));
    }
  }
  CK(cudaFree(flush));
  return 0;
}
