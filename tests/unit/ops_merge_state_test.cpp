// SPDX-License-Identifier: Apache-2.0
// merge_state on the CPU: plans for every boundary shape are legal on sm_90, the float64
// reference follows the formula, argument errors name the argument.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/merge_state.hpp"
#include "kjit/plan.hpp"
#include "ops/merge_state_reference.hpp"
#include "support/numeric.hpp"
#include "templates/merge_state/params.h"

namespace kjit {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Planning never dereferences pointers: a fake, 256-byte aligned address stands in for memory.
void* fake(std::uintptr_t offset = 0) { return reinterpret_cast<void*>(0x7f0000000000 + offset); }

MergeStateOptions base2() {
  MergeStateOptions options;
  options.lse_base = LseBase::two;
  return options;
}

struct PairViews {
  TensorView v_a, s_a, v_b, s_b, v_out, s_out;
};

PairViews pair_views(DType in, DType out, std::int64_t t, std::int64_t h, std::int64_t d) {
  PairViews p;
  p.v_a = TensorView::contiguous(fake(), in, {t, h, d});
  p.v_b = TensorView::contiguous(fake(1 << 20), in, {t, h, d});
  p.v_out = TensorView::contiguous(fake(2 << 20), out, {t, h, d});
  p.s_a = TensorView::contiguous(fake(3 << 20), DType::f32, {t, h});
  p.s_b = TensorView::contiguous(fake(4 << 20), DType::f32, {t, h});
  p.s_out = TensorView::contiguous(fake(5 << 20), DType::f32, {t, h});
  return p;
}

Plan plan_pair(const PairViews& p, const MergeStateOptions& options = base2()) {
  return plan_merge_state(p.v_a, p.s_a, p.v_b, p.s_b, p.v_out, p.s_out, options,
                          DeviceLimits::for_arch(Arch{9, 0}));
}

void require_all_legal(const Plan& plan) {
  for (const PlannedLaunch& launch : plan.launches) {
    REQUIRE(launch.shape.block.count() <= 512);
    for (const LimitCheck& check : check_launch(launch.shape, plan.device)) {
      INFO(plan.explain());
      REQUIRE_MESSAGE(check.ok(), check.limit, " requested ", check.requested, " allowed ",
                      check.allowed);
    }
  }
}

TEST_CASE("merge_state plans every boundary shape legally on sm_90") {
  const std::vector<std::int64_t> dims = {8, 64, 80, 96, 128, 192, 256, 512, 576, 1024};
  const std::vector<std::int64_t> heads = {1,   7,   8,   31,  32,  33,  63,  64,   65,
                                           127, 128, 129, 200, 255, 256, 257, 1024, 65535};
  int plans = 0;
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (std::int64_t d : dims) {
      for (std::int64_t h : heads) {
        for (std::int64_t t : {0, 1, 4096}) {
          CAPTURE(to_string(dtype));
          CAPTURE(d);
          CAPTURE(h);
          CAPTURE(t);
          const Plan plan = plan_pair(pair_views(dtype, dtype, t, h, d));
          ++plans;
          if (t == 0) {
            CHECK(plan.launches.empty());
            CHECK(plan.mode == "empty");
            continue;
          }
          REQUIRE(plan.launches.size() == 1);
          CHECK((plan.mode == "token_major" || plan.mode == "flat"));
          CHECK(!plan.reasons.empty());
          require_all_legal(plan);
          // 16-byte vectors whenever everything is aligned.
          CHECK(plan.launches[0].spec.get_int("vec") ==
                static_cast<std::int64_t>(16 / size_of(dtype)));
        }
      }
    }
  }
  CHECK(plans == 3 * 10 * 18 * 3);
}

