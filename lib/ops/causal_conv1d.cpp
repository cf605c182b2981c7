// SPDX-License-Identifier: Apache-2.0
// causal_conv1d / causal_conv1d_update: argument checks, choice of vector width and mode, plans
// and launches.
#include "kjit/ops/causal_conv1d.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/runtime.hpp"
#include "kjit/spec.hpp"
// After kjit/types.hpp (via the op header): the params header declares kjit::i32 and friends.
#include "kjit/causal_conv1d_params.h"

namespace kjit {
namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSeqs = std::int64_t{1} << 24;
/// Tokens (T, or B * S) stay below 2^31: the bound, and what the i32 cu_seqlens of
/// every serving engine can address.
constexpr std::int64_t kMaxTokens = (std::int64_t{1} << 31) - 1;
/// Tokens per batch of loads (the spec's `chunk`). The prefill modes keep two batches in
/// flight (the next one issued before the current one is computed): 16 vector loads per thread.
constexpr std::int64_t kChunk = 8;
/// The chunked prefill's batch: 4 tokens (8 vector loads in flight per thread, 164 registers,
/// three blocks per SM) beat 8 (242 registers, two blocks) on the H200 at D = 8192, W = 4, bf16,
/// span 64, 16 uneven sequences (same run): 32k tokens 318.2 against 350.4 us, 128k 1221.9
/// against 1348.4 (docs/performance.md, "causal_conv1d").
constexpr std::int64_t kPrefillChunk = 4;
/// Tokens per work item of the chunked mode (the spec's `span`): the longest the planner picks
/// (amortizes the sequence lookup, weights and W - 1 token halo over 64 tokens: the halo adds
/// 3 / 64 of x's reads at W = 4), the shortest it picks, and the longest options.force_span
/// accepts.
constexpr std::int64_t kSpanLongest = 64;
constexpr std::int64_t kSpanShortest = 8;
constexpr std::int64_t kSpanForcedLongest = 256;
constexpr std::int64_t kThreads = 128;  // kConvBlockThreads of the template

enum class Op : std::uint8_t { prefill, update };

const char* op_name(Op op) { return op == Op::prefill ? "causal_conv1d" : "causal_conv1d_update"; }

[[noreturn]] void fail(Op op, const std::string& message) {
  throw InvalidArgument(fmt::format("{}: {}", op_name(op), message));
}

std::string shape_text(const TensorView& view) {
  std::string out = "[";
  for (int i = 0; i < view.rank; ++i) out += fmt::format("{}{}", i ? ", " : "", view.shape[i]);
  return out + "]";
}

/// Everything a plan depends on (no pointer values, only what they allow).
struct Problem {
  Op op = Op::prefill;
  DType in = DType::bf16, out = DType::bf16, weight = DType::bf16, state = DType::bf16;
  std::int64_t width = 4;
  std::int64_t dim = 0;
  std::int64_t state_len = 0;
  /// Prefill: T; update: S.
  std::int64_t tokens = 0;
  /// Prefill: N; update: B.
  std::int64_t seqs = 0;
  bool in_place = false;
  bool silu = false;
  /// Widest channel vector the layouts allow (1 when x or out is not channel-contiguous).
  std::int64_t max_vec = 1;
  std::string why_vec;
  /// 2: each slot is a contiguous [D, W-1] (vLLM's layout, L = W - 1); 1: channel-contiguous
  /// (the transposed [slots, L, D] buffer); 0: other strides.
  int state_layout = 0;
  /// Alignment in bytes of the pool's address and of the strides its vector accesses step by.
  std::int64_t state_align = 1;
  /// -1: the planner picks; else an index into kCausalConv1dModes.
  int forced_mode = -1;
  int force_vec = 0;
  int force_chunk = 0;
  int force_span = 0;
  /// Update: rows delimited by query_start_loc (x [T, D]; `tokens` is T).
  bool varlen = false;
};

struct Prepared {
  Problem problem;
  CausalConv1dParams params{};
  /// For the debug checks.
  TensorView cu_seqlens, indices, accepted, query_start_loc;
  std::int64_t slots = 0;
  /// For the vector loads of weight and bias (CausalConv1dParams::vector_flags): whether they
  /// are contiguous and how their addresses are aligned.
  bool weight_contiguous = false, bias_contiguous = false;
  std::int64_t weight_align = 1, bias_align = 1;
};

void require_rank(Op op, const char* name, const TensorView& v, int rank, const char* what) {
  if (v.rank != rank) {
    fail(op, fmt::format("{} has rank {} ({}); expected rank {}: {}", name, v.rank, v.str(), rank,
                         what));
  }
  for (int i = 0; i < rank; ++i) {
    if (v.shape[i] < 0) fail(op, fmt::format("{} {} has a negative extent", name, v.str()));
  }
}

void require_float(Op op, const char* name, const TensorView& v) {
  if (v.dtype != DType::f16 && v.dtype != DType::bf16 && v.dtype != DType::f32) {
    fail(op, fmt::format("{} has dtype {}; accepted: f16, bf16, f32", name, to_string(v.dtype)));
  }
}

void require_index(Op op, const char* name, const TensorView& v) {
  if (v.dtype != DType::i32 && v.dtype != DType::i64) {
    fail(op, fmt::format("{} has dtype {}; accepted: i32, i64", name, to_string(v.dtype)));
  }
}

/// Non-null (unless empty) and aligned to its element size.
void require_memory(Op op, const char* name, const TensorView& v) {
  if (v.data == nullptr && v.numel() > 0) fail(op, fmt::format("{} has a null data pointer", name));
  const auto address = reinterpret_cast<std::uintptr_t>(v.data);
  const std::size_t esize = size_of(v.dtype);
  if (address % esize != 0) {
    fail(op, fmt::format("{} data pointer {:#x} is not aligned to its element size ({} bytes for "
                         "{}); accepted: a multiple of {}",
                         name, address, esize, to_string(v.dtype), esize));
  }
}

/// Outputs must not have stride 0 along a dimension of extent > 1 (elements would alias).
void require_no_broadcast(Op op, const char* name, const TensorView& v) {
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] > 1 && v.strides[i] == 0) {
      fail(op, fmt::format("{} {} has stride 0 in dimension {} of extent {}; outputs must not "
                           "overlap themselves",
                           name, v.str(), i, v.shape[i]));
    }
  }
}

