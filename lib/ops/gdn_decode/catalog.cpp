// SPDX-License-Identifier: Apache-2.0
// gdn_decode in the op catalog (kjit/catalog.hpp).
#include <fmt/format.h>

#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit::catalog_detail {
namespace {

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

// Elements of one mixed_qkv row, 2*H*K + HV*V, or an InvalidArgument when that overflows int64
// (the planner would refuse such a shape anyway, but only after the catalog had formed it).
std::int64_t row_width(std::int64_t h, std::int64_t k, std::int64_t hv, std::int64_t v) {
  std::int64_t qk = 0, values = 0, width = 0;
  if (__builtin_mul_overflow(h, k, &qk) || __builtin_mul_overflow(qk, std::int64_t{2}, &qk) ||
      __builtin_mul_overflow(hv, v, &values) || __builtin_add_overflow(qk, values, &width)) {
    throw InvalidArgument(fmt::format(
        "a mixed_qkv row of 2*H*K + HV*V elements overflows int64 (H = {}, K = {}, HV = {}, "
        "V = {})",
        h, k, hv, v));
  }
  return width;
}

/// The options both decode steps read from their shape values: the q/k norm and the index rule.
GdnDecodeOptions step_options(const ShapeValues& values) {
  GdnDecodeOptions options;
  options.l2norm_qk = get_bool(values, "l2norm");
  const std::string& invalid = values.at("invalid");
  if (invalid == "negative") {
    options.invalid_index = GdnInvalidIndex::negative;
  } else if (invalid == "nonpositive") {
    options.invalid_index = GdnInvalidIndex::nonpositive;
  } else {
    throw InvalidArgument(
        fmt::format("invalid must be negative or nonpositive, got '{}'", invalid));
  }
  return options;
}

/// Plans either step (options.conv decides which) on fake tensors of the shape values: mixed_qkv,
/// a pool of B + 1 slots, indices, out and the gates of the form. `memory` also holds any conv
/// tensors the caller made, so that no two fake tensors overlap.
Plan plan_step(const ShapeValues& values, FakeMemory& memory, const GdnDecodeOptions& options,
               const DeviceLimits& device) {
  const std::int64_t b = get_int(values, "batch");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hv = get_int(values, "v_heads");
  const std::int64_t k = get_int(values, "k");
  const std::int64_t v = get_int(values, "v");
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

Plan plan_decode(const OpInfo&, const ShapeValues& values, const DeviceLimits& device) {
  GdnDecodeOptions options = step_options(values);
  options.force_mode = values.at("mode");
  const std::string& row_order = values.at("row_order");
  if (row_order == "by_slot") {
    options.row_order = GdnRowOrder::by_slot;
  } else if (row_order == "as_given") {
    options.row_order = GdnRowOrder::as_given;
  } else if (row_order != "auto") {
    throw InvalidArgument(
        fmt::format("row_order must be auto, by_slot or as_given, got '{}'", row_order));
  }
  FakeMemory memory;
  return plan_step(values, memory, options, device);
}

/// The fused decode step (gdn_decode with options.conv): gdn_decode's shapes and dtypes without
/// its forcing options, and the convolution's.
std::vector<OpParam> gdn_decode_conv_params() {
  std::vector<OpParam> params = gdn_decode_params();
  std::erase_if(params, [](const OpParam& p) { return p.name == "mode" || p.name == "row_order"; });
  params.push_back(option("width", "4", "conv taps W (2..8)"));
  params.push_back(option("weight_dtype", "=dtype", "dtype of the conv weight and bias"));
  params.push_back(option("conv_state_dtype", "=dtype", "dtype of the conv-state pool"));
  params.push_back(option("silu", "1", "1: SiLU on the conv output"));
  return params;
}

Plan plan_decode_conv(const OpInfo&, const ShapeValues& values, const DeviceLimits& device) {
  const std::int64_t b = get_int(values, "batch");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hv = get_int(values, "v_heads");
  const std::int64_t k = get_int(values, "k");
  const std::int64_t v = get_int(values, "v");
  const std::int64_t w = get_int(values, "width");
  GdnDecodeOptions options = step_options(values);
  FakeMemory memory;
  const std::int64_t d = row_width(h, k, hv, v);
  const DType weight_dtype = get_dtype(values, "weight_dtype");
  options.conv = GdnDecodeConv{
      memory.tensor(weight_dtype, {d, w}), memory.tensor(weight_dtype, {d}),
      memory.tensor(get_dtype(values, "conv_state_dtype"), {b + 1, d, w < 2 ? 1 : w - 1}),
      get_bool(values, "silu") ? ConvActivation::silu : ConvActivation::none};
  return plan_step(values, memory, options, device);
}

}  // namespace

std::vector<OpInfo> gdn_decode_entries() {
  return {{"gdn_decode", gdn_decode_params(), "Gated DeltaNet decode step over a state pool",
           plan_decode},
          {"gdn_decode_conv", gdn_decode_conv_params(),
           "Gated DeltaNet fused decode step: causal conv update of mixed_qkv and the delta rule "
           "in one launch (gdn_decode with options.conv)",
           plan_decode_conv}};
}

}  // namespace kjit::catalog_detail
