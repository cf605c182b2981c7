// SPDX-License-Identifier: Apache-2.0
// Device contexts and device limits from the driver.
#pragma once

#include <cuda.h>

#include "kjit/device.hpp"

namespace kjit::driver {

/// A retained primary context of one device (the context the CUDA runtime and PyTorch use, so
/// kjit's allocations and functions are shared with them). Move-only; releases on destruction.
class PrimaryContext {
 public:
  /// Retains the primary context of device `ordinal`; throws DriverError (e.g. an ordinal past
  /// cuDeviceGetCount, CUDA_ERROR_INVALID_DEVICE).
  explicit PrimaryContext(int ordinal);
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& other) noexcept;
  PrimaryContext& operator=(PrimaryContext&& other) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUcontext get() const noexcept { return context_; }
  CUdevice device() const noexcept { return device_; }

 private:
  void release() noexcept;

  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
};

/// Makes a context current on the calling thread for a scope and restores the previous one
/// (possibly none) on exit, so that kjit never leaves a caller's thread on another context.
class ScopedContext {
 public:
  /// Throws DriverError when the context cannot be made current.
  explicit ScopedContext(CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
  bool switched_ = false;
};

/// The limits of device `ordinal` as the driver reports them (cuDeviceGetAttribute): arch from
/// the compute capability, name, SM count, block/grid dimensions, shared memory (default,
/// opt-in, per SM, reserved per block), registers, threads and blocks per SM, L2 size. Fields
/// the driver does not report (registers per thread, allocation unit) come from the built-in
/// table. Needs no context.
DeviceLimits query_device_limits(int ordinal);

}  // namespace kjit::driver
