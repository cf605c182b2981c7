// SPDX-License-Identifier: Apache-2.0
#include "driver/launch.hpp"

#include <fmt/format.h>

#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "kjit/error.hpp"

namespace kjit::driver {
namespace {

/// The MAX_DYNAMIC_SHARED_SIZE_BYTES value each function was raised to. Launches whose static
/// and dynamic shared memory together stay within 48 KiB never look here; larger ones take a
/// shared lock and one hash lookup.
struct OptInCache {
  std::shared_mutex mutex;
  std::unordered_map<CUfunction, std::uint32_t> raised;
};

OptInCache& opt_in_cache() {
  // Leaked: LoadedLibrary destructors may run during static destruction.
  static OptInCache* cache = new OptInCache;
  return *cache;
}

void opt_in(const DriverApi& cu, CUfunction function, std::uint32_t bytes) {
  OptInCache& cache = opt_in_cache();
  {
    std::shared_lock lock(cache.mutex);
    auto it = cache.raised.find(function);
    if (it != cache.raised.end() && it->second >= bytes) return;
  }
  std::unique_lock lock(cache.mutex);
  auto& raised = cache.raised[function];
  if (raised >= bytes) return;
  const CUresult r = cu.cuFuncSetAttribute(
      function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes));
  if (r != CUDA_SUCCESS) {
    throw DriverError(fmt::format("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {}) failed: "
                                  "{} (opting into more than the default 48 KiB of static and "
                                  "dynamic shared memory)",
                                  bytes, describe(r)),
                      static_cast<int>(r), "cuFuncSetAttribute");
  }
  raised = bytes;
}

}  // namespace

FunctionLimits function_limits(CUfunction function) {
  const DriverApi& cu = loaded_api();
  const auto attribute = [&](CUfunction_attribute which, const char* what) {
    int value = 0;
    const CUresult r = cu.cuFuncGetAttribute(&value, which, function);
    if (r != CUDA_SUCCESS) {
      throw DriverError(fmt::format("cuFuncGetAttribute({}) failed: {}", what, describe(r)),
                        static_cast<int>(r), "cuFuncGetAttribute");
    }
    return value;
  };
  FunctionLimits limits;
  limits.max_threads_per_block =
      attribute(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, "MAX_THREADS_PER_BLOCK");
  limits.registers = attribute(CU_FUNC_ATTRIBUTE_NUM_REGS, "NUM_REGS");
  limits.static_smem = attribute(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, "SHARED_SIZE_BYTES");
  limits.local_bytes = attribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, "LOCAL_SIZE_BYTES");
  limits.max_dynamic_smem =
      attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, "MAX_DYNAMIC_SHARED_SIZE_BYTES");
  return limits;
}

void launch(CUfunction function, const LaunchShape& shape, std::uint32_t static_smem,
            CUstream stream, void** args) {
  const DriverApi& cu = loaded_api();
  // The driver's default ceiling is 48 KiB of static and dynamic shared memory together.
  if (std::uint64_t{shape.dynamic_smem} + static_smem > kDefaultDynamicSmemLimit) {
    opt_in(cu, function, shape.dynamic_smem);
  }
  CUlaunchConfig config{};
  config.gridDimX = shape.grid.x;
  config.gridDimY = shape.grid.y;
  config.gridDimZ = shape.grid.z;
  config.blockDimX = shape.block.x;
  config.blockDimY = shape.block.y;
  config.blockDimZ = shape.block.z;
  config.sharedMemBytes = shape.dynamic_smem;
  config.hStream = stream;
  CUlaunchAttribute attributes[2]{};
  unsigned int count = 0;
  if (shape.overlaps_previous) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attributes[count].value.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  const bool clustered = shape.cluster.count() > 1;
  if (clustered) {
    attributes[count].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attributes[count].value.clusterDim.x = shape.cluster.x;
    attributes[count].value.clusterDim.y = shape.cluster.y;
    attributes[count].value.clusterDim.z = shape.cluster.z;
    ++count;
  }
  config.attrs = count > 0 ? attributes : nullptr;
  config.numAttrs = count;
  const CUresult r = cu.cuLaunchKernelEx(&config, function, args, nullptr);
  if (r != CUDA_SUCCESS) {
    throw DriverError(
        fmt::format("cuLaunchKernelEx failed: {} (grid ({}, {}, {}), block ({}, {}, {}), {} "
                    "bytes dynamic shared memory{}{}){}",
                    describe(r), shape.grid.x, shape.grid.y, shape.grid.z, shape.block.x,
                    shape.block.y, shape.block.z, shape.dynamic_smem,
                    clustered ? fmt::format(", cluster ({}, {}, {})", shape.cluster.x,
                                            shape.cluster.y, shape.cluster.z)
                              : std::string(),
                    shape.overlaps_previous ? ", programmatic dependent launch" : "",
                    is_sticky(r) ? "; the CUDA context is lost (sticky device fault)" : ""),
        static_cast<int>(r), "cuLaunchKernelEx");
  }
}

bool is_sticky(CUresult result) noexcept {
  switch (result) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_NVLINK_UNCORRECTABLE:
    case CUDA_ERROR_CONTAINED:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_TENSOR_MEMORY_LEAK:
    case CUDA_ERROR_EXTERNAL_DEVICE:
      return true;
    default:
      return false;
  }
}

bool stream_is_capturing(CUstream stream) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const CUresult r = loaded_api().cuStreamIsCapturing(stream, &status);
  // Querying the legacy stream while another stream captures in global mode is itself illegal
  // (it would join the capture): that stream is as good as capturing.
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) return true;
  check(r, "cuStreamIsCapturing");
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

void forget_functions(const CUfunction* functions, std::size_t count) noexcept {
  if (count == 0) return;
  try {
    OptInCache& cache = opt_in_cache();
    std::unique_lock lock(cache.mutex);
    for (std::size_t i = 0; i < count; ++i) cache.raised.erase(functions[i]);
  } catch (...) {
  }
}

}  // namespace kjit::driver
