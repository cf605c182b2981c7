// SPDX-License-Identifier: Apache-2.0
// merge_state: the planner. Vector width, vectors per thread and grid mode for a Problem on a
// device; pure (no device, no runtime).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/merge_state/family.hpp"

namespace kjit::ops::merge {
namespace {

/// Threads of one block; matches kMergeMaxBlockThreads of the template (its launch bounds).
constexpr std::int64_t kMaxBlockThreads = 512;
/// Target threads of a flat block.
constexpr std::int64_t kFlatBlockThreads = 256;
/// Bytes of each input row one thread moves at most (2 x 16-byte vectors per input).
constexpr std::int64_t kMaxBytesPerThread = 32;
/// Smallest token_major block worth keeping: below it blocks are too small to fill an SM
/// within the 32-blocks-per-SM limit, and the flat mode packs rows densely instead.
constexpr std::int64_t kMinTokenMajorThreads = 128;

const char* op_choice(Entry op) {
  switch (op) {
    case Entry::pair:
      return "pair";
    case Entry::in_place:
      return "in_place";
    case Entry::many:
      return "many";
  }
  return "pair";
}

/// The widest vector (elements) every access allows: 16 bytes of input at most, and each
/// tensor aligned to min(16, vector bytes).
std::int64_t choose_vec(const Problem& problem) {
  const std::int64_t in_size = static_cast<std::int64_t>(size_of(problem.in));
  const std::int64_t out_size = static_cast<std::int64_t>(size_of(problem.out));
  for (std::int64_t vec = 16 / in_size; vec >= 1; vec /= 2) {
    if (problem.head_dim % vec != 0) continue;
    if (problem.in_align < std::min<std::int64_t>(16, vec * in_size)) continue;
    if (problem.out_align < std::min<std::int64_t>(16, vec * out_size)) continue;
    return vec;
  }
  return 1;
}

struct Geometry {
  std::int64_t vec = 1;
  std::int64_t chunks = 1;
  std::int64_t lanes = 1;
};

struct ModeChoice {
  bool legal = false;
  LaunchShape shape;
  std::string why_not;
  std::string summary;
};

/// Threads per block a ":t<n>" suffix of force_mode asks for, or `planner_default`.
std::int64_t block_threads(const Problem& problem, std::int64_t planner_default) {
  return problem.forced_block_log2 == 0 ? planner_default
                                        : std::int64_t{1} << problem.forced_block_log2;
}

ModeChoice token_major_shape(const Problem& problem, const Geometry& g,
                             const DeviceLimits& limits) {
  ModeChoice c;
  const std::int64_t cap =
      std::max<std::int64_t>(1, block_threads(problem, kMaxBlockThreads) / g.lanes);
  const std::int64_t groups = (problem.heads + cap - 1) / cap;
  const std::int64_t per_group = (problem.heads + groups - 1) / groups;
  const std::int64_t idle = groups * per_group - problem.heads;
  c.shape.block =
      Dim3{static_cast<std::uint32_t>(g.lanes), static_cast<std::uint32_t>(per_group), 1};
  c.shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(problem.tokens, 0xFFFFFFFFll)),
           static_cast<std::uint32_t>(std::min<std::int64_t>(groups, 0xFFFFFFFFll)), 1};
  c.summary = fmt::format(
      "grid ({}, {}) x block ({}, {}): {} head group(s) of {} heads, {} idle "
      "row(s) per token",
      problem.tokens, groups, g.lanes, per_group, groups, per_group, idle);
  if (problem.tokens > limits.max_grid_dim[0]) {
    c.why_not =
        fmt::format("T = {} exceeds grid x limit {}", problem.tokens, limits.max_grid_dim[0]);
  } else if (groups > limits.max_grid_dim[1]) {
    c.why_not =
        fmt::format("{} head groups exceed grid y limit {}", groups, limits.max_grid_dim[1]);
  } else {
    const auto checks = check_launch(c.shape, limits);
    for (const LimitCheck& check : checks) {
      if (!check.ok() && c.why_not.empty()) {
        c.why_not = fmt::format("{} is {}, needs {}", check.limit, check.allowed, check.requested);
      }
    }
  }
  c.legal = c.why_not.empty();
  return c;
}

