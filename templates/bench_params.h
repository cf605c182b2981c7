// SPDX-License-Identifier: Apache-2.0
// Parameter block of the benchmark helper kernels (templates/bench.cuh).
#pragma once

#include "kjit/common/types.h"

namespace kjit {

struct BenchParams {
  /// Spin kernel: how many SM clock cycles to wait.
  u64 cycles;
};

}  // namespace kjit
