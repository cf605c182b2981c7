// SPDX-License-Identifier: Apache-2.0
// Parameter block of the probe kernel (templates/probe/probe.cuh), shared with host code.
#pragma once

#include "templates/common/types.h"

namespace kjit {

struct ProbeParams {
  /// One float per thread of the grid: out[linear thread id] = value + linear thread id.
  float* out;
  u64 count;
  float value;
  /// Floats of dynamic shared memory the kernel touches (all of it, to prove it is there).
  u32 smem_floats;
};

}  // namespace kjit
