// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc): the bandwidth ceiling of an in-place
// read-modify-write of a GDN decode state pool [slots, HV, 128, 128] f32 whose rows come through
// a random slot permutation, against cudaMemcpy of the same bytes. Tiles as gdn_decode lays
// them out (one warp of 32 lanes x 16 bytes per state row), with several rows per warp, warps
// per block, cache hints and the identity permutation. Median of 21 event-timed calls; every
// size is >= 512 MB, so L2 holds none of it.
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/experiments/decode_rmw_ceiling.cu -o /tmp/rmw && /tmp/rmw
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
#include "cuda_check.h"

template <int kRows, int kWarps, bool kStream>
__global__ void __launch_bounds__(kWarps * 32)
    rmw(float* pool, const int* idx, int hv_count, long long slot_stride) {
  // one tile = kRows*kWarps rows of 128 floats; tiles per (b,hv) = 128/(kRows*kWarps)
  constexpr int kTileRows = kRows * kWarps;
  constexpr int kTiles = 128 / kTileRows;
  const long long t = blockIdx.x + (long long)gridDim.x * blockIdx.y;
  const int vt = t % kTiles;
  const int hv = (t / kTiles) % hv_count;
  const long long b = t / kTiles / hv_count;
  const int slot = idx[b];
  float4* tile = reinterpret_cast<float4*>(pool + slot * slot_stride +
                                           ((long long)hv * 128 + vt * kTileRows) * 128);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float4 x[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4* ptr = tile + (r * kWarps + warp) * 32 + lane;
    if (kStream)
      x[r] = __ldcs(ptr);
    else
      x[r] = *ptr;
  }
  float s = 0;
#pragma unroll
  for (int r = 0; r < kRows; ++r) s += x[r].x + x[r].y + x[r].z + x[r].w;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  const float u = 1e-7f * s;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float4 y = make_float4(0.999f * x[r].x + u, 0.999f * x[r].y + u, 0.999f * x[r].z + u,
                           0.999f * x[r].w + u);
    float4* ptr = tile + (r * kWarps + warp) * 32 + lane;
    if (kStream)
      __stcs(ptr, y);
    else
      *ptr = y;
  }
}

// Same pattern, out of place (read pool, write pool2).
template <int kRows>
__global__ void __launch_bounds__(32)
    oop(const float* pool, float* pool2, const int* idx, int hv_count, long long slot_stride) {
  constexpr int kTiles = 128 / kRows;
  const long long t = blockIdx.x + (long long)gridDim.x * blockIdx.y;
  const int vt = t % kTiles;
  const int hv = (t / kTiles) % hv_count;
  const long long b = t / kTiles / hv_count;
  const int slot = idx[b];
  const long long off = slot * slot_stride + ((long long)hv * 128 + vt * kRows) * 128;
  const float4* src = reinterpret_cast<const float4*>(pool + off);
  float4* dst = reinterpret_cast<float4*>(pool2 + off);
  const int lane = threadIdx.x;
  float4 x[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) x[r] = __ldcs(src + r * 32 + lane);
#pragma unroll
  for (int r = 0; r < kRows; ++r) __stcs(dst + r * 32 + lane, x[r]);
}

template <typename F>
float median_us(F f) {
  cudaEvent_t a[21], b[21];
  for (int i = 0; i < 21; ++i) {
    cudaEventCreate(&a[i]);
    cudaEventCreate(&b[i]);
  }
  for (int i = 0; i < 3; ++i) f();
  for (int i = 0; i < 21; ++i) {
    cudaEventRecord(a[i]);
    f();
    cudaEventRecord(b[i]);
  }
  CK(cudaDeviceSynchronize());
  std::vector<float> v(21);
  for (int i = 0; i < 21; ++i) {
    cudaEventElapsedTime(&v[i], a[i], b[i]);
  }
  std::sort(v.begin(), v.end());
  return v[10] * 1000.f;
}

int main() {
  for (int hv : {32}) {
    for (long long B : {256LL, 1024LL, 2048LL}) {
      const long long slot_stride = (long long)hv * 128 * 128;
      const long long slots = B;
      const size_t bytes = slots * slot_stride * 4;
      float *pool, *pool2;
      int *perm, *ident;
      CK(cudaMalloc(&pool, bytes));
      CK(cudaMalloc(&pool2, bytes));
      CK(cudaMemset(pool, 0, bytes));
      CK(cudaMemset(pool2, 0, bytes));
      std::vector<int> h(B);
      std::iota(h.begin(), h.end(), 0);
      CK(cudaMalloc(&ident, B * 4));
      CK(cudaMemcpy(ident, h.data(), B * 4, cudaMemcpyHostToDevice));
      std::shuffle(h.begin(), h.end(), std::mt19937_64(7));
      CK(cudaMalloc(&perm, B * 4));
      CK(cudaMemcpy(perm, h.data(), B * 4, cudaMemcpyHostToDevice));
      const double moved = 2.0 * bytes;
      const float copy =
          median_us([&] { cudaMemcpyAsync(pool2, pool, bytes, cudaMemcpyDeviceToDevice); });
      auto report = [&](const char* name, float us) {
        printf("HV=%d B=%4lld %-34s %9.1f us %7.1f GB/s ratio %.3f\n", hv, B, name, us,
               moved / us / 1e3, copy / us);
      };
      report("cudaMemcpy", copy);
      auto grid = [&](long long blocks) { return dim3(1024, (unsigned)((blocks + 1023) / 1024)); };
#define RUN(NAME, ROWS, WARPS, STREAM, IDX)                                                      \
  {                                                                                              \
    const long long blocks = B * hv * (128 / ((ROWS) * (WARPS)));                                \
    report(NAME, median_us([&] {                                                                 \
             rmw<ROWS, WARPS, STREAM><<<grid(blocks), (WARPS)*32>>>(pool, IDX, hv, slot_stride); \
           }));                                                                                  \
    CK(cudaGetLastError());                                                                      \
  }
      RUN("rmw 1 warp x 4 rows, cs, perm", 4, 1, true, perm);
      RUN("rmw 1 warp x 4 rows, cs, ident", 4, 1, true, ident);
      RUN("rmw 1 warp x 4 rows, plain, perm", 4, 1, false, perm);
      RUN("rmw 1 warp x 8 rows, cs, perm", 8, 1, true, perm);
      RUN("rmw 1 warp x 16 rows, cs, perm", 16, 1, true, perm);
      RUN("rmw 2 warps x 4 rows, cs, perm", 4, 2, true, perm);
      RUN("rmw 4 warps x 4 rows, cs, perm", 4, 4, true, perm);
      RUN("rmw 8 warps x 2 rows, cs, perm", 2, 8, true, perm);
      RUN("rmw 1 warp x 2 rows, cs, perm", 2, 1, true, perm);
      {
        const long long blocks = B * hv * 32;
        report("oop 1 warp x 4 rows, cs, perm", median_us([&] {
                 oop<4><<<grid(blocks), 32>>>(pool, pool2, perm, hv, slot_stride);
               }));
      }
      cudaFree(pool);
      cudaFree(pool2);
      cudaFree(perm);
      cudaFree(ident);
    }
  }
  return 0;
}
