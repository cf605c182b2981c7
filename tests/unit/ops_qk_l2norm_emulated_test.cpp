// SPDX-License-Identifier: Apache-2.0
// The qk_l2norm kernel template compiled as host C++ (tests/common/cuda_warp_emulation.hpp: a
// block's threads at once, shuffles at a block barrier) and run on the parameters the op builds
// for host tensors, against the float64 reference: 16-, 8-byte and scalar accesses, rows of
// fewer vectors than lanes (D = 136), several vectors per lane (D = 512, scalar D = 128), q and
// k with different head counts, in place, and a grid smaller than the rows (grid-stride loop).
// Bytes between output rows must stay untouched. Indexing and arithmetic, not races.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/host_data.hpp"
#include "kjit/device.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "kjit/types.hpp"
#include "ops/qk_l2norm/family.hpp"
#include "support/numeric.hpp"
// clang-format off
#include "common/cuda_warp_emulation.hpp"
// clang-format on
#include "templates/qk_l2norm/qk_l2norm.cuh"

namespace kjit {
namespace {

using Host = test::HostTensor;

struct Case {
  DType dtype = DType::bf16;
  std::int64_t tokens = 5, q_heads = 3, k_heads = 2, head_dim = 128;
  std::int64_t head_pad = 0, offset = 0;
  bool in_place = false;
  /// What the planner must choose for these views (the instantiation run below).
  int vec = 8, lanes = 16;
};

Host make(const Case& c, std::int64_t heads) {
  const std::int64_t head_stride = c.head_dim + c.head_pad;
  return Host(c.dtype, {c.tokens, heads, c.head_dim},
              {heads * head_stride + 3 * c.head_pad, head_stride, 1}, c.offset);
}

template <typename T, int kHeadDim, int kVec, int kLanes>
void run_case(const Case& c) {
  CAPTURE(to_string(c.dtype));
  CAPTURE(c.head_dim);
  CAPTURE(c.in_place);
  std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(c.head_dim));
  Host q = make(c, c.q_heads), k = make(c, c.k_heads);
  q.fill(rng);
  k.fill(rng);
  const Host q_in = q, k_in = k;
  Host q_out = q, k_out = k;
  if (!c.in_place) {
    std::fill(q_out.storage.begin(), q_out.storage.end(), 0xFF);
    std::fill(k_out.storage.begin(), k_out.storage.end(), 0xFF);
  }
  Host& qo = c.in_place ? q : q_out;
  Host& ko = c.in_place ? k : k_out;
  const TensorView qv = q.view(), kv = k.view(), qov = qo.view(), kov = ko.view();
  QkL2NormOptions options;
  options.eps = 1e-6f;
  using ops::l2norm::Family;
  const ops::l2norm::Args args{&qv, &kv, &qov, &kov, &options};
  const auto problem = Family::check(args);
  const auto planned = Family::plan(problem, DeviceLimits::for_arch(Arch{9, 0}));
  REQUIRE(planned.choice.vec == kVec);
  REQUIRE(planned.choice.lanes == kLanes);
  const QkL2NormParams params = Family::params(args, problem, planned.choice, nullptr);
  // Two blocks, whatever the plan says: each block walks several groups of rows.
  emulated_launch_threads(&qk_l2norm_kernel<T, kHeadDim, kVec, kLanes>, EmulatedDim3{2, 1, 1},
                          static_cast<unsigned>(kQkL2NormBlockThreads), params);

  const double tolerance = c.dtype == DType::f32 ? 1e-6 : c.dtype == DType::f16 ? 2e-3 : 1.6e-2;
  auto verify = [&](const Host& in, Host& out, std::int64_t heads) {
    std::vector<bool> written(static_cast<std::size_t>(out.elements()), false);
    std::vector<double> x(static_cast<std::size_t>(c.head_dim)), ref(x.size());
    double d2 = 0, r2 = 0;
    for (std::int64_t t = 0; t < c.tokens; ++t) {
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t base = t * out.strides[0] + h * out.strides[1];
        for (std::int64_t i = 0; i < c.head_dim; ++i) {
          x[static_cast<std::size_t>(i)] =
              support::load_as_double(in.storage.data() + in.offset_bytes, c.dtype, base + i);
        }
        ops::l2norm::reference_row(x.data(), ref.data(), c.head_dim, 1e-6);
        for (std::int64_t i = 0; i < c.head_dim; ++i) {
          written[static_cast<std::size_t>(base + i)] = true;
          const double got = out.get(base + i), want = ref[static_cast<std::size_t>(i)];
          REQUIRE(std::isfinite(got));
          d2 += (got - want) * (got - want);
          r2 += want * want;
        }
      }
    }
    CHECK(std::sqrt(d2 / r2) <= tolerance);
    for (std::size_t e = 0; e < written.size(); ++e) {
      if (written[e]) continue;
      // In place, a gap keeps its input; out of place, its poison.
      const std::int64_t i = static_cast<std::int64_t>(e);
      const double expected =
          c.in_place ? support::load_as_double(in.storage.data() + in.offset_bytes, c.dtype, i)
                     : 0.0;
      if (c.in_place) {
        CHECK(out.get(i) == expected);
      } else {
        CHECK(std::isnan(out.get(i)));
      }
    }
  };
  verify(q_in, qo, c.q_heads);
  verify(k_in, ko, c.k_heads);
}

TEST_CASE("emulated qk_l2norm kernel: 16-byte rows, q and k, in place") {
  for (bool in_place : {false, true}) {
    Case c;
    c.in_place = in_place;
    run_case<__nv_bfloat16, 128, 8, 16>(c);
    c.dtype = DType::f16;
    c.head_dim = 64;
    c.lanes = 8;
    run_case<__half, 64, 8, 8>(c);
  }
}

TEST_CASE("emulated qk_l2norm kernel: fewer vectors than lanes, several per lane") {
  Case c;
  c.dtype = DType::f16;
  c.head_dim = 136;  // 17 vectors of 8 on 32 lanes
  c.lanes = 32;
  run_case<__half, 136, 8, 32>(c);
  c.dtype = DType::f32;
  c.head_dim = 512;  // 128 vectors of 4: 4 per lane
  c.vec = 4;
  c.tokens = 3;
  run_case<float, 512, 4, 32>(c);
  c.head_dim = 8;  // 2 vectors: 2 lanes, 128 rows per block
  c.lanes = 2;
  c.tokens = 70;
  run_case<float, 8, 4, 2>(c);
}

TEST_CASE("emulated qk_l2norm kernel: padded and misaligned rows use narrower accesses") {
  Case c;
  c.head_pad = 4;  // 264-byte head stride: 8-byte vectors
  c.vec = 4;
  c.lanes = 32;
  run_case<__nv_bfloat16, 128, 4, 32>(c);
  c.head_pad = 1;
  c.offset = 1;  // element-aligned only: scalar accesses, 4 per lane
  c.vec = 1;
  c.in_place = true;
  run_case<__nv_bfloat16, 128, 1, 32>(c);
}

}  // namespace
}  // namespace kjit
