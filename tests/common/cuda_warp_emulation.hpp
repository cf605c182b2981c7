// SPDX-License-Identifier: Apache-2.0
// cuda_host_emulation.hpp plus what warp-synchronous templates need: each block's threads run
// at once as OS threads, and __shfl_xor_sync / __shfl_sync / __syncthreads meet at a barrier of
// the whole block (so every thread of a block must reach them in the same order, as the GDN
// decode kernel's do). __shared__ is defined away (cuda_host_emulation.hpp); a test whose kernel
// exchanges data through static shared memory redefines it as `static` (one block runs at a time),
// see ops_gdn_decode_emulated_test.cpp. Loads and stores with cache hints are plain ones. Like the
// base header: indexing and arithmetic only, not races or the memory model.
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common/cuda_host_emulation.hpp"

[[noreturn]] inline void __trap() { std::abort(); }

template <typename T>
T __ldcs(const T* p) {
  return *p;
}
template <typename T>
void __stcs(T* p, T v) {
  *p = v;
}
/// Only for name lookup of the (never instantiated here) cp.async helpers.
inline unsigned __cvta_generic_to_shared(const void*) { return 0; }

/// The threads of the block being run, meeting at `barrier`.
struct EmulatedBlock {
  explicit EmulatedBlock(unsigned threads) : barrier(threads), exchange(threads) {}
  std::barrier<> barrier;
  std::vector<float> exchange;
};
inline thread_local EmulatedBlock* emulated_block = nullptr;

inline void __syncthreads() { emulated_block->barrier.arrive_and_wait(); }

/// The value of lane `src_lane(lane)` of this thread's warp.
template <typename SrcLane>
float emulated_exchange(float v, SrcLane src_lane) {
  EmulatedBlock& block = *emulated_block;
  const unsigned warp_base = threadIdx.x & ~31u;
  block.exchange[threadIdx.x] = v;
  block.barrier.arrive_and_wait();
  const float got = block.exchange[warp_base + src_lane(threadIdx.x & 31u)];
  block.barrier.arrive_and_wait();
  return got;
}
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  return emulated_exchange(v,
                           [&](unsigned lane) { return lane ^ static_cast<unsigned>(lane_mask); });
}
inline float __shfl_sync(unsigned, float v, int src, int width = 32) {
  return emulated_exchange(v, [&](unsigned lane) {
    const unsigned w = static_cast<unsigned>(width);
    return lane / w * w + static_cast<unsigned>(src) % w;
  });
}

/// Runs a launch of `kernel(params)` on grid (x, y, z) x block.x: blocks one after another, the
/// threads of each block at once.
template <typename Params>
void emulated_launch_threads(void (*kernel)(Params), EmulatedDim3 grid, unsigned block,
                             const Params& params) {
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        EmulatedBlock state(block);
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned t = 0; t < block; ++t) {
          threads.emplace_back([&, t] {
            gridDim = grid;
            blockDim = EmulatedDim3{block, 1, 1};
            blockIdx = EmulatedDim3{bx, by, bz};
            threadIdx = EmulatedDim3{t, 0, 0};
            emulated_block = &state;
            kernel(params);
          });
        }
        for (std::thread& thread : threads) thread.join();
      }
    }
  }
}
