// SPDX-License-Identifier: Apache-2.0
// An anchor kernel (another project's kernel, built outside this repository) loaded at run time
// from a shared library, so that a benchmark can time it beside kjit in the same process, on the
// same inputs. The library is named by an environment variable and exports plain C functions;
// nothing of the anchor is compiled into kjit's benchmarks.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <optional>
#include <string>

namespace kjit::bench {

class AnchorLibrary {
 public:
  /// The library named by `env_var`, or nullopt when the variable is unset. A library that
  /// cannot be opened, or lacks kjit_anchor_name, is reported and treated as absent.
  static std::optional<AnchorLibrary> open(const char* env_var) {
    const char* path = std::getenv(env_var);
    if (path == nullptr || *path == '\0') return std::nullopt;
    void* handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      std::fprintf(stderr, "%s=%s: %s (anchor columns left out)\n", env_var, path, dlerror());
      return std::nullopt;
    }
    AnchorLibrary library(handle);
    const auto name = library.symbol<const char* (*)()>("kjit_anchor_name");
    if (name == nullptr) return std::nullopt;
    library.name_ = name();
    return library;
  }

  /// The exported function `name` as `Fn`, or nullptr (reported) when it is missing.
  template <typename Fn>
  Fn symbol(const char* name) const {
    void* address = dlsym(handle_, name);
    if (address == nullptr) std::fprintf(stderr, "anchor library: no symbol %s\n", name);
    return reinterpret_cast<Fn>(address);
  }

  const std::string& name() const { return name_; }

 private:
  explicit AnchorLibrary(void* handle) : handle_(handle) {}
  void* handle_ = nullptr;  // never closed: the anchor's kernels stay registered until exit
  std::string name_;
};

}  // namespace kjit::bench