/// [lowest, highest] byte addresses a view touches.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView& v) {
  auto lo = reinterpret_cast<std::intptr_t>(v.data), hi = lo;
  const auto esize = static_cast<std::intptr_t>(size_of(v.dtype));
  for (int i = 0; i < v.rank; ++i) {
    if (v.shape[i] == 0) return {1, 0};
    const std::intptr_t span = (v.shape[i] - 1) * v.strides[i] * esize;
    (span < 0 ? lo : hi) += span;
  }
  return {static_cast<std::uintptr_t>(lo), static_cast<std::uintptr_t>(hi) + size_of(v.dtype) - 1};
}

bool overlaps(const TensorView& a, const TensorView& b) {
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  return a0 <= a1 && b0 <= b1 && a0 <= b1 && b0 <= a1;
}

std::int64_t align_of(std::uint64_t bytes) {
  return bytes == 0 ? 16 : std::min<std::int64_t>(16, std::int64_t{1} << std::countr_zero(bytes));
}

/// The widest channel vector x and out allow: channel stride 1 and every address and row /
/// token stride a multiple of the vector's bytes. Also says why not wider.
void choose_max_vec(Problem* p, const TensorView& x, const TensorView& out, int channel_dim) {
  if (x.strides[channel_dim] != 1 || out.strides[channel_dim] != 1) {
    p->max_vec = 1;
    p->why_vec = fmt::format(
        "channel strides of x / out are {} / {}: one channel per access (vectors need stride 1)",
        x.strides[channel_dim], out.strides[channel_dim]);
    return;
  }
  std::int64_t align = 16;
  for (const TensorView* v : {&x, &out}) {
    const std::uint64_t esize = size_of(v->dtype);
    align = std::min(align, align_of(reinterpret_cast<std::uintptr_t>(v->data)));
    for (int i = 0; i < channel_dim; ++i) {
      if (v->shape[i] > 1) {
        const std::uint64_t stride =
            static_cast<std::uint64_t>(v->strides[i] < 0 ? -v->strides[i] : v->strides[i]);
        align = std::min(align, align_of(stride * esize));
      }
    }
  }
  const std::int64_t widest =
      static_cast<std::int64_t>(std::max(size_of(x.dtype), size_of(out.dtype)));
  std::int64_t vec = 16 / widest;
  while (vec > 1 && (p->dim % vec != 0 || align < vec * widest)) vec /= 2;
  p->max_vec = vec;
  p->why_vec =
      fmt::format("x and out channel-contiguous, addresses and strides aligned to {} bytes", align);
}

void check_options(Op op, const CausalConv1dOptions& options, Problem* p) {
  p->silu = options.activation == ConvActivation::silu;
  if (options.activation != ConvActivation::none && options.activation != ConvActivation::silu) {
    fail(op, fmt::format("options.activation = {} is not an activation; accepted: none, silu",
                         static_cast<int>(options.activation)));
  }
  if (options.invalid_index != ConvInvalidIndex::negative &&
      options.invalid_index != ConvInvalidIndex::nonpositive) {
    fail(op, fmt::format("options.invalid_index = {} is not a rule; accepted: negative, "
                         "nonpositive",
                         static_cast<int>(options.invalid_index)));
  }
  p->forced_mode = -1;
  if (!options.force_mode.empty()) {
    for (int i = 0; i < static_cast<int>(std::size(kCausalConv1dModes)); ++i) {
      if (options.force_mode == kCausalConv1dModes[i]) p->forced_mode = i;
    }
    const bool allowed =
        op == Op::prefill ? (p->forced_mode == 0 || p->forced_mode == 1) : p->forced_mode == 2;
    if (!allowed) {
      fail(op, fmt::format("options.force_mode = '{}' is not a mode of this op; accepted: '' "
                           "(planner picks), {}",
                           options.force_mode,
                           op == Op::prefill ? "'chunked', 'sequential'" : "'rows'"));
    }
  }
  if (options.force_vec != 0 && options.force_vec != 1 && options.force_vec != 2 &&
      options.force_vec != 4 && options.force_vec != 8) {
    fail(op, fmt::format("options.force_vec = {}; accepted: 0 (planner picks), 1, 2, 4, 8",
                         options.force_vec));
  }
  p->force_vec = options.force_vec;
  if (options.force_chunk != 0 && options.force_chunk != 1 && options.force_chunk != 2 &&
      options.force_chunk != 4 && options.force_chunk != 8 && options.force_chunk != 16) {
    fail(op, fmt::format("options.force_chunk = {}; accepted: 0 (planner picks), 1, 2, 4, 8, 16",
                         options.force_chunk));
  }
  p->force_chunk = options.force_chunk;
  const int span = options.force_span;
  if (span != 0 && (span < kSpanShortest || span > kSpanForcedLongest ||
                    !std::has_single_bit(static_cast<unsigned>(span)))) {
    fail(op, fmt::format("options.force_span = {}; accepted: 0 (planner picks), 8, 16, 32, 64, "
                         "128, 256",
                         span));
  }
  p->force_span = span;
}

