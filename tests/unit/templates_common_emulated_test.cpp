// SPDX-License-Identifier: Apache-2.0
// Arithmetic of the shared template headers (templates/common) compiled as host C++ under
// tests/common/cuda_warp_emulation.hpp, with the intrinsics they call emulated exactly: the
// formulas, not the hardware approximations (their measured error is in docs/performance.md).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

// (keep this order: the emulation header defines __device__ & co. for the templates; the host
// compiler does not know #pragma unroll: tests/CMakeLists.txt silences that here)
#include "common/cuda_warp_emulation.hpp"
#include "templates/common/gdn_math.cuh"
#include "templates/common/swizzle.cuh"
#include "templates/common/vec.cuh"
#include "templates/common/wgmma.cuh"

namespace kjit {
namespace {

// The prefill chunk kernel's gates (gdn::fast_softplus, fast_sigmoid), with the intrinsics they
// call emulated exactly: this checks their formulas, the series below x = -5 above all (where
// log(1 + e^x) in f32 loses e^x's low bits: 30% off at x = -15). The intrinsics' own error on
// the H200 is in docs/performance.md ("The chunk kernel's instructions per chunk step").
TEST_CASE("gdn fast gates: softplus keeps its relative precision down to e^-100, sigmoid") {
  constexpr float kThreshold = 20.f;
  double worst_series = 0, worst_log = 0, worst_sigmoid = 0;
  for (int i = 0; i <= 130000; ++i) {
    const float x = -100.f + 0.001f * static_cast<float>(i);
    const double xd = x;
    const double softplus = xd > kThreshold ? xd : std::log1p(std::exp(xd));
    const double got = gdn::fast_softplus(x, kThreshold);
    // Relative errors where f32 has its full precision (values above 1e-30; e^x is subnormal
    // below x = -87).
    if (softplus > 1e-30) {
      const double error = std::fabs(got - softplus) / softplus;
      double& worst = x < -5.f ? worst_series : worst_log;
      worst = std::max(worst, error);
    }
    const double sigmoid = 1.0 / (1.0 + std::exp(-xd));
    if (sigmoid > 1e-30) {
      worst_sigmoid = std::max(worst_sigmoid, std::fabs(gdn::fast_sigmoid(x) - sigmoid) / sigmoid);
    }
  }
  INFO("worst relative error: series " << worst_series << ", log " << worst_log << ", sigmoid "
                                       << worst_sigmoid);
  CHECK(worst_series < 1e-6);
  CHECK(worst_log < 2e-5);  // 1 + e^x rounded to f32 near x = -5 (the H200 showed 1.4e-5)
  CHECK(worst_sigmoid < 1e-6);
  // The limits: e^-x overflows to inf below x = -88 and the sigmoid is 0; the threshold cuts
  // softplus to x.
  CHECK(gdn::fast_sigmoid(-100.f) == 0.f);
  CHECK(gdn::fast_sigmoid(100.f) == 1.f);
  CHECK(gdn::fast_softplus(25.f, kThreshold) == 25.f);
  CHECK(gdn::fast_log_decay(0.5f, std::log(2.f), -0.5f, kThreshold) ==
        doctest::Approx(-2.0 * std::log(2.0)).epsilon(1e-6));
}

// vec::to_tf32_bits (the tf32 mma operands of the prefill chunk kernel's block products) against
// cvt.rna.tf32.f32's rounding done in double: the value to 11 significant bits (subnormals on
// the f32 grid of 2^-136), ties away from zero, past the largest finite value inf.
TEST_CASE("tf32 operand bits: round to nearest, ties away, over every exponent") {
  const auto reference = [](float x) -> std::uint32_t {
    const double magnitude = std::fabs(static_cast<double>(x));
    const int exponent = std::max(std::ilogb(magnitude), -126);
    const double ulp = std::ldexp(1.0, exponent - 10);
    const double rounded = std::floor(magnitude / ulp + 0.5) * ulp;  // ties away (magnitude)
    const float value = rounded >= std::ldexp(1.0, 128) ? INFINITY : static_cast<float>(rounded);
    return __float_as_uint(std::signbit(x) ? -value : value);
  };
  std::mt19937 rng(7);
  std::vector<float> values = {0.f,     -0.f,   INFINITY, -INFINITY, FLT_MAX, -FLT_MAX,
                               FLT_MIN, 1e-40f, 1.f,      -1.f,      3.f};
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t bits = static_cast<std::uint32_t>(rng());
    if ((bits & 0x7f800000u) == 0x7f800000u) bits &= 0xbfffffffu;  // finite only
    if (i % 4 == 0) bits = (bits & 0xffffe000u) | 0x1000u;         // exact ties
    values.push_back(__uint_as_float(bits));
  }
  int mismatches = 0;
  for (const float x : values) {
    if (std::isinf(x) || x == 0.f) {
      CHECK(vec::to_tf32_bits(x) == __float_as_uint(x));
      continue;
    }
    if (vec::to_tf32_bits(x) != reference(x) && ++mismatches <= 5) {
      FAIL_CHECK(fmt::format("x = {:a}: 0x{:08x}, expected 0x{:08x}", x, vec::to_tf32_bits(x),
                             reference(x)));
    }
  }
  CHECK(mismatches == 0);
  CHECK(vec::to_tf32_bits(FLT_MAX) == __float_as_uint(INFINITY));
}

// The prefill kernels build each swizzled tile's wgmma descriptor once and advance it by a
// constant per k-step (wgmma::advance adds offset / 16 to the 14-bit address field): the same
// descriptor as one built from the k-step's address, for every 1024-byte-aligned tile start an
// SM's shared memory allows and every offset the kernels use (K-major k-steps over two 64-column
// slices, the 32-byte steps of T' and P, N-major 16-row steps), so the field never carries.
TEST_CASE("wgmma descriptors: a k-step's descriptor is its tile's advanced by the offset") {
  constexpr std::uint32_t kSharedBytes = 232448;  // sm_90's opt-in maximum per block
  int checked = 0;
  for (std::uint32_t tile = 0; tile + sw128::kAtom <= kSharedBytes; tile += sw128::kAtom) {
    for (int ks = 0; ks < 16; ++ks) {
      const std::uint32_t offset = sw128::k_step(0, ks);
      if (tile + offset + 8 * 128 > kSharedBytes) continue;
      CHECK(wgmma::descriptor_sw128(sw128::k_step(tile, ks), 16, sw128::kAtom) ==
            wgmma::advance(wgmma::descriptor_sw128(tile, 16, sw128::kAtom), offset));
      ++checked;
    }
    for (std::uint32_t jb = 0; jb < 4; ++jb) {
      CHECK(wgmma::descriptor_sw128(tile + jb * 32, 16, sw128::kAtom) ==
            wgmma::advance(wgmma::descriptor_sw128(tile, 16, sw128::kAtom), jb * 32));
      if (tile + jb * 2 * sw128::kAtom < kSharedBytes) {
        CHECK(wgmma::descriptor_sw128(tile + jb * 2 * sw128::kAtom, sw128::kSlice, sw128::kAtom) ==
              wgmma::advance(wgmma::descriptor_sw128(tile, sw128::kSlice, sw128::kAtom),
                             jb * 2 * sw128::kAtom));
      }
      checked += 2;
    }
  }
  CHECK(checked > 4000);
}

}  // namespace
}  // namespace kjit
