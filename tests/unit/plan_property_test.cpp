// SPDX-License-Identifier: Apache-2.0
// Property test of the launch checks: for many random (shape, device, function) triples the
// planner's verdict must equal a verdict recomputed here from the limits' definitions, and a
// rejection must name the limit that fails first.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/plan.hpp"

namespace kjit {
namespace {

using i64 = std::int64_t;

/// One limit as the test computes it: holds or not, and the text a rejection must contain.
struct Expected {
  bool ok;
  std::string needle;
};

/// Resident blocks per SM by counting: add blocks until one of the SM's resources runs out.
/// Deliberately not the planner's closed form.
i64 resident_blocks(i64 threads, i64 warps, i64 regs_per_block, i64 smem, const DeviceLimits& d) {
  i64 blocks = 0;
  while (blocks < d.max_blocks_per_sm) {
    const i64 next = blocks + 1;
    if (next * warps * d.warp_size > d.max_threads_per_sm) break;
    if (next * regs_per_block > d.regs_per_sm) break;
    if (next * (smem + d.reserved_smem_per_block) > d.max_smem_per_sm) break;
    blocks = next;
  }
  (void)threads;
  return blocks;
}

/// The limits in the order the planner documents (dimensions >= 1, threads per block, block
/// dims, grid dims, dynamic smem, registers, occupancy).
std::vector<Expected> expected_limits(const LaunchShape& s, const DeviceLimits& d,
                                      const FunctionLimits& f) {
  std::vector<Expected> out;
  const i64 block[3] = {s.block.x, s.block.y, s.block.z};
  const i64 grid[3] = {s.grid.x, s.grid.y, s.grid.z};
  const char* axes[3] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i) {
    out.push_back({block[i] >= 1, std::string("block.") + axes[i] + " >= 1 is required"});
  }
  for (int i = 0; i < 3; ++i) {
    out.push_back({grid[i] >= 1, std::string("grid.") + axes[i] + " >= 1 is required"});
  }
  const i64 threads = block[0] * block[1] * block[2];
  i64 max_threads = d.max_threads_per_block;
  if (f.max_threads_per_block > 0 && f.max_threads_per_block < max_threads) {
    max_threads = f.max_threads_per_block;
  }
  out.push_back({threads <= max_threads, "threads per block"});
  for (int i = 0; i < 3; ++i) {
    out.push_back({block[i] <= d.max_block_dim[i], std::string("block.") + axes[i] + " is "});
  }
  for (int i = 0; i < 3; ++i) {
    out.push_back({grid[i] <= d.max_grid_dim[i], std::string("grid.") + axes[i] + " is "});
  }
  const i64 smem = f.static_smem + s.dynamic_smem;
  out.push_back({smem <= d.max_smem_per_block_optin, "dynamic shared memory"});
  const i64 warps = (threads + d.warp_size - 1) / d.warp_size;
  i64 regs = 0;
  if (f.registers > 0) {
    i64 per_warp = i64{f.registers} * d.warp_size;
    if (per_warp % d.reg_alloc_unit != 0)
      per_warp += d.reg_alloc_unit - per_warp % d.reg_alloc_unit;
    regs = warps * per_warp;
  }
  out.push_back({regs <= d.regs_per_block, "registers per block"});
  const bool fits_block = threads >= 1 && threads <= max_threads && regs <= d.regs_per_block &&
                          smem <= d.max_smem_per_block_optin;
  const i64 blocks = fits_block ? resident_blocks(threads, warps, regs, smem, d) : 0;
  out.push_back({blocks >= 1, "blocks per SM (occupancy)"});
  return out;
}

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  i64 uniform(i64 lo, i64 hi) { return std::uniform_int_distribution<i64>(lo, hi)(rng_); }
  bool coin(int percent) { return uniform(0, 99) < percent; }

  /// A value around `limit`: mostly legal, often exactly at or one past the boundary, now and
  /// then zero or far beyond.
  i64 around(i64 limit, i64 cap) {
    if (gentle_) return uniform(1, std::max<i64>(1, std::min(limit, cap) / 2));
    switch (uniform(0, 9)) {
      case 0:
        return 0;
      case 1:
        return limit;
      case 2:
        return limit + 1;
      case 3:
        return std::max<i64>(limit - 1, 1);
      case 4:
        return uniform(limit, std::max(limit, std::min(cap, limit * 4)));
      case 5:
        return i64{1} << uniform(0, 10);
      default:
        return uniform(1, std::max<i64>(1, std::min(limit, cap)));
    }
  }