/// weight [D, W], bias [D] or none, conv_state [slots, D, L]; fills the common parameters.
void check_weights_and_pool(Op op, const TensorView& x, const TensorView& weight,
                            const TensorView& bias, const TensorView& state, Prepared* prep) {
  Problem& p = prep->problem;
  CausalConv1dParams& k = prep->params;
  require_rank(op, "weight", weight, 2, "[D, W]");
  if (weight.shape[0] != p.dim) {
    fail(op, fmt::format("weight has shape {}; expected [D, W] with D = {} (the channels of x)",
                         shape_text(weight), p.dim));
  }
  p.width = weight.shape[1];
  if (p.width < 2 || p.width > 8) {
    fail(op, fmt::format("weight has shape {}: width W = {}; accepted: 2..8", shape_text(weight),
                         p.width));
  }
  if (weight.dtype != x.dtype && weight.dtype != DType::f32) {
    fail(op, fmt::format("weight has dtype {}; accepted: {} (x's dtype) or f32",
                         to_string(weight.dtype), to_string(x.dtype)));
  }
  require_memory(op, "weight", weight);
  p.weight = weight.dtype;
  prep->weight_contiguous = weight.strides[0] == p.width && weight.strides[1] == 1;
  prep->weight_align = align_of(reinterpret_cast<std::uintptr_t>(weight.data));
  k.weight = weight.data;
  k.weight_channel_stride = weight.strides[0];
  k.weight_tap_stride = weight.strides[1];
  if (bias.data != nullptr) {
    require_rank(op, "bias", bias, 1, "[D]");
    if (bias.shape[0] != p.dim) {
      fail(op, fmt::format("bias has shape {}; expected [D] = [{}]", shape_text(bias), p.dim));
    }
    if (bias.dtype != weight.dtype) {
      fail(op, fmt::format("bias has dtype {}; accepted: {} (weight's dtype)",
                           to_string(bias.dtype), to_string(weight.dtype)));
    }
    require_memory(op, "bias", bias);
    k.bias = bias.data;
    k.bias_stride = bias.strides[0];
    prep->bias_contiguous = bias.strides[0] == 1;
    prep->bias_align = align_of(reinterpret_cast<std::uintptr_t>(bias.data));
  }
  require_rank(op, "conv_state", state, 3, "[slots, D, L] with L >= W - 1");
  require_float(op, "conv_state", state);
  if (state.shape[1] != p.dim || state.shape[2] < p.width - 1) {
    fail(op, fmt::format("conv_state has shape {}; expected [slots, D, L] with D = {} and L >= "
                         "W - 1 = {}",
                         shape_text(state), p.dim, p.width - 1));
  }
  require_memory(op, "conv_state", state);
  require_no_broadcast(op, "conv_state", state);
  p.state = state.dtype;
  p.state_len = state.shape[2];
  {
    const auto ss = static_cast<std::uint64_t>(size_of(state.dtype));
    const auto stride_bytes = [&](int dim) {
      const std::int64_t st = state.strides[dim];
      return state.shape[dim] > 1 ? static_cast<std::uint64_t>(st < 0 ? -st : st) * ss : 0;
    };
    std::int64_t align = align_of(reinterpret_cast<std::uintptr_t>(state.data));
    align = std::min(align, align_of(stride_bytes(0)));
    if (state.strides[2] == 1 && state.strides[1] == p.width - 1 && p.state_len == p.width - 1) {
      p.state_layout = 2;
    } else if (state.strides[1] == 1 || state.shape[1] == 1) {
      p.state_layout = 1;
      align = std::min(align, align_of(stride_bytes(2)));
    }
    p.state_align = align;
  }
  prep->slots = state.shape[0];
  k.state = state.data;
  k.state_slot_stride = state.strides[0];
  k.state_channel_stride = state.strides[1];
  k.state_col_stride = state.strides[2];
  k.num_slots = state.shape[0];
  k.state_len = state.shape[2];
}

/// num_accepted_tokens [B] (i32, i64) or data == nullptr; B = prep->problem.seqs.
void check_accepted(Op op, const TensorView& accepted, Prepared* prep) {
  if (accepted.data == nullptr) return;
  const std::int64_t rows = prep->problem.seqs;
  require_rank(op, "num_accepted_tokens", accepted, 1, "[B]");
  require_index(op, "num_accepted_tokens", accepted);
  require_memory(op, "num_accepted_tokens", accepted);
  if (accepted.shape[0] != rows) {
    fail(op, fmt::format("num_accepted_tokens has shape {}; expected [B] = [{}]",
                         shape_text(accepted), rows));
  }
  prep->params.num_accepted = accepted.data;
  prep->params.accepted_stride = accepted.strides[0];
  prep->params.accepted_bytes = static_cast<u32>(size_of(accepted.dtype));
}

void check_dim(Op op, const TensorView& x, std::int64_t dim) {
  if (dim < 8 || dim > kMaxDim || dim % 8 != 0) {
    fail(op, fmt::format("x {} has D = {} channels; accepted: a multiple of 8 in 8..2^20 ({})",
                         x.str(), dim, kMaxDim));
  }
}

void check_out(Op op, const TensorView& x, const TensorView& out, Problem* p) {
  require_float(op, "out", out);
  require_memory(op, "out", out);
  require_no_broadcast(op, "out", out);
  bool same_shape = out.rank == x.rank;
  for (int i = 0; same_shape && i < x.rank; ++i) same_shape = out.shape[i] == x.shape[i];
  if (!same_shape) {
    fail(op,
         fmt::format("out has shape {}; expected x's shape {}", shape_text(out), shape_text(x)));
  }
  bool same_view = out.data == x.data && out.dtype == x.dtype;
  for (int i = 0; same_view && i < x.rank; ++i) same_view = out.strides[i] == x.strides[i];
  p->in_place = same_view && x.numel() > 0;
  if (!p->in_place && overlaps(x, out)) {
    fail(op, fmt::format("out {} overlaps x {} without being x itself; accepted: disjoint "
                         "memory, or out == x (same pointer, dtype and strides: in place)",
                         out.str(), x.str()));
  }
}

