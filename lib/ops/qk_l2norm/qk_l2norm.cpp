// SPDX-License-Identifier: Apache-2.0
// qk_l2norm: argument checks -> Problem, the planner, the kernel parameters, the public entry
// points, and the float64 reference.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/qk_l2norm/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit {
namespace ops::l2norm {
namespace {

constexpr std::string_view kOp = "qk_l2norm";
constexpr std::int64_t kMinHeadDim = 8;
constexpr std::int64_t kMaxHeadDim = 512;
/// Heads are 32-bit in the kernel's row division.
constexpr std::int64_t kMaxHeads = 0x7FFFFFFF;
/// Resident blocks per SM a grid is sized for, times this many waves: enough blocks to hide
/// the tail of the grid-stride loop, few enough that each block walks several rows.
constexpr std::int64_t kWaves = 8;

constexpr ArgChecks kChecks(kOp);

[[noreturn]] void fail(std::string_view argument, const TensorView& view,
                       std::string_view accepted) {
  kChecks.fail(argument, view, accepted);
}

/// A [T, H, D] tensor: rank, dtype, shape against `tokens` / `head_dim` (when >= 0), data,
/// element alignment, contiguous last dimension, and (outputs) rows that do not overlap.
/// Returns its alignment in bytes (address and the strides of dimensions of extent > 1).
std::int64_t check_rows(std::string_view name, const TensorView& view, DType dtype,
                        std::int64_t tokens, std::int64_t head_dim, bool output) {
  kChecks.rank(name, view, 3, "[T, H, D]");
  if (view.dtype != dtype) {
    fail(name, view, fmt::format("its dtype must be {} (the dtype of q)", to_string(dtype)));
  }
  if (view.shape[0] < 0 || view.shape[1] < 0) fail(name, view, "its extents must be >= 0");
  if (view.shape[1] > kMaxHeads) {
    fail(name, view, fmt::format("H = {} is too large; accepted: at most 2^31 - 1", view.shape[1]));
  }
  if (tokens >= 0 && view.shape[0] != tokens) {
    fail(name, view, fmt::format("expected T = {} (q's token count)", tokens));
  }
  if (head_dim >= 0 && view.shape[2] != head_dim) {
    fail(name, view, fmt::format("expected D = {} (q's head dim)", head_dim));
  }
  // An empty tensor is never dereferenced, so it may come without memory (D >= 8 here).
  const bool empty = view.shape[0] == 0 || view.shape[1] == 0;
  kChecks.not_null(name, view);
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  const std::size_t esize = size_of(view.dtype);
  if (address % esize != 0) {
    fail(name, view,
         fmt::format("its data pointer {:#x} must be aligned to its element size ({} bytes)",
                     address, esize));
  }
  if (view.strides[2] != 1) {
    fail(name, view,
         fmt::format("its last-dimension stride is {}; accepted: 1 (rows must be contiguous)",
                     view.strides[2]));
  }
  std::int64_t align = align_of_bytes(address);
  for (int dim : {0, 1}) {
    if (view.shape[dim] > 1) {
      align = std::min(align, align_of_bytes(magnitude(view.strides[dim]) * esize));
    }
  }
  if (output && !empty) {
    // Rows are disjoint when, ordering the two row strides by magnitude, the smaller one steps
    // over at least a whole row and the larger one past the last row the smaller one reaches:
    // large >= small * (small extent - 1) + D (a dimension of extent 1 is never stepped).
    struct Dim {
      std::uint64_t extent, stride;
    };
    Dim a{static_cast<std::uint64_t>(view.shape[0]), magnitude(view.strides[0])};
    Dim b{static_cast<std::uint64_t>(view.shape[1]), magnitude(view.strides[1])};
    if (a.extent == 1) a.stride = 0;
    if (b.extent == 1) b.stride = 0;
    if (a.stride > b.stride) std::swap(a, b);
    const auto d = static_cast<std::uint64_t>(view.shape[2]);
    const bool small_ok = a.extent == 1 || a.stride >= d;
    const bool large_ok =
        b.extent == 1 ||
        (b.stride >= d && (a.extent == 1 || a.stride <= (b.stride - d) / (a.extent - 1)));
    if (!small_ok || !large_ok) {
      fail(name, view,
           "its rows overlap (an output row must not share elements with another); accepted: "
           "token and head strides that keep the [D] rows disjoint");
    }
  }
  return align;
}

/// An output that is not its input must not be a different view of the same memory start:
/// the kernel would read rows another row already overwrote.
void check_alias(std::string_view out_name, const TensorView& out, std::string_view in_name,
                 const TensorView& in) {
  if (out.data != in.data || out.data == nullptr) return;
  for (int dim : {0, 1}) {
    if (in.shape[dim] > 1 && out.strides[dim] != in.strides[dim]) {
      fail(out_name, out,
           fmt::format("it starts at {}'s address with other strides ({}); accepted: the same "
                       "view (in place) or memory that does not overlap",
                       in_name, in.str()));
    }
  }
}

}  // namespace

Problem Family::check(const Args& args) {
  const TensorView& q = *args.q;
  const TensorView& k = *args.k;
  const TensorView& q_out = *args.q_out;
  const TensorView& k_out = *args.k_out;
  const QkL2NormOptions& options = *args.options;
  if (!std::isfinite(options.eps) || options.eps < 0.0f) {
    throw InvalidArgument(fmt::format(
        "{}: options.eps = {}; accepted: a finite value >= 0 (default 1e-6)", kOp, options.eps));
  }
  Problem p;
  kChecks.rank("q", q, 3, "[T, H, D]");
  if (q.dtype != DType::f16 && q.dtype != DType::bf16 && q.dtype != DType::f32) {
    fail("q", q, "its dtype must be f16, bf16 or f32");
  }
  p.dtype = q.dtype;
  p.head_dim = q.shape[2];
  if (p.head_dim < kMinHeadDim || p.head_dim > kMaxHeadDim || p.head_dim % 8 != 0) {
    fail("q", q,
         fmt::format("D = {} is not supported; accepted: a multiple of 8 in {}..{}", p.head_dim,
                     kMinHeadDim, kMaxHeadDim));
  }
  p.align = check_rows("q", q, p.dtype, -1, p.head_dim, false);
  p.tokens = q.shape[0];
  p.q_heads = q.shape[1];
  p.align = std::min(p.align, check_rows("q_out", q_out, p.dtype, p.tokens, p.head_dim, true));
  if (q_out.shape[1] != p.q_heads) {
    fail("q_out", q_out, fmt::format("expected H = {} (q's head count)", p.q_heads));
  }
  check_alias("q_out", q_out, "q", q);

  const bool has_k = k.data != nullptr;
  if (!has_k && k_out.data != nullptr) {
    fail("k_out", k_out, "k is absent (data == nullptr), so k_out must be absent too");
  }
  if (has_k) {
    p.align = std::min(p.align, check_rows("k", k, p.dtype, p.tokens, p.head_dim, false));
    p.k_heads = k.shape[1];
    p.align = std::min(p.align, check_rows("k_out", k_out, p.dtype, p.tokens, p.head_dim, true));
    if (k_out.shape[1] != p.k_heads) {
      fail("k_out", k_out, fmt::format("expected H = {} (k's head count)", p.k_heads));
    }
    check_alias("k_out", k_out, "k", k);
    if (k_out.data != nullptr && k_out.data == q_out.data) {
      fail("k_out", k_out, "it starts at q_out's address; accepted: memory apart from q_out");
    }
  }
  // T * (Hq + Hk) rows, counted in 64 bits by the kernel.
  const std::uint64_t heads = static_cast<std::uint64_t>(p.q_heads + p.k_heads);
  if (heads > 0 && static_cast<std::uint64_t>(p.tokens) > (std::uint64_t{1} << 62) / heads) {
    throw InvalidArgument(
        fmt::format("{}: T * (Hq + Hk) = {} * {} rows is too many; accepted: at most 2^62", kOp,
                    p.tokens, heads));
  }
  return p;
}

Planned<Choice> Family::plan(const Problem& problem, const DeviceLimits& limits) {
  Planned<Choice> planned;
  Plan& plan = planned.plan;
  plan.op = std::string(kOp);
  plan.device = limits;
  const std::int64_t rows = problem.tokens * (problem.q_heads + problem.k_heads);
  if (rows == 0) {
    plan.mode = "empty";
    plan.reasons.push_back(fmt::format("T = {}, Hq + Hk = {}: no rows, nothing is launched",
                                       problem.tokens, problem.q_heads + problem.k_heads));
    return planned;
  }
  const auto esize = static_cast<std::int64_t>(size_of(problem.dtype));
  std::int64_t vec = 16 / esize;
  while (vec > 1 && (problem.head_dim % vec != 0 || problem.align < vec * esize)) vec /= 2;
  const std::int64_t vectors = problem.head_dim / vec;
  const std::int64_t lanes =
      std::min<std::int64_t>(32, std::bit_ceil(static_cast<std::uint64_t>(vectors)));
  const std::int64_t rows_per_block = kQkL2NormBlockThreads / lanes;
  const std::int64_t blocks_needed = (rows + rows_per_block - 1) / rows_per_block;
  const std::int64_t resident =
      static_cast<std::int64_t>(limits.sm_count) *
      std::max<std::int64_t>(1, limits.max_threads_per_sm / kQkL2NormBlockThreads);
  const std::int64_t cap = std::min<std::int64_t>(resident * kWaves, limits.max_grid_dim[0]);
  const std::int64_t blocks = std::min(blocks_needed, cap);
  plan.mode = "rows";
  plan.reasons.push_back(fmt::format(
      "vec = {} ({} bytes of {}): the widest access every pointer and stride allows (aligned to "
      "{} bytes), D = {} is {} vector(s)",
      vec, vec * esize, to_string(problem.dtype), problem.align, problem.head_dim, vectors));
  plan.reasons.push_back(
      fmt::format("{} lane(s) per row ({} vector(s) each), {} rows per block of {} threads", lanes,
                  (vectors + lanes - 1) / lanes, rows_per_block, kQkL2NormBlockThreads));
  plan.reasons.push_back(fmt::format(
      "grid ({}): {} rows = T {} x (Hq {} + Hk {}) need {} blocks; {}", blocks, rows,
      problem.tokens, problem.q_heads, problem.k_heads, blocks_needed,
      blocks < blocks_needed
          ? fmt::format("capped at {} waves of {} resident blocks, the blocks stride over rows",
                        kWaves, resident)
          : std::string("one pass: every row group of every block normalizes one row")));

  PlannedLaunch launch;
  launch.spec = KernelSpec::make("qk_l2norm",
                                 {{"dtype", std::string(to_string(problem.dtype))},
                                  {"head_dim", std::to_string(problem.head_dim)},
                                  {"vec", std::to_string(vec)},
                                  {"lanes", std::to_string(lanes)}},
                                 limits.arch);
  launch.shape.block = Dim3{static_cast<std::uint32_t>(kQkL2NormBlockThreads), 1, 1};
  launch.shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  launch.checks = check_launch(launch.shape, limits);
  require_legal(launch.checks, plan.op);
  plan.launches.push_back(std::move(launch));
  planned.choice = Choice{static_cast<std::int32_t>(vec), static_cast<std::int32_t>(lanes)};
  return planned;
}

QkL2NormParams Family::params(const Args& args, const Problem& problem, const Choice&, void*) {
  const TensorView& q = *args.q;
  const TensorView& q_out = *args.q_out;
  QkL2NormParams p{};
  p.q = q.data;
  p.q_out = q_out.data;
  p.q_token_stride = q.strides[0];
  p.q_head_stride = q.strides[1];
  p.q_out_token_stride = q_out.strides[0];
  p.q_out_head_stride = q_out.strides[1];
  if (problem.k_heads > 0) {
    const TensorView& k = *args.k;
    const TensorView& k_out = *args.k_out;
    p.k = k.data;
    p.k_out = k_out.data;
    p.k_token_stride = k.strides[0];
    p.k_head_stride = k.strides[1];
    p.k_out_token_stride = k_out.strides[0];
    p.k_out_head_stride = k_out.strides[1];
  }
  p.q_rows = static_cast<u64>(problem.tokens) * static_cast<u64>(problem.q_heads);
  p.rows = static_cast<u64>(problem.tokens) * static_cast<u64>(problem.q_heads + problem.k_heads);
  p.q_heads = static_cast<u32>(problem.q_heads);
  p.k_heads = static_cast<u32>(problem.k_heads);
  p.eps = args.options->eps;
  return p;
}

void reference_row(const double* x, double* out, std::int64_t dim, double eps) {
  double sum = 0;
  for (std::int64_t i = 0; i < dim; ++i) sum += x[i] * x[i];
  const double scale = 1.0 / std::sqrt(sum + eps);
  for (std::int64_t i = 0; i < dim; ++i) out[i] = x[i] * scale;
}

}  // namespace ops::l2norm

void qk_l2norm(const TensorView& q, const TensorView& k, const TensorView& q_out,
               const TensorView& k_out, const QkL2NormOptions& options, Stream stream) {
  using ops::l2norm::Family;
  const ops::l2norm::Args args{&q, &k, &q_out, &k_out, &options};
  ops::run<Family>(args, Family::check(args), {options.device, options.runtime}, stream);
}

Plan plan_qk_l2norm(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const QkL2NormOptions& options,
                    const DeviceLimits& limits) {
  using ops::l2norm::Family;
  return Family::plan(Family::check({&q, &k, &q_out, &k_out, &options}), limits).plan;
}

}  // namespace kjit
