// SPDX-License-Identifier: Apache-2.0
// NVRTC, loaded with dlopen on first use: KernelSpec -> cubin + PTX + lowered name + resources.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/runtime.hpp"
#include "kjit/spec.hpp"

namespace kjit::compile {

/// What identifies the compiler for cache keys: NVRTC's version and the banner lines of the
/// PTX it emits for an empty program (which carry the build id).
struct CompilerIdentity {
  int major = 0;
  int minor = 0;
  /// "nvrtc-13.0-<8 hex of the banner hash>": a path component of the disk cache.
  std::string id;
  /// The full text that went into `id`, for key material.
  std::string material;
};

/// NVRTC as loaded from a library path. Move-only; one per process is usual (compiler()).
class Compiler {
 public:
  /// Loads `library` (empty: KJIT_NVRTC_LIBRARY's default "libnvrtc.so.13", then
  /// "libnvrtc.so"). Throws CompileError saying which library could not be loaded and how to
  /// point kjit at one.
  explicit Compiler(const std::string& library, std::string cuda_home);
  ~Compiler();
  Compiler(Compiler&&) noexcept;
  Compiler& operator=(Compiler&&) noexcept;

  const CompilerIdentity& identity() const;
  /// Archs this NVRTC can target (nvrtcGetSupportedArchs), plus their a/f variants where
  /// NVRTC accepts them.
  std::vector<Arch> supported_archs() const;

  /// The canonical option list for a spec (sorted, without -Xptxas=-v which never changes the
  /// binary): goes into the cache key.
  std::vector<std::string> options_for(const KernelSpec& spec) const;

  /// Compiles one spec: stub source from codegen, every embedded template as a header,
  /// cuda_fp16.h etc. from <cuda_home>/include. Fills every field of CompiledKernel except
  /// `key` and `key_material`. Throws CompileError with the log mapped to template file:line.
  CompiledKernel compile(const KernelSpec& spec) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Parses the `-Xptxas=-v` part of an NVRTC log: resources per mangled kernel name.
std::map<std::string, KernelResources> parse_ptxas_report(std::string_view log);

}  // namespace kjit::compile
