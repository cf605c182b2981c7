// SPDX-License-Identifier: Apache-2.0
// merge_state family on the GPU against the float64 CPU reference: random states with wide LSE
// ranges and +-inf rows, padded strides, FlashInfer's failing shapes, odd head dims, 1 and 65535
// heads, T = 0, head-major LSE, masks, S = 0/1/2/5 states, misaligned views, every grid mode,
// and one shape with more than 2^31 elements. Outputs are poisoned (0xFF = NaN) before every
// run, and padding of outputs must stay poisoned.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/merge_state.hpp"
#include "ops/merge_state_reference.hpp"
#include "support/numeric.hpp"

namespace kjit {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

/// A tensor with host and device copies of one allocation (padding included), laid out by
/// explicit strides, starting `byte_offset` bytes into the allocation.
struct Tensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t byte_offset = 0;
  std::vector<unsigned char> host;
  std::unique_ptr<test::DeviceBuffer> device;

  TensorView view(void* base) const {
    TensorView v;
    v.data = static_cast<unsigned char*>(base) + byte_offset;
    v.dtype = dtype;
    v.rank = static_cast<int>(shape.size());
    for (int i = 0; i < v.rank; ++i) {
      v.shape[i] = shape[static_cast<std::size_t>(i)];
      v.strides[i] = strides[static_cast<std::size_t>(i)];
    }
    return v;
  }
  TensorView host_view() { return view(host.data()); }
  TensorView device_view() const { return view(device->get()); }
  void upload() { device->upload(host.data(), host.size()); }
  void download() { device->download(host.data(), host.size()); }
  /// Calls f(element offset) for every logical element, row-major.
  template <typename F>
  void for_each(F&& f) const {
    std::int64_t count = 1;
    for (std::int64_t s : shape) count *= s;
    for (std::int64_t linear = 0; linear < count; ++linear) {
      std::int64_t rest = linear, offset = 0;
      for (std::size_t i = shape.size(); i-- > 0;) {
        offset += (rest % shape[i]) * strides[i];
        rest /= shape[i];
      }
      f(offset);
    }
  }
};

/// Row-major strides with `pad[i]` extra elements added to dimension i's stride (the last
/// dimension stays contiguous).
std::vector<std::int64_t> padded_strides(const std::vector<std::int64_t>& shape,
                                         const std::vector<std::int64_t>& pad) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size() - 1; i-- > 0;) {
    strides[i] = strides[i + 1] * shape[i + 1] + (i < pad.size() ? pad[i] : 0);
  }
  return strides;
}

/// Allocates host + device memory, poisons both with 0xFF (NaN in every float format).
Tensor make_tensor(DType dtype, std::vector<std::int64_t> shape, std::vector<std::int64_t> pad = {},
                   std::int64_t byte_offset = 0) {
  Tensor t;
  t.dtype = dtype;
  t.strides = padded_strides(shape, pad);
  t.shape = std::move(shape);
  t.byte_offset = byte_offset;
  std::int64_t span = 1;
  bool empty = false;
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] == 0) empty = true;
    span += (t.shape[i] - 1) * t.strides[i];
  }
  if (empty) span = 0;
  const std::size_t bytes =
      static_cast<std::size_t>(byte_offset + span * static_cast<std::int64_t>(size_of(dtype)));
  t.host.assign(std::max<std::size_t>(bytes, 16), 0xFF);
  t.device = std::make_unique<test::DeviceBuffer>(t.host.size());
  return t;
}

void fill_normal(Tensor& t, test::Rng& rng, double scale) {
  std::normal_distribution<double> normal(0.0, 1.0);
  void* base = t.host.data() + t.byte_offset;
  t.for_each([&](std::int64_t off) {
    support::store_from_double(base, t.dtype, off, normal(rng) * scale);
  });
}

void set_f32(Tensor& t, std::int64_t offset, float value) {
  std::memcpy(t.host.data() + t.byte_offset + offset * 4, &value, 4);
}

/// Tolerance of one output element: the brief's absolute bound plus half an ulp of the output
/// format relative to the value (rounding of the fp32 result).
double v_tolerance(DType out, double ref) {
  switch (out) {
    case DType::bf16:
      return 1e-2 + std::ldexp(std::fabs(ref), -8);
    case DType::f16:
      return 1e-3 + std::ldexp(std::fabs(ref), -11);
    default:
      return 1e-5 + 1e-5 * std::fabs(ref);
  }
}