TEST_CASE("merge_state plans FlashInfer's failing shapes, both modes, all ops") {
  struct Shape {
    std::int64_t h, d;
  };
  for (Shape s : {Shape{128, 128}, Shape{256, 128}, Shape{64, 256}, Shape{128, 256}, Shape{64, 512},
                  Shape{128, 512}, Shape{128, 576}, Shape{96, 128}}) {
    for (const char* mode : {"", "token_major", "flat"}) {
      CAPTURE(s.h);
      CAPTURE(s.d);
      CAPTURE(mode);
      MergeStateOptions options = base2();
      options.force_mode = mode;
      const PairViews p = pair_views(DType::bf16, DType::bf16, 4096, s.h, s.d);
      const Plan plan = plan_pair(p, options);
      if (*mode) CHECK(plan.mode == mode);
      require_all_legal(plan);
      const Plan in_place = plan_merge_state_in_place(p.v_a, p.s_a, p.v_b, p.s_b, TensorView{},
                                                      options, DeviceLimits::for_arch(Arch{9, 0}));
      require_all_legal(in_place);
      CHECK(in_place.launches[0].spec.get("op") == "in_place");
      const TensorView v = TensorView::contiguous(fake(), DType::bf16, {4096, 5, s.h, s.d});
      const TensorView sv = TensorView::contiguous(fake(64 << 20), DType::f32, {4096, 5, s.h});
      const Plan many =
          plan_merge_states(v, sv, p.v_out, p.s_out, options, DeviceLimits::for_arch(Arch{9, 0}));
      require_all_legal(many);
      CHECK(many.launches[0].spec.get("op") == "many");
    }
  }
}

TEST_CASE("merge_state plan: force_mode suffixes force the geometry") {
  const PairViews p = pair_views(DType::bf16, DType::bf16, 4096, 128, 512);
  const auto planned = [&](const char* mode) {
    MergeStateOptions options = base2();
    options.force_mode = mode;
    const Plan plan = plan_pair(p, options);
    require_all_legal(plan);
    return plan;
  };
  // The planner's choice at D = 512, H = 128: a token's 128 heads would span 8 token_major
  // blocks (of 2 vectors per thread), so flat rows in memory order, one vector per thread, 4
  // per block of 64 x 4.
  const Plan planner = planned("");
  CHECK(planner.mode == "flat");
  CHECK(planner.launches[0].spec.get("chunks") == "1");
  CHECK(planner.launches[0].shape.block.x == 64);
  CHECK(planner.launches[0].shape.block.y == 4);
  // Flat with the chunk rule's 2 vectors, forced by ":c2".
  CHECK(planned("flat:c2").launches[0].spec.get("chunks") == "2");
  CHECK(planned("flat:c2").launches[0].shape.block.x == 32);
  CHECK(planned("token_major").launches[0].shape.block.y == 16);
  // vLLM's geometry: one vector per thread, two rows per 128-thread block.
  const Plan vllm_like = planned("flat:c1:t128");
  CHECK(vllm_like.mode == "flat");
  CHECK(vllm_like.launches[0].spec.get("chunks") == "1");
  CHECK(vllm_like.launches[0].shape.block.x == 64);
  CHECK(vllm_like.launches[0].shape.block.y == 2);
  CHECK(vllm_like.launches[0].shape.grid.x == 4096 * 128 / 2);
  const Plan small_blocks = planned("token_major:t128");
  CHECK(small_blocks.launches[0].spec.get("chunks") == "2");
  CHECK(small_blocks.launches[0].shape.block.y == 4);
  CHECK(small_blocks.launches[0].shape.grid.y == 32);
  const Plan one_vector = planned("token_major:c1");
  CHECK(one_vector.launches[0].shape.block.x == 64);
  CHECK(one_vector.launches[0].shape.block.y == 8);
  CHECK(planned("token_major:c4:t256").launches[0].spec.get("chunks") == "4");
  for (const char* bad : {"token_major:c3", "flat:t100", "flat:t1024", "flat:x1", "flat:", ":c1",
                          "flat:c1:", "flat:c"}) {
    CAPTURE(bad);
    MergeStateOptions options = base2();
    options.force_mode = bad;
    CHECK_THROWS_AS(plan_pair(p, options), InvalidArgument);
  }
}

TEST_CASE("merge_state plan: f32 output, base e, layout and the spec parameters") {
  MergeStateOptions options;
  options.lse_base = LseBase::e;
  options.pos_inf_as_empty = false;
  const Plan plan = plan_pair(pair_views(DType::bf16, DType::f32, 64, 32, 128), options);
  REQUIRE(plan.launches.size() == 1);
  const KernelSpec& spec = plan.launches[0].spec;
  CHECK(spec.family == "merge_state");
  CHECK(spec.get("in") == "bf16");
  CHECK(spec.get("out") == "f32");
  CHECK(spec.get("base") == "e");
  CHECK(spec.get("pos_inf_empty") == "0");
  CHECK(spec.get_int("head_dim") == 128);
  CHECK(spec.get_int("vec") == 8);
}

