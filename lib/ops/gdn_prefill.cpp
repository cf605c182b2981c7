// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill: argument checks, choice of the value tile, launch.
#include "kjit/ops/gdn_prefill.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <vector>

#include "codegen/families.hpp"
#include "driver/context.hpp"
#include "driver/driver_api.hpp"
#include "driver/memory.hpp"
#include "kjit/error.hpp"
#include "kjit/gdn_prefill_params.h"
#include "kjit/runtime.hpp"

namespace kjit {

GdnGates GdnGates::raw(TensorView a, TensorView b, TensorView a_log, TensorView dt_bias) {
  return GdnGates{GdnGateKind::raw, a, b, a_log, dt_bias};
}

GdnGates GdnGates::precomputed(TensorView g, TensorView beta) {
  return GdnGates{GdnGateKind::precomputed, g, beta, {}, {}};
}

namespace {

constexpr const char* kOp = "gdn_prefill";

[[noreturn]] void fail(const std::string& message) {
  throw InvalidArgument(fmt::format("{}: {}", kOp, message));
}

void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.rank != rank) {
    fail(fmt::format("{} must have rank {} ({}), got {}", name, rank, layout, t.str()));
  }
}

void require_dtype(const TensorView& t, const char* name, std::initializer_list<DType> accepted) {
  std::string list;
  for (DType d : accepted) {
    if (d == t.dtype) return;
    list += fmt::format("{}{}", list.empty() ? "" : ", ", to_string(d));
  }
  fail(fmt::format("{} has dtype {}; accepted: {}", name, to_string(t.dtype), list));
}

void require_dim(const TensorView& t, const char* name, int dim, std::int64_t expected,
                 const char* what) {
  if (t.shape[dim] != expected) {
    fail(fmt::format("{} dim {} is {}, expected {} ({}); {}", name, dim, t.shape[dim], expected,
                     what, t.str()));
  }
}

void require_aligned(const TensorView& t, const char* name, std::uintptr_t bytes) {
  if (reinterpret_cast<std::uintptr_t>(t.data) % bytes != 0) {
    fail(fmt::format("{} data pointer {} must be {}-byte aligned", name, t.data, bytes));
  }
}

void require_stride_multiple(const TensorView& t, const char* name, int dim, std::int64_t m) {
  if (t.shape[dim] > 1 && t.strides[dim] % m != 0) {
    fail(fmt::format("{} stride of dim {} is {}; it must be a multiple of {} elements ({})", name,
                     dim, t.strides[dim], m, t.str()));
  }
}

void require_inner_contiguous(const TensorView& t, const char* name) {
  if (t.strides[t.rank - 1] != 1 && t.shape[t.rank - 1] > 1) {
    fail(fmt::format("{} must have a contiguous last dimension, got {}", name, t.str()));
  }
}

// The layout of a state-shaped tensor's [HV, V, K] block (dims 1..3), from its strides: true
// when V is contiguous (kv: the transpose of a contiguous [.., HV, K, V] block, fla's layout),
// false when K is (vk). Any other strides fail, naming both accepted layouts.
bool k_major_block(const TensorView& t, const char* name, std::int64_t v, std::int64_t k) {
  if (t.strides[1] == v * k && t.strides[2] == k && t.strides[3] == 1) return false;
  if (t.strides[1] == v * k && t.strides[2] == 1 && t.strides[3] == v) return true;
  fail(fmt::format(
      "{} has strides that are not an accepted layout of its [HV, V, K] block, got {}; accepted: "
      "[*, {}, {}, 1] (K contiguous) or [*, {}, 1, {}] (V contiguous: a .transpose(-1, -2) of a "
      "contiguous [.., HV, K, V] tensor)",
      name, t.str(), v * k, k, v * k, v));
}

// A state-shaped output (final states, checkpoints) in the layout of the pool.
void require_layout_of_state(const TensorView& t, const char* name, std::int64_t v, std::int64_t k,
                             bool state_k_major) {
  if (k_major_block(t, name, v, k) != state_k_major) {
    fail(fmt::format("{} is {} but state is {}; accepted: the layout of state, strides [*, {}, {}]",
                     name, state_k_major ? "K contiguous" : "V contiguous",
                     state_k_major ? "V contiguous" : "K contiguous", v * k,
                     state_k_major ? fmt::format("1, {}", v) : fmt::format("{}, 1", k)));
  }
}

// An optional tensor is given when it is anything but a default TensorView: planning passes
// null pointers with real shapes, so the pointer alone cannot tell.
bool given(const TensorView& t) { return t.rank > 0 || t.data != nullptr; }

// The checkpoint arguments (GdnPrefillOptions::checkpoint_every_n_tokens and the two tensors).
void validate_checkpoints(const GdnPrefillOptions& options, const TensorView& state,
                          bool state_k_major, std::int64_t seqs, std::int64_t value_heads,
                          std::int64_t v, std::int64_t k) {
  const std::int64_t every = options.checkpoint_every_n_tokens;
  const TensorView& ck = options.state_checkpoints;
  const TensorView& starts = options.checkpoint_cu_starts;
  if (every == 0) {
    for (const auto& [t, name] : {std::pair{&ck, "options.state_checkpoints"},
                                  std::pair{&starts, "options.checkpoint_cu_starts"}}) {
      if (given(*t)) {
        fail(fmt::format(
            "{} is given ({}) but options.checkpoint_every_n_tokens is 0; accepted: a positive "
            "multiple of {} with it, or a default (empty) TensorView",
            name, t->str(), kGdnPrefillChunk));
      }
    }
    return;
  }
  if (every < 0 || every % kGdnPrefillChunk != 0) {
    fail(fmt::format(
        "options.checkpoint_every_n_tokens = {}; accepted: 0 (no checkpoints) or a positive "
        "multiple of {} (the kernel's chunk)",
        every, kGdnPrefillChunk));
  }
  if (!given(ck)) {
    fail(fmt::format(
        "options.state_checkpoints is missing; it is required with "
        "options.checkpoint_every_n_tokens = {} (a [total, HV, V, K] tensor of the dtype of state)",
        every));
  }
  require_rank(ck, "options.state_checkpoints", 4, "[total, HV, V, K]");
  if (ck.dtype != state.dtype) {
    fail(fmt::format("options.state_checkpoints has dtype {}; accepted: {} (the dtype of state)",
                     to_string(ck.dtype), to_string(state.dtype)));
  }
  require_dim(ck, "options.state_checkpoints", 1, value_heads, "value heads HV");
  require_dim(ck, "options.state_checkpoints", 2, v, "V");
  require_dim(ck, "options.state_checkpoints", 3, k, "K");
  require_layout_of_state(ck, "options.state_checkpoints", v, k, state_k_major);
  require_aligned(ck, "options.state_checkpoints", 16);
  require_stride_multiple(ck, "options.state_checkpoints", 0, 4);

  if (!given(starts)) {
    fail(
        fmt::format("options.checkpoint_cu_starts is missing; it is required with "
                    "options.checkpoint_every_n_tokens = {} (an i64 [N + 1] device tensor, see "
                    "gdn_prefill_checkpoint_starts)",
                    every));
  }
  require_rank(starts, "options.checkpoint_cu_starts", 1, "[N + 1]");
  require_dtype(starts, "options.checkpoint_cu_starts", {DType::i64});
  require_dim(starts, "options.checkpoint_cu_starts", 0, seqs + 1, "sequences N + 1");
  if (starts.shape[0] > 1 && starts.strides[0] != 1) {
    fail(fmt::format("options.checkpoint_cu_starts must be contiguous, got {}", starts.str()));
  }
  require_aligned(starts, "options.checkpoint_cu_starts", 8);
}

// Checks every argument; fills the problem description the plan and the launch need.
struct Problem {
  std::int64_t tokens = 0, seqs = 0, heads = 0, value_heads = 0, k = 0, v = 0, slots = 0;
  /// bf16 q/k/v: the chunked path multiplies raw rows on bf16 tensor cores.
  bool bf16 = false;
  /// v rows can be copied 16 bytes at a time (cp.async): pointer 16-byte aligned, token and
  /// head strides multiples of 8 elements.
  bool v16 = false;
  /// The pool, final states and checkpoints have V contiguous (spec state_layout=kv).
  bool k_major = false;
};

