// SPDX-License-Identifier: Apache-2.0
// gdn_prefill on the CPU: the float64 reference against a direct chunked (WY) float64
// implementation of the algorithm the kernel runs, padding and initial-state semantics, state
// checkpoints (the host prefix helper, the reference's checkpoints against prefix-length runs),
// plan legality over many shapes, and argument errors that name the argument.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "codegen/families.hpp"
#include "common/triangular.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "ops/gdn_prefill/family.hpp"
#include "ops/gdn_prefill_reference.hpp"
#include "templates/gdn_prefill/params.h"

namespace kjit {
namespace {

using Vec = std::vector<double>;

// A small problem held in f64 host buffers (the reference reads any dtype; f64 keeps the
// comparison with the chunked form at rounding level).
struct Problem {
  std::int64_t heads = 1, value_heads = 2, k = 8, v = 6, slots = 0;
  std::vector<std::int64_t> cu;
  Vec q, kk, vv, a, b, a_log, dt_bias, state;
  std::vector<std::int64_t> indices;
  std::vector<std::uint8_t> has_init;
  std::int64_t tokens() const { return cu.back(); }
  std::int64_t seqs() const { return static_cast<std::int64_t>(cu.size()) - 1; }
};

Problem make_problem(const std::vector<std::int64_t>& lengths, std::int64_t heads,
                     std::int64_t value_heads, std::int64_t k, std::int64_t v, std::uint64_t seed) {
  Problem pr;
  pr.heads = heads;
  pr.value_heads = value_heads;
  pr.k = k;
  pr.v = v;
  pr.cu.push_back(0);
  for (std::int64_t len : lengths) pr.cu.push_back(pr.cu.back() + len);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto fill = [&](Vec& x, std::int64_t n, double scale) {
    x.resize(static_cast<std::size_t>(n));
    for (double& e : x) e = normal(rng) * scale;
  };
  const std::int64_t t = pr.tokens();
  fill(pr.q, t * heads * k, 1.0);
  fill(pr.kk, t * heads * k, 1.0);
  fill(pr.vv, t * value_heads * v, 1.0);
  fill(pr.a, t * value_heads, 1.0);
  fill(pr.b, t * value_heads, 1.0);
  fill(pr.a_log, value_heads, 0.5);
  fill(pr.dt_bias, value_heads, 0.5);
  pr.slots = pr.seqs() + 2;
  fill(pr.state, pr.slots * value_heads * v * k, 0.3);
  for (std::int64_t n = 0; n < pr.seqs(); ++n) {
    pr.indices.push_back(pr.slots - 1 - n);
    pr.has_init.push_back(n % 3 == 2 ? 0 : 1);
  }
  return pr;
}

struct Views {
  TensorView q, k, v, cu, state, indices, has_init;
  GdnGates gates;
};

Views views(Problem& pr, TensorView out) {
  (void)out;
  const std::int64_t t = pr.tokens(), h = pr.heads, hv = pr.value_heads;
  Views w;
  w.q = TensorView::contiguous(pr.q.data(), DType::f64, {t, h, pr.k});
  w.k = TensorView::contiguous(pr.kk.data(), DType::f64, {t, h, pr.k});
  w.v = TensorView::contiguous(pr.vv.data(), DType::f64, {t, hv, pr.v});
  w.cu = TensorView::contiguous(pr.cu.data(), DType::i64, {pr.seqs() + 1});
  w.state = TensorView::contiguous(pr.state.data(), DType::f64, {pr.slots, hv, pr.v, pr.k});
  w.indices = TensorView::contiguous(pr.indices.data(), DType::i64, {pr.seqs()});
  w.has_init = TensorView::contiguous(pr.has_init.data(), DType::u8, {pr.seqs()});
  w.gates = GdnGates::raw(TensorView::contiguous(pr.a.data(), DType::f64, {t, hv}),
                          TensorView::contiguous(pr.b.data(), DType::f64, {t, hv}),
                          TensorView::contiguous(pr.a_log.data(), DType::f64, {hv}),
                          TensorView::contiguous(pr.dt_bias.data(), DType::f64, {hv}));
  return w;
}

// The chunked WY algorithm of the kernel (templates/gdn_prefill/gdn_prefill.cuh), in float64,
// with chunk C:
// A, T = (I + A)^-1 by forward substitution, R = diag(beta)(V - diag(e^gamma) K S^T),
// Vn = T R, O = scale (e^gamma Q S^T + tril(Q K^T e^(dgamma)) Vn),
// S <- e^gamma_last S + sum_j e^(gamma_last - gamma_j) Vn_j k_j^T. Writes out [T, HV, V] and the
// final state of every sequence into `finals` [N, HV, V, K].
void chunked_wy(const Problem& pr, int chunk, double scale, Vec& out, Vec& finals) {
  const std::int64_t K = pr.k, V = pr.v, HV = pr.value_heads, H = pr.heads;
  out.assign(static_cast<std::size_t>(pr.tokens() * HV * V), 0.0);
  finals.assign(static_cast<std::size_t>(pr.seqs() * HV * V * K), 0.0);
  auto idx = [](std::int64_t i) { return static_cast<std::size_t>(i); };
  for (std::int64_t n = 0; n < pr.seqs(); ++n) {
    const std::int64_t slot = pr.indices[idx(n)];
    const bool init = slot >= 0 && slot < pr.slots && pr.has_init[idx(n)] != 0;
    for (std::int64_t hv = 0; hv < HV; ++hv) {
      const std::int64_t h = hv / (HV / H);
      Vec s(idx(V * K), 0.0);  // S[v][k]
      if (init) {
        for (std::int64_t e = 0; e < V * K; ++e)
          s[idx(e)] = pr.state[idx((slot * HV + hv) * V * K + e)];
      }
      for (std::int64_t t0 = pr.cu[idx(n)]; t0 < pr.cu[idx(n + 1)]; t0 += chunk) {
        const std::int64_t c = std::min<std::int64_t>(chunk, pr.cu[idx(n + 1)] - t0);
        std::vector<Vec> q(idx(c), Vec(idx(K))), k(idx(c), Vec(idx(K)));
        Vec gamma(idx(c)), beta(idx(c));
        double acc = 0;
        for (std::int64_t i = 0; i < c; ++i) {
          const std::int64_t t = t0 + i;
          double sq = 0, sk = 0;
          for (std::int64_t d = 0; d < K; ++d) {
            q[idx(i)][idx(d)] = pr.q[idx((t * H + h) * K + d)];
            k[idx(i)][idx(d)] = pr.kk[idx((t * H + h) * K + d)];
            sq += q[idx(i)][idx(d)] * q[idx(i)][idx(d)];
            sk += k[idx(i)][idx(d)] * k[idx(i)][idx(d)];
          }
          for (std::int64_t d = 0; d < K; ++d) {
            q[idx(i)][idx(d)] /= std::sqrt(sq + 1e-6);
            k[idx(i)][idx(d)] /= std::sqrt(sk + 1e-6);
          }
          const double x = pr.a[idx(t * HV + hv)] + pr.dt_bias[idx(hv)];
          acc += -std::exp(pr.a_log[idx(hv)]) * (x > 20 ? x : std::log1p(std::exp(x)));
          gamma[idx(i)] = acc;
          beta[idx(i)] = 1.0 / (1.0 + std::exp(-pr.b[idx(t * HV + hv)]));
        }
        auto dot = [&](const Vec& x, const Vec& y) {
          double r = 0;
          for (std::int64_t d = 0; d < K; ++d) r += x[idx(d)] * y[idx(d)];
          return r;
        };
        // A (strictly lower, row-major) and T = (I + A)^-1.
        Vec a(idx(c * c), 0.0);
        for (std::int64_t i = 0; i < c; ++i) {
          for (std::int64_t j = 0; j < i; ++j) {
            a[idx(i * c + j)] =
                beta[idx(i)] * dot(k[idx(i)], k[idx(j)]) * std::exp(gamma[idx(i)] - gamma[idx(j)]);
          }
        }
        const Vec tm = test::unit_lower_inverse(a, idx(c));
        // R, Vn, O.
        std::vector<Vec> r(idx(c), Vec(idx(V))), vn(idx(c), Vec(idx(V), 0.0));
        for (std::int64_t i = 0; i < c; ++i) {
          for (std::int64_t e = 0; e < V; ++e) {
            double ks = 0;
            for (std::int64_t d = 0; d < K; ++d) ks += k[idx(i)][idx(d)] * s[idx(e * K + d)];
            r[idx(i)][idx(e)] = beta[idx(i)] * (pr.vv[idx(((t0 + i) * HV + hv) * V + e)] -
                                                std::exp(gamma[idx(i)]) * ks);
          }
        }
        for (std::int64_t i = 0; i < c; ++i) {
          for (std::int64_t j = 0; j <= i; ++j) {
            for (std::int64_t e = 0; e < V; ++e)
              vn[idx(i)][idx(e)] += tm[idx(i * c + j)] * r[idx(j)][idx(e)];
          }
        }
        for (std::int64_t i = 0; i < c; ++i) {
          for (std::int64_t e = 0; e < V; ++e) {
            double qs = 0;
            for (std::int64_t d = 0; d < K; ++d) qs += q[idx(i)][idx(d)] * s[idx(e * K + d)];
            double o = std::exp(gamma[idx(i)]) * qs;
            for (std::int64_t j = 0; j <= i; ++j) {
              o += dot(q[idx(i)], k[idx(j)]) * std::exp(gamma[idx(i)] - gamma[idx(j)]) *
                   vn[idx(j)][idx(e)];
            }
            out[idx(((t0 + i) * HV + hv) * V + e)] = scale * o;
          }
        }
        const double last = gamma[idx(c - 1)];
        for (std::int64_t e = 0; e < V; ++e) {
          for (std::int64_t d = 0; d < K; ++d) {
            double x = std::exp(last) * s[idx(e * K + d)];
            for (std::int64_t j = 0; j < c; ++j) {
              x += std::exp(last - gamma[idx(j)]) * vn[idx(j)][idx(e)] * k[idx(j)][idx(d)];
            }
            s[idx(e * K + d)] = x;
          }
        }
      }
      for (std::int64_t e = 0; e < V * K; ++e) finals[idx((n * HV + hv) * V * K + e)] = s[idx(e)];
    }
  }
}

double max_abs_diff(const Vec& x, const Vec& y) {
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

}  // namespace

TEST_CASE("gdn_prefill reference equals the chunked WY form in float64") {
  for (int chunk : {64, 8, 16}) {
    for (auto [h, hv, k, v] :
         std::vector<std::array<std::int64_t, 4>>{{1, 2, 8, 6}, {2, 4, 16, 16}, {1, 1, 12, 8}}) {
      CAPTURE(chunk);
      CAPTURE(h);
      CAPTURE(hv);
      CAPTURE(k);
      CAPTURE(v);
      Problem pr = make_problem({0, 1, 63, 64, 65, 0, 130}, h, hv, k, v, 7 + chunk + k);
      const double scale = 0.37;
      Vec wy_out, wy_final;
      chunked_wy(pr, chunk, scale, wy_out, wy_final);

      Vec out(wy_out.size(), std::nan("")), finals(wy_final.size(), std::nan(""));
      Views w = views(pr, {});
      GdnPrefillOptions options;
      options.scale = static_cast<float>(scale);
      options.final_state = TensorView::contiguous(finals.data(), DType::f64,
                                                   {pr.seqs(), pr.value_heads, pr.v, pr.k});
      const Vec pool_before = pr.state;
      ops::gdn_prefill_reference(
          w.q, w.k, w.v, w.gates, w.cu, w.state, w.indices, w.has_init,
          TensorView::contiguous(out.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}),
          options);
      // options.scale is f32: the reference uses the rounded value, so compare relative to it.
      Vec wy_out_f = wy_out;
      for (double& x : wy_out_f) x *= static_cast<double>(static_cast<float>(scale)) / scale;
      CHECK(max_abs_diff(out, wy_out_f) < 1e-9);
      CHECK(max_abs_diff(finals, wy_final) < 1e-9);
      CHECK(pr.state == pool_before);  // a separate final_state leaves the pool alone
    }
  }
}

TEST_CASE("gdn_prefill: |T| <= max beta for unit k, the bound the f16 inverse relies on") {
  // The kernels' inverse takes f16 operands (range 6.5e4) where k is normalized in the kernel and
  // beta is a sigmoid (templates/gdn_prefill/chunk.cuh, F16Operands), on the bound |T_ij| <=
  // beta_i for T = (I + A)^-1 with A_ij = beta_i (k_i . k_j) e^(g_i - g_j) below the diagonal.
  // Checked in float64 on chunks meant to be hard: k in 1 to 3 dimensions (many parallel and
  // anti-parallel pairs), beta at 1, no decay; and random ones. With |k| = 8 instead of 1 the
  // same chunks exceed it by far, which is why the f16 form is not used for caller-normalized k.
  constexpr int n = 64;
  std::mt19937_64 rng(20261206);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  const auto largest_entry = [&](const std::vector<double>& k, std::size_t dims,
                                 const std::vector<double>& beta, const std::vector<double>& g) {
    std::vector<double> a(n * n, 0.0);
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t m = 0; m < r; ++m) {
        double dot = 0;
        for (std::size_t d = 0; d < dims; ++d) dot += k[r * dims + d] * k[m * dims + d];
        a[r * n + m] = beta[r] * dot * std::exp(g[r] - g[m]);
      }
    }
    const std::vector<double> t = test::unit_lower_inverse(a, n);
    double largest = 0;
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t j = 0; j < r; ++j) largest = std::max(largest, std::abs(t[r * n + j]));
    }
    return largest;
  };
  double unnormalized_largest = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const std::size_t dims = std::array<std::size_t, 5>{1, 2, 3, 8, 128}[trial % 5];
    std::vector<double> k(n * dims), beta(n), g(n);
    double cumulative = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double norm2 = 0;
      for (std::size_t d = 0; d < dims; ++d) {
        k[i * dims + d] = normal(rng);
        norm2 += k[i * dims + d] * k[i * dims + d];
      }
      for (std::size_t d = 0; d < dims; ++d) k[i * dims + d] /= std::sqrt(norm2);
      beta[i] = trial % 2 == 0 ? 1.0 : uniform(rng);
      if (trial % 4 == 3) cumulative -= 0.3 * uniform(rng);  // a decay on some trials
      g[i] = cumulative;
    }
    CAPTURE(trial);
    CAPTURE(dims);
    CHECK(largest_entry(k, dims, beta, g) <= *std::max_element(beta.begin(), beta.end()) + 1e-9);
    for (double& v : k) v *= 8.0;
    unnormalized_largest = std::max(unnormalized_largest, largest_entry(k, dims, beta, g));
  }
  CHECK(unnormalized_largest > 65504.0);  // past f16's range
}

