// SPDX-License-Identifier: Apache-2.0
// gdn_prefill: the kernel parameters of a checked call, its workspace, and the public entry
// points, which run on the op skeleton (ops/op.hpp).
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "ops/gdn_prefill/family.hpp"

namespace kjit {

GdnGates GdnGates::raw(TensorView a, TensorView b, TensorView a_log, TensorView dt_bias) {
  return GdnGates{GdnGateKind::raw, a, b, a_log, dt_bias};
}

GdnGates GdnGates::precomputed(TensorView g, TensorView beta) {
  return GdnGates{GdnGateKind::precomputed, g, beta, {}, {}};
}

namespace ops::prefill {

std::size_t Family::workspace_bytes(const Problem& pr, const Choice& choice) {
  // The caller's workspace, when it has a data pointer (check() made sure it is large enough).
  if (!uses_workspace(choice.path) || pr.caller_workspace) return 0;
  if (choice.path == Path::context_parallel) {
    return static_cast<std::size_t>(cp_workspace_bytes(pr, choice.cp_chunks));
  }
  return static_cast<std::size_t>(gdn_prefill_workspace(static_cast<std::uint64_t>(pr.tokens),
                                                        static_cast<std::uint64_t>(pr.value_heads))
                                      .total);
}

std::string Family::workspace_hint(std::size_t bytes) {
  return fmt::format(
      "pass options.workspace ({} bytes for this call, as plan_gdn_prefill's reasons say) instead",
      bytes);
}

namespace {

/// Whether a call's kernel has whole chunks for TMA boxes: the warp-specialized kernel (K = V =
/// 128), at least one chunk, and token coordinates that fit a box coordinate (an int).
bool ws_boxes_possible(const Problem& pr, const Choice& choice) {
  return choice.path == Path::warp_specialized && pr.k == 128 && pr.v == 128 &&
         pr.tokens >= kGdnPrefillChunk && pr.tokens < (std::int64_t{1} << 31);
}

/// The map of a bf16 tensor {128, heads, T} (strides in elements) in boxes of `box_columns` x 1
/// head x 64 tokens with `swizzle_bytes`, into `map`; none where TMA cannot address the tensor
/// (tensor_map_refusal: e.g. a base not 16-byte aligned, a stride of no whole 16 bytes).
std::optional<TensorMapSlot> bf16_box_map(TensorMap* map, const void* base, std::int64_t heads,
                                          std::int64_t tokens, std::int64_t stride_t,
                                          std::int64_t stride_h, std::uint32_t box_columns,
                                          int swizzle_bytes) {
  constexpr std::int64_t kElement = 2;
  TensorMapSlot slot;
  slot.map = map;
  TensorMapRequest& r = slot.request;
  r.element = DType::bf16;
  r.rank = 3;
  r.base = base;
  r.dims[0] = 128;
  r.dims[1] = static_cast<std::uint64_t>(heads);
  r.dims[2] = static_cast<std::uint64_t>(tokens);
  // (A negative stride wraps to past 2^40, which the check refuses.)
  r.strides[0] = static_cast<std::uint64_t>(stride_h * kElement);
  r.strides[1] = static_cast<std::uint64_t>(stride_t * kElement);
  r.box[0] = box_columns;
  r.box[1] = 1;
  r.box[2] = kGdnPrefillChunk;
  r.swizzle_bytes = swizzle_bytes;
  if (!tensor_map_refusal(r).empty()) return std::nullopt;
  return slot;
}

}  // namespace

InputTensorMaps input_tensor_maps(GdnPrefillParams& p, const Problem& pr, const Choice& choice) {
  InputTensorMaps maps;
  if (!ws_boxes_possible(pr, choice) || pr.qkv != DType::bf16) return maps;
  // 64 columns with 128-byte swizzle: a box is one of the stages' sw128 slices.
  const std::optional<TensorMapSlot> q =
      bf16_box_map(&p.q_map, p.q, pr.heads, pr.tokens, p.q_stride_t, p.q_stride_h, 64, 128);
  const std::optional<TensorMapSlot> k =
      bf16_box_map(&p.k_map, p.k, pr.heads, pr.tokens, p.k_stride_t, p.k_stride_h, 64, 128);
  const std::optional<TensorMapSlot> v =
      bf16_box_map(&p.v_map, p.v, pr.value_heads, pr.tokens, p.v_stride_t, p.v_stride_h, 64, 128);
  if (!q || !k || !v) return maps;  // all three or none: the kernel has one copy path
  maps.slots[0] = *q;
  maps.slots[1] = *k;
  maps.slots[2] = *v;
  maps.count = 3;
  return maps;
}

std::optional<TensorMapSlot> output_tensor_map(GdnPrefillParams& p, const Problem& pr,
                                               const Choice& choice) {
  if (!ws_boxes_possible(pr, choice) || pr.out != DType::bf16) return std::nullopt;
  // A state warp's 16 values (32-byte rows, 32-byte swizzle).
  return bf16_box_map(&p.out_map, p.out, pr.value_heads, pr.tokens, p.out_stride_t, p.out_stride_h,
                      16, 32);
}

void Family::attach_tensor_maps(GdnPrefillParams& p, const Problem& pr, const Choice& choice,
                                Runtime& runtime) {
  p.tma_inputs = 0;
  p.tma_out = 0;
  const Settings& settings = runtime.settings();
  if (settings.tensor_map_loads) {
    const InputTensorMaps maps = input_tensor_maps(p, pr, choice);
    bool encoded = maps.count > 0;
    for (int i = 0; i < maps.count && encoded; ++i) {
      encoded = runtime.encode_tensor_map(maps.slots[i].request, maps.slots[i].map);
    }
    p.tma_inputs = encoded ? 1 : 0;
  }
  if (settings.tensor_map_stores) {
    if (const std::optional<TensorMapSlot> slot = output_tensor_map(p, pr, choice)) {
      p.tma_out = runtime.encode_tensor_map(slot->request, slot->map) ? 1 : 0;
    }
  }
}

GdnPrefillParams Family::params(const Args& args, const Problem& pr, const Choice& choice,
                                void* workspace) {
  const TensorView& q = *args.q;
  const TensorView& k = *args.k;
  const TensorView& v = *args.v;
  const GdnGates& gates = *args.gates;
  const TensorView& has_initial_state = *args.has_initial_state;
  const TensorView& out = *args.out;
  const GdnPrefillOptions& options = *args.options;
  const bool ckpt = options.checkpoint_every_n_tokens > 0;
  const bool raw = gates.kind == GdnGateKind::raw;
  // Every launch of the plan (one fused kernel, or the chunked path's two or four) takes this
  // one block.
  GdnPrefillParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.a = gates.a.data;
  p.b = gates.b.data;
  p.a_log = raw ? gates.a_log.data : nullptr;
  p.dt_bias = raw ? gates.dt_bias.data : nullptr;
  p.cu_seqlens = args.cu_seqlens->data;
  p.state_indices = args.state_indices->data;
  p.has_initial_state = static_cast<const unsigned char*>(has_initial_state.data);
  p.state = args.state->data;
  p.final_state = options.final_state.data;
  p.out = out.data;
  p.checkpoints = ckpt ? options.state_checkpoints.data : nullptr;
  p.checkpoint_starts =
      ckpt ? static_cast<const std::int64_t*>(options.checkpoint_cu_starts.data) : nullptr;
  p.q_stride_t = q.strides[0];
  p.q_stride_h = q.strides[1];
  p.k_stride_t = k.strides[0];
  p.k_stride_h = k.strides[1];
  p.v_stride_t = v.strides[0];
  p.v_stride_h = v.strides[1];
  p.a_stride_t = gates.a.strides[0];
  p.b_stride_t = gates.b.strides[0];
  p.out_stride_t = out.strides[0];
  p.out_stride_h = out.strides[1];
  p.state_slot_stride = args.state->strides[0];
  p.final_seq_stride = options.final_state.data != nullptr ? options.final_state.strides[0] : 0;
  p.index_stride = args.state_indices->strides[0];
  p.has_init_stride = has_initial_state.data != nullptr ? has_initial_state.strides[0] : 0;
  p.num_slots = args.state->shape[0];
  p.ckpt_slot_stride = ckpt ? options.state_checkpoints.strides[0] : 0;
  p.ckpt_rows = ckpt ? options.state_checkpoints.shape[0] : 0;
  p.ckpt_every_chunks = ckpt ? options.checkpoint_every_n_tokens / kGdnPrefillChunk : 0;
  p.num_seqs = static_cast<u32>(pr.seqs);
  p.num_value_heads = static_cast<u32>(pr.value_heads);
  p.heads_per_group = static_cast<u32>(pr.value_heads / pr.heads);
  p.v_tiles = static_cast<u32>(pr.v / choice.bv);
  p.scale = options.scale > 0.0f ? options.scale
                                 : static_cast<float>(1.0 / std::sqrt(static_cast<double>(pr.k)));
  p.softplus_threshold = options.softplus_threshold;
  p.num_heads = static_cast<u32>(pr.heads);
  p.num_tokens = pr.tokens;
  const bool cp = choice.path == Path::context_parallel;
  if (cp) {
    p.k_tiles = static_cast<u32>(pr.k / choice.bv);
    p.cp_segment_chunks = choice.cp_chunks;
    // This call's segment ids (its T, not the T of the call that made the memoized plan).
    p.cp_segments = cp_segments(pr, choice.cp_chunks);
  }
  // The fused and warp-specialized kernels keep every chunk's rows on chip: no workspace (the
  // latter's blocks rank up to kGdnPrefillRankInStateMaxSeqs sequences themselves, state_work).
  if (!uses_workspace(choice.path)) return p;

  // The chunked paths: the caller's workspace, else the runtime's (stream-ordered, freed on the
  // stream after the launches; under capture graph memory nodes). The context-parallel path's
  // regions follow the chunked path's.
  const GdnPrefillWorkspace ws = gdn_prefill_workspace(static_cast<std::uint64_t>(pr.tokens),
                                                       static_cast<std::uint64_t>(pr.value_heads));
  auto* base =
      static_cast<unsigned char*>(pr.caller_workspace ? options.workspace.data : workspace);
  p.ws_t = base != nullptr ? base + ws.t : nullptr;
  p.ws_p = base != nullptr ? base + ws.p : nullptr;
  p.ws_scales = base != nullptr ? base + ws.scales : nullptr;
  p.ws_order = base != nullptr && orders_longest_first(pr) ? base + ws.order : nullptr;
  if (cp && base != nullptr) {
    const GdnPrefillCpWorkspace cw = gdn_prefill_cp_workspace(
        ws.total, static_cast<std::uint64_t>(p.cp_segments),
        static_cast<std::uint64_t>(pr.value_heads), static_cast<std::uint64_t>(pr.k),
        static_cast<std::uint64_t>(pr.v));
    p.cp_b = reinterpret_cast<float*>(base + cw.b);
    p.cp_m = reinterpret_cast<float*>(base + cw.m);
    p.cp_x = reinterpret_cast<float*>(base + cw.x);
    // The segment and resume passes find sequences by their offsets, not by rank.
    p.ws_order = nullptr;
  }
  return p;
}

}  // namespace ops::prefill

std::vector<std::int64_t> gdn_prefill_checkpoint_starts(std::span<const std::int64_t> cu_seqlens,
                                                        std::int64_t every) {
  if (every <= 0 || every % kGdnPrefillChunk != 0) {
    throw InvalidArgument(fmt::format(
        "gdn_prefill_checkpoint_starts: every = {}; accepted: a positive multiple of {} (the "
        "kernel's chunk)",
        every, kGdnPrefillChunk));
  }
  if (cu_seqlens.empty()) {
    throw InvalidArgument(
        "gdn_prefill_checkpoint_starts: cu_seqlens is empty; accepted: N + 1 >= 1 offsets");
  }
  std::vector<std::int64_t> starts(cu_seqlens.size());
  starts[0] = 0;
  for (std::size_t i = 1; i < cu_seqlens.size(); ++i) {
    const std::int64_t length = cu_seqlens[i] - cu_seqlens[i - 1];
    if (length < 0) {
      throw InvalidArgument(fmt::format(
          "gdn_prefill_checkpoint_starts: cu_seqlens[{}] = {} < cu_seqlens[{}] = {}; accepted: "
          "non-decreasing offsets",
          i, cu_seqlens[i], i - 1, cu_seqlens[i - 1]));
    }
    starts[i] = starts[i - 1] + length / every;
  }
  return starts;
}

Plan plan_gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                      const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                      const TensorView& state_indices, const TensorView& has_initial_state,
                      const TensorView& out, const GdnPrefillOptions& options,
                      const DeviceLimits& device) {
  const ops::prefill::Args args{
      &q, &k, &v, &gates, &cu_seqlens, &state, &state_indices, &has_initial_state, &out, &options};
  const ops::prefill::Problem pr = ops::prefill::Family::check(args);
  ops::Planned<ops::prefill::Choice> planned = ops::prefill::Family::plan(pr, device);
  Plan& plan = planned.plan;
  // The workspace of this call's T (not part of the memoized plans, which T does not key).
  if (!plan.launches.empty() && ops::prefill::uses_workspace(planned.choice.path)) {
    const bool cp = planned.choice.path == ops::prefill::Path::context_parallel;
    plan.reasons.push_back(
        fmt::format("workspace for T = {}: {} bytes", pr.tokens,
                    cp ? ops::prefill::cp_workspace_bytes(pr, planned.choice.cp_chunks)
                       : gdn_prefill_workspace_bytes(pr.tokens, pr.value_heads)));
  }
  return std::move(plan);
}