/// The launch parameters every form shares: x and out (their last two dimensions are tokens
/// and channels: [T, D] or the [S, D] of each [B, S, D] row), the state indices, the padding
/// rule and the sizes.
void fill_common_params(const TensorView& x, const TensorView& out, const TensorView& indices,
                        const CausalConv1dOptions& options, const Problem& p,
                        CausalConv1dParams* k) {
  const int last = x.rank - 1;
  k->x = x.data;
  k->out = out.data;
  k->state_indices = indices.data;
  k->x_token_stride = x.strides[last - 1];
  k->x_channel_stride = x.strides[last];
  k->out_token_stride = out.strides[last - 1];
  k->out_channel_stride = out.strides[last];
  k->index_stride = indices.strides[0];
  k->index_bytes = static_cast<u32>(size_of(indices.dtype));
  k->nonpositive_invalid = options.invalid_index == ConvInvalidIndex::nonpositive ? 1 : 0;
  k->num_tokens = p.tokens;
  k->num_seqs = p.seqs;
}

/// x [T, D] (tokens of every sequence or row back to back) and what is checked against it:
/// weights, bias, pool and out. Shared by the prefill and the varlen update.
void check_token_rows(Op op, const TensorView& x, const char* x_shape, const TensorView& weight,
                      const TensorView& bias, const TensorView& state, const TensorView& out,
                      Prepared* prep) {
  Problem& p = prep->problem;
  require_rank(op, "x", x, 2, x_shape);
  require_float(op, "x", x);
  require_memory(op, "x", x);
  p.in = x.dtype;
  p.tokens = x.shape[0];
  p.dim = x.shape[1];
  check_dim(op, x, p.dim);
  if (p.tokens > kMaxTokens) {
    fail(op, fmt::format("x has T = {} tokens; accepted: at most 2^31 - 1", p.tokens));
  }
  check_weights_and_pool(op, x, weight, bias, state, prep);
  check_out(op, x, out, &p);
  p.out = out.dtype;
}

Prepared prepare_prefill(const TensorView& x, const TensorView& weight, const TensorView& bias,
                         const TensorView& state, const TensorView& cu_seqlens,
                         const TensorView& indices, const TensorView& has_initial,
                         const TensorView& out, const CausalConv1dOptions& options) {
  const Op op = Op::prefill;
  Prepared prep;
  Problem& p = prep.problem;
  CausalConv1dParams& k = prep.params;
  p.op = op;
  check_options(op, options, &p);
  check_token_rows(op, x, "[T, D]", weight, bias, state, out, &prep);
  require_rank(op, "cu_seqlens", cu_seqlens, 1, "[N + 1]");
  require_index(op, "cu_seqlens", cu_seqlens);
  require_memory(op, "cu_seqlens", cu_seqlens);
  if (cu_seqlens.shape[0] < 1) {
    fail(op, "cu_seqlens has shape [0]; expected [N + 1] (at least the leading 0)");
  }
  p.seqs = cu_seqlens.shape[0] - 1;
  if (p.seqs > kMaxSeqs) {
    fail(op, fmt::format("cu_seqlens describes N = {} sequences; accepted: at most 2^24", p.seqs));
  }
  require_rank(op, "state_indices", indices, 1, "[N]");
  require_index(op, "state_indices", indices);
  require_memory(op, "state_indices", indices);
  if (indices.shape[0] != p.seqs) {
    fail(op, fmt::format("state_indices has shape {}; expected [N] = [{}] (cu_seqlens has N + 1 "
                         "entries)",
                         shape_text(indices), p.seqs));
  }
  if (has_initial.data != nullptr) {
    require_rank(op, "has_initial_state", has_initial, 1, "[N]");
    if (has_initial.dtype != DType::u8) {
      fail(op, fmt::format("has_initial_state has dtype {}; accepted: u8 (bool)",
                           to_string(has_initial.dtype)));
    }
    if (has_initial.shape[0] != p.seqs) {
      fail(op, fmt::format("has_initial_state has shape {}; expected [N] = [{}]",
                           shape_text(has_initial), p.seqs));
    }
    k.has_initial_state = static_cast<const unsigned char*>(has_initial.data);
    k.has_initial_stride = has_initial.strides[0];
  }
  choose_max_vec(&p, x, out, 1);
  fill_common_params(x, out, indices, options, p, &k);
  k.cu_seqlens = cu_seqlens.data;
  k.cu_stride = cu_seqlens.strides[0];
  k.cu_bytes = static_cast<u32>(size_of(cu_seqlens.dtype));
  prep.cu_seqlens = cu_seqlens;
  prep.indices = indices;
  return prep;
}

Prepared prepare_update(const TensorView& x_in, const TensorView& weight, const TensorView& bias,
                        const TensorView& state, const TensorView& indices,
                        const TensorView& accepted, const TensorView& out_in,
                        const CausalConv1dOptions& options) {
  const Op op = Op::update;
  Prepared prep;
  Problem& p = prep.problem;
  CausalConv1dParams& k = prep.params;
  p.op = op;
  check_options(op, options, &p);
  if (x_in.rank != 2 && x_in.rank != 3) {
    fail(op, fmt::format("x has rank {} ({}); expected [B, S, D], or [B, D] for S = 1", x_in.rank,
                         x_in.str()));
  }
  // [B, D] is [B, 1, D]: the token stride is never stepped over.
  auto as3 = [](const TensorView& v) {
    if (v.rank == 3) return v;
    TensorView t = v;
    t.rank = 3;
    t.shape[2] = v.shape[1];
    t.strides[2] = v.strides[1];
    t.shape[1] = 1;
    t.strides[1] = 0;
    return t;
  };
  if (out_in.rank != x_in.rank) {
    fail(op, fmt::format("out has shape {}; expected x's shape {}", shape_text(out_in),
                         shape_text(x_in)));
  }
  const TensorView x = as3(x_in), out = as3(out_in);
  require_rank(op, "x", x, 3, "[B, S, D]");
  require_float(op, "x", x);
  require_memory(op, "x", x);
  p.in = x.dtype;
  p.seqs = x.shape[0];
  p.tokens = x.shape[1];
  p.dim = x.shape[2];
  check_dim(op, x_in, p.dim);
  if (p.tokens < 1)
    fail(op, fmt::format("x {} has S = 0 tokens per row; accepted: S >= 1", x_in.str()));
  if (p.seqs > kMaxTokens / p.tokens) {
    fail(op, fmt::format("x has B * S = {} * {} tokens; accepted: B * S < 2^31", p.seqs, p.tokens));
  }
  check_weights_and_pool(op, x, weight, bias, state, &prep);
  check_out(op, x_in, out_in, &p);
  p.out = out.dtype;
  require_rank(op, "state_indices", indices, 1, "[B]");
  require_index(op, "state_indices", indices);
  require_memory(op, "state_indices", indices);
  if (indices.shape[0] != p.seqs) {
    fail(op, fmt::format("state_indices has shape {}; expected [B] = [{}]", shape_text(indices),
                         p.seqs));
  }
  check_accepted(op, accepted, &prep);
  choose_max_vec(&p, x, out, 2);
  fill_common_params(x, out, indices, options, p, &k);
  k.x_row_stride = x.strides[0];
  k.out_row_stride = out.strides[0];
  prep.indices = indices;
  prep.accepted = accepted;
  return prep;
}