Problem validate(const TensorView& q, const TensorView& k, const TensorView& v,
                 const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                 const TensorView& state_indices, const TensorView& has_initial_state,
                 const TensorView& out, const GdnPrefillOptions& options) {
  Problem pr;
  require_rank(q, "q", 3, "[T, H, K]");
  require_rank(k, "k", 3, "[T, H, K]");
  require_rank(v, "v", 3, "[T, HV, V]");
  require_dtype(q, "q", {DType::bf16, DType::f16});
  if (k.dtype != q.dtype || v.dtype != q.dtype) {
    fail(fmt::format("q, k and v must have one dtype, got {}, {}, {}", to_string(q.dtype),
                     to_string(k.dtype), to_string(v.dtype)));
  }
  pr.tokens = q.shape[0];
  pr.heads = q.shape[1];
  pr.k = q.shape[2];
  pr.value_heads = v.shape[1];
  pr.v = v.shape[2];
  if (pr.k != 64 && pr.k != 128 && pr.k != 256) {
    fail(fmt::format("q head dim K is {}; accepted: 64, 128, 256", pr.k));
  }
  if (pr.v != 64 && pr.v != 128 && pr.v != 256) {
    fail(fmt::format("v head dim V is {}; accepted: 64, 128, 256", pr.v));
  }
  require_dim(k, "k", 0, pr.tokens, "tokens T of q");
  require_dim(k, "k", 1, pr.heads, "heads H of q");
  require_dim(k, "k", 2, pr.k, "K of q");
  require_dim(v, "v", 0, pr.tokens, "tokens T of q");
  if (pr.heads < 1 || pr.value_heads < 1 || pr.value_heads % pr.heads != 0) {
    fail(fmt::format("value heads HV = {} must be a positive multiple of q/k heads H = {}",
                     pr.value_heads, pr.heads));
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}}) {
    require_inner_contiguous(*t, name);
    require_aligned(*t, name, 16);
    require_stride_multiple(*t, name, 0, 8);
    require_stride_multiple(*t, name, 1, 8);
  }
  pr.bf16 = q.dtype == DType::bf16;
  pr.v16 = reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0 &&
           (v.shape[0] <= 1 || v.strides[0] % 8 == 0) && (v.shape[1] <= 1 || v.strides[1] % 8 == 0);
  require_inner_contiguous(v, "v");
  require_aligned(v, "v", 4);
  require_stride_multiple(v, "v", 0, 2);
  require_stride_multiple(v, "v", 1, 2);

  const std::int64_t hv = pr.value_heads;
  if (gates.kind == GdnGateKind::raw) {
    require_rank(gates.a, "gates.a", 2, "[T, HV]");
    require_rank(gates.b, "gates.b", 2, "[T, HV]");
    require_dtype(gates.a, "gates.a", {DType::f32, DType::bf16, DType::f16});
    if (gates.b.dtype != gates.a.dtype) fail("gates.a and gates.b must have one dtype");
    require_rank(gates.a_log, "gates.a_log", 1, "[HV]");
    require_rank(gates.dt_bias, "gates.dt_bias", 1, "[HV]");
    require_dtype(gates.a_log, "gates.a_log", {DType::f32, DType::bf16, DType::f16});
    if (gates.dt_bias.dtype != gates.a_log.dtype) {
      fail("gates.a_log and gates.dt_bias must have one dtype");
    }
    require_dim(gates.a_log, "gates.a_log", 0, hv, "value heads HV");
    require_dim(gates.dt_bias, "gates.dt_bias", 0, hv, "value heads HV");
    require_inner_contiguous(gates.a_log, "gates.a_log");
    require_inner_contiguous(gates.dt_bias, "gates.dt_bias");
  } else {
    require_rank(gates.a, "gates.g", 2, "[T, HV]");
    require_rank(gates.b, "gates.beta", 2, "[T, HV]");
    require_dtype(gates.a, "gates.g", {DType::f32});
    require_dtype(gates.b, "gates.beta", {DType::f32});
  }
  const char* a_name = gates.kind == GdnGateKind::raw ? "gates.a" : "gates.g";
  const char* b_name = gates.kind == GdnGateKind::raw ? "gates.b" : "gates.beta";
  require_dim(gates.a, a_name, 0, pr.tokens, "tokens T");
  require_dim(gates.a, a_name, 1, hv, "value heads HV");
  require_dim(gates.b, b_name, 0, pr.tokens, "tokens T");
  require_dim(gates.b, b_name, 1, hv, "value heads HV");
  require_inner_contiguous(gates.a, a_name);
  require_inner_contiguous(gates.b, b_name);

  require_rank(cu_seqlens, "cu_seqlens", 1, "[N + 1]");
  require_dtype(cu_seqlens, "cu_seqlens", {DType::i32, DType::i64});
  if (cu_seqlens.shape[0] < 1) fail("cu_seqlens must hold N + 1 >= 1 offsets");
  if (cu_seqlens.shape[0] > 1 && cu_seqlens.strides[0] != 1) {
    fail(fmt::format("cu_seqlens must be contiguous, got {}", cu_seqlens.str()));
  }
  pr.seqs = cu_seqlens.shape[0] - 1;

  require_rank(state, "state", 4, "[slots, HV, V, K]");
  require_dtype(state, "state", {DType::f32, DType::bf16});
  pr.slots = state.shape[0];
  require_dim(state, "state", 1, hv, "value heads HV");
  require_dim(state, "state", 2, pr.v, "V");
  require_dim(state, "state", 3, pr.k, "K");
  pr.k_major = k_major_block(state, "state", pr.v, pr.k);
  require_aligned(state, "state", 16);
  require_stride_multiple(state, "state", 0, 4);

  require_rank(state_indices, "state_indices", 1, "[N]");
  require_dtype(state_indices, "state_indices", {DType::i32, DType::i64});
  require_dim(state_indices, "state_indices", 0, pr.seqs, "sequences N of cu_seqlens");
  if (has_initial_state.data != nullptr) {
    require_rank(has_initial_state, "has_initial_state", 1, "[N]");
    require_dtype(has_initial_state, "has_initial_state", {DType::u8});
    require_dim(has_initial_state, "has_initial_state", 0, pr.seqs, "sequences N");
  }

  require_rank(out, "out", 3, "[T, HV, V]");
  require_dtype(out, "out", {DType::bf16, DType::f16, DType::f32});
  require_dim(out, "out", 0, pr.tokens, "tokens T");
  require_dim(out, "out", 1, hv, "value heads HV");
  require_dim(out, "out", 2, pr.v, "V");
  require_inner_contiguous(out, "out");
  require_aligned(out, "out", 8);
  require_stride_multiple(out, "out", 0, 2);
  require_stride_multiple(out, "out", 1, 2);

  const TensorView& fs = options.final_state;
  if (fs.data != nullptr) {
    require_rank(fs, "options.final_state", 4, "[N, HV, V, K]");
    if (fs.dtype != state.dtype) fail("options.final_state must have the dtype of state");
    require_dim(fs, "options.final_state", 0, pr.seqs, "sequences N");
    require_dim(fs, "options.final_state", 1, hv, "value heads HV");
    require_dim(fs, "options.final_state", 2, pr.v, "V");
    require_dim(fs, "options.final_state", 3, pr.k, "K");
    require_layout_of_state(fs, "options.final_state", pr.v, pr.k, pr.k_major);
    require_aligned(fs, "options.final_state", 16);
    require_stride_multiple(fs, "options.final_state", 0, 4);
  }
  validate_checkpoints(options, state, pr.k_major, pr.seqs, hv, pr.v, pr.k);
  const TensorView& ws = options.workspace;
  if (given(ws)) {
    require_rank(ws, "options.workspace", 1, "[bytes]");
    require_dtype(ws, "options.workspace", {DType::u8});
    if (ws.shape[0] > 1 && ws.strides[0] != 1) {
      fail(fmt::format("options.workspace must be contiguous, got {}", ws.str()));
    }
    require_aligned(ws, "options.workspace", 256);
    const std::int64_t need = gdn_prefill_workspace_bytes(pr.tokens, hv);
    if (ws.shape[0] < need) {
      fail(fmt::format(
          "options.workspace holds {} bytes; accepted: at least gdn_prefill_workspace_bytes(T = "
          "{}, HV = {}) = {} bytes",
          ws.shape[0], pr.tokens, hv, need));
    }
  }
  if (!(options.scale >= 0.0f) || !std::isfinite(options.scale)) {
    fail(fmt::format("options.scale = {} must be finite and >= 0 (0: K^-0.5)", options.scale));
  }
  return pr;
}

