// SPDX-License-Identifier: Apache-2.0
// Kernel and copy durations from CUPTI activity records: the GPU's own start and end timestamps
// of each kernel or copy. An event pair around a call of a few microseconds measures the front
// end and the event writes too (an empty kernel reads ~2-5 us that way), so the smallest calls
// (merge_state at T = 1, gdn_decode at B = 1) are compared by duration, beside an empty kernel
// and a copy of the same bytes measured the same way. libcupti is loaded at run time
// (KJIT_CUPTI_LIBRARY, else libcupti.so.13 and the toolkit's usual folders); where it or its
// header is missing the durations are reported as unavailable, never guessed.
#pragma once

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define KJIT_BENCH_HAVE_CUPTI 1
#else
#define KJIT_BENCH_HAVE_CUPTI 0
#endif

#include "harness.hpp"

namespace kjit::bench {

class ActivityTimer {
 public:
  /// The process's timer (CUPTI's activity callbacks are global), or nullptr with `why`.
  static ActivityTimer* get(std::string* why) {
    static ActivityTimer timer;
    if (!timer.ready_) *why = timer.why_;
    return timer.ready_ ? &timer : nullptr;
  }

  /// The timer where KJIT_BENCH_CUPTI=1 asks for kernel durations, else nullptr; asked for and
  /// unavailable, the reason is printed once here.
  static ActivityTimer* requested() {
    if (!env_is_one("KJIT_BENCH_CUPTI")) return nullptr;
    std::string why;
    ActivityTimer* timer = get(&why);
    if (timer == nullptr) std::printf("kernel durations unavailable: %s\n", why.c_str());
    return timer;
  }

  /// Median duration in us of the kernels whose (mangled) name contains `name_part`, or of the
  /// memory copies when `copies`, over `reps` calls of `enqueue` (after 3 untimed ones).
  /// nullopt when no such record came back.
  std::optional<double> median_us(Gpu& gpu, const std::function<void(Stream)>& enqueue, int reps,
                                  const std::string& name_part, bool copies = false) {
#if KJIT_BENCH_HAVE_CUPTI
    // Recording only while measuring: activity records cost every launch a little.
    if (enable_(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        enable_(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) {
      return std::nullopt;
    }
    for (int i = 0; i < 3; ++i) enqueue(gpu.stream);
    gpu.synchronize();
    flush_all_(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    {
      std::lock_guard<std::mutex> lock(state().mutex);
      state().durations.clear();
      state().name_part = name_part;
      state().copies = copies;
      state().collecting = true;
    }
    for (int i = 0; i < reps; ++i) enqueue(gpu.stream);
    gpu.synchronize();
    flush_all_(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    disable_(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    disable_(CUPTI_ACTIVITY_KIND_MEMCPY);
    std::lock_guard<std::mutex> lock(state().mutex);
    state().collecting = false;
    std::vector<double>& d = state().durations;
    if (d.empty()) return std::nullopt;
    std::nth_element(d.begin(), d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2), d.end());
    return d[d.size() / 2];
#else
    (void)gpu, (void)enqueue, (void)reps, (void)name_part, (void)copies;
    return std::nullopt;
#endif
  }

  /// Durations (us) of a small call, of an empty kernel and of a device copy moving
  /// `bytes_moved` (read + written), all by the same clock; -1 where no record came back.
  struct Beside {
    double call = -1, empty = -1, copy = -1;
  };
  Beside beside_empty_and_copy(Gpu& gpu, const std::function<void(Stream)>& call,
                               const std::string& name_part, std::size_t bytes_moved) {
    constexpr int kReps = 50;
    DeviceBuffer src(bytes_moved / 2 + 256), dst(bytes_moved / 2 + 256);
    Beside b;
    b.call = median_us(gpu, call, kReps, name_part).value_or(-1);
    b.empty = median_us(
                  gpu, [&](Stream) { gpu.launch_empty(); }, kReps, "bench_kernel")
                  .value_or(-1);
    b.copy =
        median_us(
            gpu,
            [&](Stream) {
              check(cu().cuMemcpyDtoDAsync(dst.ptr(), src.ptr(), bytes_moved / 2, gpu.cu_stream()),
                    "cuMemcpyDtoDAsync");
            },
            kReps, "", true)
            .value_or(-1);
    return b;
  }

 private:
#if KJIT_BENCH_HAVE_CUPTI
  struct State {
    std::mutex mutex;
    std::vector<double> durations;
    std::string name_part;
    bool copies = false, collecting = false;
  };
  static State& state() {
    static State s;
    return s;
  }

  static void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size,
                                        std::size_t* max_records) {
    constexpr std::size_t kBytes = std::size_t{8} << 20;
    *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(8, kBytes));
    *size = *buffer == nullptr ? 0 : kBytes;
    *max_records = 0;
  }

  static void CUPTIAPI buffer_completed(CUcontext, std::uint32_t, std::uint8_t* buffer, std::size_t,
                                        std::size_t valid) {
    CUpti_Activity* record = nullptr;
    std::lock_guard<std::mutex> lock(state().mutex);
    while (next_record_ != nullptr && next_record_(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (!state().collecting) continue;
      if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
          record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        if (!state().copies && kernel->name != nullptr &&
            std::strstr(kernel->name, state().name_part.c_str()) != nullptr) {
          state().durations.push_back(static_cast<double>(kernel->end - kernel->start) * 1e-3);
        }
      } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY && state().copies) {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        state().durations.push_back(static_cast<double>(copy->end - copy->start) * 1e-3);
      }
    }
    std::free(buffer);
  }

  using RegisterFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc,
                                     CUpti_BuffersCallbackCompleteFunc);
  using EnableFn = CUptiResult (*)(CUpti_ActivityKind);
  using FlushAllFn = CUptiResult (*)(std::uint32_t);
  using NextRecordFn = CUptiResult (*)(std::uint8_t*, std::size_t, CUpti_Activity**);
  static inline NextRecordFn next_record_ = nullptr;
  FlushAllFn flush_all_ = nullptr;
  EnableFn enable_ = nullptr, disable_ = nullptr;
#endif

