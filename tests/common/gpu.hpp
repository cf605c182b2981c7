// SPDX-License-Identifier: Apache-2.0
// Helpers for the GPU suite: one runtime, one device, one stream, device buffers, fresh seeds.
// Everything goes through kjit's dlopen()ed driver, so the suite builds and starts (and skips)
// on machines without libcuda.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/device_buffer.hpp"
#include "common/host_data.hpp"
#include "driver/driver_api.hpp"
#include "kjit/error.hpp"
#include "kjit/runtime.hpp"

namespace kjit::test {

inline const driver::DriverApi& cu() { return driver::driver_api(); }

/// Throws DriverError naming the call when `result` is not CUDA_SUCCESS.
inline void check_cu(CUresult result, const char* call) { driver::check(result, call); }

/// The device the suite runs on (KJIT_TEST_DEVICE, default 0).
inline int device() {
  static const int ordinal = [] {
    const char* text = std::getenv("KJIT_TEST_DEVICE");
    return text != nullptr ? std::atoi(text) : 0;
  }();
  return ordinal;
}

/// Makes the device's primary context current on the calling thread (the context kjit's
/// runtime launches into) and returns it.
inline CUcontext context() {
  static const CUcontext ctx = [] {
    CUdevice dev = 0;
    check_cu(cu().cuDeviceGet(&dev, device()), "cuDeviceGet");
    CUcontext c = nullptr;
    check_cu(cu().cuDevicePrimaryCtxRetain(&c, dev), "cuDevicePrimaryCtxRetain");
    return c;
  }();
  CUcontext current = nullptr;
  cu().cuCtxGetCurrent(&current);
  if (current != ctx) check_cu(cu().cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  return ctx;
}

/// The suite's runtime: its own cache directory under the build tree, so test runs do not
/// touch the user's cache.
inline Runtime& runtime() {
  static Runtime rt([] {
    Settings settings = Settings::from_env();
    if (std::getenv("KJIT_CACHE_DIR") == nullptr) {
      settings.cache_dir = std::string(KJIT_BINARY_DIR) + "/test-cache";
    }
    return settings;
  }());
  context();
  return rt;
}

inline Arch device_arch() { return runtime().device_limits(device()).arch; }

/// A non-blocking stream on the suite's device.
inline Stream stream() {
  static const CUstream s = [] {
    context();
    CUstream created = nullptr;
    check_cu(cu().cuStreamCreate(&created, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return created;
  }();
  return reinterpret_cast<Stream>(s);
}

/// Waits for the suite's stream and throws on any asynchronous error.
inline void sync() {
  context();
  check_cu(cu().cuStreamSynchronize(reinterpret_cast<CUstream>(stream())), "cuStreamSynchronize");
}

/// Device memory on the suite's device: makes the suite's context current before allocating,
/// so a test may allocate before anything else touched the GPU.
class DeviceBuffer : public DeviceMemory {
 public:
  explicit DeviceBuffer(std::size_t bytes) : DeviceMemory((context(), bytes)) {}
};

}  // namespace kjit::test
