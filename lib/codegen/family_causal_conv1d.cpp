// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include "codegen/family_decls.hpp"

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

}  // namespace

// Parameters in the order of the template arguments of kjit::causal_conv1d_kernel
// (templates/causal_conv1d.cuh).
FamilyDecl causal_conv1d_family() {
  return FamilyDecl{
      .name = "causal_conv1d",
      .include = "kjit/causal_conv1d.cuh",
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

}  // namespace kjit::codegen
