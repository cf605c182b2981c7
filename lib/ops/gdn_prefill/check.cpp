// SPDX-License-Identifier: Apache-2.0
// gdn_prefill: argument and option checks -> Problem, and the parse of options.force_mode.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kjit/error.hpp"
#include "ops/gdn_prefill/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit::ops::prefill {

[[noreturn]] void fail(const std::string& message) { ArgChecks(kOp).fail(message); }

namespace {

constexpr ArgChecks kChecks(kOp);
constexpr const char* kInner = "the last dimension must be contiguous";

// The asserted wording of this family's rank checks ("<argument> must have rank R (<layout>)")
// predates the shared vocabulary's; tests pin it, so it stays.
void require_rank(const TensorView& t, const char* name, int rank, const char* layout) {
  if (t.rank != rank) {
    fail(fmt::format("{} must have rank {} ({}), got {}", name, rank, layout, t.str()));
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
  kChecks.dtype_of("options.state_checkpoints", ck, state.dtype, "the dtype of state");
  kChecks.dim("options.state_checkpoints", ck, 1, value_heads, "value heads HV");
  kChecks.dim("options.state_checkpoints", ck, 2, v, "V");
  kChecks.dim("options.state_checkpoints", ck, 3, k, "K");
  require_layout_of_state(ck, "options.state_checkpoints", v, k, state_k_major);
  kChecks.aligned("options.state_checkpoints", ck, 16);
  kChecks.stride_multiple("options.state_checkpoints", ck, 0, 4);

  if (!given(starts)) {
    fail(
        fmt::format("options.checkpoint_cu_starts is missing; it is required with "
                    "options.checkpoint_every_n_tokens = {} (an i64 [N + 1] device tensor, see "
                    "gdn_prefill_checkpoint_starts)",
                    every));
  }
  require_rank(starts, "options.checkpoint_cu_starts", 1, "[N + 1]");
  kChecks.dtype_in("options.checkpoint_cu_starts", starts, {DType::i64});
  kChecks.dim("options.checkpoint_cu_starts", starts, 0, seqs + 1, "sequences N + 1");
  kChecks.contiguous("options.checkpoint_cu_starts", starts);
  kChecks.aligned("options.checkpoint_cu_starts", starts, 8);
}

}  // namespace

Problem check_arguments(const Args& args) {
  const TensorView& q = *args.q;
  const TensorView& k = *args.k;
  const TensorView& v = *args.v;
  const GdnGates& gates = *args.gates;
  const TensorView& cu_seqlens = *args.cu_seqlens;
  const TensorView& state = *args.state;
  const TensorView& state_indices = *args.state_indices;
  const TensorView& has_initial_state = *args.has_initial_state;
  const TensorView& out = *args.out;
  const GdnPrefillOptions& options = *args.options;
  Problem pr;
  require_rank(q, "q", 3, "[T, H, K]");
  require_rank(k, "k", 3, "[T, H, K]");
  require_rank(v, "v", 3, "[T, HV, V]");
  kChecks.dtype_in("q", q, {DType::bf16, DType::f16});
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
  kChecks.dim("k", k, 0, pr.tokens, "tokens T of q");
  kChecks.dim("k", k, 1, pr.heads, "heads H of q");
  kChecks.dim("k", k, 2, pr.k, "K of q");
  kChecks.dim("v", v, 0, pr.tokens, "tokens T of q");
  if (pr.heads < 1 || pr.value_heads < 1 || pr.value_heads % pr.heads != 0) {
    fail(fmt::format("value heads HV = {} must be a positive multiple of q/k heads H = {}",
                     pr.value_heads, pr.heads));
  }
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&k, "k"}}) {
    kChecks.unit_last_stride(name, *t, kInner, true);
    kChecks.aligned(name, *t, 16);
    kChecks.stride_multiple(name, *t, 0, 8);
    kChecks.stride_multiple(name, *t, 1, 8);
  }
  pr.bf16 = q.dtype == DType::bf16;
  pr.v16 = reinterpret_cast<std::uintptr_t>(v.data) % 16 == 0 &&
           (v.shape[0] <= 1 || v.strides[0] % 8 == 0) && (v.shape[1] <= 1 || v.strides[1] % 8 == 0);
  kChecks.unit_last_stride("v", v, kInner, true);
  kChecks.aligned("v", v, 4);
  kChecks.stride_multiple("v", v, 0, 2);
  kChecks.stride_multiple("v", v, 1, 2);

  const std::int64_t hv = pr.value_heads;
  if (gates.kind == GdnGateKind::raw) {
    require_rank(gates.a, "gates.a", 2, "[T, HV]");
    require_rank(gates.b, "gates.b", 2, "[T, HV]");
    kChecks.dtype_in("gates.a", gates.a, {DType::f32, DType::bf16, DType::f16});
    kChecks.dtype_of("gates.b", gates.b, gates.a.dtype, "the dtype of gates.a");
    require_rank(gates.a_log, "gates.a_log", 1, "[HV]");
    require_rank(gates.dt_bias, "gates.dt_bias", 1, "[HV]");
    kChecks.dtype_in("gates.a_log", gates.a_log, {DType::f32, DType::bf16, DType::f16});
    kChecks.dtype_of("gates.dt_bias", gates.dt_bias, gates.a_log.dtype, "the dtype of gates.a_log");
    kChecks.dim("gates.a_log", gates.a_log, 0, hv, "value heads HV");
    kChecks.dim("gates.dt_bias", gates.dt_bias, 0, hv, "value heads HV");
    kChecks.unit_last_stride("gates.a_log", gates.a_log, kInner, true);
    kChecks.unit_last_stride("gates.dt_bias", gates.dt_bias, kInner, true);
  } else {
    require_rank(gates.a, "gates.g", 2, "[T, HV]");
    require_rank(gates.b, "gates.beta", 2, "[T, HV]");
    kChecks.dtype_in("gates.g", gates.a, {DType::f32});
    kChecks.dtype_in("gates.beta", gates.b, {DType::f32});
  }
  const char* a_name = gates.kind == GdnGateKind::raw ? "gates.a" : "gates.g";
  const char* b_name = gates.kind == GdnGateKind::raw ? "gates.b" : "gates.beta";
  kChecks.dim(a_name, gates.a, 0, pr.tokens, "tokens T");
  kChecks.dim(a_name, gates.a, 1, hv, "value heads HV");
  kChecks.dim(b_name, gates.b, 0, pr.tokens, "tokens T");
  kChecks.dim(b_name, gates.b, 1, hv, "value heads HV");
  kChecks.unit_last_stride(a_name, gates.a, kInner, true);
  kChecks.unit_last_stride(b_name, gates.b, kInner, true);

  require_rank(cu_seqlens, "cu_seqlens", 1, "[N + 1]");
  kChecks.dtype_in("cu_seqlens", cu_seqlens, {DType::i32, DType::i64});
  if (cu_seqlens.shape[0] < 1) fail("cu_seqlens must hold N + 1 >= 1 offsets");
  kChecks.contiguous("cu_seqlens", cu_seqlens);
  pr.seqs = cu_seqlens.shape[0] - 1;
  kChecks.tokens_in_groups("cu_seqlens", "N", "sequences", pr.seqs, "q", pr.tokens);

  require_rank(state, "state", 4, "[slots, HV, V, K]");
  kChecks.dtype_in("state", state, {DType::f32, DType::bf16});
  kChecks.dim("state", state, 1, hv, "value heads HV");
  kChecks.dim("state", state, 2, pr.v, "V");
  kChecks.dim("state", state, 3, pr.k, "K");
  pr.k_major = k_major_block(state, "state", pr.v, pr.k);
  kChecks.aligned("state", state, 16);
  kChecks.stride_multiple("state", state, 0, 4);

  require_rank(state_indices, "state_indices", 1, "[N]");
  kChecks.dtype_in("state_indices", state_indices, {DType::i32, DType::i64});
  kChecks.dim("state_indices", state_indices, 0, pr.seqs, "sequences N of cu_seqlens");
  if (has_initial_state.data != nullptr) {
    require_rank(has_initial_state, "has_initial_state", 1, "[N]");
    kChecks.dtype_in("has_initial_state", has_initial_state, {DType::u8});
    kChecks.dim("has_initial_state", has_initial_state, 0, pr.seqs, "sequences N");
  }

  require_rank(out, "out", 3, "[T, HV, V]");
  kChecks.dtype_in("out", out, {DType::bf16, DType::f16, DType::f32});
  kChecks.dim("out", out, 0, pr.tokens, "tokens T");
  kChecks.dim("out", out, 1, hv, "value heads HV");
  kChecks.dim("out", out, 2, pr.v, "V");
  kChecks.unit_last_stride("out", out, kInner, true);
  kChecks.aligned("out", out, 8);
  kChecks.stride_multiple("out", out, 0, 2);
  kChecks.stride_multiple("out", out, 1, 2);

  const TensorView& fs = options.final_state;
  if (fs.data != nullptr) {
    require_rank(fs, "options.final_state", 4, "[N, HV, V, K]");
    kChecks.dtype_of("options.final_state", fs, state.dtype, "the dtype of state");
    kChecks.dim("options.final_state", fs, 0, pr.seqs, "sequences N");
    kChecks.dim("options.final_state", fs, 1, hv, "value heads HV");
    kChecks.dim("options.final_state", fs, 2, pr.v, "V");
    kChecks.dim("options.final_state", fs, 3, pr.k, "K");
    require_layout_of_state(fs, "options.final_state", pr.v, pr.k, pr.k_major);
    kChecks.aligned("options.final_state", fs, 16);
    kChecks.stride_multiple("options.final_state", fs, 0, 4);
  }
  validate_checkpoints(options, state, pr.k_major, pr.seqs, hv, pr.v, pr.k);
  const TensorView& ws = options.workspace;
  if (given(ws)) {
    require_rank(ws, "options.workspace", 1, "[bytes]");
    kChecks.dtype_in("options.workspace", ws, {DType::u8});
    kChecks.contiguous("options.workspace", ws);
    kChecks.aligned("options.workspace", ws, 256);
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
  pr.qkv = q.dtype;
  pr.gate = gates.a.dtype;
  pr.param = gates.kind == GdnGateKind::raw ? gates.a_log.dtype : DType::f32;
  pr.state = state.dtype;
  pr.out = out.dtype;
  pr.cu = cu_seqlens.dtype;
  pr.index = state_indices.dtype;
  pr.gated = gates.kind != GdnGateKind::raw;
  pr.l2norm = options.l2norm_qk;
  pr.checkpoint_every = options.checkpoint_every_n_tokens;
  pr.user_workspace = given(ws) ? ws.shape[0] : -1;
  pr.caller_workspace = ws.data != nullptr;
  return pr;
}

