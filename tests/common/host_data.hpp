// SPDX-License-Identifier: Apache-2.0
// Host-side data for the GPU suite: typed random buffers and their comparison against a float64
// reference, shared by the op tests so that every test measures error the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kjit/types.hpp"
#include "support/numeric.hpp"

namespace kjit::test {

using Bytes = std::vector<unsigned char>;

/// `count` elements of `dtype` drawn from N(shift, scale^2), rounded to the dtype.
template <typename Rng>
Bytes random_bytes(Rng& rng, DType dtype, std::int64_t count, double scale, double shift = 0) {
  Bytes host(static_cast<std::size_t>(count) * size_of(dtype));
  std::normal_distribution<double> normal(0.0, 1.0);
  for (std::int64_t i = 0; i < count; ++i) {
    support::store_from_double(host.data(), dtype, i, normal(rng) * scale + shift);
  }
  return host;
}

/// How far `got` is from `ref`: ||got - ref|| / ||ref||, the largest absolute difference, and
/// how many elements of `got` are not finite (poison left behind included).
struct Diff {
  double rel = 0, max_abs = 0;
  std::int64_t non_finite = 0;
};

inline Diff compare(const Bytes& got, const Bytes& ref, DType dtype) {
  const auto n = static_cast<std::int64_t>(got.size() / size_of(dtype));
  double d2 = 0, r2 = 0;
  Diff e;
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = support::load_as_double(got.data(), dtype, i);
    const double b = support::load_as_double(ref.data(), dtype, i);
    if (!std::isfinite(a)) ++e.non_finite;
    d2 += (a - b) * (a - b);
    r2 += b * b;
    e.max_abs = std::max(e.max_abs, std::abs(a - b));
  }
  e.rel = std::sqrt(d2 / std::max(r2, 1e-300));
  return e;
}

}  // namespace kjit::test
