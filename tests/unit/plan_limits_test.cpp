// SPDX-License-Identifier: Apache-2.0
// The built-in device table, the boundary shapes of every limit, and how plans print.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/plan.hpp"

namespace kjit {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * 1024;

LaunchShape shape(Dim3 grid, Dim3 block, std::uint32_t smem = 0) {
  return LaunchShape{grid, block, smem};
}

/// The PlanError message require_legal throws, or "" when the launch is legal.
std::string rejection(const LaunchShape& s, const DeviceLimits& device,
                      const FunctionLimits& function = {}) {
  try {
    require_legal(check_launch(s, device, function), "probe launch 1 of 1");
  } catch (const PlanError& error) {
    return error.what();
  }
  return {};
}

TEST_CASE("plan: built-in limits of the six archs") {
  struct Row {
    const char* arch;
    int sms;
    std::int64_t optin;
    std::int64_t per_sm;
    int threads_per_sm;
    int blocks_per_sm;
  };
  const Row rows[] = {
      {"sm_80", 108, 163 * kKiB, 164 * kKiB, 2048, 32},
      {"sm_86", 82, 99 * kKiB, 100 * kKiB, 1536, 16},
      {"sm_89", 142, 99 * kKiB, 100 * kKiB, 1536, 24},
      {"sm_90", 132, 227 * kKiB, 228 * kKiB, 2048, 32},
      {"sm_100", 148, 227 * kKiB, 228 * kKiB, 2048, 32},
      {"sm_120", 170, 99 * kKiB, 100 * kKiB, 1536, 32},
  };
  REQUIRE(DeviceLimits::known_archs().size() == std::size(rows));
  for (const Row& row : rows) {
    CAPTURE(row.arch);
    const DeviceLimits d = DeviceLimits::for_arch(Arch::parse(row.arch));
    CHECK(d.arch == Arch::parse(row.arch));
    CHECK(d.sm_count == row.sms);
    CHECK(d.max_smem_per_block_optin == row.optin);
    CHECK(d.max_smem_per_sm == row.per_sm);
    CHECK(d.max_threads_per_sm == row.threads_per_sm);
    CHECK(d.max_blocks_per_sm == row.blocks_per_sm);
    CHECK(d.max_threads_per_block == 1024);
    CHECK(d.max_block_dim == std::array<std::int64_t, 3>{1024, 1024, 64});
    CHECK(d.max_grid_dim == std::array<std::int64_t, 3>{2147483647, 65535, 65535});
    CHECK(d.max_smem_per_block == 48 * kKiB);
    CHECK(d.regs_per_block == 65536);
    CHECK(d.regs_per_sm == 65536);
    CHECK(d.max_regs_per_thread == 255);
    CHECK(d.reg_alloc_unit == 256);
    CHECK(d.reserved_smem_per_block == 1 * kKiB);
    CHECK(d.warp_size == 32);
    CHECK(d.l2_bytes > 0);
    bool listed = false;
    for (const Arch& arch : DeviceLimits::known_archs()) listed |= arch == d.arch;
    CHECK(listed);
  }
  CHECK(DeviceLimits::for_arch(Arch{9, 0}).max_smem_per_block_optin == 232448);
  CHECK(DeviceLimits::for_arch(Arch{8, 0}).max_smem_per_block_optin == 166912);
  CHECK(DeviceLimits::for_arch(Arch{8, 0}).l2_bytes == 40 * kMiB);
  CHECK(DeviceLimits::for_arch(Arch{9, 0}).l2_bytes == 50 * kMiB);
}

TEST_CASE("plan: a/f variants share their base's limits and keep their target") {
  const DeviceLimits hopper_a = DeviceLimits::for_arch(Arch::parse("sm_90a"));
  CHECK(hopper_a.arch.str() == "sm_90a");
  CHECK(hopper_a.max_smem_per_block_optin == 227 * kKiB);
  const DeviceLimits blackwell_f = DeviceLimits::for_name("sm_100f");
  CHECK(blackwell_f.arch.str() == "sm_100f");
  CHECK(blackwell_f.sm_count == 148);
}

TEST_CASE("plan: DRAM bandwidth, and every product of an arch") {
  constexpr std::int64_t kGBps = 1'000'000'000;
  CHECK(DeviceLimits::for_name("h100").dram_bytes_per_second == 3352 * kGBps);
  CHECK(DeviceLimits::for_arch(Arch{9, 0}).dram_bytes_per_second == 3352 * kGBps);
  CHECK(DeviceLimits::for_name("h200").dram_bytes_per_second == 4800 * kGBps);
  CHECK(DeviceLimits::for_arch(Arch{8, 0}).dram_bytes_per_second == 2039 * kGBps);
  CHECK(DeviceLimits::for_name("b200").dram_bytes_per_second == 8000 * kGBps);
  for (const Arch arch : DeviceLimits::known_archs()) {
    CHECK(DeviceLimits::for_arch(arch).dram_bytes_per_second > 500 * kGBps);
  }
  // sm_90 is the H100 (its table row, first) and the H200; the variant stays the compile target.
  const std::vector<DeviceLimits> hopper = DeviceLimits::products_of(Arch::parse("sm_90a"));
  REQUIRE(hopper.size() == 2);
  CHECK(hopper[0].dram_bytes_per_second == 3352 * kGBps);
  CHECK(hopper[1].name == "h200");
  CHECK(hopper[1].dram_bytes_per_second == 4800 * kGBps);
  CHECK(hopper[1].l2_bytes == 60 * kMiB);
  for (const DeviceLimits& d : hopper) CHECK(d.arch.str() == "sm_90a");
  // One product per arch elsewhere (the RTX 3090 and the A10 share sm_86's table row).
  CHECK(DeviceLimits::products_of(Arch{8, 6}).size() == 1);
  CHECK(DeviceLimits::products_of(Arch{10, 0}).size() == 1);
}

TEST_CASE("plan: product names and arch texts") {
  CHECK(DeviceLimits::for_name("h100").arch == Arch{9, 0});
  CHECK(DeviceLimits::for_name("h100").l2_bytes == 50 * kMiB);
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  CHECK(h200.arch == Arch{9, 0});
  CHECK(h200.sm_count == 132);
  CHECK(h200.l2_bytes == 60 * kMiB);
  CHECK(h200.name == "h200");
  CHECK(DeviceLimits::for_name("H200").l2_bytes == 60 * kMiB);
  CHECK(DeviceLimits::for_name("b200").arch == Arch{10, 0});
  CHECK(DeviceLimits::for_name("a100").arch == Arch{8, 0});
  CHECK(DeviceLimits::for_name("l40s").arch == Arch{8, 9});
  CHECK(DeviceLimits::for_name("rtx5090").arch == Arch{12, 0});
  CHECK(DeviceLimits::for_name("sm_86").max_threads_per_sm == 1536);
  CHECK(DeviceLimits::for_name("8.9").max_blocks_per_sm == 24);
  CHECK(DeviceLimits::for_name("120").arch == Arch{12, 0});
  CHECK(DeviceLimits::for_name("compute_80").arch == Arch{8, 0});
}

TEST_CASE("plan: unknown devices and archs name what is known") {
  for (const char* name : {"v100", "sm_70", "sm_75", "", "h300"}) {
    CAPTURE(name);
    try {
      (void)DeviceLimits::for_name(name);
      FAIL("accepted an unknown device");
    } catch (const InvalidArgument& error) {
      const std::string message = error.what();
      CHECK(message.find("sm_90") != std::string::npos);
      CHECK(message.find("h200") != std::string::npos);
      CHECK(message.find("rtx5090") != std::string::npos);
    }
  }
  CHECK_THROWS_AS((void)DeviceLimits::for_arch(Arch{7, 5}), InvalidArgument);
}

TEST_CASE("plan: every check is reported, legal or not") {
  const auto checks =
      check_launch(shape({4, 2, 1}, {128, 1, 1}), DeviceLimits::for_arch(Arch{9, 0}));
  std::string names;
  for (const LimitCheck& check : checks) {
    CHECK(check.ok());
    names += check.limit + "|";
  }
  for (const char* expected :
       {"block.x >= 1|", "block.y >= 1|", "block.z >= 1|", "grid.x >= 1|", "grid.y >= 1|",
        "grid.z >= 1|", "threads per block|", "block.x|", "block.y|", "block.z|", "grid.x|",
        "grid.y|", "grid.z|", "dynamic shared memory|", "registers per block|",
        "blocks per SM (occupancy)|"}) {
    CAPTURE(expected);
    CHECK(names.find(expected) != std::string::npos);
  }
}

TEST_CASE("plan: threads per block 1024 ok, 1025 rejected") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  CHECK(rejection(shape({1, 1, 1}, {1024, 1, 1}), h100).empty());
  CHECK(rejection(shape({1, 1, 1}, {32, 32, 1}), h100).empty());
  CHECK(rejection(shape({1, 1, 1}, {1025, 1, 1}), h100) ==
        "probe launch 1 of 1: threads per block is 1024 at most, the launch needs 1025");
  CHECK(rejection(shape({1, 1, 1}, {32, 33, 1}), h100) ==
        "probe launch 1 of 1: threads per block is 1024 at most, the launch needs 1056");
  // Within the thread count but over one dimension's own limit.
  CHECK(rejection(shape({1, 1, 1}, {1, 1, 65}), h100) ==
        "probe launch 1 of 1: block.z is 64 at most, the launch needs 65");
  CHECK(rejection(shape({1, 1, 1}, {1, 1, 64}), h100).empty());
}

