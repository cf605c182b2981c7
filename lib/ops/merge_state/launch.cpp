// SPDX-License-Identifier: Apache-2.0
// merge_state: the kernel parameters of a checked call, and the public entry points, which run
// on the op skeleton (ops/op.hpp).
#include <cstdint>

#include "kjit/ops/merge_state.hpp"
#include "ops/merge_state/family.hpp"

namespace kjit {
namespace ops::merge {
namespace {

/// (token, head, state) strides of an LSE tensor in `layout`; check_lse() proved its shape.
struct LseStrides {
  std::int64_t token = 0;
  std::int64_t head = 0;
  std::int64_t state = 0;
};

LseStrides lse_strides(const TensorView& s, LseLayout layout, bool many) {
  if (!many) {
    return layout == LseLayout::token_major ? LseStrides{s.strides[0], s.strides[1], 0}
                                            : LseStrides{s.strides[1], s.strides[0], 0};
  }
  return layout == LseLayout::token_major ? LseStrides{s.strides[0], s.strides[2], s.strides[1]}
                                          : LseStrides{s.strides[1], s.strides[0], s.strides[2]};
}

}  // namespace

MergeStateParams Family::params(const Args& args, const Problem& problem, const Choice&, void*) {
  const LseLayout layout = args.options->lse_layout;
  const TensorView& v_a = *args.v_a;
  const TensorView& s_a = *args.s_a;
  MergeStateParams p{};
  const LseStrides sa = lse_strides(s_a, layout, problem.entry == Entry::many);
  p.v_a = v_a.data;
  p.s_a = static_cast<const float*>(s_a.data);
  p.v_a_token_stride = v_a.strides[0];
  p.s_a_token_stride = sa.token;
  p.s_a_head_stride = sa.head;
  if (problem.entry == Entry::many) {
    // v [T, S, H, D], s per layout; v_out [T, H, D], s_out [T, H] / [H, T] or absent.
    p.v_b = v_a.data;
    p.s_b = p.s_a;
    p.v_a_head_stride = v_a.strides[2];
    p.v_state_stride = v_a.strides[1];
    p.s_state_stride = sa.state;
    p.num_states = static_cast<u32>(problem.states);
  } else {
    const TensorView& v_b = *args.v_b;
    const LseStrides sb = lse_strides(*args.s_b, layout, false);
    p.v_a_head_stride = v_a.strides[1];
    p.v_b = v_b.data;
    p.s_b = static_cast<const float*>(args.s_b->data);
    p.v_b_token_stride = v_b.strides[0];
    p.v_b_head_stride = v_b.strides[1];
    p.s_b_token_stride = sb.token;
    p.s_b_head_stride = sb.head;
  }
  // In place: the output is v_a / s_a itself (s_a always written).
  const bool in_place = problem.entry == Entry::in_place;
  const TensorView& v_out = in_place ? v_a : *args.v_out;
  const TensorView* s_out = in_place ? &s_a : (args.s_out->data != nullptr ? args.s_out : nullptr);
  p.v_out = v_out.data;
  p.v_out_token_stride = v_out.strides[0];
  p.v_out_head_stride = v_out.strides[1];
  if (s_out != nullptr) {
    const LseStrides so = lse_strides(*s_out, layout, false);
    p.s_out = static_cast<float*>(s_out->data);
    p.s_out_token_stride = so.token;
    p.s_out_head_stride = so.head;
  }
  if (in_place && args.mask != nullptr && args.mask->data != nullptr) {
    p.mask = static_cast<const unsigned char*>(args.mask->data);
    p.mask_stride = args.mask->strides[0];
  }
  p.num_tokens = problem.tokens;
  p.num_heads = static_cast<u32>(problem.heads);
  p.num_rows = static_cast<u64>(problem.tokens) * static_cast<u64>(problem.heads);
  const MergeDivMagic magic = merge_div_magic(static_cast<u32>(problem.heads));
  p.head_div_magic = magic.magic;
  p.head_div_shift = magic.shift;
  return p;
}

}  // namespace ops::merge

namespace {

using ops::merge::Args;
using ops::merge::Entry;
using ops::merge::Family;

void call(const Args& args, Stream stream) {
  const MergeStateOptions& options = *args.options;
  ops::run<Family>(args, Family::check(args), {options.device, options.runtime}, stream);
}

Plan plan_of(const Args& args, const DeviceLimits& limits) {
  return Family::plan(Family::check(args), limits).plan;
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 const MergeStateOptions& options, Stream stream) {
  call({Entry::pair, &v_a, &s_a, &v_b, &s_b, &v_out, &s_out, nullptr, &options}, stream);
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask,
                          const MergeStateOptions& options, Stream stream) {
  call({Entry::in_place, &v, &s, &v_other, &s_other, &v, &s, &mask, &options}, stream);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, const MergeStateOptions& options, Stream stream) {
  call({Entry::many, &v, &s, nullptr, nullptr, &v_out, &s_out, nullptr, &options}, stream);
}

Plan plan_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                      const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                      const MergeStateOptions& options, const DeviceLimits& limits) {
  return plan_of({Entry::pair, &v_a, &s_a, &v_b, &s_b, &v_out, &s_out, nullptr, &options}, limits);
}

Plan plan_merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                               const TensorView& s_other, const TensorView& mask,
                               const MergeStateOptions& options, const DeviceLimits& limits) {
  return plan_of({Entry::in_place, &v, &s, &v_other, &s_other, &v, &s, &mask, &options}, limits);
}

Plan plan_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                       const TensorView& s_out, const MergeStateOptions& options,
                       const DeviceLimits& limits) {
  return plan_of({Entry::many, &v, &s, nullptr, nullptr, &v_out, &s_out, nullptr, &options},
                 limits);
}

}  // namespace kjit