std::int64_t gdn_prefill_workspace_bytes(std::int64_t tokens, std::int64_t value_heads) {
  if (tokens < 0 || value_heads < 0) {
    throw InvalidArgument(fmt::format(
        "gdn_prefill_workspace_bytes: tokens = {}, value_heads = {}; accepted: both >= 0", tokens,
        value_heads));
  }
  return static_cast<std::int64_t>(gdn_prefill_workspace(static_cast<std::uint64_t>(tokens),
                                                         static_cast<std::uint64_t>(value_heads))
                                       .total);
}

void gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                 const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                 const TensorView& state_indices, const TensorView& has_initial_state,
                 const TensorView& out, const GdnPrefillOptions& options, Stream stream) {
  const ops::prefill::Args args{
      &q, &k, &v, &gates, &cu_seqlens, &state, &state_indices, &has_initial_state, &out, &options};
  ops::prefill::Problem pr = ops::prefill::check_arguments(args);
  if (ops::prefill::Family::launches_nothing(pr)) return;
  const bool ckpt = options.checkpoint_every_n_tokens > 0;
  // Planning accepts null pointers; a launch needs real ones (an empty checkpoint tensor may
  // stay null: no row is ever written).
  if (ckpt && options.checkpoint_cu_starts.data == nullptr) {
    ops::prefill::fail(
        "options.checkpoint_cu_starts has a null data pointer; accepted: a device pointer");
  }
  if (ckpt && options.state_checkpoints.data == nullptr && options.state_checkpoints.shape[0] > 0) {
    ops::prefill::fail(fmt::format(
        "options.state_checkpoints has a null data pointer and {} rows; accepted: a device "
        "pointer, or 0 rows",
        options.state_checkpoints.shape[0]));
  }
  ops::prefill::parse_mode(pr, options.force_mode);
  ops::run<ops::prefill::Family>(args, pr, {options.device, options.runtime}, stream);
}

}  // namespace kjit
