// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill: varlen sequences, states read from and written back to a
// pool [slots, HV, V, K], tensor-core kernels (chunk 64, WY form). Paths: the chunked path (a
// fully parallel kernel over every chunk, then a short sequential state kernel per sequence,
// with a workspace between them); its exact context-parallel variant for few long sequences
// (the state kernel over segments of each sequence, a scan of the segments' affine maps, and a
// rerun of each segment from its exact initial state); and the fused single kernel (f16 inputs,
// misaligned v, or devices whose shared memory cannot hold the chunked path's tiles).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"
#include "kjit/types.hpp"

namespace kjit {

class Runtime;

/// How the per-token decay and write strength are given.
enum class GdnGateKind : std::uint8_t {
  /// a, b [T, HV] (f32/bf16/f16) with A_log, dt_bias [HV]:
  /// g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
  raw,
  /// g [T, HV] f32 (log decay, <= 0) and beta [T, HV] f32 (post-sigmoid). The chunked path
  /// splits e^(g's sum between two tokens of a 64-token chunk) into two factors, each <= 1 for
  /// a decay; a g > 0 (growth) is accepted, but these factors must then stay in f32 range.
  precomputed,
};

/// The gates of a GDN call. Rows may be strided; the head dimension must be contiguous.
struct GdnGates {
  GdnGateKind kind = GdnGateKind::raw;
  /// raw: a [T, HV]; precomputed: g [T, HV] f32.
  TensorView a;
  /// raw: b [T, HV]; precomputed: beta [T, HV] f32.
  TensorView b;
  /// raw only: [HV], same dtype as dt_bias.
  TensorView a_log;
  /// raw only: [HV].
  TensorView dt_bias;