/// Compares a downloaded v_out / s_out (any strides, layout) with the reference; checks that
/// padding bytes are still poisoned and that no NaN appears anywhere.
void require_matches(const reference::MergeResult& ref, Tensor& v_out, Tensor* s_out,
                     LseLayout layout) {
  v_out.download();
  const TensorView v = v_out.host_view();
  std::int64_t bad = 0;
  std::string first;
  std::vector<bool> touched(v_out.host.size(), false);
  const std::int64_t esize = static_cast<std::int64_t>(size_of(v_out.dtype));
  for (std::int64_t t = 0; t < ref.tokens; ++t) {
    for (std::int64_t h = 0; h < ref.heads; ++h) {
      for (std::int64_t d = 0; d < ref.head_dim; ++d) {
        const std::int64_t off = t * v.strides[0] + h * v.strides[1] + d;
        for (std::int64_t b = 0; b < esize; ++b) {
          touched[static_cast<std::size_t>(v_out.byte_offset + off * esize + b)] = true;
        }
        const double got = support::load_as_double(v.data, v.dtype, off);
        const double want = ref.v_at(t, h, d);
        if (std::isnan(got) || !(std::fabs(got - want) <= v_tolerance(v_out.dtype, want))) {
          if (bad++ == 0) first = fmt::format("v[{}, {}, {}] = {} expected {}", t, h, d, got, want);
        }
      }
    }
  }
  for (std::size_t i = 0; i < touched.size(); ++i) {
    if (!touched[i] && v_out.host[i] != 0xFF) {
      if (bad++ == 0) first = fmt::format("v_out padding byte {} was written", i);
    }
  }
  if (s_out != nullptr) {
    s_out->download();
    const TensorView s = s_out->host_view();
    for (std::int64_t t = 0; t < ref.tokens; ++t) {
      for (std::int64_t h = 0; h < ref.heads; ++h) {
        const std::int64_t off = layout == LseLayout::token_major
                                     ? t * s.strides[0] + h * s.strides[1]
                                     : h * s.strides[0] + t * s.strides[1];
        const double got = support::load_as_double(s.data, DType::f32, off);
        const double want = ref.s_at(t, h);
        const bool ok = std::isinf(want)
                            ? got == want
                            : std::fabs(got - want) <= 1e-4 * std::max(1.0, std::fabs(want));
        if (std::isnan(got) || !ok) {
          if (bad++ == 0) first = fmt::format("s[{}, {}] = {} expected {}", t, h, got, want);
        }
      }
    }
  }
  if (bad != 0) FAIL(bad << " wrong elements; first: " << first);
}

MergeStateOptions options_for(LseBase base, const std::string& mode = "") {
  MergeStateOptions options;
  options.lse_base = base;
  options.force_mode = mode;
  options.device = test::device();
  options.runtime = &test::runtime();
  return options;
}

struct PairCase {
  DType in = DType::bf16;
  DType out = DType::bf16;
  std::int64_t tokens = 37;
  std::int64_t heads = 8;
  std::int64_t head_dim = 128;
  double lse_scale = 10.0;
  LseBase base = LseBase::two;
  LseLayout layout = LseLayout::token_major;
  bool pos_inf_as_empty = true;
  std::string mode;
  /// Extra elements on (token, head) strides of v_a / v_b / v_out, and on the LSE's outer stride.
  std::vector<std::int64_t> pad_a, pad_b, pad_out;
  std::int64_t pad_s = 0;
  /// Bytes the v_b view starts past a 256-byte aligned allocation.
  std::int64_t offset_b = 0;
  bool with_s_out = true;
  bool special_rows = true;
};

std::string describe(const PairCase& c) {
  return fmt::format("{}->{} T={} H={} D={} k={} base={} layout={} mode='{}' offset_b={}",
                     to_string(c.in), to_string(c.out), c.tokens, c.heads, c.head_dim, c.lse_scale,
                     c.base == LseBase::two ? "2" : "e",
                     c.layout == LseLayout::token_major ? "TH" : "HT", c.mode, c.offset_b);
}

std::vector<std::int64_t> lse_shape(const PairCase& c) {
  return c.layout == LseLayout::token_major ? std::vector<std::int64_t>{c.tokens, c.heads}
                                            : std::vector<std::int64_t>{c.heads, c.tokens};
}

