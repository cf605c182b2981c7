// SPDX-License-Identifier: Apache-2.0
// gdn_decode: the planner. Grid mode, V tile, staging, residency and row order for a Problem on
// a device; pure (no device, no runtime).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/gdn_decode/family.hpp"

namespace kjit::ops::decode {
namespace {

constexpr int kMaxWarps = 8;
/// Below this many blocks per SM the planner prefers smaller V tiles (more blocks).
constexpr std::int64_t kMinBlocksPerSm = 2;
/// Below this many warps per SM the planner gives each thread fewer rows (more warps), so a
/// small batch still spreads its loads over every SM.
constexpr std::int64_t kMinWarpsPerSm = 16;
/// State read per step from which the planner stages the tiles in shared memory (measured
/// crossover on an H200, see choose_tile).
constexpr std::int64_t kStagedMinBytes = std::int64_t{1} << 29;
/// State floats a thread keeps in registers at most (x1.5 with the raw words in flight).
constexpr int kStateFloatsPerThread = 32;
/// Persistent and bulk modes: stages of the bulk ring at most (template limit), the ring size
/// the planner aims for, resident threads per SM by default (512: two 8-warp blocks, about 120
/// registers each), resident blocks per SM at most, the static shared memory per stage
/// (barrier and slot), and the least register cap accepted. Neither mode is the planner's
/// choice: on an H200 both moved 0.83-0.90 of a copy where the one-warp flat grid moved
/// 0.92-0.99 (forced only, for tuning and tests).
constexpr int kMaxStages = 8;
constexpr std::int64_t kBulkRingBytes = 64 * 1024;
constexpr std::int64_t kResidentThreadsPerSm = 512;
constexpr int kMaxResidentBlocks = 32;
constexpr std::int64_t kStaticSmemPerStage = 16;
constexpr std::int64_t kMinRegisterCap = 32;

/// Rows in slot order (GdnRowOrder): taken by the planner from this much state per step, where
/// ascending slots beat a random order by more than the ranking pass costs (measured:
/// docs/performance.md, "Rows in slot order"), up to kOrderMaxBatch rows (the ranking is
/// quadratic in B), for slots below 2^39 (a key packs the slot above kGdnOrderRowBits bits of
/// row number).
constexpr std::int64_t kOrderMinStateBytes = std::int64_t{512} << 20;
constexpr std::int64_t kOrderMaxBatch = 16384;
constexpr std::int64_t kOrderMaxSlots = std::int64_t{1} << (63 - kGdnOrderRowBits);

constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

/// How a V tile of `bv` rows maps onto threads.
struct Tile {
  int bv = 0;
  int warps = 0;
  int rows_per_thread = 0;
  /// State loads staged in shared memory (load hint "staged").
  bool staged = false;
};

/// Whether the state loads may, must or must not go through shared memory.
enum class Staging { off, automatic, forced };

/// Lanes that share one state row and rows one warp covers, as the template derives them.
struct RowLayout {
  int lanes_per_row = 32;
  int rows_per_warp = 1;
  /// State elements one lane holds per row.
  int elems_per_lane = 1;
};

RowLayout row_layout(const Problem& p) {
  const int vec = p.vec_bytes / static_cast<int>(size_of(p.state));
  const int chunks = static_cast<int>(p.k) / vec;
  RowLayout layout;
  layout.lanes_per_row = 1;
  while (layout.lanes_per_row < std::min(chunks, 32)) layout.lanes_per_row *= 2;
  layout.rows_per_warp = 32 / layout.lanes_per_row;
  layout.elems_per_lane = (chunks + layout.lanes_per_row - 1) / layout.lanes_per_row * vec;
  return layout;
}

/// Threads for a tile of `bv` rows with at most `max_rpt` rows per thread; nullopt when `bv`
/// does not fit (V not whole tiles, rows not whole warps, or more than kMaxWarps warps).
std::optional<Tile> shape_tile(const Problem& p, const RowLayout& layout, int bv, int max_rpt) {
  if (bv < 1 || p.v % bv != 0 || bv % layout.rows_per_warp != 0) return std::nullopt;
  const int rows = bv / layout.rows_per_warp;
  for (int rpt = std::min(max_rpt, rows); rpt >= 1; --rpt) {
    if (rows % rpt == 0 && rows / rpt <= kMaxWarps) return Tile{bv, rows / rpt, rpt};
  }
  return std::nullopt;
}

/// Staged state loads (load hint "staged") go through shared memory, which holds no registers
/// while they are in flight, so a large grid then takes twice the rows per thread. Automatic
/// staging is taken for large grids only (where it was measured to help).
Tile choose_tile(const Problem& p, const DeviceLimits& device, int force_bv, Staging staging,
                 std::vector<std::string>& reasons) {
  const RowLayout layout = row_layout(p);
  int rpt_cap = 1;
  while (rpt_cap * 2 * layout.elems_per_lane <= kStateFloatsPerThread) rpt_cap *= 2;
  const std::int64_t pairs = p.batch * p.value_heads;
  const std::int64_t sms = std::max(device.sm_count, 1);
  const std::int64_t warps_at_cap = pairs * p.v / (layout.rows_per_warp * rpt_cap);
  // Half the register cap measured best on an H200 for large grids (more resident warps mix
  // load and store phases: 0.90-0.92 of a copy against 0.89-0.91 at the cap); a quarter for
  // small grids, which need many warps more than many rows per thread.
  // Staged through shared memory, 8 rows per warp pay off once a step reads >= 512 MiB of
  // state (bench_gdn_decode on the H200, same run, ratio to a copy, staged vs 4 rows in
  // registers: HV = 64, B = 256 / 1024 / 2048: 0.960 / 0.947 / 0.944 vs 0.946 / 0.932 / 0.929;
  // HV = 32, B = 1024 / 2048: 0.948 / 0.936 vs 0.922 / 0.918. At 512 MiB (HV = 32, B = 256) the
  // serving protocol decides it: 273.3 vs 283.5 us with the batch at random slots of a pool
  // twice its size, 271.2 vs 278.5 as a permutation of the pool (docs/performance.md, "Staged
  // loads from 512 MiB"); at 64 MiB (B = 32) the two are level, and small grids keep registers.
  const bool large = warps_at_cap >= kMinWarpsPerSm * sms;
  const std::int64_t state_bytes = pairs * p.v * p.k * static_cast<std::int64_t>(size_of(p.state));
  const bool staged = staging == Staging::forced ||
                      (staging == Staging::automatic && large && state_bytes >= kStagedMinBytes);
  int rpt = large ? std::max(1, staged ? rpt_cap : rpt_cap / 2) : std::max(1, rpt_cap / 4);
  reasons.push_back(fmt::format(
      "row layout: {} lanes per state row ({} B vectors, {} elements per lane), {} rows per "
      "warp; up to {} rows per thread ({} with {} warps at {} rows per thread vs {} SMs)",
      layout.lanes_per_row, p.vec_bytes, layout.elems_per_lane, layout.rows_per_warp, rpt,
      large ? (staged ? "large grid, state staged in shared memory" : "large grid")
            : "small grid: spread over more warps",
      warps_at_cap, rpt_cap, sms));

  if (force_bv != 0) {
    const auto tile = shape_tile(p, layout, force_bv, rpt_cap);
    if (!tile) {
      throw InvalidArgument(fmt::format(
          "{}: options.force_bv = {} is not accepted; it must divide V = {}, be a multiple of "
          "{} (rows per warp) and need at most {} warps of <= {} rows per thread",
          op_name(p.form), force_bv, p.v, layout.rows_per_warp, kMaxWarps, rpt_cap));
    }
    reasons.push_back(fmt::format("BV = {} forced by options.force_bv", force_bv));
    Tile forced = *tile;
    forced.staged = staged;
    return forced;
  }
  // One warp per block. Measured on an H200 (cold L2, f32 state, K = V = 128, HV 32 and 64,
  // B 32..2048): one-warp blocks of 4 rows per thread moved 0.916-0.986 of a same-size copy
  // where eight-warp blocks of the same rows per thread moved 0.903-0.972. An SM frees and
  // refills a block's slot when its one warp is done instead of waiting for the slowest of
  // eight, so its loads stay in flight between tiles. Rows per thread are halved until the
  // grid has enough blocks.
  for (int rows = rpt; rows >= 1; rows /= 2) {
    const int bv = layout.rows_per_warp * rows;
    if (p.v % bv != 0) continue;
    const std::int64_t blocks = pairs * (p.v / bv);
    if (blocks >= kMinBlocksPerSm * sms || rows == 1) {
      reasons.push_back(fmt::format(
          "BV = {}: one warp per block, {} rows per thread ({} blocks{})", bv, rows, blocks,
          blocks >= kMinBlocksPerSm * sms
              ? fmt::format(", >= {} per SM", kMinBlocksPerSm)
              : fmt::format(": the most this problem has, < {} per SM", kMinBlocksPerSm)));
      return Tile{bv, 1, rows, staged};
    }
  }
  throw PlanError(fmt::format("{}: no V tile fits V = {} with {} rows per warp", op_name(p.form),
                              p.v, layout.rows_per_warp));
}

/// The tile of a K-major pool (state_layout kv, KMajorTileDecoder): bv columns of V, each of
/// the K lines of a tile one run of bv contiguous elements. Lines of 128 bytes where the vector
/// width allows (whole cache lines per warp access, 8 lanes of 16 bytes each); warps split K
/// until a thread holds at most kStateFloatsPerThread elements (then reduced over the warps
/// through shared memory). `rows_per_thread` of the Tile holds the lines per thread.
Tile choose_k_major_tile(const Problem& p, int force_bv, std::vector<std::string>& reasons) {
  const int esize = static_cast<int>(size_of(p.state));
  const int vec = p.vec_bytes / esize;
  const auto shape = [&](int bv) -> std::optional<Tile> {
    if (bv < vec || bv % vec != 0 || p.v % bv != 0) return std::nullopt;
    const int lanes = bv / vec;
    if (lanes > 32 || (lanes & (lanes - 1)) != 0) return std::nullopt;
    const int lines_per_warp = 32 / lanes;
    const int max_lines = std::max(1, kStateFloatsPerThread / vec);
    std::optional<Tile> fallback;
    for (int warps = 1; warps <= kMaxWarps; ++warps) {
      if (p.k % (lines_per_warp * warps) != 0) continue;
      const int lines = static_cast<int>(p.k) / (lines_per_warp * warps);
      if (lines <= max_lines) return Tile{bv, warps, lines};
      fallback = Tile{bv, warps, lines};
    }
    return fallback;
  };
  if (force_bv != 0) {
    const auto tile = shape(force_bv);
    if (!tile) {
      throw InvalidArgument(fmt::format(
          "{}: options.force_bv = {} is not accepted for a K-major state (V contiguous); it must "
          "divide V = {} and be a power of two <= 32 of {}-element vectors, with K = {} whole "
          "lines for up to {} warps",
          op_name(p.form), force_bv, p.v, vec, p.k, kMaxWarps));
    }
    reasons.push_back(fmt::format("BV = {} forced by options.force_bv", force_bv));
    return *tile;
  }
  const int widest = std::min(128 / esize, 32 * vec);
  for (int bv = widest; bv >= vec; bv /= 2) {
    if (const auto tile = shape(bv)) {
      reasons.push_back(fmt::format(
          "BV = {} columns of V: lines of {} B ({} lanes of {} B vectors), {} lines per warp "
          "access; {} warps split K = {}, {} lines ({} state elements) per thread",
          bv, bv * esize, bv / vec, p.vec_bytes, 32 / (bv / vec), tile->warps, p.k,
          tile->rows_per_thread, tile->rows_per_thread * vec));
      return *tile;
    }
  }
  throw PlanError(fmt::format("{}: no V tile fits V = {} with {}-element vectors (K-major state)",
                              op_name(p.form), p.v, vec));
}

/// Cache hints of the state pool's loads and stores, as the family's choice names.
struct CacheHints {
  std::string load = "stream";
  std::string store = "stream";
};

/// What the planner reads of the options, rebuilt from the Problem's values: check() parsed
/// the strings; here they are spelled again for messages, reasons and the spec.
struct Forced {
  std::string force_mode;
  std::string force_cache_hints;
  int force_bv = 0;
  int force_stages = 0;
  int force_blocks_per_sm = 0;
  GdnRowOrder row_order = GdnRowOrder::automatic;
  bool l2norm_qk = true;
  GdnInvalidIndex invalid_index = GdnInvalidIndex::negative;
};

Forced forced_of(const Problem& p) {
  Forced f;
  f.force_mode = kModeNames[static_cast<int>(p.forced_mode)];
  if (p.hints_forced) {
    f.force_cache_hints = std::string(kLoadHintNames[static_cast<int>(p.load_hint)]) + "/" +
                          kStoreHintNames[static_cast<int>(p.store_hint)];
  }
  f.force_bv = p.force_bv;
  f.force_stages = p.force_stages;
  f.force_blocks_per_sm = p.force_blocks_per_sm;
  f.row_order = p.row_order;
  f.l2norm_qk = p.l2norm;
  f.invalid_index = p.invalid_index;
  return f;
}

/// The planner's hints, or the forced ones.
CacheHints cache_hints(const Problem& p) {
  CacheHints hints;
  if (!p.hints_forced) return hints;
  hints.load = kLoadHintNames[static_cast<int>(p.load_hint)];
  hints.store = kStoreHintNames[static_cast<int>(p.store_hint)];
  return hints;
}

/// Shared-memory ring and residency of the persistent and bulk modes.
struct Resident {
  int stages = 0;
  int blocks_per_sm = 0;
  std::uint32_t smem = 0;
};

Resident plan_resident(const Problem& p, const Tile& tile, const std::string& mode,
                       const Forced& options, const DeviceLimits& device,
                       std::vector<std::string>& reasons, std::vector<LimitCheck>& checks) {
  const std::string op(op_name(p.form));
  Resident r;
  const std::int64_t threads = std::int64_t{tile.warps} * 32;
  const std::int64_t tile_bytes = tile.bv * p.k * static_cast<std::int64_t>(size_of(p.state));
  if (mode == "bulk") {
    // The bulk copy engine is sm_90's; its addresses must be 16-byte aligned, which a pool
    // with 16-byte vectors guarantees for every tile (tiles are whole rows of K >= 16).
    if (device.arch.sm() < 90) {
      throw PlanError(
          fmt::format("{} (bulk mode): needs sm_90 or newer (bulk copies); the device "
                      "is {}",
                      op, device.arch.str()));
    }
    if (p.vec_bytes != 16 || tile_bytes % 16 != 0) {
      throw PlanError(fmt::format(
          "{} (bulk mode): needs a 16-byte aligned pool base and slot stride (the widest vector "
          "they allow is {} B)",
          op, p.vec_bytes));
    }
    if (options.force_stages != 0) {
      if (options.force_stages < 1 || options.force_stages > kMaxStages) {
        throw InvalidArgument(
            fmt::format("{}: options.force_stages = {} is out of range; "
                        "accepted: 1..{}",
                        op, options.force_stages, kMaxStages));
      }
      r.stages = options.force_stages;
    } else {
      r.stages =
          static_cast<int>(std::clamp<std::int64_t>(kBulkRingBytes / tile_bytes, 2, kMaxStages));
    }
    r.smem = static_cast<std::uint32_t>(r.stages * tile_bytes);
    reasons.push_back(
        fmt::format("bulk ring: {} stages of {} B state tiles ({} B of shared memory per block)",
                    r.stages, tile_bytes, r.smem));
  } else if (tile.staged) {
    r.smem = static_cast<std::uint32_t>(tile_bytes);
    reasons.push_back(fmt::format(
        "staged tile: {} B of shared memory per block (cp.async; no registers held while the "
        "tile is in flight)",
        r.smem));
  }
  // Blocks that fit by threads and shared memory alone; registers are then capped by
  // __launch_bounds__(threads, blocks per SM) so that they fit too.
  LaunchShape probe;
  probe.block = Dim3{static_cast<std::uint32_t>(threads), 1, 1};
  probe.dynamic_smem = r.smem;
  FunctionLimits static_only;
  static_only.static_smem = kStaticSmemPerStage * r.stages;
  const int fit = occupancy_blocks_per_sm(probe, device, static_only);
  if (options.force_blocks_per_sm != 0) {
    if (options.force_blocks_per_sm < 1 || options.force_blocks_per_sm > kMaxResidentBlocks) {
      throw InvalidArgument(
          fmt::format("{}: options.force_blocks_per_sm = {} is out of range; "
                      "accepted: 1..{}",
                      op, options.force_blocks_per_sm, kMaxResidentBlocks));
    }
    r.blocks_per_sm = options.force_blocks_per_sm;
  } else if (tile.staged) {
    // A staged warp holds no state in registers while it waits, so what limits the warps per
    // SM is registers: capped so that an SM fills with as many blocks as its threads and
    // shared memory take (64 per thread for one-warp blocks of 4 KiB; f32 state, 8 rows: 66
    // uncapped, which left 28 warps instead of 32). Larger forced tiles fit fewer blocks and
    // keep more registers.
    r.blocks_per_sm = std::max(1, fit);
  } else {
    const auto wanted = static_cast<int>(kResidentThreadsPerSm / threads);
    r.blocks_per_sm = std::max(1, std::min(wanted, fit));
  }
  const std::int64_t reg_cap =
      device.regs_per_sm / (ceil_div(threads, std::int64_t{32}) * 32 * r.blocks_per_sm);
  reasons.push_back(fmt::format(
      "{} blocks of {} threads resident per SM ({} fit by threads and shared memory; registers "
      "capped at {} per thread)",
      r.blocks_per_sm, threads, fit, std::min<std::int64_t>(reg_cap, device.max_regs_per_thread)));
  // A persistent grid larger than what is resident would leave its last blocks to run after
  // the others finished all their tiles: twice the time. Hence these are limits, not hints.
  checks.push_back(
      {"resident blocks per SM the launch assumes (threads, shared memory)", r.blocks_per_sm, fit});
  checks.push_back({"registers per thread under the residency register cap (at least 32)",
                    kMinRegisterCap, reg_cap});
  return r;
}

/// Whether the step visits its rows in slot order (a ranking kernel first), with the reason.
bool choose_row_order(const Problem& p, const Forced& options, const std::string& mode,
                      std::vector<std::string>& reasons) {
  const bool one_tile_mode = mode == "flat" || mode == "split" || mode == "folded";
  const bool fits = p.batch <= kOrderMaxBatch && p.slots < kOrderMaxSlots;
  if (options.row_order == GdnRowOrder::by_slot) {
    if (!one_tile_mode || !fits) {
      throw PlanError(fmt::format(
          "{}: options.row_order = by_slot needs the flat, split or folded mode (mode is {}), B "
          "<= {} (B = {}) and fewer than 2^{} slots (slots = {})",
          op_name(p.form), mode, kOrderMaxBatch, p.batch, 63 - kGdnOrderRowBits, p.slots));
    }
    reasons.push_back(
        "rows in slot order (forced by options.row_order): a ranking kernel, then the step");
    return true;
  }
  if (options.row_order == GdnRowOrder::as_given) {
    reasons.push_back("rows in the given order (options.row_order = as_given)");
    return false;
  }
  const std::int64_t state_bytes =
      p.batch * p.value_heads * p.v * p.k * static_cast<std::int64_t>(size_of(p.state));
  const bool ordered = one_tile_mode && fits && p.batch >= 2 && state_bytes >= kOrderMinStateBytes;
  reasons.push_back(
      ordered ? fmt::format("rows in slot order: {} MiB of state (>= {} MiB) in address order; a "
                            "ranking kernel of {} blocks first, {} bytes of scratch",
                            state_bytes >> 20, kOrderMinStateBytes >> 20,
                            ceil_div(p.batch, kGdnOrderRowsPerBlock), p.batch * 8)
      : !one_tile_mode ? fmt::format("rows in the given order ({} mode)", mode)
      : !fits ? fmt::format("rows in the given order: B = {} > {} or {} slots (ranking bounds)",
                            p.batch, kOrderMaxBatch, p.slots)
              : fmt::format("rows in the given order: {} MiB of state < {} MiB, where ranking "
                            "them costs more than address order gains",
                            state_bytes >> 20, kOrderMinStateBytes >> 20));
  return ordered;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> step_spec_params(const Problem& p) {
  const auto dtype = [](DType d) { return std::string(to_string(d)); };
  const bool gated = p.form == Form::gated;
  return {
      {"qkv", dtype(p.qkv)},
      {"gate", dtype(gated ? DType::f32 : p.gate)},
      {"a_log", dtype(gated ? DType::f32 : p.a_log)},
      {"dt_bias", dtype(gated ? DType::f32 : p.dt_bias)},
      {"state", dtype(p.state)},
      {"out", dtype(p.out)},
      {"index", dtype(p.index)},
      {"k", std::to_string(p.k)},
      {"v", std::to_string(p.v)},
      {"gated", gated ? "1" : "0"},
      {"l2norm", p.l2norm ? "1" : "0"},
      {"invalid", p.invalid_index == GdnInvalidIndex::nonpositive ? "nonpositive" : "negative"}};
}

namespace {

Planned<Choice> make_plan(const Problem& p, const DeviceLimits& device) {
  const Forced options = forced_of(p);
  Planned<Choice> planned;
  Plan& plan = planned.plan;
  plan.op = std::string(op_name(p.form));
  plan.device = device;
  CacheHints hints = cache_hints(p);
  const bool k_major = p.state_layout == StateLayout::kv;
  // Staged loads: one tile per block (not the persistent and bulk modes, which keep tiles in
  // flight their own way), 16-byte vectors (cp.async copies 16 bytes), cp.async (sm_80 on).
  const bool resident_forced = options.force_mode == "persistent" || options.force_mode == "bulk";
  if (k_major) {
    plan.reasons.push_back(
        "state layout kv: the pool's [HV, V, K] block has V contiguous (strides [*, V*K, 1, V]: "
        "a transposed [slots, HV, K, V] pool); lanes walk V, flat, split or folded grid, loads "
        "into registers");
    if (resident_forced || hints.load == "staged") {
      throw PlanError(fmt::format(
          "{}: a K-major state (V contiguous) runs in the flat, split or folded mode with "
          "register loads; options.force_mode = '{}' and options.force_cache_hints = '{}' ask "
          "for {}",
          plan.op, options.force_mode, options.force_cache_hints,
          resident_forced ? "a resident mode" : "staged loads"));
    }
  }
  const bool can_stage =
      p.vec_bytes == 16 && device.arch.sm() >= 80 && !resident_forced && !k_major;
  if (hints.load == "staged" && !can_stage) {
    throw PlanError(fmt::format(
        "{}: staged state loads (options.force_cache_hints = '{}') need 16-byte state vectors "
        "(have {} B), sm_80 or newer (have {}) and a one-tile-per-block mode (have '{}')",
        plan.op, options.force_cache_hints, p.vec_bytes, device.arch.str(),
        options.force_mode.empty() ? "planner's" : options.force_mode));
  }
  const Staging staging = hints.load == "staged"                           ? Staging::forced
                          : options.force_cache_hints.empty() && can_stage ? Staging::automatic
                                                                           : Staging::off;
  const Tile tile = k_major ? choose_k_major_tile(p, options.force_bv, plan.reasons)
                            : choose_tile(p, device, options.force_bv, staging, plan.reasons);
  if (tile.staged) hints.load = "staged";
  const std::int64_t nv = p.v / tile.bv;
  const std::int64_t pairs = p.batch * p.value_heads;
  const std::int64_t total = pairs * nv;
  const auto& grid_max = device.max_grid_dim;

  const bool flat_ok = nv <= grid_max[0] && pairs <= grid_max[1];
  const bool split_ok = nv <= grid_max[0] && p.value_heads <= grid_max[1] && p.batch <= grid_max[2];
  const std::string flat_why =
      flat_ok ? fmt::format("flat grid (NV, B*HV) = ({}, {}) fits (max grid y {})", nv, pairs,
                            grid_max[1])
              : fmt::format("flat ruled out: B*HV = {} > max grid y {} (or NV = {} > max grid x)",
                            pairs, grid_max[1], nv);
  const std::string split_why =
      split_ok
          ? fmt::format("split grid (NV, HV, B) = ({}, {}, {}) fits", nv, p.value_heads, p.batch)
          : fmt::format("split ruled out: HV = {} vs max grid y {}, B = {} vs max grid z {}",
                        p.value_heads, grid_max[1], p.batch, grid_max[2]);

  std::string mode = options.force_mode;
  if (mode.empty()) {
    if (flat_ok) {
      mode = "flat";
      plan.reasons.push_back(flat_why);
    } else if (split_ok) {
      mode = "split";
      plan.reasons.push_back(flat_why);
      plan.reasons.push_back(split_why);
    } else {
      mode = "folded";
      plan.reasons.push_back(flat_why);
      plan.reasons.push_back(split_why);
    }
  } else {
    // check() accepted only grid modes.
    plan.reasons.push_back(fmt::format("mode {} forced by options.force_mode", mode));
  }
  const bool ordered = choose_row_order(p, options, mode, plan.reasons);
  if (options.force_stages != 0 && mode != "bulk") {
    throw InvalidArgument(
        fmt::format("{}: options.force_stages = {} applies to the bulk mode only (mode is {})",
                    plan.op, options.force_stages, mode));
  }
  plan.reasons.push_back(fmt::format(
      "state cache hints: loads {}, stores {}{}", hints.load, hints.store,
      !options.force_cache_hints.empty() ? " (forced by options.force_cache_hints)"
      : tile.staged ? " (staged: cp.async into shared memory, one tile per block; large grid)"
                    : ""));

  LaunchShape shape;
  shape.block = Dim3{static_cast<std::uint32_t>(tile.warps * 32), 1, 1};
  // Sizes beyond 32 bits are clamped, not wrapped, so that check_launch reports them.
  auto dim = [](std::int64_t x) {
    return static_cast<std::uint32_t>(std::min<std::int64_t>(x, 0xFFFFFFFFll));
  };
  Resident resident;
  std::vector<LimitCheck> resident_checks;
  const bool resident_mode = mode == "persistent" || mode == "bulk";
  if (!resident_mode && (options.force_blocks_per_sm != 0 || tile.staged)) {
    // One tile per block: the residency is only a register cap (more warps per SM), and a
    // staged tile's shared memory.
    resident = plan_resident(p, tile, mode, options, device, plan.reasons, resident_checks);
    shape.dynamic_smem = resident.smem;
  }
  if (mode == "flat") {
    shape.grid = Dim3{dim(nv), dim(pairs), 1};
  } else if (mode == "split") {
    shape.grid = Dim3{dim(nv), dim(p.value_heads), dim(p.batch)};
  } else if (mode == "folded") {
    const std::int64_t x = std::min<std::int64_t>(total, grid_max[0]);
    shape.grid = Dim3{dim(x), 1, 1};
    plan.reasons.push_back(
        x == total
            ? fmt::format("folded grid: all {} tiles on x", total)
            : fmt::format("folded grid: {} tiles on x = {} blocks (max grid x), grid-stride loop",
                          total, x));
  } else {
    resident = plan_resident(p, tile, mode, options, device, plan.reasons, resident_checks);
    shape.dynamic_smem = resident.smem;
    const std::int64_t x = std::min<std::int64_t>(
        {total, std::int64_t{device.sm_count} * resident.blocks_per_sm, grid_max[0]});
    shape.grid = Dim3{dim(x), 1, 1};
    plan.reasons.push_back(
        fmt::format("{} grid: {} blocks ({} SMs x {} resident) walk {} tiles with a grid stride",
                    mode, x, device.sm_count, resident.blocks_per_sm, total));
  }
  plan.mode = mode;

  std::vector<std::pair<std::string, std::string>> spec_params = step_spec_params(p);
  spec_params.insert(
      spec_params.end(),
      {{"bv", std::to_string(tile.bv)},
       {"warps", std::to_string(tile.warps)},
       {"vec_bytes", std::to_string(p.vec_bytes)},
       {"mode", mode},
       {"stages", std::to_string(resident.stages)},
       {"min_blocks", std::to_string(resident.blocks_per_sm)},
       {"load_hint", hints.load},
       {"store_hint", hints.store},
       {"ordered", ordered ? "1" : "0"},
       // Left out of the spec when vk (the family's omitted default): V-major specs, and so
       // their cache keys, are what they were before K-major pools were accepted.
       {"state_layout", kStateLayoutNames[static_cast<int>(p.state_layout)]}});
  KernelSpec spec = KernelSpec::make("gdn_decode", std::move(spec_params), device.arch);
  plan.reasons.push_back(fmt::format(
      "state vectors of {} B: the widest the pool base and slot stride allow", p.vec_bytes));
  if (ordered) {
    KernelSpec order_spec = KernelSpec::make(
        "gdn_decode_order",
        {{"index", std::string(to_string(p.index))},
         {"invalid",
          options.invalid_index == GdnInvalidIndex::nonpositive ? "nonpositive" : "negative"}},
        device.arch);
    LaunchShape order_shape;
    order_shape.grid = Dim3{dim(ceil_div(p.batch, kGdnOrderRowsPerBlock)), 1, 1};
    order_shape.block = Dim3{static_cast<std::uint32_t>(kGdnOrderThreads), 1, 1};
    PlannedLaunch order{std::move(order_spec), order_shape, check_launch(order_shape, device)};
    require_legal(order.checks, fmt::format("{} (ranking kernel)", plan.op));
    plan.launches.push_back(std::move(order));
    // The step's blocks may start while the ranking kernel runs; they wait for it first.
    shape.overlaps_previous = supports_programmatic_launch(device.arch);
  }
  PlannedLaunch launch{std::move(spec), shape, check_launch(shape, device)};
  launch.checks.insert(launch.checks.end(), resident_checks.begin(), resident_checks.end());
  require_legal(launch.checks, fmt::format("{} ({} mode)", plan.op, mode));
  plan.launches.push_back(std::move(launch));
  planned.choice = Choice{tile.bv, ordered};
  return planned;
}

}  // namespace

Planned<Choice> Family::plan(const Problem& problem, const DeviceLimits& device) {
  return make_plan(problem, device);
}

}  // namespace kjit::ops::decode
