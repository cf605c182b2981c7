// SPDX-License-Identifier: Apache-2.0
// causal_conv1d / causal_conv1d_update on the CPU: the float64 reference against a plain full
// convolution of each sequence, plans legal over the grid (D up to 2^20, B = 70000,
// N = 2^24, T up to 2^31 - 1) on every known device, validation messages that name the argument,
// and every planned kernel of a representative set compiled by NVRTC for sm_90 (no GPU needed).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compile/compiler.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/plan.hpp"
#include "kjit/settings.hpp"
#include "ops/causal_conv1d/family.hpp"
#include "support/numeric.hpp"

namespace kjit {
namespace {

using support::load_as_double;
using support::store_from_double;

/// Fake device addresses 2^55 bytes apart (the largest views span 2^52): planning only looks at
/// their alignment and overlap.
void* fake(std::uintptr_t n) { return reinterpret_cast<void*>((n + 1) << 55); }

struct Prefill {
  TensorView x, weight, bias, state, cu, indices, has, out;
};

Prefill prefill_views(std::int64_t tokens, std::int64_t seqs, std::int64_t dim,
                      std::int64_t width = 4, DType dtype = DType::bf16) {
  Prefill v;
  v.x = TensorView::contiguous(fake(0), dtype, {tokens, dim});
  v.weight = TensorView::contiguous(fake(1), dtype, {dim, width});
  v.bias = TensorView::contiguous(fake(2), dtype, {dim});
  v.state = TensorView::contiguous(fake(3), dtype, {seqs + 1, dim, width - 1});
  v.cu = TensorView::contiguous(fake(4), DType::i32, {seqs + 1});
  v.indices = TensorView::contiguous(fake(5), DType::i32, {seqs});
  v.has = TensorView::contiguous(nullptr, DType::u8, {seqs});
  v.out = TensorView::contiguous(fake(6), dtype, {tokens, dim});
  return v;
}

Plan plan(const Prefill& v, const DeviceLimits& device, const CausalConv1dOptions& o = {}) {
  return plan_causal_conv1d(v.x, v.weight, v.bias, v.state, v.cu, v.indices, v.has, v.out, o,
                            device);
}

struct Update {
  TensorView x, weight, bias, state, indices, accepted, out;
};

Update update_views(std::int64_t batch, std::int64_t steps, std::int64_t dim,
                    std::int64_t width = 4, bool spec = false, DType dtype = DType::bf16) {
  Update v;
  v.x = TensorView::contiguous(fake(0), dtype, {batch, steps, dim});
  v.weight = TensorView::contiguous(fake(1), dtype, {dim, width});
  v.bias = TensorView::contiguous(nullptr, dtype, {dim});
  v.state = TensorView::contiguous(fake(3), DType::f32,
                                   {batch + 1, dim, spec ? width - 2 + steps : width - 1});
  v.indices = TensorView::contiguous(fake(5), DType::i64, {batch});
  v.accepted = TensorView::contiguous(spec ? fake(7) : nullptr, DType::i32, {batch});
  v.out = TensorView::contiguous(fake(6), dtype, {batch, steps, dim});
  return v;
}

Plan plan(const Update& v, const DeviceLimits& device, const CausalConv1dOptions& o = {}) {
  return plan_causal_conv1d_update(v.x, v.weight, v.bias, v.state, v.indices, v.accepted, v.out, o,
                                   device);
}

struct Varlen {
  TensorView x, weight, bias, state, query_start_loc, indices, accepted, out;
};

/// x [T, D] of B varlen rows; a pool of W - 2 + `most` columns when speculative.
Varlen varlen_views(std::int64_t tokens, std::int64_t batch, std::int64_t dim,
                    std::int64_t width = 4, bool spec = false, std::int64_t most = 4) {
  Varlen v;
  v.x = TensorView::contiguous(fake(0), DType::bf16, {tokens, dim});
  v.weight = TensorView::contiguous(fake(1), DType::bf16, {dim, width});
  v.bias = TensorView::contiguous(nullptr, DType::bf16, {dim});
  v.state = TensorView::contiguous(fake(3), DType::bf16,
                                   {batch + 1, dim, spec ? width - 2 + most : width - 1});
  v.query_start_loc = TensorView::contiguous(fake(4), DType::i32, {batch + 1});
  v.indices = TensorView::contiguous(fake(5), DType::i32, {batch});
  v.accepted = TensorView::contiguous(spec ? fake(7) : nullptr, DType::i32, {batch});
  v.out = TensorView::contiguous(fake(6), DType::bf16, {tokens, dim});
  return v;
}

Plan plan(const Varlen& v, const DeviceLimits& device, const CausalConv1dOptions& o = {}) {
  return plan_causal_conv1d_update_varlen(v.x, v.weight, v.bias, v.state, v.query_start_loc,
                                          v.indices, v.accepted, v.out, o, device);
}

void check_legal(const Plan& p, std::int64_t items_at_least) {
  REQUIRE(p.launches.size() == 1);
  const LaunchShape& s = p.launches[0].shape;
  CHECK(s.grid.y == 1);
  CHECK(s.grid.z == 1);
  CHECK(s.grid.x >= 1);
  for (const LimitCheck& c : p.launches[0].checks) CHECK_MESSAGE(c.ok(), c.limit);
  // The launch covers every item (a grid-stride loop where the grid is capped).
  CHECK(static_cast<std::int64_t>(s.grid.x) * s.block.x >=
        std::min<std::int64_t>(items_at_least, std::int64_t{s.grid.x} * s.block.x));
  CHECK(!p.explain().empty());
}

std::string rejection(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument)";
}

// ---------------------------------------------------------------------------------------------
// The reference against a plain full convolution.

/// A host tensor of doubles rounded to `dtype`, with explicit strides.
struct Host {
  DType dtype;
  std::vector<std::int64_t> shape, strides;
  std::vector<unsigned char> bytes;
  Host(DType d, std::vector<std::int64_t> s, std::vector<std::int64_t> st = {})
      : dtype(d), shape(std::move(s)), strides(std::move(st)) {
    if (strides.empty()) {
      strides.assign(shape.size(), 1);
      for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    std::int64_t span = 1;
    for (std::size_t i = 0; i < shape.size(); ++i) span += (shape[i] - 1) * strides[i];
    bytes.assign(static_cast<std::size_t>(span) * size_of(dtype), 0);
  }
  TensorView view() {
    TensorView t;
    t.data = bytes.data();
    t.dtype = dtype;
    t.rank = static_cast<int>(shape.size());
    for (int i = 0; i < t.rank; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    return t;
  }
  std::int64_t off(std::initializer_list<std::int64_t> idx) const {
    std::int64_t o = 0, i = 0;
    for (std::int64_t v : idx) o += v * strides[static_cast<std::size_t>(i++)];
    return o;
  }
  double at(std::initializer_list<std::int64_t> idx) const {
    return load_as_double(bytes.data(), dtype, off(idx));
  }
  void set(std::initializer_list<std::int64_t> idx, double v) {
    store_from_double(bytes.data(), dtype, off(idx), v);
  }
  void fill(std::mt19937_64& rng) {
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(bytes.size() / size_of(dtype)); ++i) {
      store_from_double(bytes.data(), dtype, i, normal(rng));
    }
  }
};

/// y = full convolution of the zero-padded or history-prefixed signal with the reversed kernel,
/// as numpy.convolve(signal, w[::-1])[valid part] would compute it: the formula stated
/// differently from the reference (which slides a window).
std::vector<double> direct_conv(const std::vector<double>& history, const std::vector<double>& xs,
                                const std::vector<double>& w, double bias, bool silu) {
  std::vector<double> signal = history;
  signal.insert(signal.end(), xs.begin(), xs.end());
  const std::size_t width = w.size();
  std::vector<double> full(signal.size() + width - 1, 0.0);
  for (std::size_t i = 0; i < signal.size(); ++i) {
    for (std::size_t k = 0; k < width; ++k) full[i + k] += signal[i] * w[width - 1 - k];
  }
  std::vector<double> y;
  for (std::size_t t = 0; t < xs.size(); ++t) {
    double v = full[t + width - 1] + bias;
    if (silu) v = v / (1.0 + std::exp(-v));
    y.push_back(v);
  }
  return y;
}

TEST_CASE("causal_conv1d reference: a full convolution of each sequence, pool columns, padding") {
  std::mt19937_64 rng(std::random_device{}());
  for (const std::int64_t width : {2, 3, 4, 8}) {
    for (const bool silu : {false, true}) {
      CAPTURE(width);
      CAPTURE(silu);
      const std::int64_t dim = 8, slots = 9;
      // Lengths 0, 1, W-2, W-1, W, 13, with and without initial state, one padding sequence.
      const std::vector<std::int64_t> lengths = {
          1, std::max<std::int64_t>(0, width - 2), width - 1, width, 13, 0, 5};
      const auto seqs = static_cast<std::int64_t>(lengths.size());
      std::vector<std::int64_t> cu = {0};
      for (std::int64_t l : lengths) cu.push_back(cu.back() + l);
      const std::int64_t tokens = cu.back();
      // x token-contiguous ([D, T] buffer seen as [T, D]), pool transposed [slots, W-1, D].
      Host x(DType::bf16, {tokens, dim}, {1, tokens});
      Host weight(DType::f32, {dim, width});
      Host bias(DType::f32, {dim});
      Host pool(DType::f32, {slots, dim, width - 1}, {(width - 1) * dim, 1, dim});
      Host cu_t(DType::i64, {seqs + 1});
      Host idx(DType::i32, {seqs});
      Host has(DType::u8, {seqs});
      for (Host* h : {&x, &weight, &bias, &pool}) h->fill(rng);
      for (std::int64_t n = 0; n <= seqs; ++n) cu_t.set({n}, static_cast<double>(cu[n]));
      const std::vector<std::int64_t> slot_of = {3, 1, -1, 7, 0, 2, 5};
      for (std::int64_t n = 0; n < seqs; ++n) {
        idx.set({n}, static_cast<double>(slot_of[n]));
        has.set({n}, n % 2 == 0 ? 1 : 0);
      }
      const Host pool_before = pool;
      CausalConv1dOptions o;
      o.activation = silu ? ConvActivation::silu : ConvActivation::none;
      o.invalid_index = ConvInvalidIndex::negative;
      const std::vector<double> out =
          reference::causal_conv1d(x.view(), weight.view(), bias.view(), pool.view(), cu_t.view(),
                                   idx.view(), has.view(), o);
      REQUIRE(out.size() == static_cast<std::size_t>(tokens * dim));
      std::vector<bool> touched(static_cast<std::size_t>(slots), false);
      for (std::int64_t n = 0; n < seqs; ++n) {
        const std::int64_t slot = slot_of[n];
        for (std::int64_t c = 0; c < dim; ++c) {
          std::vector<double> history, xs, w;
          for (std::int64_t j = 0; j < width - 1; ++j) {
            history.push_back(n % 2 == 0 && slot >= 0 ? pool_before.at({slot, c, j}) : 0.0);
          }
          for (std::int64_t t = cu[n]; t < cu[n + 1]; ++t) xs.push_back(x.at({t, c}));
          for (std::int64_t j = 0; j < width; ++j) w.push_back(weight.at({c, j}));
          const std::vector<double> want = direct_conv(history, xs, w, bias.at({c}), silu);
          for (std::size_t t = 0; t < xs.size(); ++t) {
            const double got =
                out[static_cast<std::size_t>((cu[n] + static_cast<std::int64_t>(t)) * dim + c)];
            CHECK(got == doctest::Approx(slot < 0 ? 0.0 : want[t]).epsilon(1e-12));
          }
          if (slot < 0 || lengths[n] == 0) continue;
          touched[static_cast<std::size_t>(slot)] = true;
          // The last W-1 entries of history ++ inputs, rounded to the pool's dtype.
          std::vector<double> all = history;
          all.insert(all.end(), xs.begin(), xs.end());
          for (std::int64_t j = 0; j < width - 1; ++j) {
            CHECK(pool.at({slot, c, j}) ==
                  all[all.size() - static_cast<std::size_t>(width - 1 - j)]);
          }
        }
      }
      // Padding (-1) and the empty sequence's slot (2) are untouched, and so are unused slots.
      for (std::int64_t s = 0; s < slots; ++s) {
        if (touched[static_cast<std::size_t>(s)]) continue;
        for (std::int64_t c = 0; c < dim; ++c) {
          for (std::int64_t j = 0; j < width - 1; ++j) {
            CHECK(pool.at({s, c, j}) == pool_before.at({s, c, j}));
          }
        }
      }
    }
  }
}

TEST_CASE("causal_conv1d_update reference: decode, multi-token and speculative columns") {
  std::mt19937_64 rng(std::random_device{}());
  const std::int64_t dim = 16, width = 4, batch = 4;
  for (const std::int64_t steps : {1, 2, 5}) {
    for (const bool spec : {false, true}) {
      CAPTURE(steps);
      CAPTURE(spec);
      const std::int64_t cols = spec ? width - 2 + steps : width - 1;
      Host x(DType::f32, {batch, steps, dim});
      Host weight(DType::f32, {dim, width});
      Host pool(DType::bf16, {6, dim, cols});
      Host idx(DType::i64, {batch});
      Host acc(DType::i32, {batch});
      for (Host* h : {&x, &weight, &pool}) h->fill(rng);
      const std::vector<std::int64_t> slots = {4, 0, -3, 2};
      for (std::int64_t b = 0; b < batch; ++b) {
        idx.set({b}, static_cast<double>(slots[b]));
        acc.set({b}, static_cast<double>(1 + b % (cols - width + 2)));
      }
      const Host before = pool;
      CausalConv1dOptions o;
      o.invalid_index = ConvInvalidIndex::nonpositive;  // slot 0 is a null block here
      TensorView accepted = acc.view();
      if (!spec) accepted.data = nullptr;
      const std::vector<double> out = reference::causal_conv1d_update(
          x.view(), weight.view(), TensorView{}, pool.view(), idx.view(), accepted, o);
      for (std::int64_t b = 0; b < batch; ++b) {
        const bool valid = slots[b] > 0;
        const std::int64_t first = spec ? b % (cols - width + 2) : 0;
        for (std::int64_t c = 0; c < dim; ++c) {
          std::vector<double> history, xs, w;
          for (std::int64_t j = 0; j < width - 1; ++j) {
            history.push_back(valid ? before.at({slots[b], c, first + j}) : 0.0);
          }
          for (std::int64_t s = 0; s < steps; ++s) xs.push_back(x.at({b, s, c}));
          for (std::int64_t j = 0; j < width; ++j) w.push_back(weight.at({c, j}));
          const std::vector<double> want = direct_conv(history, xs, w, 0.0, false);
          for (std::int64_t s = 0; s < steps; ++s) {
            CHECK(out[static_cast<std::size_t>((b * steps + s) * dim + c)] ==
                  doctest::Approx(valid ? want[static_cast<std::size_t>(s)] : 0.0).epsilon(1e-12));
          }
          if (!valid) {
            for (std::int64_t k = 0; k < cols; ++k) {
              CHECK(pool.at({slots[b] < 0 ? 0 : slots[b], c, k}) ==
                    before.at({slots[b] < 0 ? 0 : slots[b], c, k}));
            }
            continue;
          }
          std::vector<double> all = history;
          all.insert(all.end(), xs.begin(), xs.end());
          if (spec) {
            // Accepting a' of the S tokens next step finds its history at columns a'-1..a'+W-3:
            // the W-1 inputs before token a'.
            for (std::int64_t a2 = 1; a2 <= steps; ++a2) {
              for (std::int64_t j = 0; j < width - 1; ++j) {
                CHECK(pool.at({slots[b], c, a2 - 1 + j}) ==
                      doctest::Approx(support::bf16_to_float(support::float_to_bf16(
                          static_cast<float>(all[static_cast<std::size_t>(a2 + j)])))));
              }
            }
          } else {
            for (std::int64_t j = 0; j < width - 1; ++j) {
              CHECK(
                  pool.at({slots[b], c, j}) ==
                  doctest::Approx(support::bf16_to_float(support::float_to_bf16(static_cast<float>(
                      all[all.size() - static_cast<std::size_t>(width - 1 - j)])))));
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Plans

TEST_CASE("causal_conv1d plans are legal over the issue's grid on every known device") {
  for (const Arch arch : DeviceLimits::known_archs()) {
    const DeviceLimits device = DeviceLimits::for_arch(arch);
    CAPTURE(arch.str());
    for (const std::int64_t dim :
         {std::int64_t{8}, std::int64_t{8192}, std::int64_t{65536}, std::int64_t{1} << 20}) {
      for (const std::int64_t tokens :
           {std::int64_t{1}, std::int64_t{4097}, (std::int64_t{1} << 31) - 1}) {
        for (const std::int64_t seqs : {std::int64_t{1}, std::int64_t{16}, std::int64_t{1} << 24}) {
          CAPTURE(dim);
          CAPTURE(tokens);
          CAPTURE(seqs);
          const Plan p = plan(prefill_views(tokens, seqs, dim), device);
          CHECK(p.mode == "chunked");
          check_legal(p, (tokens / p.launches[0].spec.get_int("span") + seqs) * (dim / 8));
          CHECK(p.launches[0].spec.get("vec") == "8");
        }
      }
      for (const std::int64_t batch : {1, 256, 65535, 65536, 70000, 1 << 24}) {
        for (const std::int64_t steps : {1, 4}) {
          CAPTURE(batch);
          const Plan p = plan(update_views(batch, steps, dim, 4, steps > 1), device);
          CHECK(p.mode == "rows");
          check_legal(p, batch * (dim / 8));
        }
      }
    }
  }
}

TEST_CASE("causal_conv1d planner: vector width, in place, forced modes, empty calls") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  Prefill v = prefill_views(1000, 4, 4096);
  CHECK(plan(v, h200).launches[0].spec.str() ==
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=4,span=8,"
        "mode=chunked,pool=block,silu=0,stages=4@sm_90");
  // f32 x: 16-byte accesses are 4 channels.
  CHECK(plan(prefill_views(1000, 4, 4096, 4, DType::f32), h200).launches[0].spec.get("vec") == "4");
  // Token-contiguous x ([D, T] buffer): one channel per thread, and the plan says why.
  Prefill t = v;
  t.x = TensorView::strided(fake(0), DType::bf16, {1000, 4096}, {1, 1000});
  const Plan scalar = plan(t, h200);
  CHECK(scalar.launches[0].spec.get("vec") == "1");
  CHECK(scalar.explain().find("channel strides of x / out are 1000 / 1") != std::string::npos);
  // A row stride that is only 4-byte aligned: 2 bf16 channels per access.
  Prefill odd = v;
  odd.x = TensorView::strided(fake(0), DType::bf16, {1000, 4096}, {4098, 1});
  CHECK(plan(odd, h200).launches[0].spec.get("vec") == "2");
  // In place: the sequential mode, also when asked for nothing; chunked is refused.
  Prefill in_place = v;
  in_place.out = in_place.x;
  CHECK(plan(in_place, h200).mode == "sequential");
  CausalConv1dOptions chunked;
  chunked.force_mode = "chunked";
  CHECK_THROWS_WITH_AS(plan(in_place, h200, chunked), doctest::Contains("not legal in place"),
                       PlanError);
  CausalConv1dOptions sequential;
  sequential.force_mode = "sequential";
  CHECK(plan(v, h200, sequential).mode == "sequential");
  CausalConv1dOptions vec4;
  vec4.force_vec = 4;
  CHECK(plan(v, h200, vec4).launches[0].spec.get("vec") == "4");
  vec4.force_vec = 8;
  CHECK_THROWS_AS(plan(t, h200, vec4), PlanError);
  // The pool's access: vLLM's contiguous [D, W-1] per slot is moved as blocks, a transposed
  // pool ([slots, W-1, D] buffer) as channel vectors, anything else one element at a time.
  Prefill transposed = v;
  transposed.state = TensorView::strided(fake(3), DType::bf16, {5, 4096, 3}, {3 * 4096, 1, 4096});
  CHECK(plan(transposed, h200).launches[0].spec.get("pool") == "channels");
  Prefill wide = v;
  wide.state = TensorView::contiguous(fake(3), DType::bf16, {5, 4096, 5});
  const Plan scalar_pool = plan(wide, h200);
  CHECK(scalar_pool.launches[0].spec.get("pool") == "scalar");
  CHECK(scalar_pool.explain().find("neither") != std::string::npos);
  Prefill f32_pool = transposed;
  f32_pool.state.dtype = DType::f32;  // 8 channels x 4 bytes: more than one 16-byte vector
  CHECK(plan(f32_pool, h200).launches[0].spec.get("pool") == "scalar");
  Prefill odd_slots = v;
  odd_slots.state = TensorView::strided(fake(3), DType::bf16, {5, 4096, 3}, {3 * 4096 + 4, 3, 1});
  CHECK(plan(odd_slots, h200).launches[0].spec.get("pool") == "scalar");
  // Forced chunks: batches of 16 make spans of at least 16 (half the span ids of 8); batches
  // shorter than the W - 1 halo are fine (the span holds the halo).
  CausalConv1dOptions chunk16;
  chunk16.force_chunk = 16;
  const Plan longer = plan(v, h200, chunk16);
  CHECK(longer.launches[0].spec.get("chunk") == "16");
  CHECK(longer.launches[0].spec.get("span") == "16");
  CHECK(longer.explain().find("66 ids for T = 1000, N = 4") != std::string::npos);
  CausalConv1dOptions chunk2;
  chunk2.force_chunk = 2;
  CHECK(plan(v, h200, chunk2).launches[0].spec.get("span") == "8");
  CHECK(plan(update_views(8, 1, 64), h200, chunk2).launches[0].spec.get("chunk") == "2");
  // Forced spans: chunked only, at least the chunk.
  CausalConv1dOptions span64;
  span64.force_span = 64;
  const Plan spans = plan(v, h200, span64);
  CHECK(spans.launches[0].spec.get("span") == "64");
  CHECK(spans.launches[0].spec.get("chunk") == "4");
  CHECK(spans.explain().find("19 ids for T = 1000, N = 4") != std::string::npos);
  CHECK(spans.launches[0].shape.grid.x == 19 * 512 / 128);
  CausalConv1dOptions span8_chunk16 = chunk16;
  span8_chunk16.force_span = 8;
  CHECK_THROWS_WITH_AS(plan(v, h200, span8_chunk16),
                       doctest::Contains("force_span = 8 is shorter than the chunk"), PlanError);
  CHECK_THROWS_WITH_AS(plan(in_place, h200, span64),
                       doctest::Contains("applies to mode 'chunked' only"), PlanError);
  CHECK_THROWS_WITH_AS(plan(update_views(8, 1, 64), h200, span64),
                       doctest::Contains("this call runs mode 'rows'"), PlanError);
  // The planner's span: the longest up to 64 that still gives every SM 1024 items (H200: 132
  // SMs). D = 8192 (1024 channel groups), 16 sequences: 8k tokens make 144 spans of 64 (144 x
  // 1024 items >= 132 x 1024), and so do 32k and 128k tokens; 1000 tokens over 4 sequences
  // only spans of 8 (above).
  CHECK(plan(prefill_views(8192, 16, 8192), h200).launches[0].spec.get("span") == "64");
  CHECK(plan(prefill_views(32768, 16, 8192), h200).launches[0].spec.get("span") == "64");
  CHECK(plan(prefill_views(131072, 16, 8192), h200).launches[0].spec.get("span") == "64");
  CHECK(plan(prefill_views(131072, 16, 8192), h200)
            .explain()
            .find("span = 64 tokens per work "
                  "item") != std::string::npos);
  CHECK(plan(prefill_views(100, 2, 64), h200).launches[0].spec.get("span") == "8");
  // On an H100 (25.4 GB/s of DRAM per SM, under 30) the longest span is 32, and the plan says
  // why; the A100's slower DRAM per SM keeps 64 (measured on Hopper only), as does a Hopper
  // at exactly 30 GB/s per SM; a forced span stays what it is.
  const DeviceLimits h100 = DeviceLimits::for_name("h100");
  for (const std::int64_t tokens : {8192, 32768, 131072}) {
    CAPTURE(tokens);
    const Plan on_h100 = plan(prefill_views(tokens, 16, 8192), h100);
    CHECK(on_h100.launches[0].spec.get("span") == "32");
    CHECK(on_h100.explain().find("(longest 32, not 64: 25.4 GB/s of DRAM bandwidth per SM < 30") !=
          std::string::npos);
  }
  CHECK(plan(prefill_views(100, 2, 64), h100).launches[0].spec.get("span") == "8");
  CHECK(plan(prefill_views(131072, 16, 8192), DeviceLimits::for_name("a100"))
            .launches[0]
            .spec.get("span") == "64");
  DeviceLimits edge = h100;
  edge.dram_bytes_per_second = 30'000'000'000LL * edge.sm_count;
  CHECK(plan(prefill_views(131072, 16, 8192), edge).launches[0].spec.get("span") == "64");
  edge.dram_bytes_per_second -= 1;
  CHECK(plan(prefill_views(131072, 16, 8192), edge).launches[0].spec.get("span") == "32");
  CHECK(plan(prefill_views(131072, 16, 8192), h100, span64).launches[0].spec.get("span") == "64");
  // W > 4: 4 channels per thread in the prefill (the update keeps 8).
  const Plan w8 = plan(prefill_views(1000, 4, 4096, 8), h200);
  CHECK(w8.launches[0].spec.get("vec") == "4");
  CHECK(w8.explain().find("W = 8 > 4") != std::string::npos);
  CHECK(plan(update_views(8, 1, 64, 8), h200).launches[0].spec.get("vec") == "8");
  CausalConv1dOptions vec8;
  vec8.force_vec = 8;
  CHECK(plan(prefill_views(1000, 4, 4096, 8), h200, vec8).launches[0].spec.get("vec") == "8");
  // Sequential and rows carry no span.
  CHECK(plan(in_place, h200).launches[0].spec.get("span") == "0");
  CHECK(plan(update_views(8, 1, 64), h200).launches[0].spec.get("span") == "0");
  CHECK(plan(update_views(8, 3, 64), h200).launches[0].spec.get("chunk") == "4");
  // Nothing to do: no launch.
  CHECK(plan(prefill_views(0, 4, 64), h200).launches.empty());
  CHECK(plan(prefill_views(0, 0, 64), h200).mode == "empty");
  CHECK(plan(update_views(0, 1, 64), h200).launches.empty());
  // Update: [B, D] is S = 1.
  Update u = update_views(32, 1, 64);
  u.x = TensorView::contiguous(fake(0), DType::bf16, {32, 64});
  u.out = TensorView::contiguous(fake(6), DType::bf16, {32, 64});
  CHECK(plan(u, h200).mode == "rows");
  CausalConv1dOptions silu;
  silu.activation = ConvActivation::silu;
  CHECK(plan(u, h200, silu).launches[0].spec.get("silu") == "1");
}

/// The benchmark's decode step: B rows of D channels, W = 4, bf16 everywhere (pool included).
Update bench_decode_views(std::int64_t batch, std::int64_t dim) {
  Update v = update_views(batch, 1, dim, 4);
  v.state = TensorView::contiguous(fake(3), DType::bf16, {batch + 1, dim, 3});
  return v;
}

TEST_CASE(
    "causal_conv1d planner: the minimum-blocks candidate is opt-in (force_min_blocks), "
    "4 stages are the chunked prefill's default (force_stages)") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  CausalConv1dOptions silu;
  silu.activation = ConvActivation::silu;
  // The default plans do not name min_blocks: their specs are the ones before the candidate
  // existed.
  const Plan decode = plan(bench_decode_views(256, 8192), h200, silu);
  CHECK(decode.launches[0].spec.str() ==
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=1,span=0,"
        "mode=rows,pool=block,silu=1@sm_90");
  CHECK(decode.launches[0].shape.grid.x == 256 * 1024 / 128);
  CHECK_FALSE(
      plan(prefill_views(8192, 16, 8192, 4), h200, silu).launches[0].spec.has("min_blocks"));
  // Minimum blocks: every mode; the spec names it, so each is its own kernel.
  CausalConv1dOptions blocks = silu;
  blocks.force_min_blocks = 4;
  const Plan prefill4 = plan(prefill_views(8192, 16, 8192, 4), h200, blocks);
  CHECK(prefill4.launches[0].spec.str() ==
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=4,span=64,"
        "mode=chunked,pool=block,silu=1,min_blocks=4,stages=4@sm_90");
  CHECK(prefill4.explain().find("at most 128 registers per thread") != std::string::npos);
  CHECK(plan(bench_decode_views(256, 8192), h200, blocks).launches[0].spec.str() ==
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=1,span=0,"
        "mode=rows,pool=block,silu=1,min_blocks=4@sm_90");
  // Values outside the accepted sets, and a spec naming the removed rows-per-item candidate
  // (slower than the default at every batch on the H200: docs/performance.md).
  CausalConv1dOptions bad;
  bad.force_min_blocks = 7;
  CHECK_THROWS_WITH_AS(plan(prefill_views(100, 2, 64), h200, bad),
                       doctest::Contains("options.force_min_blocks = 7; accepted: 0"),
                       InvalidArgument);
  CHECK_THROWS_WITH_AS(
      KernelSpec::parse("causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,"
                        "chunk=1,span=0,mode=rows,pool=block,silu=1,rows=2@sm_90"),
      doctest::Contains("causal_conv1d has no parameter 'rows'"), InvalidArgument);
  // Stages: the chunked mode's 16-byte accesses only, stages x chunk <= 24. By default 4 where
  // they apply (Qwen3-Next's prefill), none elsewhere; force_stages = 1 keeps the registers.
  const Plan by_default = plan(prefill_views(8192, 16, 8192, 4), h200, silu);
  CHECK(by_default.launches[0].spec.str() ==
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=4,span=64,"
        "mode=chunked,pool=block,silu=1,stages=4@sm_90");
  CHECK(by_default.explain().find("stages = 4: x's batches of 4 tokens go to shared memory") !=
        std::string::npos);
  CausalConv1dOptions unstaged = silu;
  unstaged.force_stages = 1;
  const Plan registers = plan(prefill_views(8192, 16, 8192, 4), h200, unstaged);
  CHECK_FALSE(registers.launches[0].spec.has("stages"));
  CHECK(registers.explain().find("no stages (options.force_stages = 1)") != std::string::npos);
  const Plan update_unstaged = plan(update_views(8, 1, 64), h200, unstaged);
  CHECK_FALSE(update_unstaged.launches[0].spec.has("stages"));
  // Where stages never apply, forcing none says nothing about them.
  CHECK(update_unstaged.explain().find("stages") == std::string::npos);
  CausalConv1dOptions narrow = silu;  // 8-byte accesses, or batches of 8 tokens: no stages
  narrow.force_vec = 4;
  CHECK_FALSE(plan(prefill_views(1000, 4, 4096), h200, narrow).launches[0].spec.has("stages"));
  narrow.force_vec = 0;
  narrow.force_chunk = 8;
  CHECK_FALSE(plan(prefill_views(1000, 4, 4096), h200, narrow).launches[0].spec.has("stages"));
  Prefill in_place_views = prefill_views(100, 3, 64);
  in_place_views.out = in_place_views.x;
  CHECK_FALSE(plan(in_place_views, h200, silu).launches[0].spec.has("stages"));
  // Forcing the default's 4 stages gives the default's kernel.
  CausalConv1dOptions staged = silu;
  staged.force_stages = 4;
  const Plan s4 = plan(prefill_views(8192, 16, 8192, 4), h200, staged);
  CHECK(s4.launches[0].spec.str() == by_default.launches[0].spec.str());
  CHECK(s4.explain().find("3 batches ahead of the one computed (32768 bytes per block)") !=
        std::string::npos);
  CHECK_THROWS_WITH_AS(plan(update_views(8, 1, 64), h200, staged),
                       doctest::Contains("options.force_stages = 4 needs mode 'chunked'"),
                       PlanError);
  CHECK_THROWS_WITH_AS(plan(in_place_views, h200, staged),
                       doctest::Contains("this call runs mode 'sequential'"), PlanError);
  staged.force_vec = 4;
  CHECK_THROWS_WITH_AS(plan(prefill_views(1000, 4, 4096), h200, staged),
                       doctest::Contains("with 8-byte accesses and chunk 4"), PlanError);
  staged.force_vec = 0;
  staged.force_stages = 6;
  staged.force_chunk = 8;
  CHECK_THROWS_WITH_AS(plan(prefill_views(1000, 4, 4096), h200, staged),
                       doctest::Contains("stages x chunk <= 24"), PlanError);
  bad.force_min_blocks = 0;
  bad.force_stages = 5;
  CHECK_THROWS_WITH_AS(plan(prefill_views(100, 2, 64), h200, bad),
                       doctest::Contains("options.force_stages = 5; accepted: 0"), InvalidArgument);
}

TEST_CASE("causal_conv1d: the tuning candidates' kernels compile for sm_90 (registers, spills)") {
  // Not a limit: the candidates are measured on a GPU (bench_causal_conv1d,
  // KJIT_CONV_BENCH_MODES); this prints what each costs in registers and spills beside the
  // default, for the performance notes.
  const Settings settings = Settings::from_env();
  const std::string cuda_home = settings.resolved_cuda_home();
  const compile::Compiler& nvrtc = compile::compiler(settings.nvrtc_library, cuda_home);
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  CausalConv1dOptions silu;
  silu.activation = ConvActivation::silu;
  std::vector<KernelSpec> specs;
  for (const int blocks : {0, 4, 6}) {
    CausalConv1dOptions o = silu;
    o.force_min_blocks = blocks;
    specs.push_back(plan(bench_decode_views(2048, 8192), h200, o).launches[0].spec);
  }
  for (const int blocks : {0, 3, 4, 5}) {
    for (const int vec : {0, 4}) {
      CausalConv1dOptions o = silu;
      o.force_min_blocks = blocks;
      o.force_vec = vec;
      specs.push_back(plan(prefill_views(32768, 16, 8192, 4), h200, o).launches[0].spec);
    }
    for (const auto& [stages, chunk] :
         std::vector<std::pair<int, int>>{{2, 4}, {3, 4}, {4, 4}, {6, 4}, {3, 8}}) {
      CausalConv1dOptions o = silu;
      o.force_min_blocks = blocks;
      o.force_stages = stages;
      o.force_chunk = chunk;
      specs.push_back(plan(prefill_views(32768, 16, 8192, 4), h200, o).launches[0].spec);
    }
  }
  std::vector<std::string> report(specs.size());
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < specs.size(); i += 2) {
        try {
          const CompiledKernel k = nvrtc.compile(specs[i]);
          report[i] = fmt::format("{} registers, {} bytes spill stores, {} bytes spill loads",
                                  k.resources.registers, k.resources.spill_store_bytes,
                                  k.resources.spill_load_bytes);
        } catch (const Error& e) {
          report[i] = fmt::format("ERROR {}", e.what());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    CHECK(report[i].rfind("ERROR", 0) == std::string::npos);
    MESSAGE(fmt::format("{}: {}", specs[i].str(), report[i]));
  }
}

TEST_CASE("causal_conv1d argument errors name the argument, its value and what is accepted") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  auto expect = [&](const Prefill& v, const CausalConv1dOptions& o,
                    std::initializer_list<const char*> parts) {
    const std::string what = rejection([&] { plan(v, h200, o); });
    for (const char* part : parts) CHECK_MESSAGE(what.find(part) != std::string::npos, what);
  };
  const CausalConv1dOptions none;
  {
    Prefill v = prefill_views(100, 2, 100);
    expect(v, none, {"causal_conv1d:", "D = 100", "a multiple of 8 in 8..2^20"});
    v = prefill_views(100, 2, (std::int64_t{1} << 20) + 8);
    expect(v, none, {"D = 1048584"});
  }
  {
    Prefill v = prefill_views(100, 2, 64);
    v.weight = TensorView::contiguous(fake(1), DType::bf16, {64, 9});
    expect(v, none, {"weight", "W = 9", "2..8"});
    v.weight = TensorView::contiguous(fake(1), DType::bf16, {64, 1});
    expect(v, none, {"W = 1"});
    v.weight = TensorView::contiguous(fake(1), DType::f16, {64, 4});
    expect(v, none, {"weight has dtype f16", "bf16 (x's dtype) or f32"});
    v.weight = TensorView::contiguous(fake(1), DType::bf16, {32, 4});
    expect(v, none, {"weight has shape [32, 4]", "D = 64"});
  }
  {
    Prefill v = prefill_views(100, 2, 64);
    v.bias = TensorView::contiguous(fake(2), DType::f32, {64});
    expect(v, none, {"bias has dtype f32", "weight's dtype"});
    v = prefill_views(100, 2, 64);
    v.state = TensorView::contiguous(fake(3), DType::bf16, {3, 64, 2});
    expect(v, none, {"conv_state has shape [3, 64, 2]", "L >= W - 1 = 3"});
    v.state = TensorView::contiguous(fake(3), DType::i32, {3, 64, 3});
    expect(v, none, {"conv_state has dtype i32", "f16, bf16, f32"});
  }
  {
    Prefill v = prefill_views(100, 2, 64);
    v.cu = TensorView::contiguous(fake(4), DType::f32, {3});
    expect(v, none, {"cu_seqlens has dtype f32", "i32, i64"});
    // Tokens without a sequence: nothing would write their out rows.
    expect(prefill_views(100, 0, 64), none,
           {"cu_seqlens holds 1 offset (N = 0 sequences) but x has T = 100 tokens", "N >= 1"});
    v = prefill_views(100, 2, 64);
    v.indices = TensorView::contiguous(fake(5), DType::i32, {3});
    expect(v, none, {"state_indices has shape [3]", "[N] = [2]"});
    v = prefill_views(100, 2, 64);
    v.has = TensorView::contiguous(fake(7), DType::i32, {2});
    expect(v, none, {"has_initial_state has dtype i32", "u8"});
    v = prefill_views(100, 2, 64);
    v.out = TensorView::contiguous(fake(6), DType::bf16, {99, 64});
    expect(v, none, {"out has shape [99, 64]", "[100, 64]"});
    v = prefill_views(100, 2, 64);
    v.out = TensorView::contiguous(static_cast<char*>(fake(0)) + 128, DType::bf16, {100, 64});
    expect(v, none, {"overlaps x", "out == x"});
    v = prefill_views(100, 2, 64);
    v.out = TensorView::strided(fake(6), DType::bf16, {100, 64}, {0, 1});
    expect(v, none, {"out", "stride 0 in dimension 0"});
    v = prefill_views(100, 2, 64);
    v.x = TensorView::contiguous(static_cast<char*>(fake(0)) + 1, DType::bf16, {100, 64});
    expect(v, none, {"x data pointer", "not aligned"});
    v = prefill_views(100, std::int64_t{1} << 24, 64);
    v.cu = TensorView::contiguous(fake(4), DType::i32, {(std::int64_t{1} << 24) + 2});
    v.indices = TensorView::contiguous(fake(5), DType::i32, {(std::int64_t{1} << 24) + 1});
    expect(v, none, {"N = 16777217", "at most 2^24"});
    v = prefill_views(std::int64_t{1} << 31, 2, 64);
    expect(v, none, {"T = 2147483648", "2^31 - 1"});
  }
  {
    CausalConv1dOptions o;
    o.force_mode = "rows";
    expect(prefill_views(100, 2, 64), o, {"force_mode = 'rows'", "'chunked', 'sequential'"});
    o.force_mode = "";
    o.force_vec = 3;
    expect(prefill_views(100, 2, 64), o, {"force_vec = 3", "1, 2, 4, 8"});
    o.force_vec = 0;
    o.force_chunk = 32;
    expect(prefill_views(100, 2, 64), o, {"force_chunk = 32", "1, 2, 4, 8, 16"});
    o.force_chunk = 0;
    for (const int span : {4, 48, 512}) {
      o.force_span = span;
      expect(prefill_views(100, 2, 64), o,
             {fmt::format("force_span = {}", span).c_str(), "8, 16, 32, 64, 128, 256"});
    }
  }
  // The update's own arguments.
  auto expect_update = [&](const Update& v, std::initializer_list<const char*> parts) {
    const std::string what = rejection([&] { plan(v, h200); });
    for (const char* part : parts) CHECK_MESSAGE(what.find(part) != std::string::npos, what);
  };
  {
    Update v = update_views(8, 2, 64, 4, true);
    v.accepted = TensorView::contiguous(fake(7), DType::i32, {7});
    expect_update(v, {"causal_conv1d_update:", "num_accepted_tokens has shape [7]", "[B] = [8]"});
    v = update_views(8, 2, 64);
    v.x = TensorView::contiguous(fake(0), DType::bf16, {8, 0, 64});
    v.out = TensorView::contiguous(fake(6), DType::bf16, {8, 0, 64});
    expect_update(v, {"S = 0", "S >= 1"});
    v = update_views(8, 2, 64);
    v.x = TensorView::contiguous(fake(0), DType::bf16, {8});
    expect_update(v, {"x has rank 1", "[B, S, D]"});
    v = update_views(8, 2, 64);
    v.indices = TensorView::contiguous(fake(5), DType::u8, {8});
    expect_update(v, {"state_indices has dtype u8", "i32, i64"});
    v = update_views(std::int64_t{1} << 30, 2, 64);
    expect_update(v, {"B * S", "< 2^31"});
  }
}

TEST_CASE("causal_conv1d_update_varlen: plans independent of the offsets, argument errors") {
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  // The rows mode over B rows; loads in flight for the mean row length ceil(T / B).
  const Plan p = plan(varlen_views(96, 32, 8192, 4, true), h200);
  CHECK(p.mode == "rows");
  CHECK(p.launches[0].spec.get("chunk") == "4");
  CHECK(p.launches[0].spec.get("span") == "0");
  CHECK(p.launches[0].shape.grid.x == 32 * 1024 / 128);
  CHECK(p.explain().find("query_start_loc[b]") != std::string::npos);
  // The same kernel as the equal-length rows of that length.
  Update equal = update_views(32, 3, 8192, 4, true);
  equal.state = varlen_views(96, 32, 8192, 4, true).state;
  CHECK(plan(equal, h200).launches[0].spec.str() == p.launches[0].spec.str());
  CHECK(plan(varlen_views(8, 32, 64), h200).launches[0].spec.get("chunk") == "1");
  CHECK(plan(varlen_views(1000, 4, 64), h200).launches[0].spec.get("chunk") == "8");
  // No tokens or no rows: nothing launched.
  CHECK(plan(varlen_views(0, 32, 64), h200).launches.empty());
  CHECK(plan(varlen_views(5, 0, 64), h200).launches.empty());
  for (const Arch arch : DeviceLimits::known_archs()) {
    check_legal(plan(varlen_views((std::int64_t{1} << 31) - 1, std::int64_t{1} << 24,
                                  std::int64_t{1} << 20, 4, true),
                     DeviceLimits::for_arch(arch)),
                (std::int64_t{1} << 24) * (std::int64_t{1} << 17));
  }
  auto expect = [&](const Varlen& v, std::initializer_list<const char*> parts) {
    const std::string what = rejection([&] { plan(v, h200); });
    for (const char* part : parts) CHECK_MESSAGE(what.find(part) != std::string::npos, what);
  };
  Varlen v = varlen_views(20, 8, 64);
  v.query_start_loc = TensorView::contiguous(fake(4), DType::i32, {8});
  expect(v, {"causal_conv1d_update:", "query_start_loc has shape [8]", "[B + 1] = [9]", "B = 8"});
  v = varlen_views(20, 8, 64);
  v.query_start_loc = TensorView::contiguous(fake(4), DType::f32, {9});
  expect(v, {"query_start_loc has dtype f32", "i32, i64"});
  v = varlen_views(20, 8, 64);
  v.query_start_loc = TensorView::contiguous(static_cast<char*>(fake(4)) + 2, DType::i32, {9});
  expect(v, {"query_start_loc data pointer", "not aligned"});
  v = varlen_views(20, 8, 64);
  v.x = TensorView::contiguous(fake(0), DType::bf16, {4, 5, 64});
  expect(v, {"x has rank 3", "[T, D]"});
  v = varlen_views(20, 8, 64, 4, true);
  v.accepted = TensorView::contiguous(fake(7), DType::i32, {20});
  expect(v, {"num_accepted_tokens has shape [20]", "[B] = [8]"});
  v = varlen_views(20, 8, 64);
  v.out = TensorView::contiguous(fake(6), DType::bf16, {19, 64});
  expect(v, {"out has shape [19, 64]", "[20, 64]"});
  v = varlen_views(20, 8, 64);
  v.indices = TensorView::contiguous(fake(5), DType::i32, {8, 1});
  expect(v, {"state_indices has rank 2", "[B]"});
}

TEST_CASE("causal_conv1d_update_varlen reference: each row a direct convolution of its tokens") {
  std::mt19937_64 rng(std::random_device{}());
  const std::int64_t dim = 8, width = 4, most = 5;
  // Rows of 0..5 tokens (row 1 empty, row 4 padding); two trailing tokens in no row.
  const std::vector<std::int64_t> lengths = {3, 0, 1, 5, 2, 4};
  const std::vector<std::int64_t> slots = {4, 2, 0, 6, -1, 1};
  const auto batch = static_cast<std::int64_t>(lengths.size());
  std::vector<std::int64_t> qsl = {0};
  for (std::int64_t l : lengths) qsl.push_back(qsl.back() + l);
  const std::int64_t tokens = qsl.back() + 2;
  for (const bool spec : {false, true}) {
    CAPTURE(spec);
    const std::int64_t cols = spec ? width - 2 + most : width - 1;
    Host x(DType::f32, {tokens, dim});
    Host weight(DType::f32, {dim, width});
    Host pool(DType::f32, {8, dim, cols});
    Host q(DType::i64, {batch + 1}), idx(DType::i32, {batch}), acc(DType::i64, {batch});
    for (Host* h : {&x, &weight, &pool}) h->fill(rng);
    for (std::int64_t b = 0; b <= batch; ++b) q.set({b}, static_cast<double>(qsl[b]));
    for (std::int64_t b = 0; b < batch; ++b) {
      idx.set({b}, static_cast<double>(slots[b]));
      acc.set({b}, static_cast<double>(1 + b % (cols - width + 2)));
    }
    const Host before = pool;
    CausalConv1dOptions o;
    TensorView accepted = acc.view();
    if (!spec) accepted.data = nullptr;
    const std::vector<double> out =
        reference::causal_conv1d_update_varlen(x.view(), weight.view(), TensorView{}, pool.view(),
                                               q.view(), idx.view(), accepted, o, -5.0);
    REQUIRE(out.size() == static_cast<std::size_t>(tokens * dim));
    for (std::int64_t t = qsl.back(); t < tokens; ++t) {
      for (std::int64_t c = 0; c < dim; ++c)
        CHECK(out[static_cast<std::size_t>(t * dim + c)] == -5.0);
    }
    for (std::int64_t b = 0; b < batch; ++b) {
      CAPTURE(b);
      const bool valid = slots[b] >= 0;
      const std::int64_t first = spec ? b % (cols - width + 2) : 0;
      for (std::int64_t c = 0; c < dim; ++c) {
        std::vector<double> history, xs, w;
        for (std::int64_t j = 0; j < width - 1; ++j) {
          history.push_back(valid ? before.at({slots[b], c, first + j}) : 0.0);
        }
        for (std::int64_t t = qsl[b]; t < qsl[b + 1]; ++t) xs.push_back(x.at({t, c}));
        for (std::int64_t j = 0; j < width; ++j) w.push_back(weight.at({c, j}));
        const std::vector<double> want = direct_conv(history, xs, w, 0.0, false);
        for (std::size_t s = 0; s < xs.size(); ++s) {
          const auto t = qsl[b] + static_cast<std::int64_t>(s);
          CHECK(out[static_cast<std::size_t>(t * dim + c)] ==
                doctest::Approx(valid ? want[s] : 0.0).epsilon(1e-12));
        }
        if (!valid) continue;
        std::vector<double> all = history;
        all.insert(all.end(), xs.begin(), xs.end());
        const auto steps = static_cast<std::int64_t>(xs.size());
        for (std::int64_t k = 0; k < cols; ++k) {
          // The empty row leaves its slot as it was; otherwise columns 0..W-2 are the last W-1
          // entries, or (speculative) column k < W-2+S_b is entry k+1 and the rest untouched.
          double expected = before.at({slots[b], c, k});
          if (steps > 0 && !spec && k < width - 1) {
            expected = all[static_cast<std::size_t>(steps + k)];
          } else if (steps > 0 && spec && k < width - 2 + steps) {
            expected = all[static_cast<std::size_t>(k + 1)];
          }
          CHECK(pool.at({slots[b], c, k}) == expected);
        }
      }
    }
    // The padding row's "slot" -1 and the unused slots 3, 5, 7 are untouched.
    for (const std::int64_t s : {3, 5, 7}) {
      for (std::int64_t c = 0; c < dim; ++c) {
        for (std::int64_t k = 0; k < cols; ++k) CHECK(pool.at({s, c, k}) == before.at({s, c, k}));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// NVRTC

TEST_CASE("causal_conv1d: the kernels of representative plans compile for sm_90") {
  const Settings settings = Settings::from_env();
  const std::string cuda_home = settings.resolved_cuda_home();
  const compile::Compiler& nvrtc = compile::compiler(settings.nvrtc_library, cuda_home);
  const DeviceLimits h200 = DeviceLimits::for_name("h200");
  std::vector<KernelSpec> specs;
  auto add = [&](const Plan& p) {
    REQUIRE(p.launches.size() == 1);
    specs.push_back(p.launches[0].spec);
  };
  CausalConv1dOptions silu;
  silu.activation = ConvActivation::silu;
  add(plan(prefill_views(8192, 16, 8192, 4), h200, silu));  // bf16, vec 8, chunked
  Prefill in_place = prefill_views(100, 3, 64, 8, DType::f16);
  in_place.out = in_place.x;
  add(plan(in_place, h200));  // f16 sequential, W = 8
  Prefill f32 = prefill_views(100, 3, 64, 2, DType::f32);
  f32.x = TensorView::strided(fake(0), DType::f32, {100, 64}, {1, 100});
  add(plan(f32, h200));                                          // f32 scalar, W = 2
  add(plan(update_views(256, 1, 8192, 4), h200, silu));          // decode
  add(plan(update_views(4, 8, 64, 3, true, DType::f32), h200));  // speculative, f32
  Prefill channels = prefill_views(100, 3, 64);
  channels.state = TensorView::strided(fake(3), DType::bf16, {4, 64, 3}, {3 * 64, 1, 64});
  add(plan(channels, h200));  // channel-vector pool
  CausalConv1dOptions span64 = silu;
  span64.force_span = 64;
  add(plan(prefill_views(32768, 16, 8192, 4), h200, span64));  // spans of 64 (bench)
  add(plan(varlen_views(96, 32, 8192, 4, true), h200, silu));  // varlen speculative rows
  std::vector<std::string> errors(specs.size());
  std::vector<int> registers(specs.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      for (std::size_t i = w; i < specs.size(); i += 2) {
        try {
          const CompiledKernel k = nvrtc.compile(specs[i]);
          registers[i] = k.resources.registers;
          if (k.resources.spill_store_bytes > 0) {
            errors[i] = fmt::format("spills {} bytes", k.resources.spill_store_bytes);
          }
        } catch (const Error& e) {
          errors[i] = e.what();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // Every pool access is among them.
  for (const char* access : {"block", "channels", "scalar"}) {
    CHECK(std::any_of(specs.begin(), specs.end(),
                      [&](const KernelSpec& spec) { return spec.get("pool") == access; }));
  }
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].str());
    CHECK_MESSAGE(errors[i].empty(), errors[i]);
    // The register counts the performance notes quote (docs/performance.md).
    MESSAGE(fmt::format("{}: {} registers", specs[i].str(), registers[i]));
  }
}

}  // namespace
}  // namespace kjit
