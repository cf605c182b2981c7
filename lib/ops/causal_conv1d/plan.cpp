// SPDX-License-Identifier: Apache-2.0
// causal_conv1d: the planner. Vector width, mode, batch of loads, span and pool access for a
// Problem on a device; pure (no device, no runtime). One 1-D launch for every shape
// (docs/architecture.md, "causal_conv1d").
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/causal_conv1d/family.hpp"

namespace kjit::ops::conv1d {
namespace {

/// Tokens per batch of loads (the spec's `chunk`). The prefill modes keep two batches in
/// flight (the next one issued before the current one is computed): 16 vector loads per thread.
constexpr std::int64_t kChunk = 8;
/// The chunked prefill's batch: 4 tokens (8 vector loads in flight per thread, 164 registers,
/// three blocks per SM) beat 8 (242 registers, two blocks) on the H200 at Qwen3-Next's sizes
/// (measured: docs/performance.md, "Spans of tokens per work item").
constexpr std::int64_t kPrefillChunk = 4;
/// The staged prefill's stages where they apply (options.force_stages = 0).
constexpr std::int64_t kDefaultStages = 4;
constexpr std::int64_t kThreads = kConvBlockThreads;

/// Why the widest channel vector is what it is (Problem::max_vec).
std::string why_vec(const Problem& p) {
  if (p.x_channel_stride != 1 || p.out_channel_stride != 1) {
    return fmt::format(
        "channel strides of x / out are {} / {}: one channel per access (vectors need stride 1)",
        p.x_channel_stride, p.out_channel_stride);
  }
  return fmt::format("x and out channel-contiguous, addresses and strides aligned to {} bytes",
                     p.vec_align);
}

}  // namespace

std::uint64_t items_of(const Problem& p, ConvMode mode, std::int64_t vec, std::int64_t span) {
  const auto groups = static_cast<std::uint64_t>(p.dim / vec);
  std::uint64_t units = static_cast<std::uint64_t>(p.seqs);
  if (mode == ConvMode::chunked) units = static_cast<std::uint64_t>(p.tokens / span + p.seqs);
  return units * groups;
}

Planned<Choice> Family::plan(const Problem& p, const DeviceLimits& limits) {
  Planned<Choice> planned;
  Plan& plan = planned.plan;
  plan.op = op_name(p.op);
  plan.device = limits;
  if (p.seqs == 0 || ((p.op == Op::prefill || p.varlen) && p.tokens == 0)) {
    plan.mode = "empty";
    plan.reasons.push_back(fmt::format("{} = {}, T = {}: nothing to do, nothing is launched",
                                       p.op == Op::prefill ? "N" : "B", p.seqs, p.tokens));
    return planned;
  }
  std::int64_t vec = p.max_vec;
  if (p.force_vec != 0) {
    if (p.force_vec > p.max_vec) {
      throw PlanError(fmt::format("{}: options.force_vec = {} is not possible: at most {} ({})",
                                  plan.op, p.force_vec, p.max_vec, why_vec(p)));
    }
    vec = p.force_vec;
    plan.reasons.push_back(fmt::format("vec = {} forced by options.force_vec", vec));
  } else if (p.op == Op::prefill && p.width > 4 && vec > 4) {
    // The taps, bias and history of a thread's channels are (2W) x vec floats: at W > 4 and
    // 8 channels, with two batches of loads in flight, the prefill kernel spills (W = 6 and 8,
    // bf16: 255 registers, 224 and 576 bytes of spill stores at sm_90).
    vec = 4;
    plan.reasons.push_back(fmt::format(
        "vec = 4 channels per thread: W = {} > 4, whose taps and history for 8 channels would "
        "not fit in registers beside two batches of loads ({} allows {})",
        p.width, why_vec(p), p.max_vec));
  } else {
    plan.reasons.push_back(fmt::format("vec = {} channels per thread: {}", vec, why_vec(p)));
  }

  int mode = 2;
  if (p.op == Op::prefill) {
    if (p.forced_mode >= 0) {
      mode = p.forced_mode;
      if (mode == 0 && p.in_place) {
        throw PlanError(fmt::format(
            "{}: forced mode 'chunked' is not legal in place (out == x): a span reads the W - 1 "
            "inputs before it, which the previous span's threads overwrite; use 'sequential'",
            plan.op));
      }
      plan.reasons.push_back(
          fmt::format("mode {} forced by options.force_mode", kCausalConv1dModes[mode]));
    } else if (p.in_place) {
      mode = 1;
      plan.reasons.push_back(
          "sequential: in place (out == x), so each (sequence, channel group) is walked by one "
          "thread that reads every input before overwriting it (spans would read inputs their "
          "neighbours overwrite)");
    } else {
      mode = 0;
    }
  } else {
    plan.reasons.push_back(fmt::format(
        "rows: one thread per (row, {} channels) over the row's {}; its pool columns are read "
        "and written by that thread alone",
        vec,
        p.varlen ? fmt::format("tokens query_start_loc[b]..query_start_loc[b + 1] - 1 (T = {} "
                               "in all; a row without tokens leaves its slot untouched)",
                               p.tokens)
                 : fmt::format("S = {} tokens", p.tokens)));
  }
  if (p.force_span != 0 && mode != 0) {
    throw PlanError(
        fmt::format("{}: options.force_span = {} applies to mode 'chunked' only; this "
                    "call runs mode '{}'",
                    plan.op, p.force_span, kCausalConv1dModes[mode]));
  }

  // Tokens whose loads are in flight at once: a batch of the prefill (two batches in flight);
  // an update row's S tokens up to 8 (fewer registers held for loads that never happen at
  // S = 1), for varlen rows their mean length T / B.
  const std::int64_t row_tokens =
      p.varlen ? std::max<std::int64_t>(1, (p.tokens + p.seqs - 1) / p.seqs) : p.tokens;
  std::int64_t chunk =
      mode == 2   ? std::min<std::int64_t>(kChunk, static_cast<std::int64_t>(std::bit_ceil(
                                                       static_cast<std::uint64_t>(row_tokens))))
      : mode == 0 ? kPrefillChunk
                  : kChunk;
  if (p.force_chunk != 0) {
    chunk = p.force_chunk;
    plan.reasons.push_back(fmt::format("chunk = {} forced by options.force_chunk", chunk));
  }
  // Tokens per chunked work item: the longest span of kSpanLongest, kSpanLongest / 2, ..
  // kSpanShortest that still gives every SM max_threads_per_sm / 2 work items (the device full
  // of threads about 2.7 times over at the 384 threads an SM holds at this kernel's
  // registers), so that short calls keep every SM busy and long ones amortize each item's
  // fixed cost (measured against shorter spans: docs/performance.md, "Spans of tokens per work
  // item").
  std::int64_t span = 0;
  if (mode == 0) {
    const std::int64_t floor_span = std::max({kSpanShortest, chunk, p.width - 1});
    const auto enough = static_cast<std::uint64_t>(limits.sm_count) *
                        static_cast<std::uint64_t>(limits.max_threads_per_sm) / 2;
    if (p.force_span != 0) {
      if (p.force_span < floor_span) {
        throw PlanError(fmt::format(
            "{}: options.force_span = {} is shorter than the chunk ({} tokens per batch of "
            "loads) or the W - 1 = {} token halo a span covers for the next one",
            plan.op, p.force_span, chunk, p.width - 1));
      }
      span = p.force_span;
      plan.reasons.push_back(fmt::format("span = {} forced by options.force_span", span));
    } else {
      // Where DRAM is slow per SM the longest span is 32 on Hopper: on the H100 (25 GB/s per SM)
      // span 32 was 1.03-1.04x span 64 at 8k, 32k and 128k tokens in two sessions' runs, on the
      // H200 (36) 0.95-0.96x at 32k and 128k (docs/performance.md, "The prefill's span on the
      // H100").
      const std::int64_t dram_per_sm = limits.dram_bytes_per_sm_second();
      // (Measured on Hopper only: other archs keep 64 however their DRAM compares.)
      const bool slow_dram = limits.arch.major == 9 && dram_per_sm < kSpan32BelowBytesPerSmSecond;
      const std::int64_t longest = slow_dram ? kSpanLongest / 2 : kSpanLongest;
      span = std::max(longest, floor_span);
      while (span > floor_span && items_of(p, ConvMode::chunked, vec, span) < enough) span /= 2;
      plan.reasons.push_back(fmt::format(
          "span = {} tokens per work item: the longest of {}..{} giving at least {} SMs x {} "
          "threads / 2 = {} items ({} here), so that each item's sequence lookup, weights and "
          "W - 1 token halo are spread over many tokens while every SM still gets threads{}",
          span, longest, floor_span, limits.sm_count, limits.max_threads_per_sm, enough,
          items_of(p, ConvMode::chunked, vec, span),
          slow_dram ? fmt::format(" (longest {}, not {}: {:.1f} GB/s of DRAM bandwidth per SM "
                                  "< {}, where shorter spans measured faster)",
                                  longest, kSpanLongest, static_cast<double>(dram_per_sm) * 1e-9,
                                  kSpan32BelowBytesPerSmSecond / 1'000'000'000)
                    : std::string()));
    }
    plan.reasons.push_back(fmt::format(
        "chunked: every span of {} tokens of every sequence in parallel (span ids "
        "floor(cu[n] / {}) + n + s, {} ids for T = {}, N = {}), each walked in batches of {} "
        "tokens with the next batch's loads issued before the current one is computed; the "
        "thread of a sequence's first span reads and writes its pool slot",
        span, span, p.tokens / span + p.seqs, p.tokens, p.seqs, chunk));
  }
  plan.mode = kCausalConv1dModes[mode];
  // Stages of the chunked prefill: x's batches through shared memory by cp.async, 4 batches deep
  // (1.08-1.14x the register double buffer at Qwen3-Next sizes on the H200: docs/performance.md,
  // "Tuning candidates"). force_stages = 1 keeps the register double buffer.
  const std::int64_t access = vec * static_cast<std::int64_t>(size_of(p.in));
  const bool can_stage = mode == 0 && access == 16;
  std::int64_t stages = 0;
  if (p.force_stages > 1) {
    if (!can_stage || p.force_stages * chunk > kConvMaxStagedTokens) {
      throw PlanError(fmt::format(
          "{}: options.force_stages = {} needs mode 'chunked' with 16-byte accesses of x and "
          "stages x chunk <= {} ({} KiB of shared memory per block); this call runs mode '{}' "
          "with {}-byte accesses and chunk {}",
          plan.op, p.force_stages, kConvMaxStagedTokens,
          conv_staged_bytes(kConvMaxStagedTokens) / 1024, kCausalConv1dModes[mode], access, chunk));
    }
    stages = p.force_stages;
  } else if (p.force_stages == 0 && can_stage && kDefaultStages * chunk <= kConvMaxStagedTokens) {
    stages = kDefaultStages;
  }
  if (stages != 0) {
    const bool forced = p.force_stages != 0;
    plan.reasons.push_back(fmt::format(
        "stages = {}{}: x's batches of {} tokens go to shared memory by cp.async, {} batches "
        "ahead of the one computed ({} bytes per block){}",
        stages, forced ? " forced by options.force_stages" : "", chunk, stages - 1,
        conv_staged_bytes(stages * chunk),
        forced ? "" : ": more loads in flight than two register buffers hold"));
  } else if (p.force_stages == 1 && can_stage) {
    plan.reasons.push_back(
        "no stages (options.force_stages = 1): x's batches in two register buffers");
  }
  // A tuning candidate, opt-in only: the default plan has the template's minimum of blocks per SM
  // and does not name it in its spec.
  if (p.force_min_blocks != 0) {
    plan.reasons.push_back(fmt::format(
        "min_blocks = {} forced by options.force_min_blocks: compiled for {} blocks of {} "
        "threads per SM (at most {} registers per thread)",
        p.force_min_blocks, p.force_min_blocks, kThreads,
        std::min<std::int64_t>(255, 65536 / (kThreads * p.force_min_blocks) / 8 * 8)));
  }

  // The pool: its columns are a small part of a prefill's bytes but half of a decode step's.
  const auto state_size = static_cast<std::int64_t>(size_of(p.state));
  const std::int64_t block_bytes = vec * (p.width - 1) * state_size;
  std::string pool = "scalar";
  if (p.state_layout == PoolLayout::block && block_bytes % 16 == 0 && p.state_align >= 16) {
    pool = "block";
    plan.reasons.push_back(fmt::format(
        "pool access block: each slot is a contiguous [D, W-1], so a thread's {} x {} columns are "
        "{} contiguous bytes, moved as 16-byte vectors",
        vec, p.width - 1, block_bytes));
  } else if (p.state_layout == PoolLayout::channels && vec > 1 && vec * state_size <= 16 &&
             p.state_align >= vec * state_size) {
    pool = "channels";
    plan.reasons.push_back(fmt::format(
        "pool access channels: the pool is channel-contiguous, one {}-byte vector per column",
        vec * state_size));
  } else {
    plan.reasons.push_back(fmt::format(
        "pool access scalar: {}",
        p.state_layout == PoolLayout::block
            ? fmt::format("the [vec, W-1] block is {} bytes or the pool is "
                          "aligned to {} bytes (needs whole 16-byte vectors)",
                          block_bytes, p.state_align)
        : p.state_layout == PoolLayout::channels
            ? fmt::format("channel vectors of {} x {} bytes with the pool aligned to {} bytes "
                          "(needs 2..16 bytes, aligned)",
                          vec, state_size, p.state_align)
            : std::string("the pool is neither [slots, D, W-1] contiguous per slot nor "
                          "channel-contiguous")));
  }

  const std::uint64_t items = items_of(p, static_cast<ConvMode>(mode), vec, span);
  const std::uint64_t wanted = (items + kThreads - 1) / kThreads;
  const std::uint64_t blocks =
      std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(limits.max_grid_dim[0]));
  plan.reasons.push_back(fmt::format(
      "grid ({}) x block ({}): 1-D over {} work items{}; no grid y or z, so no size of T, N, B "
      "or D reaches the 65535 limit",
      blocks, kThreads, items,
      blocks < wanted ? fmt::format(", {} items per thread (grid-stride loop)",
                                    (items + blocks * kThreads - 1) / (blocks * kThreads))
                      : ""));

  PlannedLaunch launch;
  std::vector<std::pair<std::string, std::string>> spec_params = {
      {"in", std::string(to_string(p.in))},
      {"out", std::string(to_string(p.out))},
      {"weight", std::string(to_string(p.weight))},
      {"state", std::string(to_string(p.state))},
      {"width", std::to_string(p.width)},
      {"vec", std::to_string(vec)},
      {"chunk", std::to_string(chunk)},
      {"span", std::to_string(span)},
      {"mode", plan.mode},
      {"pool", pool},
      {"silu", p.silu ? "1" : "0"}};
  if (p.force_min_blocks != 0) {
    spec_params.emplace_back("min_blocks", std::to_string(p.force_min_blocks));
  }
  if (stages != 0) spec_params.emplace_back("stages", std::to_string(stages));
  launch.spec = KernelSpec::make("causal_conv1d", spec_params, limits.arch);
  launch.shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  launch.shape.block = Dim3{static_cast<std::uint32_t>(kThreads), 1, 1};
  launch.checks = check_launch(launch.shape, limits);
  require_legal(launch.checks, plan.op);
  plan.launches.push_back(std::move(launch));
  planned.choice = Choice{static_cast<std::int32_t>(vec), static_cast<std::int32_t>(chunk),
                          static_cast<std::int32_t>(span), static_cast<ConvMode>(mode)};
  return planned;
}

}  // namespace kjit::ops::conv1d