TEST_CASE("plan: the function's thread limit says it comes from registers") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  FunctionLimits heavy;
  heavy.max_threads_per_block = 384;
  heavy.registers = 168;
  CHECK(rejection(shape({1, 1, 1}, {384, 1, 1}), h100, heavy).empty());
  CHECK(rejection(shape({1, 1, 1}, {1024, 1, 1}), h100, heavy) ==
        "probe launch 1 of 1: threads per block (function limit; 168 registers per thread) is "
        "384 at most, the launch needs 1024");
  FunctionLimits bounded;
  bounded.max_threads_per_block = 256;
  CHECK(rejection(shape({1, 1, 1}, {257, 1, 1}), h100, bounded) ==
        "probe launch 1 of 1: threads per block (function limit) is 256 at most, the launch "
        "needs 257");
}

TEST_CASE("plan: grid.y and grid.z 65535 ok, 65536 rejected; grid.x up to 2^31-1") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  CHECK(rejection(shape({1, 65535, 1}, {1, 1, 1}), h200).empty());
  CHECK(rejection(shape({1, 65536, 1}, {1, 1, 1}), h200) ==
        "probe launch 1 of 1: grid.y is 65535 at most, the launch needs 65536");
  CHECK(rejection(shape({1, 1, 65535}, {1, 1, 1}), h200).empty());
  CHECK(rejection(shape({1, 1, 65536}, {1, 1, 1}), h200) ==
        "probe launch 1 of 1: grid.z is 65535 at most, the launch needs 65536");
  CHECK(rejection(shape({2147483647u, 1, 1}, {1024, 1, 1}), h200).empty());
  CHECK(rejection(shape({2147483648u, 1, 1}, {1024, 1, 1}), h200) ==
        "probe launch 1 of 1: grid.x is 2147483647 at most, the launch needs 2147483648");
}