TEST_CASE("gdn_prefill reference: padding, has_initial_state and in-place pool writes") {
  Problem pr = make_problem({5, 0, 9, 3}, 1, 2, 8, 4, 99);
  pr.indices = {-1, 2, 1, 4};  // seq 0 is padding
  pr.has_init = {1, 1, 0, 1};
  const Vec pool_before = pr.state;
  Vec out(static_cast<std::size_t>(pr.tokens() * pr.value_heads * pr.v), std::nan(""));
  Views w = views(pr, {});
  ops::gdn_prefill_reference(
      w.q, w.k, w.v, w.gates, w.cu, w.state, w.indices, w.has_init,
      TensorView::contiguous(out.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}), {});
  for (double x : out) CHECK(std::isfinite(x));  // padding sequences still write their output
  const std::int64_t per_slot = pr.value_heads * pr.v * pr.k;
  auto slot_equal = [&](std::int64_t slot) {
    for (std::int64_t e = 0; e < per_slot; ++e) {
      if (pr.state[static_cast<std::size_t>(slot * per_slot + e)] !=
          pool_before[static_cast<std::size_t>(slot * per_slot + e)]) {
        return false;
      }
    }
    return true;
  };
  CHECK(slot_equal(0));   // never named: untouched (padding is not clamped into slot 0)
  CHECK(slot_equal(5));   // the last slot: untouched (nor into the last slot)
  CHECK(slot_equal(2));   // zero-length sequence with a state: copied unchanged
  CHECK(!slot_equal(1));  // has_initial_state = 0: written from a zero start
  CHECK(!slot_equal(4));

  // The padding sequence ran from zeros: same output as the same tokens with has_init = 0 on a
  // real slot.
  Problem zero = pr;
  zero.state = pool_before;
  zero.indices = {3, 2, 1, 4};
  zero.has_init = {0, 1, 0, 1};
  Vec out2(out.size(), std::nan(""));
  Views w2 = views(zero, {});
  ops::gdn_prefill_reference(
      w2.q, w2.k, w2.v, w2.gates, w2.cu, w2.state, w2.indices, w2.has_init,
      TensorView::contiguous(out2.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}), {});
  CHECK(max_abs_diff(out, out2) == 0.0);
}

namespace {

struct Shapes {
  std::int64_t t, n, h, hv, k, v;
};

// Views with null data: the planner never dereferences them.
// k_major: the pool as the transpose of a contiguous [slots, HV, K, V] tensor (fla's layout).
Plan plan_for(const Shapes& s, const DeviceLimits& device, DType state = DType::f32,
              const std::string& force = "", bool k_major = false,
              std::int64_t checkpoint_every = 0) {
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const auto state_view = [&](std::int64_t rows) {
    return k_major ? TensorView::strided(nullptr, state, {rows, s.hv, s.v, s.k},
                                         {s.hv * s.v * s.k, s.v * s.k, 1, s.v})
                   : view(state, {rows, s.hv, s.v, s.k});
  };
  GdnPrefillOptions options;
  options.force_mode = force;
  if (checkpoint_every > 0) {
    options.checkpoint_every_n_tokens = checkpoint_every;
    options.state_checkpoints = state_view(s.t / checkpoint_every + s.n);
    options.checkpoint_cu_starts = view(DType::i64, {s.n + 1});
  }
  return plan_gdn_prefill(
      view(DType::bf16, {s.t, s.h, s.k}), view(DType::bf16, {s.t, s.h, s.k}),
      view(DType::bf16, {s.t, s.hv, s.v}),
      GdnGates::raw(view(DType::bf16, {s.t, s.hv}), view(DType::bf16, {s.t, s.hv}),
                    view(DType::f32, {s.hv}), view(DType::f32, {s.hv})),
      view(DType::i32, {s.n + 1}), state_view(s.n + 3), view(DType::i64, {s.n}), TensorView{},
      view(DType::bf16, {s.t, s.hv, s.v}), options, device);
}

bool family_registered() {
  for (const auto& family : codegen::families()) {
    if (family.name == "gdn_prefill") return true;
  }
  return false;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return {};
}

}  // namespace

// The planner's rule for the warp-specialized kernel (ws_pays in plan.cpp), restated: bf16
// rows and K = V = 128 on compute capability 9.0 (as plan_for builds them), under 40 GB/s of
// DRAM bandwidth per SM with a value head per q/k head and under 30 with shared q/k heads, pairs
// filling 7/8 of the SMs, 48 chunks x value heads per SM, at most 128 sequences (ranked by the
// blocks).
bool ws_rule(const Shapes& s, const DeviceLimits& device) {
  const std::int64_t sms = device.sm_count;
  const std::int64_t per_sm = device.dram_bytes_per_second / sms;
  const std::int64_t min_chunks_per_sm = per_sm < 30'000'000'000 ? 15 : 48;
  return device.arch.major == 9 && device.arch.minor == 0 && s.k == 128 && s.v == 128 &&
         per_sm < 40'000'000'000 && 8 * s.n * s.hv >= 7 * sms &&
         (s.t + 63) / 64 * s.hv >= min_chunks_per_sm * sms && s.n <= 128;
}

TEST_CASE("gdn_prefill plans are legal for every shape, N = 4096 and T = 100k included") {
  if (!family_registered()) {
    MESSAGE("gdn_prefill family not registered in lib/codegen/families.cpp yet: skipped");
    return;
  }
  for (const char* arch : {"sm_80", "sm_90", "sm_100"}) {
    const DeviceLimits device = DeviceLimits::for_arch(Arch::parse(arch));
    // Whether the state kernel's whole-V tile (K = 128) fits a block's shared memory.
    const bool whole_v_fits =
        gdn_prefill_state_smem(128, 128).total <= device.max_smem_per_block_optin;
    for (const Shapes& s : std::vector<Shapes>{{0, 1, 1, 1, 128, 128},
                                               {100000, 1, 1, 1, 128, 128},
                                               {100000, 4096, 16, 32, 128, 128},
                                               {8192, 4, 16, 16, 128, 128},
                                               {131072, 16, 16, 64, 128, 128},
                                               {4096, 4096, 2, 64, 64, 64},
                                               {1000, 7, 4, 8, 256, 256},
                                               {1000, 7, 4, 8, 64, 128},
                                               {1000, 7, 1, 48, 128, 256}}) {
      CAPTURE(arch);
      CAPTURE(s.t);
      CAPTURE(s.n);
      CAPTURE(s.hv);
      CAPTURE(s.k);
      CAPTURE(s.v);
      const Plan automatic = plan_for(s, device);
      REQUIRE(!automatic.launches.empty());
      for (const PlannedLaunch& launch : automatic.launches) {
        for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
        CHECK(launch.shape.dynamic_smem <= device.max_smem_per_block_optin);
      }
      // Few long sequences take the context-parallel path (its own test below); the
      // sequential chunked path ("chunked") is checked here for every shape.
      if (automatic.launches.size() == 4) CHECK(3 * s.n * s.hv <= device.sm_count);
      // Where DRAM is slow per SM (the sm_90 table is the H100's) many long chains take the
      // warp-specialized kernel instead (its own test below).
      CHECK((automatic.mode == "chunked_ws") == ws_rule(s, device));
      DeviceLimits fast_dram = device;
      fast_dram.dram_bytes_per_second = std::int64_t{1} << 50;
      const Plan plan = automatic.launches.size() == 4 ? plan_for(s, device, DType::f32, "chunked")
                        : automatic.mode == "chunked_ws" ? plan_for(s, fast_dram)
                                                         : automatic;
      for (const PlannedLaunch& launch : plan.launches) {
        for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
        CHECK(launch.shape.dynamic_smem <= device.max_smem_per_block_optin);
      }
      // bf16 inputs with aligned v: always the chunked path on these archs.
      REQUIRE(plan.launches.size() == 2);
      CHECK(plan.mode.starts_with("chunked_bv"));
      const PlannedLaunch& chunk = plan.launches[0];
      const PlannedLaunch& state = plan.launches[1];
      CHECK(chunk.spec.family == "gdn_prefill_chunk");
      CHECK(state.spec.family == "gdn_prefill_state");
      CHECK(chunk.shape.grid.y == static_cast<std::uint32_t>(s.h));
      CHECK(chunk.shape.dynamic_smem == gdn_prefill_chunk_smem(static_cast<int>(s.k)).total);
      const int bv = std::stoi(state.spec.get("bv"));
      // The whole-V tile at K = V = 128 runs on wgmma where sm_90a exists (prefer_wgmma).
      const bool wgmma = bv == 128 && s.k == 128 && s.v == 128 && device.arch == Arch{9, 0};
      CHECK(plan.mode == fmt::format("chunked_bv{}{}", bv, wgmma ? "_wgmma" : ""));
      CHECK(state.spec.arch == (wgmma ? Arch{9, 0, 'a'} : device.arch));
      CHECK(s.v % bv == 0);
      CHECK(bv * s.k <= 2048 * gdn_prefill_state_warps(bv));
      CHECK(chunk.shape.block.x == kGdnPrefillThreads);
      CHECK(state.shape.block.x == static_cast<std::uint32_t>(32 * gdn_prefill_state_warps(bv)));
      // Many (sequence, value head) pairs take the whole-V tile where it exists.
      if (s.n * s.hv >= device.sm_count && s.v % 128 == 0 && s.k <= 128 && whole_v_fits) {
        CHECK(bv == 128);
      }
      CHECK(state.shape.grid.count() == static_cast<std::uint64_t>(s.n * s.hv * (s.v / bv)));
      // The state kernel overlaps the chunk kernel's tail (sm_90 on) only where each of its
      // blocks gets an SM of its own: a block filling more than half an SM, or a grid that fits
      // the SMs, whose blocks then ask for just over half an SM.
      // The wide tiles take 3 input stages (mbarrier handoff) on sm_90 and later where they
      // fit, else 2; the spec says which.
      const int stages = gdn_prefill_state_wide(bv) && device.arch.major >= 9 &&
                                 gdn_prefill_state_smem(static_cast<int>(s.k), bv, 3).total <=
                                     device.max_smem_per_block_optin
                             ? 3
                             : 2;
      CHECK(state.spec.get_or("stages", "2") == std::to_string(stages));
      const std::uint32_t natural = gdn_prefill_state_smem(static_cast<int>(s.k), bv, stages).total;
      const auto fits_twice = [&](std::int64_t smem) {
        return 2 * (smem + device.reserved_smem_per_block) <= device.max_smem_per_sm;
      };
      CHECK_FALSE(chunk.shape.overlaps_previous);
      if (device.arch.sm() < 90) {
        CHECK_FALSE(state.shape.overlaps_previous);
      } else {
        CHECK(state.shape.overlaps_previous ==
              (!fits_twice(natural) || state.shape.grid.count() <= std::uint64_t(device.sm_count)));
      }
      if (state.shape.overlaps_previous) {
        CHECK_FALSE(fits_twice(state.shape.dynamic_smem));
        CHECK(state.shape.dynamic_smem >= natural);
        CHECK(state.shape.dynamic_smem <=
              std::max<std::int64_t>(natural, device.max_smem_per_sm / 2));
      } else {
        CHECK(state.shape.dynamic_smem == natural);
      }
      // The workspace the plan reports is the public helper's.
      bool reported = false;
      for (const std::string& r : plan.reasons) {
        reported |= r == fmt::format("workspace for T = {}: {} bytes", s.t,
                                     gdn_prefill_workspace_bytes(s.t, s.hv));
      }
      CHECK(reported);

      // The fused kernel, forced: one launch with its own tile rules.
      for (const char* force : {"bv64", "bv32", "bv16"}) {
        const int fbv = std::stoi(std::string(force + 2));
        if (s.v % fbv != 0 || fbv * s.k > 8192) continue;
        if (gdn_prefill_smem(static_cast<int>(s.k), fbv).total > device.max_smem_per_block_optin) {
          continue;
        }
        const Plan fused = plan_for(s, device, DType::f32, force);
        REQUIRE(fused.launches.size() == 1);
        const PlannedLaunch& launch = fused.launches[0];
        for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
        CHECK(launch.spec.family == "gdn_prefill");
        CHECK(launch.shape.grid.count() == static_cast<std::uint64_t>(s.n * s.hv * (s.v / fbv)));
        CHECK(launch.shape.dynamic_smem == gdn_prefill_smem(static_cast<int>(s.k), fbv).total);
      }
    }
    // The smallest tile whose blocks fit one per SM: 16 rows while 8 blocks per (sequence,
    // value head) pair fit, then 64 rows while 2 do, then all of V.
    CHECK(plan_for({100000, 1, 1, 1, 128, 128}, device, DType::f32, "chunked").mode ==
          "chunked_bv16");
    if (whole_v_fits) {
      const std::int64_t sms = device.sm_count;
      CHECK(plan_for({8192, sms / 8, 1, 1, 128, 128}, device, DType::f32, "chunked").mode ==
            "chunked_bv16");
      CHECK(plan_for({8192, sms / 8 + 1, 1, 1, 128, 128}, device, DType::f32, "chunked").mode ==
            "chunked_bv64");
      CHECK(plan_for({8192, sms / 2, 1, 1, 128, 128}, device).mode == "chunked_bv64");
      CHECK(
          plan_for({8192, sms / 2 + 1, 1, 1, 128, 128}, device).mode.starts_with("chunked_bv128"));
    }
    if (whole_v_fits) {
      CHECK(plan_for({100000, 4096, 16, 32, 128, 128}, device).mode ==
            (device.arch == Arch{9, 0} ? "chunked_bv128_wgmma" : "chunked_bv128"));
      CHECK(plan_for({1000, 4, 1, 1, 128, 128}, device, DType::bf16, "chunked_bv128").mode ==
            "chunked_bv128");
    } else {
      // sm_80: 163 KiB per block; the whole-V tile needs 185 KiB.
      CHECK(plan_for({100000, 4096, 16, 32, 128, 128}, device).mode == "chunked_bv32");
      CHECK_THROWS_AS(plan_for({1000, 4, 1, 1, 128, 128}, device, DType::bf16, "chunked_bv128"),
                      PlanError);
    }
    CHECK(plan_for({1000, 4, 1, 1, 128, 128}, device, DType::bf16, "bv16").mode == "bv16");
    CHECK(plan_for({1000, 4, 1, 1, 128, 128}, device, DType::bf16, "chunked_bv64").mode ==
          "chunked_bv64");
    CHECK(plan_for({1000, 4, 1, 1, 128, 128}, device, DType::bf16, "chunked").mode ==
          "chunked_bv16");
  }
}

