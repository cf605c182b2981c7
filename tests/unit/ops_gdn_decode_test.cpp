// SPDX-License-Identifier: Apache-2.0
// gdn_decode planning (legal at every batch, mode choice at the grid boundaries, x-folding on a
// tiny device), validation messages, and the float64 reference against hand-computed steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/plan.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"

namespace kjit {
namespace {

/// Fake, 256-byte aligned device addresses: planning only looks at their alignment.
void* fake(std::uintptr_t n) { return reinterpret_cast<void*>((n + 1) << 28); }

struct Views {
  TensorView qkv, a, b, a_log, dt_bias, state, indices, out;
};

Views views(std::int64_t batch, std::int64_t heads, std::int64_t value_heads, std::int64_t k,
            std::int64_t v, DType state_dtype = DType::f32, DType qkv_dtype = DType::bf16,
            std::int64_t slots = 8) {
  Views w;
  w.qkv = TensorView::contiguous(fake(0), qkv_dtype, {batch, 2 * heads * k + value_heads * v});
  w.a = TensorView::contiguous(fake(1), qkv_dtype, {batch, value_heads});
  w.b = TensorView::contiguous(fake(2), qkv_dtype, {batch, value_heads});
  w.a_log = TensorView::contiguous(fake(3), DType::f32, {value_heads});
  w.dt_bias = TensorView::contiguous(fake(4), DType::f32, {value_heads});
  w.state = TensorView::contiguous(fake(5), state_dtype, {slots, value_heads, v, k});
  w.indices = TensorView::contiguous(fake(6), DType::i32, {batch});
  w.out = TensorView::contiguous(fake(7), qkv_dtype, {batch, value_heads, v});
  return w;
}

Plan plan(const Views& w, const DeviceLimits& device, const GdnDecodeOptions& options = {}) {
  return plan_gdn_decode(w.qkv, w.a, w.b, w.a_log, w.dt_bias, w.state, w.indices, w.out, options,
                         device);
}

std::string rejection(const Views& w, const GdnDecodeOptions& options = {}) {
  try {
    plan(w, DeviceLimits::for_arch(Arch{9, 0}), options);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return {};
}

bool all_ok(const Plan& p) {
  for (const PlannedLaunch& launch : p.launches) {
    for (const LimitCheck& check : launch.checks) {
      if (!check.ok()) return false;
    }
  }
  return !p.launches.empty();
}

TEST_CASE("gdn_decode plan: legal for every batch, head count and head dim on sm_90") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  for (std::int64_t batch : {1, 8, 2047, 2048, 65535, 65536, 70000, 1 << 24}) {
    for (std::int64_t value_heads : {1, 32, 64}) {
      for (std::int64_t k : {64, 128, 256}) {
        for (std::int64_t v : {64, 128, 256}) {
          CAPTURE(batch);
          CAPTURE(value_heads);
          CAPTURE(k);
          CAPTURE(v);
          const Plan p = plan(views(batch, 1, value_heads, k, v), h200);
          // A ranking kernel comes first when the rows run in slot order (>= 512 MiB of state,
          // 2..16384 rows).
          const bool ordered = p.launches.back().spec.get_int("ordered") == 1;
          CHECK(ordered == (batch >= 2 && batch <= 16384 &&
                            batch * value_heads * k * v * 4 >= (std::int64_t{512} << 20)));
          REQUIRE(p.launches.size() == (ordered ? 2u : 1u));
          CHECK(all_ok(p));
          const std::int64_t pairs = batch * value_heads;
          const std::string expected = pairs <= 65535   ? "flat"
                                       : batch <= 65535 ? "split"
                                                        : "folded";
          CHECK(p.mode == expected);
          CHECK(p.launches.back().spec.get("mode") == expected);
          const std::int64_t bv = p.launches.back().spec.get_int("bv");
          CHECK(v % bv == 0);
          const Dim3 grid = p.launches.back().shape.grid;
          if (expected == "folded") {
            CHECK(grid.x == std::min<std::int64_t>(pairs * (v / bv), 2147483647));
          } else {
            CHECK(grid.count() == static_cast<std::uint64_t>(pairs * (v / bv)));
          }
          CHECK(p.launches.back().shape.block.x % 32 == 0);
          CHECK(p.launches.back().shape.block.x <= 256);
        }
      }
    }
  }
}

TEST_CASE("gdn_decode plan: mode at the grid-y boundary") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  CHECK(plan(views(65535, 1, 1, 128, 128), h200).mode == "flat");
  CHECK(plan(views(65536, 1, 1, 128, 128), h200).mode == "folded");  // B > max grid z
  CHECK(plan(views(2048, 16, 32, 128, 128), h200).mode == "split");  // B*HV = 65536
  CHECK(plan(views(2047, 16, 32, 128, 128), h200).mode == "flat");   // 65504
  CHECK(plan(views(70000, 1, 1, 16, 16), h200).mode == "folded");
  const Plan split = plan(views(2048, 16, 32, 128, 128), h200);
  CHECK(split.launches.back().shape.grid.y == 32);
  CHECK(split.launches.back().shape.grid.z == 2048);
  CHECK_FALSE(split.reasons.empty());
  CHECK(split.explain().find("flat ruled out") != std::string::npos);