/// Sets special LSE pairs on the first rows: one side empty, both empty, +inf, +inf both.
void plant_special_rows(Tensor& s_a, Tensor& s_b, const PairCase& c) {
  const float specials[][2] = {{-kInfF, 0.5f}, {1.5f, -kInfF},  {-kInfF, -kInfF}, {kInfF, 2.0f},
                               {kInfF, kInfF}, {-kInfF, kInfF}, {80.0f, -80.0f},  {3.0f, 3.0f}};
  const std::int64_t rows = c.tokens * c.heads;
  for (std::int64_t i = 0; i < std::min<std::int64_t>(rows, 8); ++i) {
    // Spread over tokens and heads: row i*stride.
    const std::int64_t row = (i * 7919) % rows;
    const std::int64_t t = row / c.heads, h = row % c.heads;
    const std::int64_t off_a = c.layout == LseLayout::token_major
                                   ? t * s_a.strides[0] + h * s_a.strides[1]
                                   : h * s_a.strides[0] + t * s_a.strides[1];
    const std::int64_t off_b = c.layout == LseLayout::token_major
                                   ? t * s_b.strides[0] + h * s_b.strides[1]
                                   : h * s_b.strides[0] + t * s_b.strides[1];
    set_f32(s_a, off_a, specials[i][0]);
    set_f32(s_b, off_b, specials[i][1]);
  }
}

void run_pair(const PairCase& c) {
  CAPTURE(describe(c));
  test::Rng rng(test::fresh_seed());
  Tensor v_a = make_tensor(c.in, {c.tokens, c.heads, c.head_dim}, c.pad_a);
  Tensor v_b = make_tensor(c.in, {c.tokens, c.heads, c.head_dim}, c.pad_b, c.offset_b);
  Tensor v_out = make_tensor(c.out, {c.tokens, c.heads, c.head_dim}, c.pad_out);
  Tensor s_a = make_tensor(DType::f32, lse_shape(c), {c.pad_s});
  Tensor s_b = make_tensor(DType::f32, lse_shape(c), {c.pad_s * 2});
  Tensor s_out = make_tensor(DType::f32, lse_shape(c), {c.pad_s});
  fill_normal(v_a, rng, 1.0);
  fill_normal(v_b, rng, 1.0);
  fill_normal(s_a, rng, c.lse_scale);
  fill_normal(s_b, rng, c.lse_scale);
  if (c.special_rows) plant_special_rows(s_a, s_b, c);
  for (Tensor* t : {&v_a, &v_b, &s_a, &s_b}) t->upload();
  v_out.device->poison();
  s_out.device->poison();
  MergeStateOptions options = options_for(c.base, c.mode);
  options.lse_layout = c.layout;
  options.pos_inf_as_empty = c.pos_inf_as_empty;
  TensorView no_s_out;
  merge_state(v_a.device_view(), s_a.device_view(), v_b.device_view(), s_b.device_view(),
              v_out.device_view(), c.with_s_out ? s_out.device_view() : no_s_out, options,
              test::stream());
  test::sync();
  const reference::MergeResult ref = reference::merge_state(
      v_a.host_view(), s_a.host_view(), v_b.host_view(), s_b.host_view(), options);
  require_matches(ref, v_out, c.with_s_out ? &s_out : nullptr, c.layout);
}

TEST_CASE("gpu merge_state: random states, every dtype, LSE scale and base") {
  for (DType in : {DType::bf16, DType::f16, DType::f32}) {
    for (DType out : {in, DType::f32}) {
      for (double k : {1.0, 10.0, 50.0}) {
        for (LseBase base : {LseBase::two, LseBase::e}) {
          PairCase c;
          c.in = in;
          c.out = out;
          c.lse_scale = k;
          c.base = base;
          run_pair(c);
        }
      }
    }
  }
}

TEST_CASE("gpu merge_state: FlashInfer's failing shapes, odd head dims, 1 and many heads") {
  struct Shape {
    std::int64_t t, h, d;
  };
  for (Shape s :
       {Shape{64, 128, 128}, Shape{64, 256, 128}, Shape{32, 64, 256}, Shape{32, 128, 256},
        Shape{16, 64, 512}, Shape{16, 128, 512}, Shape{16, 128, 576}, Shape{16, 96, 128},
        Shape{33, 8, 80}, Shape{33, 7, 96}, Shape{17, 9, 192}, Shape{5, 3, 8}, Shape{40, 1, 128},
        Shape{3, 1, 1024}, Shape{2, 65535, 8}, Shape{1, 1, 64}, Shape{1, 8, 128}}) {
    for (DType dtype : {DType::bf16, DType::f32}) {
      PairCase c;
      c.in = c.out = dtype;
      c.tokens = s.t;
      c.heads = s.h;
      c.head_dim = s.d;
      run_pair(c);
    }
  }
}

