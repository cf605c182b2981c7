// SPDX-License-Identifier: Apache-2.0
// Parameter block of the benchmark helper kernels (templates/bench/bench.cuh).
#pragma once

#include "templates/common/types.h"

namespace kjit {

struct BenchParams {
  /// Spin kernel: how many SM clock cycles to wait.
  u64 cycles;
};

}  // namespace kjit