// The memo key stands in the context-parallel decision for T. Segment ids (floor(T / 64 L) + N)
// size the passes' grids, so two token counts with one segment length must not share a key:
// 2 x 40000 and 2 x 50000 tokens (H = HV = 1) both take L = 16 on an H200, with 80 and 99 ids.
TEST_CASE("gdn_prefill: the plan memo's key holds the context-parallel segment ids") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  const auto key = [&](std::int64_t tokens) {
    ops::prefill::Problem p;
    p.tokens = tokens;
    p.seqs = 2;
    p.heads = p.value_heads = 1;
    p.k = p.v = 128;
    p.bf16 = p.v16 = true;
    return ops::prefill::Family::memo_problem(p, h200);
  };
  const ops::prefill::Problem a = key(80000), b = key(100000), c = key(80000 + 63);
  CHECK(a.cp_chunks == 16);
  CHECK(b.cp_chunks == 16);
  CHECK(a.cp_segment_ids == 80);
  CHECK(b.cp_segment_ids == 99);
  CHECK(std::memcmp(&a, &b, sizeof a) != 0);
  // T itself is not in the key: a token count with the same decision and ids shares it.
  CHECK(std::memcmp(&a, &c, sizeof a) == 0);
  // Off the context-parallel path the key holds neither.
  const ops::prefill::Problem seq = key(64);
  CHECK(seq.cp_chunks == 0);
  CHECK(seq.cp_segment_ids == 0);
}

// The planner's choice between the two kernels and the warp-specialized one follows the DRAM
// bandwidth per SM (docs/performance.md, "The planner's choice between the two kernels and the
// warp-specialized one", "S as register A"): below 40 GB/s per SM, the H100's 25 and the
// H200's 36, ws takes many long chains, whether value heads share q/k heads or not.
TEST_CASE("gdn_prefill planner: the warp-specialized kernel where DRAM is slow per SM") {
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  const auto said = [](const Plan& plan, std::string_view text) {
    for (const std::string& r : plan.reasons) {
      if (r.find(text) != std::string::npos) return true;
    }
    return false;
  };
  // The shapes measured (bench_gdn_prefill): ws on the H100 where it won, not where it lost.
  for (const Shapes& s : std::vector<Shapes>{{131072, 16, 16, 16, 128, 128},
                                             {32768, 16, 16, 16, 128, 128},
                                             {131072, 16, 16, 32, 128, 128},
                                             {131072, 16, 16, 16, 128, 128},
                                             {32768, 8, 16, 16, 128, 128}}) {
    CAPTURE(s.t);
    CAPTURE(s.n);
    CAPTURE(s.hv);
    const Plan on_h100 = plan_for(s, h100);
    CHECK(on_h100.mode == "chunked_ws");
    REQUIRE(on_h100.launches.size() == 1);
    CHECK(on_h100.launches[0].spec.family == "gdn_prefill_ws");
    CHECK(on_h100.launches[0].spec.arch == Arch{9, 0, 'a'});
    CHECK(said(on_h100, "25.4 GB/s of DRAM bandwidth per SM"));
    const std::string group =
        std::to_string(s.hv) + " value heads share each of " + std::to_string(s.h) + " q/k heads";
    const std::string per_head = s.hv > s.h ? group : std::string("one value head per q/k head");
    CHECK(said(on_h100, "(< 40 with " + per_head + ")"));
    const Plan on_h200 = plan_for(s, h200);
    CHECK(on_h200.mode == "chunked_ws");
    CHECK(on_h200.launches.size() == 1);
    CHECK(said(on_h200, "36.4 GB/s of DRAM bandwidth per SM (< 40 with " + per_head + ")"));
  }
  // Short chains: 15 chunks per SM below 30 GB/s per SM (the H100, measured with the TMA paths:
  // 16/32 8k in 4 sequences 1.13x), 48 on the H200 (not re-measured there).
  CHECK(plan_for({8192, 4, 16, 32, 128, 128}, h100).mode == "chunked_ws");
  CHECK(said(plan_for({8192, 4, 16, 32, 128, 128}, h100), "(>= 15 per SM)"));
  CHECK(said(plan_for({8192, 4, 16, 32, 128, 128}, h200),
             "4096 chunks x value heads, fewer than 48 per SM"));
  CHECK(said(plan_for({8192, 16, 16, 16, 128, 128}, h200),
             "2048 chunks x value heads, fewer than 48 per SM"));
  CHECK(plan_for({8192, 16, 16, 16, 128, 128}, h100).mode == "chunked_ws");  // 16 x 512
  CHECK(plan_for({8192, 4, 16, 16, 128, 128}, h100).mode == "chunked_bv64");
  CHECK(plan_for({32768, 4, 16, 16, 128, 128}, h100).mode == "chunked_bv64");
  CHECK(plan_for({32768, 1, 16, 16, 128, 128}, h100).launches.size() == 4);  // context-parallel

  // The boundaries: 116 pairs (8 x 116 >= 7 x 132) and 115; on the H200 6336 chunks x value
  // heads (48 x 132; a partial chunk counts) and one chunk per head fewer, on the H100 1980 (15 x
  // 132) and one fewer; 128 sequences and 129.
  const auto mode = [&](const Shapes& s, const DeviceLimits& d) { return plan_for(s, d).mode; };
  CHECK(mode({6336 * 64 / 58, 2, 2, 58, 128, 128}, h100) == "chunked_ws");  // 116 pairs
  CHECK(mode({6336 * 64 / 23 + 64, 5, 1, 23, 128, 128}, h100) == "chunked_bv128_wgmma");  // 115
  CHECK(mode({6336 * 64 / 32, 4, 4, 32, 128, 128}, h200) == "chunked_ws");                // 6336
  CHECK(mode({6336 * 64 / 32 - 64, 4, 4, 32, 128, 128}, h200) == "chunked_bv128_wgmma");  // 6304
  CHECK(mode({6336 * 64 / 32 - 63, 4, 4, 32, 128, 128}, h200) == "chunked_ws");  // rounds up
  CHECK(mode({55 * 64, 4, 4, 36, 128, 128}, h100) == "chunked_ws");              // 55 x 36 = 1980
  CHECK(mode({54 * 64, 4, 4, 36, 128, 128}, h100) == "chunked_bv128_wgmma");     // 1944
  CHECK(mode({54 * 64 + 1, 4, 4, 36, 128, 128}, h100) == "chunked_ws");          // rounds up
  // The DRAM threshold of the chunk count: 30 GB/s per SM is the H200's side, a byte less the
  // H100's.
  DeviceLimits mid = h100;
  mid.dram_bytes_per_second = 30'000'000'000LL * mid.sm_count;
  CHECK(mode({55 * 64, 4, 4, 36, 128, 128}, mid) == "chunked_bv128_wgmma");
  mid.dram_bytes_per_second -= mid.sm_count;
  CHECK(mode({55 * 64, 4, 4, 36, 128, 128}, mid) == "chunked_ws");
  CHECK(mode({1 << 20, 128, 1, 1, 128, 128}, h100) == "chunked_ws");
  const Plan too_many = plan_for({1 << 20, 129, 1, 1, 128, 128}, h100);
  CHECK(too_many.mode == "chunked_bv128_wgmma");
  CHECK(said(too_many, "129 sequences, more than the 128 its blocks rank longest first"));
  // The bandwidth threshold itself: 40 GB/s per SM (HV = H and HV > H alike) is fast enough, a
  // byte less per second is not.
  DeviceLimits edge = h100;
  const Shapes big{131072, 16, 16, 16, 128, 128}, grouped{131072, 16, 8, 16, 128, 128};
  edge.dram_bytes_per_second = 40'000'000'000LL * edge.sm_count;
  CHECK(mode(big, edge) == "chunked_bv128_wgmma");
  edge.dram_bytes_per_second -= edge.sm_count;
  CHECK(mode(big, edge) == "chunked_ws");
  CHECK(mode(grouped, edge) == "chunked_ws");
  edge.dram_bytes_per_second += edge.sm_count;
  CHECK(mode(grouped, edge) == "chunked_bv128_wgmma");
  // Only where the kernel exists: K = V = 128 on sm_90a, bf16 rows (not sm_100, however slow its
  // DRAM, nor K = 64).
  DeviceLimits slow_b200 = DeviceLimits::for_name("b200");
  slow_b200.dram_bytes_per_second = 1'000'000'000'000;
  CHECK(plan_for(big, slow_b200).mode != "chunked_ws");
  CHECK(mode({131072, 16, 16, 16, 64, 128}, h100) != "chunked_ws");

  // The memo key holds the verdict in place of T: same sequences, one side of the chunk
  // threshold each.
  const auto key = [&](std::int64_t tokens) {
    ops::prefill::Problem p;
    p.tokens = tokens;
    p.seqs = 4;
    p.heads = 4;
    p.value_heads = 32;
    p.k = p.v = 128;
    p.bf16 = p.v16 = true;
    return ops::prefill::Family::memo_problem(p, h200);
  };
  const ops::prefill::Problem taken = key(6336 * 2), not_taken = key(6336 * 2 - 64),
                              taken_too = key(100000);
  CHECK(taken.ws_by_planner);
  CHECK(!not_taken.ws_by_planner);
  CHECK(std::memcmp(&taken, &not_taken, sizeof taken) != 0);
  CHECK(std::memcmp(&taken, &taken_too, sizeof taken) == 0);
}

