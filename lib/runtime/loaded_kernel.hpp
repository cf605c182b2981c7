// SPDX-License-Identifier: Apache-2.0
// The definition behind the public, opaque kjit::LoadedKernel (internal: tests and benchmarks
// reach the raw CUfunction through it).
#pragma once

#include <memory>

#include "driver/launch.hpp"
#include "kjit/plan.hpp"
#include "kjit/runtime.hpp"

namespace kjit {

/// A kernel loaded on one device: the compiled artifacts, the library handle that owns the
/// function, and what the driver says of the function.
class LoadedKernel {
 public:
  std::shared_ptr<const CompiledKernel> compiled;
  int device = 0;
  /// The primary context of `device`, which `function` belongs to.
  CUcontext context = nullptr;
  /// Limits of `device`, taken at load time so that checked launches need no lookup.
  DeviceLimits device_limits;
  driver::LoadedLibrary library;
  CUfunction function = nullptr;
  FunctionLimits limits;
};

}  // namespace kjit
