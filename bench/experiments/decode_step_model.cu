// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc): a standalone model of one GDN decode
// step (L2 norms, gates, dk/dq reductions, update, out) over a random-slot pool, H = 16,
// K = V = 128, bf16 qkv, f32 state, with the state tile held in registers (kStage 0), staged
// in shared memory by cp.async (1) or by one bulk copy (2), against cudaMemcpy of the same
// bytes. It reproduces gdn_decode's register path within 0.5% and chose its staged path.
// Inputs are constant (timing only; correctness is the GPU suite's).
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/experiments/decode_step_model.cu -o /tmp/m && /tmp/m
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>
#include "cuda_check.h"

struct P {
  float* pool;
  const int* idx;
  const __nv_bfloat16* qkv;
  const __nv_bfloat16* a;
  const __nv_bfloat16* b;
  const float* a_log;
  const float* dt_bias;
  __nv_bfloat16* out;
  int hv_count;
  long long slot_stride;
};

__device__ __forceinline__ float bf(unsigned short x) { return __uint_as_float(unsigned(x) << 16); }
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

/// One halving exchange of a transposed reduction: lanes with bit 2*kHalf set keep the upper
/// kHalf of their 2*kHalf values and send the lower (constant indices: val stays in registers).
template <int kHalf>
__device__ __forceinline__ void halve(float (&val)[16], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? val[i] : val[i + kHalf];
    const float keep = upper ? val[i + kHalf] : val[i];
    val[i] = keep + __shfl_xor_sync(~0u, send, 2 * kHalf);
  }
}

