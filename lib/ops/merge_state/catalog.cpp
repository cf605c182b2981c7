// SPDX-License-Identifier: Apache-2.0
// merge_state, merge_state_in_place and merge_states in the op catalog (kjit/catalog.hpp).
#include <fmt/format.h>

#include "kjit/error.hpp"
#include "kjit/ops/merge_state.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit::catalog_detail {
namespace {

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

MergeStateOptions merge_options(const ShapeValues& values) {
  MergeStateOptions options;
  const std::string& base = values.at("lse_base");
  if (base == "e") {
    options.lse_base = LseBase::e;
  } else if (base == "2" || base == "two") {
    options.lse_base = LseBase::two;
  } else {
    throw InvalidArgument(fmt::format("lse_base must be e or 2, got '{}'", base));
  }
  const std::string& layout = values.at("layout");
  if (layout == "token_major") {
    options.lse_layout = LseLayout::token_major;
  } else if (layout == "head_major") {
    options.lse_layout = LseLayout::head_major;
  } else {
    throw InvalidArgument(
        fmt::format("layout must be token_major or head_major, got '{}'", layout));
  }
  options.pos_inf_as_empty = get_bool(values, "pos_inf_empty");
  options.force_mode = values.at("mode");
  return options;
}

Plan plan_merge(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device) {
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
  if (op.name == "merge_states") {
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
  if (op.name == "merge_state_in_place") {
    return plan_merge_state_in_place(v_a, s_a, v_b, s_b, FakeMemory::none(DType::u8, {t}), options,
                                     device);
  }
  return plan_merge_state(v_a, s_a, v_b, s_b, memory.tensor(out, {t, h, d}), lse(t, h), options,
                          device);
}

}  // namespace

std::vector<OpInfo> merge_state_entries() {
  return {
      {"merge_state", merge_state_params(false),
       "merge two partial attention states (v_a, s_a) + (v_b, s_b) -> (v_out, s_out)", plan_merge},
      {"merge_state_in_place", merge_state_params(false),
       "merge (v_other, s_other) into (v, s) in place", plan_merge},
      {"merge_states", merge_state_params(true), "merge S partial states per (token, head)",
       plan_merge},
  };
}

}  // namespace kjit::catalog_detail
