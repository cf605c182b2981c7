// SPDX-License-Identifier: Apache-2.0
#include "ops.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>

#include "cli.hpp"
#include "kjit/error.hpp"
#include "kjit/types.hpp"

#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"

namespace kjit::tool {
namespace {

/// Hands out distinct, 4 KiB-aligned, non-overlapping fake device addresses: the planners
/// inspect alignment (which picks vector widths) and may check overlap, never the memory.
class FakeMemory {
 public:
  TensorView tensor(DType dtype, std::initializer_list<std::int64_t> shape) {
    std::uint64_t bytes = size_of(dtype);
    for (std::int64_t dim : shape) bytes *= static_cast<std::uint64_t>(dim < 1 ? 1 : dim);
    void* data = reinterpret_cast<void*>(next_);
    next_ += (bytes + 2 * kAlign - 1) / kAlign * kAlign;
    return TensorView::contiguous(data, dtype, shape);
  }
  /// A view with data == nullptr (an optional output left out).
  static TensorView none(DType dtype, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, dtype, shape);
  }

 private:
  static constexpr std::uint64_t kAlign = 4096;
  std::uint64_t next_ = std::uint64_t{1} << 32;
};

OpParam size(std::string name, std::string representative, std::string doc, SizeRule rule = {}) {
  return OpParam{std::move(name),           true,           "",
                 std::move(representative), std::move(doc), std::move(rule)};
}
OpParam option(std::string name, std::string fallback, std::string doc) {
  std::string representative = fallback;
  return OpParam{std::move(name),           false,          std::move(fallback),
                 std::move(representative), std::move(doc), {}};
}

// Problem sizes that a running engine meets as 0 (an empty batch) plan as "nothing launched";
// model dimensions (heads, head dims) of 0 are mistakes and are refused by name.
SizeRule at_least(std::int64_t min) { return SizeRule{.min = min}; }
SizeRule multiple_in(std::int64_t multiple, std::int64_t min, std::int64_t max) {
  return SizeRule{.min = min, .max = max, .multiple = multiple};
}
SizeRule one_of(std::vector<std::int64_t> values) {
  return SizeRule{.min = values.front(), .max = values.back(), .only = std::move(values)};
}
SizeRule dividing(std::string other) { return SizeRule{.divides = std::move(other)}; }

std::vector<OpParam> merge_state_params(bool states) {
  std::vector<OpParam> params = {
      size("tokens", "1,7,64,512,4096,32768,262144", "tokens T", at_least(0)),
      size("heads", "", "heads H"),
      size("head_dim", "", "head dim D (multiple of 8, 8..1024)", multiple_in(8, 8, 1024)),
      option("dtype", "bf16", "dtype of the partial outputs v"),
      option("out_dtype", "=dtype", "dtype of v_out (v's dtype or f32)"),
      option("lse_base", "e", "base of the LSEs: e or 2"),
      option("layout", "token_major", "LSE layout: token_major or head_major"),
      option("pos_inf_empty", "1", "1: an LSE of +inf marks an empty state"),
      option("mode", "", "force a grid mode (token_major, flat)"),
  };
  // A manifest covers both LSE bases unless it names one: they are distinct kernels.
  params[5].representative = "e,2";
  if (states) params.insert(params.begin() + 1, size("states", "2,3,4,8", "states S"));
  return params;
}

std::vector<OpParam> gdn_decode_params() {
  return {
      size("batch", "1,2,8,64,256,1024,4096,16384", "rows B",
           SizeRule{.min = 1, .max = std::int64_t{1} << 24}),
      size("heads", "", "q/k heads H", dividing("v_heads")),
      size("v_heads", "", "value heads HV (a multiple of H)"),
      size("k", "", "key head dim K (multiple of 16, 16..256)", multiple_in(16, 16, 256)),
      size("v", "", "value head dim V (multiple of 16, 16..256)", multiple_in(16, 16, 256)),
      option("dtype", "bf16", "dtype of mixed_qkv"),
      option("gate_dtype", "=dtype", "dtype of a and b"),
      option("a_log_dtype", "f32", "dtype of A_log"),
      option("dt_bias_dtype", "=dtype", "dtype of dt_bias"),
      option("state_dtype", "f32", "dtype of the state pool"),
      option("out_dtype", "=dtype", "dtype of out"),
      option("index_dtype", "i32", "dtype of state_indices (i32, i64)"),
      option("gated", "0", "1: precomputed f32 g and beta (gdn_decode_gated)"),
      option("l2norm", "1", "1: L2-normalize q and k"),
      option("invalid", "negative", "invalid state indices: negative or nonpositive"),
      option("mode", "", "force a grid mode (flat, split, folded)"),
      option("row_order", "auto",
             "row order: auto (slot order from 512 MiB of state), by_slot, as_given"),
  };
}

std::vector<OpParam> gdn_prefill_params() {
  return {
      size("tokens", "1,64,1000,8192,65536", "tokens T over all sequences", at_least(0)),
      size("seqs", "1,4,64", "sequences N", at_least(0)),
      size("heads", "", "q/k heads H", dividing("v_heads")),
      size("v_heads", "", "value heads HV (a multiple of H)"),
      size("k", "", "key head dim K (64, 128, 256)", one_of({64, 128, 256})),
      size("v", "", "value head dim V (64, 128, 256)", one_of({64, 128, 256})),
      option("dtype", "bf16", "dtype of q, k, v (bf16, f16)"),
      option("gate_dtype", "=dtype", "dtype of a and b (raw gates)"),
      option("param_dtype", "f32", "dtype of A_log and dt_bias"),
      option("state_dtype", "f32", "dtype of the state pool (f32, bf16)"),
      option("out_dtype", "=dtype", "dtype of out"),
      option("cu_dtype", "i32", "dtype of cu_seqlens (i32, i64)"),
      option("index_dtype", "i32", "dtype of state_indices (i32, i64)"),
      option("gated", "0", "1: precomputed f32 g and beta"),
      option("l2norm", "1", "1: L2-normalize q and k"),
      option("mode", "",
             "force a path and value tile (bv64, bv32, bv16: fused; chunked, chunked_bv128 .. "
             "_bv16; a chunked mode + _wgmma: sm_90a warpgroup MMA; chunked_cp or chunked_cp<L>: "
             "context-parallel, segments of L chunks, optionally + _s2/_s3 input stages)"),
      option("checkpoint", "0",
             "state checkpoints every this many tokens (a multiple of 64; 0: none)"),
  };
}

std::vector<OpParam> causal_conv1d_params(bool update) {
  std::vector<OpParam> params = {
      size("dim", "", "channels D (multiple of 8, 8..2^20)",
           multiple_in(8, 8, std::int64_t{1} << 20)),
      option("width", "4", "taps W (2..8)"),
      option("dtype", "bf16", "dtype of x"),
      option("out_dtype", "=dtype", "dtype of out"),
      option("weight_dtype", "=dtype", "dtype of weight and bias (x's or f32)"),
      option("state_dtype", "=dtype", "dtype of the conv-state pool"),
      option("index_dtype", "i32", "dtype of state_indices (and cu_seqlens, num_accepted_tokens)"),
      option("silu", "1", "1: SiLU activation"),
      option("in_place", "0", "1: out is x"),
      option("mode", "", update ? "force a mode (rows)" : "force a mode (chunked, sequential)"),
  };
  if (update) {
    params.insert(params.begin(), size("batch", "1,32,256,2048,70000", "rows B",
                                       SizeRule{.min = 0, .max = (std::int64_t{1} << 31) - 1}));
    params.insert(params.begin() + 1, size("steps", "1,2,4", "tokens per row S (>1: speculative)",
                                           SizeRule{.min = 1, .max = 1024}));
    params.push_back(option("spec", "0", "1: num_accepted_tokens given (pool L = W - 2 + S)"));
  } else {
    params.insert(params.begin(),
                  size("tokens", "1,64,1000,8192,131072", "tokens T over all sequences",
                       SizeRule{.min = 0, .max = (std::int64_t{1} << 31) - 1}));
    params.insert(params.begin() + 1, size("seqs", "1,16,256", "sequences N",
                                           SizeRule{.min = 0, .max = std::int64_t{1} << 24}));
  }
  return params;
}

// Sizes up to 2^62, so that n + 1 stays inside int64; products of sizes are checked where the
// tool forms them (row_width), and TensorView::contiguous checks element counts.
constexpr std::int64_t kMaxToolSize = std::int64_t{1} << 62;

std::int64_t get_int(const ShapeValues& values, const std::string& name) {
  const std::int64_t value = parse_int(values.at(name), name);
  if (value < 0 || value > kMaxToolSize) {
    throw UsageError(fmt::format("{} = {} is out of range; accepted: 0 to 2^62 ({})", name, value,
                                 kMaxToolSize));
  }
  return value;
}

// Elements of one mixed_qkv row, 2*H*K + HV*V, or a UsageError when that overflows int64 (the
// planner would refuse such a shape anyway, but only after the tool had formed it).
std::int64_t row_width(std::int64_t h, std::int64_t k, std::int64_t hv, std::int64_t v) {
  std::int64_t qk = 0, values = 0, width = 0;
  if (__builtin_mul_overflow(h, k, &qk) || __builtin_mul_overflow(qk, std::int64_t{2}, &qk) ||
      __builtin_mul_overflow(hv, v, &values) || __builtin_add_overflow(qk, values, &width)) {
    throw UsageError(fmt::format(
        "a mixed_qkv row of 2*H*K + HV*V elements overflows int64 (H = {}, K = {}, HV = {}, "
        "V = {})",
        h, k, hv, v));
  }
  return width;
}
DType get_dtype(const ShapeValues& values, const std::string& name) {
  return parse_dtype(values.at(name), name);
}
bool get_bool(const ShapeValues& values, const std::string& name) {
  const std::string& text = values.at(name);
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  throw UsageError(fmt::format("{} must be 0 or 1, got '{}'", name, text));
}

MergeStateOptions merge_options(const ShapeValues& values) {
  MergeStateOptions options;
  const std::string& base = values.at("lse_base");
  if (base == "e") {
    options.lse_base = LseBase::e;
  } else if (base == "2" || base == "two") {
    options.lse_base = LseBase::two;
  } else {
    throw UsageError(fmt::format("lse_base must be e or 2, got '{}'", base));
  }
  const std::string& layout = values.at("layout");
  if (layout == "token_major") {
    options.lse_layout = LseLayout::token_major;
  } else if (layout == "head_major") {
    options.lse_layout = LseLayout::head_major;
  } else {
    throw UsageError(fmt::format("layout must be token_major or head_major, got '{}'", layout));
  }
  options.pos_inf_as_empty = get_bool(values, "pos_inf_empty");
  options.force_mode = values.at("mode");
  return options;
}

Plan plan_merge(const std::string& op, const ShapeValues& values, const DeviceLimits& device) {
  const MergeStateOptions options = merge_options(values);
  const std::int64_t t = get_int(values, "tokens");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t d = get_int(values, "head_dim");
  const DType in = get_dtype(values, "dtype");
  const DType out = get_dtype(values, "out_dtype");
  const bool token_major = options.lse_layout == LseLayout::token_major;
  FakeMemory memory;
  auto lse = [&](std::int64_t tokens, std::int64_t heads) {
    return token_major ? memory.tensor(DType::f32, {tokens, heads})
                       : memory.tensor(DType::f32, {heads, tokens});
  };
  if (op == "merge_states") {
    const std::int64_t s = get_int(values, "states");
    const TensorView v = memory.tensor(in, {t, s, h, d});
    const TensorView lse_in =
        token_major ? memory.tensor(DType::f32, {t, s, h}) : memory.tensor(DType::f32, {h, t, s});
    return plan_merge_states(v, lse_in, memory.tensor(out, {t, h, d}), lse(t, h), options, device);
  }
  const TensorView v_a = memory.tensor(in, {t, h, d});
  const TensorView s_a = lse(t, h);
  const TensorView v_b = memory.tensor(in, {t, h, d});
  const TensorView s_b = lse(t, h);
  if (op == "merge_state_in_place") {
    return plan_merge_state_in_place(v_a, s_a, v_b, s_b, FakeMemory::none(DType::u8, {t}), options,
                                     device);
  }
  return plan_merge_state(v_a, s_a, v_b, s_b, memory.tensor(out, {t, h, d}), lse(t, h), options,
                          device);
}

Plan plan_decode(const ShapeValues& values, const DeviceLimits& device) {
  const std::int64_t b = get_int(values, "batch");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hv = get_int(values, "v_heads");
  const std::int64_t k = get_int(values, "k");
  const std::int64_t v = get_int(values, "v");
  GdnDecodeOptions options;
  options.l2norm_qk = get_bool(values, "l2norm");
  const std::string& invalid = values.at("invalid");
  if (invalid == "negative") {
    options.invalid_index = GdnInvalidIndex::negative;
  } else if (invalid == "nonpositive") {
    options.invalid_index = GdnInvalidIndex::nonpositive;
  } else {
    throw UsageError(fmt::format("invalid must be negative or nonpositive, got '{}'", invalid));
  }
  options.force_mode = values.at("mode");
  const std::string& row_order = values.at("row_order");
  if (row_order == "by_slot") {
    options.row_order = GdnRowOrder::by_slot;
  } else if (row_order == "as_given") {
    options.row_order = GdnRowOrder::as_given;
  } else if (row_order != "auto") {
    throw UsageError(
        fmt::format("row_order must be auto, by_slot or as_given, got '{}'", row_order));
  }
  FakeMemory memory;
  const TensorView qkv = memory.tensor(get_dtype(values, "dtype"), {b, row_width(h, k, hv, v)});
  const TensorView state = memory.tensor(get_dtype(values, "state_dtype"), {b + 1, hv, v, k});
  const TensorView indices = memory.tensor(get_dtype(values, "index_dtype"), {b});
  const TensorView out = memory.tensor(get_dtype(values, "out_dtype"), {b, hv, v});
  if (get_bool(values, "gated")) {
    const TensorView g = memory.tensor(DType::f32, {b, hv});
    const TensorView beta = memory.tensor(DType::f32, {b, hv});
    return plan_gdn_decode_gated(qkv, g, beta, state, indices, out, options, device);
  }
  const DType gate = get_dtype(values, "gate_dtype");
  const TensorView a = memory.tensor(gate, {b, hv});
  const TensorView bt = memory.tensor(gate, {b, hv});
  const TensorView a_log = memory.tensor(get_dtype(values, "a_log_dtype"), {hv});
  const TensorView dt_bias = memory.tensor(get_dtype(values, "dt_bias_dtype"), {hv});
  return plan_gdn_decode(qkv, a, bt, a_log, dt_bias, state, indices, out, options, device);
}

Plan plan_prefill(const ShapeValues& values, const DeviceLimits& device) {
  const std::int64_t t = get_int(values, "tokens");
  const std::int64_t n = get_int(values, "seqs");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hv = get_int(values, "v_heads");
  const std::int64_t k = get_int(values, "k");
  const std::int64_t v = get_int(values, "v");
  const DType dtype = get_dtype(values, "dtype");
  GdnPrefillOptions options;
  options.l2norm_qk = get_bool(values, "l2norm");
  options.force_mode = values.at("mode");
  FakeMemory memory;
  const TensorView q = memory.tensor(dtype, {t, h, k});
  const TensorView kk = memory.tensor(dtype, {t, h, k});
  const TensorView vv = memory.tensor(dtype, {t, hv, v});
  GdnGates gates;
  if (get_bool(values, "gated")) {
    gates = GdnGates::precomputed(memory.tensor(DType::f32, {t, hv}),
                                  memory.tensor(DType::f32, {t, hv}));
  } else {
    const DType gate = get_dtype(values, "gate_dtype");
    const DType param = get_dtype(values, "param_dtype");
    gates = GdnGates::raw(memory.tensor(gate, {t, hv}), memory.tensor(gate, {t, hv}),
                          memory.tensor(param, {hv}), memory.tensor(param, {hv}));
  }
  const TensorView cu = memory.tensor(get_dtype(values, "cu_dtype"), {n + 1});
  const TensorView state = memory.tensor(get_dtype(values, "state_dtype"), {n + 1, hv, v, k});
  const TensorView indices = memory.tensor(get_dtype(values, "index_dtype"), {n});
  const TensorView has_initial = FakeMemory::none(DType::u8, {n});
  const TensorView out = memory.tensor(get_dtype(values, "out_dtype"), {t, hv, v});
  options.checkpoint_every_n_tokens = get_int(values, "checkpoint");
  if (options.checkpoint_every_n_tokens > 0) {
    // The most rows the call could write: every token of one sequence checkpointed.
    const std::int64_t rows = t / options.checkpoint_every_n_tokens + 1;
    options.state_checkpoints = memory.tensor(state.dtype, {rows, hv, v, k});
    options.checkpoint_cu_starts = memory.tensor(DType::i64, {n + 1});
  }
  return plan_gdn_prefill(q, kk, vv, gates, cu, state, indices, has_initial, out, options, device);
}

Plan plan_conv(bool update, const ShapeValues& values, const DeviceLimits& device) {
  const std::int64_t d = get_int(values, "dim");
  const std::int64_t w = get_int(values, "width");
  const DType dtype = get_dtype(values, "dtype");
  const DType weight_dtype = get_dtype(values, "weight_dtype");
  const DType index = get_dtype(values, "index_dtype");
  CausalConv1dOptions options;
  options.activation = get_bool(values, "silu") ? ConvActivation::silu : ConvActivation::none;
  options.force_mode = values.at("mode");
  const bool in_place = get_bool(values, "in_place");
  FakeMemory memory;
  const TensorView weight = memory.tensor(weight_dtype, {d, w});
  const TensorView bias = memory.tensor(weight_dtype, {d});
  if (update) {
    const std::int64_t b = get_int(values, "batch");
    const std::int64_t s = get_int(values, "steps");
    const bool spec = get_bool(values, "spec");
    const TensorView x = memory.tensor(dtype, {b, s, d});
    const TensorView out = in_place ? x : memory.tensor(get_dtype(values, "out_dtype"), {b, s, d});
    const TensorView pool =
        memory.tensor(get_dtype(values, "state_dtype"), {b + 1, d, spec ? w - 2 + s : w - 1});
    const TensorView indices = memory.tensor(index, {b});
    const TensorView accepted = spec ? memory.tensor(index, {b}) : FakeMemory::none(index, {b});
    return plan_causal_conv1d_update(x, weight, bias, pool, indices, accepted, out, options,
                                     device);
  }
  const std::int64_t t = get_int(values, "tokens");
  const std::int64_t n = get_int(values, "seqs");
  const TensorView x = memory.tensor(dtype, {t, d});
  const TensorView out = in_place ? x : memory.tensor(get_dtype(values, "out_dtype"), {t, d});
  const TensorView pool = memory.tensor(get_dtype(values, "state_dtype"), {n + 1, d, w - 1});
  return plan_causal_conv1d(x, weight, bias, pool, memory.tensor(index, {n + 1}),
                            memory.tensor(index, {n}), FakeMemory::none(DType::u8, {n}), out,
                            options, device);
}

}  // namespace