  GdnDecodeOptions forced;
  forced.force_mode = "flat";
  CHECK_THROWS_AS(plan(views(2048, 16, 32, 128, 128), h200, forced), PlanError);
  forced.force_mode = "folded";
  CHECK(plan(views(8, 16, 32, 128, 128), h200, forced).mode == "folded");
  forced.force_mode = "diagonal";
  CHECK(rejection(views(8, 16, 32, 128, 128), forced).find("force_mode") != std::string::npos);
}

TEST_CASE("gdn_decode plan: a tiny device still plans by folding onto x") {
  DeviceLimits tiny = DeviceLimits::for_arch(Arch{9, 0});
  tiny.max_grid_dim = {1000, 7, 7};
  for (std::int64_t batch : {1, 5, 8, 100, 70000}) {
    for (std::int64_t value_heads : {1, 7, 32}) {
      CAPTURE(batch);
      CAPTURE(value_heads);
      const Plan p = plan(views(batch, 1, value_heads, 128, 128), tiny);
      CHECK(all_ok(p));
      const std::int64_t pairs = batch * value_heads;
      const std::int64_t nv = 128 / p.launches.back().spec.get_int("bv");
      if (pairs <= 7) {
        CHECK(p.mode == "flat");
      } else if (value_heads <= 7 && batch <= 7) {
        CHECK(p.mode == "split");
      } else {
        CHECK(p.mode == "folded");
        CHECK(p.launches.back().shape.grid.x == std::min<std::int64_t>(pairs * nv, 1000));
      }
    }
  }
}

TEST_CASE("gdn_decode plan: V tiles shrink at small batch, grow at large batch") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  const Plan small = plan(views(1, 16, 32, 128, 128), h200);
  const std::int64_t bv_small = small.launches.back().spec.get_int("bv");
  CHECK(32 * (128 / bv_small) >= 2 * 132);
  CHECK(bv_small <= 16);
  CHECK(small.launches.back().spec.get_int("warps") == 1);
  // A step reading >= 512 MiB of state (here 2 GiB) stages its tiles in shared memory: one
  // warp x 8 rows per thread, 4 KiB of shared memory, registers capped for 32 one-warp blocks
  // per SM. Below 512 MiB the tiles stay in registers.
  const Plan large = plan(views(1024, 16, 32, 128, 128), h200);
  CHECK(large.launches.back().spec.get_int("bv") == 8);
  CHECK(large.launches.back().spec.get_int("warps") == 1);
  CHECK(large.launches.back().spec.get_int("vec_bytes") == 16);
  CHECK(large.launches.back().spec.get("load_hint") == "staged");
  CHECK(large.launches.back().spec.get_int("min_blocks") == 32);
  CHECK(large.launches.back().shape.dynamic_smem == 8 * 128 * 4);
  // A forced larger staged tile (16 KiB) fits 13 blocks per SM by shared memory and is capped
  // for those, not for 32 (which would leave 64 registers to 32 rows per thread).
  GdnDecodeOptions big_staged;
  big_staged.force_bv = 32;
  big_staged.force_cache_hints = "staged/stream";
  const Plan big = plan(views(1024, 16, 32, 128, 128), h200, big_staged);
  CHECK(big.launches.back().shape.dynamic_smem == 32 * 128 * 4);
  CHECK(big.launches.back().spec.get_int("min_blocks") ==
        h200.max_smem_per_sm / (32 * 128 * 4 + h200.reserved_smem_per_block));
  // Forced register loads keep 4 rows per thread and no shared memory.
  GdnDecodeOptions in_registers;
  in_registers.force_cache_hints = "stream/stream";
  const Plan registers = plan(views(1024, 16, 32, 128, 128), h200, in_registers);
  CHECK(registers.launches.back().spec.get_int("bv") == 4);
  CHECK(registers.launches.back().spec.get_int("min_blocks") == 0);
  CHECK(registers.launches.back().shape.dynamic_smem == 0);
  // A small grid keeps its loads in registers, and so does a step under 512 MiB of state.
  CHECK(small.launches.back().spec.get("load_hint") == "stream");
  CHECK(plan(views(255, 16, 32, 128, 128), h200).launches.back().spec.get("load_hint") == "stream");
  CHECK(plan(views(255, 16, 32, 128, 128), h200).launches.back().spec.get_int("bv") == 4);
  CHECK(plan(views(256, 16, 32, 128, 128), h200).launches.back().spec.get("load_hint") == "staged");
  CHECK(plan(views(256, 16, 32, 128, 128), h200).launches.back().spec.get_int("bv") == 8);
  CHECK(plan(views(128, 16, 64, 128, 128), h200).launches.back().spec.get("load_hint") == "staged");
  CHECK(small.launches.back().shape.dynamic_smem == 0);
  // Staging needs one tile per block and 16-byte vectors.
  GdnDecodeOptions staged_bulk;
  staged_bulk.force_mode = "bulk";
  staged_bulk.force_cache_hints = "staged/stream";
  CHECK_THROWS_AS(plan(views(1024, 16, 32, 128, 128), h200, staged_bulk), PlanError);
  GdnDecodeOptions bulk;
  bulk.force_mode = "bulk";
  CHECK(plan(views(1024, 16, 32, 128, 128), h200, bulk).launches.back().spec.get("load_hint") ==
        "stream");

