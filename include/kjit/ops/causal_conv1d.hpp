// SPDX-License-Identifier: Apache-2.0
// causal_conv1d: the short causal depthwise convolution a Gated DeltaNet / Mamba layer runs over
// its projected inputs (mixed_qkv) before the recurrence, with the last inputs of every sequence
// kept in a conv-state pool (like the recurrent state).
//
// Per channel c, with weight w[c, 0..W-1] (tap W-1 multiplies the current input) and the inputs
// of one sequence preceded by its history h (the W-1 inputs before it):
//   y[t, c] = act(bias[c] + sum_{j=0}^{W-1} w[c, W-1-j] * in[t-j, c]),  act = identity or SiLU,
// where in[t-j] for t-j < 0 is the history entry h[W-1+(t-j)] (oldest first). Arithmetic in f32.
//
// The pool: conv_state [slots, D, L] with L >= W-1 columns (any strides: vLLM's [slots, D, W-1]
// layout and the transposed [slots, W-1, D] buffer are both views of this shape). Columns
// 0..W-2 hold a sequence's last W-1 inputs, oldest first. Speculative decoding keeps more
// columns (L = W-2+S in vLLM) so that the next step can pick its history by the number of
// tokens the previous verification accepted (causal_conv1d_update's num_accepted_tokens).
//
// Example (Qwen3-Next, one layer, TP1: D = 8192, W = 4, bf16):
//
//   kjit::CausalConv1dOptions opt;
//   opt.activation = kjit::ConvActivation::silu;
//   // prefill: x, out [T, D]; cu_seqlens [N+1] i32; pool [slots, D, 3]; indices [N] i32
//   kjit::causal_conv1d(x, weight, bias, pool, cu_seqlens, indices, has_initial, out, opt, stream);
//   // decode: x, out [B, 1, D]; the same pool and weights; indices [B]
//   kjit::causal_conv1d_update(xd, weight, bias, pool, indices_b, kjit::TensorView{}, outd, opt,
//                              stream);
//   std::puts(kjit::plan_causal_conv1d(x, weight, bias, pool, cu_seqlens, indices, has_initial,
//                                      out, opt, kjit::DeviceLimits::for_name("h200"))
//                 .explain().c_str());
#pragma once

#include <cstdint>
#include <string>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"
#include "kjit/types.hpp"

