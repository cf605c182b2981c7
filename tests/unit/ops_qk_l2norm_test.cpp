// SPDX-License-Identifier: Apache-2.0
// qk_l2norm on the CPU: the float64 reference against the formula, plans legal on every known
// device for boundary shapes (T = 1, odd H, q alone, T = 2^31 - 1 planning only), the vector
// width follows alignment, argument errors name the argument, and the catalog lists the op.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "kjit/plan.hpp"
#include "ops/qk_l2norm/family.hpp"

namespace kjit {
namespace {

// Planning never dereferences pointers: fake, 4 KiB-aligned addresses stand in for memory.
void* fake(std::uintptr_t offset) { return reinterpret_cast<void*>(0x7f0000000000 + offset); }

struct Views {
  TensorView q, k, q_out, k_out;
};

Views views(DType dtype, std::int64_t t, std::int64_t hq, std::int64_t hk, std::int64_t d) {
  Views v;
  v.q = TensorView::contiguous(fake(0), dtype, {t, hq, d});
  v.q_out = TensorView::contiguous(fake(std::uintptr_t{1} << 40), dtype, {t, hq, d});
  if (hk > 0) {
    v.k = TensorView::contiguous(fake(std::uintptr_t{2} << 40), dtype, {t, hk, d});
    v.k_out = TensorView::contiguous(fake(std::uintptr_t{3} << 40), dtype, {t, hk, d});
  }
  return v;
}

Plan plan_of(const Views& v, const DeviceLimits& limits = DeviceLimits::for_arch(Arch{9, 0}),
             const QkL2NormOptions& options = {}) {
  return plan_qk_l2norm(v.q, v.k, v.q_out, v.k_out, options, limits);
}

void require_legal_plan(const Plan& plan) {
  INFO(plan.explain());
  for (const PlannedLaunch& launch : plan.launches) {
    CHECK(launch.shape.grid.y == 1);
    CHECK(launch.shape.grid.z == 1);
    for (const LimitCheck& check : check_launch(launch.shape, plan.device)) {
      REQUIRE_MESSAGE(check.ok(), check.limit, " requested ", check.requested, " allowed ",
                      check.allowed);
    }
  }
}

std::string error_of(const Views& v, const QkL2NormOptions& options = {}) {
  try {
    plan_of(v, DeviceLimits::for_arch(Arch{9, 0}), options);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_CASE("qk_l2norm reference follows x / sqrt(sum x^2 + eps)") {
  const std::vector<double> x = {3.0, -4.0, 0.0, 12.0};
  std::vector<double> out(x.size());
  ops::l2norm::reference_row(x.data(), out.data(), 4, 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(out[i] == doctest::Approx(x[i] / 13.0));
  // eps inside the root: a zero row stays zero, a tiny one is damped, not blown up.
  const std::vector<double> zero(8, 0.0);
  std::vector<double> zero_out(8, 1.0);
  ops::l2norm::reference_row(zero.data(), zero_out.data(), 8, 1e-6);
  for (double value : zero_out) CHECK(value == 0.0);
  const std::vector<double> tiny = {1e-4, 0.0};
  std::vector<double> tiny_out(2);
  ops::l2norm::reference_row(tiny.data(), tiny_out.data(), 2, 1e-6);
  CHECK(tiny_out[0] == doctest::Approx(1e-4 / std::sqrt(1e-8 + 1e-6)));
  // Random rows: unit norm when eps = 0.
  std::vector<double> row(128), normed(128);
  for (std::size_t i = 0; i < row.size(); ++i) row[i] = std::sin(0.37 * static_cast<double>(i));
  ops::l2norm::reference_row(row.data(), normed.data(), 128, 0.0);
  double norm = 0;
  for (double value : normed) norm += value * value;
  CHECK(norm == doctest::Approx(1.0).epsilon(1e-12));
}

TEST_CASE("qk_l2norm plans are legal on every known device") {
  for (const Arch arch : DeviceLimits::known_archs()) {
    const DeviceLimits limits = DeviceLimits::for_arch(arch);
    CAPTURE(arch.str());
    for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
      for (std::int64_t d : {8, 64, 128, 136, 256, 512}) {
        for (std::int64_t t :
             {std::int64_t{1}, std::int64_t{2}, std::int64_t{4097}, std::int64_t{1} << 20}) {
          for (auto [hq, hk] :
               {std::pair{1, 0}, std::pair{7, 3}, std::pair{32, 32}, std::pair{48, 16}}) {
            CAPTURE(t);
            CAPTURE(d);
            CAPTURE(hq);
            const Plan plan = plan_of(views(dtype, t, hq, hk, d), limits);
            REQUIRE(plan.launches.size() == 1);
            require_legal_plan(plan);
            CHECK(plan.launches[0].shape.block.count() == 256);
          }
        }
      }
    }
    // T = 2^31 - 1 tokens of 64 + 64 heads (planning only: 2^38 rows): still one legal 1-D grid.
    const Plan huge = plan_of(views(DType::bf16, 0x7FFFFFFF, 64, 64, 128), limits);
    require_legal_plan(huge);
    CHECK(huge.launches[0].shape.grid.x <= limits.max_grid_dim[0]);
  }
}

TEST_CASE("qk_l2norm picks 16-byte vectors when aligned, narrower ones otherwise") {
  Views v = views(DType::bf16, 64, 16, 16, 128);
  Plan plan = plan_of(v);
  CHECK(plan.launches[0].spec.str() == "qk_l2norm:dtype=bf16,head_dim=128,vec=8,lanes=16@sm_90");
  // A head stride of 132 elements (264 bytes): 8-byte vectors.
  v.k = TensorView::strided(v.k.data, DType::bf16, {64, 16, 128}, {16 * 132, 132, 1});
  CHECK(plan_of(v).launches[0].spec.get_int("vec") == 4);
  // An odd element offset: scalar accesses.
  v.q_out.data = static_cast<char*>(v.q_out.data) + 2;
  CHECK(plan_of(v).launches[0].spec.get_int("vec") == 1);
  CHECK(plan_of(v).launches[0].spec.get_int("lanes") == 32);
  // f32, D = 64: 4-element vectors, 16 lanes.
  plan = plan_of(views(DType::f32, 3, 5, 0, 64));
  CHECK(plan.launches[0].spec.get_int("vec") == 4);
  CHECK(plan.launches[0].spec.get_int("lanes") == 16);
  // In place (outputs are the inputs) plans like out of place.
  Views in_place = views(DType::f16, 9, 3, 1, 256);
  in_place.q_out = in_place.q;
  in_place.k_out = in_place.k;
  CHECK(plan_of(in_place).launches[0].spec.get_int("vec") == 8);
  // No rows: nothing launched.
  CHECK(plan_of(views(DType::bf16, 0, 4, 4, 128)).launches.empty());
}

TEST_CASE("qk_l2norm argument errors name the argument, its value and what is accepted") {
  Views v = views(DType::bf16, 4, 2, 2, 128);
  CHECK(error_of(v).empty());

  Views bad = v;
  bad.q = TensorView::contiguous(v.q.data, DType::f64, {4, 2, 128});
  CHECK(contains(error_of(bad), "qk_l2norm: q is f64[4, 2, 128]"));
  CHECK(contains(error_of(bad), "f16, bf16 or f32"));

  bad = v;
  bad.k = TensorView::contiguous(v.k.data, DType::f16, {4, 2, 128});
  CHECK(contains(error_of(bad), "k is f16"));
  CHECK(contains(error_of(bad), "must be bf16"));

  bad = views(DType::bf16, 4, 2, 2, 100);
  CHECK(contains(error_of(bad), "D = 100 is not supported; accepted: a multiple of 8 in 8..512"));
  bad = views(DType::bf16, 4, 2, 2, 1024);
  CHECK(contains(error_of(bad), "D = 1024"));

  bad = v;
  bad.q = TensorView::contiguous(v.q.data, DType::bf16, {4, 256});
  CHECK(contains(error_of(bad), "expected rank 3: [T, H, D]"));

  bad = v;
  bad.k = TensorView::contiguous(v.k.data, DType::bf16, {5, 2, 128});
  CHECK(contains(error_of(bad), "k is bf16[5, 2, 128]"));
  CHECK(contains(error_of(bad), "expected T = 4"));

  bad = v;
  bad.q_out = TensorView::contiguous(v.q_out.data, DType::bf16, {4, 3, 128});
  CHECK(contains(error_of(bad), "q_out"));
  CHECK(contains(error_of(bad), "expected H = 2"));

  bad = v;
  bad.q = TensorView::strided(v.q.data, DType::bf16, {4, 2, 128}, {512, 256, 2});
  CHECK(contains(error_of(bad), "last-dimension stride is 2; accepted: 1"));

  bad = v;
  bad.q.data = static_cast<char*>(v.q.data) + 1;
  CHECK(contains(error_of(bad), "must be aligned to its element size (2 bytes)"));

  bad = v;
  bad.q_out = TensorView::strided(v.q_out.data, DType::bf16, {4, 2, 128}, {128, 64, 1});
  CHECK(contains(error_of(bad), "q_out"));
  CHECK(contains(error_of(bad), "rows overlap"));
  bad.q_out = TensorView::strided(v.q_out.data, DType::bf16, {4, 2, 128}, {0, 128, 1});
  CHECK(contains(error_of(bad), "rows overlap"));
  // Padded and transposed (head-major) output rows are fine.
  bad.q_out = TensorView::strided(v.q_out.data, DType::bf16, {4, 2, 128}, {1000, 200, 1});
  CHECK(error_of(bad).empty());
  bad.q_out = TensorView::strided(v.q_out.data, DType::bf16, {4, 2, 128}, {128, 512, 1});
  CHECK(error_of(bad).empty());

  bad = v;
  bad.q_out = TensorView::strided(v.q.data, DType::bf16, {4, 2, 128}, {512, 256, 1});
  CHECK(contains(error_of(bad), "starts at q's address with other strides"));

  bad = v;
  bad.k = TensorView{};
  CHECK(contains(error_of(bad), "k is absent"));

  bad = v;
  bad.q.data = nullptr;
  CHECK(contains(error_of(bad), "data pointer is null"));

  QkL2NormOptions options;
  options.eps = -1.0f;
  CHECK(contains(error_of(v, options), "options.eps = -1; accepted: a finite value >= 0"));
  options.eps = std::numeric_limits<float>::quiet_NaN();
  CHECK(contains(error_of(v, options), "options.eps"));
}

TEST_CASE("qk_l2norm's Problem is its plan memo key: eps and addresses are not in it") {
  using ops::l2norm::Family;
  const Views v = views(DType::bf16, 4, 2, 2, 128);
  QkL2NormOptions a, b;
  b.eps = 1e-5f;
  const auto pa = Family::check({&v.q, &v.k, &v.q_out, &v.k_out, &a});
  const auto pb = Family::check({&v.q, &v.k, &v.q_out, &v.k_out, &b});
  CHECK(std::memcmp(&pa, &pb, sizeof pa) == 0);
  const auto planned = Family::plan(pa, DeviceLimits::for_arch(Arch{9, 0}));
  CHECK(planned.choice.vec == planned.plan.launches[0].spec.get_int("vec"));
  CHECK(planned.choice.lanes == planned.plan.launches[0].spec.get_int("lanes"));
  const QkL2NormParams params =
      Family::params({&v.q, &v.k, &v.q_out, &v.k_out, &b}, pa, planned.choice, nullptr);
  CHECK(params.q_rows == 8);
  CHECK(params.rows == 16);
  CHECK(params.eps == 1e-5f);
  CHECK(params.k_head_stride == 128);
}

TEST_CASE("the op catalog lists qk_l2norm and plans it from shape values") {
  const OpInfo& op = find_op("qk_l2norm");
  ShapeValues values =
      complete_shape_values(op, {{"tokens", "1"}, {"heads", "7"}, {"head_dim", "128"}}, true);
  CHECK(values.at("k_heads") == "7");
  Plan plan = plan_from_shape(op, values, DeviceLimits::for_arch(Arch{9, 0}));
  REQUIRE(plan.launches.size() == 1);
  require_legal_plan(plan);
  values["k_heads"] = "0";
  values["in_place"] = "1";
  values["dtype"] = "f32";
  plan = plan_from_shape(op, values, DeviceLimits::for_arch(Arch{8, 0}));
  CHECK(plan.launches[0].spec.str() == "qk_l2norm:dtype=f32,head_dim=128,vec=4,lanes=32@sm_80");
  values["head_dim"] = "1024";
  CHECK_THROWS_AS(plan_from_shape(op, values, DeviceLimits::for_arch(Arch{9, 0})), InvalidArgument);
}

}  // namespace
}  // namespace kjit