namespace {

constexpr const char* kModes =
    "auto, chunked, chunked_bv128, chunked_bv64, chunked_bv32, chunked_bv16, bv64, bv32, bv16, "
    "chunked_cp (context-parallel, planner's segments) or chunked_cp<L> (segments of L >= 1 "
    "chunks), either optionally followed by _s2 or _s3 (input stages of its state passes); any of "
    "these chunked modes with the suffix _wgmma (sm_90a warpgroup MMA); chunked_ws (one "
    "warp-specialized kernel, sm_90a, K = V = 128); "
    "any other chunked mode may end in _p0 or _p1 (P formed by the chunk "
    "kernel or by the state kernel's wide tiles: mma.sync, or the whole-V tile on wgmma)";
constexpr std::string_view kCpPrefix = "chunked_cp";
constexpr std::string_view kWgmmaSuffix = "_wgmma";

[[noreturn]] void not_a_mode(const std::string& force) {
  fail(fmt::format("options.force_mode '{}' is not a mode; accepted: {}", force, kModes));
}

// "chunked_cp" (the planner's L) or "chunked_cp<L>", optionally + "_s2" / "_s3" (`mode`: without
// a "_wgmma" suffix; `force`: as the caller spelled it, for messages).
void parse_cp_mode(Problem& pr, const std::string& mode, const std::string& force) {
  pr.forced_kind = ModeKind::context_parallel;
  std::string digits = mode.substr(kCpPrefix.size());
  for (int st : {2, 3}) {
    const std::string suffix = fmt::format("_s{}", st);
    if (digits.ends_with(suffix)) {
      pr.forced_stages = st;
      digits.resize(digits.size() - suffix.size());
    }
  }
  if (!digits.empty()) {
    const bool numeric =
        digits.size() <= 6 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    pr.forced_cp_chunks = numeric ? std::stoll(digits) : 0;
    if (pr.forced_cp_chunks < 1) not_a_mode(force);
  }
}

// "chunked" or "chunked_bv<n>" (`base`: the mode without a "_wgmma" suffix; `force`: as the
// caller spelled it, for messages).
void parse_chunked_mode(Problem& pr, const std::string& base, const std::string& force) {
  pr.forced_kind = ModeKind::chunked;
  if (base == "chunked") return;
  for (int bv : {128, 64, 32, 16}) {
    if (base == fmt::format("chunked_bv{}", bv)) pr.forced_bv = bv;
  }
  if (pr.forced_bv == 0) not_a_mode(force);
  const int bv = pr.forced_bv;
  if (pr.v % bv != 0 || bv * pr.k > state_tile_limit(bv)) {
    fail(fmt::format("options.force_mode '{}' needs V % {} == 0 and {} * K <= {} (V = {}, K = {})",
                     force, bv, bv, state_tile_limit(bv), pr.v, pr.k));
  }
}

// "bv64", "bv32", "bv16": the fused kernel with that value tile.
void parse_fused_mode(Problem& pr, const std::string& force) {
  const std::vector<int> tiles = value_tiles(pr.k, pr.v);
  for (int bv : {64, 32, 16}) {
    if (force == fmt::format("bv{}", bv)) {
      if (std::find(tiles.begin(), tiles.end(), bv) == tiles.end()) {
        fail(
            fmt::format("options.force_mode '{}' needs V % {} == 0 and {} * K <= 8192 (V = {}, "
                        "K = {})",
                        force, bv, bv, pr.v, pr.k));
      }
      pr.forced_kind = ModeKind::fused;
      pr.forced_bv = bv;
      return;
    }
  }
  not_a_mode(force);
}

}  // namespace