  GdnDecodeOptions forced;
  forced.force_bv = 32;
  CHECK(plan(views(1, 16, 32, 128, 128), h200, forced).launches.back().spec.get_int("bv") == 32);
  forced.force_bv = 48;
  CHECK(rejection(views(1, 16, 32, 128, 128), forced).find("force_bv") != std::string::npos);
}

TEST_CASE("gdn_decode plan: the pool's alignment picks the vector width") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  Views w = views(4, 1, 2, 64, 64);
  w.state.data = static_cast<char*>(w.state.data) + 4;
  CHECK(plan(w, h200).launches.back().spec.get_int("vec_bytes") == 4);
  w = views(4, 1, 2, 64, 64);
  w.state.strides[0] += 2;  // padded slot stride: 8-byte multiple
  CHECK(plan(w, h200).launches.back().spec.get_int("vec_bytes") == 8);
  w = views(4, 1, 2, 64, 64, DType::bf16);
  w.state.strides[0] += 1;  // 2-byte multiple
  const Plan narrow = plan(w, h200);
  CHECK(narrow.launches.back().spec.get_int("vec_bytes") == 2);
  CHECK(all_ok(narrow));
}

TEST_CASE("gdn_decode plan: every dtype combination and both forms plan") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  for (DType qkv : {DType::f16, DType::bf16, DType::f32}) {
    for (DType state : {DType::f16, DType::bf16, DType::f32}) {
      for (DType index : {DType::i32, DType::i64}) {
        Views w = views(3, 2, 4, 80, 48, state, qkv);
        w.indices.dtype = index;
        const Plan p = plan(w, h200);
        CHECK(all_ok(p));
        CHECK(p.launches.back().spec.get("state") == to_string(state));
        TensorView g = TensorView::contiguous(fake(9), DType::f32, {3, 4});
        const Plan gated = plan_gdn_decode_gated(w.qkv, g, g, w.state, w.indices, w.out, {}, h200);
        CHECK(gated.launches.back().spec.get("gated") == "1");
        CHECK(all_ok(gated));
      }
    }
  }
}

TEST_CASE("gdn_decode plan: persistent and bulk grids are resident, checked and explained") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  for (const char* mode : {"persistent", "bulk"}) {
    for (std::int64_t batch : {1, 8, 2048, 70000, 1 << 24}) {
      for (std::int64_t value_heads : {1, 32, 64}) {
        CAPTURE(mode);
        CAPTURE(batch);
        CAPTURE(value_heads);
        GdnDecodeOptions options;
        options.force_mode = mode;
        const Plan p = plan(views(batch, 1, value_heads, 128, 128), h200, options);
        REQUIRE(p.launches.size() == 1);
        CHECK(all_ok(p));
        CHECK(p.mode == mode);
        const KernelSpec& spec = p.launches.back().spec;
        const std::int64_t bps = spec.get_int("min_blocks");
        const std::int64_t tiles = batch * value_heads * (128 / spec.get_int("bv"));
        CHECK(bps >= 1);
        CHECK(p.launches.back().shape.grid.x == std::min<std::int64_t>(tiles, 132 * bps));
        CHECK(p.launches.back().shape.grid.y == 1);
        CHECK(p.launches.back().shape.grid.z == 1);
        // The residency the grid assumes is one of the plan's checks.
        bool resident_checked = false;
        for (const LimitCheck& check : p.launches.back().checks) {
          if (check.limit.find("resident blocks per SM") != std::string::npos) {
            resident_checked = true;
            CHECK(check.requested == bps);
          }
        }
        CHECK(resident_checked);
        CHECK(p.explain().find("resident per SM") != std::string::npos);
        if (std::string(mode) == "bulk") {
          const std::int64_t stages = spec.get_int("stages");
          CHECK(stages >= 2);
          CHECK(p.launches.back().shape.dynamic_smem ==
                static_cast<std::uint32_t>(stages * spec.get_int("bv") * 128 * 4));
        } else {
          CHECK(spec.get_int("stages") == 0);
          CHECK(p.launches.back().shape.dynamic_smem == 0);
        }
      }
    }
  }
  // The other modes carry no stages, and a residency assumption only when staged.
  const Plan flat = plan(views(2, 16, 32, 128, 128), h200);
  CHECK(flat.launches.back().spec.get_int("stages") == 0);
  CHECK(flat.launches.back().spec.get("load_hint") == "stream");
  CHECK(flat.launches.back().spec.get_int("min_blocks") == 0);
}

