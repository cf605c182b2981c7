// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc, sm_90a): the throughput of the state
// kernel's largest product shape on the three ways it can run. 132 blocks of two warpgroups
// each form two 64 x 64 x 128 products (bf16 A in registers, B from a shared-memory tile) per
// iteration: wgmma on a no-swizzle core-matrix tile, wgmma on a 128-byte-swizzled tile, and
// mma.sync with every warp loading B through ldmatrix from a padded row-major tile. Prints
// cycles per iteration (clock64) and each result's max abs error against float64.
//   (from the repository root: the includes are paths in the source tree)
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I. \
//     bench/experiments/wgmma_throughput.cu -o /tmp/wb && /tmp/wb
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "templates/common/mma.cuh"
#include "templates/common/wgmma.cuh"
using kjit::u32;
using kjit::u64;
#include "cuda_check.h"

__device__ int off_none(int r, int c) {
  return (r / 8) * 2048 + (c / 8) * 128 + (r % 8) * 16 + (c % 8) * 2;
}
__device__ int off_sw128(int r, int c) {
  return (c / 64) * 8192 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2;
}
__device__ __forceinline__ u64 desc_sw128(u32 addr) {
  return u64((addr & 0x3ffffu) >> 4) | (u64(1) << 16) | (u64(1024 >> 4) << 32) | (u64(1) << 62);
}

// mode 0: no swizzle, 1: sw128, 2: mma.sync from padded tile.  out: D of warpgroup 0 for checking.
template <int kMode>
__global__ void __launch_bounds__(256) bench(const __nv_bfloat16* a, const __nv_bfloat16* t,
                                             int iters, float* out, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char tile[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  for (int e = tid; e < 64 * 128; e += 256) {
    const int r = e / 128, c = e % 128;
    const int o = kMode == 0 ? off_none(r, c) : kMode == 1 ? off_sw128(r, c) : (r * 136 + c) * 2;
    *reinterpret_cast<__nv_bfloat16*>(tile + o) = t[e];
  }
  __syncthreads();
  const unsigned short* a16 = reinterpret_cast<const unsigned short*>(a);
  auto pair = [&](int r, int c) {
    return u32(a16[r * 128 + c]) | (u32(a16[r * 128 + c + 1]) << 16);
  };
  const int r0 = 16 * (warp % 4) + g;
  u32 fa[8][4];
  for (int ks = 0; ks < 8; ++ks) {
    fa[ks][0] = pair(r0, 16 * ks + 2 * t4);
    fa[ks][1] = pair(r0 + 8, 16 * ks + 2 * t4);
    fa[ks][2] = pair(r0, 16 * ks + 2 * t4 + 8);
    fa[ks][3] = pair(r0 + 8, 16 * ks + 2 * t4 + 8);
  }
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(tile));
  float acc[8][4], acc2[8][4];
  float sink = 0.f;
  long long t0 = clock64();
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][e] = acc2[i][e] = 0.f;
    if constexpr (kMode < 2) {
      kjit::wgmma::hold_registers(acc);
      kjit::wgmma::hold_registers(acc2);
      kjit::wgmma::fence();
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const u64 d = kMode == 0 ? kjit::wgmma::descriptor(base + ks * 256, 128, 2048)
                                 : desc_sw128(base + (ks / 4) * 8192 + (ks % 4) * 32);
        kjit::wgmma::mma_m64n64k16<0>(acc, fa[ks], d);
      }
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
        const u64 d = kMode == 0 ? kjit::wgmma::descriptor(base + ks * 256, 128, 2048)
                                 : desc_sw128(base + (ks / 4) * 8192 + (ks % 4) * 32);
        kjit::wgmma::mma_m64n64k16<0>(acc2, fa[ks], d);
      }
      kjit::wgmma::commit();
      kjit::wgmma::wait<0>();
      kjit::wgmma::hold_registers(acc);
      kjit::wgmma::hold_registers(acc2);
    } else {
      const __nv_bfloat16* s = reinterpret_cast<const __nv_bfloat16*>(tile);
#pragma unroll
      for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          u32 b[4];
          kjit::mma::load_b2(b, s + np * 16 * 136 + ks * 16, 136);
          kjit::mma::mma_bf16(acc[2 * np], fa[ks], b[0], b[1]);
          kjit::mma::mma_bf16(acc[2 * np + 1], fa[ks], b[2], b[3]);
          kjit::mma::load_b2(b, s + np * 16 * 136 + ks * 16, 136);
          kjit::mma::mma_bf16(acc2[2 * np], fa[ks], b[0], b[1]);
          kjit::mma::mma_bf16(acc2[2 * np + 1], fa[ks], b[2], b[3]);
        }
      }
    }
    sink += acc[0][0] + acc2[1][1];
  }
  long long t1 = clock64();
  if (blockIdx.x == 0 && warp < 4) {
    for (int nt = 0; nt < 8; ++nt)
      for (int e = 0; e < 4; ++e)
        out[(r0 + 8 * (e / 2)) * 64 + nt * 8 + 2 * t4 + e % 2] = acc[nt][e];
  }
  if (tid == 0) cycles[blockIdx.x] = t1 - t0;
  if (sink == 12345.f) out[0] = sink;
}

int main() {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<__nv_bfloat16> ha(64 * 128), ht(64 * 128);
  for (auto& x : ha) x = __float2bfloat16(nd(rng));
  for (auto& x : ht) x = __float2bfloat16(nd(rng));
  __nv_bfloat16 *da, *dt;
  float* dout;
  long long* dc;
  CK(cudaMalloc(&da, 16384));
  CK(cudaMalloc(&dt, 16384));
  CK(cudaMalloc(&dout, 64 * 64 * 4));
  CK(cudaMalloc(&dc, 132 * 8));
  CK(cudaMemcpy(da, ha.data(), 16384, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, ht.data(), 16384, cudaMemcpyHostToDevice));
  std::vector<double> ref(64 * 64);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      double s = 0;
      for (int k = 0; k < 128; ++k)
        s += double(__bfloat162float(ha[m * 128 + k])) * __bfloat162float(ht[n * 128 + k]);
      ref[m * 64 + n] = s;
    }
  const char* names[3] = {"wgmma no swizzle", "wgmma 128B swizzle",
                          "mma.sync + ldmatrix (8 warps)"};
  for (int mode = 0; mode < 3; ++mode) {
    const int smem = 40 * 1024;
    auto k = mode == 0 ? bench<0> : mode == 1 ? bench<1> : bench<2>;
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaMemset(dout, 0xff, 64 * 64 * 4));
    k<<<132, 256, smem>>>(da, dt, 2000, dout, dc);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> h(64 * 64);
    std::vector<long long> c(132);
    CK(cudaMemcpy(h.data(), dout, h.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(c.data(), dc, 132 * 8, cudaMemcpyDeviceToHost));
    double err = 0;
    for (int i = 0; i < 64 * 64; ++i) {
      double d = std::fabs(h[i] - ref[i]);
      err = d <= 1e30 ? std::fmax(err, d) : INFINITY;
    }
    double mean = 0;
    for (auto x : c) mean += x;
    mean /= 132;
    printf(
        "%-32s: %7.0f cycles per iteration (two 64x64x128 products per warpgroup pair), max err "
        "%.3g\n",
        names[mode], mean / 2000, err);
  }
}
