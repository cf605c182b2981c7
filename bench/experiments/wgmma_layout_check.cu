// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc, sm_90a): checks templates/common/wgmma.cuh
// against a float64 CPU product before a kernel relies on it. One warpgroup multiplies a random
// 64 x 16 bf16 A (registers, mma.cuh's A fragments) by B tiles stored as gdn_prefill_state's
// no-swizzle layout holds them (64 rows of 128 bf16: core matrix (r / 8, c / 8) at
// (r / 8) * 2048 + (c / 8) * 128 bytes): K-major B (B[k][n] = T[n][16 ks + k]) with m64n64k16,
// and N-major B (B[k][n] = T[16 jb + k][n], kTransB = 1) with m64n128k16 under both readings of
// the descriptor's two strides. Prints the max abs error of each against float64. The same
// checks then run on the 128-byte-swizzled tiles the state kernel takes now
// (wgmma::descriptor_sw128: two halves of 64 columns, 8 KiB each; within a half row r's 16-byte
// chunk j at r * 128 + (j ^ r % 8) * 16; K-major k-step ks at (ks / 4) * 8192 + (ks % 4) * 32,
// sbo 1024; N-major k-step jb at jb * 2048, strides 8192 / 1024 both ways round). On the H200:
// K-major 9.5e-7, N-major with lbo 8192 and sbo 1024 1.8e-6, the other reading 17.1 (wrong).
//   (from the repository root: the includes are paths in the source tree)
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -std=c++17 -I.
//   bench/experiments/wgmma_layout_check.cu -o /tmp/w
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

__device__ int core_offset(int r, int c, bool sw128) {
  return sw128 ? (c / 64) * 8192 + r * 128 + ((((c % 64) / 8) ^ (r % 8)) * 16) + (c % 8) * 2
               : (r / 8) * 2048 + (c / 8) * 128 + (r % 8) * 16 + (c % 8) * 2;
}