/// The varlen update: x and out [T, D], row b = tokens query_start_loc[b]..[b + 1] - 1.
Prepared prepare_update_varlen(const TensorView& x, const TensorView& weight,
                               const TensorView& bias, const TensorView& state,
                               const TensorView& query_start_loc, const TensorView& indices,
                               const TensorView& accepted, const TensorView& out,
                               const CausalConv1dOptions& options) {
  const Op op = Op::update;
  Prepared prep;
  Problem& p = prep.problem;
  CausalConv1dParams& k = prep.params;
  p.op = op;
  p.varlen = true;
  check_options(op, options, &p);
  check_token_rows(op, x, "[T, D]: the tokens of all rows, delimited by query_start_loc", weight,
                   bias, state, out, &prep);
  require_rank(op, "state_indices", indices, 1, "[B]");
  require_index(op, "state_indices", indices);
  require_memory(op, "state_indices", indices);
  p.seqs = indices.shape[0];
  if (p.seqs > kMaxTokens) {
    fail(op, fmt::format("state_indices has B = {} rows; accepted: at most 2^31 - 1", p.seqs));
  }
  require_rank(op, "query_start_loc", query_start_loc, 1, "[B + 1]");
  require_index(op, "query_start_loc", query_start_loc);
  require_memory(op, "query_start_loc", query_start_loc);
  if (query_start_loc.shape[0] != p.seqs + 1) {
    fail(op, fmt::format("query_start_loc has shape {}; expected [B + 1] = [{}] (state_indices "
                         "has B = {} rows)",
                         shape_text(query_start_loc), p.seqs + 1, p.seqs));
  }
  check_accepted(op, accepted, &prep);
  choose_max_vec(&p, x, out, 1);
  fill_common_params(x, out, indices, options, p, &k);
  k.query_start_loc = query_start_loc.data;
  k.query_start_stride = query_start_loc.strides[0];
  k.query_start_bytes = static_cast<u32>(size_of(query_start_loc.dtype));
  prep.indices = indices;
  prep.accepted = accepted;
  prep.query_start_loc = query_start_loc;
  return prep;
}

/// Work items of a mode: (span ids, sequences or rows) x channel groups.
std::uint64_t items_of(const Problem& p, int mode, std::int64_t vec, std::int64_t span) {
  const auto groups = static_cast<std::uint64_t>(p.dim / vec);
  std::uint64_t units = static_cast<std::uint64_t>(p.seqs);
  if (mode == 0) units = static_cast<std::uint64_t>(p.tokens / span + p.seqs);
  return units * groups;
}

