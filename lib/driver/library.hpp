// SPDX-License-Identifier: Apache-2.0
// A loaded cubin (CUlibrary) and the functions in it.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>
#include <vector>

namespace kjit::driver {

/// A CUlibrary loaded from cubin bytes with cuLibraryLoadData: context-independent, unloaded on
/// destruction. Move-only; the destructor never throws.
class LoadedLibrary {
 public:
  LoadedLibrary() = default;
  /// Loads `image` (a cubin; the driver copies it, the bytes need not outlive the call). Throws
  /// DriverError naming the result (CUDA_ERROR_NO_BINARY_FOR_GPU for a cubin of another arch,
  /// CUDA_ERROR_INVALID_IMAGE for damaged bytes).
  explicit LoadedLibrary(std::string_view image);
  ~LoadedLibrary();
  LoadedLibrary(LoadedLibrary&& other) noexcept;
  LoadedLibrary& operator=(LoadedLibrary&& other) noexcept;
  LoadedLibrary(const LoadedLibrary&) = delete;
  LoadedLibrary& operator=(const LoadedLibrary&) = delete;

  explicit operator bool() const noexcept { return library_ != nullptr; }
  CUlibrary get() const noexcept { return library_; }

  /// The function `lowered_name` (the mangled name from nvrtcGetLoweredName) for the calling
  /// thread's current context: function handles are per context, so the device's primary
  /// context must be current (see ScopedContext). Throws DriverError naming the function when
  /// the library has no such kernel or no context is current. Not thread-safe on one object.
  CUfunction function(const std::string& lowered_name);

 private:
  void unload() noexcept;

  CUlibrary library_ = nullptr;
  /// Functions handed out, forgotten by launch()'s opt-in cache on unload: a later library may
  /// get the same handle values.
  std::vector<CUfunction> functions_;
};

}  // namespace kjit::driver
