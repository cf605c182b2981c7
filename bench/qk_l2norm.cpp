// SPDX-License-Identifier: Apache-2.0
// qk_l2norm benchmark (method: shared/BENCHMARKING.md). bf16 and f32, D in {64, 128, 256},
// (Hq, Hk) in {(16, 16), (32, 8)} (GDN-like q and k heads), T in {1, 64, 4096, 32768}, out of
// place and in place: median GPU us (L2 flushed before each call), GB/s (bytes read + written),
// ratio to a same-size device copy measured in this run, and the plan's vec/lanes. Each shape is
// first checked against the float64 reference on sampled rows.
//
//   bench_qk_l2norm [out.jsonl]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

// kjit/types.hpp before harness.hpp (GCC's -Wshadow: see bench/merge_state.cpp).
#include "kjit/types.hpp"
// (keep this order)
#include "harness.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "ops/qk_l2norm/family.hpp"
#include "support/numeric.hpp"

namespace {

using kjit::DType;
using kjit::TensorView;

/// Largest relative error over sampled rows of q and k against the float64 reference (the
/// output read back after one call), or -1 if any sampled element is not finite.
double verify(kjit::bench::Gpu& gpu, const TensorView& in, const TensorView& out,
              const std::vector<unsigned char>& host_in, std::int64_t heads) {
  const std::int64_t t = in.shape[0], d = in.shape[2];
  std::vector<unsigned char> host_out(host_in.size());
  gpu.synchronize();
  kjit::bench::check(kjit::bench::cu().cuMemcpyDtoH(
                         host_out.data(), reinterpret_cast<CUdeviceptr>(out.data), host_out.size()),
                     "cuMemcpyDtoH");
  double worst = 0;
  std::vector<double> x(static_cast<std::size_t>(d)), ref(x.size());
  for (std::int64_t row = 0; row < t * heads; row += std::max<std::int64_t>(1, t * heads / 97)) {
    const std::int64_t base = row * d;
    for (std::int64_t i = 0; i < d; ++i) {
      x[static_cast<std::size_t>(i)] =
          kjit::support::load_as_double(host_in.data(), in.dtype, base + i);
    }
    kjit::ops::l2norm::reference_row(x.data(), ref.data(), d, 1e-6);
    for (std::int64_t i = 0; i < d; ++i) {
      const double got = kjit::support::load_as_double(host_out.data(), in.dtype, base + i);
      if (!std::isfinite(got)) return -1;
      worst = std::max(worst, std::abs(got - ref[static_cast<std::size_t>(i)]));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  auto opened = kjit::bench::Gpu::open(&why);
  if (!opened) {
    std::printf("bench_qk_l2norm skipped: %s\n", why.c_str());
    return 0;
  }
  kjit::bench::Gpu& gpu = *opened;
  std::FILE* json = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  const double empty_us = kjit::bench::empty_kernel_us(gpu);
  std::printf("empty kernel %.2f us\n", empty_us);
  std::printf("%-5s %-3s %-8s %-6s %-8s %-10s %10s %9s %6s  %s\n", "dtype", "D", "Hq+Hk", "T",
              "place", "vec/lanes", "us", "GB/s", "/copy", "check");
  int failures = 0;
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (std::int64_t d : {64, 128, 256}) {
      for (auto [hq, hk] : {std::pair<std::int64_t, std::int64_t>{16, 16}, {32, 8}}) {
        for (std::int64_t t : {1, 64, 4096, 32768}) {
          const std::size_t esize = size_of(dtype);
          const std::size_t q_bytes = static_cast<std::size_t>(t * hq * d) * esize;
          const std::size_t k_bytes = static_cast<std::size_t>(t * hk * d) * esize;
          kjit::bench::DeviceBuffer q(q_bytes), k(k_bytes), q_out(q_bytes), k_out(k_bytes);
          kjit::bench::fill_random(q, dtype, q_bytes / esize, 1);
          kjit::bench::fill_random(k, dtype, k_bytes / esize, 2, 30.0);
          std::vector<unsigned char> host_q(q_bytes), host_k(k_bytes);
          kjit::bench::check(kjit::bench::cu().cuMemcpyDtoH(host_q.data(), q.ptr(), q_bytes),
                             "cuMemcpyDtoH");
          kjit::bench::check(kjit::bench::cu().cuMemcpyDtoH(host_k.data(), k.ptr(), k_bytes),
                             "cuMemcpyDtoH");
          const TensorView qv = TensorView::contiguous(q.get(), dtype, {t, hq, d});
          const TensorView kv = TensorView::contiguous(k.get(), dtype, {t, hk, d});
          const TensorView qo = TensorView::contiguous(q_out.get(), dtype, {t, hq, d});
          const TensorView ko = TensorView::contiguous(k_out.get(), dtype, {t, hk, d});
          kjit::QkL2NormOptions options;
          options.runtime = &gpu.runtime();
          const kjit::Plan plan = kjit::plan_qk_l2norm(qv, kv, qo, ko, options, gpu.limits);
          const kjit::KernelSpec& spec = plan.launches.at(0).spec;
          kjit::qk_l2norm(qv, kv, qo, ko, options, gpu.stream);
          const double eq = verify(gpu, qv, qo, host_q, hq);
          const double ek = verify(gpu, kv, ko, host_k, hk);
          const bool ok =
              eq >= 0 && ek >= 0 && std::max(eq, ek) < (dtype == DType::f32 ? 1e-5 : 2e-2);
          if (!ok) ++failures;
          const double bytes = 2.0 * static_cast<double>(q_bytes + k_bytes);
          const double copy = kjit::bench::copy_gbs(gpu, static_cast<std::size_t>(bytes));
          for (bool in_place : {false, true}) {
            const double us = kjit::bench::median_gpu_us(
                gpu,
                [&](kjit::Stream stream) {
                  if (in_place) {
                    kjit::qk_l2norm(qv, kv, qv, kv, options, stream);
                  } else {
                    kjit::qk_l2norm(qv, kv, qo, ko, options, stream);
                  }
                },
                100, 10, [&](kjit::Stream) { kjit::bench::flush_l2(gpu); });
            const double gbs = bytes / (us * 1e3);
            std::printf("%-5s %-3lld %-8s %-6lld %-8s %-10s %10.2f %9.0f %6.3f  %s\n",
                        std::string(to_string(dtype)).c_str(), static_cast<long long>(d),
                        fmt::format("{}+{}", hq, hk).c_str(), static_cast<long long>(t),
                        in_place ? "in" : "out",
                        fmt::format("{}/{}", spec.get("vec"), spec.get("lanes")).c_str(), us, gbs,
                        gbs / copy,
                        ok ? fmt::format("ok {:.2e}", std::max(eq, ek)).c_str() : "FAIL");
            std::fflush(stdout);
            if (json != nullptr) {
              std::fprintf(json,
                           "{\"bench\":\"qk_l2norm\",\"dtype\":\"%s\",\"D\":%lld,\"Hq\":%lld,"
                           "\"Hk\":%lld,\"T\":%lld,\"in_place\":%s,\"vec\":%s,\"lanes\":%s,"
                           "\"us\":%.3f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"ratio_copy\":%.4f,"
                           "\"empty_us\":%.3f,\"ok\":%s}\n",
                           std::string(to_string(dtype)).c_str(), static_cast<long long>(d),
                           static_cast<long long>(hq), static_cast<long long>(hk),
                           static_cast<long long>(t), in_place ? "true" : "false",
                           spec.get("vec").c_str(), spec.get("lanes").c_str(), us, gbs, copy,
                           gbs / copy, empty_us, ok ? "true" : "false");
              std::fflush(json);
            }
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