/// kCompact (one warp, 8 rows): the 16 row sums (k and q dot products) are reduced by halving
/// exchanges (8 + 4 + 2 + 1 + 1 shuffles, leaving row r's two sums in lanes 4r..4r+3), each
/// row's v is loaded, its u and out computed, by those lanes alone (one 16-byte v load, one
/// 16-byte out store per tile), and u is broadcast back (8 shuffles): 25 shuffles instead of 80.
template <int kRows, int kWarps, int kStage, bool kCompact = false>
__global__ void __launch_bounds__(kWarps * 32) mini(const P p) {
  static_assert(!kCompact || (kRows == 8 && kWarps == 1), "compact: one warp of 8 rows");
  constexpr int kTileRows = kRows * kWarps;
  constexpr int kTiles = 128 / kTileRows;
  extern __shared__ __align__(128) float4 sm[];
  const long long t = blockIdx.x + (long long)gridDim.x * blockIdx.y;
  const int vt = t % kTiles;
  const int hv = (t / kTiles) % p.hv_count;
  const long long n = t / kTiles / p.hv_count;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int slot = p.idx[n];
  float4* tile = reinterpret_cast<float4*>(p.pool + slot * p.slot_stride +
                                           ((long long)hv * 128 + vt * kTileRows) * 128);
  float4* stage = sm + warp * kRows * 32;
  __shared__ __align__(8) unsigned long long bar[kWarps];
  float4 x[kStage == 0 ? kRows : 1];
  if constexpr (kStage == 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) x[r] = __ldcs(tile + (r * kWarps + warp) * 32 + lane);
  } else if constexpr (kStage == 1) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      asm volatile(
          "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(stage + r * 32 + lane)),
          "l"(tile + (r * kWarps + warp) * 32 + lane)
          : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
  } else {
    // rows of this warp are not contiguous when kWarps > 1; this variant requires kWarps == 1
    static_assert(kStage != 2 || kWarps == 1, "bulk: one warp");
    if (lane == 0) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(&bar[warp])) : "memory");
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile(
          "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(&bar[warp])),
          "r"(kRows * 512)
          : "memory");
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
          "[%3];" ::"r"(smem_u32(stage)),
          "l"(tile), "r"(kRows * 512), "r"(smem_u32(&bar[warp]))
          : "memory");
    }
    __syncwarp();
  }
  // inputs
  const int h = hv / (p.hv_count / 16);
  const __nv_bfloat16* row = p.qkv + n * (2 * 16 * 128 + p.hv_count * 128);
  const uint2 qw = *reinterpret_cast<const uint2*>(row + h * 128 + lane * 4);
  const uint2 kw = *reinterpret_cast<const uint2*>(row + (16 + h) * 128 + lane * 4);
  float vv[kRows];
  if constexpr (kCompact) {
    // Lanes 4r..4r+3 own row r: one load of the tile's 8 consecutive v values.
    vv[0] = __bfloat162float(row[2 * 16 * 128 + hv * 128 + vt * kTileRows + (lane >> 2)]);
  } else {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      vv[r] = __bfloat162float(row[2 * 16 * 128 + hv * 128 + vt * kTileRows + r * kWarps + warp]);
  }
  const float ga = __bfloat162float(p.a[n * p.hv_count + hv]);
  const float gb = __bfloat162float(p.b[n * p.hv_count + hv]);
  const float alog = p.a_log[hv], dtb = p.dt_bias[hv];
  float q[4] = {bf(qw.x & 0xffff), bf(qw.x >> 16), bf(qw.y & 0xffff), bf(qw.y >> 16)};
  float k[4] = {bf(kw.x & 0xffff), bf(kw.x >> 16), bf(kw.y & 0xffff), bf(kw.y >> 16)};
  float qs = 0, ks = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    qs += q[i] * q[i];
    ks += k[i] * k[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    qs += __shfl_xor_sync(~0u, qs, o);
    ks += __shfl_xor_sync(~0u, ks, o);
  }
  const float qf = rsqrtf(qs + 1e-6f) * 0.0883883f, kf = rsqrtf(ks + 1e-6f);
  float kq = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] *= qf;
    k[i] *= kf;
    kq += q[i] * k[i];
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) kq += __shfl_xor_sync(~0u, kq, o);
  const float sp = ga + dtb > 20.f ? ga + dtb : log1pf(expf(ga + dtb));
  const float alpha = expf(-expf(alog) * sp);
  const float beta = 1.f / (1.f + expf(-gb));
  if constexpr (kStage == 1) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
  }
  if constexpr (kStage == 2) {
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0; @!p bra W; }" ::
            "r"(smem_u32(&bar[warp]))
        : "memory");
  }
  float dk[kRows], dq[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4 s = kStage == 0 ? x[r] : stage[r * 32 + lane];
    dk[r] = s.x * k[0] + s.y * k[1] + s.z * k[2] + s.w * k[3];
    dq[r] = s.x * q[0] + s.y * q[1] + s.z * q[2] + s.w * q[3];
  }
  __nv_bfloat16* out = p.out + n * p.hv_count * 128 + hv * 128 + vt * kTileRows;
  if constexpr (kCompact) {
    // Value j of 16 (dk[r] at 2r, dq[r] at 2r + 1); each exchange halves the values a lane
    // holds: lane bit b keeps the upper half when set and sends the other half.
    float val[16];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      val[2 * r] = dk[r];
      val[2 * r + 1] = dq[r];
    }
    halve<8>(val, lane);
    halve<4>(val, lane);
    halve<2>(val, lane);
    halve<1>(val, lane);
    val[0] += __shfl_xor_sync(~0u, val[0], 1);
    // Lane L holds value 8*b4 + 4*b3 + 2*b2 + b1 of its bits: row r = L >> 2, dk when b1 = 0.
    const float other = __shfl_xor_sync(~0u, val[0], 2);
    const bool is_dq = (lane & 2) != 0;
    const float my_dk = is_dq ? other : val[0], my_dq = is_dq ? val[0] : other;
    const float my_u = beta * (vv[0] - alpha * my_dk);
    if ((lane & 3) == 0) out[lane >> 2] = __float2bfloat16(alpha * my_dq + my_u * kq);
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      dk[r] = __shfl_sync(~0u, my_u, 4 * r);  // dk[] now holds u per row
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float4 s = kStage == 0 ? x[r] : stage[r * 32 + lane];
      const float u = dk[r];
      __stcs(tile + r * 32 + lane, make_float4(alpha * s.x + u * k[0], alpha * s.y + u * k[1],
                                               alpha * s.z + u * k[2], alpha * s.w + u * k[3]));
    }
    return;
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      dk[r] += __shfl_xor_sync(~0u, dk[r], o);
      dq[r] += __shfl_xor_sync(~0u, dq[r], o);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float4 s = kStage == 0 ? x[r] : stage[r * 32 + lane];
    const float u = beta * (vv[r] - alpha * dk[r]);
    float4 y = make_float4(alpha * s.x + u * k[0], alpha * s.y + u * k[1], alpha * s.z + u * k[2],
                           alpha * s.w + u * k[3]);
    __stcs(tile + (r * kWarps + warp) * 32 + lane, y);
    if (lane == 0) out[r * kWarps + warp] = __float2bfloat16(alpha * dq[r] + u * kq);
  }
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
  for (int hv : {32, 64}) {
    for (long long B : {256LL, 2048LL}) {
      const long long slot_stride = (long long)hv * 128 * 128;
      const size_t bytes = B * slot_stride * 4;
      P p{};
      float* pool2;
      int* perm;
      __nv_bfloat16 *qkv, *ab, *out;
      float* par;
      CK(cudaMalloc(&p.pool, bytes));
      CK(cudaMalloc(&pool2, bytes));
      CK(cudaMemset(p.pool, 0, bytes));
      const long long width = 2 * 16 * 128 + hv * 128;
      CK(cudaMalloc(&qkv, B * width * 2));
      CK(cudaMemset(qkv, 0x3c, B * width * 2));
      CK(cudaMalloc(&ab, 2 * B * hv * 2));
      CK(cudaMemset(ab, 0x3c, 2 * B * hv * 2));
      CK(cudaMalloc(&par, 2 * hv * 4));
      CK(cudaMemset(par, 0, 2 * hv * 4));
      CK(cudaMalloc(&out, B * hv * 128 * 2));
      std::vector<int> h(B);
      std::iota(h.begin(), h.end(), 0);
      std::shuffle(h.begin(), h.end(), std::mt19937_64(7));
      CK(cudaMalloc(&perm, B * 4));
      CK(cudaMemcpy(perm, h.data(), B * 4, cudaMemcpyHostToDevice));
      p.idx = perm;
      p.qkv = qkv;
      p.a = ab;
      p.b = ab + B * hv;
      p.a_log = par;
      p.dt_bias = par + hv;
      p.out = out;
      p.hv_count = hv;
      p.slot_stride = slot_stride;
      const double moved = 2.0 * bytes;
      const float copy =
          median_us([&] { cudaMemcpyAsync(pool2, p.pool, bytes, cudaMemcpyDeviceToDevice); });
      auto report = [&](const char* name, float us) {
        printf("HV=%d B=%4lld %-30s %9.1f us %7.1f GB/s ratio %.3f\n", hv, B, name, us,
               moved / us / 1e3, copy / us);
      };
      report("cudaMemcpy", copy);
      auto grid = [&](long long blocks) { return dim3(1024, (unsigned)((blocks + 1023) / 1024)); };
#define RUN_C(NAME, ROWS, WARPS, STAGE, COMPACT)                                       \
  {                                                                                    \
    const long long blocks = B * hv * (128 / ((ROWS) * (WARPS)));                      \
    const int smem = (STAGE) ? (ROWS) * (WARPS)*512 : 0;                               \
    CK(cudaFuncSetAttribute(mini<ROWS, WARPS, STAGE, COMPACT>,                         \
                            cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024));  \
    report(NAME, median_us([&] {                                                       \
             mini<ROWS, WARPS, STAGE, COMPACT><<<grid(blocks), (WARPS)*32, smem>>>(p); \
           }));                                                                        \
    CK(cudaGetLastError());                                                            \
  }
#define RUN(NAME, ROWS, WARPS, STAGE) RUN_C(NAME, ROWS, WARPS, STAGE, false)
      RUN("reg 1w x 4", 4, 1, 0);
      RUN("reg 1w x 8", 8, 1, 0);
      RUN("reg 2w x 4", 4, 2, 0);
      RUN("reg 2w x 8", 8, 2, 0);
      RUN("cp.async 1w x 4", 4, 1, 1);
      RUN("cp.async 1w x 8", 8, 1, 1);
      RUN_C("cp.async 1w x 8, compact", 8, 1, 1, true);
      RUN_C("reg 1w x 8, compact", 8, 1, 0, true);
      RUN("cp.async 1w x 16", 16, 1, 1);
      RUN("cp.async 2w x 8", 8, 2, 1);
      RUN("cp.async 4w x 8", 8, 4, 1);
      RUN("bulk 1w x 4", 4, 1, 2);
      RUN("bulk 1w x 8", 8, 1, 2);
      RUN("bulk 1w x 16", 16, 1, 2);
      RUN("bulk 1w x 32", 32, 1, 2);
      cudaFree(p.pool);
      cudaFree(pool2);
      cudaFree(perm);
      cudaFree(qkv);
      cudaFree(ab);
      cudaFree(par);
      cudaFree(out);
    }
  }
  return 0;
}
