// SPDX-License-Identifier: Apache-2.0
// merge_state benchmark (method: shared/BENCHMARKING.md). bf16, D in {64,128,256,512},
// H in {8,32,64,128,256}, T in {1,64,4096,16384}: median GPU us, GB/s, ratio to a same-size
// device copy, the mode the planner chose; every shape is first checked against the float64
// reference on sampled rows. Inputs rotate through >= 512 MB of buffers so timed calls read
// cold data.
//
// KJIT_MERGE_BENCH_DIRTY=1: each shape also timed with 64 MiB of unrelated writes before every
// call, leaving L2 dirty as a serving engine's previous kernels do. KJIT_BENCH_CUPTI=1: T = 1
// shapes also by kernel duration beside an empty kernel and a copy (bench/activity_timer.hpp).
//
//   bench_merge_state [out.jsonl] [--modes]   (--modes: also time every forced grid mode)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// kjit/types.hpp before harness.hpp: GCC's -Wshadow otherwise reports DType's i32 / i64
// enumerators as shadowing kjit::i32 / kjit::i64 of kjit/common/types.h.
#include "kjit/types.hpp"
// (keep this order)
#include "activity_timer.hpp"
#include "harness.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/merge_state.hpp"
#include "ops/merge_state_reference.hpp"
#include "support/numeric.hpp"

namespace {

using kjit::DType;
using kjit::TensorView;

constexpr std::size_t kPoolBytes = std::size_t{512} << 20;
constexpr std::size_t kAlign = 256;

std::size_t round_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// One problem size laid out as `slots` copies of (v_a, v_b, v_out) in one pool and
/// (s_a, s_b, s_out) in another; call i uses a slot far from call i-1's.
struct Pools {
  std::int64_t t, h, d;
  std::size_t v_bytes, s_bytes, slots;
  kjit::bench::DeviceBuffer v_pool, s_pool;

  Pools(std::int64_t tokens, std::int64_t heads, std::int64_t dim, std::size_t v_tensor,
        std::size_t s_tensor, std::size_t n)
      : t(tokens),
        h(heads),
        d(dim),
        v_bytes(v_tensor),
        s_bytes(s_tensor),
        slots(n),
        v_pool(3 * v_tensor * n),
        s_pool(3 * s_tensor * n) {}

