// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "codegen/family_decls.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"
#include "templates/gdn_decode/conv_params.h"

namespace kjit::codegen {
namespace {

int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

// The static_asserts of gdn_decode_kernel and its KMajorTileDecoder (state_layout=kv): a tile
// is bv columns of V, a line of it (one k) whole vectors split over a power of two <= 32 lanes,
// K whole lines for every warp; one tile per block, loads into registers.
std::string check_k_major(const KernelSpec& spec, std::int64_t per_vec) {
  const std::int64_t k = spec.get_int("k");
  const std::int64_t v = spec.get_int("v");
  const std::int64_t bv = spec.get_int("bv");
  const std::int64_t warps = spec.get_int("warps");
  const std::string& mode = spec.get("mode");
  if (v % bv != 0) return fmt::format("bv = {} does not divide v = {}", bv, v);
  const std::int64_t lanes_per_line = bv / per_vec;
  if (bv % per_vec != 0 || lanes_per_line > 32 || (lanes_per_line & (lanes_per_line - 1)) != 0) {
    return fmt::format(
        "state_layout=kv: bv = {} must be a power of two <= 32 of {}-element vectors", bv, per_vec);
  }
  const std::int64_t lines_per_warp = 32 / lanes_per_line;
  if (k % (lines_per_warp * warps) != 0) {
    return fmt::format(
        "state_layout=kv: k = {} is not a multiple of warps x lines per warp = {} x {}", k, warps,
        lines_per_warp);
  }
  if (mode != "flat" && mode != "split" && mode != "folded") {
    return fmt::format("state_layout=kv is for the flat, split and folded modes (mode={})", mode);
  }
  if (spec.get_int("stages") != 0) {
    return fmt::format("stages = {} belongs to mode=bulk alone (mode={})", spec.get_int("stages"),
                       mode);
  }
  if (spec.get("load_hint") == "staged") {
    return "state_layout=kv loads the state into registers (load_hint=staged is V-major only)";
  }
  return {};
}

// The fused step's cluster (its template's static_asserts, and the arch): a cluster of 1, 2, 4 or
// 8 blocks that splits the 2K q/k channels evenly, and only from sm_90 on, where the cluster
// barrier and distributed shared memory exist (compiled for an older arch the exchange would be
// missing and the kernel would compute wrong outputs, not fail).
std::string check_gdn_decode_conv(const KernelSpec& spec) {
  const std::int64_t cluster = std::stoll(spec.get_or("cluster", "1"));
  const std::int64_t stages = std::stoll(spec.get_or("stages", "0"));
  if (!gdn_decode_conv_stage_count(stages)) {
    return fmt::format("stages = {}; accepted: 0 (no ring), 2, 3 or 4", stages);
  }
  if (stages > 0) {
    const std::int64_t vec_bytes =
        spec.get_int("state_vec") *
        static_cast<std::int64_t>(size_of(parse_dtype(spec.get("state"), "state")));
    if (cluster != 1 || vec_bytes != 16) {
      return fmt::format(
          "stages = {} needs cluster = 1 and 16-byte state vectors; the spec has cluster = {} and "
          "{}-byte vectors",
          stages, cluster, vec_bytes);
    }
  }
  if (cluster == 1) return {};
  if (cluster != 2 && cluster != 4 && cluster != 8) {
    return fmt::format("cluster = {}; accepted: 1, 2, 4 or 8 blocks", cluster);
  }
  if (spec.arch.sm() < 90) {
    return fmt::format(
        "cluster = {} needs sm_90 or later (thread-block clusters); the spec is "
        "for {}",
        cluster, spec.arch.str());
  }
  const std::int64_t k = spec.get_int("k");
  if (2 * k % cluster != 0) {
    return fmt::format("cluster = {} does not split the 2K = {} q/k channels evenly", cluster,
                       2 * k);
  }
  return {};
}

// The static_asserts of gdn_decode_kernel and its TileDecoder, in the same order and terms.
std::string check_gdn_decode(const KernelSpec& spec) {
  const auto elem = static_cast<std::int64_t>(size_of(parse_dtype(spec.get("state"))));
  const std::int64_t vec_bytes = spec.get_int("vec_bytes");
  const std::int64_t k = spec.get_int("k");
  const std::int64_t v = spec.get_int("v");
  const std::int64_t bv = spec.get_int("bv");
  const std::int64_t warps = spec.get_int("warps");
  const std::int64_t stages = spec.get_int("stages");
  const std::string& mode = spec.get("mode");
  if (vec_bytes % elem != 0) {
    return fmt::format("vec_bytes = {} does not hold whole {}-byte state elements", vec_bytes,
                       elem);
  }
  const std::int64_t per_vec = vec_bytes / elem;
  if (spec.get_or("state_layout", "vk") == "kv") return check_k_major(spec, per_vec);
  if (k % per_vec != 0) return fmt::format("k = {} is not whole vectors of {}", k, per_vec);
  if (v % bv != 0) return fmt::format("bv = {} does not divide v = {}", bv, v);
  const std::int64_t lanes_per_row = std::min(32, pow2_at_least(static_cast<int>(k / per_vec)));
  const std::int64_t rows_per_warp = 32 / lanes_per_row;
  if (bv % (warps * rows_per_warp) != 0) {
    return fmt::format("bv = {} is not a multiple of warps x rows per warp = {} x {}", bv, warps,
                       rows_per_warp);
  }
  if (mode == "bulk") {
    if (stages < 1 || stages > 8) return fmt::format("mode=bulk needs stages 1..8, got {}", stages);
    if (bv * k * elem % 16 != 0) {
      return fmt::format("mode=bulk copies multiples of 16 bytes; a tile is {} bytes",
                         bv * k * elem);
    }
    if (spec.arch.sm() < 90) {
      return fmt::format("mode=bulk needs sm_90 or newer, the target is {}", spec.arch.str());
    }
  } else if (stages != 0) {
    return fmt::format("stages = {} belongs to mode=bulk alone (mode={})", stages, mode);
  }
  if (spec.get_int("ordered") != 0 && (mode == "persistent" || mode == "bulk")) {
    return fmt::format(
        "ordered=1 (rows in slot order) is for the one-tile-per-block modes (mode={})", mode);
  }
  if (spec.get("load_hint") == "staged") {
    if (mode == "persistent" || mode == "bulk" || vec_bytes != 16) {
      return fmt::format(
          "load_hint=staged is for the one-tile-per-block modes with 16-byte vectors (mode={}, "
          "vec_bytes={})",
          mode, vec_bytes);
    }
    if (spec.arch.sm() < 80) {
      return fmt::format("load_hint=staged needs cp.async (sm_80 or newer), the target is {}",
                         spec.arch.str());
    }
  }
  return {};
}

// Parameters the step and its ranking kernel share.
ParamDecl index_dtype_param() {
  return ParamDecl{.name = "index",
                   .kind = ParamKind::dtype,
                   .choices = {"i32", "i64"},
                   .doc = "element type of state_indices"};
}

// An element type of f16, bf16 or f32.
ParamDecl float_param(std::string_view name, std::string_view doc) {
  return ParamDecl{
      .name = name, .kind = ParamKind::dtype, .choices = {"f16", "bf16", "f32"}, .doc = doc};
}

// A head dim: 16..256 in steps of 16.
ParamDecl head_dim_param(std::string_view name, std::string_view doc) {
  return ParamDecl{.name = name,
                   .kind = ParamKind::integer,
                   .min = 16,
                   .max = 256,
                   .multiple_of = 16,
                   .doc = doc};
}

ParamDecl gated_param() {
  return ParamDecl{.name = "gated",
                   .kind = ParamKind::boolean,
                   .doc = "1: a/b hold precomputed f32 g (log decay) and beta"};
}

ParamDecl l2norm_param() {
  return ParamDecl{.name = "l2norm", .kind = ParamKind::boolean, .doc = "1: L2-normalize q and k"};
}

ParamDecl invalid_rule_param() {
  return ParamDecl{.name = "invalid",
                   .kind = ParamKind::choice,
                   .choices = {"negative", "nonpositive"},
                   .rendered = {"0", "1"},
                   .doc = "which state indices are invalid: < 0, or <= 0 (slot 0 null)"};
}

}  // namespace

// The order is the template parameter order of kjit::gdn_decode_kernel (templates/
// gdn_decode.cuh); the ops layer (lib/ops/gdn_decode/plan.cpp) builds specs by these names.
FamilyDecl gdn_decode_family() {
  return FamilyDecl{
      .name = "gdn_decode",
      .include = "templates/gdn_decode/gdn_decode.cuh",
      .kernel = "kjit::gdn_decode_kernel",
      .params =
          {
              float_param("qkv", "element type of mixed_qkv"),
              float_param("gate", "element type of a and b (f32 g and beta in the gated form)"),
              float_param("a_log", "element type of A_log (f32 in the gated form, unused)"),
              float_param("dt_bias", "element type of dt_bias (f32 in the gated form, unused)"),
              float_param("state", "element type of the state pool"),
              float_param("out", "element type of out"),
              index_dtype_param(),
              head_dim_param("k", "key head dim K"),
              head_dim_param("v", "value head dim V"),
              ParamDecl{.name = "bv",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 256,
                        .doc = "state rows (of V) per block; divides V"},
              ParamDecl{.name = "warps",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 8,
                        .doc = "warps per block"},
              ParamDecl{.name = "vec_bytes",
                        .kind = ParamKind::choice,
                        .choices = {"2", "4", "8", "16"},
                        .rendered = {"2", "4", "8", "16"},
                        .doc = "bytes per state load/store (alignment class of the pool)"},
              ParamDecl{.name = "mode",
                        .kind = ParamKind::choice,
                        .choices = {"flat", "split", "folded", "persistent", "bulk"},
                        .rendered = {"0", "1", "2", "3", "4"},
                        .doc = "grid mode: flat (NV, B*HV), split (NV, HV, B), folded (x only), "
                               "persistent (resident blocks, register prefetch), bulk "
                               "(resident blocks, shared-memory ring of bulk copies, sm_90+)"},
              ParamDecl{.name = "stages",
                        .kind = ParamKind::integer,
                        .min = 0,
                        .max = 8,
                        .doc = "shared-memory stages of state tiles (bulk mode; 0 otherwise)"},
              ParamDecl{.name = "min_blocks",
                        .kind = ParamKind::integer,
                        .min = 0,
                        .max = 32,
                        .doc = "blocks per SM the launch assumes resident (a register cap); "
                               "0: no cap"},
              ParamDecl{.name = "load_hint",
                        .kind = ParamKind::choice,
                        .choices = {"stream", "plain", "l2_256", "staged"},
                        .rendered = {"0", "1", "2", "3"},
                        .doc = "state loads: .cs (evict first), no hint, L2::256B prefetch, or "
                               "staged (cp.async into shared memory, one tile per block)"},
              ParamDecl{.name = "store_hint",
                        .kind = ParamKind::choice,
                        .choices = {"stream", "plain"},
                        .rendered = {"0", "1"},
                        .doc = "state stores: .cs (evict first) or no hint"},
              gated_param(),
              l2norm_param(),
              invalid_rule_param(),
              ParamDecl{.name = "ordered",
                        .kind = ParamKind::boolean,
                        .doc = "1: rows in slot order, from the keys gdn_decode_order wrote "
                               "(flat, split and folded modes)"},
              // Declared after the fact: V-major specs leave it out and keep their text.
              ParamDecl{.name = "state_layout",
                        .kind = ParamKind::choice,
                        .choices = {"vk", "kv"},
                        .rendered = {"0", "1"},
                        .doc = "the pool's [HV, V, K] block: vk (K contiguous) or kv (V "
                               "contiguous, fla's states; flat, split and folded modes, bv "
                               "columns of V per block)",
                        .omitted_default = "vk"},
          },
      .min_sm = 80,
      .doc = "Gated DeltaNet packed decode: one recurrent step per row, state pool in place",
      // What the planner emits for K = V = 128: one warp, 4 rows, 16-byte vectors, flat mode.
      .typical = {{"bv", "4"},
                  {"warps", "1"},
                  {"vec_bytes", "16"},
                  {"stages", "0"},
                  {"min_blocks", "0"},
                  {"ordered", "0"}},
      .check = check_gdn_decode,
  };
}

// The pass before an ordered gdn_decode launch: ranks the rows by slot. Order = the template
// parameters of kjit::gdn_decode_order_kernel (templates/gdn_decode/gdn_decode.cuh).
FamilyDecl gdn_decode_order_family() {
  return FamilyDecl{
      .name = "gdn_decode_order",
      .include = "templates/gdn_decode/gdn_decode.cuh",
      .kernel = "kjit::gdn_decode_order_kernel",
      .params =
          {
              index_dtype_param(),
              invalid_rule_param(),
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet packed decode, the pass before an ordered step: each row's "
          "(slot, row) key at its rank, so the step visits the pool in address order",
  };
}

// The fused decode step (conv update + delta rule, templates/gdn_decode/conv.cuh). Order = the
// template parameters of kjit::gdn_decode_conv_kernel; the ops layer
// (lib/ops/gdn_decode/conv.cpp) builds specs by these names.
FamilyDecl gdn_decode_conv_family() {
  return FamilyDecl{
      .name = "gdn_decode_conv",
      .include = "templates/gdn_decode/conv.cuh",
      .kernel = "kjit::gdn_decode_conv_kernel",
      .params =
          {
              float_param("qkv", "element type of mixed_qkv (before the convolution)"),
              float_param("gate", "element type of a and b (f32 g and beta in the gated form)"),
              float_param("a_log", "element type of A_log (f32 in the gated form, unused)"),
              float_param("dt_bias", "element type of dt_bias (f32 in the gated form, unused)"),
              float_param("state", "element type of the state pool"),
              float_param("out", "element type of out"),
              index_dtype_param(),
              float_param("weight", "element type of the conv weight and bias"),
              float_param("conv_state", "element type of the conv-state pool"),
              head_dim_param("k", "key head dim K"),
              head_dim_param("v", "value head dim V"),
              ParamDecl{.name = "width",
                        .kind = ParamKind::integer,
                        .min = 2,
                        .max = 8,
                        .doc = "conv taps W"},
              ParamDecl{.name = "warps",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 32,
                        .doc = "warps per block (one block per row and q/k head)"},
              gated_param(),
              l2norm_param(),
              invalid_rule_param(),
              ParamDecl{
                  .name = "silu", .kind = ParamKind::boolean, .doc = "1: SiLU on the conv output"},
              ParamDecl{.name = "state_vec",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 8,
                        .doc = "state elements per lane and access (one 4- to 16-byte vector, or "
                               "1: scalar)"},
              ParamDecl{.name = "cluster",
                        .kind = ParamKind::integer,
                        .min = 1,
                        .max = 8,
                        .doc = "blocks per cluster that share a (row, q/k head) (1: no cluster; "
                               "2, 4, 8: sm_90 and later)",
                        .omitted_default = "1"},
              ParamDecl{.name = "stages",
                        .kind = ParamKind::integer,
                        .min = 0,
                        .max = 4,
                        .doc = "sets of state rows per warp in a shared-memory ring (cp.async; 0: "
                               "two register sets; 2..4: unclustered, 16-byte state vectors)",
                        .omitted_default = "0"},
          },
      .min_sm = 80,
      .doc =
          "Gated DeltaNet fused decode step: causal conv update of mixed_qkv (both pools in "
          "place) and the delta rule in one launch",
      // What the planner emits for Qwen3-Next at small B on any arch: 32 warps, W = 4, SiLU, no
      // cluster (sm_90 clusters blocks of 16 warps at B = 1), no state ring.
      .typical = {{"width", "4"},
                  {"warps", "32"},
                  {"silu", "1"},
                  {"state_vec", "4"},
                  {"cluster", "1"},
                  {"stages", "0"}},
      .check = check_gdn_decode_conv,
  };
}

}  // namespace kjit::codegen
