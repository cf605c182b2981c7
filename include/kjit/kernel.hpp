// SPDX-License-Identifier: Apache-2.0
// What compiling a KernelSpec produces, and the kernel cache's counters: the vocabulary the
// compile, cache and runtime layers share. Below the runtime (issue 21): the layers that make
// and store kernels include this, not the runtime's facade.
#pragma once

#include <cstdint>
#include <string>

#include "kjit/spec.hpp"

namespace kjit {

/// The product of compiling one KernelSpec: everything needed to load it, and everything
/// needed to explain it.
struct CompiledKernel {
  KernelSpec spec;
  std::string cubin;
  std::string ptx;
  /// Mangled name of the entry point (from nvrtcGetLoweredName).
  std::string lowered_name;
  /// The exact source handed to NVRTC.
  std::string source;
  std::string options;
  /// NVRTC + ptxas log.
  std::string log;
  KernelResources resources;
  /// Cache key, 32 lowercase hex digits.
  std::string key;
  /// The tagged fields the key was computed from, one "tag: value" per line.
  std::string key_material;
};

/// Where a kernel came from the last time it was looked up.
enum class KernelSource { memory, bundle, disk, compiled };

/// Counters of the kernel cache, for tests, `kjit cache stats` and logs.
struct CacheStats {
  std::uint64_t memory_hits = 0;
  std::uint64_t bundle_hits = 0;
  std::uint64_t disk_hits = 0;
  std::uint64_t compiles = 0;
  /// Kernels loaded onto a device (once per spec and device).
  std::uint64_t loads = 0;
  /// Entries found corrupt, truncated or foreign: treated as misses and replaced.
  std::uint64_t corrupt_entries = 0;
  /// Entries that could not be written (the cache then runs memory-only).
  std::uint64_t write_failures = 0;
  bool disk_enabled = true;
  /// Whether this runtime loaded NVRTC. A fresh process whose kernels are all in a bundle, or
  /// in the disk cache with the compiler identity remembered there, never does.
  bool nvrtc_loaded = false;
};

}  // namespace kjit
