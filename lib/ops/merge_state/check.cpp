// SPDX-License-Identifier: Apache-2.0
// merge_state: argument checks of the three entry points -> Problem (the plan memo's key).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>

#include "kjit/error.hpp"
#include "ops/merge_state/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit::ops::merge {
namespace {

constexpr std::int64_t kMinHeadDim = 8;
constexpr std::int64_t kMaxHeadDim = 1024;

/// A v-like tensor after layout normalization: strides in elements.
struct VDesc {
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t state_stride = 0;
  /// Largest power of two <= 16 dividing the address and every stride (in bytes) that matters.
  std::int64_t align = 16;
};

ArgChecks checks(Entry op) { return ArgChecks(op_name(op)); }

[[noreturn]] void fail(Entry op, const std::string& message) { checks(op).fail(message); }

/// Checks a v tensor whose last dimension is the head dim; `dims` maps (token, head, state) to
/// view dimensions (-1: absent). Returns its strides and alignment.
VDesc describe_v(Entry op, const char* name, const TensorView& view, int token_dim,
                 int head_dim_dim, int state_dim, bool output) {
  const ArgChecks c = checks(op);
  c.not_null(name, view);
  c.unit_last_stride(name, view, "the head dim must be contiguous");
  c.element_aligned(name, view);
  const std::int64_t esize = static_cast<std::int64_t>(size_of(view.dtype));
  VDesc desc;
  desc.align = align_of_bytes(reinterpret_cast<std::uintptr_t>(view.data));
  auto use = [&](int dim, std::int64_t* stride) {
    if (dim < 0) return;
    *stride = view.strides[dim];
    // A dimension of extent 1 is never stepped over: its stride cannot misalign anything.
    if (view.shape[dim] > 1) {
      desc.align = std::min(desc.align, align_of_bytes(magnitude(view.strides[dim]) *
                                                       static_cast<std::uint64_t>(esize)));
      if (output && view.strides[dim] == 0) {
        fail(op, fmt::format("{} {} has stride 0 in dimension {} of extent {}; outputs must not "
                             "overlap",
                             name, view.str(), dim, view.shape[dim]));
      }
    }
  };
  use(token_dim, &desc.token_stride);
  use(head_dim_dim, &desc.head_stride);
  use(state_dim, &desc.state_stride);
  return desc;
}

/// Checks an LSE tensor: f32, element-aligned, the shape of `layout`.
void check_lse(Entry op, const char* name, const TensorView& view, LseLayout layout,
               std::int64_t tokens, std::int64_t heads, std::int64_t states, bool many) {
  const ArgChecks c = checks(op);
  c.dtype_in(name, view, {DType::f32});
  c.memory(name, view);
  if (!many) {
    if (layout == LseLayout::token_major) {
      c.shape(name, view, {tokens, heads}, "[T, H] (lse_layout token_major)");
    } else {
      c.shape(name, view, {heads, tokens}, "[H, T] (lse_layout head_major)");
    }
  } else if (layout == LseLayout::token_major) {
    c.shape(name, view, {tokens, states, heads}, "[T, S, H] (lse_layout token_major)");
  } else {
    c.shape(name, view, {heads, tokens, states}, "[H, T, S] (lse_layout head_major)");
  }
}

void check_common_options(Entry op, const MergeStateOptions& options, Problem* problem) {
  if (!options.lse_base) {
    fail(op,
         "options.lse_base is unset; accepted: LseBase::two (FlashInfer) or LseBase::e "
         "(FlashAttention, SGLang, vLLM). There is no default because both are in wide use and "
         "merging with the wrong base is silently wrong: it must be the base of the kernel "
         "that produced the LSE");
  }
  problem->base = *options.lse_base;
  problem->pos_inf_as_empty = options.pos_inf_as_empty;
  problem->forced_mode = ForcedMode::planner;
  problem->forced_chunks = 0;
  problem->forced_block_log2 = 0;
  if (!options.force_mode.empty()) {
    // "<mode>[:c<chunks>][:t<threads>]": the suffixes force the geometry too (A/B runs).
    const std::string& text = options.force_mode;
    const std::size_t colon = text.find(':');
    const std::string mode = text.substr(0, colon);
    for (int i = 0; i < static_cast<int>(std::size(kMergeStateModes)); ++i) {
      if (mode == kMergeStateModes[i]) problem->forced_mode = static_cast<ForcedMode>(i + 1);
    }
    bool bad = problem->forced_mode == ForcedMode::planner;
    for (std::size_t at = colon; !bad && at != std::string::npos;) {
      const std::size_t next = text.find(':', at + 1);
      const std::string part =
          text.substr(at + 1, next == std::string::npos ? next : next - at - 1);
      at = next;
      const bool digits = part.size() >= 2 && part.size() <= 4 &&
                          part.find_first_not_of("0123456789", 1) == std::string::npos;
      const int value = digits ? std::stoi(part.substr(1)) : 0;
      if (digits && part[0] == 'c' && (value == 1 || value == 2 || value == 4)) {
        problem->forced_chunks = static_cast<std::uint8_t>(value);
      } else if (digits && part[0] == 't' && value >= 32 && value <= 512 &&
                 (value & (value - 1)) == 0) {
        problem->forced_block_log2 =
            static_cast<std::uint8_t>(std::countr_zero(static_cast<unsigned>(value)));
      } else {
        bad = true;
      }
    }
    if (bad) {
      fail(op, fmt::format("options.force_mode = '{}' is not a mode; accepted: '' (planner "
                           "picks), 'token_major', 'flat', each optionally followed by ':c<n>' "
                           "(vectors per thread: 1, 2, 4) and ':t<n>' (threads per block: a "
                           "power of 2 in 32..512)",
                           options.force_mode));
    }
  }
}

void check_dtypes_and_dims(Entry op, const char* name_in, const TensorView& v_in,
                           const char* name_out, const TensorView& v_out, std::int64_t head_dim,
                           Problem* problem) {
  checks(op).float_dtype(name_in, v_in);
  if (v_out.dtype != v_in.dtype && v_out.dtype != DType::f32) {
    fail(op, fmt::format("{} has dtype {}; accepted: {} (the input dtype) or f32", name_out,
                         to_string(v_out.dtype), to_string(v_in.dtype)));
  }
  if (head_dim < kMinHeadDim || head_dim > kMaxHeadDim || head_dim % 8 != 0) {
    fail(op, fmt::format("head_dim (last dimension of {}) is {}; accepted: a multiple of 8 in "
                         "{}..{}",
                         name_in, head_dim, kMinHeadDim, kMaxHeadDim));
  }
  problem->in = v_in.dtype;
  problem->out = v_out.dtype;
  problem->head_dim = head_dim;
}

Problem check_pair(Entry op, const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                   const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                   const TensorView* mask, const MergeStateOptions& options) {
  Problem problem;
  problem.entry = op;
  check_common_options(op, options, &problem);
  const char* a_name = op == Entry::in_place ? "v" : "v_a";
  const char* b_name = op == Entry::in_place ? "v_other" : "v_b";
  const char* sa_name = op == Entry::in_place ? "s" : "s_a";
  const char* sb_name = op == Entry::in_place ? "s_other" : "s_b";
  checks(op).rank(a_name, v_a, 3, "[T, H, D]");
  const std::int64_t tokens = v_a.shape[0];
  const std::int64_t heads = v_a.shape[1];
  const std::int64_t head_dim = v_a.shape[2];
  if (tokens < 0 || heads < 0) fail(op, fmt::format("{} has a negative extent", a_name));
  check_dtypes_and_dims(op, a_name, v_a, op == Entry::in_place ? a_name : "v_out", v_out, head_dim,
                        &problem);
  const ArgChecks c = checks(op);
  c.dtype_in(b_name, v_b, {v_a.dtype});
  // A literal, not a formatted string: this runs on every call.
  c.shape(b_name, v_b, {tokens, heads, head_dim},
          op == Entry::in_place ? "the shape of v" : "the shape of v_a");
  if (op == Entry::pair) c.shape("v_out", v_out, {tokens, heads, head_dim}, "the shape of v_a");
  problem.tokens = tokens;
  problem.heads = heads;
  problem.states = 2;

  const VDesc a = describe_v(op, a_name, v_a, 0, 1, -1, op == Entry::in_place);
  const VDesc b = describe_v(op, b_name, v_b, 0, 1, -1, false);
  const VDesc o = op == Entry::in_place ? a : describe_v(op, "v_out", v_out, 0, 1, -1, true);
  problem.in_align = std::min(a.align, b.align);
  problem.out_align = o.align;

  check_lse(op, sa_name, s_a, options.lse_layout, tokens, heads, 0, false);
  check_lse(op, sb_name, s_b, options.lse_layout, tokens, heads, 0, false);
  if (op == Entry::pair && s_out.data != nullptr) {
    check_lse(op, "s_out", s_out, options.lse_layout, tokens, heads, 0, false);
  }

  if (mask != nullptr && mask->data != nullptr) {
    c.dtype_in("mask", *mask, {DType::u8});
    if (mask->rank != 1 || mask->shape[0] != tokens) {
      fail(op, fmt::format("mask has shape {}; expected [T] = [{}] (u8, one flag per token)",
                           shape_text(*mask), tokens));
    }
  }
  return problem;
}

Problem check_many(const TensorView& v, const TensorView& s, const TensorView& v_out,
                   const TensorView& s_out, const MergeStateOptions& options) {
  const Entry op = Entry::many;
  Problem problem;
  problem.entry = op;
  check_common_options(op, options, &problem);
  checks(op).rank("v", v, 4, "[T, S, H, D]");
  const std::int64_t tokens = v.shape[0];
  const std::int64_t states = v.shape[1];
  const std::int64_t heads = v.shape[2];
  const std::int64_t head_dim = v.shape[3];
  if (tokens < 0 || heads < 0 || states < 0) fail(op, "v has a negative extent");
  check_dtypes_and_dims(op, "v", v, "v_out", v_out, head_dim, &problem);
  checks(op).shape("v_out", v_out, {tokens, heads, head_dim}, "[T, H, D] of v");
  if (states > 0xFFFFFFFFll) fail(op, fmt::format("v has {} states; at most 2^32-1", states));
  problem.tokens = tokens;
  problem.heads = heads;
  problem.states = states;
  const VDesc a = describe_v(op, "v", v, 0, 2, 1, false);
  const VDesc o = describe_v(op, "v_out", v_out, 0, 1, -1, true);
  problem.in_align = a.align;
  problem.out_align = o.align;
  check_lse(op, "s", s, options.lse_layout, tokens, heads, states, true);
  if (s_out.data != nullptr) {
    check_lse(op, "s_out", s_out, options.lse_layout, tokens, heads, 0, false);
  }
  return problem;
}

}  // namespace

Problem Family::check(const Args& args) {
  if (args.entry == Entry::many) {
    return check_many(*args.v_a, *args.s_a, *args.v_out, *args.s_out, *args.options);
  }
  return check_pair(args.entry, *args.v_a, *args.s_a, *args.v_b, *args.s_b, *args.v_out,
                    *args.s_out, args.mask, *args.options);
}

}  // namespace kjit::ops::merge