Plan make_plan(const Problem& p, const DeviceLimits& limits) {
  Plan plan;
  plan.op = op_name(p.op);
  plan.device = limits;
  if (p.seqs == 0 || ((p.op == Op::prefill || p.varlen) && p.tokens == 0)) {
    plan.mode = "empty";
    plan.reasons.push_back(fmt::format("{} = {}, T = {}: nothing to do, nothing is launched",
                                       p.op == Op::prefill ? "N" : "B", p.seqs, p.tokens));
    return plan;
  }
  std::int64_t vec = p.max_vec;
  if (p.force_vec != 0) {
    if (p.force_vec > p.max_vec) {
      throw PlanError(fmt::format("{}: options.force_vec = {} is not possible: at most {} ({})",
                                  plan.op, p.force_vec, p.max_vec, p.why_vec));
    }
    vec = p.force_vec;
    plan.reasons.push_back(fmt::format("vec = {} forced by options.force_vec", vec));
  } else if (p.op == Op::prefill && p.width > 4 && vec > 4) {
    // The taps, bias and history of a thread's channels are (2W) x vec floats: at W > 4 and
    // 8 channels, with two batches of loads in flight, the prefill kernel spills (W = 6 and 8,
    // bf16: 255 registers, 224 and 576 bytes of spill stores at sm_90).
    vec = 4;
    plan.reasons.push_back(fmt::format(
        "vec = 4 channels per thread: W = {} > 4, whose taps and history for 8 channels would "
        "not fit in registers beside two batches of loads ({} allows {})",
        p.width, p.why_vec, p.max_vec));
  } else {
    plan.reasons.push_back(fmt::format("vec = {} channels per thread: {}", vec, p.why_vec));
  }

  int mode = 2;
  if (p.op == Op::prefill) {
    if (p.forced_mode >= 0) {
      mode = p.forced_mode;
      if (mode == 0 && p.in_place) {
        throw PlanError(fmt::format(
            "{}: forced mode 'chunked' is not legal in place (out == x): a span reads the W - 1 "
            "inputs before it, which the previous span's threads overwrite; use 'sequential'",
            plan.op));
      }
      plan.reasons.push_back(
          fmt::format("mode {} forced by options.force_mode", kCausalConv1dModes[mode]));
    } else if (p.in_place) {
      mode = 1;
      plan.reasons.push_back(
          "sequential: in place (out == x), so each (sequence, channel group) is walked by one "
          "thread that reads every input before overwriting it (spans would read inputs their "
          "neighbours overwrite)");
    } else {
      mode = 0;
    }
  } else {
    plan.reasons.push_back(fmt::format(
        "rows: one thread per (row, {} channels) over the row's {}; its pool columns are read "
        "and written by that thread alone",
        vec,
        p.varlen ? fmt::format("tokens query_start_loc[b]..query_start_loc[b + 1] - 1 (T = {} "
                               "in all; a row without tokens leaves its slot untouched)",
                               p.tokens)
                 : fmt::format("S = {} tokens", p.tokens)));
  }
  if (p.force_span != 0 && mode != 0) {
    throw PlanError(
        fmt::format("{}: options.force_span = {} applies to mode 'chunked' only; this "
                    "call runs mode '{}'",
                    plan.op, p.force_span, kCausalConv1dModes[mode]));
  }

  // Tokens whose loads are in flight at once: a batch of the prefill (two batches in flight);
  // an update row's S tokens up to 8 (fewer registers held for loads that never happen at
  // S = 1), for varlen rows their mean length T / B.
  const std::int64_t row_tokens =
      p.varlen ? std::max<std::int64_t>(1, (p.tokens + p.seqs - 1) / p.seqs) : p.tokens;
  std::int64_t chunk =
      mode == 2   ? std::min<std::int64_t>(kChunk, static_cast<std::int64_t>(std::bit_ceil(
                                                       static_cast<std::uint64_t>(row_tokens))))
      : mode == 0 ? kPrefillChunk
                  : kChunk;
  if (p.force_chunk != 0) {
    chunk = p.force_chunk;
    plan.reasons.push_back(fmt::format("chunk = {} forced by options.force_chunk", chunk));
  }
  // Tokens per chunked work item: the longest span of kSpanLongest, kSpanLongest / 2, ..
  // kSpanShortest that still gives every SM max_threads_per_sm / 2 work items (the device full
  // of threads about 2.7 times over at the 384 threads an SM holds at this kernel's
  // registers), so that short calls keep every SM busy and long ones amortize each item's
  // fixed cost. At 8k tokens (D = 8192, 16 sequences) that is span 64: 92.0 us, against
  // 101.4 us for span 32 with batches of 8 (same run).
  std::int64_t span = 0;
  if (mode == 0) {
    const std::int64_t floor_span = std::max({kSpanShortest, chunk, p.width - 1});
    const auto enough = static_cast<std::uint64_t>(limits.sm_count) *
                        static_cast<std::uint64_t>(limits.max_threads_per_sm) / 2;
    if (p.force_span != 0) {
      if (p.force_span < floor_span) {
        throw PlanError(fmt::format(
            "{}: options.force_span = {} is shorter than the chunk ({} tokens per batch of "
            "loads) or the W - 1 = {} token halo a span covers for the next one",
            plan.op, p.force_span, chunk, p.width - 1));
      }
      span = p.force_span;
      plan.reasons.push_back(fmt::format("span = {} forced by options.force_span", span));
    } else {
      span = std::max(kSpanLongest, floor_span);
      while (span > floor_span && items_of(p, 0, vec, span) < enough) span /= 2;
      plan.reasons.push_back(fmt::format(
          "span = {} tokens per work item: the longest of {}..{} giving at least {} SMs x {} "
          "threads / 2 = {} items ({} here), so that each item's sequence lookup, weights and "
          "W - 1 token halo are spread over many tokens while every SM still gets threads",
          span, kSpanLongest, floor_span, limits.sm_count, limits.max_threads_per_sm, enough,
          items_of(p, 0, vec, span)));
    }
    plan.reasons.push_back(fmt::format(
        "chunked: every span of {} tokens of every sequence in parallel (span ids "
        "floor(cu[n] / {}) + n + s, {} ids for T = {}, N = {}), each walked in batches of {} "
        "tokens with the next batch's loads issued before the current one is computed; the "
        "thread of a sequence's first span reads and writes its pool slot",
        span, span, p.tokens / span + p.seqs, p.tokens, p.seqs, chunk));
  }
  plan.mode = kCausalConv1dModes[mode];

  // The pool: its columns are a small part of a prefill's bytes but half of a decode step's.
  const auto state_size = static_cast<std::int64_t>(size_of(p.state));
  const std::int64_t block_bytes = vec * (p.width - 1) * state_size;
  std::string pool = "scalar";
  if (p.state_layout == 2 && block_bytes % 16 == 0 && p.state_align >= 16) {
    pool = "block";
    plan.reasons.push_back(fmt::format(
        "pool access block: each slot is a contiguous [D, W-1], so a thread's {} x {} columns are "
        "{} contiguous bytes, moved as 16-byte vectors",
        vec, p.width - 1, block_bytes));
  } else if (p.state_layout == 1 && vec > 1 && vec * state_size <= 16 &&
             p.state_align >= vec * state_size) {
    pool = "channels";
    plan.reasons.push_back(fmt::format(
        "pool access channels: the pool is channel-contiguous, one {}-byte vector per column",
        vec * state_size));
  } else {
    plan.reasons.push_back(fmt::format(
        "pool access scalar: {}",
        p.state_layout == 2 ? fmt::format("the [vec, W-1] block is {} bytes or the pool is "
                                          "aligned to {} bytes (needs whole 16-byte vectors)",
                                          block_bytes, p.state_align)
        : p.state_layout == 1
            ? fmt::format("channel vectors of {} x {} bytes with the pool aligned to {} bytes "
                          "(needs 2..16 bytes, aligned)",
                          vec, state_size, p.state_align)
            : std::string("the pool is neither [slots, D, W-1] contiguous per slot nor "
                          "channel-contiguous")));
  }

  const std::uint64_t items = items_of(p, mode, vec, span);
  const std::uint64_t wanted = (items + kThreads - 1) / kThreads;
  const std::uint64_t blocks =
      std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(limits.max_grid_dim[0]));
  plan.reasons.push_back(fmt::format(
      "grid ({}) x block ({}): 1-D over {} work items{}; no grid y or z, so no size of T, N, B "
      "or D reaches the 65535 limit",
      blocks, kThreads, items,
      blocks < wanted ? fmt::format(", {} items per thread (grid-stride loop)",
                                    (items + blocks * kThreads - 1) / (blocks * kThreads))
                      : ""));

  PlannedLaunch launch;
  launch.spec = KernelSpec::make("causal_conv1d",
                                 {{"in", std::string(to_string(p.in))},
                                  {"out", std::string(to_string(p.out))},
                                  {"weight", std::string(to_string(p.weight))},
                                  {"state", std::string(to_string(p.state))},
                                  {"width", std::to_string(p.width)},
                                  {"vec", std::to_string(vec)},
                                  {"chunk", std::to_string(chunk)},
                                  {"span", std::to_string(span)},
                                  {"mode", plan.mode},
                                  {"pool", pool},
                                  {"silu", p.silu ? "1" : "0"}},
                                 limits.arch);
  launch.shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  launch.shape.block = Dim3{static_cast<std::uint32_t>(kThreads), 1, 1};
  launch.checks = check_launch(launch.shape, limits);
  require_legal(launch.checks, plan.op);
  plan.launches.push_back(std::move(launch));
  return plan;
}

