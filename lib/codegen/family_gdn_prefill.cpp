// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "codegen/family_decls.hpp"
#include "kjit/spec.hpp"

namespace kjit::codegen {

namespace {

// The value tile of the state kernel must divide V and keep the f32 state tile in 64 registers
// per thread (the template's static_asserts).
std::string check_gdn_prefill_state(const KernelSpec& spec) {
  const std::int64_t k = spec.get_int("k");
  const std::int64_t v = spec.get_int("v");
  const std::int64_t bv = spec.get_int("bv");
  if (v % bv != 0) return fmt::format("bv = {} does not divide v = {}", bv, v);
  // 64 state registers per thread: 4 warps, or 8 for the whole-V tile bv = 128.
  const std::int64_t limit = bv == 128 ? 16384 : 8192;
  if (bv * k > limit) {
    return fmt::format("bv * k = {} * {} > {} (the f32 state tile must fit 64 registers)", bv, k,
                       limit);
  }
  return "";
}

// Parameters the three prefill families share, declared once: the fused kernel and the two
// kernels of the chunked path must accept the same values for them.
ParamDecl float_dtype_param(std::string_view name, std::string_view doc) {
  return ParamDecl{
      .name = name, .kind = ParamKind::dtype, .choices = {"f32", "bf16", "f16"}, .doc = doc};
}
ParamDecl gate_param() {
  return float_dtype_param("gate", "element type of a and b (f32 g and beta in the gated form)");
}
ParamDecl param_param() {
  return float_dtype_param("param", "element type of A_log and dt_bias (unused in the gated form)");
}
ParamDecl state_param() {
  return ParamDecl{.name = "state",
                   .kind = ParamKind::dtype,
                   .choices = {"f32", "bf16"},
                   .doc = "element type of the state pool and the final states"};
}
ParamDecl out_param() {
  return ParamDecl{.name = "out",
                   .kind = ParamKind::dtype,
                   .choices = {"bf16", "f16", "f32"},
                   .doc = "element type of out"};
}
ParamDecl integer_dtype_param(std::string_view name, std::string_view doc) {
  return ParamDecl{.name = name, .kind = ParamKind::dtype, .choices = {"i32", "i64"}, .doc = doc};
}
ParamDecl head_dim_param(std::string_view name, std::string_view doc) {
  return ParamDecl{.name = name,
                   .kind = ParamKind::choice,
                   .choices = {"128", "64", "256"},
                   .rendered = {"128", "64", "256"},
                   .doc = doc};
}
ParamDecl flag_param(std::string_view name, std::string_view doc) {
  return ParamDecl{.name = name, .kind = ParamKind::boolean, .doc = doc};
}

}  // namespace

// The order is the template parameter order of kjit::gdn_prefill_kernel (templates/
// gdn_prefill.cuh); the ops layer (lib/ops/gdn_prefill.cpp) builds specs by these names. The
// first value of every parameter gives the first-class instantiation (bf16, K = V = 128).
FamilyDecl gdn_prefill_family() {
  return FamilyDecl{
      .name = "gdn_prefill",
      .include = "kjit/gdn_prefill.cuh",
      .kernel = "kjit::gdn_prefill_kernel",
      .params =
          {
              ParamDecl{.name = "qkv",
                        .kind = ParamKind::dtype,
                        .choices = {"bf16", "f16"},
                        .doc = "element type of q, k and v"},
              gate_param(),
              param_param(),
              state_param(),
              out_param(),
              integer_dtype_param("cu", "element type of cu_seqlens"),
              integer_dtype_param("index", "element type of state_indices"),
              head_dim_param("k", "key head dim K"),
              head_dim_param("v", "value head dim V"),
              ParamDecl{.name = "bv",
                        .kind = ParamKind::choice,
                        .choices = {"64", "32", "16"},
                        .rendered = {"64", "32", "16"},
                        .doc = "state rows (of V) per block; divides V, bv * K <= 8192"},
              flag_param("gated", "1: a/b hold precomputed f32 g (log decay) and beta"),
              flag_param("l2norm", "1: L2-normalize q and k"),
              flag_param("ckpt", "1: write state checkpoints every n full chunks"),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill (chunk 64, WY form on mma.sync bf16), varlen, "
          "state pool in place",
  };
}

// The chunked path (lib/ops/gdn_prefill.cpp picks it): kernel 1, every chunk at once. Order =
// the template parameters of kjit::gdn_prefill_chunk_kernel (templates/gdn_prefill_chunk.cuh).
FamilyDecl gdn_prefill_chunk_family() {
  return FamilyDecl{
      .name = "gdn_prefill_chunk",
      .include = "kjit/gdn_prefill_chunk.cuh",
      .kernel = "kjit::gdn_prefill_chunk_kernel",
      .params =
          {
              ParamDecl{.name = "qkv",
                        .kind = ParamKind::dtype,
                        .choices = {"bf16"},
                        .doc = "element type of q and k (bf16: the state kernel multiplies raw "
                               "rows)"},
              gate_param(),
              param_param(),
              integer_dtype_param("cu", "element type of cu_seqlens"),
              head_dim_param("k", "key head dim K"),
              flag_param("gated", "1: a/b hold precomputed f32 g (log decay) and beta"),
              flag_param("l2norm", "1: L2-normalize q and k"),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, kernel 1 of the chunked path: per (chunk, key head) "
          "T' = (I + A)^-1 diag(beta), P and decay scales into the workspace",
  };
}

// Kernel 2 of the chunked path: the sequential state recurrence. Order = the template parameters
// of kjit::gdn_prefill_state_kernel (templates/gdn_prefill_state.cuh).
FamilyDecl gdn_prefill_state_family() {
  return FamilyDecl{
      .name = "gdn_prefill_state",
      .include = "kjit/gdn_prefill_state.cuh",
      .kernel = "kjit::gdn_prefill_state_kernel",
      .params =
          {
              ParamDecl{.name = "qkv",
                        .kind = ParamKind::dtype,
                        .choices = {"bf16"},
                        .doc = "element type of q, k and v (raw rows are mma operands)"},
              state_param(),
              out_param(),
              integer_dtype_param("cu", "element type of cu_seqlens"),
              integer_dtype_param("index", "element type of state_indices"),
              head_dim_param("k", "key head dim K"),
              head_dim_param("v", "value head dim V"),
              ParamDecl{.name = "bv",
                        .kind = ParamKind::choice,
                        .choices = {"32", "64", "16", "128"},
                        .rendered = {"32", "64", "16", "128"},
                        .doc = "state rows (of V) per block; divides V; bv * K <= 8192 (4 warps), "
                               "16384 for bv = 128 (8 warps)"},
              flag_param("ckpt", "1: write state checkpoints every n full chunks"),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, kernel 2 of the chunked path: the state recurrence "
          "over chunks with cp.async prefetch",
      .check = check_gdn_prefill_state,
  };
}

}  // namespace kjit::codegen
