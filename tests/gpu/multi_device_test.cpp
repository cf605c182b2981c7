// SPDX-License-Identifier: Apache-2.0
// Several devices (or several threads on one device) in one process: every op launched from
// concurrent threads, each on its own device's stream, checked against the float64 references;
// each kernel loaded once per device; a stream of one device never receives another device's
// function; a thread with no current context, or another device's context current, still runs
// on the device it asked for and keeps its own context. Written for any number of devices: with
// one GPU the threads share it, with N each device gets two threads.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/gpu.hpp"
#include "common/host_data.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"
#include "ops/gdn_prefill_reference.hpp"
#include "ops/gdn_reference.hpp"
#include "ops/merge_state_reference.hpp"
#include "support/numeric.hpp"
#include "templates/probe/params.h"

namespace kjit {
namespace {

/// Plan twins validate pointers (non-null, aligned) but never dereference them: a 1 MiB-aligned
/// address plans like a cuMemAlloc allocation.
void* const kFakeAddress = reinterpret_cast<void*>(std::uintptr_t{1} << 20);

using test::Bytes;
using test::DeviceMemory;
using test::random_bytes;

/// The primary context of `device`, retained for the rest of the process (never released: the
/// suite's runtime holds it too).
CUcontext primary_context(int device) {
  CUdevice dev = 0;
  test::check_cu(test::cu().cuDeviceGet(&dev, device), "cuDeviceGet");
  CUcontext context = nullptr;
  test::check_cu(test::cu().cuDevicePrimaryCtxRetain(&context, dev), "cuDevicePrimaryCtxRetain");
  return context;
}

CUcontext current_context() {
  CUcontext context = nullptr;
  test::check_cu(test::cu().cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  return context;
}

/// Device memory in the current context holding a copy of `host`.
DeviceMemory upload(const Bytes& host) {
  DeviceMemory memory(host.size());
  memory.upload(host.data(), host.size());
  return memory;
}

Bytes download(const DeviceMemory& memory) {
  Bytes host(memory.bytes());
  memory.download(host.data(), host.size());
  return host;
}

/// ||got - ref|| / ||ref||, or +inf when anything is not finite (poison left behind included).
double relative_error(const Bytes& got, const Bytes& ref, DType dtype) {
  const test::Diff diff = test::compare(got, ref, dtype);
  return diff.non_finite != 0 ? INFINITY : diff.rel;
}

/// What one worker saw; checked by the main thread (doctest assertions stay on one thread).
struct WorkerResult {
  int device = 0;
  std::uint64_t seed = 0;
  std::vector<std::string> failures;
  double merge_error = 0, decode_out_error = 0, decode_pool_error = 0;
  double prefill_out_error = 0, prefill_pool_error = 0;
  bool context_kept = true;
};

void expect(WorkerResult& result, bool ok, const std::string& what) {
  if (!ok) result.failures.push_back(what);
}

/// merge_state bf16 at 128 heads x 128 (a shape FlashInfer cannot launch), T = 37.
void merge_on(Runtime& runtime, int device, Stream stream, test::Rng& rng, WorkerResult& result) {
  const std::int64_t t = 37, h = 128, d = 128;
  const Bytes va = random_bytes(rng, DType::bf16, t * h * d, 1.0);
  const Bytes vb = random_bytes(rng, DType::bf16, t * h * d, 1.0);
  const Bytes sa = random_bytes(rng, DType::f32, t * h, 3.0);
  const Bytes sb = random_bytes(rng, DType::f32, t * h, 3.0);
  DeviceMemory dva = upload(va), dvb = upload(vb), dsa = upload(sa), dsb = upload(sb);
  DeviceMemory dvo(va.size()), dso(sa.size());
  dvo.poison();
  dso.poison();
  MergeStateOptions options;
  options.lse_base = LseBase::e;
  options.runtime = &runtime;
  options.device = device;
  const auto view = [](const void* p, DType dt, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<void*>(p), dt, shape);
  };
  merge_state(view(dva.get(), DType::bf16, {t, h, d}), view(dsa.get(), DType::f32, {t, h}),
              view(dvb.get(), DType::bf16, {t, h, d}), view(dsb.get(), DType::f32, {t, h}),
              view(dvo.get(), DType::bf16, {t, h, d}), view(dso.get(), DType::f32, {t, h}), options,
              stream);
  const reference::MergeResult ref = reference::merge_state(
      view(va.data(), DType::bf16, {t, h, d}), view(sa.data(), DType::f32, {t, h}),
      view(vb.data(), DType::bf16, {t, h, d}), view(sb.data(), DType::f32, {t, h}), options);
  Bytes ref_v(va.size()), ref_s(sa.size());
  reference::store(ref, view(ref_v.data(), DType::bf16, {t, h, d}),
                   view(ref_s.data(), DType::f32, {t, h}), options.lse_layout);
  result.merge_error = std::max(relative_error(download(dvo), ref_v, DType::bf16),
                                relative_error(download(dso), ref_s, DType::f32));
  expect(result, result.merge_error <= 1e-2,
         fmt::format("merge_state relative error {}", result.merge_error));
}

/// gdn_decode, raw gates, B = 5 with one padding row, f32 pool, two steps.
void decode_on(Runtime& runtime, int device, Stream stream, test::Rng& rng, WorkerResult& result) {
  const std::int64_t b = 5, h = 2, hv = 4, kd = 128, vd = 128, slots = 8;
  const std::int64_t width = 2 * h * kd + hv * vd;
  Bytes pool = random_bytes(rng, DType::f32, slots * hv * vd * kd, 0.1);
  Bytes indices(static_cast<std::size_t>(b) * 4);
  const std::int32_t slot_of[] = {3, -1, 0, 7, 5};
  std::memcpy(indices.data(), slot_of, sizeof slot_of);
  const Bytes a_log = random_bytes(rng, DType::f32, hv, 0.5, -1.0);
  const Bytes dt_bias = random_bytes(rng, DType::f32, hv, 0.5);
  DeviceMemory dpool = upload(pool), didx = upload(indices), dalog = upload(a_log),
               ddt = upload(dt_bias);
  GdnDecodeOptions options;
  options.runtime = &runtime;
  options.device = device;
  const auto view = [](const void* p, DType dt, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<void*>(p), dt, shape);
  };
  for (int step = 0; step < 2; ++step) {
    const Bytes qkv = random_bytes(rng, DType::bf16, b * width, 1.0);
    const Bytes ga = random_bytes(rng, DType::bf16, b * hv, 1.0);
    const Bytes gb = random_bytes(rng, DType::bf16, b * hv, 1.0);
    DeviceMemory dqkv = upload(qkv), dga = upload(ga), dgb = upload(gb);
    DeviceMemory dout(static_cast<std::size_t>(b * hv * vd) * 2);
    dout.poison();
    gdn_decode(view(dqkv.get(), DType::bf16, {b, width}), view(dga.get(), DType::bf16, {b, hv}),
               view(dgb.get(), DType::bf16, {b, hv}), view(dalog.get(), DType::f32, {hv}),
               view(ddt.get(), DType::f32, {hv}),
               view(dpool.get(), DType::f32, {slots, hv, vd, kd}),
               view(didx.get(), DType::i32, {b}), view(dout.get(), DType::bf16, {b, hv, vd}),
               options, stream);
    Bytes ref_out(dout.bytes());
    reference::gdn_decode_reference(
        view(qkv.data(), DType::bf16, {b, width}), view(ga.data(), DType::bf16, {b, hv}),
        view(gb.data(), DType::bf16, {b, hv}), view(a_log.data(), DType::f32, {hv}),
        view(dt_bias.data(), DType::f32, {hv}), view(pool.data(), DType::f32, {slots, hv, vd, kd}),
        view(indices.data(), DType::i32, {b}), view(ref_out.data(), DType::bf16, {b, hv, vd}),
        options);
    result.decode_out_error =
        std::max(result.decode_out_error, relative_error(download(dout), ref_out, DType::bf16));
    // The device pool goes on to the next step; the host pool already holds the reference's.
    result.decode_pool_error =
        std::max(result.decode_pool_error, relative_error(download(dpool), pool, DType::f32));
  }
  expect(result, result.decode_out_error <= 2e-2,
         fmt::format("gdn_decode output relative error {}", result.decode_out_error));
  expect(result, result.decode_pool_error <= 1e-3,
         fmt::format("gdn_decode pool relative error {}", result.decode_pool_error));
}

/// gdn_prefill: lengths 65, 0, 1, 100 (one padding sequence), bf16, f32 pool.
void prefill_on(Runtime& runtime, int device, Stream stream, test::Rng& rng, WorkerResult& result) {
  const std::vector<std::int32_t> cu = {0, 65, 65, 66, 166};
  const std::vector<std::int32_t> slot_of = {2, 0, -1, 4};
  const std::int64_t n = 4, t = cu.back(), h = 2, hv = 2, kd = 128, vd = 128, slots = 6;
  Bytes cu_host(cu.size() * 4), idx_host(slot_of.size() * 4);
  std::memcpy(cu_host.data(), cu.data(), cu_host.size());
  std::memcpy(idx_host.data(), slot_of.data(), idx_host.size());
  const Bytes q = random_bytes(rng, DType::bf16, t * h * kd, 1.0);
  const Bytes k = random_bytes(rng, DType::bf16, t * h * kd, 1.0);
  const Bytes v = random_bytes(rng, DType::bf16, t * hv * vd, 1.0);
  const Bytes ga = random_bytes(rng, DType::bf16, t * hv, 1.0);
  const Bytes gb = random_bytes(rng, DType::bf16, t * hv, 1.0);
  const Bytes a_log = random_bytes(rng, DType::f32, hv, 0.5, -1.0);
  const Bytes dt_bias = random_bytes(rng, DType::f32, hv, 0.5);
  Bytes pool = random_bytes(rng, DType::f32, slots * hv * vd * kd, 0.3);
  DeviceMemory dq = upload(q), dk = upload(k), dv = upload(v), dga = upload(ga), dgb = upload(gb),
               dalog = upload(a_log), ddt = upload(dt_bias), dcu = upload(cu_host),
               didx = upload(idx_host), dpool = upload(pool);
  DeviceMemory dout(static_cast<std::size_t>(t * hv * vd) * 2);
  dout.poison();
  const auto view = [](const void* p, DType dt, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(const_cast<void*>(p), dt, shape);
  };
  const auto gates = [&](const void* a, const void* b, const void* al, const void* dt) {
    return GdnGates::raw(view(a, DType::bf16, {t, hv}), view(b, DType::bf16, {t, hv}),
                         view(al, DType::f32, {hv}), view(dt, DType::f32, {hv}));
  };
  GdnPrefillOptions options;
  options.runtime = &runtime;
  options.device = device;
  gdn_prefill(view(dq.get(), DType::bf16, {t, h, kd}), view(dk.get(), DType::bf16, {t, h, kd}),
              view(dv.get(), DType::bf16, {t, hv, vd}),
              gates(dga.get(), dgb.get(), dalog.get(), ddt.get()),
              view(dcu.get(), DType::i32, {n + 1}),
              view(dpool.get(), DType::f32, {slots, hv, vd, kd}), view(didx.get(), DType::i32, {n}),
              TensorView{}, view(dout.get(), DType::bf16, {t, hv, vd}), options, stream);
  Bytes ref_out(dout.bytes());
  ops::gdn_prefill_reference(
      view(q.data(), DType::bf16, {t, h, kd}), view(k.data(), DType::bf16, {t, h, kd}),
      view(v.data(), DType::bf16, {t, hv, vd}),
      gates(ga.data(), gb.data(), a_log.data(), dt_bias.data()),
      view(cu_host.data(), DType::i32, {n + 1}), view(pool.data(), DType::f32, {slots, hv, vd, kd}),
      view(idx_host.data(), DType::i32, {n}), TensorView{},
      view(ref_out.data(), DType::bf16, {t, hv, vd}), options);
  result.prefill_out_error = relative_error(download(dout), ref_out, DType::bf16);
  result.prefill_pool_error = relative_error(download(dpool), pool, DType::f32);
  expect(result, result.prefill_out_error <= 2e-2,
         fmt::format("gdn_prefill output relative error {}", result.prefill_out_error));
  expect(result, result.prefill_pool_error <= 2e-2,
         fmt::format("gdn_prefill pool relative error {}", result.prefill_pool_error));
}

/// One worker: its device's primary context current on this thread, its own stream, every op
/// `rounds` times on fresh inputs.
void work(Runtime& runtime, int device, std::uint64_t seed, int rounds, WorkerResult& result) {
  result.device = device;
  result.seed = seed;
  try {
    const CUcontext context = primary_context(device);
    test::check_cu(test::cu().cuCtxSetCurrent(context), "cuCtxSetCurrent");
    CUstream stream = nullptr;
    test::check_cu(test::cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    test::Rng rng(seed);
    for (int round = 0; round < rounds; ++round) {
      const auto s = reinterpret_cast<Stream>(stream);
      merge_on(runtime, device, s, rng, result);
      decode_on(runtime, device, s, rng, result);
      prefill_on(runtime, device, s, rng, result);
      result.context_kept = result.context_kept && current_context() == context;
    }
    test::check_cu(test::cu().cuStreamSynchronize(stream), "cuStreamSynchronize");
    test::check_cu(test::cu().cuStreamDestroy(stream), "cuStreamDestroy");
  } catch (const std::exception& error) {
    result.failures.push_back(fmt::format("threw: {}", error.what()));
  }
}

/// The specs the workers' three ops plan on a device with `limits` (the plan twins take the same
/// shapes with null data).
std::set<std::string> specs_used(const DeviceLimits& limits) {
  std::set<std::string> specs;
  const auto add = [&](const Plan& plan) {
    for (const PlannedLaunch& launch : plan.launches) specs.insert(launch.spec.str());
  };
  const auto view = [](DType dt, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(kFakeAddress, dt, shape);
  };
  MergeStateOptions merge;
  merge.lse_base = LseBase::e;
  add(plan_merge_state(view(DType::bf16, {37, 128, 128}), view(DType::f32, {37, 128}),
                       view(DType::bf16, {37, 128, 128}), view(DType::f32, {37, 128}),
                       view(DType::bf16, {37, 128, 128}), view(DType::f32, {37, 128}), merge,
                       limits));
  add(plan_gdn_decode(view(DType::bf16, {5, 2 * 2 * 128 + 4 * 128}), view(DType::bf16, {5, 4}),
                      view(DType::bf16, {5, 4}), view(DType::f32, {4}), view(DType::f32, {4}),
                      view(DType::f32, {8, 4, 128, 128}), view(DType::i32, {5}),
                      view(DType::bf16, {5, 4, 128}), GdnDecodeOptions{}, limits));
  add(plan_gdn_prefill(view(DType::bf16, {166, 2, 128}), view(DType::bf16, {166, 2, 128}),
                       view(DType::bf16, {166, 2, 128}),
                       GdnGates::raw(view(DType::bf16, {166, 2}), view(DType::bf16, {166, 2}),
                                     view(DType::f32, {2}), view(DType::f32, {2})),
                       view(DType::i32, {5}), view(DType::f32, {6, 2, 128, 128}),
                       view(DType::i32, {4}), TensorView{}, view(DType::bf16, {166, 2, 128}),
                       GdnPrefillOptions{}, limits));
  return specs;
}

Settings suite_settings() {
  Settings settings = Settings::from_env();
  if (std::getenv("KJIT_CACHE_DIR") == nullptr) {
    settings.cache_dir = std::string(KJIT_BINARY_DIR) + "/test-cache";
  }
  return settings;
}

}  // namespace

TEST_CASE("multi-device: every op from two threads per device, each checked against float64") {
  test::runtime();  // the suite's context and driver first
  const int devices = test::runtime().device_count();
  const std::string note = devices < 2 ? " (one GPU: two threads share it; the cross-device "
                                         "checks need a second GPU)"
                                       : "";
  MESSAGE("devices: " << devices << note);
  // A runtime of its own, so that its load counter sees only this test.
  Runtime runtime(suite_settings());
  const std::uint64_t seed = test::fresh_seed();
  std::vector<WorkerResult> results(static_cast<std::size_t>(devices) * 2);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back(work, std::ref(runtime), static_cast<int>(i) / 2, seed + i, 3,
                         std::ref(results[i]));
  }
  for (std::thread& thread : threads) thread.join();
  for (const WorkerResult& r : results) {
    INFO("device " << r.device << ", seed " << r.seed);
    MESSAGE("device " << r.device << ": merge_state " << r.merge_error << ", gdn_decode out "
                      << r.decode_out_error << " pool " << r.decode_pool_error
                      << ", gdn_prefill out " << r.prefill_out_error << " pool "
                      << r.prefill_pool_error << " (relative errors)");
    for (const std::string& failure : r.failures) FAIL_CHECK(failure);
    CHECK(r.context_kept);
  }
  // Each kernel was loaded once per device, whatever the threads raced for: the specs the three
  // ops use on a device, times the devices.
  const std::set<std::string> specs = specs_used(runtime.device_limits(0));
  const CacheStats stats = runtime.stats();
  MESSAGE("loads: " << stats.loads << " for " << devices << " device(s); compiles "
                    << stats.compiles << ", disk hits " << stats.disk_hits);
  CHECK(stats.loads == specs.size() * static_cast<std::uint64_t>(devices));
}