TEST_CASE("plan: empty grids and blocks are rejected") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  CHECK(rejection(shape({0, 1, 1}, {1, 1, 1}), h100) ==
        "probe launch 1 of 1: grid.x >= 1 is required, the launch has 0");
  CHECK(rejection(shape({1, 1, 0}, {1, 1, 1}), h100) ==
        "probe launch 1 of 1: grid.z >= 1 is required, the launch has 0");
  CHECK(rejection(shape({1, 1, 1}, {32, 0, 1}), h100) ==
        "probe launch 1 of 1: block.y >= 1 is required, the launch has 0");
}

TEST_CASE("plan: dynamic shared memory up to the opt-in limit minus static") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  const auto optin = static_cast<std::uint32_t>(h100.max_smem_per_block_optin);
  // Above the 48 KiB default: legal, the runtime opts in.
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, 100 * 1024), h100).empty());
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, optin), h100).empty());
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, optin + 1), h100) ==
        "probe launch 1 of 1: dynamic shared memory is 232448 bytes at most, the launch needs "
        "232449 bytes");
  FunctionLimits with_static;
  with_static.static_smem = 4096;
  // The function's configured maximum does not bound the plan: the runtime raises it.
  with_static.max_dynamic_smem = 48 * 1024 - 4096;
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, optin - 4096), h100, with_static).empty());
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, optin - 4095), h100, with_static) ==
        "probe launch 1 of 1: dynamic shared memory (opt-in limit minus 4096 bytes static) is "
        "228352 bytes at most, the launch needs 228353 bytes");
  const DeviceLimits l40s = DeviceLimits::for_name("l40s");
  CHECK(rejection(shape({1, 1, 1}, {128, 1, 1}, 99 * 1024), l40s).empty());
  CHECK(!rejection(shape({1, 1, 1}, {128, 1, 1}, 99 * 1024 + 1), l40s).empty());
}

TEST_CASE("plan: registers x threads, rounded per warp") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  FunctionLimits f;
  f.registers = 64;
  CHECK(rejection(shape({1, 1, 1}, {1024, 1, 1}), h100, f).empty());
  f.registers = 65;
  // 65 registers round up to 72 per thread (2304 per warp): 32 warps need 73728.
  CHECK(rejection(shape({1, 1, 1}, {1024, 1, 1}), h100, f) ==
        "probe launch 1 of 1: registers per block (65 per thread) is 65536 at most, the launch "
        "needs 73728");
  // 72 registers x 896 threads = 64512: fits.
  CHECK(rejection(shape({1, 1, 1}, {896, 1, 1}), h100, f).empty());
  // A partial warp costs a whole warp: 897 threads are 29 warps (66816 registers).
  CHECK(rejection(shape({1, 1, 1}, {897, 1, 1}), h100, f) ==
        "probe launch 1 of 1: registers per block (65 per thread) is 65536 at most, the launch "
        "needs 66816");
}

