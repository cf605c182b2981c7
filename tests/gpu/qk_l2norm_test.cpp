// SPDX-License-Identifier: Apache-2.0
// qk_l2norm on the GPU against the float64 reference: random rows of every dtype and several
// head dims, q and k with different head counts, q alone, padded and interleaved (packed qkv)
// strides, in place, misaligned views (narrower accesses), T = 1 and a grid-strided T. Outputs
// are poisoned (0xFF = NaN) first, and whatever lies between output rows must stay poisoned.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/host_data.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "ops/qk_l2norm/family.hpp"

namespace kjit {
namespace {

/// A host tensor and its device copy (the same bytes, padding and offset included).
struct Mirrored {
  test::HostTensor host;
  std::unique_ptr<test::DeviceBuffer> device;

  explicit Mirrored(test::HostTensor h) : host(std::move(h)) {
    device = std::make_unique<test::DeviceBuffer>(host.storage.size());
  }
  void upload() { device->upload(host.storage.data(), host.storage.size()); }
  void download() { device->download(host.storage.data(), host.storage.size()); }
  TensorView device_view() {
    TensorView v = host.view();
    v.data = static_cast<unsigned char*>(device->get()) + host.offset_bytes;
    return v;
  }
  /// Element index (from data()) of (t, h, i).
  std::int64_t at(std::int64_t t, std::int64_t h, std::int64_t i) const {
    return t * host.strides[0] + h * host.strides[1] + i * host.strides[2];
  }
};

struct Layout {
  std::int64_t tokens = 1, q_heads = 1, k_heads = 0, head_dim = 128;
  /// Extra elements per head row and per token row of every tensor.
  std::int64_t head_pad = 0, token_pad = 0;
  /// Elements the data pointers are shifted by (1: misaligned, scalar accesses).
  std::int64_t offset = 0;
  bool in_place = false;
};

test::HostTensor make(DType dtype, const Layout& l, std::int64_t heads) {
  const std::int64_t head_stride = l.head_dim + l.head_pad;
  const std::int64_t token_stride = heads * head_stride + l.token_pad;
  return test::HostTensor(dtype, {l.tokens, heads, l.head_dim}, {token_stride, head_stride, 1},
                          l.offset);
}

/// Relative L2 error allowed: the output's rounding (bf16 2^-9, f16 2^-12 per element), and for
/// f32 the f32 sum over up to 512 elements and rsqrt's approximation.
double tolerance(DType dtype) {
  return dtype == DType::f32 ? 1e-5 : dtype == DType::f16 ? 2e-3 : 1.6e-2;
}

/// Runs one call and checks every output row against the reference and the padding bytes.
void check_case(DType dtype, const Layout& l, float eps, std::uint64_t seed) {
  CAPTURE(to_string(dtype));
  CAPTURE(l.tokens);
  CAPTURE(l.q_heads);
  CAPTURE(l.k_heads);
  CAPTURE(l.head_dim);
  CAPTURE(l.head_pad);
  CAPTURE(l.offset);
  CAPTURE(l.in_place);
  test::Rng rng(seed);
  Mirrored q(make(dtype, l, l.q_heads));
  q.host.fill(rng);
  const test::HostTensor q_in = q.host;
  std::unique_ptr<Mirrored> k, q_out, k_out;
  test::HostTensor k_in(dtype, {0});
  if (l.k_heads > 0) {
    k = std::make_unique<Mirrored>(make(dtype, l, l.k_heads));
    // k rows of another scale than q's, and one all-zero row (eps > 0 keeps it zero; with
    // eps = 0 it would be 0 * inf = NaN, in the reference too).
    k->host.fill(rng);
    for (std::int64_t i = 0; i < k->host.elements(); ++i) k->host.set(i, k->host.get(i) * 40.0);
    if (eps > 0) {
      for (std::int64_t i = 0; i < l.head_dim; ++i) k->host.set(k->at(0, 0, i), 0.0);
    }
    k_in = k->host;
  }
  q.upload();
  if (k) k->upload();
  // Outputs: poisoned copies of the layout, unless in place.
  auto poisoned = [&](std::int64_t heads) {
    auto out = std::make_unique<Mirrored>(make(dtype, l, heads));
    std::fill(out->host.storage.begin(), out->host.storage.end(), 0xFF);
    out->upload();
    return out;
  };
  if (!l.in_place) {
    q_out = poisoned(l.q_heads);
    if (k) k_out = poisoned(l.k_heads);
  }
  const TensorView qv = q.device_view();
  const TensorView kv = k ? k->device_view() : TensorView{};
  const TensorView qov = l.in_place ? qv : q_out->device_view();
  const TensorView kov = l.in_place ? kv : (k_out ? k_out->device_view() : TensorView{});
  QkL2NormOptions options;
  options.eps = eps;
  options.runtime = &test::runtime();
  const Plan plan =
      plan_qk_l2norm(qv, kv, qov, kov, options, test::runtime().device_limits(test::device()));
  INFO(plan.explain());
  qk_l2norm(qv, kv, qov, kov, options, test::stream());
  test::sync();

  auto verify = [&](const test::HostTensor& in, Mirrored& out, std::int64_t heads) {
    out.download();
    std::vector<bool> written(static_cast<std::size_t>(out.host.elements()), false);
    std::vector<double> x(static_cast<std::size_t>(l.head_dim));
    std::vector<double> ref(x.size());
    double d2 = 0, r2 = 0;
    std::int64_t non_finite = 0;
    for (std::int64_t t = 0; t < l.tokens; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t i = 0; i < l.head_dim; ++i) {
          x[static_cast<std::size_t>(i)] =
              support::load_as_double(in.storage.data() + in.offset_bytes, dtype, out.at(t, h, i));
        }
        ops::l2norm::reference_row(x.data(), ref.data(), l.head_dim, eps);
        for (std::int64_t i = 0; i < l.head_dim; ++i) {
          const std::int64_t e = out.at(t, h, i);
          written[static_cast<std::size_t>(e)] = true;
          const double got = out.host.get(e);
          const double want = ref[static_cast<std::size_t>(i)];
          if (!std::isfinite(got)) ++non_finite;
          d2 += (got - want) * (got - want);
          r2 += want * want;
        }
      }
    }
    CHECK(non_finite == 0);
    CHECK(std::sqrt(d2 / std::max(r2, 1e-300)) <= tolerance(dtype));
    if (!l.in_place) {
      // Padding between rows (and the slack after them) was never written.
      std::int64_t touched = 0;
      const std::size_t esize = size_of(dtype);
      for (std::size_t e = 0; e < written.size(); ++e) {
        if (written[e]) continue;
        for (std::size_t b = 0; b < esize; ++b) {
          touched += out.host.data()[e * esize + b] != 0xFF ? 1 : 0;
        }
      }
      CHECK(touched == 0);
    }
  };
  verify(q_in, l.in_place ? q : *q_out, l.q_heads);
  if (k) verify(k_in, l.in_place ? *k : *k_out, l.k_heads);
}