TEST_CASE("multi-device: a thread with no current context runs on the device it names") {
  Runtime& runtime = test::runtime();
  const int devices = runtime.device_count();
  for (int device = 0; device < devices; ++device) {
    WorkerResult result;
    std::thread([&] {
      // No cuCtxSetCurrent: the default stream and options.device pick the device, and the
      // thread is left without a context as it started.
      try {
        test::check_cu(test::cu().cuCtxSetCurrent(nullptr), "cuCtxSetCurrent");
        const CUcontext context = primary_context(device);
        test::Rng rng(test::fresh_seed());
        // Inputs are allocated in the device's context, then the thread drops it again.
        test::check_cu(test::cu().cuCtxSetCurrent(context), "cuCtxSetCurrent");
        const Bytes va = random_bytes(rng, DType::f32, 3 * 4 * 64, 1.0);
        const Bytes vb = random_bytes(rng, DType::f32, 3 * 4 * 64, 1.0);
        const Bytes sa = random_bytes(rng, DType::f32, 3 * 4, 2.0);
        const Bytes sb = random_bytes(rng, DType::f32, 3 * 4, 2.0);
        DeviceMemory dva = upload(va), dvb = upload(vb), dsa = upload(sa), dsb = upload(sb),
                     dvo(va.size()), dso(sa.size());
        dvo.poison();
        dso.poison();
        test::check_cu(test::cu().cuCtxSetCurrent(nullptr), "cuCtxSetCurrent");
        MergeStateOptions options;
        options.lse_base = LseBase::e;
        options.runtime = &runtime;
        options.device = device;
        const auto view = [](const void* p, DType dt, std::initializer_list<std::int64_t> s) {
          return TensorView::contiguous(const_cast<void*>(p), dt, s);
        };
        merge_state(view(dva.get(), DType::f32, {3, 4, 64}), view(dsa.get(), DType::f32, {3, 4}),
                    view(dvb.get(), DType::f32, {3, 4, 64}), view(dsb.get(), DType::f32, {3, 4}),
                    view(dvo.get(), DType::f32, {3, 4, 64}), view(dso.get(), DType::f32, {3, 4}),
                    options, nullptr);
        result.context_kept = current_context() == nullptr;
        test::check_cu(test::cu().cuCtxSetCurrent(context), "cuCtxSetCurrent");
        const reference::MergeResult ref = reference::merge_state(
            view(va.data(), DType::f32, {3, 4, 64}), view(sa.data(), DType::f32, {3, 4}),
            view(vb.data(), DType::f32, {3, 4, 64}), view(sb.data(), DType::f32, {3, 4}), options);
        Bytes ref_v(va.size()), ref_s(sa.size());
        reference::store(ref, view(ref_v.data(), DType::f32, {3, 4, 64}),
                         view(ref_s.data(), DType::f32, {3, 4}), options.lse_layout);
        result.merge_error = std::max(relative_error(download(dvo), ref_v, DType::f32),
                                      relative_error(download(dso), ref_s, DType::f32));
        test::check_cu(test::cu().cuCtxSetCurrent(nullptr), "cuCtxSetCurrent");
      } catch (const std::exception& error) {
        result.failures.push_back(error.what());
      }
    }).join();
    INFO("device " << device);
    for (const std::string& failure : result.failures) FAIL_CHECK(failure);
    CHECK(result.context_kept);
    CHECK(result.merge_error <= 1e-5);
    MESSAGE("device " << device << ": relative error " << result.merge_error);
  }
}

