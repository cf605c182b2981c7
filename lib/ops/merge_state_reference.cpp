// SPDX-License-Identifier: Apache-2.0
#include "ops/merge_state_reference.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "kjit/error.hpp"
#include "support/numeric.hpp"

namespace kjit::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double read(const TensorView& view, std::int64_t offset) {
  return support::load_as_double(view.data, view.dtype, offset);
}

LseBase base_of(const MergeStateOptions& options) {
  if (!options.lse_base) {
    throw InvalidArgument("reference merge_state: options.lse_base is unset; accepted: two, e");
  }
  return *options.lse_base;
}

/// Offset of s[t, h] in a [T, H] / [H, T] LSE view.
std::int64_t s_offset(const TensorView& s, LseLayout layout, std::int64_t t, std::int64_t h) {
  return layout == LseLayout::token_major ? t * s.strides[0] + h * s.strides[1]
                                          : h * s.strides[0] + t * s.strides[1];
}

void require_rank(const TensorView& view, int rank, const char* what) {
  if (view.rank != rank) {
    throw InvalidArgument(
        fmt::format("reference merge_state: {} has rank {}; expected {}", what, view.rank, rank));
  }
}

}  // namespace

MergeWeights merge_weights(std::span<const double> lse, LseBase base, bool pos_inf_as_empty) {
  MergeWeights out;
  out.weights.assign(lse.size(), 0.0);
  std::vector<double> s(lse.begin(), lse.end());
  if (pos_inf_as_empty) {
    for (double& x : s) x = x == kInf ? -kInf : x;
  }
  double m = -kInf;
  for (double x : s) m = std::max(m, x);
  if (m == -kInf) {
    out.lse = -kInf;
    return out;
  }
  if (m == kInf) {
    const double count = static_cast<double>(std::count(s.begin(), s.end(), kInf));
    for (std::size_t i = 0; i < s.size(); ++i) out.weights[i] = s[i] == kInf ? 1.0 / count : 0.0;
    out.lse = kInf;
    return out;
  }
  const double b = base == LseBase::two ? 2.0 : std::exp(1.0);
  double d = 0.0;
  for (double x : s) d += std::pow(b, x - m);
  for (std::size_t i = 0; i < s.size(); ++i) out.weights[i] = std::pow(b, s[i] - m) / d;
  out.lse = m + std::log(d) / std::log(b);
  return out;
}

MergeResult merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                        const TensorView& s_b, const MergeStateOptions& options) {
  require_rank(v_a, 3, "v_a");
  require_rank(v_b, 3, "v_b");
  const LseBase base = base_of(options);
  MergeResult r;
  r.tokens = v_a.shape[0];
  r.heads = v_a.shape[1];
  r.head_dim = v_a.shape[2];
  r.v.assign(static_cast<std::size_t>(r.tokens * r.heads * r.head_dim), 0.0);
  r.s.assign(static_cast<std::size_t>(r.tokens * r.heads), 0.0);
  for (std::int64_t t = 0; t < r.tokens; ++t) {
    for (std::int64_t h = 0; h < r.heads; ++h) {
      const double lse[2] = {read(s_a, s_offset(s_a, options.lse_layout, t, h)),
                             read(s_b, s_offset(s_b, options.lse_layout, t, h))};
      const MergeWeights w = merge_weights(lse, base, options.pos_inf_as_empty);
      r.s[static_cast<std::size_t>(t * r.heads + h)] = w.lse;
      for (std::int64_t d = 0; d < r.head_dim; ++d) {
        double acc = 0.0;
        // Zero-weight states are skipped, not multiplied: their v may be garbage.
        if (w.weights[0] > 0)
          acc += w.weights[0] *
                 read(v_a, t * v_a.strides[0] + h * v_a.strides[1] + d * v_a.strides[2]);
        if (w.weights[1] > 0)
          acc += w.weights[1] *
                 read(v_b, t * v_b.strides[0] + h * v_b.strides[1] + d * v_b.strides[2]);
        r.v[static_cast<std::size_t>((t * r.heads + h) * r.head_dim + d)] = acc;
      }
    }
  }
  return r;
}