namespace kjit {

class Runtime;

/// Which state indices mean "this sequence / row has no state" (padding). Such a sequence gets
/// zero output rows and its pool slot (none) is left untouched.
enum class ConvInvalidIndex : std::uint8_t {
  /// index < 0 is padding; slot 0 is a real slot (SGLang's convention, kjit's default).
  negative,
  /// index <= 0 is padding; slot 0 is a null block (vLLM's convention).
  nonpositive,
};

/// Activation applied to the convolution's output.
enum class ConvActivation : std::uint8_t { none, silu };

/// Options of causal_conv1d / causal_conv1d_update and their plan twins.
struct CausalConv1dOptions {
  ConvActivation activation = ConvActivation::none;
  ConvInvalidIndex invalid_index = ConvInvalidIndex::negative;
  /// "" lets the planner choose. causal_conv1d: "chunked" (every span of every sequence in
  /// parallel; not for in place) or "sequential" (one thread per sequence and channel group
  /// walks the whole sequence; the in-place mode). causal_conv1d_update: "rows". PlanError if
  /// the mode cannot run the call.
  std::string force_mode;
  /// 0 lets the planner choose; else the channels per thread (1, 2, 4 or 8; the channel stride
  /// of x and out must then be 1 and every address aligned to vec elements). For tests.
  int force_vec = 0;
  /// 0 lets the planner choose; else the tokens whose loads a thread issues before their
  /// arithmetic (1, 2, 4, 8 or 16; the prefill modes keep two such batches in flight). For
  /// tests and tuning.
  int force_chunk = 0;
  /// 0 lets the planner choose; else the tokens of one work item of the chunked prefill mode
  /// (8, 16, 32, 64, 128 or 256; at least the chunk and W - 1). PlanError when the call runs
  /// another mode. For tests and tuning.
  int force_span = 0;
  /// Tuning candidate (the default plan is 0): the minimum blocks per SM the kernel is compiled
  /// for (__launch_bounds__; 2, 3, 4, 5, 6 or 8), which caps its registers at 65536 / (128 x
  /// blocks); 0 keeps the template's rule. For A/B runs and tests.
  int force_min_blocks = 0;
  /// The chunked prefill's batches of x go through shared memory by cp.async, `force_stages`
  /// batches deep (2, 3, 4 or 6; stages x chunk <= 24), instead of two register buffers: more
  /// loads in flight with fewer registers. Needs 16-byte accesses of x (vec x element size =
  /// 16); PlanError otherwise and in other modes. 0: the planner's choice (4 stages where they
  /// apply); 1: the two register buffers. For A/B runs and tests.
  int force_stages = 0;
  /// Before launching, copy the indices (and cu_seqlens, query_start_loc, num_accepted_tokens)
  /// to the host and check them: indices < slots, no valid index repeated, cu_seqlens starting
  /// at 0, non-decreasing and ending at T, query_start_loc from 0, non-decreasing and at most
  /// T, num_accepted_tokens in 1..L-W+2 (InvalidArgument otherwise). Synchronizes the stream;
  /// skipped while it captures. Also on with KJIT_DEBUG_CHECKS=1. Without it, an index >= slots is
  /// treated as padding by the kernel and a num_accepted_tokens outside 1..L-W+2 is clamped into it
  /// (never an access out of the pool).
  bool debug_check_indices = false;
  /// CUDA device ordinal; -1: the stream's device (for the default stream, the calling
  /// thread's current device). A device other than the stream's is an InvalidArgument.
  int device = -1;
  /// nullptr: Runtime::global().
  Runtime* runtime = nullptr;
};

/// The modes force_mode accepts.
inline constexpr const char* kCausalConv1dModes[] = {"chunked", "sequential", "rows"};

/// Varlen prefill over a conv-state pool.
///
/// - x [T, D] (bf16, f16, f32), any token and channel strides (channel-contiguous [T, D] and
///   token-contiguous [D, T] buffers alike). D a multiple of 8 in 8..2^20.
/// - weight [D, W] (x's dtype or f32), any strides, W in 2..8; bias [D] (weight's dtype) or a
///   view with data == nullptr (no bias).
/// - conv_state [slots, D, L] (bf16, f16, f32), L >= W-1, any strides.
/// - cu_seqlens [N+1] (i32, i64): sequence n is tokens cu_seqlens[n]..cu_seqlens[n+1]-1;
///   cu_seqlens[0] = 0, non-decreasing, cu_seqlens[N] = T (checked in debug-check mode).
/// - state_indices [N] (i32, i64): each sequence's slot; padding per options.invalid_index.
///   Valid indices must not repeat (caller error, caught by debug_check_indices).
/// - has_initial_state [N] (u8) or data == nullptr (every sequence has one): 0 -> the history
///   is zeros instead of the slot's columns.
/// - out [T, D] (bf16, f16, f32), any strides; may be x itself (in place: same pointer and
///   strides; other overlaps are refused).
///
/// After the call, columns 0..W-2 of a sequence's slot hold its last W-1 inputs (with fewer
/// than W-1 tokens, the history shifted by the tokens); other columns are untouched. A
/// sequence of 0 tokens leaves its slot untouched. T and N from 0; T < 2^31, N <= 2^24.
void causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                   const TensorView& conv_state, const TensorView& cu_seqlens,
                   const TensorView& state_indices, const TensorView& has_initial_state,
                   const TensorView& out, const CausalConv1dOptions& options = {},
                   Stream stream = nullptr);

