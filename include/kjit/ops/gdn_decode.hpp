// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet packed decode: one recurrent step for a batch of requests, each reading and
// writing its state in place in a slot of a state pool.
#pragma once

#include <optional>
#include <string>

#include "kjit/device.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/plan.hpp"
#include "kjit/types.hpp"

namespace kjit {

class Runtime;

/// Which state indices mean "this row has no state" (padding). Such a row writes zeros to its
/// output and leaves the pool untouched.
enum class GdnInvalidIndex {
  /// index < 0 is invalid; slot 0 is a real slot (SGLang's convention).
  negative,
  /// index <= 0 is invalid; slot 0 is a null block (vLLM's convention).
  nonpositive,
};

/// The order in which a step visits its rows (GdnDecodeOptions::row_order).
enum class GdnRowOrder {
  /// The planner's choice: slot order for a step that reads >= 512 MiB of state with 2 to 16384
  /// rows in the flat, split or folded mode (measured on an H200: a step that visits the pool in
  /// address order moved 1-4% more bytes per second than one in the rows' random order), else
  /// as given.
  automatic,
  /// Sorted by slot: a small kernel ranks the rows first and the step follows the ranks (B x 8
  /// bytes of scratch from kjit's workspace pool, stream-ordered, freed after the step). B up to
  /// 16384, slots < 2^39, flat, split or folded mode; otherwise a PlanError.
  by_slot,
  /// In the order given: one kernel, no scratch memory.
  as_given,
};

/// The causal conv update the fused decode step runs before the delta rule
/// (GdnDecodeOptions::conv): mixed_qkv is then the projection *before* the convolution, and the
/// step computes, per row n with a valid index and channel c of [q | k | v],
///   y[n, c] = act(bias[c] + sum_{i<W-1} weight[c, i] * conv_state[slot, c, i]
///                 + weight[c, W-1] * mixed_qkv[n, c])
/// (causal_conv1d_update with S = 1), rounds y to mixed_qkv's dtype (as the two-kernel sequence
/// stores its conv output) and uses it as q, k, v; columns 0..W-2 of the conv slot then hold
/// the last W-1 inputs (columns 1..W-2, then mixed_qkv[n]); other columns are untouched. One
/// launch reads mixed_qkv once; the conv output is not written anywhere.
///
/// Both pools are indexed by state_indices (one slot number per request for both caches, as in
/// vLLM and SGLang), under options.invalid_index: a padding row (or an index >= slots) writes
/// zeros to out and leaves both pools untouched.
struct GdnDecodeConv {
  /// [D, W] (mixed_qkv's dtype or f32), D = 2*H*K + HV*V, any strides, W in 2..8.
  TensorView weight;
  /// [D] (weight's dtype), any stride, or a view with data == nullptr (no bias).
  TensorView bias;
  /// [slots, D, L] (f16, bf16, f32), L >= W-1, any strides; the same slot count as the state
  /// pool; updated in place.
  TensorView conv_state;
  /// silu (Qwen3-Next's layers) or none.
  ConvActivation activation = ConvActivation::silu;
  /// 0 lets the planner choose; otherwise the blocks per (row, q/k head): 1 (no cluster), or a
  /// cluster of 2, 4 or 8 (sm_90 and later, V * HV / H state rows and 2K channels splitting
  /// evenly with at least 4 rows per block; PlanError otherwise). For tests and tuning.
  int force_cluster = 0;
  /// 0 lets the planner choose; 1: each warp's state rows load into two register sets; 2, 3 or 4:
  /// through a ring of that many sets in shared memory (cp.async; unclustered plans with 16-byte
  /// state vectors, PlanError otherwise). For tests and tuning.
  int force_stages = 0;
};

/// Options of gdn_decode / gdn_decode_gated and their plan twins.
struct GdnDecodeOptions {
  /// Multiplier of q after normalization; default K^-0.5.
  std::optional<float> scale;
  /// L2-normalize q and k (x / sqrt(sum x^2 + 1e-6)) before use.
  bool l2norm_qk = true;
  /// softplus(x) = x above this, log1p(exp(x)) below (raw form only).
  float softplus_threshold = 20.0f;
  GdnInvalidIndex invalid_index = GdnInvalidIndex::negative;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
  /// "" lets the planner choose; "flat", "split", "folded", "persistent" or "bulk" forces a
  /// grid mode (PlanError if that mode cannot launch the problem on the device; bulk needs
  /// sm_90 and a 16-byte aligned pool; persistent and bulk need a K-contiguous pool).
  std::string force_mode;
  /// 0 lets the planner choose; otherwise the state rows per block (a power of two dividing
  /// V, at least the rows one warp covers; with a V-contiguous pool, the columns of V per block:
  /// a power of two <= 32 vectors). For tests and tuning.
  int force_bv = 0;
  /// 0 lets the planner choose; otherwise the shared-memory stages of the bulk mode (1..8).
  /// For tests and tuning.
  int force_stages = 0;
  /// 0 lets the planner choose; otherwise the resident blocks per SM that the persistent and
  /// bulk grids are sized for, or in the other modes a register cap for that many blocks
  /// (PlanError if threads, shared memory or 32 registers per thread do not fit). For tests
  /// and tuning.
  int force_blocks_per_sm = 0;
  /// "" lets the planner choose (large grids: staged loads, else stream/stream); otherwise
  /// "<load>/<store>" cache hints of the state pool's accesses, load in stream (.cs), plain,
  /// l2_256 (L2::256B prefetch) or staged (cp.async into shared memory; flat, split and folded
  /// modes with 16-byte vectors, sm_80+, a K-contiguous pool, else PlanError) and store in
  /// stream, plain. For tests and tuning.
  std::string force_cache_hints;
  /// Before launching, copy state_indices to the host and check that no valid index repeats
  /// and that every valid index is < slots (InvalidArgument otherwise). Synchronizes the
  /// stream, and is skipped while the stream is capturing. Also on with KJIT_DEBUG_CHECKS=1.
  bool debug_check_indices = false;
  /// Row order of the step; results are the same in every order (rows are independent).
  GdnRowOrder row_order = GdnRowOrder::automatic;
  /// Set: the fused decode step (conv update + delta rule in one kernel; see GdnDecodeConv).
  /// It runs its own kernel (gdn_decode_conv: one block per (row, q/k head), which owns every
  /// channel it convolves, so each conv-pool column has one reader and writer; on sm_90 and
  /// later a small batch's (row, q/k head) is a cluster of 2-8 blocks that order their q/k
  /// column writes after every block's reads by the cluster barrier; B * H blocks (times the
  /// cluster), at most 2^31 - 1, and the conv output of a block's channels in shared memory, else
  /// a PlanError), a K-contiguous state pool only; force_mode, force_bv, force_stages,
  /// force_blocks_per_sm, force_cache_hints and row_order = by_slot do not apply to it
  /// (InvalidArgument). When to use it: one launch instead of two, and at B = 1 the faster form
  /// (H200, Qwen3-Next sizes: 8.3 us against 9.7 for causal_conv1d_update + gdn_decode); from
  /// B = 4 on the two calls are faster (13.8 against 16.0 us at B = 4, 43.8 against 49.7 at
  /// B = 32, 283.7 against 320.7 at B = 256; docs/performance.md, "The fused step beside vLLM's
  /// two Triton kernels"), so it pays there only where the launch count matters more.
  std::optional<GdnDecodeConv> conv;
};

/// One decode step, raw gate form.
///
/// - mixed_qkv [B, 2*H*K + HV*V] (f16, bf16, f32): rows [q: H*K | k: H*K | v: HV*V], head-major
///   in each part; last dim contiguous, any row stride. H is inferred and must divide HV; q/k
///   head of value head hv is hv / (HV/H).
/// - a, b [B, HV] (f16, bf16, f32, same dtype): last dim contiguous, any row stride.
/// - a_log (A_log), dt_bias [HV] (f16, bf16, f32), contiguous.
/// - state [slots, HV, V, K] (f16, bf16, f32), any slot stride >= HV*V*K, updated in place;
///   its inner [HV, V, K] block either contiguous (strides [*, V*K, K, 1]: K contiguous) or
///   with K and V swapped (strides [*, V*K, 1, V]: V contiguous, a .transpose(-1, -2) view of
///   a contiguous [slots, HV, K, V] pool such as fla's). The layout is a specialization of
///   the kernel (plan().explain() says which); other strides are an InvalidArgument. A
///   V-contiguous pool runs in the flat, split or folded mode. K, V: multiples of 16 in
///   16..256.
/// - state_indices [B] (i32, i64), any positive stride: slot of each row. Valid indices must
///   be < slots and must not repeat within a call (a repeat races: caller error, caught by
///   debug_check_indices). An index >= slots is treated as invalid by the kernel.
/// - out [B, HV, V] (f16, bf16, f32): inner [HV, V] contiguous, any row stride.
///
/// Per (n, hv): g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); q, k normalized,
/// q *= scale; H = exp(g) H; u = beta (v - H k); H += u k^T; out = H q; arithmetic in f32.
/// B from 1 to 2^24. Throws InvalidArgument naming the argument, PlanError if no grid mode
/// fits the device.
void gdn_decode(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                const TensorView& a_log, const TensorView& dt_bias, const TensorView& state,
                const TensorView& state_indices, const TensorView& out,
                const GdnDecodeOptions& options = {}, Stream stream = nullptr);

/// The plan gdn_decode would launch on a device with these limits: validation, grid mode and
/// tile choice, with the reasons. Pointers are only inspected for alignment.
Plan plan_gdn_decode(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                     const TensorView& a_log, const TensorView& dt_bias, const TensorView& state,
                     const TensorView& state_indices, const TensorView& out,
                     const GdnDecodeOptions& options, const DeviceLimits& device);

/// One decode step with precomputed gates: g [B, HV] f32 log decay (the state is scaled by
/// exp(g)) and beta [B, HV] f32, both last dim contiguous with any row stride. Everything else
/// as gdn_decode; softplus_threshold is unused.
void gdn_decode_gated(const TensorView& mixed_qkv, const TensorView& g, const TensorView& beta,
                      const TensorView& state, const TensorView& state_indices,
                      const TensorView& out, const GdnDecodeOptions& options = {},
                      Stream stream = nullptr);

/// The plan gdn_decode_gated would launch on a device with these limits.
Plan plan_gdn_decode_gated(const TensorView& mixed_qkv, const TensorView& g, const TensorView& beta,
                           const TensorView& state, const TensorView& state_indices,
                           const TensorView& out, const GdnDecodeOptions& options,
                           const DeviceLimits& device);

}  // namespace kjit
