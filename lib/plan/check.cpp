// SPDX-License-Identifier: Apache-2.0
// The launch checks: every limit the driver enforces (or would fault on) for one launch shape,
// computed from DeviceLimits and what is known of the function, so that an illegal launch is a
// PlanError naming the limit instead of "invalid argument" from cuLaunchKernelEx.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/plan.hpp"
#include "plan/limits.hpp"

namespace kjit {
namespace {

constexpr std::array<char, 3> kAxes{'x', 'y', 'z'};

std::array<std::int64_t, 3> dims(const Dim3& d) { return {d.x, d.y, d.z}; }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

namespace plan {

std::int64_t thread_limit(const DeviceLimits& device, const FunctionLimits& function) {
  std::int64_t limit = device.max_threads_per_block;
  if (function.max_threads_per_block > 0) {
    limit = std::min<std::int64_t>(limit, function.max_threads_per_block);
  }
  return limit;
}

std::int64_t registers_per_block(std::int64_t threads, const DeviceLimits& device,
                                 const FunctionLimits& function) {
  if (function.registers <= 0 || threads <= 0) return 0;
  // The driver allocates registers per warp, rounded up to the allocation unit, and a partial
  // warp costs a whole one: 65 registers x 1024 threads needs 72 x 1024, not 66560.
  const std::int64_t warp = std::max(device.warp_size, 1);
  const std::int64_t unit = std::max(device.reg_alloc_unit, 1);
  const std::int64_t per_warp = ceil_div(std::int64_t{function.registers} * warp, unit) * unit;
  return ceil_div(threads, warp) * per_warp;
}

}  // namespace plan

int occupancy_blocks_per_sm(const LaunchShape& shape, const DeviceLimits& device,
                            const FunctionLimits& function) {
  const auto threads = static_cast<std::int64_t>(shape.block.count());
  if (threads == 0 || threads > plan::thread_limit(device, function)) return 0;
  const std::int64_t warp = std::max(device.warp_size, 1);
  // Threads are scheduled in whole warps: a 33-thread block occupies two warps' worth.
  std::int64_t blocks = device.max_threads_per_sm / (ceil_div(threads, warp) * warp);
  blocks = std::min<std::int64_t>(blocks, device.max_blocks_per_sm);

  const std::int64_t regs = plan::registers_per_block(threads, device, function);
  if (regs > device.regs_per_block) return 0;
  if (regs > 0) blocks = std::min(blocks, device.regs_per_sm / regs);

  const std::int64_t smem = function.static_smem + shape.dynamic_smem;
  if (smem > device.max_smem_per_block_optin) return 0;
  // The driver reserves shared memory per resident block on top of what the kernel asks for.
  const std::int64_t smem_on_sm = smem + device.reserved_smem_per_block;
  if (smem_on_sm > 0) blocks = std::min(blocks, device.max_smem_per_sm / smem_on_sm);
  return static_cast<int>(std::max<std::int64_t>(blocks, 0));
}

bool supports_programmatic_launch(Arch arch) noexcept { return arch.sm() >= 90; }

std::vector<LimitCheck> check_launch(const LaunchShape& shape, const DeviceLimits& device,
                                     const FunctionLimits& function) {
  std::vector<LimitCheck> checks;
  checks.reserve(16);
  const auto block = dims(shape.block);
  const auto grid = dims(shape.grid);

  // A zero dimension is rejected by the driver; these are "at least" checks, written so that
  // LimitCheck::ok() (requested <= allowed) holds exactly when the dimension is >= 1.
  for (std::size_t i = 0; i < 3; ++i) {
    checks.push_back({fmt::format("block.{} {}", kAxes[i], plan::kAtLeastOne), 1, block[i]});
  }
  for (std::size_t i = 0; i < 3; ++i) {
    checks.push_back({fmt::format("grid.{} {}", kAxes[i], plan::kAtLeastOne), 1, grid[i]});
  }

  const auto threads = static_cast<std::int64_t>(shape.block.count());
  const std::int64_t thread_limit = plan::thread_limit(device, function);
  std::string thread_name(plan::kThreadsPerBlock);
  if (thread_limit < device.max_threads_per_block) {
    // The function's own limit comes from its register count (or __launch_bounds__); saying
    // which makes "why only 384?" answerable from the message alone.
    thread_name +=
        function.registers > 0
            ? fmt::format(" (function limit; {} registers per thread)", function.registers)
            : std::string(" (function limit)");
  }
  checks.push_back({std::move(thread_name), threads, thread_limit});

  for (std::size_t i = 0; i < 3; ++i) {
    checks.push_back({fmt::format("block.{}", kAxes[i]), block[i], device.max_block_dim[i]});
  }
  for (std::size_t i = 0; i < 3; ++i) {
    checks.push_back({fmt::format("grid.{}", kAxes[i]), grid[i], device.max_grid_dim[i]});
  }

  // Dynamic shared memory above the function's current maximum is fine: the runtime raises
  // MAX_DYNAMIC_SHARED_SIZE_BYTES before launching. Only the opt-in ceiling is a hard limit.
  std::string smem_name(plan::kDynamicSmem);
  if (function.static_smem > 0) {
    smem_name += fmt::format(" (opt-in limit minus {} bytes static)", function.static_smem);
  }
  checks.push_back({std::move(smem_name), std::int64_t{shape.dynamic_smem},
                    device.max_smem_per_block_optin - function.static_smem});

  std::string regs_name(plan::kRegistersPerBlock);
  if (function.registers > 0) {
    regs_name += fmt::format(" ({} per thread)", function.registers);
  }
  checks.push_back({std::move(regs_name), plan::registers_per_block(threads, device, function),
                    device.regs_per_block});

  checks.push_back(
      {std::string(plan::kOccupancy), 1, occupancy_blocks_per_sm(shape, device, function)});

  // Clusters: only clustered launches get these checks (other plans keep their exact list). A
  // cluster of at most 8 blocks is the portable size, which the driver guarantees to schedule
  // on sm_90 and later whenever one block fits on an SM (checked above); earlier archs have none.
  if (shape.cluster != Dim3{}) {
    const auto cluster = dims(shape.cluster);
    for (std::size_t i = 0; i < 3; ++i) {
      checks.push_back({fmt::format("cluster.{} {}", kAxes[i], plan::kAtLeastOne), 1, cluster[i]});
    }
    checks.push_back({std::string(plan::kClusterBlocks),
                      static_cast<std::int64_t>(shape.cluster.count()),
                      device.arch.sm() >= 90 ? plan::kMaxPortableClusterBlocks : 1});
    for (std::size_t i = 0; i < 3; ++i) {
      // requested <= allowed holds exactly when the grid is a whole number of clusters.
      checks.push_back({fmt::format("grid.{} modulo cluster.{}", kAxes[i], kAxes[i]),
                        cluster[i] > 0 ? grid[i] % cluster[i] : 0, 0});
    }
  }
  return checks;
}

void require_legal(const std::vector<LimitCheck>& checks, std::string_view what) {
  for (const LimitCheck& check : checks) {
    if (check.ok()) continue;
    const std::string_view limit = check.limit;
    if (limit.ends_with(plan::kAtLeastOne)) {
      throw PlanError(
          fmt::format("{}: {} is required, the launch has {}", what, limit, check.allowed));
    }
    if (limit.starts_with(plan::kOccupancy)) {
      throw PlanError(fmt::format(
          "{}: {} is {}: one block of this shape does not fit on an SM (threads, registers or "
          "shared memory per SM), the launch needs {}",
          what, limit, check.allowed, check.requested));
    }
    const std::string_view unit = limit.starts_with(plan::kDynamicSmem) ? " bytes" : "";
    throw PlanError(fmt::format("{}: {} is {}{} at most, the launch needs {}{}", what, limit,
                                check.allowed, unit, check.requested, unit));
  }
}

}  // namespace kjit