TEST_CASE("gdn_prefill: force_mode '_wgmma' compiles both kernels for sm_90a, only there") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  for (const std::string mode : {"chunked_bv128_wgmma", "chunked_bv64_wgmma", "chunked_wgmma"}) {
    CAPTURE(mode);
    const Plan plan = plan_for({100000, 4096, 16, 32, 128, 128}, h200, DType::f32, mode);
    REQUIRE(plan.launches.size() == 2);
    // The chunk kernel's products on wgmma too (swizzled tiles).
    CHECK(plan.launches[0].spec.arch == Arch{9, 0, 'a'});
    CHECK(plan.launches[1].spec.arch == Arch{9, 0, 'a'});
    CHECK(plan.launches[1].spec.str().ends_with("@sm_90a"));
    bool said = false;
    for (const std::string& r : plan.reasons)
      said |= r.find("warpgroup wgmma") != std::string::npos;
    CHECK(said);
  }
  // The default takes wgmma for the whole-V tile at K = V = 128 (prefer_wgmma), both kernels, and
  // for the context-parallel passes there (check_cp_plan); the 64-row tile keeps its state kernel
  // on mma.sync for the device's own target, with the chunk kernel on wgmma at K = 128 (sm_90a);
  // other sizes keep both on the device's target.
  const Plan plain = plan_for({100000, 4096, 16, 32, 128, 128}, h200);
  REQUIRE(plain.launches.size() == 2);
  CHECK(plain.mode == "chunked_bv128_wgmma");
  CHECK(plain.launches[1].spec.arch == Arch{9, 0, 'a'});
  CHECK(plain.launches[0].spec.arch == Arch{9, 0, 'a'});
  for (const Shapes& s : {Shapes{8192, 4, 16, 16, 128, 128}, Shapes{100000, 4096, 16, 32, 64, 64},
                          Shapes{32768, 1, 16, 16, 128, 64}}) {
    CAPTURE(s.n);
    CAPTURE(s.k);
    const Plan other = plan_for(s, h200);
    for (const PlannedLaunch& launch : other.launches) {
      CAPTURE(launch.spec.str());
      const bool chunk_wgmma = launch.spec.family == "gdn_prefill_chunk" && s.k == 128;
      CHECK(launch.spec.arch == (chunk_wgmma ? Arch{9, 0, 'a'} : Arch{9, 0}));
    }
    CHECK(other.mode.find("wgmma") == std::string::npos);
  }
  for (const Arch arch : {Arch{8, 0}, Arch{8, 9}, Arch{10, 0}, Arch{12, 0}}) {
    CAPTURE(arch.str());
    const Plan other = plan_for({100000, 4096, 16, 32, 128, 128}, DeviceLimits::for_arch(arch));
    REQUIRE(other.launches.size() == 2);
    CHECK(other.launches[0].spec.arch == arch);
  }
  // Refused where it cannot run: other archs, tiles under 64 rows, K = 256.
  // (A tile the problem cannot take is an InvalidArgument, as without the suffix.)
  const auto refused = [&](const Shapes& s, const DeviceLimits& d, const std::string& mode,
                           const char* names) {
    CAPTURE(mode);
    try {
      plan_for(s, d, DType::f32, mode);
      FAIL("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK(what.find(mode) != std::string::npos);
      CHECK(what.find(names) != std::string::npos);
    }
  };
  refused({100000, 64, 16, 32, 128, 128}, DeviceLimits::for_arch(Arch{10, 0}),
          "chunked_bv128_wgmma", "sm_100");
  refused({100000, 64, 16, 32, 128, 128}, DeviceLimits::for_arch(Arch{8, 0}), "chunked_bv64_wgmma",
          "sm_80");
  refused({100000, 64, 16, 32, 128, 128}, h200, "chunked_bv32_wgmma", "value tile 32");
  refused({100000, 64, 16, 32, 256, 256}, h200, "chunked_bv64_wgmma", "K = 256");
  refused({1000, 4, 1, 1, 128, 128}, h200, "bv64_wgmma", "is not a mode");  // the fused kernel
}

TEST_CASE("gdn_prefill: the fused kernel where the chunked path cannot run, and why") {
  const DeviceLimits device = DeviceLimits::for_arch(Arch{9, 0});
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const std::int64_t t = 1000, n = 4, h = 2, hv = 4, k = 128, v = 128;
  const auto plan = [&](DType in, const TensorView& vv, const std::string& force = "") {
    GdnPrefillOptions options;
    options.force_mode = force;
    return plan_gdn_prefill(view(in, {t, h, k}), view(in, {t, h, k}), vv,
                            GdnGates::raw(view(DType::bf16, {t, hv}), view(DType::bf16, {t, hv}),
                                          view(DType::f32, {hv}), view(DType::f32, {hv})),
                            view(DType::i32, {n + 1}), view(DType::f32, {n, hv, v, k}),
                            view(DType::i32, {n}), TensorView{}, view(DType::bf16, {t, hv, v}),
                            options, device);
  };
  const auto mentions = [](const Plan& p, const std::string& what) {
    for (const std::string& r : p.reasons) {
      if (r.find(what) != std::string::npos) return true;
    }
    return false;
  };
  const Plan f16 = plan(DType::f16, view(DType::f16, {t, hv, v}));
  CHECK(f16.launches.size() == 1);
  CHECK(f16.launches[0].spec.family == "gdn_prefill");
  CHECK(mentions(f16, "f16"));
  // v rows with a stride of 2 mod 8 elements: cp.async cannot copy them 16 bytes at a time.
  const TensorView odd_v =
      TensorView::strided(nullptr, DType::bf16, {t, hv, v}, {hv * v + 2, v, 1});
  const Plan odd = plan(DType::bf16, odd_v);
  CHECK(odd.launches.size() == 1);
  CHECK(mentions(odd, "16-byte"));
  // Forcing the chunked path where it cannot run is a PlanError naming the reason.
  CHECK_THROWS_AS(plan(DType::f16, view(DType::f16, {t, hv, v}), "chunked"), PlanError);
}

TEST_CASE("gdn_prefill workspace: size helper and argument checks") {
  CHECK(gdn_prefill_workspace_bytes(0, 16) == 0);
  // T * HV * 272, each region rounded to 256 bytes, and 4096 int32 of sequence order.
  CHECK(gdn_prefill_workspace_bytes(1024, 16) == 1024 * 16 * 272 + 4096 * 4);
  CHECK(gdn_prefill_workspace_bytes(1, 1) == 3 * 256 + 4096 * 4);
  CHECK_THROWS_AS(gdn_prefill_workspace_bytes(-1, 4), InvalidArgument);
  const DeviceLimits device = DeviceLimits::for_arch(Arch{9, 0});
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const std::int64_t t = 300, n = 2, h = 1, hv = 2, k = 64, v = 64;
  const std::int64_t need = gdn_prefill_workspace_bytes(t, hv);
  alignas(256) static unsigned char marker[512];
  const auto err = [&](const TensorView& ws) {
    GdnPrefillOptions options;
    options.workspace = ws;
    return error_of([&] {
      plan_gdn_prefill(
          view(DType::bf16, {t, h, k}), view(DType::bf16, {t, h, k}), view(DType::bf16, {t, hv, v}),
          GdnGates::precomputed(view(DType::f32, {t, hv}), view(DType::f32, {t, hv})),
          view(DType::i32, {n + 1}), view(DType::f32, {n, hv, v, k}), view(DType::i32, {n}),
          TensorView{}, view(DType::f32, {t, hv, v}), options, device);
    });
  };
  CHECK(err(TensorView::contiguous(marker, DType::u8, {need})).empty());
  const std::string small = err(TensorView::contiguous(marker, DType::u8, {need - 1}));
  CHECK(small.find("options.workspace holds " + std::to_string(need - 1)) != std::string::npos);
  CHECK(small.find(std::to_string(need)) != std::string::npos);
  CHECK(err(TensorView::contiguous(marker + 16, DType::u8, {need})).find("256-byte aligned") !=
        std::string::npos);
  CHECK(
      err(TensorView::contiguous(marker, DType::f32, {need})).find("options.workspace has dtype") !=
      std::string::npos);
  CHECK(err(TensorView::contiguous(marker, DType::u8, {2, need})).find("options.workspace") !=
        std::string::npos);
}

TEST_CASE("gdn_prefill argument errors name the argument") {
  const DeviceLimits device = DeviceLimits::for_arch(Arch{9, 0});
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const std::int64_t t = 100, n = 3, h = 2, hv = 4, k = 128, v = 128;
  TensorView q = view(DType::bf16, {t, h, k}), kk = q, vv = view(DType::bf16, {t, hv, v});
  GdnGates gates = GdnGates::raw(view(DType::f32, {t, hv}), view(DType::f32, {t, hv}),
                                 view(DType::f32, {hv}), view(DType::f32, {hv}));
  TensorView cu = view(DType::i32, {n + 1}), state = view(DType::f32, {8, hv, v, k});
  TensorView idx = view(DType::i32, {n}), out = view(DType::bf16, {t, hv, v});
  auto err = [&](auto mutate) {
    TensorView q2 = q, k2 = kk, v2 = vv, cu2 = cu, st2 = state, idx2 = idx, out2 = out;
    GdnGates g2 = gates;
    GdnPrefillOptions options;
    mutate(q2, k2, v2, g2, cu2, st2, idx2, out2, options);
    return error_of([&] {
      plan_gdn_prefill(q2, k2, v2, g2, cu2, st2, idx2, TensorView{}, out2, options, device);
    });
  };
  using TV = TensorView;
  CHECK(err([](TV&, TV&, TV& v2, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          v2.dtype = DType::f32;
        }).find("q, k and v") != std::string::npos);
  CHECK(err([&](TV& q2, TV& k2, TV&, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          q2 = view(DType::bf16, {t, 3, k});
          k2 = q2;
        }).find("HV") != std::string::npos);
  CHECK(err([&](TV& q2, TV& k2, TV&, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          q2 = view(DType::bf16, {t, h, 96});
          k2 = q2;
        }).find("K is 96") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV&, TV& st2, TV&, TV&, GdnPrefillOptions&) {
          st2 = view(DType::f16, {8, hv, v, k});
        }).find("state has dtype f16") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV&, TV&, TV& idx2, TV&, GdnPrefillOptions&) {
          idx2 = view(DType::i32, {n + 1});
        }).find("state_indices") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates& g2, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          g2 = GdnGates::precomputed(view(DType::bf16, {t, hv}), view(DType::f32, {t, hv}));
        }).find("gates.g") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates& g2, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          g2.dt_bias = view(DType::f32, {hv + 1});
        }).find("gates.dt_bias") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV&, TV&, TV&, TV& out2, GdnPrefillOptions&) {
          out2 = view(DType::bf16, {t, hv, 64});
        }).find("out dim 2") != std::string::npos);
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV& cu2, TV&, TV&, TV&, GdnPrefillOptions&) {
          cu2 = view(DType::f32, {n + 1});
        }).find("cu_seqlens") != std::string::npos);
  // Tokens without a sequence: refused (nothing would be launched and out left unwritten); no
  // tokens and no sequences plan an empty launch.
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV& cu2, TV&, TV& idx2, TV&, GdnPrefillOptions&) {
          cu2 = view(DType::i32, {1});
          idx2 = view(DType::i32, {0});
        }).find("(N = 0 sequences) but q has T = 100 tokens") != std::string::npos);
  CHECK(err([&](TV& q2, TV& k2, TV& v2, GdnGates& g2, TV& cu2, TV&, TV& idx2, TV& out2,
                GdnPrefillOptions&) {
          q2 = k2 = view(DType::bf16, {0, h, k});
          v2 = out2 = view(DType::bf16, {0, hv, v});
          g2 = GdnGates::raw(view(DType::f32, {0, hv}), view(DType::f32, {0, hv}),
                             view(DType::f32, {hv}), view(DType::f32, {hv}));
          cu2 = view(DType::i32, {1});
          idx2 = view(DType::i32, {0});
        }).empty());
  CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions& o) {
          // Never dereferenced by the planner; non-null marks the option as given.
          alignas(16) static unsigned char marker[16];
          o.final_state = TensorView::contiguous(marker, DType::bf16, {n, hv, v, k});
        }).find("final_state") != std::string::npos);
  CHECK(err([&](TV& q2, TV&, TV&, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions&) {
          q2 = TensorView::strided(nullptr, DType::bf16, {t, h, k}, {h * k + 4, k, 1});
        }).find("q stride of dim 0") != std::string::npos);
  if (family_registered()) {
    CHECK(err([&](TV&, TV&, TV&, GdnGates&, TV&, TV&, TV&, TV&, GdnPrefillOptions& o) {
            o.force_mode = "bv7";
          }).find("force_mode") != std::string::npos);
  }
}

