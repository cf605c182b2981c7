// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <vector>

namespace kjit {

enum class LogLevel { off, error, warn, info, debug };

/// Everything kjit reads from the environment, read in one place. Every field can also be set
/// by the API; an API value wins over the environment.
struct Settings {
  /// KJIT_CACHE_DIR; empty: $XDG_CACHE_HOME/kjit, else ~/.cache/kjit.
  std::string cache_dir;
  /// KJIT_BUNDLE_PATH (colon separated): bundles searched before the disk cache.
  std::vector<std::string> bundle_paths;
  /// KJIT_DISABLE_JIT=1: a kernel missing from every bundle and cache is KernelNotInBundle.
  bool disable_jit = false;
  /// KJIT_DISABLE_DISK_CACHE=1: compile into memory only.
  bool disable_disk_cache = false;
  /// KJIT_DUMP_DIR: write the stub source, PTX and log of every compile there.
  std::string dump_dir;
  /// KJIT_LOG: off, error, warn (default), info, debug, in any case.
  LogLevel log_level = LogLevel::warn;
  /// KJIT_CUDA_HOME, else CUDA_HOME, else /usr/local/cuda: where NVRTC finds toolkit headers.
  std::string cuda_home;
  /// KJIT_NVRTC_LIBRARY: path or soname of libnvrtc (default libnvrtc.so.13).
  std::string nvrtc_library;
  /// KJIT_CUDA_DRIVER_LIBRARY: path or soname of libcuda (default libcuda.so.1).
  std::string cuda_driver_library;
  /// KJIT_ALLOW_COMPILE_IN_CAPTURE=1: allow compiling/loading while a stream is capturing.
  bool allow_compile_in_capture = false;
  /// KJIT_DEBUG_CHECKS=1: extra launch-time checks (e.g. duplicate state indices).
  bool debug_checks = false;
  /// KJIT_DISABLE_PROGRAMMATIC_LAUNCH=1: a plan's later launch never starts before the one
  /// before it has finished (LaunchShape::overlaps_previous is cleared when a plan is resolved).
  /// For A/B timing and for tools that do not follow programmatic dependencies.
  bool disable_programmatic_launch = false;
  /// KJIT_TENSOR_MAPS=1|loads|stores|0: which of gdn_prefill's warp-specialized kernel's copies
  /// go through TMA tensor maps: both (1, the default), q, k and v in (loads), out (stores), or
  /// none (0: its cp.async copies and plain stores, for A/B timing and debugging; measured slower,
  /// docs/performance.md "TMA paths behind KJIT_TENSOR_MAPS, then on by default").
  bool tensor_map_loads = true;
  bool tensor_map_stores = true;

  /// Reads the KJIT_* variables (and CUDA_HOME, XDG_CACHE_HOME, HOME). Throws InvalidArgument
  /// naming the variable for a malformed value (e.g. KJIT_LOG=loud).
  static Settings from_env();
  /// The cache root these settings resolve to (API > KJIT_CACHE_DIR > XDG > HOME).
  std::string resolved_cache_dir() const;
  /// The toolkit root these settings resolve to.
  std::string resolved_cuda_home() const;
};

}  // namespace kjit
