// SPDX-License-Identifier: Apache-2.0
// gdn_prefill on the op skeleton (ops/op.hpp): the fused kernel, the chunked path (chunk kernel,
// then the state kernel) and its context-parallel variant (chunk kernel, segment pass, scan,
// resume pass) share one Problem, one planner and one parameter block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/types.hpp"
#include "ops/op.hpp"
#include "templates/gdn_prefill/params.h"

namespace kjit::ops::prefill {

inline constexpr const char* kOp = "gdn_prefill";

/// The arguments of one call, as the entry point received them.
struct Args {
  const TensorView* q = nullptr;
  const TensorView* k = nullptr;
  const TensorView* v = nullptr;
  const GdnGates* gates = nullptr;
  const TensorView* cu_seqlens = nullptr;
  const TensorView* state = nullptr;
  const TensorView* state_indices = nullptr;
  const TensorView* has_initial_state = nullptr;
  const TensorView* out = nullptr;
  const GdnPrefillOptions* options = nullptr;
};

/// What options.force_mode asks for, parsed (kModes lists the spellings).
enum class ModeKind : std::uint8_t {
  /// "" or "auto": the planner's path and tiles.
  automatic,
  /// "bv64", "bv32", "bv16": the fused kernel with that value tile.
  fused,
  /// "chunked" (bv = 0) or "chunked_bv<n>": the chunked path, optionally with a "_wgmma" suffix.
  chunked,
  /// "chunked_cp" or "chunked_cp<L>", optionally + "_s2" / "_s3": the context-parallel path.
  context_parallel,
  /// "chunked_ws": the warp-specialized kernel (sm_90a, K = V = 128).
  warp_specialized,
};

/// The longest spelling of a mode the parser accepts ("chunked_cp999999_s3_s2") fits with room:
/// a longer force_mode is no mode.
inline constexpr std::size_t kModeTextBytes = 31;  // (31: the key stays a multiple of 8)

/// Everything validated about one call, options included; the plan is a function of it and the
/// device. No pointer values: v's alignment class (v16) stands in for its address.
///
/// It is the plan memo's key after memo_problem(): the plans of one sequence count do not
/// depend on the token count T (the chunk kernel's grid strides over the chunk ids), except
/// through the context-parallel decision and the warp-specialized kernel's, so the key holds
/// those decisions (the segment length and segment ids; ws_by_planner) in place of T and of the
/// caller's workspace size.
struct Problem {
  std::int64_t tokens = 0, seqs = 0, heads = 0, value_heads = 0, k = 0, v = 0;
  /// options.checkpoint_every_n_tokens (the plan's text names the interval).
  std::int64_t checkpoint_every = 0;
  /// Bytes of options.workspace when it is given, else -1 (the context-parallel decision
  /// needs its segment states to fit there).
  std::int64_t user_workspace = -1;
  /// Filled by memo_problem (0 in a checked problem): the context-parallel segment length L the
  /// call takes on its device, or 0, and then its segment ids (floor(T / 64 L) + N), which size
  /// the segment and resume passes' grids: two token counts with one L can differ there.
  std::int64_t cp_chunks = 0;
  std::int64_t cp_segment_ids = 0;
  /// The forced mode: its segment length L (0: the planner's), value tile (0: the planner's),
  /// input stages of the context-parallel passes (0: the planner's).
  std::int64_t forced_cp_chunks = 0;
  std::int32_t forced_bv = 0;
  std::int32_t forced_stages = 0;
  ModeKind forced_kind = ModeKind::automatic;
  /// A "_wgmma" suffix: the state kernel's wide tiles on warpgroup MMA (sm_90a).
  bool forced_wgmma = false;
  /// Element types: q/k/v, the gates, A_log/dt_bias (f32 in the gated form), the pool, out,
  /// cu_seqlens, state_indices.
  DType qkv = DType::bf16, gate = DType::f32, param = DType::f32, state = DType::f32,
        out = DType::bf16, cu = DType::i32, index = DType::i32;
  /// Precomputed g and beta (GdnGates::precomputed).
  bool gated = false;
  bool l2norm = true;
  /// bf16 q/k/v: the chunked path multiplies raw rows on bf16 tensor cores.
  bool bf16 = false;
  /// v rows can be copied 16 bytes at a time (cp.async): pointer 16-byte aligned, token and
  /// head strides multiples of 8 elements.
  bool v16 = false;
  /// The pool, final states and checkpoints have V contiguous (spec state_layout=kv).
  bool k_major = false;
  /// options.workspace has a data pointer: the call allocates no workspace.
  bool caller_workspace = false;
  /// Filled by memo_problem (false in a checked problem): the planner takes the warp-specialized
  /// kernel for this call on its device (ws_pays).
  bool ws_by_planner = false;
  /// A "_p0" / "_p1" suffix: P formed by the chunk kernel (0) or by the state kernel (1); -1:
  /// the planner's rule. (Also keeps the size a multiple of 8 with every byte a member: the memo
  /// hashes the bytes.)
  std::int8_t forced_state_p = -1;
  /// options.force_mode as the caller spelled it, for messages only (the planner reads the
  /// parsed fields above); zero bytes after the text.
  char mode_text[kModeTextBytes] = {};