  void* v(std::size_t slot, int which) const {
    return static_cast<char*>(v_pool.get()) +
           (3 * slot + static_cast<std::size_t>(which)) * v_bytes;
  }
  void* s(std::size_t slot, int which) const {
    return static_cast<char*>(s_pool.get()) +
           (3 * slot + static_cast<std::size_t>(which)) * s_bytes;
  }
  TensorView vv(std::size_t slot, int which) const {
    return TensorView::contiguous(v(slot, which), DType::bf16, {t, h, d});
  }
  TensorView sv(std::size_t slot, int which) const {
    return TensorView::contiguous(s(slot, which), DType::f32, {t, h});
  }
};

void run_merge(const Pools& p, std::size_t slot, const kjit::MergeStateOptions& options,
               kjit::Stream stream) {
  kjit::merge_state(p.vv(slot, 0), p.sv(slot, 0), p.vv(slot, 1), p.sv(slot, 1), p.vv(slot, 2),
                    p.sv(slot, 2), options, stream);
}

/// Max abs error over tokens {0, T/2, T-1} (all heads) of slot 0 against the reference; -1 on
/// a NaN or an error above tolerance (bf16: 1e-2 + 2^-8 |v|; s: 1e-4 max(1, |s|)).
double verify(kjit::bench::Gpu& gpu, const Pools& p, const kjit::MergeStateOptions& options,
              std::string* detail) {
  run_merge(p, 0, options, gpu.stream);
  gpu.synchronize();
  const std::int64_t row = p.h * p.d;
  double max_err = 0.0;
  for (std::int64_t t : {std::int64_t{0}, p.t / 2, p.t - 1}) {
    std::vector<std::uint16_t> a(static_cast<std::size_t>(row)), b(a.size()), o(a.size());
    std::vector<float> sa(static_cast<std::size_t>(p.h)), sb(sa.size()), so(sa.size());
    const std::size_t v_off = static_cast<std::size_t>(t * row * 2);
    const std::size_t s_off = static_cast<std::size_t>(t * p.h * 4);
    auto get = [&](void* dst, const void* base, std::size_t offset, std::size_t bytes) {
      kjit::bench::check(
          kjit::bench::cu().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(base) + offset, bytes),
          "cuMemcpyDtoH");
    };
    get(a.data(), p.v(0, 0), v_off, a.size() * 2);
    get(b.data(), p.v(0, 1), v_off, b.size() * 2);
    get(o.data(), p.v(0, 2), v_off, o.size() * 2);
    get(sa.data(), p.s(0, 0), s_off, sa.size() * 4);
    get(sb.data(), p.s(0, 1), s_off, sb.size() * 4);
    get(so.data(), p.s(0, 2), s_off, so.size() * 4);
    const auto ref = kjit::reference::merge_state(
        TensorView::contiguous(a.data(), DType::bf16, {1, p.h, p.d}),
        TensorView::contiguous(sa.data(), DType::f32, {1, p.h}),
        TensorView::contiguous(b.data(), DType::bf16, {1, p.h, p.d}),
        TensorView::contiguous(sb.data(), DType::f32, {1, p.h}), options);
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      const double s_want = ref.s_at(0, hh);
      const double s_got = so[static_cast<std::size_t>(hh)];
      if (std::isnan(s_got) ||
          !(std::fabs(s_got - s_want) <= 1e-4 * std::max(1.0, std::fabs(s_want)))) {
        *detail = fmt::format("s[{}, {}] = {} expected {}", t, hh, s_got, s_want);
        return -1.0;
      }
      for (std::int64_t dd = 0; dd < p.d; ++dd) {
        const double got = kjit::support::bf16_to_float(o[static_cast<std::size_t>(hh * p.d + dd)]);
        const double want = ref.v_at(0, hh, dd);
        const double err = std::fabs(got - want);
        if (std::isnan(got) || !(err <= 1e-2 + std::ldexp(std::fabs(want), -8))) {
          *detail = fmt::format("v[{}, {}, {}] = {} expected {}", t, hh, dd, got, want);
          return -1.0;
        }
        max_err = std::max(max_err, err);
      }
    }
  }
  return max_err;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool all_modes = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--modes") == 0) {
      all_modes = true;
    } else {
      json_path = argv[i];
    }
  }
  std::string why;
  auto opened = kjit::bench::Gpu::open(&why);
  if (!opened) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  kjit::bench::Gpu& gpu = *opened;
  std::FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  const char* dirty_env = std::getenv("KJIT_MERGE_BENCH_DIRTY");
  const bool dirty_protocol = dirty_env != nullptr && std::string(dirty_env) == "1";
  // KJIT_BENCH_CUPTI=1: T = 1 shapes also by kernel duration (bench/activity_timer.hpp).
  kjit::bench::ActivityTimer* durations = nullptr;
  if (const char* env = std::getenv("KJIT_BENCH_CUPTI");
      env != nullptr && std::string(env) == "1") {
    std::string cupti_why;
    durations = kjit::bench::ActivityTimer::get(&cupti_why);
    if (durations == nullptr) std::printf("kernel durations unavailable: %s\n", cupti_why.c_str());
  }
  const double empty_us = kjit::bench::empty_kernel_us(gpu);
  std::printf("device %s, %d SMs; empty kernel %.2f us (event pair)\n", gpu.limits.name.c_str(),
              gpu.limits.sm_count, empty_us);
  std::printf("%-5s %-5s %-6s %-12s %-16s %10s %9s %6s %7s  %s\n", "D", "H", "T", "mode", "spec",
              "us", "GB/s", "copy", "vs_sgl", "check");
  int failures = 0;
  for (std::int64_t d : {64, 128, 256, 512}) {
    for (std::int64_t h : {8, 32, 64, 128, 256}) {
      for (std::int64_t t : {1, 64, 4096, 16384}) {
        const std::size_t v_tensor = round_up(static_cast<std::size_t>(t * h * d * 2));
        const std::size_t s_tensor = round_up(static_cast<std::size_t>(t * h * 4));
        const std::size_t slot_bytes = 3 * (v_tensor + s_tensor);
        // A set larger than the pool is far larger than L2: one set is cold by itself.
        const std::size_t slots =
            slot_bytes >= kPoolBytes ? 1 : std::max<std::size_t>(2, kPoolBytes / slot_bytes);
        Pools pools(t, h, d, v_tensor, s_tensor, slots);
        kjit::bench::fill_random(pools.v_pool, DType::bf16, pools.v_pool.bytes() / 2, 1);
        kjit::bench::fill_random(pools.s_pool, DType::f32, pools.s_pool.bytes() / 4, 2, 10.0);

        const double bytes =
            3.0 * static_cast<double>(t * h * d) * 2 + 3.0 * static_cast<double>(t * h) * 4;
        const double copy = kjit::bench::copy_gbs(gpu, static_cast<std::size_t>(bytes));
        std::vector<std::string> modes = {""};
        if (all_modes)
          modes.insert(modes.end(), std::begin(kjit::kMergeStateModes),
                       std::end(kjit::kMergeStateModes));
        for (const std::string& mode : modes) {
          kjit::MergeStateOptions options;
          options.lse_base = kjit::LseBase::two;
          options.force_mode = mode;
          options.runtime = &gpu.runtime();
          options.device = gpu.device;
          const kjit::Plan plan =
              kjit::plan_merge_state(pools.vv(0, 0), pools.sv(0, 0), pools.vv(0, 1), pools.sv(0, 1),
                                     pools.vv(0, 2), pools.sv(0, 2), options, gpu.limits);
          const kjit::KernelSpec& spec = plan.launches.at(0).spec;
          const std::string spec_text = fmt::format("v{}c{}", spec.get("vec"), spec.get("chunks"));
          std::string detail;
          const double err = verify(gpu, pools, options, &detail);
          if (err < 0) ++failures;
          std::size_t call = 0;
          kjit::bench::flush_l2(gpu);
          const int reps = bytes > 1e9 ? 50 : 100;
          const double us = kjit::bench::median_gpu_us(
              gpu,
              [&](kjit::Stream stream) {
                // A stride through the slots that revisits none within one measurement.
                run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
              },
              reps);
          // Serving protocol: the same rotation, each call after 64 MiB of unrelated writes
          // that leave L2 dirty (kjit::bench::dirty_l2).
          double dirty_us = 0;
          if (dirty_protocol) {
            dirty_us = kjit::bench::median_gpu_us(
                gpu,
                [&](kjit::Stream stream) {
                  run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
                },
                reps, 10, [&](kjit::Stream) { kjit::bench::dirty_l2(gpu); });
          }
          const double gbs = bytes / (us * 1e3);
          const std::string label = mode.empty() ? plan.mode : "=" + mode;
          std::printf("%-5lld %-5lld %-6lld %-12s %-16s %10.2f %9.0f %6.3f %7.2f  %s%s\n",
                      static_cast<long long>(d), static_cast<long long>(h),
                      static_cast<long long>(t), label.c_str(), spec_text.c_str(), us, gbs,
                      gbs / copy, gbs / 1270.0,
                      err < 0 ? "FAIL " : fmt::format("ok {:.4f}", err).c_str(), detail.c_str());
          if (dirty_protocol) {
            std::printf("      L2 dirty before each call: %.2f us, ratio to copy %.3f\n", dirty_us,
                        bytes / (dirty_us * 1e3) / copy);
          }
          if (t == 1) std::printf("      T=1: %.2f us over the empty kernel\n", us - empty_us);
          if (t == 1 && durations != nullptr) {
            // Kernel durations (CUPTI) beside an empty kernel and a copy of the same bytes, all
            // warm: a T = 1 call's data fits in L2 anyway.
            const auto timed = durations->beside_empty_and_copy(
                gpu,
                [&](kjit::Stream stream) {
                  run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
                },
                "merge_state_kernel", static_cast<std::size_t>(bytes));
            std::printf(
                "      T=1 kernel durations (CUPTI): merge %.2f us, empty kernel %.2f us, copy "
                "of the same bytes %.2f us\n",
                timed.call, timed.empty, timed.copy);
          }
          std::fflush(stdout);
          if (json != nullptr) {
            std::fprintf(json,
                         "{\"bench\":\"merge_state\",\"dtype\":\"bf16\",\"D\":%lld,\"H\":%lld,"
                         "\"T\":%lld,\"mode\":\"%s\",\"forced\":%s,\"vec\":%s,\"chunks\":%s,"
                         "\"us\":%.3f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"ratio_copy\":%.4f,"
                         "\"empty_us\":%.3f,\"dirty_us\":%.3f,\"ok\":%s,\"max_err\":%.6f}\n",
                         static_cast<long long>(d), static_cast<long long>(h),
                         static_cast<long long>(t), plan.mode.c_str(),
                         mode.empty() ? "false" : "true", spec.get("vec").c_str(),
                         spec.get("chunks").c_str(), us, gbs, copy, gbs / copy, empty_us, dirty_us,
                         err < 0 ? "false" : "true", err < 0 ? 0.0 : err);
            std::fflush(json);
          }
        }
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  std::printf("%s\n", failures == 0 ? "all shapes correct"
                                    : fmt::format("{} shape(s) WRONG", failures).c_str());
  return failures == 0 ? 0 : 1;
}