TEST_CASE("gpu merge_state: every grid mode on a few shapes") {
  for (const char* mode : kMergeStateModes) {
    for (std::int64_t h : {1, 33, 128, 257}) {
      for (std::int64_t d : {64, 128, 576}) {
        PairCase c;
        c.tokens = 19;
        c.heads = h;
        c.head_dim = d;
        c.mode = mode;
        run_pair(c);
      }
    }
  }
}

TEST_CASE("gpu merge_state: geometries forced by force_mode suffixes (A/B variants)") {
  for (const char* mode :
       {"token_major:c1", "flat:t512", "flat:c1:t128", "token_major:c4:t64", "flat:c2:t32"}) {
    for (std::int64_t h : {1, 33, 128}) {
      for (std::int64_t d : {64, 512, 576}) {
        PairCase c;
        c.tokens = 19;
        c.heads = h;
        c.head_dim = d;
        c.mode = mode;
        run_pair(c);
        // The layout the vLLM anchor of bench_merge_state reads.
        c.layout = LseLayout::head_major;
        c.base = LseBase::e;
        run_pair(c);
      }
    }
  }
}

TEST_CASE("gpu merge_state: padded strides, head-major LSE, misaligned views, options") {
  SUBCASE("padded token and head strides, different per tensor") {
    PairCase c;
    c.heads = 12;
    c.head_dim = 96;
    c.pad_a = {24, 8};
    c.pad_b = {8, 16};
    c.pad_out = {40, 32};
    c.pad_s = 5;
    run_pair(c);
    c.in = c.out = DType::f16;
    c.pad_a = {3, 1};  // odd element padding: 2-byte alignment only -> scalar accesses
    run_pair(c);
  }
  SUBCASE("head-major LSE") {
    PairCase c;
    c.layout = LseLayout::head_major;
    c.base = LseBase::e;
    c.pad_s = 3;
    run_pair(c);
  }
  SUBCASE("v_b misaligned by 8 bytes: narrower vectors, same result") {
    PairCase c;
    c.offset_b = 8;
    const DeviceLimits limits = test::runtime().device_limits(test::device());
    Tensor probe = make_tensor(DType::bf16, {c.tokens, c.heads, c.head_dim}, {}, 8);
    Tensor aligned = make_tensor(DType::bf16, {c.tokens, c.heads, c.head_dim});
    Tensor s = make_tensor(DType::f32, {c.tokens, c.heads});
    const Plan plan = plan_merge_state(aligned.device_view(), s.device_view(), probe.device_view(),
                                       s.device_view(), aligned.device_view(), s.device_view(),
                                       options_for(LseBase::two), limits);
    CHECK(plan.launches[0].spec.get_int("vec") == 4);
    run_pair(c);
    c.in = c.out = DType::f32;
    c.offset_b = 4;
    run_pair(c);
  }
  SUBCASE("+inf kept, no s_out") {
    PairCase c;
    c.pos_inf_as_empty = false;
    run_pair(c);
    c.with_s_out = false;
    run_pair(c);
  }
}

TEST_CASE("gpu merge_state: T = 0 launches nothing and touches nothing") {
  Tensor v = make_tensor(DType::bf16, {0, 8, 128});
  Tensor s = make_tensor(DType::f32, {0, 8});
  Tensor out = make_tensor(DType::bf16, {0, 8, 128});
  out.device->poison();
  merge_state(v.device_view(), s.device_view(), v.device_view(), s.device_view(), out.device_view(),
              s.device_view(), options_for(LseBase::two), test::stream());
  test::sync();
  out.download();
  for (unsigned char b : out.host) CHECK(b == 0xFF);
}

