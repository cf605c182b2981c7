// SPDX-License-Identifier: Apache-2.0
// Plans for several fabricated devices at once, from concurrent threads: every plan is made for
// its own device's arch and limits and is legal there, and planning is deterministic (a thread
// planning for one device never sees another's limits). The GPU side of several devices is in
// tests/gpu/multi_device_test.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"
#include "kjit/plan.hpp"

namespace kjit {
namespace {

/// Plan twins validate pointers (non-null, aligned) but never dereference them: a 1 MiB-aligned
/// address plans like a cuMemAlloc allocation.
void* const kFakeAddress = reinterpret_cast<void*>(std::uintptr_t{1} << 20);

using i64 = std::int64_t;

TensorView view(DType dtype, std::initializer_list<i64> shape) {
  return TensorView::contiguous(kFakeAddress, dtype, shape);
}

/// The three ops' plans for one random problem on `limits`, as text (spec, shape and mode of
/// every launch), after checking that each launch targets the device's arch and is legal there.
std::string plan_all(std::mt19937_64& rng, const DeviceLimits& limits,
                     std::vector<std::string>& problems) {
  const auto pick = [&](std::initializer_list<i64> values) {
    return *(values.begin() + static_cast<std::ptrdiff_t>(rng() % values.size()));
  };
  std::string text;
  const auto take = [&](const Plan& plan) {
    for (const PlannedLaunch& launch : plan.launches) {
      if (launch.spec.arch.sm() != limits.arch.sm()) {
        problems.push_back(launch.spec.str() + " planned for " + limits.name);
      }
      const auto checks = check_launch(launch.shape, limits);
      for (const LimitCheck& check : checks) {
        if (!check.ok()) {
          problems.push_back(limits.name + ": " + check.limit + " " +
                             std::to_string(check.requested) + " > " +
                             std::to_string(check.allowed));
        }
      }
      const LaunchShape& s = launch.shape;
      text += launch.spec.str() + " grid " + std::to_string(s.grid.x) + "x" +
              std::to_string(s.grid.y) + "x" + std::to_string(s.grid.z) + " block " +
              std::to_string(s.block.x) + "x" + std::to_string(s.block.y) + "x" +
              std::to_string(s.block.z) + " smem " + std::to_string(s.dynamic_smem) + "; ";
    }
    text += plan.mode + "\n";
  };
  const i64 tokens = pick({1, 7, 4096, 70000}), heads = pick({1, 32, 128, 256});
  const i64 head_dim = pick({64, 128, 256, 512});
  MergeStateOptions merge;
  merge.lse_base = LseBase::two;
  take(plan_merge_state(
      view(DType::bf16, {tokens, heads, head_dim}), view(DType::f32, {tokens, heads}),
      view(DType::bf16, {tokens, heads, head_dim}), view(DType::f32, {tokens, heads}),
      view(DType::bf16, {tokens, heads, head_dim}), view(DType::f32, {tokens, heads}), merge,
      limits));
  const i64 batch = pick({1, 32, 2048, 70000}), hv = pick({16, 32, 64}), kd = pick({64, 128});
  const i64 h = 16;
  take(plan_gdn_decode(view(DType::bf16, {batch, 2 * h * kd + hv * kd}),
                       view(DType::bf16, {batch, hv}), view(DType::bf16, {batch, hv}),
                       view(DType::f32, {hv}), view(DType::f32, {hv}),
                       view(DType::f32, {batch + 1, hv, kd, kd}), view(DType::i32, {batch}),
                       view(DType::bf16, {batch, hv, kd}), GdnDecodeOptions{}, limits));
  const i64 seqs = pick({1, 4, 16}), total = pick({64, 8192});
  take(plan_gdn_prefill(
      view(DType::bf16, {total, h, kd}), view(DType::bf16, {total, h, kd}),
      view(DType::bf16, {total, hv, kd}),
      GdnGates::raw(view(DType::bf16, {total, hv}), view(DType::bf16, {total, hv}),
                    view(DType::f32, {hv}), view(DType::f32, {hv})),
      view(DType::i32, {seqs + 1}), view(DType::f32, {seqs, hv, kd, kd}), view(DType::i32, {seqs}),
      TensorView{}, view(DType::bf16, {total, hv, kd}), GdnPrefillOptions{}, limits));
  return text;
}

}  // namespace

TEST_CASE("plans for several devices from concurrent threads are each legal on their device") {
  const std::vector<std::string> names = {"h200", "a100", "l40s", "rtx3090", "b200", "rtx5090"};
  constexpr int kProblems = 40;
  // Serial reference: the plans of each device, one thread.
  std::vector<std::vector<std::string>> serial(names.size());
  std::vector<std::string> problems;
  for (std::size_t d = 0; d < names.size(); ++d) {
    const DeviceLimits limits = DeviceLimits::for_name(names[d]);
    std::mt19937_64 rng(1234);
    for (int i = 0; i < kProblems; ++i) serial[d].push_back(plan_all(rng, limits, problems));
  }
  for (const std::string& problem : problems) FAIL_CHECK(problem);
  // The same problems, every device on its own thread at once.
  std::vector<std::vector<std::string>> concurrent(names.size());
  std::vector<std::vector<std::string>> thread_problems(names.size());
  std::vector<std::thread> threads;
  for (std::size_t d = 0; d < names.size(); ++d) {
    threads.emplace_back([&, d] {
      const DeviceLimits limits = DeviceLimits::for_name(names[d]);
      std::mt19937_64 rng(1234);
      for (int i = 0; i < kProblems; ++i) {
        concurrent[d].push_back(plan_all(rng, limits, thread_problems[d]));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (std::size_t d = 0; d < names.size(); ++d) {
    INFO(names[d]);
    CHECK(thread_problems[d].empty());
    CHECK(concurrent[d] == serial[d]);
  }
  // Devices of different archs get different kernels for the same problem.
  CHECK(serial[0] != serial[1]);
}

}  // namespace kjit