TEST_CASE("gpu qk_l2norm: every dtype and head dim, q and k in one launch") {
  const std::uint64_t seed = test::fresh_seed();
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (std::int64_t d : {8, 64, 128, 136, 256, 512}) {
      Layout l;
      l.tokens = 37;
      l.q_heads = 5;
      l.k_heads = 3;
      l.head_dim = d;
      check_case(dtype, l, 1e-6f, seed + static_cast<std::uint64_t>(d));
    }
  }
}

TEST_CASE("gpu qk_l2norm: T = 1, q alone, odd heads, eps") {
  const std::uint64_t seed = test::fresh_seed();
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    Layout l;
    l.tokens = 1;
    l.q_heads = 7;
    l.k_heads = 0;
    check_case(dtype, l, 1e-6f, seed);
    l.k_heads = 1;
    check_case(dtype, l, 0.0f, seed + 1);
    l.tokens = 3;
    l.q_heads = 1;
    l.k_heads = 7;
    check_case(dtype, l, 0.5f, seed + 2);
  }
}

TEST_CASE("gpu qk_l2norm: padded and interleaved strides, misaligned, in place") {
  const std::uint64_t seed = test::fresh_seed();
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    for (bool in_place : {false, true}) {
      Layout l;
      l.tokens = 129;
      l.q_heads = 16;
      l.k_heads = 4;
      l.in_place = in_place;
      l.head_pad = 8;  // still 16-byte rows for 16-bit dtypes
      l.token_pad = 24;
      check_case(dtype, l, 1e-6f, seed);
      l.head_pad = 4;  // 8-byte vectors (16-bit), 16-byte (f32)
      check_case(dtype, l, 1e-6f, seed + 1);
      l.head_pad = 1;  // element-aligned rows only: scalar accesses
      l.offset = 1;
      check_case(dtype, l, 1e-6f, seed + 2);
    }
  }
}

TEST_CASE("gpu qk_l2norm: more rows than the grid, each block strides over rows") {
  const std::uint64_t seed = test::fresh_seed();
  Layout l;
  l.tokens = 1 << 15;
  l.q_heads = 16;
  l.k_heads = 16;
  const Plan plan = [&] {
    const TensorView q =
        TensorView::contiguous(reinterpret_cast<void*>(0x10000), DType::bf16, {l.tokens, 16, 128});
    const TensorView k = TensorView::contiguous(reinterpret_cast<void*>(0x10000000), DType::bf16,
                                                {l.tokens, 16, 128});
    return plan_qk_l2norm(q, k, q, k, {}, test::runtime().device_limits(test::device()));
  }();
  INFO(plan.explain());
  // 2^20 rows at 16 lanes: 65536 blocks needed, fewer launched.
  CHECK(plan.launches[0].shape.grid.x < 65536);
  check_case(DType::bf16, l, 1e-6f, seed);
}

TEST_CASE("gpu qk_l2norm: bad arguments fail before anything is launched") {
  test::DeviceBuffer buffer(4096);
  const TensorView q = TensorView::contiguous(buffer.get(), DType::bf16, {2, 2, 100});
  CHECK_THROWS_WITH_AS(qk_l2norm(q, TensorView{}, q, TensorView{}, {}, test::stream()),
                       doctest::Contains("D = 100 is not supported"), InvalidArgument);
}

}  // namespace
}  // namespace kjit