// Value tiles the kernel has, largest first, that divide V and keep the f32 state tile in 64
// registers per thread.
std::vector<int> value_tiles(std::int64_t k, std::int64_t v) {
  std::vector<int> tiles;
  for (int bv : {64, 32, 16}) {
    if (v % bv == 0 && bv * k <= 8192) tiles.push_back(bv);
  }
  return tiles;
}

struct Choice {
  /// The two-kernel chunked path (else the fused kernel).
  bool chunked = false;
  int bv = 0;
  /// The state kernel's wide tiles multiply on warpgroup wgmma (sm_90a) instead of mma.sync:
  /// asked for by a "_wgmma" mode.
  bool wgmma = false;
  /// Context-parallel path: chunks per segment L (0: each sequence's state rows walk its whole
  /// length in one block).
  std::int64_t cp_chunks = 0;
  /// Context-parallel path: input stages of its state passes (2 or 3).
  int cp_stages = 2;
  std::vector<std::string> reasons;
};

constexpr const char* kModes =
    "auto, chunked, chunked_bv128, chunked_bv64, chunked_bv32, chunked_bv16, bv64, bv32, bv16, "
    "a chunked mode with the suffix _wgmma, chunked_cp (context-parallel, planner's segments) or "
    "chunked_cp<L> (segments of L >= 1 chunks), either optionally followed by _s2 or _s3 (input "
    "stages of its state passes)";
constexpr std::string_view kCpPrefix = "chunked_cp";
constexpr std::string_view kWgmmaSuffix = "_wgmma";

Choice choose_tile(const Problem& pr, const std::string& force, const DeviceLimits& device) {
  Choice choice;
  std::vector<int> tiles = value_tiles(pr.k, pr.v);
  // A tile whose shared memory the device cannot give one block is no choice at all (sm_86 and
  // sm_89 opt in to 99 KiB: bv64 at K = 128 needs 105.5 KiB there). Forced tiles are left to
  // the launch check, which names the limit.
  if (force.empty() || force == "auto") {
    std::erase_if(tiles, [&](int bv) {
      const std::int64_t smem = gdn_prefill_smem(static_cast<int>(pr.k), bv).total;
      if (smem <= device.max_smem_per_block_optin) return false;
      choice.reasons.push_back(
          fmt::format("value tile {} rejected: {} bytes of shared memory > {} per block on {}", bv,
                      smem, device.max_smem_per_block_optin, device.name));
      return true;
    });
    if (tiles.empty()) {
      throw PlanError(fmt::format(
          "{}: no value tile fits the {} bytes of shared memory a block may use on {} (K = {}, "
          "V = {})",
          kOp, device.max_smem_per_block_optin, device.name, pr.k, pr.v));
    }
  }
  if (!force.empty() && force != "auto") {
    for (int bv : {64, 32, 16}) {
      if (force == fmt::format("bv{}", bv)) {
        if (std::find(tiles.begin(), tiles.end(), bv) == tiles.end()) {
          fail(
              fmt::format("options.force_mode '{}' needs V % {} == 0 and {} * K <= 8192 (V = {}, "
                          "K = {})",
                          force, bv, bv, pr.v, pr.k));
        }
        choice.bv = bv;
        choice.reasons.push_back(fmt::format("value tile {} forced by options.force_mode", bv));
        return choice;
      }
    }
    fail(fmt::format("options.force_mode '{}' is not a mode; accepted: {}", force, kModes));
  }
  // Blocks are (sequence, value head, value tile); each walks its sequence's chunks. A smaller
  // tile recomputes the chunk's A, T and P once more per extra tile but multiplies the blocks:
  // take the largest tile that still gives two blocks per SM, never below 32.
  const std::int64_t want = 2 * std::int64_t{device.sm_count};
  for (int bv : tiles) {
    const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / bv);
    if (blocks >= want || bv == 32 || bv == tiles.back()) {
      choice.bv = bv;
      choice.reasons.push_back(fmt::format(
          "value tile {}: {} blocks ({} sequences x {} value heads x {} tiles){}", bv, blocks,
          pr.seqs, pr.value_heads, pr.v / bv,
          blocks >= want ? fmt::format(" >= 2 per SM ({})", want)
                         : fmt::format(" < 2 per SM ({}); smaller tiles are not worth the "
                                       "recompute",
                                       want)));
      return choice;
    }
    choice.reasons.push_back(
        fmt::format("value tile {} rejected: {} blocks < 2 per SM ({})", bv, blocks, want));
  }
  fail("no value tile fits");  // unreachable: 16 divides every accepted V
}

// Largest bv * K of a state-kernel tile: 64 f32 registers per thread of its 4 or 8 warps.
std::int64_t state_tile_limit(int bv) { return 2048 * gdn_prefill_state_warps(bv); }

// The path and, on the chunked path, the state kernel's value tile. The chunked path takes the
// chunk-local work (A, its inverse, P, the decays) off the sequential path; it needs bf16
// inputs, 16-byte v rows and the shared memory of both kernels.
// `shown`: the mode as the caller spelled it, for messages (force without a _wgmma suffix).
Choice choose_path(const Problem& pr, const std::string& force, const DeviceLimits& device,
                   std::string_view shown) {
  const bool automatic = force.empty() || force == "auto";
  const bool forced_chunked = force.rfind("chunked", 0) == 0;
  if (!automatic && !forced_chunked) return choose_tile(pr, force, device);
  int forced_bv = 0;
  if (forced_chunked && force != "chunked") {
    for (int bv : {128, 64, 32, 16}) {
      if (force == fmt::format("chunked_bv{}", bv)) forced_bv = bv;
    }
    if (forced_bv == 0) {
      fail(fmt::format("options.force_mode '{}' is not a mode; accepted: {}", shown, kModes));
    }
    if (pr.v % forced_bv != 0 || forced_bv * pr.k > state_tile_limit(forced_bv)) {
      fail(
          fmt::format("options.force_mode '{}' needs V % {} == 0 and {} * K <= {} (V = {}, K = {})",
                      shown, forced_bv, forced_bv, state_tile_limit(forced_bv), pr.v, pr.k));
    }
  }
  const auto smem_of = [&](int bv) {
    return std::int64_t{gdn_prefill_state_smem(static_cast<int>(pr.k), bv).total};
  };
  const std::int64_t chunk_smem = gdn_prefill_chunk_smem(static_cast<int>(pr.k)).total;
  std::string why_not;
  std::vector<std::string> reasons;
  std::vector<int> tiles;
  if (!pr.bf16) {
    why_not = "q/k/v are f16, and the chunked path's state kernel multiplies raw bf16 rows";
  } else if (!pr.v16) {
    why_not =
        "v is not 16-byte aligned with token and head strides that are multiples of 8 elements "
        "(the chunked path copies v rows 16 bytes at a time)";
  } else if (chunk_smem > device.max_smem_per_block_optin) {
    why_not = fmt::format("its chunk kernel needs {} bytes of shared memory > {} per block on {}",
                          chunk_smem, device.max_smem_per_block_optin, device.name);
  } else {
    // Preference, from a sweep of every tile over 16..256 (sequence, value head) pairs on the
    // H200 (docs/performance.md, "The state kernel's value tile"): the smallest tile whose
    // blocks still fit one wave of one block per SM, since a chain split over more SMs walks
    // its chunks faster; 16 rows when even those fit, else 64 (32 never won); all of V in one
    // block of 8 warps once the 64-row blocks would double up on SMs (each chunk's q, k, T' and
    // P then cross into shared memory once per pair, not once per tile).
    const std::int64_t pairs = pr.seqs * pr.value_heads;
    const std::int64_t sms = device.sm_count;
    std::vector<int> order = pairs * (pr.v / 16) <= sms   ? std::vector<int>{16, 32, 64}
                             : pairs * (pr.v / 64) <= sms ? std::vector<int>{64, 32, 16}
                                                          : std::vector<int>{128, 64, 32, 16};
    if (forced_bv != 0) order = {forced_bv};
    for (int bv : order) {
      if (pr.v % bv != 0 || bv * pr.k > state_tile_limit(bv)) continue;
      if (smem_of(bv) > device.max_smem_per_block_optin) {
        reasons.push_back(fmt::format(
            "chunked value tile {} rejected: {} bytes of shared memory > {} per block on {}", bv,
            smem_of(bv), device.max_smem_per_block_optin, device.name));
        continue;
      }
      tiles.push_back(bv);
    }
    if (tiles.empty()) why_not = "no value tile of its state kernel fits the shared memory";
  }
  if (!why_not.empty()) {
    if (forced_chunked) {
      throw PlanError(fmt::format("{}: options.force_mode '{}': the chunked path cannot run: {}",
                                  kOp, shown, why_not));
    }
    Choice fused = choose_tile(pr, "", device);
    fused.reasons.insert(
        fused.reasons.begin(),
        fmt::format("fused single-kernel path: the chunked path is out, {}", why_not));
    return fused;
  }
  Choice choice;
  choice.chunked = true;
  choice.bv = tiles.front();
  choice.reasons = std::move(reasons);
  choice.reasons.insert(
      choice.reasons.begin(),
      fmt::format("chunked path{}: kernel 1 computes every chunk's T' = (I + A)^-1 diag(beta), "
                  "P and decay scales at once; kernel 2 walks each sequence's chunks with only "
                  "the state-dependent products on the sequential path",
                  forced_chunked ? " (forced by options.force_mode)" : ""));
  choice.reasons.push_back(fmt::format(
      "state kernel value tile {}{}: {} blocks ({} sequences x {} value heads x {} tiles), {} "
      "bytes of shared memory each",
      choice.bv,
      forced_bv != 0 ? " (forced)"
      : choice.bv == 128 && pr.seqs * pr.value_heads * (pr.v / 64) > device.sm_count
          ? fmt::format(" (all of V: the 64-row blocks of {} pairs would not fit {} SMs one each)",
                        pr.seqs * pr.value_heads, device.sm_count)
          : std::string(),
      pr.seqs * pr.value_heads * (pr.v / choice.bv), pr.seqs, pr.value_heads, pr.v / choice.bv,
      smem_of(choice.bv)));
  return choice;
}

