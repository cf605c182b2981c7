// SPDX-License-Identifier: Apache-2.0
// Thread-block clusters (sm_90 and later; LaunchShape::cluster): the blocks of a cluster run at
// the same time and meet at the cluster barrier, whose arrival and wait are separate. A kernel
// uses these only in a clustered launch, whose blocks are consecutive along x. On earlier archs
// they compile to nothing: the planner never clusters a launch there. The CPU emulation
// (tests/common/cuda_warp_emulation.hpp, which defines KJIT_EMULATED_CLUSTER) defines them itself,
// over blocks it runs at once. NVRTC-clean.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace cluster {

#if !defined(KJIT_EMULATED_CLUSTER)
/// Every thread of every block of the cluster arrives; its earlier memory accesses (shared and
/// global) are ordered before those that the cluster's threads make after their wait() for this
/// arrival (release).
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
#endif  // !KJIT_EMULATED_CLUSTER

}  // namespace cluster
}  // namespace kjit
