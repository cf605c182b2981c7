// SPDX-License-Identifier: Apache-2.0
// The causal_conv1d kernel template compiled as host C++ and run on the CPU (threads one after
// another, tests/common/cuda_host_emulation.hpp) against the float64 reference: every mode
// (chunked, sequential in place, rows), every pool access (block, channels, scalar), the weight
// block and strided paths, speculative updates over several steps, padding under both rules;
// outputs within the dtype's rounding, the pool byte for byte. Parameters are built as
// lib/ops/causal_conv1d/launch.cpp builds them, from the op's own plan (whose spec must match the
// instantiated kernel). This checks indexing and arithmetic where no GPU exists; races and the
// memory model are the GPU suite's (tests/gpu/causal_conv1d_test.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/host_data.hpp"
#include "kjit/device.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/types.hpp"
#include "ops/causal_conv1d/family.hpp"
// (keep this order: the emulation header defines __device__ & co. for the template)
#include "common/cuda_host_emulation.hpp"
// (the host compiler does not know #pragma unroll: tests/CMakeLists.txt silences that here)
#include "templates/causal_conv1d/causal_conv1d.cuh"

namespace kjit {
namespace {

using support::load_as_double;
using support::store_from_double;
using Host = test::HostTensor;

using Kernel = void (*)(const CausalConv1dParams);
void launch(Kernel k, const Plan& plan, const CausalConv1dParams& p) {
  const LaunchShape& s = plan.launches.at(0).shape;
  emulated_launch(k, s.grid.x, s.block.x, p);
}

void compare(const char* what, const TensorView& out, const std::vector<double>& want,
             double rtol) {
  double worst = 0;
  std::int64_t inner = out.shape[out.rank - 1], rows = want.size() / inner;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::int64_t rest = r, base = 0;
    for (int d = out.rank - 2; d >= 0; --d) {
      base += (rest % out.shape[d]) * out.strides[d];
      rest /= out.shape[d];
    }
    for (std::int64_t c = 0; c < inner; ++c) {
      double g = load_as_double(out.data, out.dtype, base + c * out.strides[out.rank - 1]),
             w = want[r * inner + c];
      double e = std::isfinite(g) ? std::abs(g - w) / (1e-5 + rtol * std::abs(w)) : 1e30;
      worst = std::max(worst, e);
    }
  }
  CAPTURE(what);
  CHECK(worst <= 1.0);
}
void compare_bytes(const char* what, Host& a, Host& b) {
  CAPTURE(what);
  CHECK(std::memcmp(a.data(), b.data(),
                    static_cast<std::size_t>(a.elements()) * size_of(a.dtype)) == 0);
}

// The launch's own parameters (lib/ops/causal_conv1d/launch.cpp's Family::params) from the op's
// checks and planner, whose plan must be the public one the case planned (`spec`).
CausalConv1dParams library_params(const ops::conv1d::Args& args, const std::string& spec) {
  const ops::conv1d::Problem problem = ops::conv1d::Family::check(args);
  const auto planned = ops::conv1d::Family::plan(problem, DeviceLimits::for_name("h200"));
  REQUIRE(planned.plan.launches.at(0).spec.str() == spec);
  return ops::conv1d::Family::params(args, problem, planned.choice, nullptr);
}

template <Kernel K>
void prefill_case(const char* name, const char* expect_spec_prefix, DType xd, DType wd, DType sd,
                  std::int64_t W, bool x_tokmajor, bool pool_transposed, bool in_place,
                  std::vector<std::int64_t> lengths, ConvInvalidIndex rule, int force_chunk = 0,
                  int force_span = 0, int force_min_blocks = 0, int force_stages = 0) {
  std::mt19937_64 rng(std::random_device{}());
  const std::int64_t D = 64, N = lengths.size(), slots = N + 3;
  std::vector<std::int64_t> cu{0};
  for (auto l : lengths) cu.push_back(cu.back() + l);
  const std::int64_t T = cu.back();
  Host x(xd, {T, D}, x_tokmajor ? std::vector<std::int64_t>{1, T} : std::vector<std::int64_t>{});
  Host w(wd, {D, W}), b(wd, {D}),
      pool(sd, {slots, D, W - 1},
           pool_transposed ? std::vector<std::int64_t>{(W - 1) * D, 1, D}
                           : std::vector<std::int64_t>{});
  Host cuh(DType::i32, {N + 1}), idx(DType::i64, {N}), has(DType::u8, {N}), out(xd, {T, D});
  x.fill(rng);
  w.fill(rng);
  b.fill(rng);
  pool.fill(rng);
  for (std::int64_t i = 0; i <= N; ++i) cuh.set(i, static_cast<double>(cu[i]));
  for (std::int64_t i = 0; i < N; ++i) {
    idx.set(i, static_cast<double>(i % 4 == 3 ? (rule == ConvInvalidIndex::nonpositive ? 0 : -1)
                                              : i + 1));
    has.set(i, static_cast<double>(i % 2));
  }
  Host pool_ref = pool;
  Host x_ref = x;
  CausalConv1dOptions o;
  o.activation = ConvActivation::silu;
  o.invalid_index = rule;
  o.force_chunk = force_chunk;
  o.force_span = force_span;
  o.force_min_blocks = force_min_blocks;
  o.force_stages = force_stages;
  TensorView outv = in_place ? x.view() : out.view();
  Plan plan = plan_causal_conv1d(x.view(), w.view(), b.view(), pool.view(), cuh.view(), idx.view(),
                                 has.view(), outv, o, DeviceLimits::for_name("h200"));
  std::string spec = plan.launches[0].spec.str();
  REQUIRE_MESSAGE(spec.rfind(expect_spec_prefix, 0) == 0, name << ": the plan's spec " << spec);
  std::vector<double> want = reference::causal_conv1d(
      x_ref.view(), w.view(), b.view(), pool_ref.view(), cuh.view(), idx.view(), has.view(), o);
  const TensorView xv = x.view(), wv = w.view(), bv = b.view(), pv = pool.view(), cuv = cuh.view(),
                   idxv = idx.view(), hasv = has.view();
  ops::conv1d::Args args;
  args.op = ops::conv1d::Op::prefill;
  args.x = &xv;
  args.weight = &wv;
  args.bias = &bv;
  args.conv_state = &pv;
  args.cu_seqlens = &cuv;
  args.state_indices = &idxv;
  args.has_initial_state = &hasv;
  args.out = &outv;
  args.options = &o;
  const CausalConv1dParams k = library_params(args, spec);
  launch(K, plan, k);
  compare(name, outv, want, xd == DType::f32 ? 1e-5 : xd == DType::f16 ? 1.0 / 512 : 1.0 / 128);
  compare_bytes(name, pool, pool_ref);
}

template <Kernel K>
void update_case(const char* name, const char* expect_spec_prefix, DType xd, DType wd, DType sd,
                 std::int64_t W, std::int64_t S, bool spec_mode, bool pool_transposed,
                 bool in_place, ConvInvalidIndex rule, int rounds, int force_min_blocks = 0,
                 std::int64_t B = 9) {
  std::mt19937_64 rng(std::random_device{}());
  const std::int64_t D = 64, slots = B + 2, L = spec_mode ? std::max(W - 1, W - 2 + S) : W - 1;
  Host w(wd, {D, W}), b(wd, {D}),
      pool(sd, {slots, D, L},
           pool_transposed ? std::vector<std::int64_t>{L * D, 1, D} : std::vector<std::int64_t>{});
  Host idx(DType::i32, {B}), acc(DType::i32, {B});
  w.fill(rng);
  b.fill(rng);
  pool.fill(rng);
  for (std::int64_t i = 0; i < B; ++i)
    idx.set(i, static_cast<double>(i % 4 == 3 ? (rule == ConvInvalidIndex::nonpositive ? 0 : -1)
                                              : i + 1));
  Host pool_ref = pool;
  CausalConv1dOptions o;
  o.activation = ConvActivation::silu;
  o.invalid_index = rule;
  o.force_min_blocks = force_min_blocks;
  for (int r = 0; r < rounds; ++r) {
    Host x(xd, {B, S, D}), out(xd, {B, S, D});
    x.fill(rng);
    for (std::int64_t i = 0; i < B; ++i)
      acc.set(i, static_cast<double>(1 + (std::int64_t)(rng() % (L - W + 2))));
    Host x_ref = x;
    TensorView outv = in_place ? x.view() : out.view();
    TensorView accv = acc.view();
    if (!spec_mode) accv.data = nullptr;
    Plan plan = plan_causal_conv1d_update(x.view(), w.view(), b.view(), pool.view(), idx.view(),
                                          accv, outv, o, DeviceLimits::for_name("h200"));
    std::string spec = plan.launches[0].spec.str();
    REQUIRE_MESSAGE(spec.rfind(expect_spec_prefix, 0) == 0, name << ": the plan's spec " << spec);
    std::vector<double> want = reference::causal_conv1d_update(
        x_ref.view(), w.view(), b.view(), pool_ref.view(), idx.view(), accv, o);
    const TensorView xv = x.view(), wv = w.view(), bv = b.view(), pv = pool.view(),
                     idxv = idx.view();
    ops::conv1d::Args args;
    args.op = ops::conv1d::Op::update;
    args.x = &xv;
    args.weight = &wv;
    args.bias = &bv;
    args.conv_state = &pv;
    args.state_indices = &idxv;
    args.num_accepted_tokens = &accv;
    args.out = &outv;
    args.options = &o;
    const CausalConv1dParams k = library_params(args, spec);
    launch(K, plan, k);
    compare(name, outv, want, xd == DType::f32 ? 1e-5 : xd == DType::f16 ? 1.0 / 512 : 1.0 / 128);
    compare_bytes(name, pool, pool_ref);
  }
}

/// causal_conv1d_update_varlen: rows of `lengths` tokens (0 allowed) in x [T, D] with two
/// trailing tokens that belong to no row (their out rows must keep their sentinel), chained
/// over `rounds` steps with fresh acceptance counts.
template <Kernel K>
void varlen_case(const char* name, const char* expect_spec_prefix, DType xd, DType sd,
                 std::int64_t W, std::vector<std::int64_t> lengths, bool spec_mode,
                 bool pool_transposed, ConvInvalidIndex rule, int rounds) {
  std::mt19937_64 rng(std::random_device{}());
  const std::int64_t D = 64, B = static_cast<std::int64_t>(lengths.size()), slots = B + 2;
  std::int64_t most = 0;
  std::vector<std::int64_t> qsl{0};
  for (auto l : lengths) {
    most = std::max(most, l);
    qsl.push_back(qsl.back() + l);
  }
  const std::int64_t T = qsl.back() + 2, L = spec_mode ? std::max(W - 1, W - 2 + most) : W - 1;
  Host w(DType::f32, {D, W}), b(DType::f32, {D}),
      pool(sd, {slots, D, L},
           pool_transposed ? std::vector<std::int64_t>{L * D, 1, D} : std::vector<std::int64_t>{});
  Host idx(DType::i64, {B}), acc(DType::i32, {B}), q(DType::i64, {B + 1});
  w.fill(rng);
  b.fill(rng);
  pool.fill(rng);
  for (std::int64_t i = 0; i <= B; ++i) q.set(i * q.strides[0], static_cast<double>(qsl[i]));
  for (std::int64_t i = 0; i < B; ++i)
    idx.set(
        i * idx.strides[0],
        static_cast<double>(i % 4 == 3 ? (rule == ConvInvalidIndex::nonpositive ? 0 : -1) : i + 1));
  Host pool_ref = pool;
  CausalConv1dOptions o;
  o.activation = ConvActivation::silu;
  o.invalid_index = rule;
  constexpr double kSentinel = 7.0;
  for (int r = 0; r < rounds; ++r) {
    Host x(xd, {T, D}), out(xd, {T, D});
    x.fill(rng);
    for (std::int64_t i = 0; i < out.elements(); ++i)
      store_from_double(out.data(), xd, i, kSentinel);
    for (std::int64_t i = 0; i < B; ++i)
      acc.set(i * acc.strides[0], static_cast<double>(1 + (std::int64_t)(rng() % (L - W + 2))));
    TensorView accv = acc.view();
    if (!spec_mode) accv.data = nullptr;
    Plan plan = plan_causal_conv1d_update_varlen(x.view(), w.view(), b.view(), pool.view(),
                                                 q.view(), idx.view(), accv, out.view(), o,
                                                 DeviceLimits::for_name("h200"));
    std::string spec = plan.launches[0].spec.str();
    REQUIRE_MESSAGE(spec.rfind(expect_spec_prefix, 0) == 0, name << ": the plan's spec " << spec);
    std::vector<double> want = reference::causal_conv1d_update_varlen(
        x.view(), w.view(), b.view(), pool_ref.view(), q.view(), idx.view(), accv, o, kSentinel);
    const TensorView xv = x.view(), wv = w.view(), bv = b.view(), pv = pool.view(), qv = q.view(),
                     idxv = idx.view(), outv = out.view();
    ops::conv1d::Args args;
    args.op = ops::conv1d::Op::update;
    args.varlen = true;
    args.x = &xv;
    args.weight = &wv;
    args.bias = &bv;
    args.conv_state = &pv;
    args.query_start_loc = &qv;
    args.state_indices = &idxv;
    args.num_accepted_tokens = &accv;
    args.out = &outv;
    args.options = &o;
    const CausalConv1dParams k = library_params(args, spec);
    launch(K, plan, k);
    compare(name, out.view(), want, xd == DType::f32 ? 1e-5 : 1.0 / 128);
    compare_bytes(name, pool, pool_ref);
  }
}

using bf = __nv_bfloat16;
using hf = __half;

TEST_CASE("causal_conv1d kernel on the CPU: prefill modes, pool accesses, layouts") {
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 4, 8, 8, 32, ConvMode::chunked,
                                     ConvStateAccess::block, true>>(
      "chunked, bf16, block pool, weight block",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=8,span=32,"
      "mode=chunked,pool=block,silu=1",
      DType::bf16, DType::bf16, DType::bf16, 4, false, false, false,
      {1, 2, 3, 4, 40, 17, 0, 9, 100, 31, 32, 33, 64}, ConvInvalidIndex::negative, 8, 32);
  prefill_case<&causal_conv1d_kernel<hf, hf, float, float, 3, 8, 8, 0, ConvMode::sequential,
                                     ConvStateAccess::scalar, true>>(
      "in place (sequential), f16 x, f32 weights and transposed pool",
      "causal_conv1d:in=f16,out=f16,weight=f32,state=f32,width=3,vec=8,chunk=8,span=0,"
      "mode=sequential,pool=scalar,silu=1",
      DType::f16, DType::f32, DType::f32, 3, false, true, true, {1, 2, 3, 4, 40, 17, 0, 9, 100},
      ConvInvalidIndex::nonpositive);
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 8, 4, 8, 16, ConvMode::chunked,
                                     ConvStateAccess::channels, true>>(
      "chunked, W = 8, transposed pool (channel vectors)",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=8,vec=4,chunk=8,span=16,"
      "mode=chunked,pool=channels,silu=1",
      DType::bf16, DType::bf16, DType::bf16, 8, false, true, false, {1, 6, 7, 8, 40, 17, 0, 9, 100},
      ConvInvalidIndex::negative, 8, 16);
  prefill_case<&causal_conv1d_kernel<float, float, float, float, 2, 1, 8, 8, ConvMode::chunked,
                                     ConvStateAccess::scalar, true>>(
      "chunked, token-contiguous f32 x, W = 2",
      "causal_conv1d:in=f32,out=f32,weight=f32,state=f32,width=2,vec=1,chunk=8,span=8,"
      "mode=chunked",
      DType::f32, DType::f32, DType::f32, 2, true, false, false, {1, 2, 3, 40, 0, 9},
      ConvInvalidIndex::negative, 8, 0);
}

TEST_CASE("causal_conv1d kernel on the CPU: spans of several batches, halos across batches") {
  // A span of 64 walked in batches of 2 (32 batches, double-buffered, odd tails), spans that
  // start mid-sequence and sequences shorter than one batch.
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 4, 8, 2, 64, ConvMode::chunked,
                                     ConvStateAccess::block, true>>(
      "chunked, chunk 2, span 64",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=2,span=64,"
      "mode=chunked",
      DType::bf16, DType::bf16, DType::bf16, 4, false, false, false,
      {1, 2, 3, 63, 64, 65, 0, 129, 200, 5}, ConvInvalidIndex::nonpositive, 2, 64);
  // W = 8: a span of 8 holds the whole W - 1 = 7 halo of the next; batches of 4 are shorter.
  // (4 channels per thread at W > 4, and f16's [4, 7] pool block is not whole 16-byte vectors.)
  prefill_case<&causal_conv1d_kernel<hf, hf, hf, hf, 8, 4, 4, 8, ConvMode::chunked,
                                     ConvStateAccess::scalar, true>>(
      "chunked, W = 8, chunk 4, span 8",
      "causal_conv1d:in=f16,out=f16,weight=f16,state=f16,width=8,vec=4,chunk=4,span=8,"
      "mode=chunked",
      DType::f16, DType::f16, DType::f16, 8, false, false, false, {1, 7, 8, 9, 15, 16, 17, 40},
      ConvInvalidIndex::negative, 4, 0);
  // In place, batches of 2: every later row is loaded before an earlier one is stored.
  prefill_case<&causal_conv1d_kernel<float, float, float, float, 4, 4, 2, 0, ConvMode::sequential,
                                     ConvStateAccess::block, true>>(
      "in place (sequential), chunk 2",
      "causal_conv1d:in=f32,out=f32,weight=f32,state=f32,width=4,vec=4,chunk=2,span=0,"
      "mode=sequential",
      DType::f32, DType::f32, DType::f32, 4, false, false, true, {1, 2, 3, 5, 0, 33},
      ConvInvalidIndex::negative, 2, 0);
}

TEST_CASE("causal_conv1d kernel on the CPU: decode and speculative updates, chained") {
  update_case<&causal_conv1d_kernel<bf, bf, float, bf, 4, 8, 1, 0, ConvMode::rows,
                                    ConvStateAccess::block, true>>(
      "decode, block pool",
      "causal_conv1d:in=bf16,out=bf16,weight=f32,state=bf16,width=4,vec=8,chunk=1,span=0,"
      "mode=rows,pool=block",
      DType::bf16, DType::f32, DType::bf16, 4, 1, false, false, false,
      ConvInvalidIndex::nonpositive, 3);
  update_case<&causal_conv1d_kernel<bf, bf, float, bf, 4, 8, 4, 0, ConvMode::rows,
                                    ConvStateAccess::channels, true>>(
      "speculative S = 3, transposed pool",
      "causal_conv1d:in=bf16,out=bf16,weight=f32,state=bf16,width=4,vec=8,chunk=4,span=0,"
      "mode=rows,pool=channels",
      DType::bf16, DType::f32, DType::bf16, 4, 3, true, true, false, ConvInvalidIndex::nonpositive,
      4);
  update_case<&causal_conv1d_kernel<float, float, float, float, 3, 4, 8, 0, ConvMode::rows,
                                    ConvStateAccess::scalar, true>>(
      "speculative S = 7 in place, f32",
      "causal_conv1d:in=f32,out=f32,weight=f32,state=f32,width=3,vec=4,chunk=8,span=0,"
      "mode=rows,pool=scalar",
      DType::f32, DType::f32, DType::f32, 3, 7, true, false, true, ConvInvalidIndex::negative, 4);
}

TEST_CASE("causal_conv1d kernel on the CPU: varlen speculative rows (query_start_loc)") {
  // Rows of 0..8 tokens; mean length 3 -> chunk 4, so rows past 4 tokens take the loop.
  varlen_case<&causal_conv1d_kernel<bf, bf, float, bf, 4, 8, 4, 0, ConvMode::rows,
                                    ConvStateAccess::channels, true>>(
      "varlen speculative, transposed pool",
      "causal_conv1d:in=bf16,out=bf16,weight=f32,state=bf16,width=4,vec=8,chunk=4,span=0,"
      "mode=rows,pool=channels",
      DType::bf16, DType::bf16, 4, {3, 0, 1, 8, 2, 5, 0, 4, 6}, true, true,
      ConvInvalidIndex::nonpositive, 3);
  varlen_case<&causal_conv1d_kernel<float, float, float, float, 3, 4, 4, 0, ConvMode::rows,
                                    ConvStateAccess::scalar, true>>(
      "varlen speculative, f32",
      "causal_conv1d:in=f32,out=f32,weight=f32,state=f32,width=3,vec=4,chunk=4,span=0,"
      "mode=rows,pool=scalar",
      DType::f32, DType::f32, 3, {2, 7, 0, 1, 1, 3, 8, 0}, true, false, ConvInvalidIndex::negative,
      3);
  // Without num_accepted_tokens: every row ends with its last W - 1 inputs in columns 0..W-2.
  varlen_case<&causal_conv1d_kernel<bf, bf, float, bf, 4, 8, 4, 0, ConvMode::rows,
                                    ConvStateAccess::block, true>>(
      "varlen, no acceptance counts, block pool",
      "causal_conv1d:in=bf16,out=bf16,weight=f32,state=bf16,width=4,vec=8,chunk=4,span=0,"
      "mode=rows,pool=block",
      DType::bf16, DType::bf16, 4, {1, 2, 0, 5, 3, 1, 2, 8}, false, false,
      ConvInvalidIndex::negative, 2);
}

TEST_CASE("causal_conv1d kernel on the CPU: tuning candidates, minimum blocks") {
  // The update's minimum blocks: B = 9, 10 and 1, in place, padding rows, the transposed pool.
  for (const std::int64_t batch : {9, 10, 1}) {
    update_case<&causal_conv1d_kernel<bf, bf, bf, bf, 4, 8, 1, 0, ConvMode::rows,
                                      ConvStateAccess::channels, true, 4>>(
        "decode in place, min_blocks 4, transposed pool",
        "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=1,span=0,"
        "mode=rows,pool=channels,silu=1,min_blocks=4",
        DType::bf16, DType::bf16, DType::bf16, 4, 1, false, true, true, ConvInvalidIndex::negative,
        3, 4, batch);
  }
  // The prefill's minimum blocks change only the compiler's register budget: the same code.
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 4, 8, 4, 64, ConvMode::chunked,
                                     ConvStateAccess::block, true, 4>>(
      "chunked, chunk 4, span 64, min_blocks 4",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=4,span=64,"
      "mode=chunked,pool=block,silu=1,min_blocks=4",
      DType::bf16, DType::bf16, DType::bf16, 4, false, false, false,
      {1, 2, 3, 63, 64, 65, 0, 129, 200, 5}, ConvInvalidIndex::negative, 4, 64, 4);
}

TEST_CASE("causal_conv1d kernel on the CPU: the staged (cp.async) chunked prefill") {
  // Stages of x's batches in shared memory (plain copies on the host): the stage ring, the
  // batches ahead, partial batches and spans, padding, the pool columns.
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 4, 8, 4, 64, ConvMode::chunked,
                                     ConvStateAccess::block, true, 0, 4>>(
      "staged: 4 stages of 4 tokens, span 64",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=4,vec=8,chunk=4,span=64,"
      "mode=chunked,pool=block,silu=1,stages=4",
      DType::bf16, DType::bf16, DType::bf16, 4, false, false, false,
      {1, 2, 3, 63, 64, 65, 0, 129, 200, 5}, ConvInvalidIndex::negative, 4, 64, 0, 4);
  prefill_case<&causal_conv1d_kernel<bf, bf, bf, bf, 3, 8, 2, 8, ConvMode::chunked,
                                     ConvStateAccess::block, true, 5, 3>>(
      "staged: 3 stages of 2 tokens, span 8, min_blocks 5",
      "causal_conv1d:in=bf16,out=bf16,weight=bf16,state=bf16,width=3,vec=8,chunk=2,span=8,"
      "mode=chunked,pool=block,silu=1,min_blocks=5,stages=3",
      DType::bf16, DType::bf16, DType::bf16, 3, false, false, false, {1, 2, 7, 8, 9, 17, 0, 40},
      ConvInvalidIndex::nonpositive, 2, 8, 5, 3);
  prefill_case<&causal_conv1d_kernel<float, float, float, float, 4, 4, 4, 32, ConvMode::chunked,
                                     ConvStateAccess::channels, true, 0, 6>>(
      "staged: f32, 6 stages of 4 tokens, transposed pool",
      "causal_conv1d:in=f32,out=f32,weight=f32,state=f32,width=4,vec=4,chunk=4,span=32,"
      "mode=chunked,pool=channels,silu=1,stages=6",
      DType::f32, DType::f32, DType::f32, 4, false, true, false, {1, 31, 32, 33, 100, 0, 3},
      ConvInvalidIndex::negative, 4, 32, 0, 6);
}

}  // namespace
}  // namespace kjit