  std::string_view mode() const { return std::string_view(mode_text); }
};
static_assert(std::has_unique_object_representations_v<Problem> && sizeof(Problem) % 8 == 0);

/// The path a plan takes.
enum class Path : std::uint8_t {
  /// One kernel (gdn_prefill): f16 inputs, misaligned v, too little shared memory, or forced.
  fused,
  /// The chunk kernel, then the sequential state kernel.
  chunked,
  /// The chunk kernel, the segment pass, the scan, the resume pass.
  context_parallel,
  /// One warp-specialized kernel (gdn_prefill_ws): the chunk work in shared memory, no workspace.
  warp_specialized,
};

/// Whether a path takes a workspace (T', P, scales between its kernels): the two chunked paths.
inline bool uses_workspace(Path path) {
  return path == Path::chunked || path == Path::context_parallel;
}

/// The planner's decisions the launch needs, as values.
struct Choice {
  Path path = Path::fused;
  /// The state kernel's (or the fused kernel's) value tile: state rows per block.
  std::int32_t bv = 0;
  /// The state kernel multiplies on warpgroup wgmma (compiled for sm_90a).
  bool wgmma = false;
  /// Context-parallel path: input stages of its state passes (2 or 3).
  std::int32_t cp_stages = 2;
  /// Context-parallel path: chunks per segment L.
  std::int64_t cp_chunks = 0;
};

struct Family {
  static constexpr const char* kName = "gdn_prefill";
  using Problem = prefill::Problem;
  using Choice = prefill::Choice;

