// SPDX-License-Identifier: Apache-2.0
// Kernels the benchmarks measure against: an empty kernel (the launch floor), a spin kernel
// that keeps the stream busy while the host enqueues timed calls behind it, and the slot
// read-modify-write floor of a step on a state pool.
#pragma once

#include "templates/bench/params.h"

namespace kjit {

template <int kSpin>
__global__ void bench_kernel(const BenchParams p) {
  if constexpr (kSpin != 0) {
    const long long start = clock64();
    while (clock64() - start < static_cast<long long>(p.cycles)) {
    }
  }
}

namespace bench_slot_rmw {

template <int kHint>
__device__ __forceinline__ uint4 load(const uint4* ptr) {
  if constexpr (kHint == kBenchSlotRmwStream) {
    return __ldcs(ptr);
  } else if constexpr (kHint == kBenchSlotRmwL2Prefetch) {
    uint4 v;
    asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(ptr));
    return v;
  } else {
    return *ptr;
  }
}

template <int kHint>
__device__ __forceinline__ void store(uint4* ptr, const uint4 v) {
  if constexpr (kHint == kBenchSlotRmwStream) {
    __stcs(ptr, v);
  } else {
    *ptr = v;
  }
}

__device__ __forceinline__ uint4 plus(const uint4 v, const u32 delta) {
  return make_uint4(v.x + delta, v.y + delta, v.z + delta, v.w + delta);
}

/// The inputs and the output, spread over the grid's first threads: output vector g is the xor
/// of input vectors g, g + n, g + 2n, ... (n output vectors) plus delta, so every input load
/// feeds a store and none can be dropped, and each byte is read or written once, coalesced.
/// The output's values mean nothing; only its bytes are the step's.
__device__ __forceinline__ void inputs_to_output(const SlotRmwParams& p) {
  const uint4* in0 = static_cast<const uint4*>(p.inputs[0]);
  const uint4* in1 = static_cast<const uint4*>(p.inputs[1]);
  uint4* out = static_cast<uint4*>(p.output);
  const u64 n0 = p.input_bytes[0] / 16, n_in = n0 + p.input_bytes[1] / 16;
  const u64 n_out = p.output_bytes / 16;
  const u64 threads = u64(gridDim.x) * blockDim.x;
  for (u64 g = u64(blockIdx.x) * blockDim.x + threadIdx.x; g < n_out; g += threads) {
    uint4 fold = make_uint4(0, 0, 0, 0);
    for (u64 i = g; i < n_in; i += n_out) {
      const uint4 v = i < n0 ? in0[i] : in1[i - n0];
      fold = make_uint4(fold.x ^ v.x, fold.y ^ v.y, fold.z ^ v.z, fold.w ^ v.w);
    }
    out[g] = plus(fold, p.delta);
  }
}

}  // namespace bench_slot_rmw

/// What a step on a pool of per-sequence states costs in memory alone: each selected slot read
/// and written back in place (slots[i] for grid row i, in the order given), the inputs read and
/// the output written once, no arithmetic: the floor an op's step on the same slots is timed
/// beside, since the step moves these bytes and does its work besides.
/// A block moves kRows x kWarps rows of 512 bytes of one slot (a lane's 16-byte vector per row);
/// each warp issues all its kRows loads before its first store, so kRows x 512 bytes per warp
/// are in flight. Consecutive blocks walk a slot in address order.
template <int kRows, int kWarps, int kHint>
__global__ void __launch_bounds__(kWarps * 32) bench_slot_rmw_kernel(const SlotRmwParams p) {
  constexpr u64 kRowBytes = 32 * 16;
  const u32 row = blockIdx.x / p.tiles_per_slot;
  const u32 tile = blockIdx.x % p.tiles_per_slot;
  const i64 slot = p.slots[row];
  uint4* base = nullptr;
  uint4 x[kRows];
  if (slot >= 0) {
    base = reinterpret_cast<uint4*>(static_cast<char*>(p.pool) + u64(slot) * p.slot_bytes +
                                    u64(tile) * (kRows * kWarps * kRowBytes)) +
           (threadIdx.x / 32) * 32 + threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < kRows; ++r) x[r] = bench_slot_rmw::load<kHint>(base + r * kWarps * 32);
  }
  // Between the pool's loads and its stores, so that these loads are in flight with them.
  bench_slot_rmw::inputs_to_output(p);
  if (slot >= 0) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      bench_slot_rmw::store<kHint>(base + r * kWarps * 32, bench_slot_rmw::plus(x[r], p.delta));
    }
  }
}

}  // namespace kjit
