// SPDX-License-Identifier: Apache-2.0
// The kjit demo, written against the public API only (kjit/... headers, kjit::kjit).
//
// For the shapes that hand-written kernels cannot launch (FlashInfer's MergeState at 128 heads
// of head_dim 128, vLLM's packed GDN decode at B*HV > 65535) and a Qwen3-Next prefill, it plans
// each op for an H200 (sm_90) and a B200 (sm_100a) without a GPU, prints every launch of every
// plan, and gets each launch's kernel: specialized and compiled by NVRTC on the first run, read
// back from the disk cache on the second. Where a GPU exists it also runs merge_state at 128
// heads and checks the result against a float64 evaluation on the host.
#include <cuda_runtime_api.h>

#include <kjit/kjit.hpp>
#include <kjit/ops/gdn_decode.hpp>
#include <kjit/ops/gdn_prefill.hpp>
#include <kjit/ops/merge_state.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using kjit::DType;
using kjit::TensorView;

// Planning reads shapes, strides and alignment, never memory: any aligned address will do.
void* const kAnyAddress = reinterpret_cast<void*>(std::uintptr_t{1} << 20);

TensorView view(DType dtype, std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(kAnyAddress, dtype, shape);
}

kjit::MergeStateOptions merge_options() {
  kjit::MergeStateOptions options;
  options.lse_base = kjit::LseBase::e;  // required: there is no safe default
  return options;
}

// DeepSeek-V3 attention with all 128 heads on one GPU: FlashInfer's MergeState would need a
// block of 16 x 128 = 2048 threads.
kjit::Plan plan_merge_state(const kjit::DeviceLimits& device) {
  const TensorView v = view(DType::bf16, {4096, 128, 128});
  const TensorView s = view(DType::f32, {4096, 128});
  return kjit::plan_merge_state(v, s, v, s, v, s, merge_options(), device);
}

// Qwen3-Next's GDN layers (16 q/k heads, 32 value heads, K = V = 128) decoding 2048 requests:
// B*HV = 65536 rows, one past vLLM's grid.y limit.
kjit::Plan plan_gdn_decode(const kjit::DeviceLimits& device) {
  const std::int64_t batch = 2048, heads = 16, v_heads = 32, dim = 128;
  const TensorView qkv = view(DType::bf16, {batch, 2 * heads * dim + v_heads * dim});
  const TensorView gate = view(DType::bf16, {batch, v_heads});
  const TensorView per_head = view(DType::f32, {v_heads});
  const TensorView pool = view(DType::f32, {batch, v_heads, dim, dim});
  const TensorView indices = view(DType::i32, {batch});
  const TensorView out = view(DType::bf16, {batch, v_heads, dim});
  return kjit::plan_gdn_decode(qkv, gate, gate, per_head, per_head, pool, indices, out, {}, device);
}

// The same layers prefilling 4 sequences of 1024 tokens.
kjit::Plan plan_gdn_prefill(const kjit::DeviceLimits& device) {
  const std::int64_t tokens = 4096, sequences = 4, heads = 16, v_heads = 32, dim = 128;
  const TensorView qk = view(DType::bf16, {tokens, heads, dim});
  const TensorView v = view(DType::bf16, {tokens, v_heads, dim});
  const kjit::GdnGates gates = kjit::GdnGates::raw(
      view(DType::bf16, {tokens, v_heads}), view(DType::bf16, {tokens, v_heads}),
      view(DType::f32, {v_heads}), view(DType::f32, {v_heads}));
  const TensorView cu_seqlens = view(DType::i32, {sequences + 1});
  const TensorView pool = view(DType::f32, {sequences, v_heads, dim, dim});
  const TensorView indices = view(DType::i32, {sequences});
  const TensorView every_sequence_has_a_state{};  // data == nullptr
  return kjit::plan_gdn_prefill(qk, qk, v, gates, cu_seqlens, pool, indices,
                                every_sequence_has_a_state, v, {}, device);
}

const char* source_name(kjit::KernelSource source) {
  switch (source) {
    case kjit::KernelSource::memory:
      return "memory";
    case kjit::KernelSource::bundle:
      return "a bundle";
    case kjit::KernelSource::disk:
      return "the disk cache";
    case kjit::KernelSource::compiled:
      return "NVRTC";
  }
  return "?";
}

// Prints every launch of the plan (an op may need several kernels: gdn_decode ranks the rows
// by slot before a large step) and gets each launch's kernel from the runtime.
void show(kjit::Runtime& runtime, const char* what, const kjit::Plan& plan) {
  std::printf("%s on %s: mode %s, %zu launch%s\n", what, plan.device.arch.str().c_str(),
              plan.mode.c_str(), plan.launches.size(), plan.launches.size() == 1 ? "" : "es");
  for (std::size_t i = 0; i < plan.launches.size(); ++i) {
    const kjit::PlannedLaunch& launch = plan.launches[i];
    const kjit::LaunchShape& shape = launch.shape;
    std::printf("  %zu. grid (%u, %u, %u) x block (%u, %u, %u), %u B dynamic smem", i + 1,
                shape.grid.x, shape.grid.y, shape.grid.z, shape.block.x, shape.block.y,
                shape.block.z, shape.dynamic_smem);
    if (shape.overlaps_previous) std::printf(", may start before launch %zu has finished", i);
    std::printf("\n");
    std::printf("     %s\n", launch.spec.str().c_str());
    const auto start = std::chrono::steady_clock::now();
    kjit::KernelSource source{};
    const auto kernel = runtime.compiled(launch.spec, &source);
    const std::chrono::duration<double, std::milli> took = std::chrono::steady_clock::now() - start;
    std::printf("     from %s in %.1f ms: %d registers, %zu B of cubin, key %.12s\n",
                source_name(source), took.count(), kernel->resources.registers,
                kernel->cubin.size(), kernel->key.c_str());
  }
}

