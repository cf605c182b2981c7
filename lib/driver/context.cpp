// SPDX-License-Identifier: Apache-2.0
#include "driver/context.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "driver/driver_api.hpp"
#include "kjit/error.hpp"

namespace kjit::driver {

PrimaryContext::PrimaryContext(int ordinal) {
  const DriverApi& cu = loaded_api();
  int count = 0;
  check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    throw DriverError(
        fmt::format("device {} does not exist: the driver sees {} device(s)", ordinal, count),
        CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet");
  }
  check(cu.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check(cu.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
}

PrimaryContext::~PrimaryContext() { release(); }

PrimaryContext::PrimaryContext(PrimaryContext&& other) noexcept
    : device_(other.device_), context_(std::exchange(other.context_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& other) noexcept {
  if (this != &other) {
    release();
    device_ = other.device_;
    context_ = std::exchange(other.context_, nullptr);
  }
  return *this;
}

void PrimaryContext::release() noexcept {
  if (context_ == nullptr) return;
  try {
    // Fails harmlessly (CUDA_ERROR_DEINITIALIZED) when run from a static destructor after the
    // driver shut down; there is nothing left to release then.
    (void)loaded_api().cuDevicePrimaryCtxRelease(device_);
  } catch (...) {
  }
  context_ = nullptr;
}

ScopedContext::ScopedContext(CUcontext context) {
  const DriverApi& cu = loaded_api();
  check(cu.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != context) {
    check(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent");
    switched_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (!switched_) return;
  try {
    (void)loaded_api().cuCtxSetCurrent(previous_);
  } catch (...) {
  }
}

DeviceLimits query_device_limits(int ordinal) {
  const DriverApi& cu = loaded_api();
  int count = 0;
  check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    throw DriverError(
        fmt::format("device {} does not exist: the driver sees {} device(s)", ordinal, count),
        CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet");
  }
  CUdevice device = 0;
  check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  const auto attribute = [&](CUdevice_attribute which, const char* what) {
    int value = 0;
    const CUresult r = cu.cuDeviceGetAttribute(&value, which, device);
    if (r != CUDA_SUCCESS) {
      throw DriverError(fmt::format("cuDeviceGetAttribute({}) of device {} failed: {}", what,
                                    ordinal, describe(r)),
                        static_cast<int>(r), "cuDeviceGetAttribute");
    }
    return value;
  };
#define KJIT_ATTRIBUTE(name) attribute(CU_DEVICE_ATTRIBUTE_##name, #name)
  const Arch arch{KJIT_ATTRIBUTE(COMPUTE_CAPABILITY_MAJOR),
                  KJIT_ATTRIBUTE(COMPUTE_CAPABILITY_MINOR)};
  // Registers per thread and the allocation unit are not device attributes; they have been
  // 255 and 256 since sm_50, which the built-in table (or its defaults) carries.
  DeviceLimits limits;
  try {
    limits = DeviceLimits::for_arch(arch);
  } catch (const InvalidArgument&) {
    limits = DeviceLimits{};
  }
  limits.arch = arch;
  char name[256] = {};
  check(cu.cuDeviceGetName(name, static_cast<int>(sizeof name), device), "cuDeviceGetName");
  limits.name = name;
  limits.sm_count = KJIT_ATTRIBUTE(MULTIPROCESSOR_COUNT);
  limits.warp_size = KJIT_ATTRIBUTE(WARP_SIZE);
  limits.max_threads_per_block = KJIT_ATTRIBUTE(MAX_THREADS_PER_BLOCK);
  limits.max_block_dim = {KJIT_ATTRIBUTE(MAX_BLOCK_DIM_X), KJIT_ATTRIBUTE(MAX_BLOCK_DIM_Y),
                          KJIT_ATTRIBUTE(MAX_BLOCK_DIM_Z)};
  limits.max_grid_dim = {KJIT_ATTRIBUTE(MAX_GRID_DIM_X), KJIT_ATTRIBUTE(MAX_GRID_DIM_Y),
                         KJIT_ATTRIBUTE(MAX_GRID_DIM_Z)};
  limits.max_smem_per_block = KJIT_ATTRIBUTE(MAX_SHARED_MEMORY_PER_BLOCK);
  limits.max_smem_per_block_optin = KJIT_ATTRIBUTE(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  limits.max_smem_per_sm = KJIT_ATTRIBUTE(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
  limits.reserved_smem_per_block = KJIT_ATTRIBUTE(RESERVED_SHARED_MEMORY_PER_BLOCK);
  limits.regs_per_block = KJIT_ATTRIBUTE(MAX_REGISTERS_PER_BLOCK);
  limits.regs_per_sm = KJIT_ATTRIBUTE(MAX_REGISTERS_PER_MULTIPROCESSOR);
  limits.max_threads_per_sm = KJIT_ATTRIBUTE(MAX_THREADS_PER_MULTIPROCESSOR);
  limits.max_blocks_per_sm = KJIT_ATTRIBUTE(MAX_BLOCKS_PER_MULTIPROCESSOR);
  limits.l2_bytes = KJIT_ATTRIBUTE(L2_CACHE_SIZE);
  // Peak DRAM bandwidth: the clock is in kHz, two transfers per clock, the bus width in bits. A
  // driver that reports neither keeps the arch's built-in figure.
  const std::int64_t memory_khz = KJIT_ATTRIBUTE(MEMORY_CLOCK_RATE);
  const std::int64_t bus_bits = KJIT_ATTRIBUTE(GLOBAL_MEMORY_BUS_WIDTH);
  if (memory_khz > 0 && bus_bits > 0) {
    limits.dram_bytes_per_second = memory_khz * 1000 * 2 * bus_bits / 8;
  }
#undef KJIT_ATTRIBUTE
  return limits;
}

}  // namespace kjit::driver
