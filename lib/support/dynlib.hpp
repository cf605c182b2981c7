// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace kjit::support {

/// RAII handle of a dlopen()ed shared library. Move-only. Never unloaded before the process
/// exits when `keep_loaded` is set, because CUDA libraries do not survive dlclose/re-dlopen.
class DynamicLibrary {
 public:
  DynamicLibrary() = default;
  /// Opens `name` (a soname or a path). On failure returns an empty handle and sets `error`
  /// to dlerror()'s text.
  static DynamicLibrary open(const std::string& name, std::string* error);
  ~DynamicLibrary();
  DynamicLibrary(DynamicLibrary&& other) noexcept;
  DynamicLibrary& operator=(DynamicLibrary&& other) noexcept;
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  explicit operator bool() const noexcept { return handle_ != nullptr; }
  /// The address of `symbol`, nullptr if absent.
  void* symbol(const char* name) const noexcept;
  /// Keeps the library mapped after this handle is destroyed.
  void release() noexcept { handle_ = nullptr; }

 private:
  void* handle_ = nullptr;
};

}  // namespace kjit::support
