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
/// Every thread of every block of the cluster arrives, relaxed: no order for this thread's
/// earlier memory accesses. (The release form is a fence that waits for the thread's accesses
/// still in flight: the fused decode step's state rows, loaded ahead of the arrival so that their
/// latency overlaps the conv, and its stores just before, held its warps there: 5.82 -> 5.40 us at
/// B = 1 without it, docs/performance.md.) A caller whose reads must precede the other blocks'
/// writes after wait() consumes their values before arriving: an instruction issues only once the
/// loads it reads have returned, and the arrival issues after it.
__device__ __forceinline__ void arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
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