bool SizeRule::accepts(std::int64_t value, const std::int64_t* divided) const {
  if (value < min || value > max || value % multiple != 0) return false;
  if (!only.empty() && std::find(only.begin(), only.end(), value) == only.end()) return false;
  if (!divides.empty() && divided != nullptr && (value == 0 || *divided % value != 0)) {
    return false;
  }
  return true;
}

std::string SizeRule::text() const {
  if (!only.empty()) return fmt::format("one of {}", fmt::join(only, ", "));
  std::string out;
  if (multiple > 1) {
    out = fmt::format("a multiple of {} in {}..{}", multiple, min, max);
  } else if (max < (std::int64_t{1} << 62)) {
    out = fmt::format("in {}..{}", min, max);
  } else {
    out = fmt::format(">= {}", min);
  }
  if (!divides.empty()) out += fmt::format(", dividing {}", divides);
  return out;
}

const std::vector<OpInfo>& known_ops() {
  static const std::vector<OpInfo> ops = {
      {"merge_state", merge_state_params(false),
       "merge two partial attention states (v_a, s_a) + (v_b, s_b) -> (v_out, s_out)"},
      {"merge_state_in_place", merge_state_params(false),
       "merge (v_other, s_other) into (v, s) in place"},
      {"merge_states", merge_state_params(true), "merge S partial states per (token, head)"},
      {"gdn_decode", gdn_decode_params(), "Gated DeltaNet decode step over a state pool"},
      {"gdn_prefill", gdn_prefill_params(), "Gated DeltaNet chunked varlen prefill"},
      {"causal_conv1d", causal_conv1d_params(false),
       "causal depthwise conv1d, varlen prefill over a conv-state pool"},
      {"causal_conv1d_update", causal_conv1d_params(true),
       "causal depthwise conv1d decode / speculative update over a conv-state pool"},
  };
  return ops;
}