TEST_CASE("gpu merge_state_in_place: mask, strides, both bases") {
  for (LseBase base : {LseBase::two, LseBase::e}) {
    for (bool with_mask : {true, false}) {
      CAPTURE(with_mask);
      test::Rng rng(test::fresh_seed());
      const std::int64_t T = 45, H = 40, D = 128;
      Tensor v = make_tensor(DType::bf16, {T, H, D}, {64, 0});
      Tensor s = make_tensor(DType::f32, {T, H});
      Tensor vo = make_tensor(DType::bf16, {T, H, D});
      Tensor so = make_tensor(DType::f32, {T, H}, {7});
      Tensor mask = make_tensor(DType::u8, {T});
      fill_normal(v, rng, 1.0);
      fill_normal(vo, rng, 1.0);
      fill_normal(s, rng, 10.0);
      fill_normal(so, rng, 10.0);
      set_f32(s, 0, -kInfF);
      set_f32(so, 0, -kInfF);
      set_f32(s, 5, kInfF);
      for (std::int64_t t = 0; t < T; ++t) mask.host[static_cast<std::size_t>(t)] = (t % 3 != 1);
      for (Tensor* t : {&v, &s, &vo, &so, &mask}) t->upload();
      const MergeStateOptions options = options_for(base);
      TensorView no_mask;
      const TensorView mask_view = with_mask ? mask.host_view() : no_mask;
      const reference::MergeResult ref = reference::merge_state_in_place(
          v.host_view(), s.host_view(), vo.host_view(), so.host_view(), mask_view, options);
      merge_state_in_place(v.device_view(), s.device_view(), vo.device_view(), so.device_view(),
                           with_mask ? mask.device_view() : no_mask, options, test::stream());
      test::sync();
      // The padding of v was 0xFF before and must still be.
      require_matches(ref, v, &s, LseLayout::token_major);
    }
  }
}

TEST_CASE("gpu merge_states: S = 0, 1, 2, 5, both layouts") {
  for (std::int64_t states : {0, 1, 2, 5}) {
    for (LseLayout layout : {LseLayout::token_major, LseLayout::head_major}) {
      for (DType out : {DType::bf16, DType::f32}) {
        CAPTURE(states);
        test::Rng rng(test::fresh_seed());
        const std::int64_t T = 23, H = 24, D = 64;
        Tensor v = make_tensor(DType::bf16, {T, states, H, D}, {0, 0, 8});
        Tensor s = make_tensor(DType::f32, layout == LseLayout::token_major
                                               ? std::vector<std::int64_t>{T, states, H}
                                               : std::vector<std::int64_t>{H, T, states});
        Tensor vo = make_tensor(out, {T, H, D});
        Tensor so = make_tensor(DType::f32, layout == LseLayout::token_major
                                                ? std::vector<std::int64_t>{T, H}
                                                : std::vector<std::int64_t>{H, T});
        fill_normal(v, rng, 1.0);
        fill_normal(s, rng, 10.0);
        if (states > 0) {
          set_f32(s, 0, -kInfF);
          set_f32(s, 3, kInfF);
        }
        v.upload();
        s.upload();
        vo.device->poison();
        so.device->poison();
        MergeStateOptions options = options_for(LseBase::two);
        options.lse_layout = layout;
        merge_states(v.device_view(), s.device_view(), vo.device_view(), so.device_view(), options,
                     test::stream());
        test::sync();
        const reference::MergeResult ref =
            reference::merge_states(v.host_view(), s.host_view(), options);
        require_matches(ref, vo, &so, layout);
      }
    }
  }
}

