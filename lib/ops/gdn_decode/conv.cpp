// SPDX-License-Identifier: Apache-2.0
// gdn_decode with options.conv: the fused decode step (causal conv update + delta rule in one
// kernel, templates/gdn_decode/conv.cuh). Checks, planner and parameters of its family.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/gdn_decode/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit::ops::decode {
namespace {

/// Blocks per SM from which a block has 8 warps instead of 32: below, a small batch spreads
/// each block's state rows over as many warps as a block holds.
constexpr std::int64_t kManyBlocksPerSm = 4;

/// The planner splits each group over a cluster (sm_90 and later) only while the (row, q/k head)
/// blocks are at most a quarter of the SMs: measured on an H200 (Qwen3-Next, HV = 32, docs/
/// performance.md), clusters paid at B = 1 (16 blocks: 8.36 us in clusters of 4 against 12.38
/// without) and lost from B = 4 (64 blocks: 13.8 us without, 15.5-18.7 with).
constexpr std::int64_t kClusterUpToBlocksPerSms = 4;

/// State rows a clustered block keeps at least where the group has twice as many: at B = 1,
/// clusters of 4 (64 rows a block) took 8.36 us and of 8 (32 rows, each block also convolving
/// all 2K q/k channels) 8.9.
constexpr std::int64_t kClusterMinBlockRows = 64;

/// Whether a cluster of `c` blocks splits the group's `rows` state rows and 2K q/k channels
/// evenly with at least 4 rows per block.
bool cluster_splits(const decode::Problem& p, std::int64_t rows, int c) {
  return rows % c == 0 && rows / c >= 4 && 2 * p.k % c == 0;
}

/// Blocks per cluster (1: no cluster): options.conv->force_cluster where set (PlanError where it
/// cannot launch); else none unless kClusterUpToBlocksPerSms x blocks <= SMs, and then the
/// smallest of 2, 4, 8 whose grid covers half the SMs, without going below kClusterMinBlockRows
/// rows per block once clustered (where the group has 2 x that many); only sizes that split the
/// group's state rows and q/k channels evenly, with at least 4 rows per block.
int cluster_blocks(const ConvProblem& cp, const DeviceLimits& device) {
  const decode::Problem& p = cp.step;
  const std::int64_t blocks = p.batch * p.heads;
  const std::int64_t sms = std::max(device.sm_count, 1);
  const std::int64_t rows = p.value_heads / p.heads * p.v;
  if (cp.force_cluster > 1) {
    if (device.arch.sm() < 90) {
      throw PlanError(fmt::format(
          "{}: options.conv->force_cluster = {} needs thread-block clusters (sm_90 or later); "
          "the device is {}",
          op_name(p.form), cp.force_cluster, device.arch.str()));
    }
    if (!cluster_splits(p, rows, cp.force_cluster)) {
      throw PlanError(fmt::format(
          "{}: options.conv->force_cluster = {} does not split the group's {} state rows (V * HV "
          "/ H) and {} q/k channels evenly with at least 4 rows per block",
          op_name(p.form), cp.force_cluster, rows, 2 * p.k));
    }
    return cp.force_cluster;
  }
  if (cp.force_cluster == 1) return 1;
  if (device.arch.sm() < 90 || kClusterUpToBlocksPerSms * blocks > sms) return 1;
  const std::int64_t min_rows = rows >= 2 * kClusterMinBlockRows ? kClusterMinBlockRows : 4;
  int chosen = 1;
  for (int c : {2, 4, 8}) {
    if (!cluster_splits(p, rows, c) || rows / c < min_rows) break;
    chosen = c;
    if (2 * blocks * c >= sms) break;
  }
  return chosen;
}

/// Sets of state rows per warp in the shared-memory ring (0: none, two register sets):
/// options.conv->force_stages where set (PlanError where the plan cannot take a ring); else none.
/// (A ring holds no registers for its loads in flight; not yet measured against the register
/// sets, so the planner does not choose it by itself.)
int ring_stages(const ConvProblem& cp, int cluster, int state_vec_bytes) {
  if (cp.force_stages <= 1) return 0;
  const decode::Problem& p = cp.step;
  if (cluster > 1) {
    throw PlanError(fmt::format(
        "{}: options.conv->force_stages = {} needs an unclustered plan; this one takes clusters of "
        "{} blocks (options.conv->force_cluster = 1 keeps one block per (row, q/k head))",
        op_name(p.form), cp.force_stages, cluster));
  }
  if (state_vec_bytes != 16) {
    throw PlanError(fmt::format(
        "{}: options.conv->force_stages = {} needs 16-byte state vectors (cp.async copies 16 "
        "bytes); this plan accesses the state {} bytes per lane (K = {}, {} pool aligned to {} "
        "bytes)",
        op_name(p.form), cp.force_stages, state_vec_bytes, p.k, to_string(p.state), p.vec_bytes));
  }
  return static_cast<int>(cp.force_stages);
}

/// Options that choose among the plain step's kernels have no meaning for the fused one.
void reject_plain_options(Form form, const GdnDecodeOptions& options) {
  const auto refuse = [&](std::string_view what) {
    throw InvalidArgument(fmt::format(
        "{}: {} does not apply with options.conv (the fused step has one kernel shape); leave "
        "it at its default",
        op_name(form), what));
  };
  if (!options.force_mode.empty())
    refuse(fmt::format("options.force_mode = '{}'", options.force_mode));
  if (options.force_bv != 0) refuse(fmt::format("options.force_bv = {}", options.force_bv));
  if (options.force_stages != 0) {
    refuse(fmt::format("options.force_stages = {}", options.force_stages));
  }
  if (options.force_blocks_per_sm != 0) {
    refuse(fmt::format("options.force_blocks_per_sm = {}", options.force_blocks_per_sm));
  }
  if (!options.force_cache_hints.empty()) {
    refuse(fmt::format("options.force_cache_hints = '{}'", options.force_cache_hints));
  }
  if (options.row_order == GdnRowOrder::by_slot) refuse("options.row_order = by_slot");
}

}  // namespace

