// SPDX-License-Identifier: Apache-2.0
// gdn_prefill's registrations: its five kernel families (codegen: template, parameters, accepted
// values), registered from here, and its op catalog entry, which op_catalog() lists by hand with
// the other families written before registration (that keeps `kjit plan --help` in its order).
#include <fmt/format.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "codegen/families.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/spec.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit {
namespace {

using codegen::FamilyDecl;
using codegen::ParamDecl;
using codegen::ParamKind;

// The value tile of the state kernel must divide V and keep the f32 state tile in 64 registers
// per thread (the template's static_asserts).
std::string check_gdn_prefill_state(const KernelSpec& spec) {
  const std::int64_t k = spec.get_int("k");
  const std::int64_t v = spec.get_int("v");
  const std::int64_t bv = spec.get_int("bv");
  if (v % bv != 0) return fmt::format("bv = {} does not divide v = {}", bv, v);
  if (bv < 64 && spec.get_or("statep", "0") != "0") {
    return fmt::format("statep = 1 needs a wide tile (bv >= 64; bv = {})", bv);
  }
  if (bv < 64 && spec.get_or("stages", "2") != "2") {
    return fmt::format("stages = {} needs a wide tile (bv >= 64; bv = {})",
                       spec.get_or("stages", "2"), bv);
  }
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
ParamDecl gated_param() {
  return flag_param("gated", "1: a/b hold precomputed f32 g (log decay) and beta");
}
ParamDecl l2norm_param() { return flag_param("l2norm", "1: L2-normalize q and k"); }
ParamDecl ckpt_param() {
  return flag_param("ckpt", "1: write state checkpoints every n full chunks");
}

// The layout of the pool, the final states and the checkpoints; declared after the fact as the
// last template parameter, so V-major specs leave it out and keep their text.
ParamDecl state_layout_param() {
  return ParamDecl{.name = "state_layout",
                   .kind = ParamKind::choice,
                   .choices = {"vk", "kv"},
                   .rendered = {"0", "1"},
                   .doc =
                       "the [HV, V, K] block of the pool, final states and checkpoints: vk (K "
                       "contiguous) or kv (V contiguous, fla's states)",
                   .omitted_default = "vk"};
}

// Whether the state kernel forms each chunk's P itself (its wide mma.sync tiles) instead of
// reading it from the chunk kernel's workspace; the chunk kernel and the state kernel of a plan
// take the same value. Declared last, so specs without it keep their text.
ParamDecl state_p_param() {
  return ParamDecl{.name = "statep",
                   .kind = ParamKind::boolean,
                   .doc =
                       "1: the state kernel forms P = tril(Q K^T ...) from its q and k tiles "
                       "(wide mma.sync tiles); the chunk kernel writes P's row factors instead",
                   .omitted_default = "0"};
}

// A choice whose values are rendered as they are spelled (sizes, counts, phases).
ParamDecl literal_choice(std::string_view name, std::vector<std::string_view> values,
                         std::string_view doc) {
  return ParamDecl{
      .name = name, .kind = ParamKind::choice, .choices = values, .rendered = values, .doc = doc};
}

// The input stages of the state kernels' wide tiles (`omitted_default`: see ParamDecl).
ParamDecl stages_param(std::string_view omitted_default = {}) {
  ParamDecl decl = literal_choice("stages", {"2", "3"},
                                  "input stages of the wide tiles (bv >= 64): 2 with a block "
                                  "barrier per chunk; 3 handed over by mbarriers on sm_90 and "
                                  "later (a block barrier elsewhere)");
  decl.omitted_default = omitted_default;
  return decl;
}

// The element types of the state kernels' arguments, shared by the sequential and the
// context-parallel families (their first template parameters).
std::vector<ParamDecl> state_kernel_io_params() {
  return {
      ParamDecl{.name = "qkv",
                .kind = ParamKind::dtype,
                .choices = {"bf16"},
                .doc = "element type of q, k and v (raw rows are mma operands)"},
      state_param(),
      out_param(),
      integer_dtype_param("cu", "element type of cu_seqlens"),
      integer_dtype_param("index", "element type of state_indices"),
  };
}

std::vector<ParamDecl> with(std::vector<ParamDecl> head, std::initializer_list<ParamDecl> tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// The order is the template parameter order of kjit::gdn_prefill_kernel (templates/
// gdn_prefill.cuh); the planner (lib/ops/gdn_prefill/plan.cpp) builds specs by these names. The
// first value of every parameter gives the first-class instantiation (bf16, K = V = 128).
FamilyDecl gdn_prefill_family() {
  return FamilyDecl{
      .name = "gdn_prefill",
      .include = "templates/gdn_prefill/gdn_prefill.cuh",
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
              gated_param(),
              l2norm_param(),
              ckpt_param(),
              state_layout_param(),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill (chunk 64, WY form on mma.sync bf16), varlen, "
          "state pool in place",
  };
}

// The chunked path (lib/ops/gdn_prefill/plan.cpp picks it): kernel 1, every chunk at once. Order =
// the template parameters of kjit::gdn_prefill_chunk_kernel (templates/gdn_prefill/chunk.cuh).
FamilyDecl gdn_prefill_chunk_family() {
  return FamilyDecl{
      .name = "gdn_prefill_chunk",
      .include = "templates/gdn_prefill/chunk.cuh",
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
              gated_param(),
              l2norm_param(),
              state_p_param(),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, kernel 1 of the chunked path: per (chunk, key head) "
          "T' = (I + A)^-1 diag(beta), P (or, statep = 1, P's row factors) and decay scales into "
          "the workspace",
  };
}

// Kernel 2 of the chunked path: the sequential state recurrence. Order = the template parameters
// of kjit::gdn_prefill_state_kernel (templates/gdn_prefill/state.cuh).
FamilyDecl gdn_prefill_state_family() {
  return FamilyDecl{
      .name = "gdn_prefill_state",
      .include = "templates/gdn_prefill/state.cuh",
      .kernel = "kjit::gdn_prefill_state_kernel",
      .params = with(
          state_kernel_io_params(),
          {
              head_dim_param("k", "key head dim K"),
              head_dim_param("v", "value head dim V"),
              ParamDecl{.name = "bv",
                        .kind = ParamKind::choice,
                        .choices = {"32", "64", "16", "128"},
                        .rendered = {"32", "64", "16", "128"},
                        .doc = "state rows (of V) per block; divides V; bv * K <= 8192 (4 warps), "
                               "16384 for bv = 128 (8 warps)"},
              ckpt_param(),
              state_layout_param(),
              stages_param("2"),
              state_p_param(),
          }),
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, kernel 2 of the chunked path: the state recurrence "
          "over chunks with cp.async prefetch",
      // The planner's tile for most shapes (all of V), so that statep = 1 is a typical spec.
      .typical = {{"bv", "128"}},
      .check = check_gdn_prefill_state,
  };
}

// The context-parallel path's tiles: the wide layout (64 or 128 rows, 4 or 8 warps) with rows
// that tile both V (state rows) and K (the identity rows of a segment's linear map).
std::string check_gdn_prefill_state_cp(const KernelSpec& spec) {
  const std::int64_t k = spec.get_int("k");
  const std::int64_t v = spec.get_int("v");
  const std::int64_t bv = spec.get_int("bv");
  if (k > 128) return fmt::format("k = {} > 128 (the wide tiles hold 16 rows of K per warp)", k);
  if (v % bv != 0 || k % bv != 0) {
    return fmt::format("bv = {} must divide both v = {} and k = {}", bv, v, k);
  }
  return check_gdn_prefill_state(spec);
}

// The context-parallel path's two passes of the state kernel over segments of the sequences
// (phase 1: segment pass, phase 2: resume pass). Order = the template parameters of
// kjit::gdn_prefill_state_cp_kernel (templates/gdn_prefill/state.cuh).
FamilyDecl gdn_prefill_state_cp_family() {
  return FamilyDecl{
      .name = "gdn_prefill_state_cp",
      .include = "templates/gdn_prefill/state.cuh",
      .kernel = "kjit::gdn_prefill_state_cp_kernel",
      .params =
          with(state_kernel_io_params(),
               {
                   literal_choice("k", {"128", "64"}, "key head dim K"),
                   head_dim_param("v", "value head dim V"),
                   literal_choice("bv", {"128", "64"}, "state rows per block; divides V and K"),
                   ckpt_param(),
                   literal_choice("phase", {"1", "2"},
                                  "1: segment pass (end states from zero and identity starts), 2: "
                                  "resume pass (outputs from the exact initial states)"),
                   stages_param(),
                   state_layout_param(),
                   state_p_param(),
               }),
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, context-parallel path: the state kernel over "
          "segments of the sequences",
      .check = check_gdn_prefill_state_cp,
  };
}

// The context-parallel path's scan: each segment's exact initial state from the segment pass's
// end states and linear maps. Order = the template parameters of
// kjit::gdn_prefill_cp_scan_kernel (templates/gdn_prefill/cp.cuh).
FamilyDecl gdn_prefill_cp_scan_family() {
  return FamilyDecl{
      .name = "gdn_prefill_cp_scan",
      .include = "templates/gdn_prefill/cp.cuh",
      .kernel = "kjit::gdn_prefill_cp_scan_kernel",
      .params =
          {
              integer_dtype_param("cu", "element type of cu_seqlens"),
              literal_choice("k", {"128", "64"}, "key head dim K"),
              head_dim_param("v", "value head dim V"),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet chunked prefill, context-parallel path: X_{s+1} = X_s M_s + B_s over "
          "each sequence's segments, in f32",
  };
}

// The warp-specialized path: one kernel of three warpgroups per (sequence, value head), the chunk
// work of chunk c + 1 beside the state recurrence of chunk c (sm_90a). Order = the template
// parameters of kjit::gdn_prefill_ws_kernel (templates/gdn_prefill/ws.cuh).
FamilyDecl gdn_prefill_ws_family() {
  return FamilyDecl{
      .name = "gdn_prefill_ws",
      .include = "templates/gdn_prefill/ws.cuh",
      .kernel = "kjit::gdn_prefill_ws_kernel",
      .params =
          {
              ParamDecl{.name = "qkv",
                        .kind = ParamKind::dtype,
                        .choices = {"bf16"},
                        .doc = "element type of q, k and v (raw rows are wgmma operands)"},
              gate_param(),
              param_param(),
              state_param(),
              out_param(),
              integer_dtype_param("cu", "element type of cu_seqlens"),
              integer_dtype_param("index", "element type of state_indices"),
              literal_choice("k", {"128"}, "key head dim K"),
              literal_choice("v", {"128"}, "value head dim V"),
              gated_param(),
              l2norm_param(),
              ckpt_param(),
              state_layout_param(),
          },
      .min_sm = 90,
      .doc =
          "Gated DeltaNet chunked prefill in one warp-specialized kernel (sm_90a): a chunk "
          "warpgroup computes T', P and the scales of chunk c + 1 into shared memory "
          "while two state warpgroups carry the state through chunk c on wgmma",
  };
}

const codegen::FamilyRegistration kFused(&gdn_prefill_family);
const codegen::FamilyRegistration kWs(&gdn_prefill_ws_family);
const codegen::FamilyRegistration kChunk(&gdn_prefill_chunk_family);
const codegen::FamilyRegistration kState(&gdn_prefill_state_family);
const codegen::FamilyRegistration kStateCp(&gdn_prefill_state_cp_family);
const codegen::FamilyRegistration kCpScan(&gdn_prefill_cp_scan_family);

}  // namespace
}  // namespace kjit

namespace kjit::catalog_detail {
namespace {

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
             "_bv16; chunked_cp or chunked_cp<L>: context-parallel, segments of L chunks, "
             "optionally + _s2/_s3 input stages; either + _wgmma: sm_90a warpgroup MMA; any "
             "chunked mode + _p0/_p1: P formed by the chunk or the state kernel; chunked_ws: one "
             "warp-specialized kernel, sm_90a, K = V = 128)"),
      option("checkpoint", "0",
             "state checkpoints every this many tokens (a multiple of 64; 0: none)"),
  };
}

Plan plan_prefill(const OpInfo&, const ShapeValues& values, const DeviceLimits& device) {
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

}  // namespace

std::vector<OpInfo> gdn_prefill_entries() {
  return {
      {"gdn_prefill", gdn_prefill_params(), "Gated DeltaNet chunked varlen prefill", plan_prefill}};
}

}  // namespace kjit::catalog_detail
