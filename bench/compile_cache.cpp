// SPDX-License-Identifier: Apache-2.0
// CPU benchmark of the JIT pipeline (no GPU needed):
//  1. cold compile of a small template for sm_90 (NVRTC loaded, disk cache off);
//  2. cache hit from a new process: a child process starts, loads the compiler identity, and
//     turns a spec into cubin bytes from the disk cache;
//  3. in-process memory hit.
// Usage: bench_compile_cache [json-path]
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "kjit/kjit.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// The child of part 2: prints "<first call ms> <second spec ms>" on stdout.
int child_main(const std::string& cache_dir) {
  const auto start = Clock::now();
  kjit::Settings settings = kjit::Settings::from_env();
  settings.cache_dir = cache_dir;
  kjit::Runtime runtime(settings);
  kjit::KernelSource source{};
  runtime.compiled(kjit::KernelSpec::parse("probe:heavy=0@sm_90"), &source);
  const double first_ms = ms_since(start);
  if (source != kjit::KernelSource::disk) return 3;
  // The compiler identity is known now: this is the cost of key -> verified cubin bytes.
  const auto second_start = Clock::now();
  runtime.compiled(kjit::KernelSpec::parse("probe:heavy=1@sm_90"), &source);
  const double second_ms = ms_since(second_start);
  if (source != kjit::KernelSource::disk) return 4;
  std::printf("%.4f %.4f\n", first_ms, second_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--child") return child_main(argv[2]);
  try {
    const std::string cache_dir =
        (std::filesystem::temp_directory_path() / fmt::format("kjit-bench-{}", getpid())).string();
    std::filesystem::remove_all(cache_dir);

    // 1. Cold compiles: a fresh runtime each time, the compiler loaded by a warm-up compile of
    // another spec so that only the compile of the measured spec is timed.
    std::vector<double> cold;
    for (int i = 0; i < 7; ++i) {
      kjit::Settings settings = kjit::Settings::from_env();
      settings.disable_disk_cache = true;
      kjit::Runtime runtime(settings);
      runtime.compiled(kjit::KernelSpec::parse("bench:kernel=empty@sm_90"));
      const auto start = Clock::now();
      runtime.compiled(kjit::KernelSpec::parse("probe:heavy=0@sm_90"));
      cold.push_back(ms_since(start));
    }

    // 2. Fill the disk cache, then time new processes reading it.
    {
      kjit::Settings settings = kjit::Settings::from_env();
      settings.cache_dir = cache_dir;
      kjit::Runtime runtime(settings);
      runtime.compiled(kjit::KernelSpec::parse("probe:heavy=0@sm_90"));
      runtime.compiled(kjit::KernelSpec::parse("probe:heavy=1@sm_90"));
    }
    std::vector<double> first_call, hit;
    for (int i = 0; i < 9; ++i) {
      const std::string command = fmt::format("'{}' --child '{}'", argv[0], cache_dir);
      FILE* pipe = popen(command.c_str(), "r");
      double a = 0, b = 0;
      const int fields = pipe ? std::fscanf(pipe, "%lf %lf", &a, &b) : 0;
      const int status = pipe ? pclose(pipe) : -1;
      if (fields != 2 || status != 0) {
        std::fprintf(stderr, "child failed (status %d)\n", status);
        return 1;
      }
      first_call.push_back(a);
      hit.push_back(b);
    }

    // 3. Memory hits.
    kjit::Settings settings = kjit::Settings::from_env();
    settings.cache_dir = cache_dir;
    kjit::Runtime runtime(settings);
    const kjit::KernelSpec spec = kjit::KernelSpec::parse("probe:heavy=0@sm_90");
    runtime.compiled(spec);
    const int n = 200000;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) runtime.compiled(spec);
    const double memory_us = ms_since(start) * 1000.0 / n;
    std::filesystem::remove_all(cache_dir);

    fmt::print("cold compile probe@sm_90 (median of 7):        {:8.2f} ms   (goal <= 150 ms)\n",
               median(cold));
    fmt::print("new process, disk hit, key -> cubin (median 9): {:8.3f} ms   (goal <= 1 ms)\n",
               median(hit));
    fmt::print("new process, first call incl. NVRTC load:       {:8.2f} ms\n", median(first_call));
    fmt::print("in-process memory hit:                          {:8.3f} us   (goal <= 1 us)\n",
               memory_us);
    if (argc > 1) {
      if (FILE* out = std::fopen(argv[1], "w")) {
        std::fprintf(out,
                     "{\"cold_compile_ms\": %.3f, \"disk_hit_ms\": %.4f, \"first_call_ms\": %.3f, "
                     "\"memory_hit_us\": %.4f}\n",
                     median(cold), median(hit), median(first_call), memory_us);
        std::fclose(out);
      }
    }
    return 0;
  } catch (const kjit::Error& error) {
    std::fprintf(stderr, "bench_compile_cache: %s\n", error.what());
    return 1;
  }
}