ConvProblem ConvFamily::check(const Args& args) {
  const GdnDecodeOptions& options = *args.options;
  const GdnDecodeConv& conv = *options.conv;
  reject_plain_options(args.form, options);
  ConvProblem cp;
  cp.step = Family::check(args);
  const decode::Problem& p = cp.step;
  const Form form = p.form;
  const ArgChecks c = checks(form);
  if (p.state_layout != StateLayout::vk) {
    c.fail("state", *args.state,
           "with options.conv the [HV, V, K] block must be K contiguous (strides [*, V*K, K, 1]); "
           "V-contiguous pools run only without the conv");
  }
  const std::int64_t channels = 2 * p.heads * p.k + p.value_heads * p.v;

  const TensorView& weight = conv.weight;
  c.rank("options.conv->weight", weight, 2, "[D, W]");
  if (weight.dtype != p.qkv && weight.dtype != DType::f32) {  // p.qkv is a float type
    c.fail(fmt::format("options.conv->weight has dtype {}; accepted: mixed_qkv's ({}) or f32",
                       to_string(weight.dtype), to_string(p.qkv)));
  }
  if (weight.shape[0] != channels || weight.shape[1] < 2 || weight.shape[1] > 8) {
    c.fail("options.conv->weight", weight,
           fmt::format("expected shape [D, W] with D = 2*H*K + HV*V = {} and W in 2..8", channels));
  }
  c.not_null("options.conv->weight", weight, /*empty_may_be_null=*/false);
  c.element_aligned("options.conv->weight", weight);
  cp.width = static_cast<std::int16_t>(weight.shape[1]);
  cp.weight = weight.dtype;
  cp.weight_channel_stride = weight.strides[0];
  cp.weight_tap_stride = weight.strides[1];

  const TensorView& bias = conv.bias;
  if (bias.data != nullptr) {
    if (bias.rank != 1 || bias.shape[0] != channels) {
      c.fail("options.conv->bias", bias,
             fmt::format("expected shape [D] = [{}] (or data == nullptr: no bias)", channels));
    }
    c.dtype_of("options.conv->bias", bias, weight.dtype, "the weight's dtype");
    c.element_aligned("options.conv->bias", bias);
    cp.has_bias = true;
    cp.bias_stride = bias.strides[0];
  }

  const TensorView& pool = conv.conv_state;
  c.rank("options.conv->conv_state", pool, 3, "[slots, D, L]");
  c.float_dtype("options.conv->conv_state", pool);
  if (pool.shape[0] != p.slots || pool.shape[1] != channels || pool.shape[2] < cp.width - 1) {
    c.fail("options.conv->conv_state", pool,
           fmt::format("expected shape [slots, D, L] with slots = {} (the state pool's: both pools "
                       "are indexed by state_indices), D = {} and L >= W - 1 = {}",
                       p.slots, channels, cp.width - 1));
  }
  c.not_null("options.conv->conv_state", pool, /*empty_may_be_null=*/false);
  c.element_aligned("options.conv->conv_state", pool);
  cp.conv_state = pool.dtype;
  cp.conv_slot_stride = pool.strides[0];
  cp.conv_channel_stride = pool.strides[1];
  cp.conv_column_stride = pool.strides[2];

  if (conv.activation != ConvActivation::none && conv.activation != ConvActivation::silu) {
    throw InvalidArgument(
        fmt::format("{}: options.conv->activation = {} is not accepted; accepted: none, silu",
                    op_name(form), static_cast<int>(conv.activation)));
  }
  cp.silu = conv.activation == ConvActivation::silu;
  if (conv.force_cluster != 0 && !gdn_decode_conv_cluster_size(conv.force_cluster)) {
    throw InvalidArgument(fmt::format(
        "{}: options.conv->force_cluster = {} is not accepted; accepted: 0 (the planner's "
        "choice), 1 (no cluster), 2, 4 or 8 blocks per (row, q/k head)",
        op_name(form), conv.force_cluster));
  }
  cp.force_cluster = static_cast<std::int16_t>(conv.force_cluster);
  if (conv.force_stages != 1 && !gdn_decode_conv_stage_count(conv.force_stages)) {
    throw InvalidArgument(fmt::format(
        "{}: options.conv->force_stages = {} is not accepted; accepted: 0 (the planner's choice), "
        "1 (state rows in registers), 2, 3 or 4 (a ring of that many sets of rows per warp in "
        "shared memory)",
        op_name(form), conv.force_stages));
  }
  cp.force_stages = conv.force_stages;
  return cp;
}