std::vector<int> value_tiles(std::int64_t k, std::int64_t v) {
  std::vector<int> tiles;
  for (int bv : {64, 32, 16}) {
    if (v % bv == 0 && bv * k <= 8192) tiles.push_back(bv);
  }
  return tiles;
}

void parse_mode(Problem& pr, const std::string& force) {
  // A chunked mode's last suffix may say which kernel forms P.
  std::string mode = force;
  if (mode.rfind("chunked", 0) == 0 && (mode.ends_with("_p0") || mode.ends_with("_p1"))) {
    pr.forced_state_p = mode.back() == '1' ? 1 : 0;
    mode.resize(mode.size() - 3);
  }
  if (mode.empty() || mode == "auto") {
    pr.forced_kind = ModeKind::automatic;
  } else if (force == "chunked_ws") {
    pr.forced_kind = ModeKind::warp_specialized;
    pr.forced_bv = 128;
  } else if (mode.rfind("chunked", 0) == 0) {
    // A "_wgmma" suffix before any "_p0" / "_p1": the state kernel (or the context-parallel
    // passes) on warpgroup wgmma.
    pr.forced_wgmma = mode.ends_with(kWgmmaSuffix);
    if (pr.forced_wgmma) mode.resize(mode.size() - kWgmmaSuffix.size());
    if (mode.rfind(kCpPrefix, 0) == 0) {
      parse_cp_mode(pr, mode, force);
    } else {
      parse_chunked_mode(pr, mode, force);
    }
  } else {
    parse_fused_mode(pr, mode);
  }
  // Every accepted spelling is shorter (the longest is "chunked_cp999999_s3_s2").
  if (force.size() >= kModeTextBytes) not_a_mode(force);
  std::memcpy(pr.mode_text, force.data(), force.size());
}

Problem Family::check(const Args& args) {
  Problem problem = check_arguments(args);
  parse_mode(problem, args.options->force_mode);
  return problem;
}

}  // namespace kjit::ops::prefill
