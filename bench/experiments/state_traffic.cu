// SPDX-License-Identifier: Apache-2.0
// Experiment, not built with kjit (CUDA runtime + nvcc, sm_90): the memory traffic of the
// chunked prefill's state kernel without its arithmetic. The state kernel takes ~2.3 us per
// chunk step with 16 SMs busy and ~4.5-5.5 us with all 132 busy (docs/performance.md), one block
// per SM either way: something shared saturates. This kernel moves exactly the state kernel's
// bytes the way it does (one 256-thread block per (sequence, value head), 3 cp.async stages, a
// chunk of 64 tokens per step: q, k, v rows of 256 bytes, T' rows of 128, P's row factors and
// the scales 16 bytes each per token, O rows written) and nothing else, so its time is the floor
// that the access pattern sets, for three layouts of the same bytes:
//   0  as kjit has them: q/k/v/o [T, H, 128], T' [T, HV, 64], factors and scales [T, HV]
//   1  the chunk kernel's outputs head-major: T' [HV, T, 64], factors and scales [HV, T]
//   2  everything head-major (q/k/v/o [H, T, 128] too: not the caller's layout, a bound)
// and two ways of storing O: 16 bytes per thread along a row, or the mma accumulator pattern
// (4 bytes per thread, 16 value columns per warp, as the mma.sync state kernel stores).
//   (from the repository root)
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/experiments/state_traffic.cu -o /tmp/st && /tmp/st
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdio>
#include <vector>
#include "cuda_check.h"

namespace {

constexpr int kChunk = 64, kD = 128, kThreads = 256, kStages = 3;
constexpr int kQ = 0, kK = kQ + kChunk * kD * 2, kV = kK + kChunk * kD * 2,
              kT = kV + kChunk * kD * 2, kPf = kT + kChunk * 64 * 2, kSc = kPf + kChunk * 16,
              kStageBytes = kSc + kChunk * 16;

struct Bufs {
  const __nv_bfloat16 *q, *k, *v, *t;
  const float4 *pf, *sc;
  __nv_bfloat16* o;
  long long tokens;  // all sequences
  int seq_len, heads;
};

__device__ __forceinline__ void copy16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

template <int kLayout, bool kMmaStore>
__global__ void __launch_bounds__(kThreads, 1) traffic(Bufs b) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int seq = blockIdx.x / b.heads, h = blockIdx.x % b.heads;
  const long long bos = static_cast<long long>(seq) * b.seq_len;
  const int chunks = b.seq_len / kChunk;
  // Element offset of token t's row of a [T, H, w] (layout 0) or [H, T, w] tensor.
  const auto row = [&](long long t, int w, bool head_major) {
    return head_major ? (static_cast<long long>(h) * b.tokens + t) * w
                      : (t * b.heads + h) * static_cast<long long>(w);
  };
  constexpr bool kWsHeadMajor = kLayout >= 1, kAllHeadMajor = kLayout >= 2;
  const auto fill = [&](int stage, int c) {
    unsigned char* s = smem + stage * kStageBytes;
    const long long t0 = bos + static_cast<long long>(c) * kChunk;
    for (int e = tid; e < kChunk * 16; e += kThreads) {
      const int r = e / 16, part = e % 16;
      const long long off = row(t0 + r, kD, kAllHeadMajor) + part * 8;
      copy16(s + kQ + e * 16, b.q + off);
      copy16(s + kK + e * 16, b.k + off);
      copy16(s + kV + e * 16, b.v + off);
    }
    for (int e = tid; e < kChunk * 8; e += kThreads) {
      const int r = e / 8, part = e % 8;
      copy16(s + kT + e * 16, b.t + row(t0 + r, 64, kWsHeadMajor) + part * 8);
    }
    if (tid < kChunk) {
      copy16(s + kPf + tid * 16, b.pf + row(t0 + tid, 1, kWsHeadMajor));
    } else if (tid < 2 * kChunk) {
      copy16(s + kSc + (tid - kChunk) * 16, b.sc + row(t0 + tid - kChunk, 1, kWsHeadMajor));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  for (int c = 0; c < kStages - 1; ++c) {
    if (c < chunks)
      fill(c, c);
    else
      asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int c = 0; c < chunks; ++c) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2) : "memory");
    __syncthreads();
    if (c + kStages - 1 < chunks) {
      fill((c + kStages - 1) % kStages, c + kStages - 1);
    } else {
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    const unsigned char* s = smem + (c % kStages) * kStageBytes;
    const long long t0 = bos + static_cast<long long>(c) * kChunk;
    // O = v plus one element of every other tile (so every tile is read from shared memory).
    const float extra = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(s + kT)[tid]) +
                        reinterpret_cast<const float*>(s + kPf)[tid % 256] +
                        reinterpret_cast<const float*>(s + kSc)[tid % 256] +
                        __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(s + kQ)[tid]) +
                        __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(s + kK)[tid]);
    if constexpr (kMmaStore) {
      // Warp w: value columns 16 w .. 16 w + 15; per 16-token block, rows g and g + 8, pairs 2 t4.
      for (int mb = 0; mb < 4; ++mb) {
        for (int hf = 0; hf < 2; ++hf) {
          const int i = 16 * mb + g + 8 * hf;
          for (int ni = 0; ni < 2; ++ni) {
            const int col = 16 * warp + 8 * ni + 2 * t4;
            __nv_bfloat162 x =
                *reinterpret_cast<const __nv_bfloat162*>(s + kV + (i * kD + col) * 2);
            x.x = __float2bfloat16(__bfloat162float(x.x) + extra);
            *reinterpret_cast<__nv_bfloat162*>(b.o + row(t0 + i, kD, kAllHeadMajor) + col) = x;
          }
        }
      }
    } else {
      for (int e = tid; e < kChunk * 16; e += kThreads) {
        const int r = e / 16, part = e % 16;
        uint4 x = *reinterpret_cast<const uint4*>(s + kV + e * 16);
        x.x ^= __float_as_uint(extra) & 1u;
        *reinterpret_cast<uint4*>(b.o + row(t0 + r, kD, kAllHeadMajor) + part * 8) = x;
      }
    }
  }
}