TEST_CASE("gdn_decode plan: forced persistent and bulk parameters are checked") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  GdnDecodeOptions options;
  options.force_mode = "bulk";
  options.force_bv = 32;
  options.force_stages = 3;
  options.force_blocks_per_sm = 2;
  const Plan p = plan(views(256, 16, 32, 128, 128), h200, options);
  CHECK(p.launches.back().spec.get_int("stages") == 3);
  CHECK(p.launches.back().spec.get_int("min_blocks") == 2);
  CHECK(p.launches.back().shape.dynamic_smem == 3 * 32 * 128 * 4);
  CHECK(p.launches.back().shape.grid.x == 264);

  // More resident blocks than shared memory allows: a plan error naming the limit.
  options.force_stages = 8;
  options.force_blocks_per_sm = 4;  // 4 x 128 KiB > 228 KiB per SM
  CHECK_THROWS_WITH_AS(plan(views(256, 16, 32, 128, 128), h200, options),
                       doctest::Contains("resident blocks per SM"), PlanError);
  // Too many resident blocks for the registers a thread needs.
  options = {};
  options.force_mode = "persistent";
  options.force_bv = 64;
  options.force_blocks_per_sm = 8;  // 256 threads x 8 blocks: 32 registers each
  CHECK(all_ok(plan(views(256, 16, 32, 128, 128), h200, options)));
  options.force_blocks_per_sm = 16;
  CHECK_THROWS_AS(plan(views(256, 16, 32, 128, 128), h200, options), PlanError);

  // Bulk needs sm_90 and a 16-byte aligned pool.
  options = {};
  options.force_mode = "bulk";
  CHECK_THROWS_WITH_AS(
      plan(views(8, 16, 32, 128, 128), DeviceLimits::for_arch(Arch{8, 0}), options),
      doctest::Contains("sm_90"), PlanError);
  Views narrow = views(8, 16, 32, 128, 128);
  narrow.state.strides[0] += 2;  // 8-byte multiple
  CHECK_THROWS_WITH_AS(plan(narrow, h200, options), doctest::Contains("16-byte"), PlanError);
  options.force_mode = "persistent";
  CHECK(all_ok(plan(narrow, h200, options)));
  // Staged loads need 16-byte vectors too; the error names the option's value and the vectors.
  options = {};
  options.force_cache_hints = "staged/stream";
  std::string staged_error;
  try {
    plan(narrow, h200, options);
  } catch (const PlanError& error) {
    staged_error = error.what();
  }
  CHECK(staged_error.find("'staged/stream'") != std::string::npos);
  CHECK(staged_error.find("have 8 B") != std::string::npos);

  // Stages and residency belong to those modes; out-of-range values are named.
  options = {};
  options.force_mode = "flat";
  options.force_stages = 2;
  CHECK(rejection(views(8, 16, 32, 128, 128), options).find("force_stages") != std::string::npos);
  // In the one-tile-per-block modes a residency is only a register cap: same grid.
  options.force_stages = 0;
  options.force_blocks_per_sm = 6;
  const Plan capped = plan(views(8, 16, 32, 128, 128), h200, options);
  CHECK(all_ok(capped));
  CHECK(capped.launches.back().spec.get_int("min_blocks") == 6);
  CHECK(capped.launches.back().shape.grid ==
        plan(views(8, 16, 32, 128, 128), h200).launches.back().shape.grid);
  options.force_blocks_per_sm = 33;
  CHECK(rejection(views(8, 16, 32, 128, 128), options).find("force_blocks_per_sm") !=
        std::string::npos);
  options.force_mode = "bulk";
  options.force_blocks_per_sm = 0;
  options.force_stages = 9;
  CHECK(rejection(views(8, 16, 32, 128, 128), options).find("force_stages") != std::string::npos);
}