MergeResult merge_state_in_place(const TensorView& v, const TensorView& s,
                                 const TensorView& v_other, const TensorView& s_other,
                                 const TensorView& mask, const MergeStateOptions& options) {
  MergeResult r = merge_state(v, s, v_other, s_other, options);
  if (mask.data == nullptr) return r;
  for (std::int64_t t = 0; t < r.tokens; ++t) {
    if (read(mask, t * mask.strides[0]) != 0) continue;
    for (std::int64_t h = 0; h < r.heads; ++h) {
      r.s[static_cast<std::size_t>(t * r.heads + h)] =
          read(s, s_offset(s, options.lse_layout, t, h));
      for (std::int64_t d = 0; d < r.head_dim; ++d) {
        r.v[static_cast<std::size_t>((t * r.heads + h) * r.head_dim + d)] =
            read(v, t * v.strides[0] + h * v.strides[1] + d * v.strides[2]);
      }
    }
  }
  return r;
}

MergeResult merge_states(const TensorView& v, const TensorView& s,
                         const MergeStateOptions& options) {
  require_rank(v, 4, "v");
  require_rank(s, 3, "s");
  const LseBase base = base_of(options);
  MergeResult r;
  r.tokens = v.shape[0];
  const std::int64_t states = v.shape[1];
  r.heads = v.shape[2];
  r.head_dim = v.shape[3];
  r.v.assign(static_cast<std::size_t>(r.tokens * r.heads * r.head_dim), 0.0);
  r.s.assign(static_cast<std::size_t>(r.tokens * r.heads), 0.0);
  std::vector<double> lse(static_cast<std::size_t>(states));
  for (std::int64_t t = 0; t < r.tokens; ++t) {
    for (std::int64_t h = 0; h < r.heads; ++h) {
      for (std::int64_t i = 0; i < states; ++i) {
        const std::int64_t offset = options.lse_layout == LseLayout::token_major
                                        ? t * s.strides[0] + i * s.strides[1] + h * s.strides[2]
                                        : h * s.strides[0] + t * s.strides[1] + i * s.strides[2];
        lse[static_cast<std::size_t>(i)] = read(s, offset);
      }
      const MergeWeights w = merge_weights(lse, base, options.pos_inf_as_empty);
      r.s[static_cast<std::size_t>(t * r.heads + h)] = w.lse;
      for (std::int64_t d = 0; d < r.head_dim; ++d) {
        double acc = 0.0;
        for (std::int64_t i = 0; i < states; ++i) {
          const double wi = w.weights[static_cast<std::size_t>(i)];
          if (wi > 0) {
            acc += wi * read(v, t * v.strides[0] + i * v.strides[1] + h * v.strides[2] +
                                    d * v.strides[3]);
          }
        }
        r.v[static_cast<std::size_t>((t * r.heads + h) * r.head_dim + d)] = acc;
      }
    }
  }
  return r;
}

void store(const MergeResult& result, const TensorView& v_out, const TensorView& s_out,
           LseLayout layout) {
  for (std::int64_t t = 0; t < result.tokens; ++t) {
    for (std::int64_t h = 0; h < result.heads; ++h) {
      for (std::int64_t d = 0; d < result.head_dim; ++d) {
        support::store_from_double(
            v_out.data, v_out.dtype,
            t * v_out.strides[0] + h * v_out.strides[1] + d * v_out.strides[2],
            result.v_at(t, h, d));
      }
      if (s_out.data != nullptr) {
        support::store_from_double(s_out.data, s_out.dtype, s_offset(s_out, layout, t, h),
                                   result.s_at(t, h));
      }
    }
  }
}

}  // namespace kjit::reference
