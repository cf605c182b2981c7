// SPDX-License-Identifier: Apache-2.0
// Device memory for tests and benchmarks, through kjit's dlopen()ed driver. The caller makes
// the right context current first.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "driver/driver_api.hpp"
#include "kjit/error.hpp"

namespace kjit::test {

/// Move-only owner of one cuMemAlloc allocation in the current context.
class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) : bytes_(bytes) {
    // At least one byte, so that empty tensors still get a valid, unique pointer.
    driver::check(driver::driver_api().cuMemAlloc(&ptr_, bytes == 0 ? 1 : bytes), "cuMemAlloc");
  }
  ~DeviceMemory() {
    if (ptr_ != 0) driver::driver_api().cuMemFree(ptr_);
  }
  DeviceMemory(DeviceMemory&& other) noexcept
      : ptr_(std::exchange(other.ptr_, 0)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceMemory& operator=(DeviceMemory&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  CUdeviceptr ptr() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }

  /// Synchronous copy in (the context is synchronized first, so pending kernels finish).
  void upload(const void* host, std::size_t bytes) {
    require_fits(bytes, "upload");
    driver::check(driver::driver_api().cuCtxSynchronize(), "cuCtxSynchronize");
    driver::check(driver::driver_api().cuMemcpyHtoD(ptr_, host, bytes), "cuMemcpyHtoD");
  }
  template <typename T>
  void upload(const std::vector<T>& host) {
    upload(host.data(), host.size() * sizeof(T));
  }
  void download(void* host, std::size_t bytes) const {
    require_fits(bytes, "download");
    driver::check(driver::driver_api().cuCtxSynchronize(), "cuCtxSynchronize");
    driver::check(driver::driver_api().cuMemcpyDtoH(host, ptr_, bytes), "cuMemcpyDtoH");
  }
  template <typename T>
  std::vector<T> download_as(std::size_t count) const {
    std::vector<T> host(count);
    download(host.data(), count * sizeof(T));
    return host;
  }
  /// Fills every byte with `byte` (0xFF is NaN in every float format), so unwritten outputs
  /// show up in comparisons.
  void poison(std::uint8_t byte = 0xFF) {
    driver::check(driver::driver_api().cuCtxSynchronize(), "cuCtxSynchronize");
    driver::check(
        driver::driver_api().cuMemsetD8Async(ptr_, byte, bytes_ == 0 ? 1 : bytes_, nullptr),
        "cuMemsetD8Async");
    driver::check(driver::driver_api().cuCtxSynchronize(), "cuCtxSynchronize");
  }

 private:
  void require_fits(std::size_t bytes, const char* what) const {
    if (bytes > bytes_) {
      throw Error(fmt::format("DeviceMemory::{} of {} bytes into a buffer of {} bytes", what, bytes,
                              bytes_));
    }
  }

  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

}  // namespace kjit::test