// The context-parallel path (few long sequences). A sequence's chunks are cut into segments of
// L chunks; the state recurrence is affine in the state, so segment s's end state is X_s M_s +
// B_s with M_s [K, K] its end state from the identity (v = 0) and B_s its end state from zero.
// A segment pass computes M_s, B_s of the middle segments in parallel (and segment 0 exactly), a
// scan walks X_{s+1} = X_s M_s + B_s per sequence in f32, and a resume pass reruns segments 1 ..
// S - 1 from their exact X_s with outputs. Exact (no state is assumed), at about 2.2x the state
// kernel's work, in exchange for parallelism: it pays when the (sequence, value head) pairs
// leave most SMs idle.
struct CpDecision {
  std::int64_t chunks = 0;  // L; 0: not taken
  int bv = 0;
  int stages = 2;
  std::string reason;   // why taken (chunks > 0)
  std::string why_not;  // why not (an empty string with chunks == 0: not considered)
};

// The state rows per block of the context-parallel passes: the widest wide tile that divides K
// and V and whose shared memory a block may have (0: none).
int cp_tile(const Problem& pr, const DeviceLimits& device) {
  for (int bv : {128, 64}) {
    if (pr.k % bv != 0 || pr.v % bv != 0 || bv * pr.k > state_tile_limit(bv)) continue;
    if (gdn_prefill_state_smem(static_cast<int>(pr.k), bv).total <=
        device.max_smem_per_block_optin) {
      return bv;
    }
  }
  return 0;
}

// Segment ids of a call: floor(T / (64 L)) + N (see CpWork in gdn_prefill_state.cuh).
std::int64_t cp_segments(const Problem& pr, std::int64_t chunks) {
  return pr.tokens / (kGdnPrefillChunk * chunks) + pr.seqs;
}

std::int64_t cp_workspace_bytes(const Problem& pr, std::int64_t chunks) {
  const GdnPrefillWorkspace base = gdn_prefill_workspace(
      static_cast<std::uint64_t>(pr.tokens), static_cast<std::uint64_t>(pr.value_heads));
  return static_cast<std::int64_t>(
      gdn_prefill_cp_workspace(base.total, static_cast<std::uint64_t>(cp_segments(pr, chunks)),
                               static_cast<std::uint64_t>(pr.value_heads),
                               static_cast<std::uint64_t>(pr.k), static_cast<std::uint64_t>(pr.v))
          .total);
}

// `forced_chunks`: L from the mode (0: the planner's). `user_workspace`: bytes of the caller's
// options.workspace (-1: kjit allocates it). The rule, from the H200 (docs/performance.md):
// the sequential state kernel takes (longest sequence) x t per chunk; the context-parallel
// passes about 2.2 x (all chunks x HV x V / bv) / SMs x t. With P (sequence, value head) pairs
// of equal length that is a gain of SMs / (2.2 P): taken when 3 P <= SMs. L spreads the resume
// pass over about one wave of blocks, at least kCpMinChunks so the scan stays short.
// `explain`: format the reason texts (plans); a launch's memo key needs only the numbers.
CpDecision decide_cp(const Problem& pr, const DeviceLimits& device, std::int64_t user_workspace,
                     std::int64_t forced_chunks, bool forced, int forced_stages, bool explain) {
  constexpr std::int64_t kCpMinChunks = 16;
  CpDecision d;
  if (pr.k > 128) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: K = {} > 128 (its passes use the wide state tiles)", pr.k);
    return d;
  }
  d.bv = cp_tile(pr, device);
  if (d.bv == 0) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: no state tile of 64 or 128 rows fits the {} bytes of shared "
          "memory a block may use on {}",
          device.max_smem_per_block_optin, device.name);
    return d;
  }
  const std::int64_t tiles = pr.v / d.bv;
  const std::int64_t pairs = pr.seqs * pr.value_heads;
  const std::int64_t work = pr.tokens / kGdnPrefillChunk * pr.value_heads * tiles;
  std::int64_t chunks = forced_chunks;
  if (chunks == 0) {
    chunks = std::max<std::int64_t>(kCpMinChunks, (work + device.sm_count - 1) / device.sm_count);
  }
  if (!forced) {
    if (3 * pairs > std::int64_t{device.sm_count}) {
      if (explain)
        d.why_not = fmt::format(
            "no context-parallel path: {} (sequence, value head) pairs, 3 x {} > {} SMs (it does "
            "~2.2x the state work; it pays when the pairs leave most SMs idle)",
            pairs, pairs, device.sm_count);
      return d;
    }
    if (pr.tokens < 3 * kGdnPrefillChunk * chunks * pr.seqs) {
      if (explain)
        d.why_not = fmt::format(
            "no context-parallel path: {} tokens over {} sequences are fewer than 3 segments of {} "
            "chunks each",
            pr.tokens, pr.seqs, chunks);
      return d;
    }
  }
  const std::int64_t need = cp_workspace_bytes(pr, chunks);
  if (user_workspace >= 0 && user_workspace < need) {
    if (explain)
      d.why_not = fmt::format(
          "{}context-parallel path: options.workspace holds {} bytes, it needs {} (segments of {} "
          "chunks)",
          forced ? "" : "no ", user_workspace, need, chunks);
    return d;
  }
  const std::int64_t segments = cp_segments(pr, chunks);
  const std::int64_t resume_blocks = segments * pr.value_heads * tiles;
  if (resume_blocks + segments * pr.value_heads * (pr.k / d.bv) >
      std::int64_t{device.max_grid_dim[0]}) {
    if (explain)
      d.why_not =
          fmt::format("context-parallel path out: {} segment ids x {} value heads exceed grid x",
                      segments, pr.value_heads);
    return d;
  }
  // Two input stages unless forced: a third (where the shared memory holds it) was no faster on
  // the H200 (docs/performance.md, "Few long sequences").
  const auto stage_fits = [&](int stages) {
    return gdn_prefill_state_smem(static_cast<int>(pr.k), d.bv, stages).total <=
           device.max_smem_per_block_optin;
  };
  d.stages = forced_stages > 0 ? forced_stages : 2;
  if (!stage_fits(d.stages)) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: {} input stages of the {}-row tile need {} bytes of shared "
          "memory > {} per block on {}",
          d.stages, d.bv, gdn_prefill_state_smem(static_cast<int>(pr.k), d.bv, d.stages).total,
          device.max_smem_per_block_optin, device.name);
    return d;
  }
  d.chunks = chunks;
  if (explain)
    d.reason = fmt::format(
        "context-parallel state{}: segments of {} chunks ({} tokens), {} segment ids; {} "
        "(sequence, "
        "value head) pairs would leave {} of {} SMs idle. Segment pass: end states from zero and "
        "the identity (the segment's linear map M) in parallel; scan: X_(s+1) = X_s M_s + B_s in "
        "f32; resume pass: each segment from its exact initial state, value tile {}, {} input "
        "stages",
        forced ? " (forced by options.force_mode)" : "", chunks, chunks * kGdnPrefillChunk,
        segments, pairs, std::max<std::int64_t>(0, device.sm_count - pairs * tiles),
        device.sm_count, d.bv, d.stages);
  return d;
}

