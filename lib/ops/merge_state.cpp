// SPDX-License-Identifier: Apache-2.0
// merge_state: argument checks, choice of vector width / grid mode, plans and launches.
#include "kjit/ops/merge_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/merge_state_params.h"
#include "kjit/runtime.hpp"
#include "kjit/spec.hpp"

namespace kjit {
namespace {

constexpr std::int64_t kMinHeadDim = 8;
constexpr std::int64_t kMaxHeadDim = 1024;
/// Threads of one block; matches kMergeMaxBlockThreads of the template (its launch bounds).
constexpr std::int64_t kMaxBlockThreads = 512;
/// Target threads of a flat block.
constexpr std::int64_t kFlatBlockThreads = 256;
/// Bytes of each input row one thread moves at most (2 x 16-byte vectors per input).
constexpr std::int64_t kMaxBytesPerThread = 32;
/// Smallest token_major block worth keeping: below it blocks are too small to fill an SM
/// within the 32-blocks-per-SM limit, and the flat mode packs rows densely instead.
constexpr std::int64_t kMinTokenMajorThreads = 128;

enum class Op { pair, in_place, many };

const char* op_name(Op op) {
  switch (op) {
    case Op::pair:
      return "merge_state";
    case Op::in_place:
      return "merge_state_in_place";
    case Op::many:
      return "merge_states";
  }
  return "merge_state";
}

const char* op_choice(Op op) {
  switch (op) {
    case Op::pair:
      return "pair";
    case Op::in_place:
      return "in_place";
    case Op::many:
      return "many";
  }
  return "pair";
}

/// A v-like tensor after layout normalization: strides in elements.
struct VDesc {
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t state_stride = 0;
  /// Largest power of two <= 16 dividing the address and every stride (in bytes) that matters.
  std::int64_t align = 16;
};

/// Everything a plan depends on: no pointer values, only their alignment.
struct Problem {
  Op op = Op::pair;
  DType in = DType::bf16;
  DType out = DType::bf16;
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t states = 0;
  /// min over the inputs / outputs of their alignment in bytes.
  std::int64_t in_align = 16;
  std::int64_t out_align = 16;
  LseBase base = LseBase::two;
  bool pos_inf_as_empty = true;
  /// -1: the planner picks; else an index into kMergeStateModes.
  int forced_mode = -1;
};

std::string shape_text(const TensorView& view) {
  std::string out = "[";
  for (int i = 0; i < view.rank; ++i) out += fmt::format("{}{}", i ? ", " : "", view.shape[i]);
  return out + "]";
}

std::int64_t align_of_bytes(std::uint64_t value) {
  if (value == 0) return 16;
  return std::min<std::int64_t>(16, std::int64_t{1} << std::countr_zero(value));
}

std::uint64_t magnitude(std::int64_t value) {
  return value < 0 ? static_cast<std::uint64_t>(-(value + 1)) + 1
                   : static_cast<std::uint64_t>(value);
}

[[noreturn]] void fail(Op op, const std::string& message) {
  throw InvalidArgument(fmt::format("{}: {}", op_name(op), message));
}

void require_dtype(Op op, const char* name, const TensorView& view, DType dtype) {
  if (view.dtype != dtype) {
    fail(op, fmt::format("{} has dtype {}; accepted: {}", name, to_string(view.dtype),
                         to_string(dtype)));
  }
}

void require_element_aligned(Op op, const char* name, const TensorView& view) {
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  const std::size_t esize = size_of(view.dtype);
  if (address % esize != 0) {
    fail(op, fmt::format("{} data pointer {:#x} is not aligned to its element size ({} bytes "
                         "for {}); accepted: a multiple of {}",
                         name, address, esize, to_string(view.dtype), esize));
  }
}

void require_shape(Op op, const char* name, const TensorView& view,
                   std::initializer_list<std::int64_t> expected, const char* what) {
  bool same = view.rank == static_cast<int>(expected.size());
  if (same) {
    int i = 0;
    for (std::int64_t e : expected) same = same && view.shape[i++] == e;
  }
  if (!same) {
    std::string want = "[";
    int i = 0;
    for (std::int64_t e : expected) want += fmt::format("{}{}", i++ ? ", " : "", e);
    fail(op, fmt::format("{} has shape {}; expected {} = {}", name, shape_text(view), what,
                         want + "]"));
  }
}

/// Checks a v tensor whose last dimension is the head dim; `dims` maps (token, head, state) to
/// view dimensions (-1: absent). Returns its strides and alignment.
VDesc describe_v(Op op, const char* name, const TensorView& view, int token_dim, int head_dim_dim,
                 int state_dim, bool output) {
  // An empty tensor is never dereferenced, so it may come without memory.
  if (view.data == nullptr && view.numel() > 0) {
    fail(op, fmt::format("{} has a null data pointer", name));
  }
  const int last = view.rank - 1;
  if (view.strides[last] != 1) {
    fail(op, fmt::format("{} {} has last-dimension stride {}; accepted: 1 (the head dim must be "
                         "contiguous)",
                         name, view.str(), view.strides[last]));
  }
  require_element_aligned(op, name, view);
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

/// An LSE tensor: f32, 4-byte aligned. Returns (token stride, head stride, state stride).
struct SDesc {
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  std::int64_t state_stride = 0;
};

SDesc describe_s(Op op, const char* name, const TensorView& view, LseLayout layout,
                 std::int64_t tokens, std::int64_t heads, std::int64_t states, bool many) {
  require_dtype(op, name, view, DType::f32);
  if (view.data == nullptr && view.numel() > 0) {
    fail(op, fmt::format("{} has a null data pointer", name));
  }
  require_element_aligned(op, name, view);
  SDesc desc;
  if (!many) {
    if (layout == LseLayout::token_major) {
      require_shape(op, name, view, {tokens, heads}, "[T, H] (lse_layout token_major)");
      desc.token_stride = view.strides[0];
      desc.head_stride = view.strides[1];
    } else {
      require_shape(op, name, view, {heads, tokens}, "[H, T] (lse_layout head_major)");
      desc.head_stride = view.strides[0];
      desc.token_stride = view.strides[1];
    }
  } else if (layout == LseLayout::token_major) {
    require_shape(op, name, view, {tokens, states, heads}, "[T, S, H] (lse_layout token_major)");
    desc.token_stride = view.strides[0];
    desc.state_stride = view.strides[1];
    desc.head_stride = view.strides[2];
  } else {
    require_shape(op, name, view, {heads, tokens, states}, "[H, T, S] (lse_layout head_major)");
    desc.head_stride = view.strides[0];
    desc.token_stride = view.strides[1];
    desc.state_stride = view.strides[2];
  }
  return desc;
}

void check_common_options(Op op, const MergeStateOptions& options, Problem* problem) {
  if (!options.lse_base) {
    fail(op,
         "options.lse_base is unset; accepted: LseBase::two (FlashInfer) or LseBase::e "
         "(FlashAttention, SGLang, vLLM). There is no default because both are in wide use and "
         "merging with the wrong base is silently wrong: it must be the base of the kernel "
         "that produced the LSE");
  }
  problem->base = *options.lse_base;
  problem->pos_inf_as_empty = options.pos_inf_as_empty;
  problem->forced_mode = -1;
  if (!options.force_mode.empty()) {
    for (int i = 0; i < static_cast<int>(std::size(kMergeStateModes)); ++i) {
      if (options.force_mode == kMergeStateModes[i]) problem->forced_mode = i;
    }
    if (problem->forced_mode < 0) {
      fail(op, fmt::format("options.force_mode = '{}' is not a mode; accepted: '' (planner "
                           "picks), 'token_major', 'flat'",
                           options.force_mode));
    }
  }
}

void check_v_dims(Op op, const char* name, const TensorView& view, int rank, const char* layout) {
  if (view.rank != rank) {
    fail(op, fmt::format("{} has rank {} ({}); expected rank {}: {}", name, view.rank, view.str(),
                         rank, layout));
  }
}

void check_dtypes_and_dims(Op op, const char* name_in, const TensorView& v_in, const char* name_out,
                           const TensorView& v_out, std::int64_t head_dim, Problem* problem) {
  if (v_in.dtype != DType::f16 && v_in.dtype != DType::bf16 && v_in.dtype != DType::f32) {
    fail(op,
         fmt::format("{} has dtype {}; accepted: f16, bf16, f32", name_in, to_string(v_in.dtype)));
  }
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

/// The validated problem plus the kernel parameters (pointer values filled in).
struct Prepared {
  Problem problem;
  MergeStateParams params{};
};

Prepared prepare_pair(Op op, const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                      const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                      const TensorView* mask, const MergeStateOptions& options) {
  Prepared prep;
  Problem& problem = prep.problem;
  problem.op = op;
  check_common_options(op, options, &problem);
  const char* a_name = op == Op::in_place ? "v" : "v_a";
  const char* b_name = op == Op::in_place ? "v_other" : "v_b";
  const char* sa_name = op == Op::in_place ? "s" : "s_a";
  const char* sb_name = op == Op::in_place ? "s_other" : "s_b";
  check_v_dims(op, a_name, v_a, 3, "[T, H, D]");
  const std::int64_t tokens = v_a.shape[0];
  const std::int64_t heads = v_a.shape[1];
  const std::int64_t head_dim = v_a.shape[2];
  if (tokens < 0 || heads < 0) fail(op, fmt::format("{} has a negative extent", a_name));
  check_dtypes_and_dims(op, a_name, v_a, op == Op::in_place ? a_name : "v_out", v_out, head_dim,
                        &problem);
  require_dtype(op, b_name, v_b, v_a.dtype);
  // A literal, not a formatted string: this runs on every call.
  require_shape(op, b_name, v_b, {tokens, heads, head_dim},
                op == Op::in_place ? "the shape of v" : "the shape of v_a");
  if (op == Op::pair) {
    require_shape(op, "v_out", v_out, {tokens, heads, head_dim}, "the shape of v_a");
  }
  problem.tokens = tokens;
  problem.heads = heads;
  problem.states = 2;

  const VDesc a = describe_v(op, a_name, v_a, 0, 1, -1, op == Op::in_place);
  const VDesc b = describe_v(op, b_name, v_b, 0, 1, -1, false);
  const VDesc o = op == Op::in_place ? a : describe_v(op, "v_out", v_out, 0, 1, -1, true);
  problem.in_align = std::min(a.align, b.align);
  problem.out_align = o.align;

  const SDesc sa = describe_s(op, sa_name, s_a, options.lse_layout, tokens, heads, 0, false);
  const SDesc sb = describe_s(op, sb_name, s_b, options.lse_layout, tokens, heads, 0, false);
  SDesc so;
  const bool has_s_out = op == Op::in_place || s_out.data != nullptr;
  if (op == Op::pair && has_s_out) {
    so = describe_s(op, "s_out", s_out, options.lse_layout, tokens, heads, 0, false);
  } else if (op == Op::in_place) {
    so = sa;
  }

  MergeStateParams& p = prep.params;
  p.v_a = v_a.data;
  p.v_b = v_b.data;
  p.v_out = op == Op::in_place ? v_a.data : v_out.data;
  p.s_a = static_cast<const float*>(s_a.data);
  p.s_b = static_cast<const float*>(s_b.data);
  p.s_out = has_s_out ? static_cast<float*>(op == Op::in_place ? s_a.data : s_out.data) : nullptr;
  p.v_a_token_stride = a.token_stride;
  p.v_a_head_stride = a.head_stride;
  p.v_b_token_stride = b.token_stride;
  p.v_b_head_stride = b.head_stride;
  p.v_out_token_stride = o.token_stride;
  p.v_out_head_stride = o.head_stride;
  p.s_a_token_stride = sa.token_stride;
  p.s_a_head_stride = sa.head_stride;
  p.s_b_token_stride = sb.token_stride;
  p.s_b_head_stride = sb.head_stride;
  p.s_out_token_stride = so.token_stride;
  p.s_out_head_stride = so.head_stride;
  if (mask != nullptr && mask->data != nullptr) {
    require_dtype(op, "mask", *mask, DType::u8);
    if (mask->rank != 1 || mask->shape[0] != tokens) {
      fail(op, fmt::format("mask has shape {}; expected [T] = [{}] (u8, one flag per token)",
                           shape_text(*mask), tokens));
    }
    p.mask = static_cast<const unsigned char*>(mask->data);
    p.mask_stride = mask->strides[0];
  }
  return prep;
}

Prepared prepare_many(const TensorView& v, const TensorView& s, const TensorView& v_out,
                      const TensorView& s_out, const MergeStateOptions& options) {
  const Op op = Op::many;
  Prepared prep;
  Problem& problem = prep.problem;
  problem.op = op;
  check_common_options(op, options, &problem);
  check_v_dims(op, "v", v, 4, "[T, S, H, D]");
  const std::int64_t tokens = v.shape[0];
  const std::int64_t states = v.shape[1];
  const std::int64_t heads = v.shape[2];
  const std::int64_t head_dim = v.shape[3];
  if (tokens < 0 || heads < 0 || states < 0) fail(op, "v has a negative extent");
  check_dtypes_and_dims(op, "v", v, "v_out", v_out, head_dim, &problem);
  require_shape(op, "v_out", v_out, {tokens, heads, head_dim}, "[T, H, D] of v");
  if (states > 0xFFFFFFFFll) fail(op, fmt::format("v has {} states; at most 2^32-1", states));
  problem.tokens = tokens;
  problem.heads = heads;
  problem.states = states;
  const VDesc a = describe_v(op, "v", v, 0, 2, 1, false);
  const VDesc o = describe_v(op, "v_out", v_out, 0, 1, -1, true);
  problem.in_align = a.align;
  problem.out_align = o.align;
  const SDesc sa = describe_s(op, "s", s, options.lse_layout, tokens, heads, states, true);
  SDesc so;
  if (s_out.data != nullptr) {
    so = describe_s(op, "s_out", s_out, options.lse_layout, tokens, heads, 0, false);
  }
  MergeStateParams& p = prep.params;
  p.v_a = v.data;
  p.v_b = v.data;
  p.v_out = v_out.data;
  p.s_a = static_cast<const float*>(s.data);
  p.s_b = p.s_a;
  p.s_out = static_cast<float*>(s_out.data);
  p.v_a_token_stride = a.token_stride;
  p.v_a_head_stride = a.head_stride;
  p.v_state_stride = a.state_stride;
  p.v_out_token_stride = o.token_stride;
  p.v_out_head_stride = o.head_stride;
  p.s_a_token_stride = sa.token_stride;
  p.s_a_head_stride = sa.head_stride;
  p.s_state_stride = sa.state_stride;
  p.s_out_token_stride = so.token_stride;
  p.s_out_head_stride = so.head_stride;
  p.num_states = static_cast<u32>(states);
  return prep;
}

/// The widest vector (elements) every access allows: 16 bytes of input at most, and each
/// tensor aligned to min(16, vector bytes).
std::int64_t choose_vec(const Problem& problem) {
  const std::int64_t in_size = static_cast<std::int64_t>(size_of(problem.in));
  const std::int64_t out_size = static_cast<std::int64_t>(size_of(problem.out));
  for (std::int64_t vec = 16 / in_size; vec >= 1; vec /= 2) {
    if (problem.head_dim % vec != 0) continue;
    if (problem.in_align < std::min<std::int64_t>(16, vec * in_size)) continue;
    if (problem.out_align < std::min<std::int64_t>(16, vec * out_size)) continue;
    return vec;
  }
  return 1;
}

struct Geometry {
  std::int64_t vec = 1;
  std::int64_t chunks = 1;
  std::int64_t lanes = 1;
};

struct ModeChoice {
  bool legal = false;
  LaunchShape shape;
  std::string why_not;
  std::string summary;
};

ModeChoice token_major_shape(const Problem& problem, const Geometry& g,
                             const DeviceLimits& limits) {
  ModeChoice c;
  const std::int64_t cap = std::max<std::int64_t>(1, kMaxBlockThreads / g.lanes);
  const std::int64_t groups = (problem.heads + cap - 1) / cap;
  const std::int64_t per_group = (problem.heads + groups - 1) / groups;
  const std::int64_t idle = groups * per_group - problem.heads;
  c.shape.block =
      Dim3{static_cast<std::uint32_t>(g.lanes), static_cast<std::uint32_t>(per_group), 1};
  c.shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(problem.tokens, 0xFFFFFFFFll)),
           static_cast<std::uint32_t>(std::min<std::int64_t>(groups, 0xFFFFFFFFll)), 1};
  c.summary = fmt::format(
      "grid ({}, {}) x block ({}, {}): {} head group(s) of {} heads, {} idle "
      "row(s) per token",
      problem.tokens, groups, g.lanes, per_group, groups, per_group, idle);
  if (problem.tokens > limits.max_grid_dim[0]) {
    c.why_not =
        fmt::format("T = {} exceeds grid x limit {}", problem.tokens, limits.max_grid_dim[0]);
  } else if (groups > limits.max_grid_dim[1]) {
    c.why_not =
        fmt::format("{} head groups exceed grid y limit {}", groups, limits.max_grid_dim[1]);
  } else {
    const auto checks = check_launch(c.shape, limits);
    for (const LimitCheck& check : checks) {
      if (!check.ok() && c.why_not.empty()) {
        c.why_not = fmt::format("{} is {}, needs {}", check.limit, check.allowed, check.requested);
      }
    }
  }
  c.legal = c.why_not.empty();
  return c;
}

ModeChoice flat_shape(const Problem& problem, const Geometry& g, const DeviceLimits& limits) {
  ModeChoice c;
  const std::int64_t rows_per_block = std::max<std::int64_t>(1, kFlatBlockThreads / g.lanes);
  const std::int64_t rows = problem.tokens * problem.heads;
  const std::int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  c.shape.block =
      Dim3{static_cast<std::uint32_t>(g.lanes), static_cast<std::uint32_t>(rows_per_block), 1};
  c.shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(blocks, 0xFFFFFFFFll)), 1, 1};
  c.summary = fmt::format("grid ({}) x block ({}, {}): {} rows packed {} per block", blocks,
                          g.lanes, rows_per_block, rows, rows_per_block);
  if (rows >= (std::int64_t{1} << 32)) {
    c.why_not = fmt::format(
        "T*H = {} rows needs 64-bit row division (the flat mode divides a "
        "32-bit row index)",
        rows);
  } else if (blocks > limits.max_grid_dim[0]) {
    c.why_not = fmt::format("{} blocks exceed grid x limit {}", blocks, limits.max_grid_dim[0]);
  } else {
    for (const LimitCheck& check : check_launch(c.shape, limits)) {
      if (!check.ok() && c.why_not.empty()) {
        c.why_not = fmt::format("{} is {}, needs {}", check.limit, check.allowed, check.requested);
      }
    }
  }
  c.legal = c.why_not.empty();
  return c;
}