  /// Validates a call: check_arguments, then parse_mode.
  static Problem check(const Args& args);
  /// Pure: the plan for `problem` on a device with `limits` (PlanError if no path is legal).
  static Planned<Choice> plan(const Problem& problem, const DeviceLimits& limits);
  /// The memo key of a call on a device: `problem` with T and the caller's workspace size
  /// replaced by the context-parallel decision they lead to (see Problem).
  static Problem memo_problem(const Problem& problem, const DeviceLimits& limits);
  /// The chunked paths' workspace for this call's T (0 on the fused path, and when the caller
  /// passes options.workspace).
  static std::size_t workspace_bytes(const Problem& problem, const Choice& choice);
  /// What a failed allocation's message adds: the caller can pass the workspace instead.
  static std::string workspace_hint(std::size_t bytes);
  /// N == 0: nothing to launch, no device needed.
  static bool launches_nothing(const Problem& problem) { return problem.seqs == 0; }
  static GdnPrefillParams params(const Args& args, const Problem& problem, const Choice& choice,
                                 void* workspace);
  /// The warp-specialized kernel's TMA maps of q, k and v (input_tensor_maps) and of out
  /// (output_tensor_map), encoded into `params` by the runtime as Settings::tensor_map_loads and
  /// tensor_map_stores ask (both on by default); params.tma_inputs and tma_out say they are
  /// there. A map the driver refuses leaves the kernel on its cp.async copies or plain stores.
  static void attach_tensor_maps(GdnPrefillParams& params, const Problem& problem,
                                 const Choice& choice, Runtime& runtime);
};

/// One TMA map a call's kernel reads through, and where in the parameter block it goes.
struct TensorMapSlot {
  TensorMap* map = nullptr;
  TensorMapRequest request;
};

/// The maps of q, k and v for the warp-specialized kernel's whole chunks: each {128 columns, heads,
/// T} (bf16), boxes of 64 columns x 1 head x 64 tokens with 128-byte swizzle (the stages'
/// sw128 slices). None (count 0) on the other paths, or when a base address is not 16-byte
/// aligned or a stride is no multiple of 16 bytes below 2^40, or T >= 2^31 (a box coordinate is
/// an int): TMA cannot address those, and the kernel copies with cp.async; nor for T < 64 (no
/// whole chunk).
struct InputTensorMaps {
  TensorMapSlot slots[3];
  int count = 0;
};
InputTensorMaps input_tensor_maps(GdnPrefillParams& params, const Problem& problem,
                                  const Choice& choice);

/// The map of bf16 out for the warp-specialized kernel's whole chunks: {128 values, HV, T}, boxes
/// of 16 values x 1 head x 64 tokens (a state warp's part of a chunk) with 32-byte swizzle.
/// None on the other paths, for f16 or f32 out, or where TMA cannot address out (as
/// input_tensor_maps); the kernel then stores with plain stores.
std::optional<TensorMapSlot> output_tensor_map(GdnPrefillParams& params, const Problem& problem,
                                               const Choice& choice);

/// Every check of a call but the mode's (check.cpp); a launch with no sequences returns after
/// these, as it always did, whatever options.force_mode says.
Problem check_arguments(const Args& args);
/// Parses options.force_mode into `problem` (InvalidArgument naming it when it is no mode, or
/// when its value tile cannot serve K and V).
void parse_mode(Problem& problem, const std::string& force_mode);

/// InvalidArgument "gdn_prefill: <message>".
[[noreturn]] void fail(const std::string& message);

/// The fused kernel's value tiles, largest first, that divide V and keep the f32 state tile in
/// 64 registers per thread.
std::vector<int> value_tiles(std::int64_t k, std::int64_t v);

/// Largest bv * K of a state-kernel tile: 64 f32 registers per thread of its 4 or 8 warps.
inline std::int64_t state_tile_limit(int bv) { return 2048 * gdn_prefill_state_warps(bv); }

/// Segment ids of a call: floor(T / (64 L)) + N (see CpWork in templates/gdn_prefill/state.cuh).
inline std::int64_t cp_segments(const Problem& pr, std::int64_t chunks) {
  return pr.tokens / (kGdnPrefillChunk * chunks) + pr.seqs;
}

/// The whole workspace of the context-parallel path with segments of `chunks` chunks.
std::int64_t cp_workspace_bytes(const Problem& pr, std::int64_t chunks);

/// Whether the state kernel takes the sequences longest first (ranked by its own blocks up to
/// kGdnPrefillRankInStateMaxSeqs sequences, else by the chunk kernel into the workspace): a
/// batch of one needs no order, and the workspace holds kGdnPrefillOrderMaxSeqs ranks. A
/// function of the sequence count only, which the memoized plans are keyed by (T is not).
inline bool orders_longest_first(const Problem& pr) {
  return pr.seqs > 1 && pr.seqs <= kGdnPrefillOrderMaxSeqs;
}

/// Whether the warp-specialized kernel's blocks take the sequences longest first: they rank
/// them themselves (no chunk kernel ranks into a workspace), up to kGdnPrefillRankInStateMaxSeqs.
inline bool ws_ranks_sequences(const Problem& pr) {
  return pr.seqs > 1 && pr.seqs <= static_cast<std::int64_t>(kGdnPrefillRankInStateMaxSeqs);
}

}  // namespace kjit::ops::prefill
