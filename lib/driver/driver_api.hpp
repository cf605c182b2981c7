// SPDX-License-Identifier: Apache-2.0
// The CUDA driver, loaded with dlopen on first use. Only cuda.h's types and prototypes are
// used at build time; nothing links against libcuda, so kjit loads on machines without it.
#pragma once

#include <cuda.h>

#include <string>

namespace kjit::driver {

/// Entry points of libcuda resolved through cuGetProcAddress (with the CUDA version each was
/// introduced at), so the ABI matches the version cuda.h was built against.
struct DriverApi {
  int driver_version = 0;

  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuInit) cuInit = nullptr;
  decltype(&::cuDeviceGetCount) cuDeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDeviceGetName) cuDeviceGetName = nullptr;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) cuDevicePrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) cuDevicePrimaryCtxRelease = nullptr;
  decltype(&::cuCtxGetCurrent) cuCtxGetCurrent = nullptr;
  decltype(&::cuCtxSetCurrent) cuCtxSetCurrent = nullptr;
  decltype(&::cuCtxGetDevice) cuCtxGetDevice = nullptr;
  decltype(&::cuCtxSynchronize) cuCtxSynchronize = nullptr;
  decltype(&::cuLibraryLoadData) cuLibraryLoadData = nullptr;
  decltype(&::cuLibraryUnload) cuLibraryUnload = nullptr;
  decltype(&::cuLibraryGetKernel) cuLibraryGetKernel = nullptr;
  decltype(&::cuKernelGetFunction) cuKernelGetFunction = nullptr;
  decltype(&::cuFuncGetAttribute) cuFuncGetAttribute = nullptr;
  decltype(&::cuFuncSetAttribute) cuFuncSetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor)
      cuOccupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuLaunchKernel) cuLaunchKernel = nullptr;
  decltype(&::cuLaunchKernelEx) cuLaunchKernelEx = nullptr;
  decltype(&::cuStreamIsCapturing) cuStreamIsCapturing = nullptr;
  decltype(&::cuStreamGetCtx) cuStreamGetCtx = nullptr;
  decltype(&::cuStreamCreate) cuStreamCreate = nullptr;
  decltype(&::cuStreamDestroy) cuStreamDestroy = nullptr;
  decltype(&::cuStreamSynchronize) cuStreamSynchronize = nullptr;
  decltype(&::cuStreamBeginCapture) cuStreamBeginCapture = nullptr;
  decltype(&::cuStreamEndCapture) cuStreamEndCapture = nullptr;
  decltype(&::cuGraphInstantiate) cuGraphInstantiate = nullptr;
  decltype(&::cuGraphLaunch) cuGraphLaunch = nullptr;
  decltype(&::cuGraphDestroy) cuGraphDestroy = nullptr;
  decltype(&::cuGraphExecDestroy) cuGraphExecDestroy = nullptr;
  decltype(&::cuMemAlloc) cuMemAlloc = nullptr;
  decltype(&::cuMemFree) cuMemFree = nullptr;
  /// Stream-ordered allocation (capture-safe: becomes a graph memory node under capture).
  decltype(&::cuMemAllocAsync) cuMemAllocAsync = nullptr;
  decltype(&::cuMemFreeAsync) cuMemFreeAsync = nullptr;
  /// kjit's own pool of workspaces (memory.hpp): kept reserved between calls.
  decltype(&::cuMemPoolCreate) cuMemPoolCreate = nullptr;
  decltype(&::cuMemPoolSetAttribute) cuMemPoolSetAttribute = nullptr;
  decltype(&::cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync = nullptr;
  decltype(&::cuMemGetInfo) cuMemGetInfo = nullptr;
  decltype(&::cuMemcpyHtoD) cuMemcpyHtoD = nullptr;
  decltype(&::cuMemcpyDtoH) cuMemcpyDtoH = nullptr;
  decltype(&::cuMemcpyDtoDAsync) cuMemcpyDtoDAsync = nullptr;
  decltype(&::cuMemsetD8Async) cuMemsetD8Async = nullptr;
  decltype(&::cuMemsetD32Async) cuMemsetD32Async = nullptr;
  decltype(&::cuEventCreate) cuEventCreate = nullptr;
  decltype(&::cuEventDestroy) cuEventDestroy = nullptr;
  decltype(&::cuEventRecord) cuEventRecord = nullptr;
  decltype(&::cuEventSynchronize) cuEventSynchronize = nullptr;
  decltype(&::cuEventElapsedTime) cuEventElapsedTime = nullptr;
  decltype(&::cuEventQuery) cuEventQuery = nullptr;
  /// TMA tensor maps (Runtime::encode_tensor_map): host-side encoding, no context needed.
  decltype(&::cuTensorMapEncodeTiled) cuTensorMapEncodeTiled = nullptr;
};

/// The process-wide driver API, loaded and cuInit()ed on first call from `library` (a soname or
/// a path, e.g. Settings::cuda_driver_library). Empty: the driver this process already loaded,
/// else "libcuda.so.1". Throws DriverError saying why when libcuda is missing, is the toolkit's
/// stub, is too old (CUDA < 12.0), lacks an entry point, or cuInit fails (e.g.
/// CUDA_ERROR_NO_DEVICE). Each library is tried once: later calls return the same object or
/// rethrow the same error. Thread-safe.
const DriverApi& driver_api(const std::string& library = {});

/// driver_api({}): the driver this process loaded, which the helpers of this layer call
/// through. Throws like driver_api().
const DriverApi& loaded_api();

/// True when driver_api() would succeed; otherwise `why` says why. Never throws.
bool driver_loadable(const std::string& library, std::string* why) noexcept;

/// "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered)" once a driver is
/// loaded; without one "CUDA_ERROR_ILLEGAL_ADDRESS (700)" from a built-in table of names, or
/// "CUresult 12345" for a value the table lacks.
std::string describe(CUresult result);

/// Throws DriverError naming `call` and the result when `result` is not CUDA_SUCCESS.
void check(CUresult result, const char* call);

}  // namespace kjit::driver