Plan make_plan(const Problem& problem, const DeviceLimits& limits) {
  Plan plan;
  plan.op = op_name(problem.op);
  plan.device = limits;
  if (problem.tokens == 0 || problem.heads == 0) {
    plan.mode = "empty";
    plan.reasons.push_back(
        fmt::format("T = {}, H = {}: no rows, nothing is launched", problem.tokens, problem.heads));
    return plan;
  }
  const std::int64_t in_size = static_cast<std::int64_t>(size_of(problem.in));
  Geometry g;
  g.vec = choose_vec(problem);
  const std::int64_t vectors = problem.head_dim / g.vec;
  const std::int64_t rows = problem.tokens * problem.heads;
  // More vectors per thread amortize the per-row weight math and keep more bytes in flight
  // per thread; but when the problem cannot fill the device anyway, more threads finish sooner.
  const std::int64_t resident =
      static_cast<std::int64_t>(limits.sm_count) * limits.max_threads_per_sm;
  const bool small = rows * vectors <= resident;
  for (std::int64_t chunks : {4, 2, 1}) {
    if (vectors % chunks != 0 || chunks * g.vec * in_size > kMaxBytesPerThread) continue;
    if (small && chunks > 1) continue;
    if (vectors / chunks > kMaxBlockThreads) continue;
    g.chunks = chunks;
    break;
  }
  g.lanes = vectors / g.chunks;
  plan.reasons.push_back(fmt::format(
      "vec = {} ({} bytes of {}): widest access all pointers and strides allow (inputs aligned "
      "to {} bytes, output to {}); {} vector(s) per thread, {} lanes per (token, head) row{}",
      g.vec, g.vec * in_size, to_string(problem.in), problem.in_align, problem.out_align, g.chunks,
      g.lanes, small ? " (small problem: one vector per thread for more parallelism)" : ""));

  const ModeChoice token_major = token_major_shape(problem, g, limits);
  const ModeChoice flat = flat_shape(problem, g, limits);
  const std::int64_t tm_threads =
      static_cast<std::int64_t>(token_major.shape.block.x) * token_major.shape.block.y;
  const std::int64_t tm_idle =
      static_cast<std::int64_t>(token_major.shape.grid.y) * token_major.shape.block.y -
      problem.heads;
  int chosen = -1;
  if (problem.forced_mode >= 0) {
    chosen = problem.forced_mode;
    const ModeChoice& forced = chosen == 0 ? token_major : flat;
    if (!forced.legal) {
      throw PlanError(fmt::format("{}: forced mode '{}' is not legal: {}", plan.op,
                                  kMergeStateModes[chosen], forced.why_not));
    }
    plan.reasons.push_back(
        fmt::format("mode {} forced by options.force_mode", kMergeStateModes[chosen]));
  } else if (token_major.legal && tm_threads >= kMinTokenMajorThreads &&
             tm_idle * 16 <= problem.heads) {
    chosen = 0;
    plan.reasons.push_back(fmt::format(
        "token_major: blocks of {} threads with {} idle head rows per token: no division per "
        "thread, consecutive heads of a token read contiguously",
        tm_threads, tm_idle));
  } else if (flat.legal) {
    chosen = 1;
    plan.reasons.push_back(
        token_major.legal
            ? fmt::format("flat: token_major would use blocks of {} threads with {} idle head "
                          "rows per token (needs >= {} threads and <= 1/16 idle); flat packs "
                          "rows densely",
                          tm_threads, tm_idle, kMinTokenMajorThreads)
            : fmt::format("flat: token_major is not legal: {}", token_major.why_not));
  } else if (token_major.legal) {
    chosen = 0;
    plan.reasons.push_back(
        fmt::format("token_major: the only legal mode (flat: {})", flat.why_not));
  } else {
    throw PlanError(
        fmt::format("{}: no legal grid mode for T = {}, H = {}, D = {}: "
                    "token_major: {}; flat: {}",
                    plan.op, problem.tokens, problem.heads, problem.head_dim, token_major.why_not,
                    flat.why_not));
  }
  const ModeChoice& mode = chosen == 0 ? token_major : flat;
  plan.mode = kMergeStateModes[chosen];
  plan.reasons.push_back(mode.summary);

  PlannedLaunch launch;
  launch.spec = KernelSpec::make("merge_state",
                                 {{"in", std::string(to_string(problem.in))},
                                  {"out", std::string(to_string(problem.out))},
                                  {"head_dim", std::to_string(problem.head_dim)},
                                  {"vec", std::to_string(g.vec)},
                                  {"chunks", std::to_string(g.chunks)},
                                  {"mode", plan.mode},
                                  {"op", op_choice(problem.op)},
                                  {"base", problem.base == LseBase::two ? "2" : "e"},
                                  {"pos_inf_empty", problem.pos_inf_as_empty ? "1" : "0"}},
                                 limits.arch);
  launch.shape = mode.shape;
  launch.checks = check_launch(launch.shape, limits);
  require_legal(launch.checks, plan.op);
  plan.launches.push_back(std::move(launch));
  return plan;
}

