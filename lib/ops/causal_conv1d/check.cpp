// SPDX-License-Identifier: Apache-2.0
// causal_conv1d: argument checks of the three entry points (prefill, update, varlen update) ->
// Problem (the plan memo's key).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

#include "kjit/error.hpp"
#include "ops/causal_conv1d/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit::ops::conv1d {
namespace {

constexpr std::int64_t kMaxDim = std::int64_t{1} << 20;
constexpr std::int64_t kMaxSeqs = std::int64_t{1} << 24;
/// Tokens (T, or B * S) stay below 2^31: the bound, and what the i32 cu_seqlens of
/// every serving engine can address.
constexpr std::int64_t kMaxTokens = (std::int64_t{1} << 31) - 1;

/// Rank `rank` and no negative extent.
void require_rank(Op op, const char* name, const TensorView& v, int rank, const char* what) {
  checks(op).rank(name, v, rank, what);
  checks(op).extents(name, v);
}

/// The widest channel vector x and out allow: channel stride 1 and every address and row /
/// token stride a multiple of the vector's bytes. Also keeps what the plan says about it.
void choose_max_vec(Problem* p, const TensorView& x, const TensorView& out, int channel_dim) {
  p->x_channel_stride = x.strides[channel_dim];
  p->out_channel_stride = out.strides[channel_dim];
  if (x.strides[channel_dim] != 1 || out.strides[channel_dim] != 1) {
    p->max_vec = 1;
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
  p->vec_align = align;
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
  const int blocks = options.force_min_blocks;
  if (blocks != 0 && blocks != 2 && blocks != 3 && blocks != 4 && blocks != 5 && blocks != 6 &&
      blocks != 8) {
    fail(op, fmt::format("options.force_min_blocks = {}; accepted: 0 (the template's rule), 2, "
                         "3, 4, 5, 6, 8",
                         blocks));
  }
  p->force_min_blocks = blocks;
  const int stages = options.force_stages;
  if (stages != 0 && stages != 1 && stages != 2 && stages != 3 && stages != 4 && stages != 6) {
    fail(op, fmt::format("options.force_stages = {}; accepted: 0 (the planner's choice), 1 "
                         "(register double buffer), 2, 3, 4, 6",
                         stages));
  }
  p->force_stages = stages;
}

/// weight [D, W], bias [D] or none, conv_state [slots, D, L].
void check_weights_and_pool(Op op, const TensorView& x, const TensorView& weight,
                            const TensorView& bias, const TensorView& state, Problem* problem) {
  Problem& p = *problem;
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
  checks(op).memory("weight", weight);
  p.weight = weight.dtype;
  if (bias.data != nullptr) {
    require_rank(op, "bias", bias, 1, "[D]");
    if (bias.shape[0] != p.dim) {
      fail(op, fmt::format("bias has shape {}; expected [D] = [{}]", shape_text(bias), p.dim));
    }
    checks(op).dtype_of("bias", bias, weight.dtype, "weight's dtype");
    checks(op).memory("bias", bias);
  }
  require_rank(op, "conv_state", state, 3, "[slots, D, L] with L >= W - 1");
  checks(op).float_dtype("conv_state", state);
  if (state.shape[1] != p.dim || state.shape[2] < p.width - 1) {
    fail(op, fmt::format("conv_state has shape {}; expected [slots, D, L] with D = {} and L >= "
                         "W - 1 = {}",
                         shape_text(state), p.dim, p.width - 1));
  }
  checks(op).memory("conv_state", state);
  checks(op).no_broadcast("conv_state", state);
  p.state = state.dtype;
  p.state_len = state.shape[2];
  const auto ss = static_cast<std::uint64_t>(size_of(state.dtype));
  const auto stride_bytes = [&](int dim) {
    const std::int64_t st = state.strides[dim];
    return state.shape[dim] > 1 ? static_cast<std::uint64_t>(st < 0 ? -st : st) * ss : 0;
  };
  std::int64_t align = align_of(reinterpret_cast<std::uintptr_t>(state.data));
  align = std::min(align, align_of(stride_bytes(0)));
  if (state.strides[2] == 1 && state.strides[1] == p.width - 1 && p.state_len == p.width - 1) {
    p.state_layout = PoolLayout::block;
  } else if (state.strides[1] == 1 || state.shape[1] == 1) {
    p.state_layout = PoolLayout::channels;
    align = std::min(align, align_of(stride_bytes(2)));
  }
  p.state_align = align;
}

/// num_accepted_tokens [B] (i32, i64) or data == nullptr; B = p.seqs.
void check_accepted(Op op, const TensorView& accepted, const Problem& p) {
  if (accepted.data == nullptr) return;
  const std::int64_t rows = p.seqs;
  require_rank(op, "num_accepted_tokens", accepted, 1, "[B]");
  checks(op).index_dtype("num_accepted_tokens", accepted);
  checks(op).memory("num_accepted_tokens", accepted);
  if (accepted.shape[0] != rows) {
    fail(op, fmt::format("num_accepted_tokens has shape {}; expected [B] = [{}]",
                         shape_text(accepted), rows));
  }
}

void check_dim(Op op, const TensorView& x, std::int64_t dim) {
  if (dim < 8 || dim > kMaxDim || dim % 8 != 0) {
    fail(op, fmt::format("x {} has D = {} channels; accepted: a multiple of 8 in 8..2^20 ({})",
                         x.str(), dim, kMaxDim));
  }
}

void check_out(Op op, const TensorView& x, const TensorView& out, Problem* p) {
  checks(op).float_dtype("out", out);
  checks(op).memory("out", out);
  checks(op).no_broadcast("out", out);
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

/// x [T, D] (tokens of every sequence or row back to back) and what is checked against it:
/// weights, bias, pool and out. Shared by the prefill and the varlen update.
void check_token_rows(Op op, const TensorView& x, const char* x_shape, const TensorView& weight,
                      const TensorView& bias, const TensorView& state, const TensorView& out,
                      Problem* problem) {
  Problem& p = *problem;
  require_rank(op, "x", x, 2, x_shape);
  checks(op).float_dtype("x", x);
  checks(op).memory("x", x);
  p.in = x.dtype;
  p.tokens = x.shape[0];
  p.dim = x.shape[1];
  check_dim(op, x, p.dim);
  if (p.tokens > kMaxTokens) {
    fail(op, fmt::format("x has T = {} tokens; accepted: at most 2^31 - 1", p.tokens));
  }
  check_weights_and_pool(op, x, weight, bias, state, &p);
  check_out(op, x, out, &p);
  p.out = out.dtype;
}

Problem check_prefill(const Args& args) {
  const Op op = Op::prefill;
  const TensorView& x = *args.x;
  const TensorView& out = *args.out;
  const TensorView& cu_seqlens = *args.cu_seqlens;
  const TensorView& indices = *args.state_indices;
  const TensorView& has_initial = *args.has_initial_state;
  Problem p;
  p.op = op;
  check_options(op, *args.options, &p);
  check_token_rows(op, x, "[T, D]", *args.weight, *args.bias, *args.conv_state, out, &p);
  require_rank(op, "cu_seqlens", cu_seqlens, 1, "[N + 1]");
  checks(op).index_dtype("cu_seqlens", cu_seqlens);
  checks(op).memory("cu_seqlens", cu_seqlens);
  if (cu_seqlens.shape[0] < 1) {
    fail(op, "cu_seqlens has shape [0]; expected [N + 1] (at least the leading 0)");
  }
  p.seqs = cu_seqlens.shape[0] - 1;
  checks(op).tokens_in_groups("cu_seqlens", "N", "sequences", p.seqs, "x", p.tokens);
  if (p.seqs > kMaxSeqs) {
    fail(op, fmt::format("cu_seqlens describes N = {} sequences; accepted: at most 2^24", p.seqs));
  }
  require_rank(op, "state_indices", indices, 1, "[N]");
  checks(op).index_dtype("state_indices", indices);
  checks(op).memory("state_indices", indices);
  if (indices.shape[0] != p.seqs) {
    fail(op, fmt::format("state_indices has shape {}; expected [N] = [{}] (cu_seqlens has N + 1 "
                         "entries)",
                         shape_text(indices), p.seqs));
  }
  if (has_initial.data != nullptr) {
    require_rank(op, "has_initial_state", has_initial, 1, "[N]");
    checks(op).dtype_of("has_initial_state", has_initial, DType::u8, "bool");
    if (has_initial.shape[0] != p.seqs) {
      fail(op, fmt::format("has_initial_state has shape {}; expected [N] = [{}]",
                           shape_text(has_initial), p.seqs));
    }
  }
  choose_max_vec(&p, x, out, 1);
  return p;
}

Problem check_update(const Args& args) {
  const Op op = Op::update;
  const TensorView& x_in = *args.x;
  const TensorView& out_in = *args.out;
  const TensorView& indices = *args.state_indices;
  Problem p;
  p.op = op;
  check_options(op, *args.options, &p);
  if (x_in.rank != 2 && x_in.rank != 3) {
    fail(op, fmt::format("x has rank {} ({}); expected [B, S, D], or [B, D] for S = 1", x_in.rank,
                         x_in.str()));
  }
  if (out_in.rank != x_in.rank) {
    fail(op, fmt::format("out has shape {}; expected x's shape {}", shape_text(out_in),
                         shape_text(x_in)));
  }
  const TensorView x = as_rows(x_in), out = as_rows(out_in);
  require_rank(op, "x", x, 3, "[B, S, D]");
  checks(op).float_dtype("x", x);
  checks(op).memory("x", x);
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
  check_weights_and_pool(op, x, *args.weight, *args.bias, *args.conv_state, &p);
  check_out(op, x_in, out_in, &p);
  p.out = out.dtype;
  require_rank(op, "state_indices", indices, 1, "[B]");
  checks(op).index_dtype("state_indices", indices);
  checks(op).memory("state_indices", indices);
  if (indices.shape[0] != p.seqs) {
    fail(op, fmt::format("state_indices has shape {}; expected [B] = [{}]", shape_text(indices),
                         p.seqs));
  }
  check_accepted(op, *args.num_accepted_tokens, p);
  choose_max_vec(&p, x, out, 2);
  return p;
}

/// The varlen update: x and out [T, D], row b = tokens query_start_loc[b]..[b + 1] - 1.
Problem check_update_varlen(const Args& args) {
  const Op op = Op::update;
  const TensorView& x = *args.x;
  const TensorView& out = *args.out;
  const TensorView& query_start_loc = *args.query_start_loc;
  const TensorView& indices = *args.state_indices;
  Problem p;
  p.op = op;
  p.varlen = true;
  check_options(op, *args.options, &p);
  check_token_rows(op, x, "[T, D]: the tokens of all rows, delimited by query_start_loc",
                   *args.weight, *args.bias, *args.conv_state, out, &p);
  require_rank(op, "state_indices", indices, 1, "[B]");
  checks(op).index_dtype("state_indices", indices);
  checks(op).memory("state_indices", indices);
  p.seqs = indices.shape[0];
  if (p.seqs > kMaxTokens) {
    fail(op, fmt::format("state_indices has B = {} rows; accepted: at most 2^31 - 1", p.seqs));
  }
  require_rank(op, "query_start_loc", query_start_loc, 1, "[B + 1]");
  checks(op).index_dtype("query_start_loc", query_start_loc);
  checks(op).memory("query_start_loc", query_start_loc);
  if (query_start_loc.shape[0] != p.seqs + 1) {
    fail(op, fmt::format("query_start_loc has shape {}; expected [B + 1] = [{}] (state_indices "
                         "has B = {} rows)",
                         shape_text(query_start_loc), p.seqs + 1, p.seqs));
  }
  check_accepted(op, *args.num_accepted_tokens, p);
  choose_max_vec(&p, x, out, 1);
  return p;
}

}  // namespace

Problem Family::check(const Args& args) {
  if (args.op == Op::prefill) return check_prefill(args);
  return args.varlen ? check_update_varlen(args) : check_update(args);
}

}  // namespace kjit::ops::conv1d
