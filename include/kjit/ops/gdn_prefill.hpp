// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill: varlen sequences, states read from and written back to a
// pool [slots, HV, V, K], tensor-core kernels (chunk 64, WY form).
#pragma once

#include <cstdint>
#include <string>

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
  /// g [T, HV] f32 (log decay, <= 0) and beta [T, HV] f32 (post-sigmoid).
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
  /// every sequence (padding ones included) while the pool is only read.
  TensorView final_state;
  /// Per-chunk state checkpoints every this many tokens; 0: none. Not supported yet: any other
  /// value is rejected with InvalidArgument.
  std::int64_t checkpoint_every_n_tokens = 0;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
  /// "" or "auto": the planner chooses the value tile; "bv64", "bv32", "bv16" force one.
  std::string force_mode;
};

/// Chunked Gated DeltaNet prefill over N varlen sequences (token ranges cu_seqlens[n] ..
/// cu_seqlens[n+1] of the T tokens).
///
/// - q, k [T, H, K], v [T, HV, V]: bf16 or f16 (all three the same), last dim contiguous,
///   pointers 16-byte aligned, token and head strides multiples of 8. K, V in {64, 128, 256};
///   HV a multiple of H (value head hv reads q/k head hv / (HV / H)).
/// - gates: see GdnGates. cu_seqlens [N + 1] i32 or i64, contiguous, non-decreasing, within
///   [0, T] (device data: not checked).
/// - state [slots, HV, V, K] f32 or bf16, [HV, V, K] contiguous: sequence n starts from
///   state[state_indices[n]] (zeros when has_initial_state[n] == 0) and its final state is
///   written back there. state_indices [N] i32 or i64: an index < 0 (or >= slots) is padding:
///   the sequence runs from a zero state, its output is written, the pool is never touched.
///   Indices of non-padding sequences must be distinct.
/// - has_initial_state [N] u8 (bool), or data == nullptr: every sequence has one.
/// - out [T, HV, V] bf16, f16 or f32, last dim contiguous.
/// Throws InvalidArgument naming the argument, PlanError when no legal launch exists.
void gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                 const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                 const TensorView& state_indices, const TensorView& has_initial_state,
                 const TensorView& out, const GdnPrefillOptions& options = {},
                 Stream stream = nullptr);

/// The plan gdn_prefill would run for these arguments on a device with `device` limits
/// (pointers are not dereferenced; they may be null). Throws like gdn_prefill.
Plan plan_gdn_prefill(const TensorView& q, const TensorView& k, const TensorView& v,
                      const GdnGates& gates, const TensorView& cu_seqlens, const TensorView& state,
                      const TensorView& state_indices, const TensorView& has_initial_state,
                      const TensorView& out, const GdnPrefillOptions& options,
                      const DeviceLimits& device);

}  // namespace kjit
