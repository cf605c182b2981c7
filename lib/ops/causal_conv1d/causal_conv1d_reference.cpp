// SPDX-License-Identifier: Apache-2.0
// causal_conv1d's float64 CPU reference (declared in family.hpp).
#include "ops/causal_conv1d/family.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "support/numeric.hpp"

namespace kjit::reference {
namespace {

using support::load_as_double;
using support::store_from_double;

std::int64_t offset(const TensorView& v, std::int64_t i, std::int64_t j = 0, std::int64_t k = 0) {
  return i * v.strides[0] + (v.rank > 1 ? j * v.strides[1] : 0) +
         (v.rank > 2 ? k * v.strides[2] : 0);
}
double get(const TensorView& v, std::int64_t i, std::int64_t j = 0, std::int64_t k = 0) {
  return load_as_double(v.data, v.dtype, offset(v, i, j, k));
}
std::int64_t get_int(const TensorView& v, std::int64_t i) {
  return static_cast<std::int64_t>(get(v, i));
}

bool valid(std::int64_t slot, std::int64_t slots, const CausalConv1dOptions& options) {
  if (slot < 0 || slot >= slots) return false;
  return !(options.invalid_index == ConvInvalidIndex::nonpositive && slot == 0);
}

/// One output: act(bias + sum_j w[W-1-j] * in[t-j]) with `in` the history (W-1 entries, oldest
/// first) followed by the sequence's inputs.
double conv_at(const std::vector<double>& in, std::int64_t t, const std::vector<double>& w,
               double bias, bool silu) {
  const auto width = static_cast<std::int64_t>(w.size());
  double acc = bias;
  for (std::int64_t j = 0; j < width; ++j) {
    acc += w[static_cast<std::size_t>(width - 1 - j)] *
           in[static_cast<std::size_t>(t + width - 1 - j)];
  }
  return silu ? acc / (1.0 + std::exp(-acc)) : acc;
}

struct Weights {
  std::int64_t width = 0;
  std::vector<double> w;
  double bias = 0;
};

Weights weights_of(const TensorView& weight, const TensorView& bias, std::int64_t c) {
  Weights out;
  out.width = weight.shape[1];
  for (std::int64_t j = 0; j < out.width; ++j) out.w.push_back(get(weight, c, j));
  out.bias = bias.data != nullptr ? get(bias, c) : 0.0;
  return out;
}

}  // namespace

std::vector<double> causal_conv1d(const TensorView& x, const TensorView& weight,
                                  const TensorView& bias, const TensorView& conv_state,
                                  const TensorView& cu_seqlens, const TensorView& state_indices,
                                  const TensorView& has_initial_state,
                                  const CausalConv1dOptions& options) {
  const std::int64_t tokens = x.shape[0], dim = x.shape[1], width = weight.shape[1];
  const std::int64_t seqs = state_indices.shape[0], slots = conv_state.shape[0];
  const bool silu = options.activation == ConvActivation::silu;
  std::vector<double> out(static_cast<std::size_t>(tokens * dim), 0.0);
  for (std::int64_t n = 0; n < seqs; ++n) {
    const std::int64_t start = get_int(cu_seqlens, n);
    const std::int64_t len = get_int(cu_seqlens, n + 1) - start;
    const std::int64_t slot = get_int(state_indices, n);
    if (len == 0 || !valid(slot, slots, options)) continue;  // zero rows, slot untouched
    const bool has = has_initial_state.data == nullptr || get(has_initial_state, n) != 0;
    for (std::int64_t c = 0; c < dim; ++c) {
      const Weights w = weights_of(weight, bias, c);
      std::vector<double> in;
      for (std::int64_t j = 0; j < width - 1; ++j)
        in.push_back(has ? get(conv_state, slot, c, j) : 0);
      for (std::int64_t t = 0; t < len; ++t) in.push_back(get(x, start + t, c));
      for (std::int64_t t = 0; t < len; ++t) {
        out[static_cast<std::size_t>((start + t) * dim + c)] = conv_at(in, t, w.w, w.bias, silu);
      }
      // Columns 0..W-2: the last W-1 entries of history ++ inputs.
      const auto total = static_cast<std::int64_t>(in.size());
      for (std::int64_t j = 0; j < width - 1; ++j) {
        store_from_double(conv_state.data, conv_state.dtype, offset(conv_state, slot, c, j),
                          in[static_cast<std::size_t>(total - (width - 1) + j)]);
      }
    }
  }
  return out;
}

namespace {

/// The update of every row: row b has steps_of(b) tokens, token s of it x_at(b, s, c) and its
/// output at out index out_row(b, s) * D + c.
template <typename Steps, typename XAt, typename OutRow>
void update_rows(std::int64_t rows, std::int64_t dim, const Steps& steps_of, const XAt& x_at,
                 const OutRow& out_row, const TensorView& weight, const TensorView& bias,
                 const TensorView& conv_state, const TensorView& state_indices,
                 const TensorView& num_accepted_tokens, const CausalConv1dOptions& options,
                 std::vector<double>* out) {
  const std::int64_t width = weight.shape[1];
  const std::int64_t slots = conv_state.shape[0], cols = conv_state.shape[2];
  const bool silu = options.activation == ConvActivation::silu;
  const bool spec = num_accepted_tokens.data != nullptr;
  for (std::int64_t b = 0; b < rows; ++b) {
    const std::int64_t steps = steps_of(b);
    if (steps == 0) continue;  // no output rows, slot untouched
    const std::int64_t slot = get_int(state_indices, b);
    if (!valid(slot, slots, options)) continue;
    std::int64_t first = 0;
    if (spec) {
      // Clamped like the kernel (debug checks report counts outside 1..L-W+2).
      first = std::clamp<std::int64_t>(get_int(num_accepted_tokens, b), 1, cols - width + 2) - 1;
    }
    for (std::int64_t c = 0; c < dim; ++c) {
      const Weights w = weights_of(weight, bias, c);
      std::vector<double> in;
      for (std::int64_t j = 0; j < width - 1; ++j)
        in.push_back(get(conv_state, slot, c, first + j));
      for (std::int64_t s = 0; s < steps; ++s) in.push_back(x_at(b, s, c));
      for (std::int64_t s = 0; s < steps; ++s) {
        (*out)[static_cast<std::size_t>(out_row(b, s) * dim + c)] =
            conv_at(in, s, w.w, w.bias, silu);
      }
      if (spec) {
        // Column k holds entry k + 1: the next step finds the history of a' accepted tokens at
        // columns a' - 1 .. a' + W - 3.
        const std::int64_t written = std::min(cols, width - 2 + steps);
        for (std::int64_t k = 0; k < written; ++k) {
          store_from_double(conv_state.data, conv_state.dtype, offset(conv_state, slot, c, k),
                            in[static_cast<std::size_t>(k + 1)]);
        }
      } else {
        for (std::int64_t k = 0; k < width - 1; ++k) {
          store_from_double(conv_state.data, conv_state.dtype, offset(conv_state, slot, c, k),
                            in[static_cast<std::size_t>(steps + k)]);
        }
      }
    }
  }
}

}  // namespace

std::vector<double> causal_conv1d_update(const TensorView& x, const TensorView& weight,
                                         const TensorView& bias, const TensorView& conv_state,
                                         const TensorView& state_indices,
                                         const TensorView& num_accepted_tokens,
                                         const CausalConv1dOptions& options) {
  const bool three = x.rank == 3;
  const std::int64_t rows = x.shape[0], steps = three ? x.shape[1] : 1;
  const std::int64_t dim = three ? x.shape[2] : x.shape[1];
  std::vector<double> out(static_cast<std::size_t>(rows * steps * dim), 0.0);
  update_rows(
      rows, dim, [&](std::int64_t) { return steps; },
      [&](std::int64_t b, std::int64_t s, std::int64_t c) {
        return three ? get(x, b, s, c) : get(x, b, c);
      },
      [&](std::int64_t b, std::int64_t s) { return b * steps + s; }, weight, bias, conv_state,
      state_indices, num_accepted_tokens, options, &out);
  return out;
}

std::vector<double> causal_conv1d_update_varlen(
    const TensorView& x, const TensorView& weight, const TensorView& bias,
    const TensorView& conv_state, const TensorView& query_start_loc,
    const TensorView& state_indices, const TensorView& num_accepted_tokens,
    const CausalConv1dOptions& options, double untouched) {
  const std::int64_t tokens = x.shape[0], dim = x.shape[1];
  std::vector<double> out(static_cast<std::size_t>(tokens * dim), untouched);
  // Offsets clamped into 0..T as the kernel clamps them (debug checks report others).
  auto begin_of = [&](std::int64_t b) {
    return std::clamp<std::int64_t>(get_int(query_start_loc, b), 0, tokens);
  };
  auto end_of = [&](std::int64_t b) {
    return std::clamp<std::int64_t>(get_int(query_start_loc, b + 1), begin_of(b), tokens);
  };
  // Padding rows: zeros over the row's tokens (the shared loop skips them).
  const std::int64_t rows = state_indices.shape[0];
  for (std::int64_t b = 0; b < rows; ++b) {
    if (!valid(get_int(state_indices, b), conv_state.shape[0], options)) {
      for (std::int64_t t = begin_of(b); t < end_of(b); ++t) {
        std::fill_n(out.begin() + t * dim, dim, 0.0);
      }
    }
  }
  update_rows(
      rows, dim, [&](std::int64_t b) { return end_of(b) - begin_of(b); },
      [&](std::int64_t b, std::int64_t s, std::int64_t c) { return get(x, begin_of(b) + s, c); },
      [&](std::int64_t b, std::int64_t s) { return begin_of(b) + s; }, weight, bias, conv_state,
      state_indices, num_accepted_tokens, options, &out);
  return out;
}

}  // namespace kjit::reference