// a: [64][16] row-major; t: [64][128] row-major; out_k: [64][64]; out_n: [2][64][128].
__global__ void check(const __nv_bfloat16* a, const __nv_bfloat16* t, int ks, int jb, bool sw128,
                      float* out_k, float* out_n) {
  // 48 KiB, more than the tile: a wrong reading of the strides reads garbage, not past the end.
  extern __shared__ __align__(1024) unsigned char tile[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  for (int e = tid; e < 64 * 128; e += 128) {
    const int r = e / 128, c = e % 128;
    *reinterpret_cast<__nv_bfloat16*>(tile + core_offset(r, c, sw128)) = t[e];
  }
  __syncthreads();
  // kjit::u32 A fragment of rows 16 warp .. + 15.
  u32 fa[4];
  const unsigned short* a16 = reinterpret_cast<const unsigned short*>(a);
  auto pair = [&](int r, int c) { return u32(a16[r * 16 + c]) | (u32(a16[r * 16 + c + 1]) << 16); };
  const int r0 = 16 * warp + g;
  fa[0] = pair(r0, 2 * t4);
  fa[1] = pair(r0 + 8, 2 * t4);
  fa[2] = pair(r0, 2 * t4 + 8);
  fa[3] = pair(r0 + 8, 2 * t4 + 8);
  const u32 base = static_cast<u32>(__cvta_generic_to_shared(tile));

  float dk[8][4] = {};
  kjit::wgmma::hold_registers(dk);
  kjit::wgmma::fence();
  kjit::wgmma::mma_m64n64k16<0>(
      dk, fa,
      sw128 ? kjit::wgmma::descriptor_sw128(base + (ks / 4) * 8192 + (ks % 4) * 32, 16, 1024)
            : kjit::wgmma::descriptor(base + ks * 256, 128, 2048));
  kjit::wgmma::commit();
  kjit::wgmma::wait<0>();
  kjit::wgmma::hold_registers(dk);
  for (int nt = 0; nt < 8; ++nt)
    for (int e = 0; e < 4; ++e)
      out_k[(r0 + 8 * (e / 2)) * 64 + nt * 8 + 2 * t4 + e % 2] = dk[nt][e];

  for (int variant = 0; variant < 2; ++variant) {
    float dn[16][4] = {};
    const u64 desc =
        sw128 ? (variant == 0 ? kjit::wgmma::descriptor_sw128(base + jb * 2048, 8192, 1024)
                              : kjit::wgmma::descriptor_sw128(base + jb * 2048, 1024, 8192))
              : (variant == 0 ? kjit::wgmma::descriptor(base + jb * 2 * 2048, 128, 2048)
                              : kjit::wgmma::descriptor(base + jb * 2 * 2048, 2048, 128));
    kjit::wgmma::hold_registers(dn);
    kjit::wgmma::fence();
    kjit::wgmma::mma_m64n128k16<1>(dn, fa, desc);
    kjit::wgmma::commit();
    kjit::wgmma::wait<0>();
    kjit::wgmma::hold_registers(dn);
    for (int nt = 0; nt < 16; ++nt)
      for (int e = 0; e < 4; ++e)
        out_n[variant * 64 * 128 + (r0 + 8 * (e / 2)) * 128 + nt * 8 + 2 * t4 + e % 2] = dn[nt][e];
  }
}

int main() {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<__nv_bfloat16> ha(64 * 16), ht(64 * 128);
  for (auto& x : ha) x = __float2bfloat16(nd(rng));
  for (auto& x : ht) x = __float2bfloat16(nd(rng));
  __nv_bfloat16 *da, *dt;
  float *ok, *on;
  CK(cudaMalloc(&da, ha.size() * 2));
  CK(cudaMalloc(&dt, ht.size() * 2));
  CK(cudaMalloc(&ok, 64 * 64 * 4));
  CK(cudaMalloc(&on, 2 * 64 * 128 * 4));
  CK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dt, ht.data(), ht.size() * 2, cudaMemcpyHostToDevice));
  for (const bool sw128 : {false, true}) {
    CK(cudaMemset(ok, 0xff, 64 * 64 * 4));  // NaN poison
    CK(cudaMemset(on, 0xff, 2 * 64 * 128 * 4));
    const int ks = sw128 ? 5 : 3, jb = sw128 ? 3 : 1;
    check<<<1, 128, 48 * 1024>>>(da, dt, ks, jb, sw128, ok, on);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    std::vector<float> hk(64 * 64), hn(2 * 64 * 128);
    CK(cudaMemcpy(hk.data(), ok, hk.size() * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hn.data(), on, hn.size() * 4, cudaMemcpyDeviceToHost));
    auto A = [&](int m, int k) { return double(__bfloat162float(ha[m * 16 + k])); };
    auto T = [&](int r, int c) { return double(__bfloat162float(ht[r * 128 + c])); };
    double ek = 0, en[2] = {0, 0};
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < 64; ++n) {
        double s = 0;
        for (int k = 0; k < 16; ++k) s += A(m, k) * T(n, 16 * ks + k);
        ek = std::fmax(ek, std::fabs(s - hk[m * 64 + n]));  // NaN-propagating below
        if (!(std::fabs(s - hk[m * 64 + n]) <= 1e30)) ek = INFINITY;
      }
      for (int n = 0; n < 128; ++n) {
        double s = 0;
        for (int k = 0; k < 16; ++k) s += A(m, k) * T(16 * jb + k, n);
        for (int v = 0; v < 2; ++v) {
          const double d = std::fabs(s - hn[v * 64 * 128 + m * 128 + n]);
          en[v] = d <= 1e30 ? std::fmax(en[v], d) : INFINITY;
        }
      }
    }
    const char* kind = sw128 ? "128-byte swizzle" : "no swizzle";
    std::printf("%s, K-major m64n64k16 (%s): max abs err %.3g -> %s\n", kind,
                sw128 ? "sbo 1024" : "lbo 128, sbo 2048", ek, ek < 1e-3 ? "ok" : "WRONG");
    for (int v = 0; v < 2; ++v) {
      const char* strides = sw128 ? (v == 0 ? "lbo 8192 sbo 1024" : "lbo 1024 sbo 8192")
                                  : (v == 0 ? "lbo 128 sbo 2048" : "lbo 2048 sbo 128");
      std::printf("%s, N-major m64n128k16, %s: max abs err %.3g -> %s\n", kind, strides, en[v],
                  en[v] < 1e-3 ? "ok" : "WRONG");
    }
  }
  return 0;
}