ModeChoice flat_shape(const Problem& problem, const Geometry& g, const DeviceLimits& limits) {
  ModeChoice c;
  const std::int64_t rows_per_block =
      std::max<std::int64_t>(1, block_threads(problem, kFlatBlockThreads) / g.lanes);
  const std::int64_t rows = problem.tokens * problem.heads;
  const std::int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  c.shape.block =
      Dim3{static_cast<std::uint32_t>(g.lanes), static_cast<std::uint32_t>(rows_per_block), 1};
  c.shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(blocks, 0xFFFFFFFFll)), 1, 1};
  c.summary = fmt::format("grid ({}) x block ({}, {}): {} rows packed {} per block", blocks,
                          g.lanes, rows_per_block, rows, rows_per_block);
  if (rows >= (std::int64_t{1} << 32)) {
    c.why_not = fmt::format(
        "T*H = {} rows needs 64-bit row division (the flat mode divides a "
        "32-bit row index)",
        rows);
  } else if (blocks > limits.max_grid_dim[0]) {
    c.why_not = fmt::format("{} blocks exceed grid x limit {}", blocks, limits.max_grid_dim[0]);
  } else {
    for (const LimitCheck& check : check_launch(c.shape, limits)) {
      if (!check.ok() && c.why_not.empty()) {
        c.why_not = fmt::format("{} is {}, needs {}", check.limit, check.allowed, check.requested);
      }
    }
  }
  c.legal = c.why_not.empty();
  return c;
}