TEST_CASE("merge_state plan: misaligned views narrow the vector, never fault") {
  PairViews p = pair_views(DType::bf16, DType::bf16, 64, 8, 128);
  // 8 bytes past a 16-byte boundary: 4 bf16 per access.
  p.v_b.data = fake(8);
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 4);
  // 2 bytes: scalar accesses.
  p.v_b.data = fake(2);
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 1);
  // A head stride of 132 elements (264 bytes, 8-byte aligned) narrows to 4.
  p = pair_views(DType::bf16, DType::bf16, 64, 8, 128);
  p.v_out = TensorView::strided(fake(2 << 20), DType::bf16, {64, 8, 128}, {8 * 132, 132, 1});
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 4);
  // A padded token stride that keeps 16-byte alignment keeps the full vector.
  p.v_out = TensorView::strided(fake(2 << 20), DType::bf16, {64, 8, 128}, {8 * 128 + 64, 128, 1});
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 8);
  // f32 output of bf16 input: the output needs 16-byte alignment for 8-wide vectors.
  p = pair_views(DType::bf16, DType::f32, 64, 8, 128);
  p.v_out.data = fake(8);
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 2);
  // Stride of an extent-1 dimension never matters.
  p = pair_views(DType::bf16, DType::bf16, 1, 8, 128);
  p.v_a = TensorView::strided(fake(), DType::bf16, {1, 8, 128}, {3, 128, 1});
  CHECK(plan_pair(p).launches[0].spec.get_int("vec") == 8);
}

TEST_CASE("merge_state plan: huge shapes pick a legal mode") {
  // T*H >= 2^32 rows: only token_major can index them.
  const Plan big = plan_pair(pair_views(DType::bf16, DType::bf16, std::int64_t{1} << 20, 8192, 8));
  CHECK(big.mode == "token_major");
  require_all_legal(big);
  MergeStateOptions options = base2();
  options.force_mode = "flat";
  CHECK_THROWS_AS(
      plan_pair(pair_views(DType::bf16, DType::bf16, std::int64_t{1} << 20, 8192, 8), options),
      PlanError);
  // T*H*D > 2^31: planned as usual, offsets are 64-bit in the kernel.
  require_all_legal(plan_pair(pair_views(DType::bf16, DType::bf16, 131072, 128, 128)));
  // Tiny: one token, one head.
  const Plan tiny = plan_pair(pair_views(DType::bf16, DType::bf16, 1, 1, 128));
  CHECK(tiny.mode == "flat");
  require_all_legal(tiny);
}

TEST_CASE("merge_state validation names the argument, its value and what is accepted") {
  const PairViews good = pair_views(DType::bf16, DType::bf16, 16, 8, 128);
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(no InvalidArgument)";
  };
  const DeviceLimits limits = DeviceLimits::for_arch(Arch{9, 0});
  auto plan_with = [&](PairViews p, MergeStateOptions options) {
    return [p, options, &limits] {
      (void)plan_merge_state(p.v_a, p.s_a, p.v_b, p.s_b, p.v_out, p.s_out, options, limits);
    };
  };
  {
    const std::string m = message_of(plan_with(good, MergeStateOptions{}));
    CHECK(m.find("lse_base") != std::string::npos);
    CHECK(m.find("no default") != std::string::npos);
  }
  {
    PairViews p = good;
    p.s_a.dtype = DType::f16;
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("s_a") != std::string::npos);
    CHECK(m.find("f16") != std::string::npos);
    CHECK(m.find("f32") != std::string::npos);
  }
  {
    PairViews p = good;
    p.v_b = TensorView::contiguous(fake(1 << 20), DType::bf16, {16, 9, 128});
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("v_b") != std::string::npos);
    CHECK(m.find("[16, 9, 128]") != std::string::npos);
  }
  {
    PairViews p = good;
    p.v_b.dtype = DType::f16;
    CHECK(message_of(plan_with(p, base2())).find("v_b") != std::string::npos);
  }
  {
    PairViews p = good;
    p.v_a = TensorView::strided(fake(), DType::bf16, {16, 8, 128}, {2048, 256, 2});
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("v_a") != std::string::npos);
    CHECK(m.find("stride") != std::string::npos);
  }
  {
    PairViews p = good;
    p.v_a.data = fake(1);
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("v_a") != std::string::npos);
    CHECK(m.find("aligned") != std::string::npos);
  }
  {
    PairViews p = pair_views(DType::bf16, DType::bf16, 16, 8, 100);
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("head_dim") != std::string::npos);
    CHECK(m.find("100") != std::string::npos);
  }
  {
    PairViews p = pair_views(DType::bf16, DType::f16, 16, 8, 128);
    const std::string m = message_of(plan_with(p, base2()));
    CHECK(m.find("v_out") != std::string::npos);
  }
  {
    PairViews p = pair_views(DType::i32, DType::i32, 16, 8, 128);
    CHECK(message_of(plan_with(p, base2())).find("accepted: f16, bf16, f32") != std::string::npos);
  }
  {
    MergeStateOptions options = base2();
    options.force_mode = "diagonal";
    const std::string m = message_of(plan_with(good, options));
    CHECK(m.find("force_mode") != std::string::npos);
    CHECK(m.find("diagonal") != std::string::npos);
  }
  {
    MergeStateOptions options = base2();
    options.lse_layout = LseLayout::head_major;  // s is [T, H] = [16, 8], head_major wants [8, 16]
    CHECK(message_of(plan_with(good, options)).find("head_major") != std::string::npos);
  }
  {
    const TensorView bad_mask = TensorView::contiguous(fake(9 << 20), DType::i32, {16});
    const std::string m = message_of([&] {
      (void)plan_merge_state_in_place(good.v_a, good.s_a, good.v_b, good.s_b, bad_mask, base2(),
                                      limits);
    });
    CHECK(m.find("mask") != std::string::npos);
    CHECK(m.find("u8") != std::string::npos);
    const TensorView short_mask = TensorView::contiguous(fake(9 << 20), DType::u8, {15});
    CHECK(message_of([&] {
            (void)plan_merge_state_in_place(good.v_a, good.s_a, good.v_b, good.s_b, short_mask,
                                            base2(), limits);
          }).find("[T] = [16]") != std::string::npos);
  }
  {
    const TensorView v = TensorView::contiguous(fake(), DType::bf16, {16, 3, 8, 128});
    const TensorView s = TensorView::contiguous(fake(64 << 20), DType::f32, {16, 8, 3});
    const std::string m =
        message_of([&] { (void)plan_merge_states(v, s, good.v_out, good.s_out, base2(), limits); });
    CHECK(m.find("merge_states") != std::string::npos);
    CHECK(m.find("[T, S, H]") != std::string::npos);
  }
}