/// The memo key: every input of make_plan and the device, as 64-bit fields (no padding). The
/// tag keeps it apart from other ops' keys of the same size.
struct Signature {
  std::int64_t tag = 0x636f6e763164;  // "conv1d"
  std::int64_t op = 0;
  std::int64_t dtypes = 0;
  std::int64_t width = 0;
  std::int64_t dim = 0;
  std::int64_t state_len = 0;
  std::int64_t tokens = 0;
  std::int64_t seqs = 0;
  std::int64_t in_place = 0;
  std::int64_t silu = 0;
  std::int64_t max_vec = 0;
  std::int64_t state_layout = 0;
  std::int64_t state_align = 0;
  std::int64_t forced_mode = 0;
  std::int64_t force_vec = 0;
  std::int64_t force_chunk = 0;
  std::int64_t force_span = 0;
  std::int64_t varlen = 0;
  std::int64_t device = 0;
};
static_assert(std::has_unique_object_representations_v<Signature>);

std::int64_t read_int(const std::vector<unsigned char>& host, DType dtype, std::int64_t i) {
  if (dtype == DType::i64) {
    std::int64_t v = 0;
    std::memcpy(&v, host.data() + i * 8, 8);
    return v;
  }
  std::int32_t v = 0;
  std::memcpy(&v, host.data() + i * 4, 4);
  return v;
}

std::vector<unsigned char> to_host(Runtime& runtime, const TensorView& v, std::int64_t count,
                                   Stream stream) {
  const std::size_t esize = size_of(v.dtype);
  std::vector<unsigned char> strided(
      count > 0 ? static_cast<std::size_t>((count - 1) * v.strides[0] + 1) * esize : 0);
  if (!strided.empty()) runtime.copy_to_host(strided.data(), v.data, strided.size(), stream);
  std::vector<unsigned char> packed(static_cast<std::size_t>(count) * esize);
  for (std::int64_t i = 0; i < count; ++i) {
    std::memcpy(packed.data() + i * esize, strided.data() + i * v.strides[0] * esize, esize);
  }
  return packed;
}

/// Debug checks of the values behind the pointers (see CausalConv1dOptions::debug_check_indices).
/// Skipped under graph capture, where no host copy can be made.
void check_values(Runtime& runtime, const Prepared& prep, const CausalConv1dOptions& options,
                  Stream stream) {
  const Problem& p = prep.problem;
  const Op op = p.op;
  if (runtime.capturing(stream)) return;
  if (op == Op::prefill) {
    const auto cu_host = to_host(runtime, prep.cu_seqlens, p.seqs + 1, stream);
    std::int64_t previous = 0;
    for (std::int64_t n = 0; n <= p.seqs; ++n) {
      const std::int64_t value = read_int(cu_host, prep.cu_seqlens.dtype, n);
      if ((n == 0 && value != 0) || value < previous || (n == p.seqs && value != p.tokens)) {
        fail(op, fmt::format("cu_seqlens[{}] = {} (previous {}); accepted: cu_seqlens[0] = 0, "
                             "non-decreasing, cu_seqlens[N] = T = {} (debug check)",
                             n, value, previous, p.tokens));
      }
      previous = value;
    }
  }
  if (p.varlen) {
    const auto qsl_host = to_host(runtime, prep.query_start_loc, p.seqs + 1, stream);
    std::int64_t previous = 0;
    for (std::int64_t b = 0; b <= p.seqs; ++b) {
      const std::int64_t value = read_int(qsl_host, prep.query_start_loc.dtype, b);
      if (value < previous || value > p.tokens) {
        fail(op, fmt::format("query_start_loc[{}] = {} (previous {}); accepted: from 0, "
                             "non-decreasing, at most T = {} (debug check)",
                             b, value, previous, p.tokens));
      }
      previous = value;
    }
  }
  const auto idx = to_host(runtime, prep.indices, p.seqs, stream);
  std::unordered_set<std::int64_t> seen;
  for (std::int64_t n = 0; n < p.seqs; ++n) {
    const std::int64_t slot = read_int(idx, prep.indices.dtype, n);
    if (options.invalid_index == ConvInvalidIndex::nonpositive ? slot <= 0 : slot < 0) continue;
    if (slot >= prep.slots) {
      fail(op, fmt::format("state_indices[{}] = {} is out of range; the pool has {} slots (debug "
                           "check)",
                           n, slot, prep.slots));
    }
    if (!seen.insert(slot).second) {
      fail(op, fmt::format("state_indices[{}] = {} repeats an earlier valid index; sequences of "
                           "one call must use distinct slots (debug check)",
                           n, slot));
    }
  }
  if (op == Op::update && prep.accepted.data != nullptr) {
    const auto acc = to_host(runtime, prep.accepted, p.seqs, stream);
    const std::int64_t most = p.state_len - p.width + 2;
    for (std::int64_t n = 0; n < p.seqs; ++n) {
      const std::int64_t a = read_int(acc, prep.accepted.dtype, n);
      if (a < 1 || a > most) {
        fail(op, fmt::format("num_accepted_tokens[{}] = {}; accepted: 1..L - W + 2 = {} (the "
                             "history at columns a - 1..a + W - 3 must lie in the pool's L = {} "
                             "columns) (debug check)",
                             n, a, most, p.state_len));
      }
    }
  }
}

