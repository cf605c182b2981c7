// SPDX-License-Identifier: Apache-2.0
#include "driver/library.hpp"

#include <fmt/format.h>

#include <utility>

#include "driver/driver_api.hpp"
#include "driver/launch.hpp"
#include "kjit/error.hpp"

namespace kjit::driver {

LoadedLibrary::LoadedLibrary(std::string_view image) {
  if (image.empty()) {
    throw DriverError("cuLibraryLoadData: the cubin is empty", CUDA_ERROR_INVALID_IMAGE,
                      "cuLibraryLoadData");
  }
  const DriverApi& cu = loaded_api();
  const CUresult r =
      cu.cuLibraryLoadData(&library_, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
  if (r != CUDA_SUCCESS) {
    library_ = nullptr;
    const char* hint = "";
    if (r == CUDA_ERROR_NO_BINARY_FOR_GPU) {
      hint = " (the cubin was compiled for another arch than this device)";
    } else if (r == CUDA_ERROR_INVALID_IMAGE) {
      hint = " (the cubin bytes are damaged or not a cubin)";
    }
    throw DriverError(fmt::format("cuLibraryLoadData of a {}-byte cubin failed: {}{}", image.size(),
                                  describe(r), hint),
                      static_cast<int>(r), "cuLibraryLoadData");
  }
}

LoadedLibrary::~LoadedLibrary() { unload(); }

LoadedLibrary::LoadedLibrary(LoadedLibrary&& other) noexcept
    : library_(std::exchange(other.library_, nullptr)), functions_(std::move(other.functions_)) {
  other.functions_.clear();
}

LoadedLibrary& LoadedLibrary::operator=(LoadedLibrary&& other) noexcept {
  if (this != &other) {
    unload();
    library_ = std::exchange(other.library_, nullptr);
    functions_ = std::move(other.functions_);
    other.functions_.clear();
  }
  return *this;
}

void LoadedLibrary::unload() noexcept {
  if (library_ == nullptr) return;
  forget_functions(functions_.data(), functions_.size());
  functions_.clear();
  try {
    (void)loaded_api().cuLibraryUnload(library_);
  } catch (...) {
  }
  library_ = nullptr;
}

CUfunction LoadedLibrary::function(const std::string& lowered_name) {
  if (library_ == nullptr) {
    throw DriverError(fmt::format("no library is loaded to look up {} in", lowered_name));
  }
  const DriverApi& cu = loaded_api();
  CUkernel kernel = nullptr;
  if (const CUresult r = cu.cuLibraryGetKernel(&kernel, library_, lowered_name.c_str());
      r != CUDA_SUCCESS) {
    throw DriverError(
        fmt::format(
            "cuLibraryGetKernel({}) failed: {}{}", lowered_name, describe(r),
            r == CUDA_ERROR_NOT_FOUND ? " (the cubin has no kernel of that lowered name)" : ""),
        static_cast<int>(r), "cuLibraryGetKernel");
  }
  CUfunction function = nullptr;
  if (const CUresult r = cu.cuKernelGetFunction(&function, kernel); r != CUDA_SUCCESS) {
    throw DriverError(
        fmt::format("cuKernelGetFunction({}) failed: {}{}", lowered_name, describe(r),
                    r == CUDA_ERROR_INVALID_CONTEXT
                        ? " (no context is current: make the device's primary context current)"
                        : ""),
        static_cast<int>(r), "cuKernelGetFunction");
  }
  functions_.push_back(function);
  return function;
}

}  // namespace kjit::driver
