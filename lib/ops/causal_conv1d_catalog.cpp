// SPDX-License-Identifier: Apache-2.0
// causal_conv1d and causal_conv1d_update in the op catalog (kjit/catalog.hpp).
#include "kjit/ops/causal_conv1d.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit::catalog_detail {
namespace {

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

Plan plan_conv(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device) {
  const bool update = op.name == "causal_conv1d_update";
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

std::vector<OpInfo> causal_conv1d_entries() {
  return {
      {"causal_conv1d", causal_conv1d_params(false),
       "causal depthwise conv1d, varlen prefill over a conv-state pool", plan_conv},
      {"causal_conv1d_update", causal_conv1d_params(true),
       "causal depthwise conv1d decode / speculative update over a conv-state pool", plan_conv},
  };
}

}  // namespace kjit::catalog_detail
