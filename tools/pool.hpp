// SPDX-License-Identifier: Apache-2.0
// A fork()ed process pool that compiles specs: NVRTC serializes much of its work inside one
// process, so threads do not scale and processes do.
#pragma once

#include <string>
#include <vector>

#include "kjit/runtime.hpp"
#include "kjit/spec.hpp"

namespace kjit::tool {

struct PoolResult {
  /// Compiled kernels in the order of the specs that succeeded.
  std::vector<CompiledKernel> kernels;
  /// "<spec>: <error>" for every spec that failed.
  std::vector<std::string> failures;
  double seconds = 0;
};

/// Compiles `specs` in `jobs` worker processes, each with its own Runtime (so the disk cache
/// of Settings::from_env() is used and filled). Work is handed out one spec at a time, so a
/// slow spec does not hold up a worker's queue. `progress`: draw a progress bar on stderr.
/// Must be called while this process runs no other threads (fork).
PoolResult compile_in_pool(const std::vector<KernelSpec>& specs, int jobs, bool progress);

}  // namespace kjit::tool
