// SPDX-License-Identifier: Apache-2.0
// Kernels the benchmarks measure against: an empty kernel (the launch floor) and a spin kernel
// that keeps the stream busy while the host enqueues timed calls behind it.
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

}  // namespace kjit