bool has_reason(const Plan& p, std::string_view text) {
  for (const std::string& reason : p.reasons) {
    if (reason.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("gdn_decode plan: rows in slot order") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  // 512 MiB of f32 state (B = 256, HV = 32): a ranking kernel of ceil(B / 32) blocks, then the
  // step, which may start early (programmatic launch) and waits for the keys.
  const Plan big = plan(views(256, 16, 32, 128, 128), h200);
  REQUIRE(big.launches.size() == 2);
  CHECK(all_ok(big));
  CHECK(big.launches[0].spec.family == "gdn_decode_order");
  CHECK(big.launches[0].spec.get("index") == "i32");
  CHECK(big.launches[0].spec.get("invalid") == "negative");
  CHECK(big.launches[0].shape.grid.x == 8);
  CHECK(big.launches[0].shape.block.x == 256);
  CHECK_FALSE(big.launches[0].shape.overlaps_previous);
  CHECK(big.launches[1].spec.get_int("ordered") == 1);
  CHECK(big.launches[1].shape.overlaps_previous);
  CHECK(has_reason(big, "rows in slot order: 512 MiB of state"));
  // sm_80 has no programmatic launch: the step starts after the ranking kernel.
  const Plan a100 = plan(views(256, 16, 32, 128, 128), DeviceLimits::for_arch(Arch{8, 0}));
  REQUIRE(a100.launches.size() == 2);
  CHECK_FALSE(a100.launches[1].shape.overlaps_previous);
  // Below 512 MiB, one row, above 16384 rows, or in the resident modes: the given order.
  for (const auto& [batch, value_heads] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {255, 32}, {32, 32}, {1, 64}, {16385, 32}, {70000, 64}}) {
    CAPTURE(batch);
    const Plan p = plan(views(batch, 16, value_heads, 128, 128), h200);
    CHECK(p.launches.size() == 1);
    CHECK(p.launches.back().spec.get_int("ordered") == 0);
    CHECK(has_reason(p, "rows in the given order"));
  }
  CHECK(plan(views(16384, 16, 32, 128, 128), h200).launches.size() == 2);
  GdnDecodeOptions persistent;
  persistent.force_mode = "persistent";
  CHECK(plan(views(256, 16, 32, 128, 128), h200, persistent).launches.size() == 1);

  // Forced either way.
  GdnDecodeOptions by_slot;
  by_slot.row_order = GdnRowOrder::by_slot;
  for (const char* mode : {"", "flat", "split", "folded"}) {
    CAPTURE(mode);
    by_slot.force_mode = mode;
    const Plan p = plan(views(1, 16, 32, 128, 128), h200, by_slot);
    REQUIRE(p.launches.size() == 2);
    CHECK(all_ok(p));
    CHECK(p.launches[0].shape.grid.x == 1);
    CHECK(has_reason(p, "forced by options.row_order"));
  }
  by_slot.force_mode = "bulk";
  CHECK_THROWS_WITH_AS(plan(views(256, 16, 32, 128, 128), h200, by_slot),
                       doctest::Contains("options.row_order = by_slot needs the flat, split or "
                                         "folded mode (mode is bulk)"),
                       PlanError);
  by_slot.force_mode.clear();
  CHECK_THROWS_WITH_AS(plan(views(16385, 1, 1, 128, 128), h200, by_slot),
                       doctest::Contains("B <= 16384 (B = 16385)"), PlanError);
  GdnDecodeOptions as_given;
  as_given.row_order = GdnRowOrder::as_given;
  const Plan given = plan(views(256, 16, 32, 128, 128), h200, as_given);
  CHECK(given.launches.size() == 1);
  CHECK(given.launches.back().spec.get_int("ordered") == 0);
  CHECK(has_reason(given, "options.row_order = as_given"));
  // The ranking kernel follows the index type and the invalid rule.
  Views w = views(300, 16, 32, 128, 128);
  w.indices = TensorView::contiguous(fake(6), DType::i64, {300});
  GdnDecodeOptions nonpositive;
  nonpositive.invalid_index = GdnInvalidIndex::nonpositive;
  const Plan i64_plan = plan(w, h200, nonpositive);
  REQUIRE(i64_plan.launches.size() == 2);
  CHECK(i64_plan.launches[0].spec.get("index") == "i64");
  CHECK(i64_plan.launches[0].spec.get("invalid") == "nonpositive");
  CHECK(i64_plan.launches[0].shape.grid.x == 10);
}

TEST_CASE("gdn_decode plan: cache hints of the state accesses") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  GdnDecodeOptions options;
  const Plan planned = plan(views(256, 16, 32, 128, 128), h200, options);
  CHECK_FALSE(planned.launches.back().spec.get("load_hint").empty());
  CHECK(planned.explain().find("cache hints") != std::string::npos);
  for (const char* hints : {"stream/stream", "plain/plain", "l2_256/stream", "l2_256/plain"}) {
    options.force_cache_hints = hints;
    const Plan p = plan(views(256, 16, 32, 128, 128), h200, options);
    const std::string text = hints;
    CHECK(p.launches.back().spec.get("load_hint") == text.substr(0, text.find('/')));
    CHECK(p.launches.back().spec.get("store_hint") == text.substr(text.find('/') + 1));
  }
  for (const char* bad : {"plain", "l2_256/l2_256", "fast/stream", "/"}) {
    options.force_cache_hints = bad;
    CHECK(rejection(views(8, 16, 32, 128, 128), options).find("force_cache_hints") !=
          std::string::npos);
  }
}