TEST_CASE("merge_div_magic divides exactly for every 32-bit numerator") {
  std::mt19937_64 rng(12345);
  std::vector<u32> divisors = {1,   2,    3,    5,    7,     8,     31,       32,         33,
                               63,  64,   65,   127,  128,   129,   200,      255,        256,
                               257, 1000, 1024, 4095, 65535, 65536, 1u << 31, 0xFFFFFFFFu};
  for (int i = 0; i < 200; ++i) divisors.push_back(static_cast<u32>(rng() % 70000 + 1));
  for (u32 d : divisors) {
    const MergeDivMagic m = merge_div_magic(d);
    std::vector<u32> numerators = {0, 1, d - 1, d, d + 1, 0xFFFFFFFFu, 0xFFFFFFFEu, 0x80000000u};
    for (int i = 0; i < 2000; ++i) numerators.push_back(static_cast<u32>(rng()));
    for (u32 n : numerators) {
      if (merge_fast_div(n, m.magic, m.shift) != n / d) {
        FAIL("n = " << n << " d = " << d << " got " << merge_fast_div(n, m.magic, m.shift));
      }
    }
  }
}

// ---- reference ------------------------------------------------------------------------------

struct HostPair {
  std::int64_t t, h, d;
  std::vector<float> v_a, v_b, s_a, s_b;
  TensorView va() { return TensorView::contiguous(v_a.data(), DType::f32, {t, h, d}); }
  TensorView vb() { return TensorView::contiguous(v_b.data(), DType::f32, {t, h, d}); }
  TensorView sa() { return TensorView::contiguous(s_a.data(), DType::f32, {t, h}); }
  TensorView sb() { return TensorView::contiguous(s_b.data(), DType::f32, {t, h}); }
};

HostPair one_row(float sa, float sb, std::vector<float> va, std::vector<float> vb) {
  HostPair p{1, 1, static_cast<std::int64_t>(va.size()), va, vb, {sa}, {sb}};
  return p;
}