TEST_CASE("gdn_prefill_checkpoint_starts: the exclusive prefix sum of floor(L / every)") {
  const std::vector<std::int64_t> cu = {0, 0, 1, 64, 128, 193, 321, 1321};  // 0 1 63 64 65 128 1000
  CHECK(gdn_prefill_checkpoint_starts(cu, 64) ==
        std::vector<std::int64_t>{0, 0, 0, 0, 1, 2, 4, 19});
  CHECK(gdn_prefill_checkpoint_starts(cu, 128) ==
        std::vector<std::int64_t>{0, 0, 0, 0, 0, 0, 1, 8});
  // Offsets need not start at 0; N = 0 gives the single 0.
  const std::vector<std::int64_t> shifted = {100, 228, 229};
  CHECK(gdn_prefill_checkpoint_starts(shifted, 64) == std::vector<std::int64_t>{0, 2, 2});
  CHECK(gdn_prefill_checkpoint_starts(std::vector<std::int64_t>{5}, 64) ==
        std::vector<std::int64_t>{0});

  const auto message = [](std::span<const std::int64_t> c, std::int64_t every) {
    try {
      gdn_prefill_checkpoint_starts(c, every);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  for (std::int64_t every : {0, -64, 63, 100}) {
    CAPTURE(every);
    const std::string m = message(cu, every);
    CHECK(m.find(fmt::format("every = {}", every)) != std::string::npos);
    CHECK(m.find("positive multiple of 64") != std::string::npos);
  }
  CHECK(message({}, 64).find("cu_seqlens is empty") != std::string::npos);
  const std::vector<std::int64_t> decreasing = {0, 70, 60};
  CHECK(message(decreasing, 64).find("cu_seqlens[2] = 60 < cu_seqlens[1] = 70") !=
        std::string::npos);
}

TEST_CASE("gdn_prefill reference checkpoints are the states of prefix-length runs") {
  // Small heads keep the float64 runs cheap; the reference takes any positive interval, so 8
  // gives many checkpoints on short sequences, 64 the kernel's smallest interval.
  for (std::int64_t every : {8, 64}) {
    CAPTURE(every);
    const std::vector<std::int64_t> lengths =
        every == 8 ? std::vector<std::int64_t>{0, 7, 8, 9, 17, 40, 3, 24}
                   : std::vector<std::int64_t>{0, 1, 63, 64, 65, 128, 200, 130};
    Problem pr = make_problem(lengths, 1, 2, 8, 6, 31 + static_cast<std::uint64_t>(every));
    pr.indices[3] = -1;  // padding: checkpoints from a zero state
    pr.indices[5] = -7;
    pr.has_init[6] = 0;
    // The helper takes only the kernel's intervals; 8 is summed here.
    std::vector<std::int64_t> starts = {0};
    if (every % 64 == 0) {
      starts = gdn_prefill_checkpoint_starts(pr.cu, every);
    } else {
      for (std::size_t i = 1; i < pr.cu.size(); ++i) {
        starts.push_back(starts.back() + (pr.cu[i] - pr.cu[i - 1]) / every);
      }
    }
    const std::int64_t total = starts.back();
    const std::int64_t per_state = pr.value_heads * pr.v * pr.k;
    REQUIRE(total > 4);

    // One spare row past the end stays NaN: no row beyond the prefix is written.
    Vec ckpts(static_cast<std::size_t>((total + 1) * per_state), std::nan(""));
    std::vector<std::int64_t> starts_buf = starts;
    GdnPrefillOptions options;
    options.checkpoint_every_n_tokens = every;
    options.state_checkpoints =
        TensorView::contiguous(ckpts.data(), DType::f64, {total + 1, pr.value_heads, pr.v, pr.k});
    options.checkpoint_cu_starts =
        TensorView::contiguous(starts_buf.data(), DType::i64, {pr.seqs() + 1});
    const Vec pool_before = pr.state;
    Vec out(static_cast<std::size_t>(pr.tokens() * pr.value_heads * pr.v), std::nan(""));
    Views w = views(pr, {});
    ops::gdn_prefill_reference(
        w.q, w.k, w.v, w.gates, w.cu, w.state, w.indices, w.has_init,
        TensorView::contiguous(out.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}),
        options);
    for (std::int64_t e = total * per_state; e < (total + 1) * per_state; ++e) {
      CHECK(std::isnan(ckpts[static_cast<std::size_t>(e)]));
    }

    // Without checkpoints: the same out and pool.
    Problem plain = pr;
    plain.state = pool_before;
    Vec out_plain(out.size(), std::nan(""));
    Views wp = views(plain, {});
    ops::gdn_prefill_reference(
        wp.q, wp.k, wp.v, wp.gates, wp.cu, wp.state, wp.indices, wp.has_init,
        TensorView::contiguous(out_plain.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}),
        {});
    CHECK(out_plain == out);
    CHECK(plain.state == pr.state);

    // Checkpoint j of sequence i == the final state of sequence i cut to (j + 1) * every tokens
    // (one-sequence run on the same token buffers, from the same start, pool only read).
    Problem prefix = pr;
    prefix.state = pool_before;
    Views wx = views(prefix, {});
    for (std::int64_t i = 0; i < pr.seqs(); ++i) {
      const std::int64_t len =
          pr.cu[static_cast<std::size_t>(i + 1)] - pr.cu[static_cast<std::size_t>(i)];
      REQUIRE(starts[static_cast<std::size_t>(i + 1)] - starts[static_cast<std::size_t>(i)] ==
              len / every);
      for (std::int64_t j = 0; j < len / every; ++j) {
        CAPTURE(i);
        CAPTURE(j);
        std::vector<std::int64_t> cu1 = {pr.cu[static_cast<std::size_t>(i)],
                                         pr.cu[static_cast<std::size_t>(i)] + (j + 1) * every};
        std::vector<std::int64_t> idx1 = {pr.indices[static_cast<std::size_t>(i)]};
        std::vector<std::uint8_t> init1 = {pr.has_init[static_cast<std::size_t>(i)]};
        Vec final1(static_cast<std::size_t>(per_state), std::nan(""));
        Vec out1(out.size(), 0.0);
        GdnPrefillOptions o1;
        o1.final_state =
            TensorView::contiguous(final1.data(), DType::f64, {1, pr.value_heads, pr.v, pr.k});
        ops::gdn_prefill_reference(
            wx.q, wx.k, wx.v, wx.gates, TensorView::contiguous(cu1.data(), DType::i64, {2}),
            wx.state, TensorView::contiguous(idx1.data(), DType::i64, {1}),
            TensorView::contiguous(init1.data(), DType::u8, {1}),
            TensorView::contiguous(out1.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}),
            o1);
        const std::int64_t row = starts[static_cast<std::size_t>(i)] + j;
        const Vec got(ckpts.begin() + row * per_state, ckpts.begin() + (row + 1) * per_state);
        CHECK(max_abs_diff(got, final1) < 1e-12);
        CHECK(std::isfinite(got[0]));
      }
    }
  }
}

TEST_CASE("gdn_prefill checkpoint arguments: errors name the argument, value and what fits") {
  const DeviceLimits device = DeviceLimits::for_arch(Arch{9, 0});
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const std::int64_t t = 300, n = 3, h = 2, hv = 4, k = 128, v = 128;
  const TensorView q = view(DType::bf16, {t, h, k}), vv = view(DType::bf16, {t, hv, v});
  const GdnGates gates = GdnGates::raw(view(DType::f32, {t, hv}), view(DType::f32, {t, hv}),
                                       view(DType::f32, {hv}), view(DType::f32, {hv}));
  const TensorView cu = view(DType::i32, {n + 1}), state = view(DType::f32, {8, hv, v, k});
  const TensorView idx = view(DType::i32, {n}), out = view(DType::bf16, {t, hv, v});
  const auto good = [&] {
    GdnPrefillOptions o;
    o.checkpoint_every_n_tokens = 128;
    o.state_checkpoints = view(DType::f32, {5, hv, v, k});
    o.checkpoint_cu_starts = view(DType::i64, {n + 1});
    return o;
  };
  const auto plan_with = [&](const GdnPrefillOptions& o) {
    return plan_gdn_prefill(q, q, vv, gates, cu, state, idx, TensorView{}, out, o, device);
  };
  const auto err = [&](const std::function<void(GdnPrefillOptions&)>& mutate) {
    GdnPrefillOptions o = good();
    mutate(o);
    return error_of([&] { plan_with(o); });
  };
  const auto has = [](const std::string& m, const char* part) {
    CAPTURE(m);
    CHECK_MESSAGE(m.find(part) != std::string::npos, part);
  };
  CHECK(err([](GdnPrefillOptions&) {}).empty());
  for (std::int64_t every : {100, -64, 32, 63}) {
    const std::string m = err([&](GdnPrefillOptions& o) { o.checkpoint_every_n_tokens = every; });
    has(m, fmt::format("options.checkpoint_every_n_tokens = {};", every).c_str());
    has(m, "0 (no checkpoints) or a positive multiple of 64");
  }
  has(err([](GdnPrefillOptions& o) { o.state_checkpoints = TensorView{}; }),
      "options.state_checkpoints is missing; it is required with "
      "options.checkpoint_every_n_tokens = 128");
  has(err([](GdnPrefillOptions& o) { o.checkpoint_cu_starts = TensorView{}; }),
      "options.checkpoint_cu_starts is missing");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints = view(DType::bf16, {5, hv, v, k});
      }),
      "options.state_checkpoints has dtype bf16; accepted: f32 (the dtype of state)");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints = view(DType::f32, {5, hv, v * k});
      }),
      "options.state_checkpoints must have rank 4 ([total, HV, V, K])");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints = view(DType::f32, {5, hv, 64, k});
      }),
      "options.state_checkpoints dim 2 is 64, expected 128 (V)");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints = view(DType::f32, {5, hv + 1, v, k});
      }),
      "options.state_checkpoints dim 1 is 5, expected 4 (value heads HV)");
  // Checkpoints take the pool's layout: a V-contiguous tensor next to a K-contiguous pool is
  // refused, and so are strides that are neither.
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints =
            TensorView::strided(nullptr, DType::f32, {5, hv, v, k}, {hv * v * k, v * k, 1, v});
      }),
      "options.state_checkpoints is V contiguous but state is K contiguous; accepted: the layout "
      "of state, strides [*, 16384, 128, 1]");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints =
            TensorView::strided(nullptr, DType::f32, {5, hv, v, k}, {hv * v * k, v * k, k + 4, 1});
      }),
      "options.state_checkpoints has strides that are not an accepted layout of its [HV, V, K] "
      "block");
  has(err([&](GdnPrefillOptions& o) {
        o.state_checkpoints =
            TensorView::strided(nullptr, DType::f32, {5, hv, v, k}, {hv * v * k + 2, v * k, k, 1});
      }),
      "options.state_checkpoints stride of dim 0 is 65538; it must be a multiple of 4");
  has(err([&](GdnPrefillOptions& o) {
        alignas(16) static float storage[8];
        o.state_checkpoints = TensorView::contiguous(storage + 1, DType::f32, {0, hv, v, k});
      }),
      "options.state_checkpoints data pointer");
  has(err([&](GdnPrefillOptions& o) {
        alignas(16) static float storage[8];
        o.state_checkpoints = TensorView::contiguous(storage + 1, DType::f32, {0, hv, v, k});
      }),
      "must be 16-byte aligned");
  has(err([&](GdnPrefillOptions& o) { o.checkpoint_cu_starts = view(DType::i32, {n + 1}); }),
      "options.checkpoint_cu_starts has dtype i32; accepted: i64");
  has(err([&](GdnPrefillOptions& o) { o.checkpoint_cu_starts = view(DType::i64, {n}); }),
      "options.checkpoint_cu_starts dim 0 is 3, expected 4 (sequences N + 1)");
  has(err([&](GdnPrefillOptions& o) {
        o.checkpoint_cu_starts = view(DType::i64, {n + 1, 1});
      }),
      "options.checkpoint_cu_starts must have rank 1 ([N + 1])");
  has(err([&](GdnPrefillOptions& o) {
        o.checkpoint_cu_starts = TensorView::strided(nullptr, DType::i64, {n + 1}, {2});
      }),
      "options.checkpoint_cu_starts must be contiguous");
  has(err([&](GdnPrefillOptions& o) {
        alignas(8) static std::int64_t storage[8];
        o.checkpoint_cu_starts = TensorView::contiguous(
            reinterpret_cast<unsigned char*>(storage) + 4, DType::i64, {n + 1});
      }),
      "options.checkpoint_cu_starts data pointer");
  // Tensors without an interval are a mistake, not something to ignore.
  has(err([](GdnPrefillOptions& o) { o.checkpoint_every_n_tokens = 0; }),
      "options.state_checkpoints is given");
  has(err([](GdnPrefillOptions& o) {
        o.checkpoint_every_n_tokens = 0;
        o.state_checkpoints = TensorView{};
      }),
      "options.checkpoint_cu_starts is given");

  if (family_registered()) {
    // The chunked path: only the state kernel (the last launch) writes checkpoints.
    const Plan with = plan_with(good());
    REQUIRE(with.launches.size() == 2);
    CHECK(with.launches[1].spec.get("ckpt") == "1");
    CHECK(with.explain().find("state checkpoints every 128 tokens (2 chunks of 64)") !=
          std::string::npos);
    const Plan without = plan_with(GdnPrefillOptions{});
    REQUIRE(without.launches.size() == 2);
    CHECK(without.launches[1].spec.get("ckpt") == "0");
    CHECK(without.explain().find("no state checkpoints") != std::string::npos);
    // Same launch shapes either way: checkpoints cost no shared memory or threads.
    for (std::size_t i = 0; i < 2; ++i) {
      CHECK(with.launches[i].shape.dynamic_smem == without.launches[i].shape.dynamic_smem);
      CHECK(with.launches[i].shape.grid.count() == without.launches[i].shape.grid.count());
    }
  }
}