__global__ void fill_bf16(__nv_bfloat16* p, long long n, float salt) {
  for (long long i = blockIdx.x * 256ll + threadIdx.x; i < n; i += 256ll * gridDim.x) {
    p[i] = __float2bfloat16(0.001f * static_cast<float>((i * 2654435761ll) & 1023) + salt);
  }
}

}  // namespace

int main() {
  const int heads = 16, seq_len = 8192, max_seqs = 16;
  const long long tokens = static_cast<long long>(seq_len) * max_seqs;
  const long long row_elems = tokens * heads * kD, ws_elems = tokens * heads * 64;
  __nv_bfloat16 *q, *k, *v, *o, *t;
  float4 *pf, *sc;
  unsigned char* flush;
  const size_t flush_bytes = 256u << 20;
  CK(cudaMalloc(&q, row_elems * 2));
  CK(cudaMalloc(&k, row_elems * 2));
  CK(cudaMalloc(&v, row_elems * 2));
  CK(cudaMalloc(&o, row_elems * 2));
  CK(cudaMalloc(&t, ws_elems * 2));
  CK(cudaMalloc(&pf, tokens * heads * 16));
  CK(cudaMalloc(&sc, tokens * heads * 16));
  CK(cudaMalloc(&flush, flush_bytes));
  fill_bf16<<<1024, 256>>>(q, row_elems, 0.1f);
  fill_bf16<<<1024, 256>>>(k, row_elems, 0.2f);
  fill_bf16<<<1024, 256>>>(v, row_elems, 0.3f);
  fill_bf16<<<1024, 256>>>(t, ws_elems, 0.4f);
  CK(cudaMemset(pf, 0, tokens * heads * 16));
  CK(cudaMemset(sc, 0, tokens * heads * 16));
  CK(cudaGetLastError());
  const int smem = kStages * kStageBytes;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const auto time_us = [&](auto launch) {
    std::vector<float> us;
    for (int rep = 0; rep < 7; ++rep) {
      CK(cudaMemsetAsync(flush, rep, flush_bytes));
      CK(cudaEventRecord(e0));
      launch();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaGetLastError());
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      us.push_back(ms * 1000.f);
    }
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
  };
  // Same-run reference: a device-to-device copy of 1 GiB (read + write counted).
  const size_t copy_bytes = 512u << 20;
  const float copy_us =
      time_us([&] { CK(cudaMemcpyAsync(o, q, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_tbs = 2.0 * copy_bytes / copy_us * 1e-6;
  std::printf("copy 512 MiB D2D: %.1f us, %.2f TB/s (read + write)\n", copy_us, copy_tbs);
  std::printf("%-34s %7s %10s %8s %8s %12s\n", "layout / O store", "blocks", "us", "TB/s",
              "of copy", "us per step");
  const auto run = [&](const char* name, auto kernel, int seqs) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    Bufs bufs{q, k, v, t, pf, sc, o, tokens, seq_len, heads};
    const int blocks = seqs * heads;
    const float us = time_us([&] { kernel<<<blocks, kThreads, smem>>>(bufs); });
    const double bytes = static_cast<double>(seqs) * seq_len * heads * (4 * 256 + 128 + 32);
    const double tbs = bytes / us * 1e-6;
    // Steps on the critical path: one block per SM, blocks / SMs rounded up, times the chunks.
    const int waves = (blocks + 131) / 132;
    std::printf("%-34s %7d %10.1f %8.2f %8.2f %12.2f\n", name, blocks, us, tbs, tbs / copy_tbs,
                us / (waves * (seq_len / kChunk)));
  };
  for (int seqs : {16, 8, 1}) {
    run("0 kjit layout, O 16 B", traffic<0, false>, seqs);
    run("0 kjit layout, O mma pairs", traffic<0, true>, seqs);
    run("1 workspace head-major, O mma", traffic<1, true>, seqs);
    run("2 all head-major, O 16 B", traffic<2, false>, seqs);
  }
  return 0;
}
