// SPDX-License-Identifier: Apache-2.0
// Scratch memory of kjit's multi-kernel ops (the gdn_prefill chunked path's workspace), when
// the caller passes none: stream-ordered allocations from a pool that keeps its memory between
// calls. The device's default pool returns its memory to the system at every synchronization
// (release threshold 0), which made each call after a sync map its workspace again: up to a
// gigabyte, 10 us of host time per call averaged over a batch of calls. Callers that want no
// memory held by kjit pass their own workspace.
#pragma once

#include <cuda.h>

#include <cstddef>

namespace kjit::driver {

/// `bytes` of device memory on `stream` (whose context must be current), freed with
/// cuMemFreeAsync on the same stream. Outside graph capture from kjit's pool of `device`
/// (created on first use, never destroyed, release threshold unlimited: its memory stays
/// reserved for the next call); under capture with cuMemAllocAsync, which capture records as a
/// graph memory node owned by the graph. Throws DriverError naming `what` on failure.
CUdeviceptr allocate_workspace(int device, std::size_t bytes, CUstream stream, const char* what);

}  // namespace kjit::driver