namespace {

// Tokens [from, to) of one sequence of `pr` as a problem of its own (slot 0, one sequence),
// starting from `init` [HV, V', K] (V' = rows of init / (HV K)); v_zero: v replaced by zeros of
// width V' (the context-parallel path's identity rows).
Problem segment_of(const Problem& pr, std::int64_t from, std::int64_t to, const Vec& init,
                   bool v_zero) {
  Problem s;
  s.heads = pr.heads;
  s.value_heads = pr.value_heads;
  s.k = pr.k;
  s.v = static_cast<std::int64_t>(init.size()) / (pr.value_heads * pr.k);
  s.cu = {0, to - from};
  const auto rows = [&](const Vec& x, std::int64_t width) {
    return Vec(x.begin() + from * width, x.begin() + to * width);
  };
  s.q = rows(pr.q, pr.heads * pr.k);
  s.kk = rows(pr.kk, pr.heads * pr.k);
  s.vv = v_zero ? Vec(static_cast<std::size_t>((to - from) * pr.value_heads * s.v), 0.0)
                : rows(pr.vv, pr.value_heads * pr.v);
  s.a = rows(pr.a, pr.value_heads);
  s.b = rows(pr.b, pr.value_heads);
  s.a_log = pr.a_log;
  s.dt_bias = pr.dt_bias;
  s.slots = 1;
  s.state = init;
  s.indices = {0};
  s.has_init = {1};
  return s;
}

// Runs the float64 reference on a one-sequence problem: its outputs and its final state.
void run_reference(Problem& pr, Vec& out, Vec& final_state) {
  out.assign(static_cast<std::size_t>(pr.tokens() * pr.value_heads * pr.v), std::nan(""));
  final_state.assign(static_cast<std::size_t>(pr.value_heads * pr.v * pr.k), std::nan(""));
  Views w = views(pr, {});
  GdnPrefillOptions options;
  options.scale = 0.5f;
  options.final_state =
      TensorView::contiguous(final_state.data(), DType::f64, {1, pr.value_heads, pr.v, pr.k});
  ops::gdn_prefill_reference(
      w.q, w.k, w.v, w.gates, w.cu, w.state, w.indices, w.has_init,
      TensorView::contiguous(out.data(), DType::f64, {pr.tokens(), pr.value_heads, pr.v}), options);
}

}  // namespace

// The context-parallel path's algebra, in float64 on the reference: per segment, M (the end
// state from the identity with v = 0) and B (the end state from zero); the scan X_(s+1) = X_s M_s
// + B_s gives each segment's initial state, and each segment rerun from it reproduces the
// sequential outputs and final state to rounding. Also shows that starting a segment from zero
// (an approximate shortcut) would be far off with slowly decaying gates.
TEST_CASE("gdn_prefill context-parallel algebra: segment maps reproduce the recurrence exactly") {
  for (const std::int64_t span : {64, 192, 320}) {
    CAPTURE(span);
    Problem pr = make_problem({700}, 1, 2, 8, 6, 31 + static_cast<std::uint64_t>(span));
    // Slow decay (g = -exp(A_log) softplus(a + dt_bias) near 0): the state carries far.
    for (double& x : pr.a) x = -8.0 + 0.1 * x;
    const std::int64_t hv_count = pr.value_heads, K = pr.k, V = pr.v;
    const Vec init(pr.state.begin() + pr.indices[0] * hv_count * V * K,
                   pr.state.begin() + (pr.indices[0] + 1) * hv_count * V * K);
    Problem whole = segment_of(pr, 0, 700, init, false);
    Vec out_seq, final_seq;
    run_reference(whole, out_seq, final_seq);

    Vec identity(static_cast<std::size_t>(hv_count * K * K), 0.0);
    for (std::int64_t h = 0; h < hv_count; ++h) {
      for (std::int64_t i = 0; i < K; ++i)
        identity[static_cast<std::size_t>((h * K + i) * K + i)] = 1;
    }
    Vec x = init, out_cp, zero_start_out;
    for (std::int64_t from = 0; from < 700; from += span) {
      const std::int64_t to = std::min<std::int64_t>(700, from + span);
      // The exact rerun from X_s.
      Problem seg = segment_of(pr, from, to, x, false);
      Vec out, fin;
      run_reference(seg, out, fin);
      out_cp.insert(out_cp.end(), out.begin(), out.end());
      // The shortcut a decay threshold would take: the segment from zero.
      Problem zero_seg = segment_of(pr, from, to, Vec(x.size(), 0.0), false);
      Vec zout, bz;
      run_reference(zero_seg, zout, bz);
      zero_start_out.insert(zero_start_out.end(), zout.begin(), zout.end());
      // M_s from the identity with v = 0; X_(s+1) = X_s M_s + B_s.
      Problem map_seg = segment_of(pr, from, to, identity, true);
      Vec mout, m;
      run_reference(map_seg, mout, m);
      Vec next(x.size(), 0.0);
      for (std::int64_t h = 0; h < hv_count; ++h) {
        for (std::int64_t r = 0; r < V; ++r) {
          for (std::int64_t c = 0; c < K; ++c) {
            double acc = bz[static_cast<std::size_t>((h * V + r) * K + c)];
            for (std::int64_t j = 0; j < K; ++j) {
              acc += x[static_cast<std::size_t>((h * V + r) * K + j)] *
                     m[static_cast<std::size_t>((h * K + j) * K + c)];
            }
            next[static_cast<std::size_t>((h * V + r) * K + c)] = acc;
          }
        }
      }
      // The map agrees with the rerun's own end state.
      CHECK(max_abs_diff(next, fin) < 1e-10);
      x = next;
    }
    CHECK(max_abs_diff(x, final_seq) < 1e-10);
    REQUIRE(out_cp.size() == out_seq.size());
    CHECK(max_abs_diff(out_cp, out_seq) < 1e-10);
    if (span < 700) CHECK(max_abs_diff(zero_start_out, out_seq) > 1e-2);
  }
}