TEST_CASE("gpu merge_state: more than 2^31 elements (64-bit offsets)") {
  // T*H*D = 2^31 + 2^25 bf16 elements per tensor: 4.4 GB each, 13 GB in all.
  const std::int64_t T = 133120, H = 128, D = 128;
  const std::int64_t n = T * H * D;
  REQUIRE(n > (std::int64_t{1} << 31));
  test::Rng rng(test::fresh_seed());
  // Inputs repeat a random pattern of P elements (P not a multiple of a row), so that any row
  // can be rebuilt on the host without holding 13 GB there.
  const std::int64_t P = (std::int64_t{1} << 24) + 40;
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<std::uint16_t> pattern_a(static_cast<std::size_t>(P)), pattern_b(pattern_a.size());
  for (auto& x : pattern_a) x = support::float_to_bf16(static_cast<float>(normal(rng)));
  for (auto& x : pattern_b) x = support::float_to_bf16(static_cast<float>(normal(rng)));
  std::unique_ptr<test::DeviceBuffer> buffers[3];
  try {
    for (auto& b : buffers)
      b = std::make_unique<test::DeviceBuffer>(static_cast<std::size_t>(n * 2));
  } catch (const DriverError& e) {
    MESSAGE("skipped: 3 x " << n * 2 << " bytes do not fit: " << e.what());
    return;
  }
  test::DeviceBuffer& v_a = *buffers[0];
  test::DeviceBuffer& v_b = *buffers[1];
  test::DeviceBuffer& v_out = *buffers[2];
  for (std::int64_t done = 0; done < n; done += P) {
    const std::int64_t count = std::min(P, n - done);
    test::check_cu(test::cu().cuMemcpyHtoD(v_a.ptr() + static_cast<std::size_t>(done * 2),
                                           pattern_a.data(), static_cast<std::size_t>(count * 2)),
                   "cuMemcpyHtoD");
    test::check_cu(test::cu().cuMemcpyHtoD(v_b.ptr() + static_cast<std::size_t>(done * 2),
                                           pattern_b.data(), static_cast<std::size_t>(count * 2)),
                   "cuMemcpyHtoD");
  }
  std::vector<float> s_a(static_cast<std::size_t>(T * H)), s_b(s_a.size());
  for (float& x : s_a) x = static_cast<float>(normal(rng) * 10.0);
  for (float& x : s_b) x = static_cast<float>(normal(rng) * 10.0);
  test::DeviceBuffer sa(s_a.size() * 4), sb(s_b.size() * 4), so(s_a.size() * 4);
  sa.upload(s_a.data(), s_a.size() * 4);
  sb.upload(s_b.data(), s_b.size() * 4);
  v_out.poison();
  so.poison();
  for (const char* mode : kMergeStateModes) {
    CAPTURE(mode);
    merge_state(TensorView::contiguous(v_a.get(), DType::bf16, {T, H, D}),
                TensorView::contiguous(sa.get(), DType::f32, {T, H}),
                TensorView::contiguous(v_b.get(), DType::bf16, {T, H, D}),
                TensorView::contiguous(sb.get(), DType::f32, {T, H}),
                TensorView::contiguous(v_out.get(), DType::bf16, {T, H, D}),
                TensorView::contiguous(so.get(), DType::f32, {T, H}),
                options_for(LseBase::two, mode), test::stream());
    test::sync();
    const std::vector<float> s_got = so.download_as<float>(s_a.size());
    // Tokens around the 2^31-element boundary and at the very end.
    const std::int64_t boundary_token = (std::int64_t{1} << 31) / (H * D);
    for (std::int64_t t :
         {std::int64_t{0}, boundary_token - 1, boundary_token, boundary_token + 1, T - 2, T - 1}) {
      std::vector<std::uint16_t> row_a(static_cast<std::size_t>(H * D)), row_b(row_a.size()),
          row_out(row_a.size());
      for (std::int64_t i = 0; i < H * D; ++i) {
        row_a[static_cast<std::size_t>(i)] =
            pattern_a[static_cast<std::size_t>((t * H * D + i) % P)];
        row_b[static_cast<std::size_t>(i)] =
            pattern_b[static_cast<std::size_t>((t * H * D + i) % P)];
      }
      test::check_cu(test::cu().cuMemcpyDtoH(row_out.data(),
                                             v_out.ptr() + static_cast<std::size_t>(t * H * D * 2),
                                             row_out.size() * 2),
                     "cuMemcpyDtoH");
      const reference::MergeResult ref = reference::merge_state(
          TensorView::contiguous(row_a.data(), DType::bf16, {1, H, D}),
          TensorView::contiguous(&s_a[static_cast<std::size_t>(t * H)], DType::f32, {1, H}),
          TensorView::contiguous(row_b.data(), DType::bf16, {1, H, D}),
          TensorView::contiguous(&s_b[static_cast<std::size_t>(t * H)], DType::f32, {1, H}),
          options_for(LseBase::two));
      std::int64_t bad = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        const double s_want = ref.s_at(0, h);
        const double s_have = s_got[static_cast<std::size_t>(t * H + h)];
        if (!(std::fabs(s_have - s_want) <= 1e-4 * std::max(1.0, std::fabs(s_want)))) ++bad;
        for (std::int64_t d = 0; d < D; ++d) {
          const double got = support::bf16_to_float(row_out[static_cast<std::size_t>(h * D + d)]);
          const double want = ref.v_at(0, h, d);
          if (!(std::fabs(got - want) <= v_tolerance(DType::bf16, want))) ++bad;
        }
      }
      CHECK_MESSAGE(bad == 0, "token ", t, ": ", bad, " wrong elements");
    }
  }
}

}  // namespace
}  // namespace kjit
