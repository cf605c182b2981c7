// SPDX-License-Identifier: Apache-2.0
// cuda_host_emulation.hpp plus what warp-synchronous templates need: each block's threads run
// at once as OS threads, and __shfl_xor_sync / __shfl_sync / __syncthreads meet at a barrier of
// the whole block (so every thread of a block must reach them in the same order, as the GDN
// decode kernel's do). __shared__ is defined away (cuda_host_emulation.hpp); a test whose kernel
// exchanges data through static shared memory redefines it as `static` (one block runs at a time),
// see ops_gdn_decode_emulated_test.cpp. Loads and stores with cache hints are plain ones. Like the
// base header: indexing and arithmetic only, not races or the memory model.
//
// Thread-block clusters (templates/common/cluster.cuh) run through emulated_launch_clusters: the
// blocks of a cluster at once, each with shared memory of its own (emulated_block_smem), and the
// cluster barrier's arrive and wait split as on the GPU.
#pragma once

#include <barrier>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <optional>
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

/// The threads of the block being run, meeting at `barrier`; `smem`: its shared memory when
/// the launch gives each block its own (emulated_launch_clusters).
struct EmulatedBlock {
  explicit EmulatedBlock(unsigned threads, std::size_t smem_floats = 0)
      : barrier(threads), exchange(threads), smem(smem_floats, 0.0f) {}
  std::barrier<> barrier;
  std::vector<float> exchange;
  std::vector<float> smem;
};
inline thread_local EmulatedBlock* emulated_block = nullptr;

/// The threads of the cluster being run, all its blocks', meeting at `barrier`.
struct EmulatedCluster {
  explicit EmulatedCluster(unsigned threads) : barrier(threads) {}
  std::barrier<> barrier;
};
inline thread_local EmulatedCluster* emulated_cluster = nullptr;
/// This thread's arrival at the cluster barrier, until it waits.
inline thread_local std::optional<std::barrier<>::arrival_token> emulated_cluster_arrival;

/// This thread's block's shared memory (emulated_launch_clusters).
inline float* emulated_block_smem() { return emulated_block->smem.data(); }

// templates/common/cluster.cuh's operations (it leaves them to this header when
// KJIT_EMULATED_CLUSTER is defined). Outside a clustered launch they abort: a kernel that
// reaches them was planned with a cluster and must be run as one.
#define KJIT_EMULATED_CLUSTER 1
namespace kjit::cluster {
/// The emulated arrival orders everything before it (std::barrier), more than the relaxed one
/// does: the hardware's reason that suffices (an issued instruction's loads have returned) has no
/// counterpart in host threads.
inline void arrive_relaxed() {
  if (emulated_cluster == nullptr || emulated_cluster_arrival) std::abort();
  emulated_cluster_arrival.emplace(emulated_cluster->barrier.arrive());
}
inline void wait() {
  if (emulated_cluster == nullptr || !emulated_cluster_arrival) std::abort();
  emulated_cluster->barrier.wait(std::move(*emulated_cluster_arrival));
  emulated_cluster_arrival.reset();
}
}  // namespace kjit::cluster

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

/// Runs a 1-D launch of `kernel(params)` of `grid` blocks of `block` threads in clusters of
/// `cluster` consecutive blocks (1: no cluster; grid a multiple of it): one cluster after
/// another, the threads of all its blocks at once, each block with `smem_floats` floats of
/// shared memory of its own (emulated_block_smem), zeroed.
template <typename Params>
void emulated_launch_clusters(void (*kernel)(Params), unsigned grid, unsigned block,
                              unsigned cluster, std::size_t smem_floats, const Params& params) {
  if (cluster == 0 || grid % cluster != 0) std::abort();
  for (unsigned first = 0; first < grid; first += cluster) {
    EmulatedCluster state(cluster * block);
    std::vector<std::unique_ptr<EmulatedBlock>> blocks;
    for (unsigned r = 0; r < cluster; ++r) {
      blocks.push_back(std::make_unique<EmulatedBlock>(block, smem_floats));
    }
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(cluster) * block);
    for (unsigned r = 0; r < cluster; ++r) {
      for (unsigned t = 0; t < block; ++t) {
        threads.emplace_back([&, r, t] {
          gridDim = EmulatedDim3{grid, 1, 1};
          blockDim = EmulatedDim3{block, 1, 1};
          blockIdx = EmulatedDim3{first + r, 0, 0};
          threadIdx = EmulatedDim3{t, 0, 0};
          emulated_block = blocks[r].get();
          emulated_cluster = cluster > 1 ? &state : nullptr;
          kernel(params);
          // A thread that left with an arrival pending would have hung the GPU's cluster.
          if (emulated_cluster_arrival) std::abort();
        });
      }
    }
    for (std::thread& thread : threads) thread.join();
  }
}
