// SPDX-License-Identifier: Apache-2.0
#include "ops/gdn_prefill_reference.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/numeric.hpp"

namespace kjit::ops {
namespace {

double at(const TensorView& t, std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0,
          std::int64_t i3 = 0) {
  const std::int64_t off = i0 * t.strides[0] + (t.rank > 1 ? i1 * t.strides[1] : 0) +
                           (t.rank > 2 ? i2 * t.strides[2] : 0) +
                           (t.rank > 3 ? i3 * t.strides[3] : 0);
  return support::load_as_double(t.data, t.dtype, off);
}

void put(const TensorView& t, double value, std::int64_t i0, std::int64_t i1 = 0,
         std::int64_t i2 = 0, std::int64_t i3 = 0) {
  const std::int64_t off = i0 * t.strides[0] + (t.rank > 1 ? i1 * t.strides[1] : 0) +
                           (t.rank > 2 ? i2 * t.strides[2] : 0) +
                           (t.rank > 3 ? i3 * t.strides[3] : 0);
  support::store_from_double(t.data, t.dtype, off, value);
}

// Reads a row of K elements of q or k and L2-normalizes it (eps inside the root).
std::vector<double> head_row(const TensorView& x, std::int64_t t, std::int64_t h, bool l2norm) {
  const std::int64_t n = x.shape[2];
  std::vector<double> row(static_cast<std::size_t>(n));
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    row[static_cast<std::size_t>(i)] = at(x, t, h, i);
    sum += row[static_cast<std::size_t>(i)] * row[static_cast<std::size_t>(i)];
  }
  if (l2norm) {
    const double inv = 1.0 / std::sqrt(sum + 1e-6);
    for (double& e : row) e *= inv;
  }
  return row;
}

}  // namespace

void gdn_prefill_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                           const GdnGates& gates, const TensorView& cu_seqlens,
                           const TensorView& state, const TensorView& state_indices,
                           const TensorView& has_initial_state, const TensorView& out,
                           const GdnPrefillOptions& options) {
  const std::int64_t kdim = q.shape[2], vdim = v.shape[2];
  const std::int64_t heads = q.shape[1], value_heads = v.shape[1];
  const std::int64_t group = value_heads / heads;
  const std::int64_t seqs = cu_seqlens.shape[0] - 1;
  const std::int64_t slots = state.shape[0];
  const double scale =
      options.scale > 0.0f ? options.scale : 1.0 / std::sqrt(static_cast<double>(kdim));
  const std::size_t tile = static_cast<std::size_t>(vdim * kdim);
  std::vector<double> hs(tile);
  const std::int64_t every = options.checkpoint_every_n_tokens;
  const TensorView& ckpts = options.state_checkpoints;
  const bool ckpt = every > 0 && ckpts.data != nullptr;

  // Writes the state of value head hv to row `index` of a [rows, HV, V, K] tensor, rounded to
  // its dtype.
  const auto store_state = [&](const TensorView& dst, std::int64_t index, std::int64_t hv) {
    for (std::int64_t i = 0; i < vdim; ++i) {
      for (std::int64_t j = 0; j < kdim; ++j) {
        put(dst, hs[static_cast<std::size_t>(i * kdim + j)], index, hv, i, j);
      }
    }
  };

  for (std::int64_t n = 0; n < seqs; ++n) {
    const auto slot = static_cast<std::int64_t>(at(state_indices, n));
    const bool padded = slot < 0 || slot >= slots;
    const bool has_init =
        !padded && (has_initial_state.data == nullptr || at(has_initial_state, n) != 0.0);
    const auto bos = static_cast<std::int64_t>(at(cu_seqlens, n));
    const auto eos = static_cast<std::int64_t>(at(cu_seqlens, n + 1));
    // Padding sequences write their checkpoints too, like the kernel.
    const std::int64_t first_ckpt =
        ckpt ? static_cast<std::int64_t>(at(options.checkpoint_cu_starts, n)) : 0;
    for (std::int64_t hv = 0; hv < value_heads; ++hv) {
      const std::int64_t h = hv / group;
      for (std::int64_t i = 0; i < vdim; ++i) {
        for (std::int64_t j = 0; j < kdim; ++j) {
          hs[static_cast<std::size_t>(i * kdim + j)] = has_init ? at(state, slot, hv, i, j) : 0.0;
        }
      }
      for (std::int64_t t = bos; t < eos; ++t) {
        double g = 0, beta = 0;
        if (gates.kind == GdnGateKind::raw) {
          const double x = at(gates.a, t, hv) + at(gates.dt_bias, hv);
          const double sp = x > options.softplus_threshold ? x : std::log1p(std::exp(x));
          g = -std::exp(at(gates.a_log, hv)) * sp;
          beta = 1.0 / (1.0 + std::exp(-at(gates.b, t, hv)));
        } else {
          g = at(gates.a, t, hv);
          beta = at(gates.b, t, hv);
        }
        const std::vector<double> qr = head_row(q, t, h, options.l2norm_qk);
        const std::vector<double> kr = head_row(k, t, h, options.l2norm_qk);
        const double alpha = std::exp(g);
        for (std::int64_t i = 0; i < vdim; ++i) {
          double* row = &hs[static_cast<std::size_t>(i * kdim)];
          double hk = 0;
          for (std::int64_t j = 0; j < kdim; ++j) {
            row[j] *= alpha;
            hk += row[j] * kr[static_cast<std::size_t>(j)];
          }
          const double u = beta * (at(v, t, hv, i) - hk);
          double o = 0;
          for (std::int64_t j = 0; j < kdim; ++j) {
            row[j] += u * kr[static_cast<std::size_t>(j)];
            o += row[j] * qr[static_cast<std::size_t>(j)];
          }
          put(out, o * scale, t, hv, i);
        }
        const std::int64_t done = t + 1 - bos;
        if (ckpt && done % every == 0) store_state(ckpts, first_ckpt + done / every - 1, hv);
      }
      const TensorView* dst = nullptr;
      std::int64_t index = 0;
      if (options.final_state.data != nullptr) {
        dst = &options.final_state;
        index = n;
      } else if (!padded) {
        dst = &state;
        index = slot;
      }
      if (dst != nullptr) store_state(*dst, index, hv);
    }
  }
}

}  // namespace kjit::ops