TEST_CASE("reference: hand-made cases follow the formula") {
  const float inf = std::numeric_limits<float>::infinity();
  const MergeStateOptions two = base2();
  MergeStateOptions e;
  e.lse_base = LseBase::e;
  SUBCASE("equal LSEs average, lse + 1 bit (base 2) / + ln 2 (base e)") {
    HostPair p = one_row(3.0f, 3.0f, {1, 2, 3, 4, 5, 6, 7, 8}, {3, 2, 1, 0, -1, -2, -3, -4});
    const auto r2 = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), two);
    for (int d = 0; d < 8; ++d)
      CHECK(r2.v_at(0, 0, d) == doctest::Approx((p.v_a[d] + p.v_b[d]) / 2));
    CHECK(r2.s_at(0, 0) == doctest::Approx(4.0));
    const auto re = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), e);
    CHECK(re.v_at(0, 0, 0) == doctest::Approx(2.0));
    CHECK(re.s_at(0, 0) == doctest::Approx(3.0 + std::log(2.0)));
  }
  SUBCASE("base 2 and base e differ and each matches its formula") {
    HostPair p = one_row(1.0f, 0.0f, {1, 1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0, 0});
    const auto r2 = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), two);
    const auto re = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), e);
    CHECK(r2.v_at(0, 0, 0) == doctest::Approx(2.0 / 3.0));  // 2^1 / (2^1 + 2^0)
    CHECK(re.v_at(0, 0, 0) == doctest::Approx(std::exp(1.0) / (std::exp(1.0) + 1.0)));
    CHECK(r2.s_at(0, 0) == doctest::Approx(std::log2(3.0)));
    CHECK(re.s_at(0, 0) == doctest::Approx(std::log(std::exp(1.0) + 1.0)));
    CHECK(r2.v_at(0, 0, 0) != doctest::Approx(re.v_at(0, 0, 0)));
  }
  SUBCASE("one -inf: the other state, exactly") {
    HostPair p = one_row(-inf, 2.5f, {9, 9, 9, 9, 9, 9, 9, 9}, {1, 2, 3, 4, 5, 6, 7, 8});
    const auto r = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), two);
    for (int d = 0; d < 8; ++d) CHECK(r.v_at(0, 0, d) == p.v_b[d]);
    CHECK(r.s_at(0, 0) == 2.5);
  }
  SUBCASE("both -inf: v = 0, s = -inf, garbage v never read") {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    HostPair p = one_row(-inf, -inf, {nan, inf, 1, 1, 1, 1, 1, 1}, {nan, -inf, 2, 2, 2, 2, 2, 2});
    const auto r = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), two);
    for (int d = 0; d < 8; ++d) CHECK(r.v_at(0, 0, d) == 0.0);
    CHECK(r.s_at(0, 0) == -kInf);
  }
  SUBCASE("+inf: empty by default, dominant when kept") {
    HostPair p = one_row(inf, 1.0f, {1, 1, 1, 1, 1, 1, 1, 1}, {5, 5, 5, 5, 5, 5, 5, 5});
    const auto as_empty = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), two);
    CHECK(as_empty.v_at(0, 0, 0) == 5.0);
    CHECK(as_empty.s_at(0, 0) == 1.0);
    MergeStateOptions keep = two;
    keep.pos_inf_as_empty = false;
    const auto kept = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), keep);
    CHECK(kept.v_at(0, 0, 0) == 1.0);
    CHECK(kept.s_at(0, 0) == kInf);
    HostPair both = one_row(inf, inf, {1, 1, 1, 1, 1, 1, 1, 1}, {3, 3, 3, 3, 3, 3, 3, 3});
    const auto shared = reference::merge_state(both.va(), both.sa(), both.vb(), both.sb(), keep);
    CHECK(shared.v_at(0, 0, 0) == 2.0);
    CHECK(shared.s_at(0, 0) == kInf);
    const auto both_empty = reference::merge_state(both.va(), both.sa(), both.vb(), both.sb(), two);
    CHECK(both_empty.v_at(0, 0, 0) == 0.0);
    CHECK(both_empty.s_at(0, 0) == -kInf);
  }
  SUBCASE("large LSE gaps do not overflow") {
    HostPair p = one_row(1000.0f, -1000.0f, {1, 1, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 2, 2, 2, 2});
    const auto r = reference::merge_state(p.va(), p.sa(), p.vb(), p.sb(), e);
    CHECK(r.v_at(0, 0, 0) == doctest::Approx(1.0));
    CHECK(r.s_at(0, 0) == doctest::Approx(1000.0));
  }
}