// A force_mode of the context-parallel path: "chunked_cp" (the planner's L) or "chunked_cp<L>",
// optionally + "_s2" / "_s3". `considered`: auto or such a mode (the others never take it).
struct CpMode {
  bool considered = false;
  bool forced = false;
  std::int64_t chunks = 0;  // 0: the planner's
  int stages = 0;           // 0: the planner's
};

CpMode parse_cp_mode(const std::string& force) {
  CpMode mode;
  if (force.empty() || force == "auto") {
    mode.considered = true;
    return mode;
  }
  if (force.rfind(kCpPrefix, 0) != 0) return mode;
  mode.considered = mode.forced = true;
  std::string digits = force.substr(kCpPrefix.size());
  for (int st : {2, 3}) {
    const std::string suffix = fmt::format("_s{}", st);
    if (digits.ends_with(suffix)) {
      mode.stages = st;
      digits.resize(digits.size() - suffix.size());
    }
  }
  if (!digits.empty()) {
    const bool numeric =
        digits.size() <= 6 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    mode.chunks = numeric ? std::stoll(digits) : 0;
    if (mode.chunks < 1) {
      fail(fmt::format("options.force_mode '{}' is not a mode; accepted: {}", force, kModes));
    }
  }
  return mode;
}

// The context-parallel decision for a call: the one the plan takes (choose) and, without
// texts, the launch's memo key (it depends on T and the caller's workspace, which the rest of
// the key does not hold). chunks == 0 when not taken or not considered.
CpDecision cp_decision(const Problem& pr, const GdnPrefillOptions& options,
                       const DeviceLimits& device, bool explain) {
  const CpMode mode = parse_cp_mode(options.force_mode);
  if (!mode.considered) return {};
  return decide_cp(pr, device, given(options.workspace) ? options.workspace.shape[0] : -1,
                   mode.chunks, mode.forced, mode.stages, explain);
}

// choose_path, after taking a "_wgmma" suffix off a chunked mode. The state kernel's wide tiles
// (value tile >= 64, K <= 128) can multiply on warpgroup wgmma, which reads each chunk's k, q, T'
// and P from shared memory once per four warps instead of once per warp. It exists only in the
// arch-specific target sm_90a (not on sm_100 and later), and on the H200 it was slower than
// mma.sync (docs/performance.md), so it is never chosen, only asked for.
Choice choose(const Problem& pr, const std::string& force, const DeviceLimits& device,
              std::int64_t user_workspace) {
  if (force.rfind(kCpPrefix, 0) == 0) {
    const CpMode mode = parse_cp_mode(force);
    Choice choice = choose_path(pr, "chunked", device, force);
    const CpDecision cp =
        decide_cp(pr, device, user_workspace, mode.chunks, true, mode.stages, true);
    if (!cp.why_not.empty()) {
      throw PlanError(
          fmt::format("{}: options.force_mode '{}': the context-parallel path cannot run: {}", kOp,
                      force, cp.why_not));
    }
    choice.cp_chunks = cp.chunks;
    choice.cp_stages = cp.stages;
    choice.bv = cp.bv;
    choice.reasons.back() = cp.reason;  // in place of the sequential state kernel's tile
    return choice;
  }
  if (!(force.rfind("chunked", 0) == 0 && force.ends_with(kWgmmaSuffix))) {
    if (force.empty() || force == "auto") {
      Choice choice = choose_path(pr, force, device, force);
      if (choice.chunked) {
        const CpDecision cp = decide_cp(pr, device, user_workspace, 0, false, 0, true);
        if (cp.chunks > 0) {
          choice.cp_chunks = cp.chunks;
          choice.cp_stages = cp.stages;
          choice.bv = cp.bv;
          choice.reasons.back() = cp.reason;  // in place of the sequential state kernel's tile
        } else {
          choice.reasons.push_back(cp.why_not);
        }
      }
      return choice;
    }
    return choose_path(pr, force, device, force);
  }
  Choice choice =
      choose_path(pr, force.substr(0, force.size() - kWgmmaSuffix.size()), device, force);
  // (A wide tile at K > 128 never gets here: state_tile_limit refuses it in choose_path.)
  if (!(device.arch.major == 9 && device.arch.minor == 0) || !gdn_prefill_state_wide(choice.bv)) {
    throw PlanError(fmt::format(
        "{}: options.force_mode '{}': warpgroup wgmma needs compute capability 9.0 (sm_90a), a "
        "value tile of 64 or 128 and K <= 128; here {}, value tile {}, K = {}",
        kOp, force, device.arch.str(), choice.bv, pr.k));
  }
  choice.wgmma = true;
  choice.reasons.push_back(fmt::format(
      "state kernel on warpgroup wgmma (forced by options.force_mode '{}'): compiled for sm_90a",
      force));
  return choice;
}

std::string checkpoint_reason(std::int64_t every) {
  return every > 0 ? fmt::format(
                         "state checkpoints every {} tokens ({} chunks of {}): each sequence "
                         "writes floor(length / {}) states to options.state_checkpoints from "
                         "row checkpoint_cu_starts[n] (kernel ckpt=1)",
                         every, every / kGdnPrefillChunk, kGdnPrefillChunk, every)
                   : std::string("no state checkpoints (kernel ckpt=0)");
}

// Blocks of the chunk kernel along x: a grid-stride loop covers the floor(T / 64) + N chunk ids,
// so the launch shape (and the memoized plan) does not depend on T. About 32 blocks per SM in
// all, whatever H is: ~10 waves of the 3 resident blocks, so the last wave's imbalance is
// small, while blocks past the chunk count of a short call exit at once.
std::int64_t chunk_grid_x(const Problem& pr, const DeviceLimits& device) {
  return std::max<std::int64_t>(1, (32 * std::int64_t{device.sm_count} + pr.heads - 1) / pr.heads);
}

// Whether the state kernel takes the sequences longest first (ranked by its own blocks up to
// kGdnPrefillRankInStateMaxSeqs sequences, else by the chunk kernel into the workspace):
// a batch of one needs no order, and the workspace holds kGdnPrefillOrderMaxSeqs ranks. A
// function of the sequence count only, which the memoized plans are keyed by (T is not).
bool orders_longest_first(const Problem& pr) {
  return pr.seqs > 1 && pr.seqs <= kGdnPrefillOrderMaxSeqs;
}

// Every specialization value of the three gdn_prefill families for a problem, by parameter
// name, computed once: each family's spec (family_spec) keeps the ones it declares.
using SpecValues = std::vector<std::pair<std::string, std::string>>;

