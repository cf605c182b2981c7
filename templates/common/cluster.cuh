// SPDX-License-Identifier: Apache-2.0
// Thread-block clusters (sm_90 and later; LaunchShape::cluster): the blocks of a cluster run at
// the same time, meet at the cluster barrier and read each other's shared memory (distributed
// shared memory). A kernel uses these only in a clustered launch, whose blocks are consecutive
// along x. On earlier archs they compile to nothing: the planner never clusters a launch there.
// The CPU emulation (tests/common/cuda_warp_emulation.hpp, which defines KJIT_EMULATED_CLUSTER)
// defines them itself, over blocks it runs at once. NVRTC-clean.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace cluster {

#if !defined(KJIT_EMULATED_CLUSTER)
/// Every thread of every block of the cluster arrives; its earlier shared-memory writes become
/// visible to the cluster's threads that wait() after this arrival (release).
__device__ __forceinline__ void arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
#endif
}

/// Waits until every thread of the cluster has arrived (acquire).
__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

/// The float at `local` (this block's shared memory) in the shared memory of block `rank` of
/// the cluster: same offset, other block.
__device__ __forceinline__ float load_peer(const float* local, u32 rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const u32 address = static_cast<u32>(__cvta_generic_to_shared(local));
  u32 remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  float value;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(value) : "r"(remote) : "memory");
  return value;
#else
  (void)rank;
  return *local;
#endif
}
#endif  // !KJIT_EMULATED_CLUSTER

}  // namespace cluster
}  // namespace kjit