namespace {

// A plan of the context-parallel path checked against its invariants; returns L. `forced`: a
// force_mode without "_wgmma" (the passes stay on mma.sync).
std::int64_t check_cp_plan(const Plan& plan, const Shapes& s, const DeviceLimits& device,
                           bool forced = false) {
  REQUIRE(plan.launches.size() == 4);
  const std::int64_t l = std::stoll(plan.mode.substr(10, plan.mode.find("_bv") - 10));
  const int bv = std::stoi(plan.mode.substr(plan.mode.find("_bv") + 3));
  // The passes on warpgroup wgmma (sm_90a) exactly where the planner takes them: the whole-V
  // tile at K = V = 128 with 3 stages on compute capability 9.0.
  const bool wgmma = !forced && bv == 128 && s.k == 128 && s.v == 128 && device.arch.major == 9 &&
                     device.arch.minor == 0 && plan.launches[1].spec.get("stages") == "3";
  CHECK(plan.mode == fmt::format("chunked_cp{}_bv{}{}", l, bv, wgmma ? "_wgmma" : ""));
  for (const int pass : {1, 3}) {
    CHECK(plan.launches[static_cast<std::size_t>(pass)].spec.arch ==
          (wgmma ? Arch{9, 0, 'a'} : device.arch));
  }
  CHECK(plan.launches[2].spec.arch == device.arch);
  CHECK(l >= 1);
  CHECK(s.k % bv == 0);
  CHECK(s.v % bv == 0);
  CHECK(plan.launches[0].spec.family == "gdn_prefill_chunk");
  CHECK(plan.launches[1].spec.family == "gdn_prefill_state_cp");
  CHECK(plan.launches[1].spec.get("phase") == "1");
  CHECK(plan.launches[2].spec.family == "gdn_prefill_cp_scan");
  CHECK(plan.launches[3].spec.family == "gdn_prefill_state_cp");
  CHECK(plan.launches[3].spec.get("phase") == "2");
  const std::uint64_t ids = static_cast<std::uint64_t>(s.t / (64 * l) + s.n);
  CHECK(plan.launches[1].shape.grid.count() == ids * s.hv * (s.v / bv + s.k / bv));
  CHECK(plan.launches[3].shape.grid.count() == ids * s.hv * (s.v / bv));
  CHECK(plan.launches[2].shape.grid.count() ==
        static_cast<std::uint64_t>(s.n * s.hv * (s.v / kGdnPrefillCpScanRows)));
  CHECK_FALSE(plan.launches[2].shape.overlaps_previous);
  CHECK_FALSE(plan.launches[3].shape.overlaps_previous);
  for (const PlannedLaunch& launch : plan.launches) {
    for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
    CHECK(launch.shape.dynamic_smem <= device.max_smem_per_block_optin);
  }
  return l;
}

TEST_CASE("gdn_prefill: every profile site of the warp-specialized kernel has a printed name") {
  // bench_gdn_prefill prints the measurement build's sites by these names: a site added to the
  // enum without one would print a null pointer.
  for (int site = 0; site < kjit::kGdnWsProfileSites; ++site) {
    CAPTURE(site);
    const char* name = kjit::gdn_ws_profile_site_name(site);
    REQUIRE(name != nullptr);
    CHECK(std::string(name).size() > 0);
  }
  CHECK(kjit::gdn_ws_profile_site_name(kjit::kGdnWsProfileSites) == nullptr);
  CHECK(std::string(kjit::gdn_ws_profile_site_name(kjit::kWsProfStateInvDiag)) == "inv diag");
}

TEST_CASE(
    "gdn_prefill: the wide tiles' k and q as one pair tile on wgmma fit their padded rows' bytes") {
  for (const int k : {64, 128, 256}) {
    for (const int stages : {2, 3}) {
      CAPTURE(k);
      CAPTURE(stages);
      const GdnPrefillStateSmem padded = gdn_prefill_state_smem(k, 128, stages);
      const GdnPrefillStateSmem paired = gdn_prefill_state_smem(k, 128, stages, true);
      // Same sizes (the planner's figures do not depend on the arch's layout), q behind k's
      // first slice, and the pair's last slice ends before v.
      CHECK(paired.total == padded.total);
      CHECK(paired.k0 == padded.k0);
      CHECK(paired.v == padded.v);
      CHECK(paired.q == paired.k0 + 64 * 128);
      CHECK(paired.k0 % 1024 == 0);
      const std::uint32_t slices = static_cast<std::uint32_t>(k / 64);
      CHECK(paired.k0 + slices * 2 * 64 * 128 <= paired.v);
    }
  }
}

TEST_CASE(
    "gdn_prefill: the warp-specialized kernel's shared memory: disjoint regions, aligned "
    "swizzled tiles, one H200 block") {
  const GdnPrefillWsSmem m = gdn_prefill_ws_smem(128);
  const GdnPrefillStateSmem& st = m.state;
  const std::uint32_t stage = st.k1 - st.k0;
  CHECK(stage % 1024 == 0);  // every stage's swizzled tiles stay on 1024-byte boundaries
  CHECK(st.sc1 - st.sc0 == stage);
  CHECK(st.t1 - st.t0 == m.tp_stride);
  struct Region {
    const char* what;
    std::uint32_t begin, bytes;
  };
  std::vector<Region> regions;
  for (std::uint32_t s = 0; s < static_cast<std::uint32_t>(kGdnPrefillWsStages); ++s) {
    const std::uint32_t at = s * stage;
    for (const std::uint32_t tile : {st.k0, st.q, st.v}) CHECK((at + tile) % 1024 == 0);
    // k and q: one pair tile, each tile's 64-column slices 16 KiB apart, q's behind k's.
    CHECK(st.q == st.k0 + 64 * 128);
    for (std::uint32_t slice = 0; slice < 2; ++slice) {
      regions.push_back({"k", at + st.k0 + slice * 2 * 64 * 128, 64 * 128});
      regions.push_back({"q", at + st.q + slice * 2 * 64 * 128, 64 * 128});
    }
    regions.push_back({"v", at + st.v, 64 * 128 * 2});  // swizzled, a tile of its own
    regions.push_back({"scales", at + st.sc0, 64 * 16});
  }
  for (std::uint32_t slot = 0; slot < 2; ++slot) {
    const std::uint32_t at = slot * m.tp_stride;
    for (const std::uint32_t tile : {st.t0, st.p}) CHECK((at + tile) % 1024 == 0);
    regions.push_back({"T'", at + st.t0, 64 * 64 * 2});
    regions.push_back({"P^T", at + st.p, 64 * 64 * 2});
  }
  regions.push_back({"full, empty, p_ready", st.barriers, 3 * 8 * kGdnPrefillWsStages});
  regions.push_back({"chunk_ready", m.chunk_ready, 8 * kGdnPrefillWsStages});
  regions.push_back({"t_ready (by chunk parity)", m.t_ready, 8 * 2});
  regions.push_back({"A", m.a, 64 * 68 * 4});
  regions.push_back({"gamma", m.gamma, 4 * 64 * 4});
  regions.push_back({"beta", m.beta, 4 * 64 * 4});
  regions.push_back({"cf", m.cf, 4 * 64 * 4});
  regions.push_back({"ref", m.ref, 4 * 4 * 4});
  regions.push_back({"rq (by stage)", m.rq, kGdnPrefillWsStages * 64 * 4});
  regions.push_back({"rk (by chunk parity)", m.rk, 2 * 64 * 4});
  regions.push_back({"beta for the inverse (by chunk parity)", m.beta_t, 2 * 64 * 4});
  for (std::size_t i = 0; i < regions.size(); ++i) {
    CAPTURE(regions[i].what);
    CHECK(regions[i].begin + regions[i].bytes <= m.total);
    CHECK(regions[i].begin % 8 == 0);
    for (std::size_t j = i + 1; j < regions.size(); ++j) {
      CAPTURE(regions[j].what);
      const bool apart = regions[i].begin + regions[i].bytes <= regions[j].begin ||
                         regions[j].begin + regions[j].bytes <= regions[i].begin;
      CHECK(apart);
    }
  }
  // The chunk warpgroup's f32 tiles are read as float4 / float2: 16-byte aligned.
  CHECK(m.a % 16 == 0);
  CHECK(m.cf % 16 == 0);
  // rk, rq and beta's copies are read as float2 (and the state side's rq rows as float2 too).
  CHECK(m.rk % 8 == 0);
  CHECK(m.rq % 8 == 0);
  CHECK(m.beta_t % 8 == 0);
  // One block per SM on the H200; the state warpgroups' ranking scratch (257 i64) fits stage 0.
  CHECK(m.total <= DeviceLimits::for_arch(Arch{9, 0}).max_smem_per_block_optin);
  CHECK(m.total >= (256 + 1) * 8);
}

TEST_CASE("gdn_prefill: the warp-specialized mode plans one legal sm_90a launch or says why not") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  for (const std::int64_t seqs : {std::int64_t{1}, std::int64_t{16}, std::int64_t{128},
                                  std::int64_t{129}, std::int64_t{4096}}) {
    CAPTURE(seqs);
    const Shapes s{131072, seqs, 16, 32, 128, 128};
    const Plan plan = plan_for(s, h200, DType::f32, "chunked_ws");
    CHECK(plan.mode == "chunked_ws");
    REQUIRE(plan.launches.size() == 1);
    const PlannedLaunch& launch = plan.launches[0];
    CHECK(launch.spec.family == "gdn_prefill_ws");
    CHECK(launch.spec.arch == Arch{9, 0, 'a'});
    CHECK(launch.shape.block.x == 384);
    CHECK(launch.shape.grid.x == seqs * 32);
    CHECK(launch.shape.dynamic_smem <= h200.max_smem_per_block_optin);
    for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
    // No workspace: the chunks' rows stay in shared memory.
    for (const std::string& r : plan.reasons) CHECK_FALSE(r.starts_with("workspace for T"));
    const bool ranked = std::any_of(plan.reasons.begin(), plan.reasons.end(), [](const auto& r) {
      return r.find("longest first") != std::string::npos;
    });
    CHECK(ranked == (seqs > 1 && seqs <= 128));
  }
  const Shapes s{8192, 4, 16, 16, 128, 128};
  // Another arch, or K / V other than 128: refused with the reason.
  CHECK_THROWS_WITH_AS(plan_for(s, DeviceLimits::for_arch(Arch{8, 0}), DType::f32, "chunked_ws"),
                       doctest::Contains("needs compute capability 9.0"), Error);
  CHECK_THROWS_WITH_AS(plan_for(s, DeviceLimits::for_arch(Arch{10, 0}), DType::f32, "chunked_ws"),
                       doctest::Contains("needs compute capability 9.0"), Error);
  CHECK_THROWS_WITH_AS(plan_for(Shapes{8192, 4, 16, 16, 64, 128}, h200, DType::f32, "chunked_ws"),
                       doctest::Contains("K = V = 128"), Error);
  CHECK_THROWS_WITH_AS(plan_for(Shapes{8192, 4, 16, 16, 64, 64}, h200, DType::f32, "chunked_ws"),
                       doctest::Contains("K = 64, V = 64"), Error);
  // No suffix applies to it.
  CHECK_THROWS_WITH_AS(plan_for(s, h200, DType::f32, "chunked_ws_p1"),
                       doctest::Contains("is not a mode"), Error);
}

TEST_CASE("gdn_prefill: who forms P, over a grid of shapes, and the _p0 / _p1 suffixes") {
  if (!family_registered()) return;
  for (const Arch arch : {Arch{9, 0}, Arch{8, 0}, Arch{10, 0, 'a'}}) {
    const DeviceLimits device = DeviceLimits::for_arch(arch);
    for (const std::int64_t t : {64, 8192, 131072}) {
      for (const std::int64_t n : {1, 4, 16, 300}) {
        for (const auto& [h, hv] : {std::pair{16, 16}, std::pair{16, 32}, std::pair{4, 4}}) {
          for (const std::int64_t kv : {64, 128, 256}) {
            const Shapes s{t, n, h, hv, kv, kv};
            CAPTURE(arch.str());
            CAPTURE(t);
            CAPTURE(n);
            CAPTURE(hv);
            CAPTURE(kv);
            const Plan plan = plan_for(s, device);
            if (!plan.mode.starts_with("chunked") || plan.launches.empty()) continue;
            // The rule: the state kernel forms P for the sequential whole-V tile without GVA, at
            // K = V = 128, with 3 stages.
            const bool want = plan.mode == "chunked_bv128" && h == hv && kv == 128 &&
                              arch.major >= 9;  // 3 stages (handed over by mbarriers)
            for (const PlannedLaunch& launch : plan.launches) {
              if (launch.spec.family == "gdn_prefill_cp_scan") continue;
              CHECK(launch.spec.get_or("statep", "0") == (want ? "1" : "0"));
            }
            // Forced either way where the tile is wide; both kernels follow.
            if (plan.mode == "chunked_bv128" || plan.mode == "chunked_bv64") {
              for (const char* suffix : {"_p0", "_p1"}) {
                const Plan forced = plan_for(s, device, DType::f32, plan.mode + suffix);
                for (const PlannedLaunch& launch : forced.launches) {
                  CHECK(launch.spec.get_or("statep", "0") == (suffix[2] == '1' ? "1" : "0"));
                }
              }
            }
          }
        }
      }
    }
  }
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  const Shapes s{131072, 16, 16, 16, 128, 128};
  // A narrow tile, or the 64-row tile on wgmma, cannot form P: refused with the reason.
  CHECK_THROWS_WITH_AS(plan_for(s, h200, DType::f32, "chunked_bv32_p1"),
                       doctest::Contains("P is formed by the state kernel's wide mma.sync tiles"),
                       Error);
  CHECK_THROWS_WITH_AS(plan_for(s, h200, DType::f32, "chunked_bv64_wgmma_p1"),
                       doctest::Contains("this plan's tile is 64 on wgmma"), Error);
  // The whole-V wgmma tile forms P with its two warpgroups: both kernels say so, on sm_90a.
  const Plan wgmma_p = plan_for(s, h200, DType::f32, "chunked_bv128_wgmma_p1");
  REQUIRE(wgmma_p.launches.size() == 2);
  for (const PlannedLaunch& launch : wgmma_p.launches) {
    CHECK(launch.spec.get_or("statep", "0") == "1");
    CHECK(launch.spec.arch == Arch{9, 0, 'a'});
  }
  // A suffix on a fused mode is not a mode.
  CHECK_THROWS_WITH_AS(plan_for(s, h200, DType::f32, "bv64_p1"), doctest::Contains("is not a mode"),
                       Error);
}

}  // namespace

TEST_CASE(
    "gdn_prefill planner: the context-parallel path where pairs leave SMs idle, plans legal") {
  int cp_plans = 0, sequential_plans = 0, ws_plans = 0;
  for (const char* arch : {"sm_80", "sm_86", "sm_90", "sm_100"}) {
    for (const int sms : {16, 66, 132, 264}) {
      DeviceLimits device = DeviceLimits::for_arch(Arch::parse(arch));
      device.sm_count = sms;
      for (const std::int64_t n : {1, 2, 4, 8, 16, 64}) {
        for (const std::int64_t t : {1000, 8192, 32768, 131072, 1 << 20}) {
          for (const auto [h, hv, k, v] :
               std::vector<std::array<std::int64_t, 4>>{{1, 1, 128, 128},
                                                        {16, 16, 128, 128},
                                                        {16, 32, 128, 128},
                                                        {4, 8, 64, 128},
                                                        {2, 4, 128, 256},
                                                        {2, 2, 256, 256},
                                                        {4, 4, 64, 64}}) {
            const Shapes s{t, n, h, hv, k, v};
            CAPTURE(arch);
            CAPTURE(sms);
            CAPTURE(n);
            CAPTURE(t);
            CAPTURE(hv);
            CAPTURE(k);
            CAPTURE(v);
            Plan plan;
            try {
              plan = plan_for(s, device);
            } catch (const PlanError& e) {
              // sm_86/sm_89 (99 KiB per block) have no tile at all for K = V = 256.
              CHECK(std::string(e.what()).find("no value tile fits") != std::string::npos);
              CHECK(k == 256);
              continue;
            }
            for (const PlannedLaunch& launch : plan.launches) {
              for (const LimitCheck& check : launch.checks) CHECK_MESSAGE(check.ok(), check.limit);
            }
            // The rule, restated: a tile of 128 (or else 64) rows dividing K and V that fits,
            // K <= 128, pairs leaving two thirds of the SMs idle, L = max(16, work / SMs) and
            // at least 3 segments per sequence on average.
            int bv = 0;
            for (int b : {128, 64}) {
              if (bv == 0 && k % b == 0 && v % b == 0 &&
                  b * k <= 2048 * gdn_prefill_state_warps(b) &&
                  gdn_prefill_state_smem(static_cast<int>(k), b).total <=
                      device.max_smem_per_block_optin) {
                bv = b;
              }
            }
            const std::int64_t work = t / 64 * hv * (bv > 0 ? v / bv : 1);
            const std::int64_t rule_l = std::max<std::int64_t>(16, (work + sms - 1) / sms);
            const bool expect_cp =
                k <= 128 && bv > 0 && 3 * n * hv <= sms && t >= 3 * 64 * rule_l * n;
            CHECK((plan.launches.size() == 4) == expect_cp);
            if (plan.launches.size() == 4) {
              ++cp_plans;
              CHECK(check_cp_plan(plan, s, device) == rule_l);
              bool said = false;
              for (const std::string& r : plan.reasons) {
                said |= r.starts_with("context-parallel state: segments of");
              }
              CHECK(said);
            } else if (plan.mode == "chunked_ws") {
              ++ws_plans;
              CHECK(ws_rule(s, device));
            } else {
              ++sequential_plans;
              CHECK(!ws_rule(s, device));
              REQUIRE(plan.launches.size() == 2);
              bool said = false;
              for (const std::string& r : plan.reasons) {
                said |= r.find("context-parallel") != std::string::npos;
              }
              CHECK(said);
            }
          }
        }
      }
    }
  }
  MESSAGE(cp_plans << " context-parallel plans, " << sequential_plans << " sequential, " << ws_plans
                   << " warp-specialized");
  CHECK(cp_plans > 100);
  CHECK(ws_plans > 10);
  CHECK(sequential_plans > 100);

  // The H200's shapes of the issue: few long sequences take it, 16 x 8k and 16 x 128k-in-all at
  // HV = 16 do not.
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  CHECK(plan_for({32768, 1, 16, 16, 128, 128}, h200).launches.size() == 4);
  CHECK(plan_for({32768, 2, 16, 16, 128, 128}, h200).launches.size() == 4);
  CHECK(plan_for({131072, 1, 16, 16, 128, 128}, h200).launches.size() == 4);
  CHECK(plan_for({32768, 1, 16, 32, 128, 128}, h200).launches.size() == 4);
  CHECK(plan_for({131072, 16, 16, 16, 128, 128}, h200).mode == "chunked_ws");  // one kernel
  CHECK(plan_for({8192, 16, 16, 16, 128, 128}, h200).launches.size() == 2);
}