/// The memo key of one call: every input of make_plan plus the device, as 64-bit fields (no
/// padding, so the bytes are fully defined).
struct Signature {
  std::int64_t op = 0;
  std::int64_t in = 0;
  std::int64_t out = 0;
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t states = 0;
  std::int64_t in_align = 0;
  std::int64_t out_align = 0;
  std::int64_t base = 0;
  std::int64_t pos_inf_as_empty = 0;
  std::int64_t forced_mode = 0;
  std::int64_t device = 0;
};
static_assert(std::has_unique_object_representations_v<Signature>);

void run(const Prepared& prepared, const MergeStateOptions& options, Stream stream) {
  const Problem& problem = prepared.problem;
  if (problem.tokens == 0 || problem.heads == 0) return;
  Runtime& runtime = options.runtime != nullptr ? *options.runtime : Runtime::global();
  const int device = runtime.device_of(stream, options.device);
  Signature sig{};
  sig.op = static_cast<std::int64_t>(problem.op);
  sig.in = static_cast<std::int64_t>(problem.in);
  sig.out = static_cast<std::int64_t>(problem.out);
  sig.tokens = problem.tokens;
  sig.heads = problem.heads;
  sig.head_dim = problem.head_dim;
  sig.states = problem.states;
  sig.in_align = problem.in_align;
  sig.out_align = problem.out_align;
  sig.base = static_cast<std::int64_t>(problem.base);
  sig.pos_inf_as_empty = problem.pos_inf_as_empty ? 1 : 0;
  sig.forced_mode = problem.forced_mode;
  sig.device = device;
  const Runtime::ResolvedPlan& resolved = runtime.memoized(sig, stream, [&] {
    return std::pair{make_plan(problem, runtime.device_limits(device)), device};
  });
  if (resolved.plan.launches.empty()) return;
  MergeStateParams params = prepared.params;
  params.num_tokens = problem.tokens;
  params.num_heads = static_cast<u32>(problem.heads);
  params.num_rows = static_cast<u64>(problem.tokens) * static_cast<u64>(problem.heads);
  const MergeDivMagic magic = merge_div_magic(static_cast<u32>(problem.heads));
  params.head_div_magic = magic.magic;
  params.head_div_shift = magic.shift;
  runtime.launch(resolved, 0, stream, &params, sizeof params);
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 const MergeStateOptions& options, Stream stream) {
  run(prepare_pair(Op::pair, v_a, s_a, v_b, s_b, v_out, s_out, nullptr, options), options, stream);
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const TensorView& mask,
                          const MergeStateOptions& options, Stream stream) {
  run(prepare_pair(Op::in_place, v, s, v_other, s_other, v, s, &mask, options), options, stream);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, const MergeStateOptions& options, Stream stream) {
  run(prepare_many(v, s, v_out, s_out, options), options, stream);
}

Plan plan_merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                      const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                      const MergeStateOptions& options, const DeviceLimits& limits) {
  return make_plan(
      prepare_pair(Op::pair, v_a, s_a, v_b, s_b, v_out, s_out, nullptr, options).problem, limits);
}

Plan plan_merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                               const TensorView& s_other, const TensorView& mask,
                               const MergeStateOptions& options, const DeviceLimits& limits) {
  return make_plan(prepare_pair(Op::in_place, v, s, v_other, s_other, v, s, &mask, options).problem,
                   limits);
}

Plan plan_merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                       const TensorView& s_out, const MergeStateOptions& options,
                       const DeviceLimits& limits) {
  return make_plan(prepare_many(v, s, v_out, s_out, options).problem, limits);
}

}  // namespace kjit