SpecValues spec_values(const Problem& pr, const TensorView& q, const GdnGates& gates,
                       const TensorView& cu_seqlens, const TensorView& state,
                       const TensorView& state_indices, const TensorView& out,
                       const GdnPrefillOptions& options, int bv) {
  const bool raw = gates.kind == GdnGateKind::raw;
  return {{"qkv", std::string(to_string(q.dtype))},
          {"gate", std::string(to_string(gates.a.dtype))},
          {"param", std::string(raw ? to_string(gates.a_log.dtype) : "f32")},
          {"state", std::string(to_string(state.dtype))},
          {"out", std::string(to_string(out.dtype))},
          {"cu", std::string(to_string(cu_seqlens.dtype))},
          {"index", std::string(to_string(state_indices.dtype))},
          {"k", std::to_string(pr.k)},
          {"v", std::to_string(pr.v)},
          {"bv", std::to_string(bv)},
          {"gated", raw ? "0" : "1"},
          {"l2norm", options.l2norm_qk ? "1" : "0"},
          {"ckpt", options.checkpoint_every_n_tokens > 0 ? "1" : "0"},
          {"phase", "1"},
          {"stages", "2"},
          // Left out of V-major specs (the families' omitted default): their text is unchanged.
          {"state_layout", pr.k_major ? "kv" : "vk"}};
}

KernelSpec family_spec(std::string_view family, const SpecValues& values, Arch arch) {
  SpecValues params;
  for (const codegen::ParamDecl& decl : codegen::find_family(family).params) {
    for (const auto& value : values) {
      if (value.first == decl.name) params.push_back(value);
    }
  }
  return KernelSpec::make(family, std::move(params), arch);
}

// The context-parallel plan: the chunk kernel, the segment pass (starting during the chunk
// kernel's tail when each of its blocks fills an SM), the scan, the resume pass.
Plan make_cp_plan(const Problem& pr, Plan plan, KernelSpec chunk_spec, LaunchShape chunk_shape,
                  SpecValues values, const Choice& choice, const DeviceLimits& device) {
  const std::int64_t segments = cp_segments(pr, choice.cp_chunks);
  const std::int64_t v_tiles = pr.v / choice.bv, k_tiles = pr.k / choice.bv;
  for (auto& value : values) {
    if (value.first == "stages") value.second = std::to_string(choice.cp_stages);
  }
  KernelSpec segment_spec = family_spec("gdn_prefill_state_cp", values, device.arch);
  // (A std::string built first and moved in: assigning the literal made GCC 12 at -O3 report a
  // false -Wrestrict overlap, which failed Release builds with KJIT_WERROR.)
  for (auto& value : values) {
    if (value.first == "phase") value.second = std::string(1, '2');
  }
  KernelSpec resume_spec = family_spec("gdn_prefill_state_cp", values, device.arch);
  KernelSpec scan_spec = family_spec("gdn_prefill_cp_scan", values, device.arch);
  const auto state_shape = [&](std::int64_t blocks) {
    if (blocks > device.max_grid_dim[0]) {
      throw PlanError(fmt::format("{}: grid x is {}, a context-parallel pass needs {} blocks", kOp,
                                  device.max_grid_dim[0], blocks));
    }
    LaunchShape shape;
    shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
    shape.block = Dim3{static_cast<std::uint32_t>(32 * gdn_prefill_state_warps(choice.bv)), 1, 1};
    shape.dynamic_smem =
        gdn_prefill_state_smem(static_cast<int>(pr.k), choice.bv, choice.cp_stages).total;
    return shape;
  };
  LaunchShape segment_shape = state_shape(segments * pr.value_heads * (v_tiles + k_tiles));
  segment_shape.overlaps_previous =
      supports_programmatic_launch(device.arch) &&
      occupancy_blocks_per_sm(segment_shape, device, FunctionLimits{}) == 1;
  const LaunchShape resume_shape = state_shape(segments * pr.value_heads * v_tiles);
  const std::int64_t scan_blocks = pr.seqs * pr.value_heads * (pr.v / kGdnPrefillCpScanRows);
  if (scan_blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the context-parallel scan needs {} blocks", kOp,
                                device.max_grid_dim[0], scan_blocks));
  }
  LaunchShape scan_shape;
  scan_shape.grid = Dim3{static_cast<std::uint32_t>(scan_blocks), 1, 1};
  scan_shape.block = Dim3{kGdnPrefillCpScanThreads, 1, 1};
  scan_shape.dynamic_smem = gdn_prefill_cp_scan_smem(static_cast<int>(pr.k));
  plan.reasons.push_back(fmt::format(
      "chunk kernel: {} x {} blocks; segment pass: {} blocks ({} segment ids x {} value heads x "
      "({} state + {} identity tiles)){}; scan: {} blocks of {} rows; resume pass: {} blocks",
      chunk_shape.grid.x, chunk_shape.grid.y, segment_shape.grid.x, segments, pr.value_heads,
      v_tiles, k_tiles,
      segment_shape.overlaps_previous ? ", started during the chunk kernel's tail" : "",
      scan_shape.grid.x, kGdnPrefillCpScanRows, resume_shape.grid.x));
  plan.reasons.push_back(
      fmt::format("workspace: T x HV x {} bytes plus {} bytes of segment states and maps",
                  2 * kGdnPrefillWsRowBytes + kGdnPrefillWsScaleBytes,
                  cp_workspace_bytes(pr, choice.cp_chunks) -
                      gdn_prefill_workspace_bytes(pr.tokens, pr.value_heads)));
  for (auto [spec, shape] :
       {std::pair{&chunk_spec, chunk_shape}, std::pair{&segment_spec, segment_shape},
        std::pair{&scan_spec, scan_shape}, std::pair{&resume_spec, resume_shape}}) {
    PlannedLaunch launch{std::move(*spec), shape, check_launch(shape, device)};
    require_legal(launch.checks, fmt::format("{} ({})", kOp, launch.spec.str()));
    plan.launches.push_back(std::move(launch));
  }
  return plan;
}

