// SPDX-License-Identifier: Apache-2.0
// Host-side data for the GPU suite: typed random buffers and their comparison against a float64
// reference, shared by the op tests so that every test measures error the same way.
#pragma once

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
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

/// compare(), reported as "<name>: rel .., max abs .., non-finite .." and checked: every element
/// finite, the relative error at most `tolerance`.
inline Diff check_close(const char* name, const Bytes& got, const Bytes& ref, DType dtype,
                        double tolerance) {
  const Diff e = compare(got, ref, dtype);
  MESSAGE(std::string(name) << ": rel " << e.rel << ", max abs " << e.max_abs << ", non-finite "
                            << e.non_finite);
  CHECK(e.non_finite == 0);
  CHECK(e.rel <= tolerance);
  return e;
}

/// A host tensor with explicit strides (in elements) over storage of its own: 16-byte aligned
/// (operator new) plus `offset` elements (to misalign it on purpose), and 64 bytes of slack after
/// the last element that nothing reads or writes. Copies are deep. For kernel templates run on
/// the CPU (cuda_host_emulation.hpp) and their references.
struct HostTensor {
  DType dtype;
  std::vector<std::int64_t> shape, strides;
  Bytes storage;
  std::size_t offset_bytes = 0;

  HostTensor(DType d, std::vector<std::int64_t> s, std::vector<std::int64_t> st = {},
             std::int64_t offset = 0)
      : dtype(d), shape(std::move(s)), strides(std::move(st)) {
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
        strides[i] = strides[i + 1] * shape[i + 1];
      }
    }
    offset_bytes = static_cast<std::size_t>(offset) * size_of(dtype);
    storage.assign(static_cast<std::size_t>(elements()) * size_of(dtype) + offset_bytes + 64, 0);
  }
  unsigned char* data() { return storage.data() + offset_bytes; }
  /// Elements from the first to the last one the strides reach.
  std::int64_t elements() const {
    std::int64_t span = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * strides[i];
    return span;
  }
  double get(std::int64_t i) { return support::load_as_double(data(), dtype, i); }
  void set(std::int64_t i, double v) { support::store_from_double(data(), dtype, i, v); }
  /// Every element (gaps between strided rows included) drawn from N(0, 1).
  template <typename Rng>
  void fill(Rng& rng) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::int64_t i = 0; i < elements(); ++i) set(i, normal(rng));
  }
  TensorView view() {
    TensorView t;
    t.data = data();
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    for (int i = 0; i < t.rank; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    return t;
  }
};

/// How many elements of `got` are not within atol + rtol * |want| of `want` (a NaN is not);
/// the first three are reported as "<name>[i]: got .. want ..".
inline std::int64_t count_mismatches(const char* name, HostTensor& got, HostTensor& want,
                                     double atol, double rtol) {
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < got.elements(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w))) {
      if (bad++ < 3) MESSAGE(fmt::format("{}[{}]: got {} want {}", name, i, g, w));
    }
  }
  return bad;
}

using Rng = std::mt19937_64;

/// A fresh seed per call (KJIT_TEST_SEED fixes it for reproduction), recorded in doctest's
/// context so that every failure message prints it.
inline std::uint64_t fresh_seed() {
  static const char* fixed = std::getenv("KJIT_TEST_SEED");
  const std::uint64_t seed =
      fixed != nullptr ? std::strtoull(fixed, nullptr, 10)
                       : (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  MESSAGE("seed " << seed << " (rerun with KJIT_TEST_SEED=" << seed << ")");
  return seed;
}

}  // namespace kjit::test