const OpInfo& find_op(std::string_view name) {
  std::string names;
  for (const OpInfo& op : known_ops()) {
    if (op.name == name) return op;
    names += names.empty() ? op.name : ", " + op.name;
  }
  throw UsageError(fmt::format("unknown op '{}'; known: {}", name, names));
}

ShapeValues complete_values(const OpInfo& op, ShapeValues values, bool require_sizes) {
  const auto is_param = [&](std::string_view name) {
    return std::any_of(op.params.begin(), op.params.end(),
                       [&](const OpParam& param) { return param.name == name; });
  };
  for (const auto& [key, value] : values) {
    if (!is_param(key)) {
      std::string accepted;
      for (const OpParam& param : op.params) {
        accepted += (accepted.empty() ? "" : ", ") + param.name;
      }
      throw UsageError(
          fmt::format("{} has no parameter '{}'; accepted: {}", op.name, key, accepted));
    }
  }
  for (const OpParam& param : op.params) {
    if (values.count(param.name)) continue;
    if (param.size) {
      if (require_sizes) {
        std::string flag = param.name;
        for (char& c : flag) c = c == '_' ? '-' : c;
        throw UsageError(fmt::format("{} needs --{} ({})", op.name, flag, param.doc));
      }
      continue;
    }
    values[param.name] = param.fallback;
  }
  // A default (or manifest representative) of "=other" takes the value of parameter `other`
  // ("--out-dtype [=dtype]"). A value naming no parameter is literal ("--dtype ==x",
  // "v_heads==128") and fails later as a clear error about its own argument.
  for (auto& [key, value] : values) {
    if (!value.starts_with('=')) continue;
    const std::string other = value.substr(1);
    if (!is_param(other)) continue;
    auto referred = values.find(other);
    if (referred != values.end() && !referred->second.starts_with('=')) {
      value = referred->second;
    }
  }
  return values;
}

Plan plan_op(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device) {
  // Sizes out of their range are named here: the op, seeing tensors built from them, could
  // only report a consequence (heads = 0 makes zero-stride outputs that "overlap").
  for (const OpParam& param : op.params) {
    const auto it = values.find(param.name);
    if (!param.size || it == values.end()) continue;
    const std::int64_t value = parse_int(it->second, param.name);
    if (value < param.rule.min || value > param.rule.max) {
      throw UsageError(fmt::format("{}: {} = {} is out of range; {} must be {}", op.name,
                                   param.name, value, param.name, param.rule.text()));
    }
  }
  if (op.name.starts_with("merge_state")) return plan_merge(op.name, values, device);
  if (op.name == "gdn_decode") return plan_decode(values, device);
  if (op.name == "gdn_prefill") return plan_prefill(values, device);
  if (op.name == "causal_conv1d") return plan_conv(false, values, device);
  if (op.name == "causal_conv1d_update") return plan_conv(true, values, device);
  throw UsageError(fmt::format("op '{}' has no planner in the tool", op.name));
}

}  // namespace kjit::tool