TEST_CASE("plan: occupancy") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  FunctionLimits f;
  f.registers = 32;
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {256, 1, 1}), h100, f) == 8);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {32, 1, 1}), h100, f) == 32);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {1024, 1, 1}), h100, f) == 2);
  f.registers = 64;
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {1024, 1, 1}), h100, f) == 1);
  f.registers = 0;
  // 100 KiB + 1 KiB reserved: two blocks in 228 KiB.
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {128, 1, 1}, 100 * 1024), h100, f) == 2);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {128, 1, 1}, 227 * 1024), h100, f) == 1);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {128, 1, 1}, 227 * 1024 + 1), h100, f) == 0);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {1025, 1, 1}), h100, f) == 0);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {0, 1, 1}), h100, f) == 0);
  // sm_86: 1536 threads per SM, 16 blocks.
  const DeviceLimits ga = DeviceLimits::for_arch(Arch{8, 6});
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {1024, 1, 1}), ga, f) == 1);
  CHECK(occupancy_blocks_per_sm(shape({1, 1, 1}, {32, 1, 1}), ga, f) == 16);
  // A device where one block's threads exceed what an SM can hold.
  DeviceLimits tiny = h100;
  tiny.max_threads_per_sm = 512;
  CHECK(rejection(shape({1, 1, 1}, {1024, 1, 1}), tiny) ==
        "probe launch 1 of 1: blocks per SM (occupancy) is 0: one block of this shape does not "
        "fit on an SM (threads, registers or shared memory per SM), the launch needs 1");
}

Plan sample_plan() {
  Plan plan;
  plan.op = "merge_state";
  plan.mode = "head_tiled";
  plan.device = DeviceLimits::for_name("h200");
  plan.reasons = {"token_major needs block (16, 128) = 2048 threads > 1024",
                  "a \"quoted\" reason\nwith a newline and a tab\t and a \x01"};
  PlannedLaunch launch;
  launch.spec = KernelSpec::parse("probe:heavy=0@sm_90");
  launch.shape = shape({4096, 2, 1}, {16, 64, 1}, 1024);
  launch.checks = check_launch(launch.shape, plan.device);
  plan.launches.push_back(launch);
  return plan;
}

TEST_CASE("plan: explain names the op, mode, device, reasons and every check with its margin") {
  const std::string text = sample_plan().explain();
  CAPTURE(text);
  for (const char* expected :
       {"op merge_state: mode head_tiled\n", "device h200 (sm_90, 132 SMs",
        "  - token_major needs block (16, 128) = 2048 threads > 1024\n",
        "launch 1 of 1: probe:heavy=0@sm_90\n",
        "  grid (4096, 2, 1) block (16, 64, 1) dynamic smem 1024 bytes\n",
        "threads per block: 1024 / 1024 (margin 0)\n", "grid.y: 2 / 65535 (margin 65533)\n",
        "dynamic shared memory: 1024 / 232448 (margin 231424)\n",
        "blocks per SM (occupancy): 1 / 2 (margin 1)\n"}) {
    CAPTURE(expected);
    CHECK(text.find(expected) != std::string::npos);
  }
  CHECK(text.find("FAIL") == std::string::npos);
}

TEST_CASE("plan: to_json is one object with escaped strings") {
  const std::string json = sample_plan().to_json();
  CAPTURE(json);
  CHECK(json.front() == '{');
  CHECK(json.back() == '}');
  CHECK(json.find('\n') == std::string::npos);
  for (const char* expected :
       {"\"op\":\"merge_state\"", "\"mode\":\"head_tiled\"", "\"arch\":\"sm_90\"",
        "\"device\":\"h200\"", "\"reasons\":[\"token_major needs block (16, 128) = 2048",
        "a \\\"quoted\\\" reason\\nwith a newline and a tab\\t and a \\u0001\"]",
        "\"launches\":[{\"spec\":\"probe:heavy=0@sm_90\"", "\"grid\":[4096,2,1]",
        "\"block\":[16,64,1]", "\"dynamic_smem\":1024,\"overlaps_previous\":false",
        "{\"limit\":\"threads per block\",\"requested\":1024,\"allowed\":1024}",
        "{\"limit\":\"grid.y\",\"requested\":2,\"allowed\":65535}"}) {
    CAPTURE(expected);
    CHECK(json.find(expected) != std::string::npos);
  }
  // Balanced brackets outside strings: a cheap structural check without a JSON parser.
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    CHECK(depth >= 0);
    CHECK(static_cast<unsigned char>(c) >= 0x20);
  }
  CHECK(depth == 0);
  CHECK(!in_string);
}

}  // namespace
}  // namespace kjit