TEST_CASE("gdn_prefill planner: forced context-parallel modes and their refusals") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  const Shapes many{131072, 16, 16, 16, 128, 128};
  // Forced where the rule would not take it, with the planner's L or a given one.
  check_cp_plan(plan_for(many, h200, DType::f32, "chunked_cp"), many, h200, true);
  const Plan seven = plan_for(many, h200, DType::bf16, "chunked_cp7");
  CHECK(check_cp_plan(seven, many, h200, true) == 7);
  const Shapes one{1000, 1, 1, 1, 64, 64};
  CHECK(check_cp_plan(plan_for(one, h200, DType::f32, "chunked_cp1"), one, h200, true) == 1);
  // "_wgmma" forces the passes onto warpgroup wgmma (the planner's choice here anyway), after
  // the stages too; refused where the whole-V tile at K = V = 128 or sm_90a is missing.
  for (const char* mode : {"chunked_cp_wgmma", "chunked_cp7_s3_wgmma"}) {
    CAPTURE(mode);
    const Plan forced = plan_for(many, h200, DType::f32, mode);
    check_cp_plan(forced, many, h200);
    CHECK(forced.mode.ends_with("_wgmma"));
    bool said = false;
    for (const std::string& r : forced.reasons)
      said |= r.find("forced by options.force_mode") != std::string::npos;
    CHECK(said);
  }
  for (const auto& [shape, device] :
       {std::pair{one, h200}, std::pair{many, DeviceLimits::for_name("b200")},
        std::pair{many, DeviceLimits::for_arch(Arch{8, 0})}}) {
    CAPTURE(device.name);
    try {
      plan_for(shape, device, DType::f32, "chunked_cp_wgmma");
      FAIL("planned");
    } catch (const PlanError& e) {
      CHECK(std::string(e.what()).find("chunked_cp_wgmma") != std::string::npos);
      CHECK(std::string(e.what()).find("K = V = 128") != std::string::npos);
    }
  }
  CHECK_THROWS_AS(plan_for(many, h200, DType::f32, "chunked_cp_s2_wgmma"), PlanError);
  // "chunked" stays sequential where auto would take the context-parallel path.
  const Shapes few{131072, 1, 16, 16, 128, 128};
  CHECK(plan_for(few, h200).launches.size() == 4);
  CHECK(plan_for(few, h200, DType::f32, "chunked").launches.size() == 2);
  for (const char* bad : {"chunked_cp0", "chunked_cpx", "chunked_cp-3", "chunked_cp9999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(plan_for(few, h200, DType::f32, bad), InvalidArgument);
  }
  const auto plan_error = [&](const Shapes& s, const DeviceLimits& d) {
    try {
      plan_for(s, d, DType::f32, "chunked_cp");
    } catch (const PlanError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(plan_error({131072, 1, 2, 2, 256, 256}, h200).find("K = 256 > 128") != std::string::npos);
  CHECK(plan_error({131072, 1, 2, 2, 128, 128}, DeviceLimits::for_arch(Arch{8, 6}))
            .find("no state tile of 64 or 128 rows fits") != std::string::npos);
}

TEST_CASE("gdn_prefill plans a K-major pool (V contiguous) as the state_layout=kv kernels") {
  if (!family_registered()) return;
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  struct Case {
    Shapes shapes;
    const char* force;
    std::int64_t checkpoint_every;
  };
  // The fused kernel, the sequential chunked path (narrow and wide state tiles, checkpoints),
  // and the context-parallel path (its segment and resume passes touch the pool).
  for (const Case& c :
       {Case{{1000, 7, 4, 8, 128, 128}, "bv64", 0}, Case{{1000, 7, 4, 8, 128, 128}, "bv16", 128},
        Case{{1000, 7, 4, 8, 128, 128}, "chunked", 0},
        Case{{1000, 7, 4, 8, 64, 256}, "chunked_bv32", 64},
        Case{{4096, 3, 16, 32, 128, 128}, "chunked_bv128", 256},
        Case{{131072, 1, 16, 16, 128, 128}, "", 0},
        Case{{131072, 1, 16, 16, 128, 128}, "chunked_cp", 1024}}) {
    for (DType state : {DType::f32, DType::bf16}) {
      CAPTURE(c.force);
      CAPTURE(c.checkpoint_every);
      CAPTURE(to_string(state));
      const Plan vk = plan_for(c.shapes, h200, state, c.force, false, c.checkpoint_every);
      const Plan kv = plan_for(c.shapes, h200, state, c.force, true, c.checkpoint_every);
      REQUIRE(kv.launches.size() == vk.launches.size());
      CHECK(kv.mode == vk.mode);
      for (std::size_t i = 0; i < kv.launches.size(); ++i) {
        const KernelSpec& a = vk.launches[i].spec;
        const KernelSpec& b = kv.launches[i].spec;
        CAPTURE(b.str());
        CHECK_FALSE(a.has("state_layout"));
        const bool touches_state = a.family == "gdn_prefill" || a.family == "gdn_prefill_state" ||
                                   a.family == "gdn_prefill_state_cp";
        if (touches_state) {
          CHECK(b.get("state_layout") == "kv");
          // Everything else as for the V-major pool: the layout is one more parameter.
          // (In declaration order: the sequential state kernel declares its stages after the
          // layout, both state kernels statep.)
          std::string expected = a.str();
          std::size_t at = expected.find(",statep=");
          if (at == std::string::npos) at = expected.find('@');
          const std::size_t stages = expected.find(",stages=");
          if (a.family == "gdn_prefill_state" && stages != std::string::npos) at = stages;
          expected.insert(at, ",state_layout=kv");
          CHECK(b.str() == expected);
        } else {
          CHECK(b == a);  // the chunk kernel and the scan never touch the pool
        }
        CHECK(kv.launches[i].shape.grid.x == vk.launches[i].shape.grid.x);
        CHECK(kv.launches[i].shape.dynamic_smem == vk.launches[i].shape.dynamic_smem);
      }
      CHECK(kv.explain().find("state layout kv") != std::string::npos);
      CHECK(vk.explain().find("state layout kv") == std::string::npos);
    }
  }
}

TEST_CASE("gdn_prefill: other state strides, and final states or checkpoints in another layout") {
  const DeviceLimits device = DeviceLimits::for_arch(Arch{9, 0});
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  const std::int64_t t = 300, n = 3, h = 2, hv = 4, k = 128, v = 64;
  const TensorView q = view(DType::bf16, {t, h, k}), vv = view(DType::bf16, {t, hv, v});
  const GdnGates gates = GdnGates::raw(view(DType::f32, {t, hv}), view(DType::f32, {t, hv}),
                                       view(DType::f32, {hv}), view(DType::f32, {hv}));
  const TensorView cu = view(DType::i32, {n + 1}), idx = view(DType::i32, {n});
  const TensorView out = view(DType::bf16, {t, hv, v});
  const auto v_major = [&](std::int64_t rows) { return view(DType::f32, {rows, hv, v, k}); };
  const auto k_major = [&](std::int64_t rows) {
    return TensorView::strided(nullptr, DType::f32, {rows, hv, v, k}, {hv * v * k, v * k, 1, v});
  };
  const auto plan_error = [&](const TensorView& state, const GdnPrefillOptions& o) {
    return error_of(
        [&] { plan_gdn_prefill(q, q, vv, gates, cu, state, idx, TensorView{}, out, o, device); });
  };
  const auto has = [](const std::string& m, const char* part) {
    CAPTURE(m);
    CHECK_MESSAGE(m.find(part) != std::string::npos, part);
  };
  CHECK(plan_error(k_major(8), {}).empty());
  // A padded slot stride is fine in either layout.
  TensorView padded = k_major(8);
  padded.strides[0] += 64;
  CHECK(plan_error(padded, {}).empty());
  for (int variant = 0; variant < 3; ++variant) {
    TensorView bad = k_major(8);
    if (variant == 0) bad.strides[3] = v + 4;      // padded K lines
    if (variant == 1) bad.strides[1] = 2 * v * k;  // heads apart
    if (variant == 2) {
      bad = v_major(8);
      bad.strides[2] = k + 8;  // padded V rows
    }
    const std::string m = plan_error(bad, {});
    has(m, "state has strides that are not an accepted layout");
    has(m, bad.str().c_str());
    has(m, "[*, 8192, 128, 1] (K contiguous)");
    has(m, "[*, 8192, 1, 64] (V contiguous");
  }
  // The final states and the checkpoints follow the pool's layout.
  alignas(16) static unsigned char marker[16];
  GdnPrefillOptions final_vk;
  final_vk.final_state = TensorView::contiguous(marker, DType::f32, {n, hv, v, k});
  CHECK(plan_error(v_major(8), final_vk).empty());
  has(plan_error(k_major(8), final_vk),
      "options.final_state is K contiguous but state is V contiguous");
  GdnPrefillOptions final_kv;
  final_kv.final_state =
      TensorView::strided(marker, DType::f32, {n, hv, v, k}, {hv * v * k, v * k, 1, v});
  CHECK(plan_error(k_major(8), final_kv).empty());
  has(plan_error(v_major(8), final_kv),
      "options.final_state is V contiguous but state is K contiguous");
  GdnPrefillOptions ckpt;
  ckpt.checkpoint_every_n_tokens = 128;
  ckpt.checkpoint_cu_starts = view(DType::i64, {n + 1});
  ckpt.state_checkpoints = v_major(5);
  has(plan_error(k_major(8), ckpt),
      "options.state_checkpoints is K contiguous but state is V contiguous");
  ckpt.state_checkpoints = k_major(5);
  CHECK(plan_error(k_major(8), ckpt).empty());
  ckpt.state_checkpoints.strides[2] = 2;
  has(plan_error(k_major(8), ckpt),
      "options.state_checkpoints has strides that are not an accepted layout");
}

TEST_CASE("gdn_prefill planner: a caller's workspace too small for the context-parallel path") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  const std::int64_t t = 65536, n = 1, h = 4, hv = 4, k = 128, v = 128;
  const auto view = [](DType d, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, d, shape);
  };
  alignas(256) static unsigned char marker[256];
  const auto plan_with = [&](std::int64_t bytes, const std::string& force) {
    GdnPrefillOptions options;
    options.force_mode = force;
    if (bytes > 0) options.workspace = TensorView::contiguous(marker, DType::u8, {bytes});
    return plan_gdn_prefill(
        view(DType::bf16, {t, h, k}), view(DType::bf16, {t, h, k}), view(DType::bf16, {t, hv, v}),
        GdnGates::precomputed(view(DType::f32, {t, hv}), view(DType::f32, {t, hv})),
        view(DType::i32, {n + 1}), view(DType::f32, {n, hv, v, k}), view(DType::i32, {n}),
        TensorView{}, view(DType::f32, {t, hv, v}), options, h200);
  };
  const Plan own = plan_with(0, "");
  REQUIRE(own.launches.size() == 4);
  // The bytes the plan reports are what it needs: exactly that much keeps the path.
  std::int64_t need = 0;
  for (const std::string& r : own.reasons) {
    if (r.starts_with("workspace for T = ")) need = std::stoll(r.substr(r.find(": ") + 2));
  }
  CHECK(need > gdn_prefill_workspace_bytes(t, hv));
  CHECK(plan_with(need, "").launches.size() == 4);
  const Plan small = plan_with(need - 1, "");
  CHECK(small.launches.size() == 2);
  bool said = false;
  for (const std::string& r : small.reasons) {
    said |= r.find("options.workspace holds " + std::to_string(need - 1)) != std::string::npos;
  }
  CHECK(said);
  CHECK_THROWS_AS(plan_with(need - 1, "chunked_cp"), PlanError);
}

}  // namespace kjit
