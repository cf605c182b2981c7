// SPDX-License-Identifier: Apache-2.0
// Host cost of a steady-state kjit launch against a raw cuLaunchKernel of the same cubin, in
// the same run, and the time from process start to the first launch of a spec whose cubin is
// in a warm disk cache (beyond driver initialization).
// Usage: bench_launch_overhead [json-path]
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "harness.hpp"
#include "kjit/kjit.hpp"
#include "kjit/probe_params.h"
#include "runtime/loaded_kernel.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

// Child process: driver init, then the first load + launch of a cached spec.
int child_main() {
  const auto start = Clock::now();
  const kjit::driver::DriverApi& cu = kjit::driver::driver_api();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  kjit::driver::check(cu.cuDeviceGet(&dev, 0), "cuDeviceGet");
  kjit::driver::check(cu.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  kjit::driver::check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  kjit::Runtime runtime(kjit::Settings::from_env());
  const kjit::DeviceLimits limits = runtime.device_limits(0);
  const double driver_us = us_since(start);
  const auto first = Clock::now();
  const kjit::LoadedKernel& kernel =
      runtime.load(kjit::KernelSpec::make("probe", {{"heavy", "0"}}, limits.arch), 0, nullptr);
  kjit::bench::DeviceBuffer out(32 * sizeof(float));
  kjit::ProbeParams params{static_cast<float*>(out.get()), 32, 1.0f, 0};
  runtime.launch(kernel, kjit::LaunchShape{{1, 1, 1}, {32, 1, 1}, 0}, nullptr, &params,
                 sizeof params);
  kjit::driver::check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
  const double first_us = us_since(first);
  kjit::KernelSource source{};
  runtime.compiled(kernel.compiled->spec, &source);
  std::printf("%.1f %.1f %d\n", driver_us, first_us,
              runtime.stats().disk_hits > 0 && runtime.stats().compiles == 0 ? 1 : 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--child") return child_main();
  std::string why;
  auto gpu = kjit::bench::Gpu::open(&why);
  if (!gpu) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  try {
    kjit::Runtime& runtime = gpu->runtime();
    const kjit::KernelSpec spec =
        kjit::KernelSpec::make("probe", {{"heavy", "0"}}, gpu->limits.arch);
    const kjit::LoadedKernel& kernel = runtime.load(spec, gpu->device);
    kjit::bench::DeviceBuffer out(32 * sizeof(float));
    kjit::ProbeParams params{static_cast<float*>(out.get()), 32, 1.0f, 0};
    const kjit::LaunchShape shape{{1, 1, 1}, {32, 1, 1}, 0};

    kjit::Plan plan;
    plan.op = "probe";
    plan.mode = "single";
    plan.device = gpu->limits;
    plan.launches.push_back(kjit::PlannedLaunch{spec, shape, {}});
    struct Signature {
      int device;
      int kind;
    } signature{gpu->device, 1};
    const int n = 20000;
    auto measure = [&](auto&& one_launch) {
      for (int i = 0; i < 1000; ++i) one_launch();
      gpu->synchronize();
      const auto start = Clock::now();
      for (int i = 0; i < n; ++i) one_launch();
      const double us = us_since(start) / n;
      gpu->synchronize();
      return us;
    };
    const kjit::Runtime::ResolvedPlan& resolved = runtime.memoized(signature, gpu->stream, [&] {
      return std::pair{plan, gpu->device};
    });
    void* args[] = {&params};
    double raw_best = 1e9, memo_best = 1e9, checked_best = 1e9;
    for (int round = 0; round < 3; ++round) {
      raw_best = std::min(raw_best, measure([&] {
                            kjit::bench::check(kjit::bench::cu().cuLaunchKernel(
                                                   resolved.kernels[0]->function, 1, 1, 1, 32, 1, 1,
                                                   0, gpu->cu_stream(), args, nullptr),
                                               "cuLaunchKernel");
                          }));
      memo_best = std::min(memo_best, measure([&] {
                             const auto& r = runtime.memoized(signature, gpu->stream, [&] {
                               return std::pair{plan, gpu->device};
                             });
                             runtime.launch(r, 0, gpu->stream, &params, sizeof params);
                           }));
      checked_best = std::min(checked_best, measure([&] {
                                runtime.launch(kernel, shape, gpu->stream, &params, sizeof params);
                              }));
    }

    // Fresh processes: first launch from a warm disk cache.
    double driver_us = 0, first_us = 1e18;
    int from_disk = 0;
    for (int i = 0; i < 5; ++i) {
      FILE* pipe = popen(fmt::format("'{}' --child", argv[0]).c_str(), "r");
      double a = 0, b = 0;
      int c = 0;
      if (pipe == nullptr || std::fscanf(pipe, "%lf %lf %d", &a, &b, &c) != 3 ||
          pclose(pipe) != 0) {
        std::fprintf(stderr, "child failed\n");
        return 1;
      }
      driver_us = a;
      first_us = std::min(first_us, b);
      from_disk = c;
    }
    fmt::print("host us per launch (best of 3 x {} back-to-back):\n", n);
    fmt::print("  raw cuLaunchKernel           {:6.2f} us\n", raw_best);
    fmt::print("  kjit memoized plan launch    {:6.2f} us  (+{:.2f} us; goal <= +0.4)\n", memo_best,
               memo_best - raw_best);
    fmt::print("  kjit checked launch          {:6.2f} us  (+{:.2f} us)\n", checked_best,
               checked_best - raw_best);
    fmt::print(
        "fresh process: driver init {:.0f} us, first load+launch from {} {:.0f} us "
        "(goal <= 1000 us)\n",
        driver_us, from_disk ? "warm disk cache" : "a compile (cache was cold!)", first_us);
    if (argc > 1) {
      if (FILE* f = std::fopen(argv[1], "w")) {
        std::fprintf(f,
                     "{\"raw_us\": %.3f, \"memo_us\": %.3f, \"checked_us\": %.3f, "
                     "\"first_launch_us\": %.1f, \"driver_init_us\": %.1f}\n",
                     raw_best, memo_best, checked_best, first_us, driver_us);
        std::fclose(f);
      }
    }
    return 0;
  } catch (const kjit::Error& error) {
    std::fprintf(stderr, "bench_launch_overhead: %s\n", error.what());
    return 1;
  }
}
