// SPDX-License-Identifier: Apache-2.0
#include "driver/memory.hpp"

#include <fmt/format.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "driver/driver_api.hpp"
#include "kjit/error.hpp"

namespace kjit::driver {
namespace {

constexpr int kMaxPoolDevices = 64;

CUmemoryPool pool_of(int device) {
  static std::mutex mutex;
  static std::array<CUmemoryPool, kMaxPoolDevices> pools{};
  if (device < 0 || device >= kMaxPoolDevices) {
    throw InvalidArgument(fmt::format("workspace pool: device {} is out of range 0..{}", device,
                                      kMaxPoolDevices - 1));
  }
  std::lock_guard lock(mutex);
  if (pools[static_cast<std::size_t>(device)] != nullptr) {
    return pools[static_cast<std::size_t>(device)];
  }
  const DriverApi& cu = loaded_api();
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = device;
  CUmemoryPool pool = nullptr;
  check(cu.cuMemPoolCreate(&pool, &props), "cuMemPoolCreate");
  // Keep what the pool reserved across synchronizations: the next call reuses it.
  cuuint64_t threshold = UINT64_MAX;
  check(cu.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold),
        "cuMemPoolSetAttribute");
  pools[static_cast<std::size_t>(device)] = pool;
  return pool;
}

}  // namespace

CUdeviceptr allocate_workspace(int device, std::size_t bytes, CUstream stream, const char* what) {
  const DriverApi& cu = loaded_api();
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(cu.cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  CUdeviceptr ptr = 0;
  const CUresult result = capture == CU_STREAM_CAPTURE_STATUS_NONE
                              ? cu.cuMemAllocFromPoolAsync(&ptr, bytes, pool_of(device), stream)
                              : cu.cuMemAllocAsync(&ptr, bytes, stream);
  if (result != CUDA_SUCCESS) {
    throw DriverError(
        fmt::format("{}: allocating the {}-byte workspace ({}) failed: {}", what, bytes,
                    capture == CU_STREAM_CAPTURE_STATUS_NONE ? "cuMemAllocFromPoolAsync"
                                                             : "cuMemAllocAsync under capture",
                    describe(result)),
        static_cast<int>(result),
        capture == CU_STREAM_CAPTURE_STATUS_NONE ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync");
  }
  return ptr;
}

}  // namespace kjit::driver
