// SPDX-License-Identifier: Apache-2.0
// The measuring method of ../shared/BENCHMARKING.md, shared by every GPU benchmark:
// - GPU time per call: a ~10 ms spin kernel first, then every timed call between two events
//   behind it (host launch cost excluded); median after warm-up.
// - The same-run reference: a device-to-device copy of the same number of bytes moved.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/device_buffer.hpp"
#include "driver/driver_api.hpp"
#include "kjit/runtime.hpp"
// After kjit/types.hpp: the params headers declare kjit::i32 and friends, which GCC reports
// as shadowing the DType enumerators when they come first.
#include "kjit/spec.hpp"
#include "support/numeric.hpp"
#include "templates/bench/params.h"

namespace kjit::bench {

/// Whether the environment variable `name` is "1" (the benches' optional tables and protocols).
inline bool env_is_one(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

using DeviceBuffer = test::DeviceMemory;

inline const driver::DriverApi& cu() { return driver::driver_api(); }
inline void check(CUresult result, const char* call) { driver::check(result, call); }

/// One device, one stream, one runtime, the helper kernels and a pool of events.
class Gpu {
 public:
  /// nullopt (and `why`) where no driver or device exists.
  static std::optional<Gpu> open(std::string* why) {
    std::string reason;
    if (!driver::driver_loadable("", &reason)) {
      *why = reason;
      return std::nullopt;
    }
    int count = 0;
    if (cu().cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      *why = "no CUDA device";
      return std::nullopt;
    }
    return std::optional<Gpu>(std::in_place);
  }

  Gpu() : runtime_(std::make_unique<Runtime>(Settings::from_env())) {
    CUdevice dev = 0;
    check(cu().cuDeviceGet(&dev, device), "cuDeviceGet");
    check(cu().cuDevicePrimaryCtxRetain(&context_, dev), "cuDevicePrimaryCtxRetain");
    check(cu().cuCtxSetCurrent(context_), "cuCtxSetCurrent");
    CUstream s = nullptr;
    check(cu().cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    stream = reinterpret_cast<Stream>(s);
    limits = runtime_->device_limits(device);
    spin_ = &runtime_->load(KernelSpec::make("bench", {{"kernel", "spin"}}, limits.arch), device);
    empty_ = &runtime_->load(KernelSpec::make("bench", {{"kernel", "empty"}}, limits.arch), device);
    events_.resize(2 * kMaxReps + 2);
    for (CUevent& e : events_) check(cu().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    int clock_khz = 0;
    check(cu().cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev),
          "cuDeviceGetAttribute");
    clock_khz_ = clock_khz;
    flush_buffer_ = std::make_unique<DeviceBuffer>(std::size_t{256} << 20);
  }
  Gpu(Gpu&&) = default;

  Runtime& runtime() { return *runtime_; }
  CUstream cu_stream() const { return reinterpret_cast<CUstream>(stream); }

  /// Enqueues a spin kernel of about `ms` milliseconds.
  void spin(double ms) {
    BenchParams params{static_cast<std::uint64_t>(ms * clock_khz_)};
    runtime_->launch(*spin_, LaunchShape{{1, 1, 1}, {1, 1, 1}, 0}, stream, &params, sizeof params);
  }
  void launch_empty() { launch_empty(LaunchShape{{1, 1, 1}, {32, 1, 1}, 0}); }
  /// The empty kernel in a given shape (e.g. a call's grid, with or without clusters): what a
  /// launch of that shape costs before any work.
  void launch_empty(const LaunchShape& shape) {
    BenchParams params{0};
    runtime_->launch(*empty_, shape, stream, &params, sizeof params);
  }

  void synchronize() { check(cu().cuStreamSynchronize(cu_stream()), "cuStreamSynchronize"); }

  static constexpr int kMaxReps = 200;
  int device = 0;
  Stream stream = nullptr;
  DeviceLimits limits;
  std::vector<CUevent> events_;
  std::unique_ptr<DeviceBuffer> flush_buffer_;
  std::map<std::pair<std::size_t, int>, double> copy_gbs_cache_;

 private:
  std::unique_ptr<Runtime> runtime_;
  CUcontext context_ = nullptr;
  const LoadedKernel* spin_ = nullptr;
  const LoadedKernel* empty_ = nullptr;
  double clock_khz_ = 1.98e6;
};

/// Evicts L2 by writing a 256 MB buffer.
inline void flush_l2(Gpu& gpu) {
  check(cu().cuMemsetD8Async(gpu.flush_buffer_->ptr(), 0x5A, gpu.flush_buffer_->bytes(),
                             gpu.cu_stream()),
        "cuMemsetD8Async");
}

/// Writes 64 MiB that nothing reads (a value that changes per call), so that L2 (50 MB on an
/// H200) holds dirty lines of unrelated data: what a call in a serving engine meets after the
/// previous layer's kernels, unlike a flushed (clean) L2.
inline void dirty_l2(Gpu& gpu) {
  static std::uint32_t value = 0;
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  check(cu().cuMemsetD32Async(gpu.flush_buffer_->ptr(), ++value, kBytes / 4, gpu.cu_stream()),
        "cuMemsetD32Async");
}

/// Median GPU time in microseconds of `enqueue_one`, each call between two events, all queued
/// behind a spin kernel so that host launch cost is not measured.
/// `before_each` (optional) is enqueued before each timed call, outside its event pair: e.g. an
/// L2 flush, or unrelated writes that leave L2 dirty, as a serving engine's previous kernels do.
inline double median_gpu_us(Gpu& gpu, const std::function<void(Stream)>& enqueue_one,
                            int reps = 100, int warmup = 10,
                            const std::function<void(Stream)>& before_each = {}) {
  reps = std::clamp(reps, 1, Gpu::kMaxReps);
  for (int i = 0; i < warmup; ++i) enqueue_one(gpu.stream);
  gpu.synchronize();
  gpu.spin(10.0);
  CUevent spin_done = gpu.events_.back();
  check(cu().cuEventRecord(spin_done, gpu.cu_stream()), "cuEventRecord");
  for (int i = 0; i < reps; ++i) {
    if (before_each) before_each(gpu.stream);
    check(cu().cuEventRecord(gpu.events_[2 * i], gpu.cu_stream()), "cuEventRecord");
    enqueue_one(gpu.stream);
    check(cu().cuEventRecord(gpu.events_[2 * i + 1], gpu.cu_stream()), "cuEventRecord");
  }
  // If the spin finished before enqueueing did, host time leaked into the first calls.
  const bool spin_outran = cu().cuEventQuery(spin_done) == CUDA_SUCCESS;
  gpu.synchronize();
  std::vector<double> us(static_cast<std::size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    check(cu().cuEventElapsedTime(&ms, gpu.events_[2 * i], gpu.events_[2 * i + 1]),
          "cuEventElapsedTime");
    us[static_cast<std::size_t>(i)] = ms * 1000.0;
  }
  if (spin_outran) std::fprintf(stderr, "note: enqueueing outlasted the 10 ms spin kernel\n");
  std::nth_element(us.begin(), us.begin() + reps / 2, us.end());
  return us[static_cast<std::size_t>(reps / 2)];
}

/// Mean GPU time per call of `reps` identical calls with no events between them.
inline double back_to_back_us(Gpu& gpu, const std::function<void(Stream)>& enqueue_one,
                              int reps = 100) {
  for (int i = 0; i < 5; ++i) enqueue_one(gpu.stream);
  gpu.synchronize();
  gpu.spin(10.0);
  check(cu().cuEventRecord(gpu.events_[0], gpu.cu_stream()), "cuEventRecord");
  for (int i = 0; i < reps; ++i) enqueue_one(gpu.stream);
  check(cu().cuEventRecord(gpu.events_[1], gpu.cu_stream()), "cuEventRecord");
  gpu.synchronize();
  float ms = 0;
  check(cu().cuEventElapsedTime(&ms, gpu.events_[0], gpu.events_[1]), "cuEventElapsedTime");
  return ms * 1000.0 / reps;
}

/// Median GPU time of an empty kernel between two events: the floor for tiny shapes.
inline double empty_kernel_us(Gpu& gpu) {
  return median_gpu_us(gpu, [&](Stream) { gpu.launch_empty(); });
}

/// What precedes each timed call of a benchmark, so that its copy reference can meet L2 in the
/// same state: `rotation` flushes once and lets the calls walk cold windows (the ops' main
/// tables); `flushed` and `dirty` enqueue flush_l2 / dirty_l2 before every call (the serving
/// protocols). Both of those leave L2 full of dirty lines that the timed call writes back, so a
/// reference timed by rotation alone understates what the same call pays (gdn_decode B = 256:
/// ~5% of the step).
enum class L2Protocol { rotation, flushed, dirty };

/// Device-to-device copy bandwidth in GB/s (bytes read + written) for a copy moving
/// `bytes_moved` bytes, measured in this run (cached per size and protocol). Cold, like the
/// ops' timed calls: L2 is flushed first and each call copies its own window of >= 512 MB of
/// source and destination, so a copy smaller than L2 is not served from it (one buffer pair
/// copied over and over was, which made small copies look faster than DRAM allows); under
/// `flushed` / `dirty` each copy is also preceded by that protocol's writes, as the op's calls.
inline double copy_gbs(Gpu& gpu, std::size_t bytes_moved,
                       L2Protocol protocol = L2Protocol::rotation) {
  constexpr std::size_t kColdBytes = std::size_t{512} << 20;
  const std::size_t half = std::max<std::size_t>(bytes_moved / 2, 256) & ~std::size_t{255};
  const auto key = std::make_pair(half, static_cast<int>(protocol));
  if (auto it = gpu.copy_gbs_cache_.find(key); it != gpu.copy_gbs_cache_.end()) return it->second;
  const std::size_t windows = std::max<std::size_t>(1, kColdBytes / half);
  DeviceBuffer src(half * windows), dst(half * windows);
  check(cu().cuMemsetD8Async(src.ptr(), 1, src.bytes(), gpu.cu_stream()), "cuMemsetD8Async");
  const int reps = half * 2 > (std::size_t{1} << 30) ? 50 : 100;
  flush_l2(gpu);
  std::function<void(Stream)> before_each;
  if (protocol == L2Protocol::flushed) before_each = [&](Stream) { flush_l2(gpu); };
  if (protocol == L2Protocol::dirty) before_each = [&](Stream) { dirty_l2(gpu); };
  std::size_t call = 0;
  const double us = median_gpu_us(
      gpu,
      [&](Stream) {
        const std::size_t at = (call++ % windows) * half;
        check(cu().cuMemcpyDtoDAsync(dst.ptr() + at, src.ptr() + at, half, gpu.cu_stream()),
              "cuMemcpyDtoDAsync");
      },
      reps, 10, before_each);
  const double gbs = static_cast<double>(2 * half) / (us * 1e3);
  gpu.copy_gbs_cache_[key] = gbs;
  return gbs;
}

/// bench_slot_rmw_kernel (templates/bench/bench.cuh) in one shape: what a step on a state pool
/// costs in memory alone (its slots read and written back in place, its inputs read and its
/// output written once, no arithmetic), the floor an op's step on the same slots is held to.
class SlotRmw {
 public:
  /// `rows` and `warps`: 512-byte rows per warp and warps per block; `hint`: plain, cs or
  /// l2_256 (the family's parameters).
  SlotRmw(Gpu& gpu, int rows, int warps, std::string hint)
      : gpu_(&gpu), rows_(rows), warps_(warps), hint_(std::move(hint)) {
    kernel_ = &gpu.runtime().load(
        KernelSpec::make(
            "bench_slot_rmw",
            {{"rows", std::to_string(rows)}, {"warps", std::to_string(warps)}, {"hint", hint_}},
            gpu.limits.arch),
        gpu.device);
  }

  std::string name() const { return fmt::format("rows={},warps={},hint={}", rows_, warps_, hint_); }

  /// Enqueues one call on `batch` rows: params.slots holds them (device i32), params.pool /
  /// slot_bytes / inputs / output / delta as the caller sets them; tiles_per_slot is set here.
  void launch(Stream stream, SlotRmwParams params, std::size_t batch) const {
    const std::size_t tile_bytes = static_cast<std::size_t>(rows_) * warps_ * 512;
    const bool vectors = params.input_bytes[0] % 16 == 0 && params.input_bytes[1] % 16 == 0 &&
                         params.output_bytes % 16 == 0 && params.output_bytes > 0;
    const std::size_t tiles = params.slot_bytes / tile_bytes;
    if (params.slot_bytes % tile_bytes != 0 || !vectors || batch * tiles > 0x7fffffffu) {
      throw std::invalid_argument(fmt::format(
          "bench_slot_rmw {}: slots of {} bytes are not whole tiles of {} bytes, the inputs or "
          "the output not 16-byte vectors (or no output), or {} x {} blocks too many",
          name(), params.slot_bytes, tile_bytes, batch, tiles));
    }
    params.tiles_per_slot = static_cast<std::uint32_t>(tiles);
    const auto blocks = static_cast<std::uint32_t>(batch * tiles);
    gpu_->runtime().launch(
        *kernel_, LaunchShape{{blocks, 1, 1}, {static_cast<std::uint32_t>(32 * warps_), 1, 1}, 0},
        stream, &params, sizeof params);
  }

 private:
  Gpu* gpu_;
  int rows_, warps_;
  std::string hint_;
  const LoadedKernel* kernel_ = nullptr;
};

/// A SlotRmw shape: 512-byte rows per warp, warps per block, the pool's cache hint.
struct FloorShape {
  int rows, warps;
  const char* hint;
};

/// The floor's candidates: a SlotRmw shape with the slot lists as drawn (the op's) or each list
/// sorted ascending (a floor may take the better order for free). An op's floor is the fastest
/// candidate that passed check_floor.
struct FloorCandidate {
  const SlotRmw* kernel;
  bool ascending;
  std::string name() const {
    return kernel->name() + (ascending ? ",order=ascending" : ",order=given");
  }
};

/// A pool slot the floor check reads back, and its bytes before the check.
struct FloorSample {
  std::int32_t slot;
  bool touched;
  std::vector<std::uint32_t> before;
};

/// The fastest of the floor's candidates as they are timed: overall (`us`, `kernel`), with the
/// slots as drawn (`given_us`), and every candidate's us as JSON members (`candidates_json`).
struct FloorBest {
  double us = -1, given_us = -1;
  std::string kernel, candidates_json;

  void add(const FloorCandidate& candidate, double candidate_us) {
    if (us < 0 || candidate_us < us) {
      us = candidate_us;
      kernel = candidate.name();
    }
    if (!candidate.ascending && (given_us < 0 || candidate_us < given_us)) given_us = candidate_us;
    candidates_json += fmt::format("{}\"{}\":{:.3f}", candidates_json.empty() ? "" : ",",
                                   candidate.name(), candidate_us);
  }
};

/// Each list of `lists` (`batch` slots each, one after the other) sorted ascending: the
/// candidates that take a call's slots in address order.
inline std::vector<std::int32_t> sorted_per_list(std::vector<std::int32_t> lists,
                                                 std::int64_t batch) {
  for (std::size_t at = 0; at + static_cast<std::size_t>(batch) <= lists.size();
       at += static_cast<std::size_t>(batch)) {
    std::sort(lists.begin() + static_cast<std::ptrdiff_t>(at),
              lists.begin() + static_cast<std::ptrdiff_t>(at + static_cast<std::size_t>(batch)));
  }
  return lists;
}

/// `words` 32-bit words of `buffer` from byte `offset`.
inline std::vector<std::uint32_t> download_words(const DeviceBuffer& buffer, std::size_t offset,
                                                 std::size_t words) {
  std::vector<std::uint32_t> host(words);
  check(cu().cuCtxSynchronize(), "cuCtxSynchronize");
  check(cu().cuMemcpyDtoH(host.data(), buffer.ptr() + offset, words * 4), "cuMemcpyDtoH");
  return host;
}

/// The slots check_floor reads back for a call on `list` (its first `batch` entries) in a pool
/// of `slots` slots: the list's first, middle and last and the first slot it leaves alone (none
/// when it touches every slot); their bytes come from snapshot_floor_samples.
inline std::vector<FloorSample> floor_samples(const std::int32_t* list, std::int64_t batch,
                                              std::int64_t slots) {
  std::vector<FloorSample> samples;
  for (const std::int64_t n : {std::int64_t{0}, batch / 2, batch - 1}) {
    const std::int32_t slot = list[n];
    if (std::none_of(samples.begin(), samples.end(),
                     [&](const FloorSample& s) { return s.slot == slot; })) {
      samples.push_back(FloorSample{slot, true, {}});
    }
  }
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    if (std::find(list, list + batch, slot) == list + batch) {
      samples.push_back(FloorSample{static_cast<std::int32_t>(slot), false, {}});
      break;
    }
  }
  return samples;
}

/// The samples' bytes now (again after a failed check, which may leave its + 1 behind).
inline void snapshot_floor_samples(std::vector<FloorSample>& samples, const DeviceBuffer& pool,
                                   std::size_t slot_bytes) {
  for (FloorSample& sample : samples) {
    sample.before =
        download_words(pool, static_cast<std::size_t>(sample.slot) * slot_bytes, slot_bytes / 4);
  }
}

/// The 32-bit words a bench_slot_rmw call with `delta` writes to an output of `out_words`:
/// output vector g is the xor of input vectors g, g + n, g + 2n, ... (n output vectors, the
/// inputs one after the other) plus delta, i.e. word i of the inputs lands on word i mod
/// out_words, xor-folded, plus delta.
inline std::vector<std::uint32_t> floor_output(const std::vector<std::uint32_t>& inputs,
                                               std::size_t out_words, std::uint32_t delta) {
  std::vector<std::uint32_t> out(out_words, 0);
  for (std::size_t i = 0; i < inputs.size(); ++i) out[i % out_words] ^= inputs[i];
  for (std::uint32_t& word : out) word += delta;
  return out;
}

/// Runs a floor candidate on `params` (its first slot list) with delta 1 and then 0xffffffff (so
/// the pool is back to its bytes) and reads the samples back after each: every word of a touched
/// slot must read before + 1 and then before, an untouched slot its bytes throughout, and the
/// output (after the first) the fold of the inputs + 1. "" when so, else the first difference
/// (or why the shape cannot run): a kernel that skips a slot, writes the wrong one or loses its
/// stores fails here rather than timing as a fast floor.
inline std::string check_floor(Gpu& gpu, const FloorCandidate& candidate, SlotRmwParams params,
                               std::int64_t batch, const DeviceBuffer& pool,
                               const std::vector<FloorSample>& samples, const DeviceBuffer& out,
                               const std::vector<std::uint32_t>& want_out) {
  const std::size_t slot_words = params.slot_bytes / 4;
  for (const std::uint32_t delta : {1u, 0xffffffffu}) {
    params.delta = delta;
    try {
      candidate.kernel->launch(gpu.stream, params, static_cast<std::size_t>(batch));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    gpu.synchronize();
    for (const FloorSample& sample : samples) {
      const auto got = download_words(
          pool, static_cast<std::size_t>(sample.slot) * params.slot_bytes, slot_words);
      const std::uint32_t added = sample.touched && delta == 1 ? 1 : 0;
      for (std::size_t i = 0; i < slot_words; ++i) {
        if (got[i] != sample.before[i] + added) {
          return fmt::format(
              "{} slot {} word {} after delta {:#x}: {:#010x}, expected {:#010x} (the slot's "
              "bytes before the check{})",
              sample.touched ? "touched" : "untouched", sample.slot, i, delta, got[i],
              sample.before[i] + added, added != 0 ? " + 1" : "");
        }
      }
    }
    if (delta == 1) {
      const auto got = download_words(out, 0, want_out.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        if (got[i] != want_out[i]) {
          return fmt::format("output word {}: {:#010x}, expected {:#010x}", i, got[i], want_out[i]);
        }
      }
    }
  }
  return {};
}

/// cu_seqlens of `seqs` uneven lengths summing to `tokens`: weights 1..seqs shuffled by `seed`,
/// so the longest sequence is ~2 / seqs of the batch (it bounds a per-sequence recurrence).
inline std::vector<std::int32_t> uneven_offsets(std::int64_t tokens, std::int64_t seqs,
                                                std::uint64_t seed) {
  std::vector<std::int64_t> weights(static_cast<std::size_t>(seqs));
  for (std::int64_t i = 0; i < seqs; ++i) weights[static_cast<std::size_t>(i)] = i + 1;
  std::shuffle(weights.begin(), weights.end(), std::mt19937_64(seed));
  const std::int64_t total = seqs * (seqs + 1) / 2;
  std::vector<std::int32_t> cu{0};
  std::int64_t used = 0;
  for (std::int64_t i = 0; i < seqs; ++i) {
    const std::int64_t len =
        i + 1 == seqs ? tokens - used : tokens * weights[static_cast<std::size_t>(i)] / total;
    used += len;
    cu.push_back(static_cast<std::int32_t>(used));
  }
  return cu;
}

/// Fills `count` elements of `dtype` with N(0,1) * scale (distinct values for the first 16M
/// elements, then repeating), on the host, uploaded once.
inline void fill_random(DeviceBuffer& buffer, DType dtype, std::size_t count, std::uint64_t seed,
                        double scale = 1.0) {
  const std::size_t esize = size_of(dtype);
  const std::size_t distinct = std::min<std::size_t>(count, std::size_t{1} << 24);
  std::vector<unsigned char> host(distinct * esize);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::size_t i = 0; i < distinct; ++i) {
    support::store_from_double(host.data(), dtype, static_cast<std::int64_t>(i),
                               normal(rng) * scale);
  }
  for (std::size_t done = 0; done < count; done += distinct) {
    const std::size_t n = std::min(distinct, count - done);
    check(cu().cuCtxSynchronize(), "cuCtxSynchronize");
    check(cu().cuMemcpyHtoD(buffer.ptr() + done * esize, host.data(), n * esize), "cuMemcpyHtoD");
  }
}

}  // namespace kjit::bench