Plan make_chunked_plan(const Problem& pr, Choice choice, const TensorView& q, const GdnGates& gates,
                       const TensorView& cu_seqlens, const TensorView& state,
                       const TensorView& state_indices, const TensorView& out,
                       const GdnPrefillOptions& options, const DeviceLimits& device) {
  const std::int64_t every = options.checkpoint_every_n_tokens;
  Plan plan;
  plan.op = kOp;
  plan.mode = choice.cp_chunks > 0 ? fmt::format("chunked_cp{}_bv{}", choice.cp_chunks, choice.bv)
                                   : fmt::format("chunked_bv{}", choice.bv);
  plan.reasons = std::move(choice.reasons);
  plan.device = device;
  plan.reasons.push_back(checkpoint_reason(every));
  plan.reasons.push_back(
      fmt::format("workspace: T x HV x {} bytes (T' and P rows, scales; options.workspace, else "
                  "cuMemAllocAsync on the call's stream)",
                  2 * kGdnPrefillWsRowBytes + kGdnPrefillWsScaleBytes));
  if (pr.seqs == 0) {
    plan.reasons.push_back("no sequences: nothing to launch");
    return plan;
  }
  const SpecValues values =
      spec_values(pr, q, gates, cu_seqlens, state, state_indices, out, options, choice.bv);
  KernelSpec chunk_spec = family_spec("gdn_prefill_chunk", values, device.arch);
  KernelSpec state_spec =
      family_spec("gdn_prefill_state", values, choice.wgmma ? Arch{9, 0, 'a'} : device.arch);
  if (pr.heads > device.max_grid_dim[1]) {
    throw PlanError(fmt::format("{}: grid y is {}, the chunk kernel needs H = {}", kOp,
                                device.max_grid_dim[1], pr.heads));
  }
  LaunchShape chunk_shape;
  chunk_shape.grid = Dim3{static_cast<std::uint32_t>(chunk_grid_x(pr, device)),
                          static_cast<std::uint32_t>(pr.heads), 1};
  chunk_shape.block = Dim3{kGdnPrefillThreads, 1, 1};
  chunk_shape.dynamic_smem = gdn_prefill_chunk_smem(static_cast<int>(pr.k)).total;
  if (choice.cp_chunks > 0) {
    return make_cp_plan(pr, std::move(plan), chunk_spec, chunk_shape, values, choice, device);
  }
  const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / choice.bv);
  if (blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the state kernel needs {} blocks", kOp,
                                device.max_grid_dim[0], blocks));
  }
  LaunchShape state_shape;
  state_shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  state_shape.block =
      Dim3{static_cast<std::uint32_t>(32 * gdn_prefill_state_warps(choice.bv)), 1, 1};
  state_shape.dynamic_smem = gdn_prefill_state_smem(static_cast<int>(pr.k), choice.bv).total;
  // The state kernel's blocks take the SMs the chunk kernel's last blocks leave, and find their
  // sequence and load their initial state before they wait for its results.
  // Started early, the blocks land on the SMs the chunk kernel frees first, as many per SM as
  // fit, so the longest sequences (the first blocks) would share SMs while others idle. So the
  // overlap is taken only where each block gets an SM of its own: when one block's shared
  // memory already fills more than half an SM (the value tile of 128), or when the grid fits
  // the SMs and asking for just over half an SM's shared memory costs nothing.
  const bool one_per_sm = occupancy_blocks_per_sm(state_shape, device, FunctionLimits{}) == 1;
  // The least shared memory (in 128-byte steps) of which an SM holds one block only.
  const std::int64_t smem_one_per_sm =
      (device.max_smem_per_sm / 2 - device.reserved_smem_per_block + 1 + 127) / 128 * 128;
  const bool spread = !one_per_sm && blocks <= device.sm_count &&
                      smem_one_per_sm <= device.max_smem_per_block_optin;
  state_shape.overlaps_previous =
      supports_programmatic_launch(device.arch) && (one_per_sm || spread);
  if (state_shape.overlaps_previous && spread) {
    state_shape.dynamic_smem = static_cast<std::uint32_t>(smem_one_per_sm);
  }
  plan.reasons.push_back(fmt::format(
      "chunk kernel: {} x {} blocks of {} threads loop over the floor(T / {}) + N chunk ids, {} "
      "bytes of shared memory; state kernel: one block per (sequence, value head, value tile), "
      "{}",
      chunk_shape.grid.x, chunk_shape.grid.y, kGdnPrefillThreads, kGdnPrefillChunk,
      chunk_shape.dynamic_smem,
      orders_longest_first(pr)
          ? fmt::format("longest sequences first (ranked by chunk count, by the state kernel's "
                        "blocks up to {} sequences, else by the chunk kernel; a sequence bounds "
                        "the time once it starts late)",
                        kGdnPrefillRankInStateMaxSeqs)
          : fmt::format("in sequence order (longest-first ranking is kept for 2 to {} sequences)",
                        kGdnPrefillOrderMaxSeqs)));
  plan.reasons.push_back(
      state_shape.overlaps_previous
          ? fmt::format("state kernel starts while the chunk kernel's last blocks run "
                        "(programmatic dependent launch): it ranks the sequences and loads the "
                        "initial states, then waits for the chunk kernel's results{}",
                        spread ? fmt::format("; its {} blocks ask for {} bytes of shared memory "
                                             "(one block per SM, as on an idle GPU)",
                                             blocks, smem_one_per_sm)
                               : std::string())
      : !supports_programmatic_launch(device.arch)
          ? fmt::format("state kernel starts after the chunk kernel (programmatic dependent "
                        "launch needs sm_90 or later; {})",
                        device.arch.str())
          : fmt::format("state kernel starts after the chunk kernel: {} blocks, several per "
                        "SM, would pile onto the SMs the chunk kernel frees first",
                        blocks));
  PlannedLaunch chunk{std::move(chunk_spec), chunk_shape, check_launch(chunk_shape, device)};
  require_legal(chunk.checks, fmt::format("{} ({})", kOp, chunk.spec.str()));
  PlannedLaunch rec{std::move(state_spec), state_shape, check_launch(state_shape, device)};
  require_legal(rec.checks, fmt::format("{} ({})", kOp, rec.spec.str()));
  plan.launches.push_back(std::move(chunk));
  plan.launches.push_back(std::move(rec));
  return plan;
}

Plan make_plan(const Problem& pr, const TensorView& q, const GdnGates& gates,
               const TensorView& cu_seqlens, const TensorView& state,
               const TensorView& state_indices, const TensorView& out,
               const GdnPrefillOptions& options, const DeviceLimits& device) {
  Choice choice = choose(pr, options.force_mode, device,
                         given(options.workspace) ? options.workspace.shape[0] : -1);
  const std::int64_t every = options.checkpoint_every_n_tokens;
  const bool ckpt = every > 0;
  if (pr.k_major) {
    choice.reasons.push_back(
        "state layout kv: the pool (and the final states and checkpoints) have V contiguous "
        "(strides [*, V*K, 1, V]: a transposed [.., HV, K, V] tensor); the state kernels read and "
        "write element (v, k) at k * V + v (spec state_layout=kv)");
  }
  if (choice.chunked) {
    return make_chunked_plan(pr, std::move(choice), q, gates, cu_seqlens, state, state_indices, out,
                             options, device);
  }
  KernelSpec spec = family_spec(
      "gdn_prefill",
      spec_values(pr, q, gates, cu_seqlens, state, state_indices, out, options, choice.bv),
      device.arch);
  Plan plan;
  plan.op = kOp;
  plan.mode = fmt::format("bv{}", choice.bv);
  plan.reasons = std::move(choice.reasons);
  plan.device = device;
  plan.reasons.push_back(
      ckpt
          ? fmt::format("state checkpoints every {} tokens ({} chunks of {}): each sequence writes "
                        "floor(length / {}) states to options.state_checkpoints from row "
                        "checkpoint_cu_starts[n] (kernel ckpt=1)",
                        every, every / kGdnPrefillChunk, kGdnPrefillChunk, every)
          : std::string("no state checkpoints (kernel ckpt=0)"));
  if (pr.seqs == 0) {
    plan.reasons.push_back("no sequences: nothing to launch");
    return plan;
  }
  const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / choice.bv);
  LaunchShape shape;
  shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(blocks, (std::int64_t{1} << 32) - 1)),
           1, 1};
  shape.block = Dim3{kGdnPrefillThreads, 1, 1};
  shape.dynamic_smem = gdn_prefill_smem(static_cast<int>(pr.k), choice.bv).total;
  if (blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the launch needs {} blocks", kOp,
                                device.max_grid_dim[0], blocks));
  }
  plan.reasons.push_back(fmt::format(
      "one block of {} threads per (sequence, value head, value tile) walks its chunks of {} "
      "tokens; {} bytes of dynamic shared memory",
      kGdnPrefillThreads, kGdnPrefillChunk, shape.dynamic_smem));
  PlannedLaunch launch{std::move(spec), shape, check_launch(shape, device)};
  require_legal(launch.checks, fmt::format("{} ({})", kOp, launch.spec.str()));
  plan.launches.push_back(std::move(launch));
  return plan;
}