/// The plan causal_conv1d would launch on a device with these limits; launches nothing, needs
/// no GPU (pointers are only inspected for alignment and overlap).
Plan plan_causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                        const TensorView& conv_state, const TensorView& cu_seqlens,
                        const TensorView& state_indices, const TensorView& has_initial_state,
                        const TensorView& out, const CausalConv1dOptions& options,
                        const DeviceLimits& device);

/// Decode step (S = 1) or speculative verification (S > 1) of B rows, each one sequence.
///
/// - x [B, S, D] or [B, D] (S = 1), any strides; out the same shape (may be x: in place).
/// - weight, bias, conv_state as causal_conv1d; state_indices [B] (i32, i64).
/// - num_accepted_tokens [B] (i32, i64) or data == nullptr. Without it, the history is columns
///   0..W-2 and afterwards columns 0..W-2 hold the last W-1 inputs (history followed by the S
///   tokens). With it (speculative decoding, vLLM's convention): a = num_accepted_tokens[b] is
///   how many tokens the previous verification step accepted; the history is columns
///   a-1..a+W-3, and afterwards column k (k < min(L, W-2+S)) holds entry k+1 of (history
///   followed by the S tokens), so that the next step finds the history of each possible
///   acceptance count a' at columns a'-1..a'+W-3. Needs 1 <= a <= L-W+2.
///
/// B from 0 to 2^31-1 rows, S >= 1 with B*S < 2^31.
void causal_conv1d_update(const TensorView& x, const TensorView& weight, const TensorView& bias,
                          const TensorView& conv_state, const TensorView& state_indices,
                          const TensorView& num_accepted_tokens, const TensorView& out,
                          const CausalConv1dOptions& options = {}, Stream stream = nullptr);

/// The plan causal_conv1d_update would launch on a device with these limits.
Plan plan_causal_conv1d_update(const TensorView& x, const TensorView& weight,
                               const TensorView& bias, const TensorView& conv_state,
                               const TensorView& state_indices,
                               const TensorView& num_accepted_tokens, const TensorView& out,
                               const CausalConv1dOptions& options, const DeviceLimits& device);

/// causal_conv1d_update over rows of different lengths (vLLM's varlen speculative decoding):
///
/// - x [T, D] (any strides), the tokens of all rows; row b is tokens
///   query_start_loc[b]..query_start_loc[b+1]-1 (S_b of them, 0 allowed). out [T, D] (may be
///   x: in place); rows of x outside every row's range are not read and their out rows are
///   not written.
/// - query_start_loc [B+1] (i32, i64): from 0 up, non-decreasing, at most T (checked in
///   debug-check mode; without it, offsets are clamped into 0..T).
/// - state_indices [B], num_accepted_tokens [B] or data == nullptr, weight, bias, conv_state:
///   as causal_conv1d_update, with S_b in place of S: the history is columns 0..W-2 (or
///   a-1..a+W-3), and afterwards columns 0..W-2 hold the row's last W-1 inputs (or column k,
///   k < min(L, W-2+S_b), holds entry k+1 of history followed by the row's tokens).
/// - A row with S_b = 0 has no output and leaves its slot untouched; a padding row gets zero
///   output rows.
///
/// The plan depends on T and B, never on the offsets' values. T < 2^31, B < 2^31.
void causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                 const TensorView& bias, const TensorView& conv_state,
                                 const TensorView& query_start_loc, const TensorView& state_indices,
                                 const TensorView& num_accepted_tokens, const TensorView& out,
                                 const CausalConv1dOptions& options = {}, Stream stream = nullptr);

/// The plan causal_conv1d_update_varlen would launch on a device with these limits.
Plan plan_causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                      const TensorView& bias, const TensorView& conv_state,
                                      const TensorView& query_start_loc,
                                      const TensorView& state_indices,
                                      const TensorView& num_accepted_tokens, const TensorView& out,
                                      const CausalConv1dOptions& options,
                                      const DeviceLimits& device);

}  // namespace kjit