Planned<Choice> make_plan(const Problem& problem, const DeviceLimits& limits) {
  Planned<Choice> planned;
  Plan& plan = planned.plan;
  plan.op = op_name(problem.entry);
  plan.device = limits;
  if (problem.tokens == 0 || problem.heads == 0) {
    plan.mode = "empty";
    plan.reasons.push_back(
        fmt::format("T = {}, H = {}: no rows, nothing is launched", problem.tokens, problem.heads));
    return planned;
  }
  const std::int64_t in_size = static_cast<std::int64_t>(size_of(problem.in));
  Geometry g;
  g.vec = choose_vec(problem);
  const std::int64_t vectors = problem.head_dim / g.vec;
  const std::int64_t rows = problem.tokens * problem.heads;
  // More vectors per thread amortize the per-row weight math and keep more bytes in flight
  // per thread; but when the problem cannot fill the device anyway, more threads finish sooner.
  const std::int64_t resident =
      static_cast<std::int64_t>(limits.sm_count) * limits.max_threads_per_sm;
  const bool small = rows * vectors <= resident;
  for (std::int64_t chunks : {4, 2, 1}) {
    if (vectors % chunks != 0 || chunks * g.vec * in_size > kMaxBytesPerThread) continue;
    if (small && chunks > 1) continue;
    if (vectors / chunks > kMaxBlockThreads) continue;
    g.chunks = chunks;
    break;
  }
  if (problem.forced_chunks != 0) {
    // A/B runs: the vectors per thread a ":c<n>" suffix of force_mode asks for.
    const std::int64_t forced = problem.forced_chunks;
    if (vectors % forced != 0 || vectors / forced > kMaxBlockThreads) {
      throw PlanError(
          fmt::format("{}: forced {} vector(s) per thread do not split D = {} into "
                      "{} vectors of {} elements with <= {} lanes",
                      plan.op, forced, problem.head_dim, vectors, g.vec, kMaxBlockThreads));
    }
    g.chunks = forced;
    plan.reasons.push_back(
        fmt::format("{} vector(s) per thread forced by options.force_mode", forced));
  }
  if (problem.forced_block_log2 != 0) {
    plan.reasons.push_back(fmt::format("blocks of (up to) {} threads forced by options.force_mode",
                                       std::int64_t{1} << problem.forced_block_log2));
  }
  g.lanes = vectors / g.chunks;
  plan.reasons.push_back(fmt::format(
      "vec = {} ({} bytes of {}): widest access all pointers and strides allow (inputs aligned "
      "to {} bytes, output to {}); {} vector(s) per thread, {} lanes per (token, head) row{}",
      g.vec, g.vec * in_size, to_string(problem.in), problem.in_align, problem.out_align, g.chunks,
      g.lanes, small ? " (small problem: one vector per thread for more parallelism)" : ""));

  const ModeChoice token_major = token_major_shape(problem, g, limits);
  const ModeChoice flat = flat_shape(problem, g, limits);
  const std::int64_t tm_threads =
      static_cast<std::int64_t>(token_major.shape.block.x) * token_major.shape.block.y;
  const std::int64_t tm_idle =
      static_cast<std::int64_t>(token_major.shape.grid.y) * token_major.shape.block.y -
      problem.heads;
  int chosen = -1;
  if (problem.forced_mode != ForcedMode::planner) {
    chosen = static_cast<int>(problem.forced_mode) - 1;
    const ModeChoice& forced = chosen == 0 ? token_major : flat;
    if (!forced.legal) {
      throw PlanError(fmt::format("{}: forced mode '{}' is not legal: {}", plan.op,
                                  kMergeStateModes[chosen], forced.why_not));
    }
    plan.reasons.push_back(
        fmt::format("mode {} forced by options.force_mode", kMergeStateModes[chosen]));
    if (problem.forced_block_log2 != 0 &&
        (std::int64_t{1} << problem.forced_block_log2) < g.lanes) {
      plan.reasons.push_back(fmt::format(
          "(a row needs {} lanes: blocks hold one row, more than the forced threads)", g.lanes));
    }
  } else if (token_major.legal && (small || problem.entry == Entry::many) &&
             tm_threads >= kMinTokenMajorThreads && tm_idle * 16 <= problem.heads &&
             token_major.shape.grid.y == 1) {
    chosen = 0;
    plan.reasons.push_back(fmt::format(
        "token_major: blocks of {} threads with {} idle head rows per token: no division per "
        "thread, consecutive heads of a token read contiguously",
        tm_threads, tm_idle));
  } else if (flat.legal) {
    // A token whose heads span several blocks is read out of memory order under token_major
    // (blockIdx.x walks tokens, so consecutive blocks are a whole token row apart): 2.7-4.7%
    // slower than flat at T*H*D >= 2^26 on the H200, vLLM's kernel in between
    // (docs/performance.md, "merge_state beside vLLM's CUDA kernel").
    // A problem that fills the device takes flat even where token_major reads in memory order
    // (grid y = 1): with one vector per thread (below) it was 0.1-2.8% faster than token_major
    // at D = 64..512, H = 8..128, T = 4096 and 16384, both LSE layouts (docs/performance.md,
    // "One vector per thread").
    chosen = 1;
    plan.reasons.push_back(
        !token_major.legal ? fmt::format("flat: token_major is not legal: {}", token_major.why_not)
        : !small && problem.entry != Entry::many
            ? std::string("flat: the problem fills the device, and flat rows in memory order "
                          "beat token_major blocks there")
        : token_major.shape.grid.y > 1
            ? fmt::format("flat: a token's {} heads span {} token_major blocks, which would read "
                          "rows out of memory order; flat walks them in order",
                          problem.heads, token_major.shape.grid.y)
            : fmt::format("flat: token_major would use blocks of {} threads with {} idle head "
                          "rows per token (needs >= {} threads and <= 1/16 idle); flat packs "
                          "rows densely",
                          tm_threads, tm_idle, kMinTokenMajorThreads));
  } else if (token_major.legal) {
    chosen = 0;
    plan.reasons.push_back(
        fmt::format("token_major: the only legal mode (flat: {})", flat.why_not));
  } else {
    throw PlanError(
        fmt::format("{}: no legal grid mode for T = {}, H = {}, D = {}: "
                    "token_major: {}; flat: {}",
                    plan.op, problem.tokens, problem.heads, problem.head_dim, token_major.why_not,
                    flat.why_not));
  }
  ModeChoice mode = chosen == 0 ? token_major : flat;
  if (chosen == 1 && g.chunks > 1 && problem.forced_chunks == 0 && problem.entry != Entry::many) {
    // Flat rows with one vector per thread: blocks of 256 threads hold twice the rows, freed
    // twice as finely. On the H200, beside vLLM's kernel (one vector per 128-thread block) at
    // 2^26 to 2^29 elements: 0.2-0.6% faster than two vectors at D = 512, 1.0% at D = 128,
    // 3.6% at D = 64 with the LSE head-major (docs/performance.md, "One vector per thread").
    // merge_states keeps its vectors per thread: each row's S weights are computed per thread.
    Geometry one = g;
    one.chunks = 1;
    one.lanes = g.lanes * g.chunks;
    const ModeChoice flat_one = flat_shape(problem, one, limits);
    if (flat_one.legal) {
      plan.reasons.push_back(fmt::format(
          "flat: 1 vector per thread after all, not {} ({} lanes per row, more rows per block, "
          "freed more finely)",
          g.chunks, one.lanes));
      g = one;
      mode = flat_one;
    }
  }
  plan.mode = kMergeStateModes[chosen];
  plan.reasons.push_back(mode.summary);

  PlannedLaunch launch;
  launch.spec = KernelSpec::make("merge_state",
                                 {{"in", std::string(to_string(problem.in))},
                                  {"out", std::string(to_string(problem.out))},
                                  {"head_dim", std::to_string(problem.head_dim)},
                                  {"vec", std::to_string(g.vec)},
                                  {"chunks", std::to_string(g.chunks)},
                                  {"mode", plan.mode},
                                  {"op", op_choice(problem.entry)},
                                  {"base", problem.base == LseBase::two ? "2" : "e"},
                                  {"pos_inf_empty", problem.pos_inf_as_empty ? "1" : "0"}},
                                 limits.arch);
  launch.shape = mode.shape;
  launch.checks = check_launch(launch.shape, limits);
  require_legal(launch.checks, plan.op);
  plan.launches.push_back(std::move(launch));
  planned.choice = Choice{static_cast<std::int32_t>(g.vec), static_cast<std::int32_t>(g.chunks),
                          static_cast<std::int32_t>(g.lanes),
                          chosen == 0 ? MergeGridMode::token_major : MergeGridMode::flat};
  return planned;
}

}  // namespace

Planned<Choice> Family::plan(const Problem& problem, const DeviceLimits& limits) {
  return make_plan(problem, limits);
}

}  // namespace kjit::ops::merge
