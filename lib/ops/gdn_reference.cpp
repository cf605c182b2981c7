// SPDX-License-Identifier: Apache-2.0
#include "ops/gdn_reference.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/causal_conv1d/family.hpp"
#include "support/numeric.hpp"

namespace kjit::reference {
namespace {

using support::load_as_double;
using support::store_from_double;

double at(const TensorView& view, std::int64_t i0, std::int64_t i1 = 0) {
  return load_as_double(view.data, view.dtype, i0 * view.strides[0] + i1 * view.strides[1]);
}

bool invalid_index(std::int64_t slot, std::int64_t slots, GdnInvalidIndex rule) {
  const bool below = rule == GdnInvalidIndex::nonpositive ? slot <= 0 : slot < 0;
  return below || slot >= slots;
}

/// Both forms: `gate_of(n, hv)` returns {g, beta}.
template <typename GateOf>
void decode(const TensorView& qkv, const TensorView& state, const TensorView& indices,
            const TensorView& out, const GdnDecodeOptions& options, std::span<double> out_f64,
            GateOf&& gate_of) {
  const std::int64_t batch = indices.shape[0];
  const std::int64_t slots = state.shape[0], value_heads = state.shape[1], v_dim = state.shape[2],
                     k_dim = state.shape[3];
  const std::int64_t heads = (qkv.shape[1] - value_heads * v_dim) / (2 * k_dim);
  const std::int64_t group = value_heads / heads;
  const double scale =
      options.scale ? static_cast<double>(*options.scale) : 1.0 / std::sqrt(double(k_dim));
  std::vector<double> q(k_dim), k(k_dim), v(v_dim), o(v_dim), h(v_dim * k_dim);
  for (std::int64_t n = 0; n < batch; ++n) {
    const auto slot = static_cast<std::int64_t>(
        load_as_double(indices.data, indices.dtype, n * indices.strides[0]));
    const bool invalid = invalid_index(slot, slots, options.invalid_index);
    for (std::int64_t hv = 0; hv < value_heads; ++hv) {
      const std::int64_t out_base = n * out.strides[0] + hv * out.strides[1];
      if (invalid) {
        for (std::int64_t i = 0; i < v_dim; ++i) {
          store_from_double(out.data, out.dtype, out_base + i * out.strides[2], 0.0);
          if (!out_f64.empty()) out_f64[(n * value_heads + hv) * v_dim + i] = 0.0;
        }
        continue;
      }
      const std::int64_t head = hv / group;
      for (std::int64_t i = 0; i < k_dim; ++i) {
        q[i] = at(qkv, n, head * k_dim + i);
        k[i] = at(qkv, n, (heads + head) * k_dim + i);
      }
      for (std::int64_t i = 0; i < v_dim; ++i)
        v[i] = at(qkv, n, 2 * heads * k_dim + hv * v_dim + i);
      const std::int64_t state_base = slot * state.strides[0] + hv * state.strides[1];
      for (std::int64_t r = 0; r < v_dim; ++r) {
        for (std::int64_t c = 0; c < k_dim; ++c) {
          h[r * k_dim + c] = load_as_double(
              state.data, state.dtype, state_base + r * state.strides[2] + c * state.strides[3]);
        }
      }
      const auto [g, beta] = gate_of(n, hv);
      gdn_step(h, q, k, v, g, beta, scale, options.l2norm_qk, o);
      for (std::int64_t r = 0; r < v_dim; ++r) {
        for (std::int64_t c = 0; c < k_dim; ++c) {
          store_from_double(state.data, state.dtype,
                            state_base + r * state.strides[2] + c * state.strides[3],
                            h[r * k_dim + c]);
        }
        store_from_double(out.data, out.dtype, out_base + r * out.strides[2], o[r]);
        if (!out_f64.empty()) out_f64[(n * value_heads + hv) * v_dim + r] = o[r];
      }
    }
  }
}

struct Gates {
  double g;
  double beta;
};

}  // namespace

double gdn_softplus(double x, double threshold) {
  return x > threshold ? x : std::log1p(std::exp(x));
}

double gdn_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double gdn_log_decay(double a, double a_log, double dt_bias, double softplus_threshold) {
  return -std::exp(a_log) * gdn_softplus(a + dt_bias, softplus_threshold);
}

void gdn_step(std::span<double> state, std::span<const double> q, std::span<const double> k,
              std::span<const double> v, double g, double beta, double scale, bool l2norm,
              std::span<double> out) {
  const std::size_t k_dim = q.size(), v_dim = v.size();
  double q_factor = scale, k_factor = 1.0;
  if (l2norm) {
    double q_sq = 0.0, k_sq = 0.0;
    for (std::size_t i = 0; i < k_dim; ++i) {
      q_sq += q[i] * q[i];
      k_sq += k[i] * k[i];
    }
    q_factor /= std::sqrt(q_sq + 1e-6);
    k_factor /= std::sqrt(k_sq + 1e-6);
  }
  const double alpha = std::exp(g);
  for (std::size_t r = 0; r < v_dim; ++r) {
    double* row = state.data() + r * k_dim;
    double hk = 0.0;
    for (std::size_t c = 0; c < k_dim; ++c) {
      row[c] *= alpha;
      hk += row[c] * k[c] * k_factor;
    }
    const double u = beta * (v[r] - hk);
    double o = 0.0;
    for (std::size_t c = 0; c < k_dim; ++c) {
      row[c] += u * k[c] * k_factor;
      o += row[c] * q[c] * q_factor;
    }
    out[r] = o;
  }
}

void gdn_decode_reference(const TensorView& mixed_qkv, const TensorView& a, const TensorView& b,
                          const TensorView& a_log, const TensorView& dt_bias,
                          const TensorView& state, const TensorView& state_indices,
                          const TensorView& out, const GdnDecodeOptions& options,
                          std::span<double> out_f64) {
  decode(
      mixed_qkv, state, state_indices, out, options, out_f64, [&](std::int64_t n, std::int64_t hv) {
        const double g =
            gdn_log_decay(at(a, n, hv), at(a_log, hv), at(dt_bias, hv), options.softplus_threshold);
        return Gates{g, gdn_sigmoid(at(b, n, hv))};
      });
}

void gdn_decode_gated_reference(const TensorView& mixed_qkv, const TensorView& g,
                                const TensorView& beta, const TensorView& state,
                                const TensorView& state_indices, const TensorView& out,
                                const GdnDecodeOptions& options, std::span<double> out_f64) {
  decode(mixed_qkv, state, state_indices, out, options, out_f64,
         [&](std::int64_t n, std::int64_t hv) {
           return Gates{at(g, n, hv), at(beta, n, hv)};
         });
}

void gdn_decode_conv_reference(const TensorView& mixed_qkv, const TensorView& a,
                               const TensorView& b, const TensorView* a_log,
                               const TensorView* dt_bias, const TensorView& state,
                               const TensorView& state_indices, const TensorView& out,
                               const GdnDecodeOptions& options, std::span<double> out_f64) {
  const GdnDecodeConv& conv = *options.conv;
  CausalConv1dOptions conv_options;
  conv_options.activation = conv.activation;
  conv_options.invalid_index = options.invalid_index == GdnInvalidIndex::nonpositive
                                   ? ConvInvalidIndex::nonpositive
                                   : ConvInvalidIndex::negative;
  const std::vector<double> y =
      causal_conv1d_update(mixed_qkv, conv.weight, conv.bias, conv.conv_state, state_indices,
                           TensorView{}, conv_options);
  const std::int64_t rows = mixed_qkv.shape[0], width = mixed_qkv.shape[1];
  std::vector<unsigned char> bytes(static_cast<std::size_t>(rows * width) *
                                   size_of(mixed_qkv.dtype));
  for (std::int64_t i = 0; i < rows * width; ++i) {
    store_from_double(bytes.data(), mixed_qkv.dtype, i, y[static_cast<std::size_t>(i)]);
  }
  const TensorView conv_out = TensorView::contiguous(bytes.data(), mixed_qkv.dtype, {rows, width});
  if (a_log != nullptr) {
    gdn_decode_reference(conv_out, a, b, *a_log, *dt_bias, state, state_indices, out, options,
                         out_f64);
  } else {
    gdn_decode_gated_reference(conv_out, a, b, state, state_indices, out, options, out_f64);
  }
}

}  // namespace kjit::reference
