// SPDX-License-Identifier: Apache-2.0
// Loading libcuda with dlopen: every entry point is resolved through cuGetProcAddress at the
// CUDA_VERSION of the cuda.h we were built with, so each pointer has the ABI its declaration
// says (cuMemAlloc is cuMemAlloc_v2, ...), whatever newer variants the installed driver has.
#include "driver/driver_api.hpp"

#include <fmt/format.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include "kjit/error.hpp"
#include "support/dynlib.hpp"

namespace kjit::driver {
namespace {

constexpr const char* kDefaultLibrary = "libcuda.so.1";
/// cuLibraryLoadData, cuKernelGetFunction and cuGetProcAddress_v2 arrived with CUDA 12.0.
constexpr int kMinimumDriverVersion = 12000;

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);
using DriverGetVersion = CUresult (*)(int*);

/// Names of the results a driver may return, so that errors can be named even when the library
/// that would name them (cuGetErrorName) is missing or is the stub.
struct ResultName {
  CUresult result;
  const char* name;
};

#define KJIT_RESULT(name) \
  ResultName { name, #name }
constexpr ResultName kResultNames[] = {
    KJIT_RESULT(CUDA_SUCCESS),
    KJIT_RESULT(CUDA_ERROR_ALREADY_ACQUIRED),
    KJIT_RESULT(CUDA_ERROR_ALREADY_MAPPED),
    KJIT_RESULT(CUDA_ERROR_ARRAY_IS_MAPPED),
    KJIT_RESULT(CUDA_ERROR_ASSERT),
    KJIT_RESULT(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER),
    KJIT_RESULT(CUDA_ERROR_CAPTURED_EVENT),
    KJIT_RESULT(CUDA_ERROR_CDP_NOT_SUPPORTED),
    KJIT_RESULT(CUDA_ERROR_CDP_VERSION_MISMATCH),
    KJIT_RESULT(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE),
    KJIT_RESULT(CUDA_ERROR_CONTAINED),
    KJIT_RESULT(CUDA_ERROR_CONTEXT_ALREADY_CURRENT),
    KJIT_RESULT(CUDA_ERROR_CONTEXT_ALREADY_IN_USE),
    KJIT_RESULT(CUDA_ERROR_CONTEXT_IS_DESTROYED),
    KJIT_RESULT(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE),
    KJIT_RESULT(CUDA_ERROR_DEINITIALIZED),
    KJIT_RESULT(CUDA_ERROR_DEVICE_NOT_LICENSED),
    KJIT_RESULT(CUDA_ERROR_DEVICE_UNAVAILABLE),
    KJIT_RESULT(CUDA_ERROR_ECC_UNCORRECTABLE),
    KJIT_RESULT(CUDA_ERROR_EXTERNAL_DEVICE),
    KJIT_RESULT(CUDA_ERROR_FILE_NOT_FOUND),
    KJIT_RESULT(CUDA_ERROR_FUNCTION_NOT_LOADED),
    KJIT_RESULT(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
    KJIT_RESULT(CUDA_ERROR_HARDWARE_STACK_ERROR),
    KJIT_RESULT(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED),
    KJIT_RESULT(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED),
    KJIT_RESULT(CUDA_ERROR_ILLEGAL_ADDRESS),
    KJIT_RESULT(CUDA_ERROR_ILLEGAL_INSTRUCTION),
    KJIT_RESULT(CUDA_ERROR_ILLEGAL_STATE),
    KJIT_RESULT(CUDA_ERROR_INVALID_ADDRESS_SPACE),
    KJIT_RESULT(CUDA_ERROR_INVALID_CLUSTER_SIZE),
    KJIT_RESULT(CUDA_ERROR_INVALID_CONTEXT),
    KJIT_RESULT(CUDA_ERROR_INVALID_DEVICE),
    KJIT_RESULT(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT),
    KJIT_RESULT(CUDA_ERROR_INVALID_HANDLE),
    KJIT_RESULT(CUDA_ERROR_INVALID_IMAGE),
    KJIT_RESULT(CUDA_ERROR_INVALID_PC),
    KJIT_RESULT(CUDA_ERROR_INVALID_PTX),
    KJIT_RESULT(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION),
    KJIT_RESULT(CUDA_ERROR_INVALID_RESOURCE_TYPE),
    KJIT_RESULT(CUDA_ERROR_INVALID_SOURCE),
    KJIT_RESULT(CUDA_ERROR_INVALID_VALUE),
    KJIT_RESULT(CUDA_ERROR_JIT_COMPILATION_DISABLED),
    KJIT_RESULT(CUDA_ERROR_JIT_COMPILER_NOT_FOUND),
    KJIT_RESULT(CUDA_ERROR_KEY_ROTATION),
    KJIT_RESULT(CUDA_ERROR_LAUNCH_FAILED),
    KJIT_RESULT(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING),
    KJIT_RESULT(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    KJIT_RESULT(CUDA_ERROR_LAUNCH_TIMEOUT),
    KJIT_RESULT(CUDA_ERROR_LOSSY_QUERY),
    KJIT_RESULT(CUDA_ERROR_MAP_FAILED),
    KJIT_RESULT(CUDA_ERROR_MISALIGNED_ADDRESS),
    KJIT_RESULT(CUDA_ERROR_MPS_CLIENT_TERMINATED),
    KJIT_RESULT(CUDA_ERROR_MPS_CONNECTION_FAILED),
    KJIT_RESULT(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED),
    KJIT_RESULT(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED),
    KJIT_RESULT(CUDA_ERROR_MPS_RPC_FAILURE),
    KJIT_RESULT(CUDA_ERROR_MPS_SERVER_NOT_READY),
    KJIT_RESULT(CUDA_ERROR_NOT_FOUND),
    KJIT_RESULT(CUDA_ERROR_NOT_INITIALIZED),
    KJIT_RESULT(CUDA_ERROR_NOT_MAPPED),
    KJIT_RESULT(CUDA_ERROR_NOT_MAPPED_AS_ARRAY),
    KJIT_RESULT(CUDA_ERROR_NOT_MAPPED_AS_POINTER),
    KJIT_RESULT(CUDA_ERROR_NOT_PERMITTED),
    KJIT_RESULT(CUDA_ERROR_NOT_READY),
    KJIT_RESULT(CUDA_ERROR_NOT_SUPPORTED),
    KJIT_RESULT(CUDA_ERROR_NO_BINARY_FOR_GPU),
    KJIT_RESULT(CUDA_ERROR_NO_DEVICE),
    KJIT_RESULT(CUDA_ERROR_NVLINK_UNCORRECTABLE),
    KJIT_RESULT(CUDA_ERROR_OPERATING_SYSTEM),
    KJIT_RESULT(CUDA_ERROR_OUT_OF_MEMORY),
    KJIT_RESULT(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED),
    KJIT_RESULT(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED),
    KJIT_RESULT(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
    KJIT_RESULT(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE),
    KJIT_RESULT(CUDA_ERROR_PROFILER_ALREADY_STARTED),
    KJIT_RESULT(CUDA_ERROR_PROFILER_ALREADY_STOPPED),
    KJIT_RESULT(CUDA_ERROR_PROFILER_DISABLED),
    KJIT_RESULT(CUDA_ERROR_PROFILER_NOT_INITIALIZED),
    KJIT_RESULT(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED),
    KJIT_RESULT(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_MERGE),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
    KJIT_RESULT(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
    KJIT_RESULT(CUDA_ERROR_STUB_LIBRARY),
    KJIT_RESULT(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH),
    KJIT_RESULT(CUDA_ERROR_SYSTEM_NOT_READY),
    KJIT_RESULT(CUDA_ERROR_TENSOR_MEMORY_LEAK),
    KJIT_RESULT(CUDA_ERROR_TIMEOUT),
    KJIT_RESULT(CUDA_ERROR_TOO_MANY_PEERS),
    KJIT_RESULT(CUDA_ERROR_UNKNOWN),
    KJIT_RESULT(CUDA_ERROR_UNMAP_FAILED),
    KJIT_RESULT(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC),
    KJIT_RESULT(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY),
    KJIT_RESULT(CUDA_ERROR_UNSUPPORTED_LIMIT),
    KJIT_RESULT(CUDA_ERROR_UNSUPPORTED_PTX_VERSION),
};
#undef KJIT_RESULT

const char* builtin_name(CUresult result) noexcept {
  for (const ResultName& entry : kResultNames) {
    if (entry.result == result) return entry.name;
  }
  return nullptr;
}

std::string version_text(int version) {
  return fmt::format("{}.{}", version / 1000, (version % 1000) / 10);
}

/// One attempt to load a driver library: the API, or the error it failed with.
struct LoadResult {
  std::unique_ptr<DriverApi> api;
  std::string error;
  int result = 0;
  std::string call;
};

/// Set once a library loaded; describe() and the helpers use it without taking a lock.
std::atomic<const DriverApi*> g_loaded{nullptr};
std::atomic<const std::string*> g_loaded_name{nullptr};

std::string normalized(const std::string& library) {
  return library.empty() ? std::string(kDefaultLibrary) : library;
}

std::string stub_hint(CUresult result) {
  if (result != CUDA_ERROR_STUB_LIBRARY) return {};
  return "; this is the CUDA toolkit's link stub (lib64/stubs/libcuda.so), not a driver: point "
         "KJIT_CUDA_DRIVER_LIBRARY at the real libcuda.so.1 (installed with the NVIDIA driver) "
         "or unset it";
}

LoadResult load(const std::string& library) {
  LoadResult out;
  std::string dl_error;
  support::DynamicLibrary lib = support::DynamicLibrary::open(library, &dl_error);
  if (!lib) {
    out.error = fmt::format(
        "cannot load the CUDA driver library '{}': {}. Launching kernels needs the NVIDIA "
        "driver's libcuda.so.1; set KJIT_CUDA_DRIVER_LIBRARY to its path if it is installed "
        "somewhere the loader does not search (planning, codegen and compiling work without it)",
        library, dl_error);
    return out;
  }
  // Never dlclose a driver, even one that failed: libcuda does not survive being unloaded and
  // mapped again, and a second name for the same file would map it again.
  struct KeepMapped {
    support::DynamicLibrary& lib;
    ~KeepMapped() { lib.release(); }
  } keep_mapped{lib};
  const auto fail = [&](CUresult result, const char* call, std::string_view why) {
    out.error = fmt::format("CUDA driver '{}': {} failed with {}{}{}", library, call,
                            describe(result), why, stub_hint(result));
    out.result = static_cast<int>(result);
    out.call = call;
  };

  const auto get_version = reinterpret_cast<DriverGetVersion>(lib.symbol("cuDriverGetVersion"));
  if (get_version == nullptr) {
    out.error =
        fmt::format("'{}' is not a CUDA driver library: it has no cuDriverGetVersion", library);
    return out;
  }
  auto api = std::make_unique<DriverApi>();
  if (const CUresult r = get_version(&api->driver_version); r != CUDA_SUCCESS) {
    fail(r, "cuDriverGetVersion", "");
    return out;
  }
  if (api->driver_version < kMinimumDriverVersion) {
    out.error = fmt::format(
        "the CUDA driver '{}' supports CUDA {}, kjit needs CUDA {} or newer (cuLibraryLoadData, "
        "cuKernelGetFunction): update the NVIDIA driver",
        library, version_text(api->driver_version), version_text(kMinimumDriverVersion));
    return out;
  }
  const auto get_proc = reinterpret_cast<GetProcAddress>(lib.symbol("cuGetProcAddress_v2"));
  if (get_proc == nullptr) {
    out.error = fmt::format(
        "the CUDA driver '{}' (CUDA {}) has no cuGetProcAddress_v2; kjit needs a CUDA 12.0+ "
        "driver",
        library, version_text(api->driver_version));
    return out;
  }

  // Entry points are requested at the CUDA 12.0 ABI, not CUDA_VERSION: CUDA 13.0 gave some
  // base names a new signature without renaming the prototype in cuda.h
  // (cuCtxSynchronize(void) -> cuCtxSynchronize(CUcontext), cuCtxGetDevice gained a context
  // argument), so asking for 13000 returns functions whose ABI does not match the declarations
  // the members are typed with (seen on the H200: CUDA_ERROR_CONTEXT_IS_DESTROYED from
  // cuCtxSynchronize). Renamed entry points (cuMemAlloc -> cuMemAlloc_v2) resolve the same at
  // 12000.
  constexpr int kRequestedApiVersion = 12000;
  std::string missing;
  CUresult missing_result = CUDA_SUCCESS;
  // The name is the entry point's base name ("cuMemAlloc"); the member is whatever cuda.h
  // maps it to (cuMemAlloc_v2), and cuGetProcAddress hands back the variant for CUDA_VERSION.
  const auto resolve = [&](const char* name, auto& member) {
    void* pointer = nullptr;
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    const CUresult r =
        get_proc(name, &pointer, kRequestedApiVersion, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status);
    if (r != CUDA_SUCCESS || pointer == nullptr || status != CU_GET_PROC_ADDRESS_SUCCESS) {
      if (missing_result == CUDA_SUCCESS) missing_result = r;
      missing += missing.empty() ? "" : ", ";
      missing += name;
      if (status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT) missing += " (driver too old)";
      return;
    }
    member = reinterpret_cast<std::remove_reference_t<decltype(member)>>(pointer);
  };
#define KJIT_RESOLVE(name) resolve(#name, api->name)
  KJIT_RESOLVE(cuGetErrorName);
  KJIT_RESOLVE(cuGetErrorString);
  KJIT_RESOLVE(cuInit);
  KJIT_RESOLVE(cuDeviceGetCount);
  KJIT_RESOLVE(cuDeviceGet);
  KJIT_RESOLVE(cuDeviceGetName);
  KJIT_RESOLVE(cuDeviceGetAttribute);
  KJIT_RESOLVE(cuDevicePrimaryCtxRetain);
  KJIT_RESOLVE(cuDevicePrimaryCtxRelease);
  KJIT_RESOLVE(cuCtxGetCurrent);
  KJIT_RESOLVE(cuCtxSetCurrent);
  KJIT_RESOLVE(cuCtxGetDevice);
  KJIT_RESOLVE(cuCtxSynchronize);
  KJIT_RESOLVE(cuLibraryLoadData);
  KJIT_RESOLVE(cuLibraryUnload);
  KJIT_RESOLVE(cuLibraryGetKernel);
  KJIT_RESOLVE(cuKernelGetFunction);
  KJIT_RESOLVE(cuFuncGetAttribute);
  KJIT_RESOLVE(cuFuncSetAttribute);
  KJIT_RESOLVE(cuOccupancyMaxActiveBlocksPerMultiprocessor);
  KJIT_RESOLVE(cuLaunchKernel);
  KJIT_RESOLVE(cuLaunchKernelEx);
  KJIT_RESOLVE(cuStreamIsCapturing);
  KJIT_RESOLVE(cuStreamGetCtx);
  KJIT_RESOLVE(cuStreamCreate);
  KJIT_RESOLVE(cuStreamDestroy);
  KJIT_RESOLVE(cuStreamSynchronize);
  KJIT_RESOLVE(cuStreamBeginCapture);
  KJIT_RESOLVE(cuStreamEndCapture);
  // cuda.h maps cuGraphInstantiate to cuGraphInstantiateWithFlags (3 arguments), but the driver's
  // entry point named "cuGraphInstantiate" is the old 5-argument one at every version: resolve
  // the name the member really has (calling the other segfaulted under graph capture tests).
  resolve("cuGraphInstantiateWithFlags", api->cuGraphInstantiate);
  KJIT_RESOLVE(cuGraphLaunch);
  KJIT_RESOLVE(cuGraphDestroy);
  KJIT_RESOLVE(cuGraphExecDestroy);
  KJIT_RESOLVE(cuMemAlloc);
  KJIT_RESOLVE(cuMemFree);
  KJIT_RESOLVE(cuMemAllocAsync);
  KJIT_RESOLVE(cuMemFreeAsync);
  KJIT_RESOLVE(cuMemPoolCreate);
  KJIT_RESOLVE(cuMemPoolSetAttribute);
  KJIT_RESOLVE(cuMemAllocFromPoolAsync);
  KJIT_RESOLVE(cuMemGetInfo);
  KJIT_RESOLVE(cuMemcpyHtoD);
  KJIT_RESOLVE(cuMemcpyDtoH);
  KJIT_RESOLVE(cuMemcpyDtoDAsync);
  KJIT_RESOLVE(cuMemsetD8Async);
  KJIT_RESOLVE(cuMemsetD32Async);
  KJIT_RESOLVE(cuEventCreate);
  KJIT_RESOLVE(cuEventDestroy);
  KJIT_RESOLVE(cuEventRecord);
  KJIT_RESOLVE(cuEventSynchronize);
  KJIT_RESOLVE(cuEventElapsedTime);
  KJIT_RESOLVE(cuEventQuery);
  KJIT_RESOLVE(cuTensorMapEncodeTiled);
#undef KJIT_RESOLVE
  if (!missing.empty()) {
    out.error = fmt::format("the CUDA driver '{}' (CUDA {}) lacks entry points kjit needs: {}{}{}",
                            library, version_text(api->driver_version), missing,
                            missing_result != CUDA_SUCCESS
                                ? fmt::format(" (cuGetProcAddress: {})", describe(missing_result))
                                : std::string(),
                            stub_hint(missing_result));
    out.result = static_cast<int>(missing_result);
    out.call = "cuGetProcAddress";
    return out;
  }
  if (const CUresult r = api->cuInit(0); r != CUDA_SUCCESS) {
    const char* why = "";
    if (r == CUDA_ERROR_NO_DEVICE) {
      why = " (no CUDA device is visible: check CUDA_VISIBLE_DEVICES and nvidia-smi)";
    } else if (r == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH ||
               r == CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) {
      why = " (the user-space libcuda does not match the kernel driver)";
    }
    // describe() must not use this library's cuGetErrorName yet: it is not the loaded one.
    fail(r, "cuInit", why);
    return out;
  }
  out.api = std::move(api);
  return out;
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, LoadResult> results;
};

Registry& registry() {
  // Leaked on purpose: helpers may run from static destructors after main returns.
  static Registry* instance = new Registry;
  return *instance;
}

const LoadResult& load_once(const std::string& library) {
  Registry& reg = registry();
  std::lock_guard lock(reg.mutex);
  auto it = reg.results.find(library);
  if (it == reg.results.end()) {
    it = reg.results.emplace(library, load(library)).first;
    if (it->second.api && g_loaded.load(std::memory_order_acquire) == nullptr) {
      g_loaded_name.store(&it->first, std::memory_order_release);
      g_loaded.store(it->second.api.get(), std::memory_order_release);
    }
  }
  return it->second;
}

}  // namespace

const DriverApi& driver_api(const std::string& library) {
  // Fast path of every launch: the library that loaded first, compared without a lock.
  // An empty name means "the driver this process uses": whichever loaded first (e.g. the one
  // KJIT_CUDA_DRIVER_LIBRARY named), so that two libcudas never end up in one process.
  if (const DriverApi* api = g_loaded.load(std::memory_order_acquire)) {
    if (library.empty() || *g_loaded_name.load(std::memory_order_acquire) == library) return *api;
  }
  const std::string name = normalized(library);
  const LoadResult& result = load_once(name);
  if (!result.api) throw DriverError(result.error, result.result, result.call);
  return *result.api;
}

const DriverApi& loaded_api() { return driver_api(); }

bool driver_loadable(const std::string& library, std::string* why) noexcept {
  try {
    (void)driver_api(library);
    return true;
  } catch (const std::exception& error) {
    if (why != nullptr) *why = error.what();
  } catch (...) {
    if (why != nullptr) *why = "unknown error while loading the CUDA driver";
  }
  return false;
}

std::string describe(CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (const DriverApi* api = g_loaded.load(std::memory_order_acquire)) {
    if (api->cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (api->cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  if (name == nullptr) name = builtin_name(result);
  if (name != nullptr && text != nullptr) return fmt::format("{} ({})", name, text);
  if (name != nullptr) return fmt::format("{} ({})", name, static_cast<int>(result));
  return fmt::format("CUresult {}", static_cast<int>(result));
}

void check(CUresult result, const char* call) {
  if (result == CUDA_SUCCESS) return;
  throw DriverError(fmt::format("{} failed: {}", call, describe(result)), static_cast<int>(result),
                    call);
}

}  // namespace kjit::driver
