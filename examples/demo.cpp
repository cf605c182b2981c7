// SPDX-License-Identifier: Apache-2.0
// The kjit demo: specialize, compile and cache kernels for the shapes that broke hand-written
// kernels, show where each came from (run it twice: the second run hits the disk cache), show
// the plans the planner chose and, where a GPU exists, launch and verify.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/device_buffer.hpp"
#include "driver/context.hpp"
#include "kjit/kjit.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"
#include "support/numeric.hpp"

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

// Planning needs shapes, strides and alignment, not memory: any 256-byte aligned address will do.
void* const kFake = reinterpret_cast<void*>(std::uintptr_t{1} << 20);

void print_plan(const char* what, const kjit::Plan& plan) {
  const kjit::PlannedLaunch& first = plan.launches.front();
  fmt::print("  {:<44} mode {:<12} grid ({},{},{}) block ({},{},{})\n", what, plan.mode,
             first.shape.grid.x, first.shape.grid.y, first.shape.grid.z, first.shape.block.x,
             first.shape.block.y, first.shape.block.z);
}

kjit::MergeStateOptions merge_options() {
  kjit::MergeStateOptions options;
  options.lse_base = kjit::LseBase::e;
  return options;
}

// The shapes that broke hand-written kernels, planned offline for an H200.
void show_plans() {
  using kjit::DType;
  using kjit::TensorView;
  const kjit::DeviceLimits h200 = kjit::DeviceLimits::for_name("h200");
  fmt::print("plans for an H200 (offline), for shapes FlashInfer / vLLM cannot launch:\n");
  for (auto [heads, dim] : {std::pair{128, 128}, std::pair{256, 128}, std::pair{128, 512}}) {
    const std::int64_t tokens = 4096;
    const TensorView v = TensorView::contiguous(kFake, DType::bf16, {tokens, heads, dim});
    const TensorView s = TensorView::contiguous(kFake, DType::f32, {tokens, heads});
    print_plan(fmt::format("merge_state bf16 T={} H={} D={}", tokens, heads, dim).c_str(),
               kjit::plan_merge_state(v, s, v, s, v, s, merge_options(), h200));
  }
  const std::int64_t batch = 2048, heads = 16, v_heads = 32, dim = 128;
  const TensorView qkv =
      TensorView::contiguous(kFake, DType::bf16, {batch, 2 * heads * dim + v_heads * dim});
  const TensorView gate = TensorView::contiguous(kFake, DType::bf16, {batch, v_heads});
  const TensorView per_head = TensorView::contiguous(kFake, DType::f32, {v_heads});
  const TensorView pool = TensorView::contiguous(kFake, DType::f32, {batch, v_heads, dim, dim});
  const TensorView indices = TensorView::contiguous(kFake, DType::i32, {batch});
  const TensorView out = TensorView::contiguous(kFake, DType::bf16, {batch, v_heads, dim});
  print_plan(
      "gdn_decode B=2048 HV=32 (B*HV = 65536)",
      kjit::plan_gdn_decode(qkv, gate, gate, per_head, per_head, pool, indices, out, {}, h200));
}

// merge_state at 128 heads x head_dim 128 on the GPU, checked against a float64 evaluation of
// the formula. Returns the largest absolute error.
double run_merge_state(kjit::Runtime& runtime) {
  using kjit::DType;
  using kjit::TensorView;
  const std::int64_t tokens = 64, heads = 128, dim = 128;
  const std::size_t rows = static_cast<std::size_t>(tokens * heads);
  const std::size_t elements = rows * static_cast<std::size_t>(dim);
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::uint16_t> va(elements), vb(elements);
  std::vector<float> sa(rows), sb(rows);
  for (std::size_t i = 0; i < elements; ++i) {
    va[i] = kjit::support::float_to_bf16(static_cast<float>(normal(rng)));
    vb[i] = kjit::support::float_to_bf16(static_cast<float>(normal(rng)));
  }
  for (std::size_t i = 0; i < rows; ++i) {
    sa[i] = static_cast<float>(normal(rng) * 10.0);
    sb[i] = static_cast<float>(normal(rng) * 10.0);
  }
  kjit::test::DeviceMemory d_va(elements * 2), d_vb(elements * 2), d_out(elements * 2);
  kjit::test::DeviceMemory d_sa(rows * 4), d_sb(rows * 4), d_sout(rows * 4);
  d_va.upload(va);
  d_vb.upload(vb);
  d_sa.upload(sa);
  d_sb.upload(sb);
  d_out.poison();
  kjit::MergeStateOptions options = merge_options();
  options.runtime = &runtime;
  options.device = 0;
  kjit::merge_state(TensorView::contiguous(d_va.get(), DType::bf16, {tokens, heads, dim}),
                    TensorView::contiguous(d_sa.get(), DType::f32, {tokens, heads}),
                    TensorView::contiguous(d_vb.get(), DType::bf16, {tokens, heads, dim}),
                    TensorView::contiguous(d_sb.get(), DType::f32, {tokens, heads}),
                    TensorView::contiguous(d_out.get(), DType::bf16, {tokens, heads, dim}),
                    TensorView::contiguous(d_sout.get(), DType::f32, {tokens, heads}), options);
  const auto out = d_out.download_as<std::uint16_t>(elements);
  double worst = 0.0;
  for (std::size_t row = 0; row < rows; ++row) {
    const double m = std::max<double>(sa[row], sb[row]);
    const double wa = std::exp(sa[row] - m), wb = std::exp(sb[row] - m);
    for (std::size_t d = 0; d < static_cast<std::size_t>(dim); ++d) {
      const std::size_t i = row * static_cast<std::size_t>(dim) + d;
      const double expected =
          (wa * kjit::support::bf16_to_float(va[i]) + wb * kjit::support::bf16_to_float(vb[i])) /
          (wa + wb);
      // bf16 keeps 8 significant bits: the tolerance scales with the value (the 1e-2
      // is for unit-scale data; N(0,1) tails reach 4-5, where one rounding step is 1.6e-2).
      const double error = std::fabs(kjit::support::bf16_to_float(out[i]) - expected) /
                           std::max(1.0, std::fabs(expected));
      worst = std::isnan(error) ? 1e30 : std::max(worst, error);
    }
  }
  return worst;
}

}  // namespace

int main() {
  try {
    kjit::Runtime runtime(kjit::Settings::from_env());
    fmt::print("kjit {} demo; cache root {}\n", kjit::kVersion,
               runtime.settings().resolved_cache_dir());
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

    show_plans();

    std::string why;
    if (!runtime.driver_available(&why)) {
      fmt::print("no GPU here ({}): launches skipped; planning and compiling shown above\n", why);
      return 0;
    }
    const int device = 0;
    const kjit::DeviceLimits limits = runtime.device_limits(device);
    fmt::print("GPU: {} ({}, {} SMs)\n", limits.name, limits.arch.str(), limits.sm_count);
    // Device memory is allocated in the device's primary context, the one kjit launches into.
    const kjit::driver::PrimaryContext context(device);
    const kjit::driver::ScopedContext current(context.get());
    const double error = run_merge_state(runtime);
    const bool ok = error <= 1e-2;
    fmt::print(
        "merge_state bf16 T=64 H=128 D=128 on the GPU: max |error| / max(1, |ref|) = {:.2e} vs "
        "float64: {}\n",
        error, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const kjit::Error& error) {
    std::fprintf(stderr, "kjit demo failed: %s\n", error.what());
    return 1;
  }
}