TEST_CASE("multi-device: a device that does not exist is refused by name") {
  Runtime& runtime = test::runtime();
  const int devices = runtime.device_count();
  DeviceMemory dv(4 * 64 * 4), ds(4 * 4);
  MergeStateOptions options;
  options.lse_base = LseBase::e;
  options.runtime = &runtime;
  options.device = devices;
  TensorView v = TensorView::contiguous(dv.get(), DType::f32, {4, 1, 64});
  TensorView s = TensorView::contiguous(ds.get(), DType::f32, {4, 1});
  try {
    merge_state(v, s, v, s, v, s, options, nullptr);
    FAIL("device " << devices << " was accepted");
  } catch (const InvalidArgument& error) {
    const std::string what = error.what();
    INFO(what);
    CHECK(what.find(fmt::format("device {} does not exist", devices)) != std::string::npos);
  }
}

TEST_CASE("multi-device: another device's stream is refused before the driver sees it") {
  Runtime& runtime = test::runtime();
  const int devices = runtime.device_count();
  if (devices < 2) {
    MESSAGE("SKIPPED: needs two devices, this process sees " << devices);
    return;
  }
  // A stream and buffers of device 1; kernels of device 0.
  const CUcontext other = primary_context(1);
  test::check_cu(test::cu().cuCtxSetCurrent(other), "cuCtxSetCurrent");
  CUstream foreign = nullptr;
  test::check_cu(test::cu().cuStreamCreate(&foreign, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  test::Rng rng(test::fresh_seed());
  const Bytes va = random_bytes(rng, DType::f32, 4 * 2 * 64, 1.0);
  const Bytes sa = random_bytes(rng, DType::f32, 4 * 2, 2.0);
  DeviceMemory dv = upload(va), ds = upload(sa), dvo(va.size()), dso(sa.size());
  dvo.poison();
  dso.poison();
  const Bytes poisoned = download(dvo);
  test::context();  // back to device 0 (the suite's device)
  MergeStateOptions options;
  options.lse_base = LseBase::e;
  options.runtime = &runtime;
  options.device = 0;
  TensorView v = TensorView::contiguous(dv.get(), DType::f32, {4, 2, 64});
  TensorView s = TensorView::contiguous(ds.get(), DType::f32, {4, 2});
  TensorView vo = TensorView::contiguous(dvo.get(), DType::f32, {4, 2, 64});
  TensorView so = TensorView::contiguous(dso.get(), DType::f32, {4, 2});
  const auto stream = reinterpret_cast<Stream>(foreign);
  // Through an op: options.device says 0, the stream says 1.
  CHECK_THROWS_WITH_AS(merge_state(v, s, v, s, vo, so, options, stream),
                       doctest::Contains("belongs to device 1"), InvalidArgument);
  // Through the runtime: a device-0 kernel on a device-1 stream.
  const KernelSpec spec = KernelSpec::parse(
      fmt::format("probe:heavy=0@{}", runtime.device_limits(0).arch.base().str()));
  const LoadedKernel& kernel = runtime.load(spec, 0);
  const ProbeParams params{static_cast<float*>(dvo.get()), 64, 1.0f, 0};
  CHECK_THROWS_WITH_AS(
      runtime.launch(kernel, LaunchShape{{1, 1, 1}, {64, 1, 1}, 0}, stream, &params, sizeof params),
      doctest::Contains("not to the primary context of device 0"), InvalidArgument);
  test::check_cu(test::cu().cuCtxSetCurrent(other), "cuCtxSetCurrent");
  CHECK(download(dvo) == poisoned);  // nothing ran
  // options.device = -1 runs on the stream's device, while device 0's context stays current.
  test::context();
  options.device = -1;
  merge_state(v, s, v, s, vo, so, options, stream);
  CHECK(current_context() == test::context());
  test::check_cu(test::cu().cuCtxSetCurrent(other), "cuCtxSetCurrent");
  test::check_cu(test::cu().cuStreamSynchronize(foreign), "cuStreamSynchronize");
  const reference::MergeResult ref = reference::merge_state(
      TensorView::contiguous(const_cast<unsigned char*>(va.data()), DType::f32, {4, 2, 64}),
      TensorView::contiguous(const_cast<unsigned char*>(sa.data()), DType::f32, {4, 2}),
      TensorView::contiguous(const_cast<unsigned char*>(va.data()), DType::f32, {4, 2, 64}),
      TensorView::contiguous(const_cast<unsigned char*>(sa.data()), DType::f32, {4, 2}), options);
  Bytes ref_v(va.size()), ref_s(sa.size());
  reference::store(ref, TensorView::contiguous(ref_v.data(), DType::f32, {4, 2, 64}),
                   TensorView::contiguous(ref_s.data(), DType::f32, {4, 2}), options.lse_layout);
  const double error = std::max(relative_error(download(dvo), ref_v, DType::f32),
                                relative_error(download(dso), ref_s, DType::f32));
  MESSAGE("merge_state on device 1's stream with options.device = -1: relative error " << error);
  CHECK(error <= 1e-5);
  test::check_cu(test::cu().cuStreamDestroy(foreign), "cuStreamDestroy");
  test::context();
}

}  // namespace kjit