TEST_CASE("reference: merge_states equals a fold of merge_state; S = 0 and S = 1") {
  const std::int64_t t = 3, h = 4, d = 8, states = 5;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(t * states * h * d));
  std::vector<float> s(static_cast<std::size_t>(t * states * h));
  for (float& x : v) x = normal(rng);
  for (float& x : s) x = normal(rng) * 10.0f;
  s[0] = -std::numeric_limits<float>::infinity();
  for (LseBase base : {LseBase::two, LseBase::e}) {
    MergeStateOptions options;
    options.lse_base = base;
    const TensorView vv = TensorView::contiguous(v.data(), DType::f32, {t, states, h, d});
    const TensorView sv = TensorView::contiguous(s.data(), DType::f32, {t, states, h});
    const auto all = reference::merge_states(vv, sv, options);
    // Fold: acc = state 0, then acc = merge(acc, state i), through float64 host buffers.
    std::vector<double> acc_v(static_cast<std::size_t>(t * h * d)),
        acc_s(static_cast<std::size_t>(t * h));
    for (std::int64_t tt = 0; tt < t; ++tt) {
      for (std::int64_t hh = 0; hh < h; ++hh) {
        acc_s[static_cast<std::size_t>(tt * h + hh)] =
            s[static_cast<std::size_t>((tt * states) * h + hh)];
        for (std::int64_t dd = 0; dd < d; ++dd) {
          acc_v[static_cast<std::size_t>((tt * h + hh) * d + dd)] =
              v[static_cast<std::size_t>(((tt * states) * h + hh) * d + dd)];
        }
      }
    }
    for (std::int64_t i = 1; i < states; ++i) {
      const TensorView av = TensorView::contiguous(acc_v.data(), DType::f64, {t, h, d});
      const TensorView as = TensorView::contiguous(acc_s.data(), DType::f64, {t, h});
      const TensorView bv =
          TensorView::strided(v.data() + i * h * d, DType::f32, {t, h, d}, {states * h * d, d, 1});
      const TensorView bs =
          TensorView::strided(s.data() + i * h, DType::f32, {t, h}, {states * h, 1});
      const auto step = reference::merge_state(av, as, bv, bs, options);
      acc_v = step.v;
      acc_s = step.s;
    }
    for (std::size_t i = 0; i < acc_v.size(); ++i) CHECK(all.v[i] == doctest::Approx(acc_v[i]));
    for (std::size_t i = 0; i < acc_s.size(); ++i) CHECK(all.s[i] == doctest::Approx(acc_s[i]));
  }
  const MergeStateOptions options = base2();
  const TensorView none_v = TensorView::contiguous(v.data(), DType::f32, {t, 0, h, d});
  const TensorView none_s = TensorView::contiguous(s.data(), DType::f32, {t, 0, h});
  const auto zero = reference::merge_states(none_v, none_s, options);
  for (double x : zero.v) CHECK(x == 0.0);
  for (double x : zero.s) CHECK(x == -kInf);
  s[0] = 0.5f;
  const TensorView one_v =
      TensorView::strided(v.data(), DType::f32, {t, 1, h, d}, {states * h * d, h * d, d, 1});
  const TensorView one_s = TensorView::strided(s.data(), DType::f32, {t, 1, h}, {states * h, h, 1});
  const auto copy = reference::merge_states(one_v, one_s, options);
  CHECK(copy.v_at(0, 0, 3) == v[3]);
  CHECK(copy.s_at(0, 0) == doctest::Approx(0.5));
}

TEST_CASE("reference: in place keeps masked rows; store rounds to the output dtype") {
  HostPair p{2,
             1,
             8,
             {1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2},
             {3, 3, 3, 3, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4},
             {0, 0},
             {0, 0}};
  std::vector<std::uint8_t> mask = {0, 1};
  const auto r = reference::merge_state_in_place(
      p.va(), p.sa(), p.vb(), p.sb(), TensorView::contiguous(mask.data(), DType::u8, {2}), base2());
  CHECK(r.v_at(0, 0, 0) == 1.0);
  CHECK(r.s_at(0, 0) == 0.0);
  CHECK(r.v_at(1, 0, 0) == 3.0);
  CHECK(r.s_at(1, 0) == doctest::Approx(1.0));
  std::vector<std::uint16_t> out(16);
  std::vector<float> s_out(2);
  reference::store(r, TensorView::contiguous(out.data(), DType::bf16, {2, 1, 8}),
                   TensorView::contiguous(s_out.data(), DType::f32, {2, 1}),
                   LseLayout::token_major);
  CHECK(support::bf16_to_float(out[8]) == 3.0f);
  CHECK(s_out[1] == 1.0f);
}

}  // namespace
}  // namespace kjit