  ActivityTimer() {
#if KJIT_BENCH_HAVE_CUPTI
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KJIT_CUPTI_LIBRARY"); env != nullptr) {
      candidates.emplace_back(env);
    }
    for (const char* path :
         {"libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13",
          "/usr/local/cuda/lib64/libcupti.so.13", "/usr/local/cuda/lib/libcupti.so.13",
          "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so.13"}) {
      candidates.emplace_back(path);
    }
    void* library = nullptr;
    for (const std::string& path : candidates) {
      if ((library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (library == nullptr) {
      why_ = "libcupti.so.13 not found (set KJIT_CUPTI_LIBRARY)";
      return;
    }
    const auto register_callbacks =
        reinterpret_cast<RegisterFn>(dlsym(library, "cuptiActivityRegisterCallbacks"));
    enable_ = reinterpret_cast<EnableFn>(dlsym(library, "cuptiActivityEnable"));
    disable_ = reinterpret_cast<EnableFn>(dlsym(library, "cuptiActivityDisable"));
    flush_all_ = reinterpret_cast<FlushAllFn>(dlsym(library, "cuptiActivityFlushAll"));
    next_record_ = reinterpret_cast<NextRecordFn>(dlsym(library, "cuptiActivityGetNextRecord"));
    if (register_callbacks == nullptr || enable_ == nullptr || disable_ == nullptr ||
        flush_all_ == nullptr || next_record_ == nullptr) {
      why_ = "libcupti lacks the activity API";
      return;
    }
    if (register_callbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) {
      why_ = "CUPTI refused the activity callbacks (another profiler attached?)";
      return;
    }
    ready_ = true;
#else
    why_ = "bench built without cupti_activity.h";
#endif
  }

  bool ready_ = false;
  std::string why_;
};

}  // namespace kjit::bench