Planned<ConvChoice> ConvFamily::plan(const ConvProblem& cp, const DeviceLimits& device) {
  const decode::Problem& p = cp.step;
  Planned<ConvChoice> planned;
  Plan& plan = planned.plan;
  plan.op = std::string(op_name(p.form));
  plan.device = device;
  plan.mode = "fused_conv";
  const std::int64_t group = p.value_heads / p.heads;
  const std::int64_t rows = group * p.v;
  const std::int64_t blocks = p.batch * p.heads;
  const std::int64_t sms = std::max(device.sm_count, 1);
  const int cluster = cluster_blocks(cp, device);
  // (Clustered, the q/k columns have a reader in every block of the cluster: its reason below.)
  if (cluster == 1) {
    plan.reasons.push_back(fmt::format(
        "fused conv update + delta rule: one block per (row, q/k head) = {} blocks; a block owns "
        "the {} channels it convolves (q and k of its head, v of its {} value heads), so each "
        "conv-pool column has one reader and writer",
        blocks, 2 * p.k + rows, group));
  } else {
    plan.reasons.push_back(fmt::format(
        "fused conv update + delta rule: {} (row, q/k head) groups of {} channels (q and k of a "
        "head, v of its {} value heads)",
        blocks, 2 * p.k + rows, group));
  }
  const std::string why_cluster =
      cp.force_cluster != 0
          ? fmt::format("forced (options.conv->force_cluster = {})", cp.force_cluster)
          : fmt::format("{} blocks, at most 1 / {} of the {} SMs", blocks, kClusterUpToBlocksPerSms,
                        sms);
  if (cluster > 1) {
    plan.reasons.push_back(fmt::format(
        "clusters of {} blocks per (row, q/k head): {}, so each block of a cluster takes {} of "
        "the group's {} state rows and convolves all {} q/k channels itself; it writes the new "
        "pool columns of {} of them after the cluster barrier at its end, which every block "
        "passes once it has read them",
        cluster, why_cluster, rows / cluster, rows, 2 * p.k, 2 * p.k / cluster));
  } else if (cp.force_cluster == 1) {
    plan.reasons.push_back(
        fmt::format("one block per (row, q/k head), no cluster: {}", why_cluster));
  }
  // With clusters, the warps follow the block's rows (two register sets of 4 rows per warp
  // cover them in one pass), and its threads cover the channels it convolves, one each: a
  // second channel per thread would be a second dependent trip to the conv pool before the step.
  int warps = cluster > 1 ? 32 : blocks >= kManyBlocksPerSm * sms ? 8 : 32;
  const std::int64_t block_rows = rows / cluster;
  const std::int64_t rows_per_warp =
      cluster > 1 ? gdn_decode_conv_rows_per_set(static_cast<int>(p.k)) : 1;
  while (warps > 1 && warps * rows_per_warp > block_rows) warps /= 2;
  const std::int64_t block_channels = 2 * p.k + block_rows;
  if (cluster > 1) {
    while (warps < 32 && warps * 32 < block_channels) warps *= 2;
  }
  plan.reasons.push_back(
      cluster > 1 ? fmt::format("{} warps per block: its {} state rows, up to {} per warp, and "
                                "its {} conv channels, up to one per thread",
                                warps, block_rows, rows_per_warp, block_channels)
      : blocks >= kManyBlocksPerSm * sms
          ? fmt::format("{} warps per block: {} blocks >= {} per SM ({} SMs)", warps, blocks,
                        kManyBlocksPerSm, sms)
          : fmt::format("{} warps per block: {} blocks < {} per SM ({} SMs), so each block spreads "
                        "its {} state rows over as many warps as it holds",
                        warps, blocks, kManyBlocksPerSm, sms, rows));

  // State vectors: the widest access (<= 16 bytes) the pool's alignment allows such that a warp's
  // 32 vectors tile whole rows of K.
  int state_vec = 1;
  const int state_bytes = static_cast<int>(size_of(p.state));
  for (int vec : {8, 4, 2}) {
    if (vec * state_bytes <= p.vec_bytes && vec * state_bytes >= 4 && p.k % (32 * vec) == 0) {
      state_vec = vec;
      break;
    }
  }
  plan.reasons.push_back(
      state_vec > 1
          ? fmt::format("state accessed {} elements ({} bytes) per lane and instruction", state_vec,
                        state_vec * state_bytes)
          : fmt::format("state accessed one element per lane and instruction: K = {} is not a "
                        "multiple of 32 vectors of >= 4 bytes, or the pool is aligned to {} bytes",
                        p.k, p.vec_bytes));
  const int stages = ring_stages(cp, cluster, state_vec * state_bytes);
  const int rows_per_set = gdn_decode_conv_rows_per_set(static_cast<int>(p.k));
  if (stages > 0) {
    plan.reasons.push_back(fmt::format(
        "state rows through a ring of {} sets of {} rows per warp in shared memory (cp.async): "
        "forced (options.conv->force_stages = {})",
        stages, rows_per_set, stages));
  } else {
    plan.reasons.push_back(fmt::format(
        "state rows in two register sets of {} rows per warp (the next set's loads issued before "
        "the current set's sums){}",
        rows_per_set, cp.force_stages == 1 ? ": forced (options.conv->force_stages = 1)" : ""));
  }

  std::vector<std::pair<std::string, std::string>> spec_params = step_spec_params(p);
  spec_params.insert(spec_params.end(), {{"weight", std::string(to_string(cp.weight))},
                                         {"conv_state", std::string(to_string(cp.conv_state))},
                                         {"width", std::to_string(cp.width)},
                                         {"warps", std::to_string(warps)},
                                         {"silu", cp.silu ? "1" : "0"},
                                         {"state_vec", std::to_string(state_vec)}});
  // (left out at 1 and 0: the specs of unclustered, unstaged kernels stay what they were)
  if (cluster > 1) spec_params.emplace_back("cluster", std::to_string(cluster));
  if (stages > 0) spec_params.emplace_back("stages", std::to_string(stages));
  KernelSpec spec = KernelSpec::make("gdn_decode_conv", std::move(spec_params), device.arch);
  LaunchShape shape;
  shape.block = Dim3{static_cast<std::uint32_t>(warps * 32), 1, 1};
  shape.grid = Dim3{
      static_cast<std::uint32_t>(std::min<std::int64_t>(blocks * cluster, 0xFFFFFFFFll)), 1, 1};
  if (cluster > 1) shape.cluster = Dim3{static_cast<std::uint32_t>(cluster), 1, 1};
  const std::int64_t smem =
      gdn_decode_conv_smem_bytes(p.k, p.v, group, cp.width, cluster, warps, stages, state_bytes);
  shape.dynamic_smem = static_cast<std::uint32_t>(std::min<std::int64_t>(smem, 0xFFFFFFFFll));
  plan.reasons.push_back(fmt::format(
      "{} B of shared memory per block: the conv output of its channels and its gates{}", smem,
      stages > 0 ? ", then the state ring" : ""));
  PlannedLaunch launch{std::move(spec), shape, check_launch(shape, device)};
  require_legal(launch.checks, fmt::format("{} (fused conv step)", plan.op));
  plan.launches.push_back(std::move(launch));
  planned.choice = ConvChoice{warps};
  return planned;
}

GdnDecodeConvParams ConvFamily::params(const Args& args, const ConvProblem& cp, const ConvChoice&,
                                       void*) {
  const decode::Problem& p = cp.step;
  const GdnDecodeConv& conv = *args.options->conv;
  GdnDecodeConvParams params{};
  fill_step_params(params, args, p);
  params.conv_weight = conv.weight.data;
  params.conv_bias = cp.has_bias ? conv.bias.data : nullptr;
  params.conv_state = conv.conv_state.data;
  params.weight_channel_stride = cp.weight_channel_stride;
  params.weight_tap_stride = cp.weight_tap_stride;
  params.bias_stride = cp.bias_stride;
  params.conv_slot_stride = cp.conv_slot_stride;
  params.conv_channel_stride = cp.conv_channel_stride;
  params.conv_column_stride = cp.conv_column_stride;
  return params;
}

}  // namespace kjit::ops::decode