  /// Raw gates (the model's projections); the kernel applies softplus and sigmoid.
  static GdnGates raw(TensorView a, TensorView b, TensorView a_log, TensorView dt_bias);
  /// Precomputed f32 log decay g and beta.
  static GdnGates precomputed(TensorView g, TensorView beta);
};

/// Options of gdn_prefill.
struct GdnPrefillOptions {
  /// Output scale; 0 means K^-0.5.
  float scale = 0.0f;
  /// L2-normalize q and k per token and head (x / sqrt(sum x^2 + 1e-6)) before use.
  bool l2norm_qk = true;
  /// softplus(x) = x above this (raw gates only).
  float softplus_threshold = 20.0f;
  /// Where final states go. data == nullptr (default): back into the pool slot of each
  /// sequence, in place. Otherwise a [N, HV, V, K] tensor of the pool's dtype, written for
  /// every sequence (padding ones included) while the pool is only read. Its [HV, V, K] block in
  /// the layout of the pool (see gdn_prefill).
  TensorView final_state;
  /// State checkpoints every this many tokens: 0 (default) writes none; otherwise a positive
  /// multiple of the kernel's chunk of 64 tokens (anything else is an InvalidArgument).
  /// Sequence i of length L_i gets floor(L_i / n) checkpoints; its checkpoint j (0-based) is
  /// the recurrent state [HV, V, K] after its first (j + 1) * n tokens, counted from the state
  /// it starts from (its pool slot, or zeros when has_initial_state is 0 or it is padding), and
  /// is written to state_checkpoints[checkpoint_cu_starts[i] + j]. Padding sequences write
  /// their checkpoints too (from their zero start), so every row the prefix assigns is
  /// defined. Checkpoints change neither out nor the final states.
  std::int64_t checkpoint_every_n_tokens = 0;
  /// With checkpoints: [total, HV, V, K] of the pool's dtype and layout (see gdn_prefill), 16-byte
  /// aligned, row stride a multiple of 4 elements. total must be at least
  /// checkpoint_cu_starts[N]; rows outside [0, total) are not written (device data: not
  /// checked otherwise), rows named by no sequence are left as they are.
  TensorView state_checkpoints;
  /// With checkpoints: [N + 1] i64, contiguous, on the device: the exclusive prefix sum of
  /// floor(L_i / n), i.e. the first checkpoint row of each sequence. The caller provides it
  /// because kjit would need a device-to-host copy (a sync) of cu_seqlens to compute it; from
  /// host offsets, gdn_prefill_checkpoint_starts() computes it.
  TensorView checkpoint_cu_starts;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
  /// "" or "auto": the planner chooses the path and the value tile. "bv64", "bv32", "bv16" force
  /// the fused single-kernel path with that tile; "chunked" forces the two-kernel chunked path
  /// (planner's tile), "chunked_bv128", "chunked_bv64", "chunked_bv32", "chunked_bv16" with that
  /// tile. A chunked mode with the suffix "_wgmma" (e.g. "chunked_bv128_wgmma") runs the state
  /// kernel's 64- and 128-row tiles and the chunk kernel's products on warpgroup wgmma, both
  /// compiled for sm_90a: compute capability 9.0 only (a PlanError elsewhere). The planner takes
  /// it itself for the whole-V tile at K = V = 128 there (mode "chunked_bv128_wgmma"); a plain
  /// "chunked_bv128" keeps mma.sync, for A/B runs. "chunked_cp" forces the context-parallel path
  /// (segments of the planner's length), "chunked_cp<L>" with segments of L >= 1 chunks of 64
  /// tokens; either may end in "_s2" or "_s3" (input stages of its state passes), and then in
  /// "_wgmma": the segment and resume passes on warpgroup wgmma (sm_90a, K = V = 128, 3 stages; a
  /// PlanError elsewhere), as the planner runs them there (mode "chunked_cp<L>_bv128_wgmma"); a
  /// plain "chunked_cp" keeps mma.sync. The planner takes that path by itself for few long
  /// sequences: see plan.explain(). Any chunked mode may end in
  /// "_p0" or "_p1": P = tril(Q K^T ...) formed by the chunk kernel, or by the state kernel's 64-
  /// and 128-row mma.sync tiles (the planner's choice for the 128-row tile without GVA at K = V =
  /// 128 on sm_90 and later) or its 128-row wgmma tile ("chunked_bv128_wgmma_p1"; "_p1" with
  /// another tile is a PlanError). "chunked_ws" runs one warp-specialized kernel per (sequence,
  /// value head) instead of the two (sm_90a, K = V = 128, no workspace; a PlanError elsewhere).
  /// The planner takes it by itself where DRAM is slow next to the SMs (under 40 GB/s per SM:
  /// the H100 and the H200) and many long sequences fill the SMs; plan.explain() says why or
  /// why not (docs/performance.md, "The planner's choice between the two kernels and the
  /// warp-specialized one").
  std::string force_mode;
  /// Scratch memory of the chunked path (the warp-specialized kernel needs none and ignores it;
  /// sizing it for the two kernels is always enough): a 1-D u8 tensor on the device, 256-byte
  /// aligned, of at least gdn_prefill_workspace_bytes(T, HV) bytes; it must not be in use by other
  /// work on the stream while the call runs. Default (empty): the call allocates it stream-ordered
  /// on its stream from kjit's workspace pool of the device, which keeps the memory reserved for
  /// the next call (the largest workspace used so far stays held until the process exits: pass your
  /// own to avoid that), and frees it on the stream after the call's kernels; under CUDA graph
  /// capture with cuMemAllocAsync / cuMemFreeAsync, which capture records as memory nodes. The
  /// fused path needs none and ignores it. The context-parallel path needs more (per segment and
  /// value head, f32 [V, K] states twice and a [K, K] map: the plan's reasons give the bytes); with
  /// a given workspace too small for it the planner keeps the sequential state kernel (and a forced
  /// "chunked_cp" mode is a PlanError).
  TensorView workspace;
};

/// Bytes of options.workspace that a gdn_prefill call over T tokens and HV value heads needs on
/// its chunked path: T * HV * 272 (bf16 rows of T' and P, 64 each, and 16 bytes of per-row
/// scales), each of the three regions rounded up to 256 bytes, plus 16 KiB for the order in
/// which the state kernel takes the sequences (longest first; none when T = 0). Throws
/// InvalidArgument for negative arguments.
std::int64_t gdn_prefill_workspace_bytes(std::int64_t tokens, std::int64_t value_heads);

/// Chunked Gated DeltaNet prefill over N varlen sequences (token ranges cu_seqlens[n] ..
/// cu_seqlens[n+1] of the T tokens).
///
/// - q, k [T, H, K], v [T, HV, V]: bf16 or f16 (all three the same), last dim contiguous,
///   pointers 16-byte aligned, token and head strides multiples of 8. K, V in {64, 128, 256};
///   HV a multiple of H (value head hv reads q/k head hv / (HV / H)).
/// - gates: see GdnGates. cu_seqlens [N + 1] i32 or i64, contiguous, non-decreasing, within
///   [0, T] (device data: not checked).
/// - state [slots, HV, V, K] f32 or bf16, its [HV, V, K] block contiguous (strides [*, V*K, K,
///   1]) or with K and V swapped (strides [*, V*K, 1, V]: V contiguous, a .transpose(-1, -2)
///   view of a contiguous [slots, HV, K, V] pool such as fla's; the final states and
///   checkpoints must then be too). The layout is a specialization of the kernels
///   (plan().explain() says which); other strides are an InvalidArgument. Sequence n starts from
///   state[state_indices[n]] (zeros when has_initial_state[n] == 0) and its final state is
///   written back there. state_indices [N] i32 or i64: an index < 0 (or >= slots) is padding:
///   the sequence runs from a zero state, its output is written, the pool is never touched.
///   Indices of non-padding sequences must be distinct.
/// - has_initial_state [N] u8 (bool), or data == nullptr: every sequence has one.
/// - out [T, HV, V] bf16, f16 or f32, last dim contiguous.
/// - optional state checkpoints: see GdnPrefillOptions::checkpoint_every_n_tokens.
/// Throws InvalidArgument naming the argument, PlanError when no legal launch exists.
void gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                 const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                 const TensorView& state_indices, const TensorView& has_initial_state,
                 const TensorView& out, const GdnPrefillOptions& options = {},
                 Stream stream = nullptr);

/// checkpoint_cu_starts for gdn_prefill on the host: element i is the sum over sequences j < i
/// of floor((cu_seqlens[j + 1] - cu_seqlens[j]) / every); the last element is the number of
/// checkpoint rows the call writes (the `total` state_checkpoints needs). Copy it to the device
/// as an i64 tensor. Throws InvalidArgument when every is not a positive multiple of 64 or
/// cu_seqlens is empty or decreasing.
std::vector<std::int64_t> gdn_prefill_checkpoint_starts(std::span<const std::int64_t> cu_seqlens,
                                                        std::int64_t every);

/// The plan gdn_prefill would run for these arguments on a device with `device` limits
/// (pointers are not dereferenced; they may be null). Throws like gdn_prefill.
Plan plan_gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                      const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                      const TensorView& state_indices, const TensorView& has_initial_state,
                      const TensorView& out, const GdnPrefillOptions& options,
                      const DeviceLimits& device);

}  // namespace kjit