// bf16 is the upper half of an f32; rounding to nearest even (inputs here are finite).
std::uint16_t to_bf16(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>(bits >> 16);
}

double from_bf16(std::uint16_t half) {
  const std::uint32_t bits = std::uint32_t{half} << 16;
  float value = 0;
  std::memcpy(&value, &bits, 4);
  return value;
}

// A CUDA runtime buffer holding a copy of `host`.
template <typename T>
void* upload(const std::vector<T>& host) {
  void* device = nullptr;
  if (cudaMalloc(&device, host.size() * sizeof(T)) != cudaSuccess ||
      cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) !=
          cudaSuccess) {
    throw std::runtime_error("cudaMalloc / cudaMemcpy failed");
  }
  return device;
}

// merge_state at 128 heads x head_dim 128 on GPU 0, against float64 on the host. Returns the
// largest error relative to max(1, |expected|).
double run_merge_state() {
  const std::int64_t tokens = 64, heads = 128, dim = 128;
  const std::size_t rows = tokens * heads, elements = rows * dim;
  std::mt19937 rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::uint16_t> v_a(elements), v_b(elements), v_out(elements);
  std::vector<float> s_a(rows), s_b(rows);
  for (std::size_t i = 0; i < elements; ++i) {
    v_a[i] = to_bf16(normal(rng));
    v_b[i] = to_bf16(normal(rng));
  }
  for (std::size_t i = 0; i < rows; ++i) {
    s_a[i] = 10.0f * normal(rng);
    s_b[i] = 10.0f * normal(rng);
  }
  void* d_v_a = upload(v_a);
  void* d_v_b = upload(v_b);
  void* d_v_out = upload(v_out);
  void* d_s_a = upload(s_a);
  void* d_s_b = upload(s_b);
  void* d_s_out = upload(s_a);
  const auto values = [&](void* data) {
    return TensorView::contiguous(data, DType::bf16, {tokens, heads, dim});
  };
  const auto lse = [&](void* data) {
    return TensorView::contiguous(data, DType::f32, {tokens, heads});
  };
  kjit::merge_state(values(d_v_a), lse(d_s_a), values(d_v_b), lse(d_s_b), values(d_v_out),
                    lse(d_s_out), merge_options(), /*stream=*/nullptr);
  cudaMemcpy(v_out.data(), d_v_out, elements * 2, cudaMemcpyDeviceToHost);
  for (void* buffer : {d_v_a, d_v_b, d_v_out, d_s_a, d_s_b, d_s_out}) cudaFree(buffer);

  double worst = 0.0;
  for (std::size_t row = 0; row < rows; ++row) {
    const double m = std::max(s_a[row], s_b[row]);
    const double w_a = std::exp(s_a[row] - m), w_b = std::exp(s_b[row] - m);
    for (std::size_t i = row * dim; i < (row + 1) * dim; ++i) {
      const double expected = (w_a * from_bf16(v_a[i]) + w_b * from_bf16(v_b[i])) / (w_a + w_b);
      const double error =
          std::fabs(from_bf16(v_out[i]) - expected) / std::max(1.0, std::fabs(expected));
      worst = std::isnan(error) ? INFINITY : std::max(worst, error);
    }
  }
  return worst;
}

}  // namespace

int main() {
  try {
    kjit::Runtime& runtime = kjit::Runtime::global();  // settings from the KJIT_* variables
    std::printf("kjit %s demo; kernels cached under %s\n\n", kjit::kVersion,
                runtime.settings().resolved_cache_dir().c_str());
    const struct {
      const char* what;
      const char* hand_written;
      kjit::Plan (*plan)(const kjit::DeviceLimits&);
    } cases[] = {
        {"merge_state bf16 T=4096 H=128 D=128",
         "FlashInfer's MergeState cannot launch this: block (16, 128) = 2048 threads > 1024",
         plan_merge_state},
        {"gdn_decode B=2048 HV=32",
         "vLLM's packed decode cannot launch this: grid.y = B*HV = 65536 > 65535", plan_gdn_decode},
        {"gdn_prefill 4 x 1024 tokens, HV=32", nullptr, plan_gdn_prefill},
    };
    // NVRTC needs no GPU: both targets compile here, whatever this machine has.
    for (const auto& c : cases) {
      if (c.hand_written != nullptr) std::printf("%s\n", c.hand_written);
      for (const char* arch : {"sm_90", "sm_100a"}) {
        show(runtime, c.what, c.plan(kjit::DeviceLimits::for_arch(kjit::Arch::parse(arch))));
      }
      std::printf("\n");
    }
    const kjit::CacheStats stats = runtime.stats();
    std::printf("cache: %llu compiled, %llu from the disk cache%s\n",
                static_cast<unsigned long long>(stats.compiles),
                static_cast<unsigned long long>(stats.disk_hits),
                stats.disk_enabled ? "" : " (disk cache disabled: memory only)");

    std::string why;
    if (!runtime.driver_available(&why)) {
      std::printf("no GPU here (%s): nothing launched\n", why.c_str());
      return 0;
    }
    const kjit::DeviceLimits gpu = runtime.device_limits(0);
    const double error = run_merge_state();
    const bool ok = error <= 1e-2;  // bf16 keeps 8 significant bits
    std::printf("%s (%s): merge_state bf16 T=64 H=128 D=128, largest error %.2e vs float64: %s\n",
                gpu.name.c_str(), gpu.arch.str().c_str(), error, ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "kjit demo failed: %s\n", error.what());
    return 1;
  }
}