// The memo key of one call: everything the plan depends on, nothing it does not (pointers and
// strides go to the parameter block). All fields are 8 bytes, so there is no padding.
struct Signature {
  std::int64_t device = 0;
  std::int64_t seqs = 0, value_heads = 0, heads = 0, k = 0, v = 0;
  std::int64_t dtypes = 0;
  std::int64_t flags = 0;
  std::int64_t checkpoint_every = 0;
  /// The context-parallel decision depends on T and on the caller's workspace size (neither is
  /// otherwise in the key): its segment length, or 0.
  std::int64_t cp_chunks = 0;
  char force[32] = {};
};

}  // namespace

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
  const Problem pr =
      validate(q, k, v, gates, cu_seqlens, state, state_indices, has_initial_state, out, options);
  Plan plan = make_plan(pr, q, gates, cu_seqlens, state, state_indices, out, options, device);
  if (plan.launches.size() >= 2) {
    const std::int64_t cp_chunks =
        plan.launches.size() == 4 ? cp_decision(pr, options, device, false).chunks : 0;
    plan.reasons.push_back(
        fmt::format("workspace for T = {}: {} bytes", pr.tokens,
                    cp_chunks > 0 ? cp_workspace_bytes(pr, cp_chunks)
                                  : gdn_prefill_workspace_bytes(pr.tokens, pr.value_heads)));
  }
  return plan;
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
  const Problem pr =
      validate(q, k, v, gates, cu_seqlens, state, state_indices, has_initial_state, out, options);
  if (pr.seqs == 0) return;
  const bool ckpt = options.checkpoint_every_n_tokens > 0;
  // Planning accepts null pointers; a launch needs real ones (an empty checkpoint tensor may
  // stay null: no row is ever written).
  if (ckpt && options.checkpoint_cu_starts.data == nullptr) {
    fail("options.checkpoint_cu_starts has a null data pointer; accepted: a device pointer");
  }
  if (ckpt && options.state_checkpoints.data == nullptr && options.state_checkpoints.shape[0] > 0) {
    fail(fmt::format(
        "options.state_checkpoints has a null data pointer and {} rows; accepted: a device "
        "pointer, or 0 rows",
        options.state_checkpoints.shape[0]));
  }
  if (options.force_mode.size() >= sizeof(Signature::force)) {
    fail(fmt::format("options.force_mode '{}' is not a mode; accepted: {}", options.force_mode,
                     kModes));
  }
  Runtime& runtime = options.runtime != nullptr ? *options.runtime : Runtime::global();
  const int device = runtime.device_of(stream, options.device);

  Signature sig{};
  sig.device = device;
  sig.seqs = pr.seqs;
  sig.value_heads = pr.value_heads;
  sig.heads = pr.heads;
  sig.k = pr.k;
  sig.v = pr.v;
  const bool raw = gates.kind == GdnGateKind::raw;
  sig.dtypes = static_cast<std::int64_t>(q.dtype) | static_cast<std::int64_t>(gates.a.dtype) << 8 |
               static_cast<std::int64_t>(raw ? gates.a_log.dtype : DType::f32) << 16 |
               static_cast<std::int64_t>(state.dtype) << 24 |
               static_cast<std::int64_t>(out.dtype) << 32 |
               static_cast<std::int64_t>(cu_seqlens.dtype) << 40 |
               static_cast<std::int64_t>(state_indices.dtype) << 48;
  sig.flags = (raw ? 1 : 0) | (options.l2norm_qk ? 2 : 0) | (pr.v16 ? 4 : 0) | (pr.k_major ? 8 : 0);
  // The plan's text names the interval, so it is part of the key, not just ckpt on/off.
  sig.checkpoint_every = options.checkpoint_every_n_tokens;
  std::memcpy(sig.force, options.force_mode.data(), options.force_mode.size());
  // The context-parallel decision (a function of T, N, HV, the SM count and the caller's
  // workspace) goes into the key; the plan takes the same one.
  sig.cp_chunks = cp_decision(pr, options, runtime.device_limits(device), false).chunks;

  const Runtime::ResolvedPlan& resolved = runtime.memoized(sig, stream, [&] {
    return std::pair{make_plan(pr, q, gates, cu_seqlens, state, state_indices, out, options,
                               runtime.device_limits(device)),
                     device};
  });
  const bool chunked = resolved.plan.launches.size() >= 2;
  const std::int64_t cp_chunks = resolved.plan.launches.size() == 4 ? sig.cp_chunks : 0;
  const std::string_view mode = resolved.plan.mode;
  const int bv = mode.ends_with("bv16")    ? 16
                 : mode.ends_with("bv32")  ? 32
                 : mode.ends_with("bv128") ? 128
                                           : 64;

  GdnPrefillParams p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.a = gates.a.data;
  p.b = gates.b.data;
  p.a_log = raw ? gates.a_log.data : nullptr;
  p.dt_bias = raw ? gates.dt_bias.data : nullptr;
  p.cu_seqlens = cu_seqlens.data;
  p.state_indices = state_indices.data;
  p.has_initial_state = static_cast<const unsigned char*>(has_initial_state.data);
  p.state = state.data;
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
  p.state_slot_stride = state.strides[0];
  p.final_seq_stride = options.final_state.data != nullptr ? options.final_state.strides[0] : 0;
  p.index_stride = state_indices.strides[0];
  p.has_init_stride = has_initial_state.data != nullptr ? has_initial_state.strides[0] : 0;
  p.num_slots = pr.slots;
  p.ckpt_slot_stride = ckpt ? options.state_checkpoints.strides[0] : 0;
  p.ckpt_rows = ckpt ? options.state_checkpoints.shape[0] : 0;
  p.ckpt_every_chunks = ckpt ? options.checkpoint_every_n_tokens / kGdnPrefillChunk : 0;
  p.num_seqs = static_cast<u32>(pr.seqs);
  p.num_value_heads = static_cast<u32>(pr.value_heads);
  p.heads_per_group = static_cast<u32>(pr.value_heads / pr.heads);
  p.v_tiles = static_cast<u32>(pr.v / bv);
  p.scale = options.scale > 0.0f ? options.scale
                                 : static_cast<float>(1.0 / std::sqrt(static_cast<double>(pr.k)));
  p.softplus_threshold = options.softplus_threshold;
  p.num_heads = static_cast<u32>(pr.heads);
  p.num_tokens = pr.tokens;
  if (cp_chunks > 0) {
    p.k_tiles = static_cast<u32>(pr.k / bv);
    p.cp_segment_chunks = cp_chunks;
    p.cp_segments = cp_segments(pr, cp_chunks);
  }
  if (!chunked) {
    runtime.launch(resolved, 0, stream, &p, sizeof p);
    return;
  }

  // The chunked path: the caller's workspace, else a stream-ordered allocation from kjit's
  // workspace pool (driver/memory.hpp), freed on the same stream after the state kernel (no
  // host synchronization; under capture both become graph memory nodes).
  const GdnPrefillWorkspace ws = gdn_prefill_workspace(static_cast<std::uint64_t>(pr.tokens),
                                                       static_cast<std::uint64_t>(pr.value_heads));
  // The context-parallel path's regions follow the chunked path's (total: all of them).
  const GdnPrefillCpWorkspace cw =
      cp_chunks > 0 ? gdn_prefill_cp_workspace(ws.total, static_cast<std::uint64_t>(p.cp_segments),
                                               static_cast<std::uint64_t>(pr.value_heads),
                                               static_cast<std::uint64_t>(pr.k),
                                               static_cast<std::uint64_t>(pr.v))
                    : GdnPrefillCpWorkspace{ws.total, ws.total, ws.total, ws.total};
  const std::uint64_t ws_total = cw.total;
  auto* base = static_cast<unsigned char*>(options.workspace.data);
  CUdeviceptr owned = 0;
  const CUstream cu_stream = reinterpret_cast<CUstream>(stream);
  if (base == nullptr && ws_total > 0) {
    driver::ScopedContext scoped(static_cast<CUcontext>(resolved.context));
    try {
      owned = driver::allocate_workspace(resolved.device, ws_total, cu_stream, kOp);
    } catch (const DriverError& error) {
      throw DriverError(fmt::format("{}; pass options.workspace ({} bytes for this call, as "
                                    "plan_gdn_prefill's reasons say) instead",
                                    error.what(), ws_total),
                        error.result(), error.call());
    }
    base = reinterpret_cast<unsigned char*>(owned);
  }
  p.ws_t = base != nullptr ? base + ws.t : nullptr;
  p.ws_p = base != nullptr ? base + ws.p : nullptr;
  p.ws_scales = base != nullptr ? base + ws.scales : nullptr;
  p.ws_order = base != nullptr && orders_longest_first(pr) ? base + ws.order : nullptr;
  if (cp_chunks > 0 && base != nullptr) {
    p.cp_b = reinterpret_cast<float*>(base + cw.b);
    p.cp_m = reinterpret_cast<float*>(base + cw.m);
    p.cp_x = reinterpret_cast<float*>(base + cw.x);
    // The segment and resume passes find sequences by their offsets, not by rank.
    p.ws_order = nullptr;
  }
  const auto release = [&]() noexcept {
    if (owned == 0) return;
    try {
      driver::ScopedContext scoped(static_cast<CUcontext>(resolved.context));
      (void)driver::loaded_api().cuMemFreeAsync(owned, cu_stream);
    } catch (...) {
    }
  };
  try {
    for (std::size_t i = 0; i < resolved.plan.launches.size(); ++i) {
      runtime.launch(resolved, i, stream, &p, sizeof p);
    }
  } catch (...) {
    release();
    throw;
  }
  if (owned != 0) {
    driver::ScopedContext scoped(static_cast<CUcontext>(resolved.context));
    driver::check(driver::loaded_api().cuMemFreeAsync(owned, cu_stream), "cuMemFreeAsync");
  }
}

}  // namespace kjit
