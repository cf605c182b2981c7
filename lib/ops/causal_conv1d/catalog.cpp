// SPDX-License-Identifier: Apache-2.0
// causal_conv1d's registrations: its kernel family (codegen: template, parameters, accepted
// values) and its op catalog entries, causal_conv1d and causal_conv1d_update (kjit plan,
// manifests, kjit.plan()). Both register from here, so the family edits no shared list.
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "codegen/families.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"
#include "ops/catalog_entries.hpp"
// After kjit/types.hpp: the params header declares kjit::i32 and friends.
#include "templates/causal_conv1d/params.h"

namespace kjit::codegen {
namespace {

// The template's static_asserts, in host code: a span covers the W - 1 token halo of the next
// and at least one batch of loads, spans belong to the chunked mode, and one access moves at
// most 16 bytes of x.
std::string check_causal_conv1d(const KernelSpec& spec) {
  const std::int64_t width = spec.get_int("width");
  const std::int64_t chunk = spec.get_int("chunk");
  const std::int64_t span = spec.get_int("span");
  if (spec.get("mode") == "chunked") {
    if (span < width - 1 || span < chunk) {
      return fmt::format("span = {} is shorter than width - 1 = {} or than chunk = {}", span,
                         width - 1, chunk);
    }
  } else if (span != 0) {
    return fmt::format("span = {} with mode = {}; spans belong to mode = chunked (others: 0)", span,
                       spec.get("mode"));
  }
  const std::int64_t vec = spec.get_int("vec");
  const std::int64_t stages = std::stoll(spec.get_or("stages", "0"));
  if (stages != 0) {
    const std::int64_t access = vec * (spec.get("in") == "f32" ? 4 : 2);
    if (spec.get("mode") != "chunked" || access != 16 || stages * chunk > kConvMaxStagedTokens) {
      return fmt::format(
          "stages = {} needs mode = chunked, 16-byte accesses of x (vec x element size = {}) and "
          "stages x chunk = {} <= {}",
          stages, access, stages * chunk, kConvMaxStagedTokens);
    }
  }
  for (const char* name : {"in", "out"}) {
    const std::int64_t bytes = spec.get(name) == "f32" ? 4 : 2;
    if (vec * bytes > 16) {
      return fmt::format("vec = {} moves {} bytes of {} ({}) per access; at most 16", vec,
                         vec * bytes, name, spec.get(name));
    }
  }
  const std::int64_t state_bytes = spec.get("state") == "f32" ? 4 : 2;
  if (spec.get("pool") == "channels" && vec * state_bytes > 16) {
    return fmt::format("pool = channels moves vec x {} bytes = {} per access; at most 16",
                       state_bytes, vec * state_bytes);
  }
  if (spec.get("pool") == "block" && vec * (width - 1) * state_bytes % 16 != 0) {
    return fmt::format("pool = block needs vec x (W - 1) x {} bytes = {} to be a multiple of 16",
                       state_bytes, vec * (width - 1) * state_bytes);
  }
  return "";
}

// Parameters in the order of the template arguments of kjit::causal_conv1d_kernel
// (templates/causal_conv1d/causal_conv1d.cuh).
FamilyDecl kernel_family() {
  return FamilyDecl{
      .name = "causal_conv1d",
      .include = "templates/causal_conv1d/causal_conv1d.cuh",
      .kernel = "kjit::causal_conv1d_kernel",
      .params =
          {
              ParamDecl{.name = "in",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of x"},
              ParamDecl{.name = "out",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of out"},
              ParamDecl{.name = "weight",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of weight and bias (x's or f32)"},
              ParamDecl{.name = "state",
                        .kind = ParamKind::dtype,
                        .choices = {"f16", "bf16", "f32"},
                        .doc = "dtype of the conv-state pool"},
              ParamDecl{.name = "width",
                        .kind = ParamKind::integer,
                        .min = 2,
                        .max = 8,
                        .doc = "taps W of the convolution"},
              ParamDecl{.name = "vec",
                        .kind = ParamKind::choice,
                        .choices = {"1", "2", "4", "8"},
                        .rendered = {"1", "2", "4", "8"},
                        .doc = "channels per thread (one vector access of x and out when > 1)"},
              ParamDecl{.name = "chunk",
                        .kind = ParamKind::choice,
                        .choices = {"1", "2", "4", "8", "16"},
                        .rendered = {"1", "2", "4", "8", "16"},
                        .doc = "tokens whose loads a thread issues before their arithmetic"},
              ParamDecl{.name = "span",
                        .kind = ParamKind::choice,
                        .choices = {"0", "8", "16", "32", "64", "128", "256"},
                        .rendered = {"0", "8", "16", "32", "64", "128", "256"},
                        .doc = "tokens per work item of mode = chunked (0 in the other modes)"},
              ParamDecl{.name = "mode",
                        .kind = ParamKind::choice,
                        .choices = {"chunked", "sequential", "rows"},
                        .rendered = {"kjit::ConvMode::chunked", "kjit::ConvMode::sequential",
                                     "kjit::ConvMode::rows"},
                        .doc = "chunked / sequential prefill, or the decode update's rows"},
              ParamDecl{
                  .name = "pool",
                  .kind = ParamKind::choice,
                  .choices = {"scalar", "channels", "block"},
                  .rendered = {"kjit::ConvStateAccess::scalar", "kjit::ConvStateAccess::channels",
                               "kjit::ConvStateAccess::block"},
                  .doc = "pool access: any strides, channel vectors per column, or the "
                         "thread's contiguous [vec, W-1] block"},
              ParamDecl{.name = "silu", .kind = ParamKind::boolean, .doc = "1: SiLU on the output"},
              // A tuning candidate (options.force_min_blocks) and the chunked prefill's stages,
              // each left out of a spec at 0 (the template's rule; no stages).
              ParamDecl{.name = "min_blocks",
                        .kind = ParamKind::choice,
                        .choices = {"0", "2", "3", "4", "5", "6", "8"},
                        .rendered = {"0", "2", "3", "4", "5", "6", "8"},
                        .doc = "minimum blocks per SM the kernel is compiled for (0: the "
                               "template's rule)",
                        .omitted_default = "0"},
              ParamDecl{.name = "stages",
                        .kind = ParamKind::choice,
                        .choices = {"0", "2", "3", "4", "6"},
                        .rendered = {"0", "2", "3", "4", "6"},
                        .doc = "shared-memory stages of the chunked prefill's batches (cp.async; "
                               "0: two register buffers)",
                        .omitted_default = "0"},
          },
      .min_sm = 80,
      .doc = "causal depthwise conv1d over varlen sequences / decode rows with a state pool",
      .typical = {{"width", "4"},
                  {"vec", "8"},
                  {"chunk", "8"},
                  {"span", "64"},
                  {"mode", "chunked"},
                  {"in", "bf16"},
                  {"out", "bf16"}},
      .check = &check_causal_conv1d,
  };
}

const FamilyRegistration kKernelFamily(&kernel_family);

}  // namespace
}  // namespace kjit::codegen

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

std::vector<OpInfo> entries() {
  return {
      {"causal_conv1d", causal_conv1d_params(false),
       "causal depthwise conv1d, varlen prefill over a conv-state pool", plan_conv},
      {"causal_conv1d_update", causal_conv1d_params(true),
       "causal depthwise conv1d decode / speculative update over a conv-state pool", plan_conv},
  };
}

const CatalogRegistration kCatalog(&entries);

}  // namespace
}  // namespace kjit::catalog_detail