void run(Prepared prep, const CausalConv1dOptions& options, Stream stream) {
  const Problem& p = prep.problem;
  if (p.seqs == 0 || ((p.op == Op::prefill || p.varlen) && p.tokens == 0)) return;
  Runtime& runtime = options.runtime != nullptr ? *options.runtime : Runtime::global();
  const int device = runtime.device_of(stream, options.device);
  Signature sig{};
  sig.op = static_cast<std::int64_t>(p.op);
  sig.dtypes = static_cast<std::int64_t>(p.in) | static_cast<std::int64_t>(p.out) << 8 |
               static_cast<std::int64_t>(p.weight) << 16 | static_cast<std::int64_t>(p.state) << 24;
  sig.width = p.width;
  sig.dim = p.dim;
  sig.state_len = p.state_len;
  sig.tokens = p.tokens;
  sig.seqs = p.seqs;
  sig.in_place = p.in_place ? 1 : 0;
  sig.silu = p.silu ? 1 : 0;
  sig.max_vec = p.max_vec;
  sig.state_layout = p.state_layout;
  sig.state_align = p.state_align;
  sig.forced_mode = p.forced_mode;
  sig.force_vec = p.force_vec;
  sig.force_chunk = p.force_chunk;
  sig.force_span = p.force_span;
  sig.varlen = p.varlen ? 1 : 0;
  sig.device = device;
  const Runtime::ResolvedPlan& resolved = runtime.memoized(sig, stream, [&] {
    return std::pair{make_plan(p, runtime.device_limits(device)), device};
  });
  if (resolved.plan.launches.empty()) return;
  if (options.debug_check_indices || runtime.settings().debug_checks) {
    check_values(runtime, prep, options, stream);
  }
  const KernelSpec& spec = resolved.plan.launches[0].spec;
  const std::int64_t vec = spec.get_int("vec");
  const int mode = spec.get("mode") == "chunked" ? 0 : spec.get("mode") == "sequential" ? 1 : 2;
  prep.params.channel_groups = static_cast<u32>(p.dim / vec);
  const auto weight_size = static_cast<std::int64_t>(size_of(p.weight));
  u32 flags = 0;
  if (prep.weight_contiguous && prep.weight_align >= 16 && vec * p.width * weight_size % 16 == 0) {
    flags |= kConvWeightBlock;
  }
  if (prep.params.bias != nullptr && prep.bias_contiguous && vec > 1 && vec * weight_size <= 16 &&
      prep.bias_align >= vec * weight_size) {
    flags |= kConvBiasVector;
  }
  prep.params.vector_flags = flags;
  prep.params.num_items = items_of(p, mode, vec, spec.get_int("span"));
  runtime.launch(resolved, 0, stream, &prep.params, sizeof prep.params);
}

}  // namespace

void causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                   const TensorView& conv_state, const TensorView& cu_seqlens,
                   const TensorView& state_indices, const TensorView& has_initial_state,
                   const TensorView& out, const CausalConv1dOptions& options, Stream stream) {
  run(prepare_prefill(x, weight, bias, conv_state, cu_seqlens, state_indices, has_initial_state,
                      out, options),
      options, stream);
}

Plan plan_causal_conv1d(const TensorView& x, const TensorView& weight, const TensorView& bias,
                        const TensorView& conv_state, const TensorView& cu_seqlens,
                        const TensorView& state_indices, const TensorView& has_initial_state,
                        const TensorView& out, const CausalConv1dOptions& options,
                        const DeviceLimits& device) {
  return make_plan(prepare_prefill(x, weight, bias, conv_state, cu_seqlens, state_indices,
                                   has_initial_state, out, options)
                       .problem,
                   device);
}

void causal_conv1d_update(const TensorView& x, const TensorView& weight, const TensorView& bias,
                          const TensorView& conv_state, const TensorView& state_indices,
                          const TensorView& num_accepted_tokens, const TensorView& out,
                          const CausalConv1dOptions& options, Stream stream) {
  run(prepare_update(x, weight, bias, conv_state, state_indices, num_accepted_tokens, out, options),
      options, stream);
}

Plan plan_causal_conv1d_update(const TensorView& x, const TensorView& weight,
                               const TensorView& bias, const TensorView& conv_state,
                               const TensorView& state_indices,
                               const TensorView& num_accepted_tokens, const TensorView& out,
                               const CausalConv1dOptions& options, const DeviceLimits& device) {
  return make_plan(
      prepare_update(x, weight, bias, conv_state, state_indices, num_accepted_tokens, out, options)
          .problem,
      device);
}

void causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                 const TensorView& bias, const TensorView& conv_state,
                                 const TensorView& query_start_loc, const TensorView& state_indices,
                                 const TensorView& num_accepted_tokens, const TensorView& out,
                                 const CausalConv1dOptions& options, Stream stream) {
  run(prepare_update_varlen(x, weight, bias, conv_state, query_start_loc, state_indices,
                            num_accepted_tokens, out, options),
      options, stream);
}

Plan plan_causal_conv1d_update_varlen(const TensorView& x, const TensorView& weight,
                                      const TensorView& bias, const TensorView& conv_state,
                                      const TensorView& query_start_loc,
                                      const TensorView& state_indices,
                                      const TensorView& num_accepted_tokens, const TensorView& out,
                                      const CausalConv1dOptions& options,
                                      const DeviceLimits& device) {
  return make_plan(prepare_update_varlen(x, weight, bias, conv_state, query_start_loc,
                                         state_indices, num_accepted_tokens, out, options)
                       .problem,
                   device);
}

}  // namespace kjit