TEST_CASE("gdn_decode validation names the argument, its value and what is accepted") {
  Views w = views(4, 2, 4, 128, 128);
  w.qkv.shape[1] += 1;
  CHECK(rejection(w).find("mixed_qkv") != std::string::npos);

  w = views(4, 3, 4, 128, 128);  // H = 3 does not divide HV = 4
  CHECK(rejection(w).find("must divide HV = 4") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.state.strides[2] = 256;
  CHECK(rejection(w).find("state") != std::string::npos);

  w = views(4, 2, 4, 72, 128);
  CHECK(rejection(w).find("K = 72") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.indices.dtype = DType::f32;
  CHECK(rejection(w).find("state_indices") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.b.dtype = DType::f32;
  CHECK(rejection(w).find("b is") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.out.shape[2] = 64;
  CHECK(rejection(w).find("out") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.a.strides[1] = 2;
  CHECK(rejection(w).find("a is") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.indices.shape[0] = 0;
  CHECK(rejection(w).find("state_indices") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  w.qkv.data = nullptr;
  CHECK(rejection(w).find("null") != std::string::npos);

  w = views(4, 2, 4, 128, 128);
  TensorView g = TensorView::contiguous(fake(9), DType::bf16, {4, 4});
  CHECK_THROWS_WITH_AS(plan_gdn_decode_gated(w.qkv, g, g, w.state, w.indices, w.out, {},
                                             DeviceLimits::for_arch(Arch{9, 0})),
                       doctest::Contains("g is"), InvalidArgument);
}

/// The pool of `w` as a K-major view: the transpose of a contiguous [slots, HV, K, V] pool.
void make_k_major(Views& w) {
  const std::int64_t hv = w.state.shape[1], v = w.state.shape[2], k = w.state.shape[3];
  w.state.strides[0] = hv * v * k;
  w.state.strides[1] = v * k;
  w.state.strides[2] = 1;
  w.state.strides[3] = v;
}

TEST_CASE("gdn_decode plan: a K-major pool (V contiguous) is a specialization") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  for (DType state : {DType::f32, DType::bf16, DType::f16}) {
    for (std::int64_t k : {16, 48, 64, 128, 256}) {
      for (std::int64_t v : {16, 48, 128, 256}) {
        for (std::int64_t batch : {1, 64, 70000}) {
          CAPTURE(to_string(state));
          CAPTURE(k);
          CAPTURE(v);
          CAPTURE(batch);
          Views w = views(batch, 2, 4, k, v, state);
          const Plan vk = plan(w, h200);
          make_k_major(w);
          const Plan kv = plan(w, h200);
          CHECK(all_ok(kv));
          const KernelSpec& spec = kv.launches.back().spec;
          CHECK(spec.get("state_layout") == "kv");
          CHECK(spec.str().find(",state_layout=kv@") != std::string::npos);
          // The V-major spec has no layout parameter: its text is what it was.
          CHECK_FALSE(vk.launches.back().spec.has("state_layout"));
          CHECK(vk.launches.back().spec.str().find("state_layout") == std::string::npos);
          CHECK(spec.get("load_hint") != "staged");
          CHECK(spec.get_int("stages") == 0);
          const std::int64_t bv = spec.get_int("bv");
          CHECK(v % bv == 0);
          CHECK(kv.explain().find("state layout kv") != std::string::npos);
          CHECK(vk.explain().find("state layout kv") == std::string::npos);
        }
      }
    }
  }
  // f32, K = V = 128, 16-byte vectors: 128-byte lines of 32 columns, 8 lanes each; 4 warps of
  // 8 lines per thread.
  Views w = views(64, 2, 4, 128, 128, DType::f32);
  make_k_major(w);
  const Plan p = plan(w, h200);
  CHECK(p.launches.back().spec.get_int("bv") == 32);
  CHECK(p.launches.back().spec.get_int("warps") == 4);
  CHECK(p.launches.back().shape.block.x == 128);
  CHECK(p.explain().find("lines of 128 B") != std::string::npos);

  // The plan memo distinguishes the layouts (the Problem holds it): a second plan of the V-major
  // pool after the K-major one is V-major again.
  Views back = views(64, 2, 4, 128, 128, DType::f32);
  CHECK_FALSE(plan(back, h200).launches.back().spec.has("state_layout"));

  // Rows in slot order and the gated form work the same way.
  Views big = views(4096, 16, 64, 128, 128, DType::f32, DType::bf16, 8192);
  make_k_major(big);
  GdnDecodeOptions by_slot;
  by_slot.row_order = GdnRowOrder::by_slot;
  const Plan ordered = plan(big, h200, by_slot);
  CHECK(ordered.launches.size() == 2);
  CHECK(ordered.launches.back().spec.get("state_layout") == "kv");
  TensorView g = TensorView::contiguous(fake(9), DType::f32, {4096, 64});
  const Plan gated =
      plan_gdn_decode_gated(big.qkv, g, g, big.state, big.indices, big.out, {}, h200);
  CHECK(gated.launches.back().spec.get("state_layout") == "kv");
  CHECK(gated.launches.back().spec.get("gated") == "1");

  // Folded and split grids take it; forced tiles are checked against its rules.
  GdnDecodeOptions folded;
  folded.force_mode = "folded";
  CHECK(plan(w, h200, folded).launches.back().spec.get("mode") == "folded");
  GdnDecodeOptions forced_bv;
  forced_bv.force_bv = 16;
  CHECK(plan(w, h200, forced_bv).launches.back().spec.get_int("bv") == 16);
  forced_bv.force_bv = 256;
  CHECK_THROWS_WITH_AS(plan(w, h200, forced_bv), doctest::Contains("K-major"), InvalidArgument);

  // Resident modes and staged loads are V-major only.
  for (const char* mode : {"persistent", "bulk"}) {
    GdnDecodeOptions resident;
    resident.force_mode = mode;
    CHECK_THROWS_WITH_AS(plan(w, h200, resident), doctest::Contains("K-major state"), PlanError);
  }
  GdnDecodeOptions staged;
  staged.force_cache_hints = "staged/stream";
  CHECK_THROWS_WITH_AS(plan(w, h200, staged), doctest::Contains("K-major state"), PlanError);
  GdnDecodeOptions plain;
  plain.force_cache_hints = "plain/plain";
  CHECK(plan(w, h200, plain).launches.back().spec.get("load_hint") == "plain");

  // A large step does not stage a K-major pool (staging is V-major).
  Views large = views(2048, 16, 64, 128, 128, DType::f32, DType::bf16, 4096);
  make_k_major(large);
  CHECK(plan(large, h200).launches.back().spec.get("load_hint") == "stream");
}

TEST_CASE("gdn_decode validation: other state strides name both accepted layouts") {
  const auto check_rejected = [](Views w) {
    const std::string why = rejection(w);
    CAPTURE(why);
    CHECK(why.find("gdn_decode: state is") != std::string::npos);
    CHECK(why.find("strides") != std::string::npos);
    CHECK(why.find("[*, 16384, 128, 1] (K contiguous)") != std::string::npos);
    CHECK(why.find("[*, 16384, 1, 128] (V contiguous") != std::string::npos);
  };
  Views w = views(4, 2, 4, 128, 128);
  w.state.strides[2] = 256;  // padded V rows
  check_rejected(w);
  w = views(4, 2, 4, 128, 128);
  make_k_major(w);
  w.state.strides[3] = 256;  // padded K lines
  check_rejected(w);
  w = views(4, 2, 4, 128, 128);
  make_k_major(w);
  w.state.strides[1] = 2 * 128 * 128;  // heads not packed
  check_rejected(w);
  w = views(4, 2, 4, 128, 128);
  w.state.strides[2] = 1;  // both unit strides
  w.state.strides[3] = 1;
  check_rejected(w);
  // A K-major pool with a padded slot stride is accepted, as a V-major one is.
  w = views(4, 2, 4, 128, 128);
  make_k_major(w);
  w.state.strides[0] = 4 * 128 * 128 + 64;
  CHECK(rejection(w).empty());
}

// --- float64 reference -------------------------------------------------------------------

TEST_CASE("gdn reference: one step by hand") {
  // K = V = 1, no normalization: H = 2 * 0.5 = 1; u = 0.5 * (5 - 1 * 4) = 0.5;
  // H = 1 + 0.5 * 4 = 3; o = 3 * 3 = 9.
  std::vector<double> h = {2.0}, o = {0.0};
  const std::vector<double> q = {3.0}, k = {4.0}, v = {5.0};
  reference::gdn_step(h, q, k, v, std::log(0.5), 0.5, 1.0, false, o);
  CHECK(h[0] == doctest::Approx(3.0));
  CHECK(o[0] == doctest::Approx(9.0));

  // With L2 norm q, k -> ~1: H = 1, u = 0.5 * (5 - 1) = 2, H = 3, o = 3.
  h = {2.0};
  reference::gdn_step(h, q, k, v, std::log(0.5), 0.5, 1.0, true, o);
  CHECK(h[0] == doctest::Approx(3.0).epsilon(1e-6));
  CHECK(o[0] == doctest::Approx(3.0).epsilon(1e-6));

  // K = V = 2: H = I, k = e0, q = e1, v = (2, 3), g = 0, beta = 1:
  // Hk = (1, 0), u = (1, 3), H = [[2, 0], [3, 1]], o = Hq = (0, 1).
  std::vector<double> h2 = {1, 0, 0, 1}, o2 = {0, 0};
  const std::vector<double> q2 = {0, 1}, k2 = {1, 0}, v2 = {2, 3};
  reference::gdn_step(h2, q2, k2, v2, 0.0, 1.0, 1.0, false, o2);
  CHECK(h2 == std::vector<double>{2, 0, 3, 1});
  CHECK(o2 == std::vector<double>{0, 1});

  CHECK(reference::gdn_softplus(25.0, 20.0) == 25.0);
  CHECK(reference::gdn_softplus(1.0, 20.0) == doctest::Approx(std::log1p(std::exp(1.0))));
  CHECK(reference::gdn_sigmoid(0.0) == 0.5);
  CHECK(reference::gdn_log_decay(0.5, 0.0, 0.5, 20.0) ==
        doctest::Approx(-std::log1p(std::exp(1.0))));
}

/// A small host problem: B rows, H = 1, HV = 2, K = V = 2, f32 everywhere.
struct HostProblem {
  static constexpr std::int64_t kB = 3, kHV = 2, kK = 2, kV = 2, kSlots = 4;
  std::vector<float> qkv, a, b, a_log, dt_bias, state, out, g, beta;
  std::vector<std::int32_t> indices;

  HostProblem() {
    const std::int64_t width = 2 * kK + kHV * kV;
    qkv.resize(kB * width);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = 0.25f * float(i % 7) - 0.5f;
    a = {0.1f, -0.3f, 0.7f, 1.5f, -2.0f, 0.0f};
    b = {0.2f, -1.0f, 0.4f, 3.0f, -0.5f, 0.9f};
    a_log = {0.3f, -0.6f};
    dt_bias = {0.05f, -0.2f};
    state.resize(kSlots * kHV * kV * kK);
    for (std::size_t i = 0; i < state.size(); ++i) state[i] = 0.1f * float(i) - 1.0f;
    out.assign(kB * kHV * kV, -7.0f);
    indices = {2, -1, 0};
    g.resize(kB * kHV);
    beta.resize(kB * kHV);
    for (std::int64_t i = 0; i < kB * kHV; ++i) {
      g[i] = float(reference::gdn_log_decay(a[i], a_log[i % kHV], dt_bias[i % kHV], 20.0));
      beta[i] = float(reference::gdn_sigmoid(b[i]));
    }
  }
  TensorView view(std::vector<float>& data, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(data.data(), DType::f32, shape);
  }
  void run(const GdnDecodeOptions& options, bool gated) {
    const TensorView x = view(qkv, {kB, 2 * kK + kHV * kV});
    const TensorView s = view(state, {kSlots, kHV, kV, kK});
    const TensorView idx = TensorView::contiguous(indices.data(), DType::i32, {kB});
    const TensorView o = view(out, {kB, kHV, kV});
    if (gated) {
      reference::gdn_decode_gated_reference(x, view(g, {kB, kHV}), view(beta, {kB, kHV}), s, idx, o,
                                            options);
    } else {
      reference::gdn_decode_reference(x, view(a, {kB, kHV}), view(b, {kB, kHV}), view(a_log, {kHV}),
                                      view(dt_bias, {kHV}), s, idx, o, options);
    }
  }
};

TEST_CASE("gdn reference: invalid rows write zeros and leave the pool untouched") {
  for (GdnInvalidIndex rule : {GdnInvalidIndex::negative, GdnInvalidIndex::nonpositive}) {
    HostProblem p;
    const std::vector<float> before = p.state;
    GdnDecodeOptions options;
    options.invalid_index = rule;
    p.run(options, false);
    const std::int64_t row = HostProblem::kHV * HostProblem::kV;
    const std::int64_t slot = HostProblem::kHV * HostProblem::kV * HostProblem::kK;
    // Row 1 (index -1) is invalid under both rules; row 2 (index 0) only under nonpositive.
    for (std::int64_t i = 0; i < row; ++i) CHECK(p.out[row + i] == 0.0f);
    for (std::int64_t i = 0; i < row; ++i) {
      if (rule == GdnInvalidIndex::nonpositive) {
        CHECK(p.out[2 * row + i] == 0.0f);
      } else {
        CHECK(p.out[2 * row + i] != 0.0f);
      }
    }
    for (std::int64_t s = 0; s < HostProblem::kSlots; ++s) {
      const bool written = s == 2 || (s == 0 && rule == GdnInvalidIndex::negative);
      const bool same = std::memcmp(&p.state[s * slot], &before[s * slot], slot * 4) == 0;
      CHECK(same != written);
    }
  }
}

TEST_CASE("gdn reference: the gated form equals the raw form with g, beta from a, b") {
  HostProblem raw, gated;
  raw.run({}, false);
  gated.run({}, true);
  // g and beta pass through f32 in the gated form: equal to f32 rounding.
  for (std::size_t i = 0; i < raw.out.size(); ++i) {
    CHECK(gated.out[i] == doctest::Approx(raw.out[i]).epsilon(1e-6));
  }
  for (std::size_t i = 0; i < raw.state.size(); ++i) {
    CHECK(gated.state[i] == doctest::Approx(raw.state[i]).epsilon(1e-6));
  }
}

TEST_CASE("gdn reference: decode row matches gdn_step on the same numbers") {
  HostProblem p;
  const std::vector<float> before = p.state;
  GdnDecodeOptions options;
  options.scale = 0.75f;
  options.l2norm_qk = false;
  p.run(options, false);
  // Row 0 uses slot 2; head hv = 1 reads q, k of head 0 and v of head 1.
  const std::int64_t width = 2 * HostProblem::kK + HostProblem::kHV * HostProblem::kV;
  std::vector<double> h(4), o(2), q(2), k(2), v(2);
  for (int i = 0; i < 4; ++i) h[i] = before[(2 * HostProblem::kHV + 1) * 4 + i];
  for (int i = 0; i < 2; ++i) {
    q[i] = p.qkv[i];
    k[i] = p.qkv[2 + i];
    v[i] = p.qkv[4 + 2 + i];
  }
  (void)width;
  const double g = reference::gdn_log_decay(p.a[1], p.a_log[1], p.dt_bias[1], 20.0);
  reference::gdn_step(h, q, k, v, g, reference::gdn_sigmoid(p.b[1]), 0.75, false, o);
  CHECK(p.out[2] == doctest::Approx(o[0]).epsilon(1e-6));
  CHECK(p.out[3] == doctest::Approx(o[1]).epsilon(1e-6));
  CHECK(p.state[(2 * HostProblem::kHV + 1) * 4 + 3] == doctest::Approx(h[3]).epsilon(1e-6));
}

TEST_CASE("gdn reference: 16-bit pools round the stored state") {
  // One bf16 slot: the stored state is the f32 result rounded to bf16.
  std::vector<std::uint16_t> state(2 * 2 * 2);
  for (std::size_t i = 0; i < state.size(); ++i) {
    state[i] = support::float_to_bf16(0.3f * float(i) - 0.5f);
  }
  std::vector<float> qkv = {1.0f, 0.5f, -0.5f, 2.0f, 0.25f, -1.0f};
  std::vector<float> g = {-0.1f}, beta = {0.6f}, out(2);
  std::vector<std::int64_t> idx = {1};
  const TensorView s = TensorView::contiguous(state.data(), DType::bf16, {2, 1, 2, 2});
  GdnDecodeOptions options;
  reference::gdn_decode_gated_reference(TensorView::contiguous(qkv.data(), DType::f32, {1, 6}),
                                        TensorView::contiguous(g.data(), DType::f32, {1, 1}),
                                        TensorView::contiguous(beta.data(), DType::f32, {1, 1}), s,
                                        TensorView::contiguous(idx.data(), DType::i64, {1}),
                                        TensorView::contiguous(out.data(), DType::f32, {1, 1, 2}),
                                        options);
  for (std::size_t i = 0; i < 4; ++i) {
    // Slot 0 untouched, slot 1 exactly representable in bf16 (trivially: it is bf16 bits).
    CHECK(state[i] == support::float_to_bf16(0.3f * float(i) - 0.5f));
  }
  CHECK(std::isfinite(out[0]));
  CHECK(std::isfinite(out[1]));
}

}  // namespace
}  // namespace kjit