  DeviceLimits device() {
    const std::vector<Arch> archs = DeviceLimits::known_archs();
    DeviceLimits d =
        DeviceLimits::for_arch(archs[static_cast<std::size_t>(uniform(0, i64(archs.size()) - 1))]);
    if (coin(50)) return d;
    // A fabricated small device, so that every limit is reachable by small shapes.
    d.name = "tiny";
    d.max_threads_per_block = static_cast<int>(i64{32} << uniform(0, 3));  // 32..256
    d.max_block_dim = {uniform(1, d.max_threads_per_block), uniform(1, 64), uniform(1, 8)};
    d.max_grid_dim = {uniform(1, 1 << 20), uniform(1, 7), uniform(1, 7)};
    d.max_smem_per_block = 4 * 1024;
    d.max_smem_per_block_optin = uniform(4, 16) * 1024;
    d.reserved_smem_per_block = coin(50) ? 1024 : 0;
    d.max_smem_per_sm = d.max_smem_per_block_optin + uniform(0, 16) * 1024;
    d.regs_per_block = uniform(2, 16) * 1024;
    d.regs_per_sm = d.regs_per_block * uniform(1, 2);
    d.reg_alloc_unit = coin(50) ? 256 : 128;
    d.max_threads_per_sm = static_cast<int>(uniform(1, 8) * 64);
    d.max_blocks_per_sm = static_cast<int>(uniform(1, 8));
    return d;
  }

  FunctionLimits function(const DeviceLimits& d) {
    FunctionLimits f;
    if (coin(60)) f.registers = static_cast<int>(uniform(1, 255));
    if (coin(40)) f.max_threads_per_block = static_cast<int>(uniform(1, d.max_threads_per_block));
    if (coin(40)) f.static_smem = uniform(0, d.max_smem_per_block_optin / 2);
    if (coin(30)) f.max_dynamic_smem = uniform(0, d.max_smem_per_block);
    return f;
  }

  LaunchShape shape(const DeviceLimits& d, const FunctionLimits& f) {
    // Half the shapes stay well inside the per-dimension limits, so that the limits that
    // combine dimensions (threads, registers, occupancy) decide often enough.
    gentle_ = coin(50);
    LaunchShape s;
    const i64 threads =
        f.max_threads_per_block > 0 ? f.max_threads_per_block : d.max_threads_per_block;
    const auto u32 = [](i64 v) { return static_cast<std::uint32_t>(std::min<i64>(v, UINT32_MAX)); };
    s.block.x = u32(around(std::min(threads, d.max_block_dim[0]), 4096));
    s.block.y = u32(coin(50) ? 1 : around(std::min(threads, d.max_block_dim[1]), 4096));
    s.block.z = u32(coin(60) ? 1 : around(d.max_block_dim[2], 256));
    s.grid.x = u32(coin(30) ? around(d.max_grid_dim[0], UINT32_MAX) : uniform(1, 4096));
    s.grid.y = u32(around(d.max_grid_dim[1], 1 << 20));
    s.grid.z = u32(coin(50) ? 1 : around(d.max_grid_dim[2], 1 << 20));
    s.dynamic_smem =
        u32(coin(40) ? 0 : around(d.max_smem_per_block_optin - f.static_smem, 1 << 20));
    return s;
  }

 private:
  std::mt19937_64 rng_;
  bool gentle_ = false;
};

TEST_CASE("plan: property: the planner's verdict equals the limits recomputed independently") {
  Generator gen(0x6b6a69745f706c61ULL);
  constexpr int kCases = 50000;
  int accepted = 0;
  int rejected = 0;
  std::vector<int> first_failure(16, 0);
  for (int i = 0; i < kCases; ++i) {
    const DeviceLimits device = gen.device();
    const FunctionLimits function = gen.function(device);
    const LaunchShape s = gen.shape(device, function);
    const std::vector<Expected> expected = expected_limits(s, device, function);
    const auto checks = check_launch(s, device, function);
    REQUIRE(checks.size() == expected.size());

    const auto first_bad =
        std::find_if(expected.begin(), expected.end(), [](const Expected& e) { return !e.ok; });
    std::string message;
    try {
      require_legal(checks, "case");
    } catch (const PlanError& error) {
      message = error.what();
    }
    if (first_bad == expected.end()) {
      ++accepted;
      if (!message.empty()) {
        CAPTURE(i);
        CAPTURE(message);
        FAIL("a shape within every limit was rejected");
      }
      // Every check agrees one by one, and occupancy_blocks_per_sm is positive.
      for (std::size_t c = 0; c < checks.size(); ++c) REQUIRE(checks[c].ok());
      REQUIRE(occupancy_blocks_per_sm(s, device, function) >= 1);
    } else {
      ++rejected;
      ++first_failure[static_cast<std::size_t>(first_bad - expected.begin())];
      if (message.find(first_bad->needle) == std::string::npos || message.rfind("case: ", 0) != 0) {
        CAPTURE(i);
        CAPTURE(message);
        CAPTURE(first_bad->needle);
        FAIL("the rejection does not name the first failing limit");
      }
      // Each check's verdict matches too, not only the first.
      for (std::size_t c = 0; c < checks.size(); ++c) {
        if (checks[c].ok() != expected[c].ok) {
          CAPTURE(i);
          CAPTURE(checks[c].limit);
          FAIL("a check disagrees with the independent computation");
        }
      }
    }
  }
  MESSAGE("accepted ", accepted, ", rejected ", rejected);
  CHECK(accepted > kCases / 10);
  CHECK(rejected > kCases / 10);
  // Every limit is the first to fail in some case, so none is untested.
  for (std::size_t c = 0; c < first_failure.size(); ++c) {
    CAPTURE(c);
    CHECK(first_failure[c] > 0);
  }
}

}  // namespace
}  // namespace kjit
