// SPDX-License-Identifier: Apache-2.0
// The fused decode step's kernel (templates/gdn_decode/conv.cuh) compiled as host C++ and run on
// the CPU, each block's threads at once with their shuffles and __syncthreads meeting at a
// barrier, and a clustered plan's blocks at once with their cluster barrier and shared-memory
// reads of each other (tests/common/cuda_warp_emulation.hpp), against the composed float64
// reference (causal_conv1d_update's, rounded to mixed_qkv's dtype, then gdn_decode's): out and the
// state pool within tolerance, the conv pool bytewise, slots no valid row owns bytewise, padding
// rows (both invalid-index rules, and an index >= slots) zero. Parameters and launch shape come
// from the op's own check, plan and params, whose spec must be the instantiated kernel. Indexing
// and arithmetic only, not races.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/host_data.hpp"
#include "kjit/device.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/types.hpp"
#include "ops/gdn_decode/family.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"
// (keep this order: the emulation header defines __device__ & co. for the template)
#include "common/cuda_warp_emulation.hpp"
// The kernel's dynamic shared memory declaration parses as a static pointer here; the test runs
// the block body with memory of its own instead (emulated_conv_kernel).
#undef __shared__
#define __shared__ static
#define extern
#define gdn_decode_conv_smem (*emulated_conv_smem)
// (the host compiler does not know #pragma unroll: tests/CMakeLists.txt silences that here)
#include "templates/gdn_decode/conv.cuh"
#undef gdn_decode_conv_smem
#undef extern

namespace kjit {
namespace {

using Host = test::HostTensor;

template <typename QkvT, typename GateT, typename StateT, typename OutT, typename WeightT,
          typename ConvT, int kK, int kV, int kWidth, int kWarps, bool kGated, int kRule,
          bool kSilu, int kStateVec, int kCluster = 1, int kStages = 0>
void emulated_conv_kernel(GdnDecodeConvParams p) {
  gdn_decode_conv_block<QkvT, GateT, float, float, StateT, OutT, int, WeightT, ConvT, kK, kV,
                        kWidth, kWarps, kGated, true, kRule, kSilu, kStateVec, kCluster, kStages>(
      p, emulated_block_smem());
}

struct Case {
  std::int64_t batch = 5, heads = 2, value_heads = 4, k = 32, v = 32, width = 4;
  /// Conv pool columns (>= width - 1) and whether the pool is stored [slots, L, D] (channels
  /// contiguous) instead of [slots, D, L].
  std::int64_t columns = 3;
  bool channel_major_pool = false;
  DType qkv = DType::bf16, state = DType::f32, out = DType::bf16, weight = DType::bf16,
        conv = DType::bf16;
  bool gated = false, bias = true, silu = true;
  GdnInvalidIndex rule = GdnInvalidIndex::negative;
  int steps = 2;
  /// SMs of the planned device: 1 makes the planner take 8-warp blocks (cheaper to emulate).
  int sm_count = 1;
  /// The planned arch. Few blocks on many SMs of sm_90 are clustered: the blocks of a cluster
  /// then run at once (emulated_launch_clusters).
  Arch arch{9, 0};
  /// options.conv->force_cluster and force_stages (0: the planner's choice).
  int force_cluster = 0;
  int force_stages = 0;
};

void run(const Case& c, const std::string& expected_spec, void (*kernel)(GdnDecodeConvParams)) {
  CAPTURE(expected_spec);
  std::mt19937_64 rng(0x22c0u + static_cast<std::uint64_t>(c.k * 131 + c.v));
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::int64_t d = 2 * c.heads * c.k + c.value_heads * c.v;
  const std::int64_t slots = c.batch + 3, slot = c.value_heads * c.v * c.k;
  const DType gate = c.gated ? DType::f32 : c.qkv;
  Host qkv(c.qkv, {c.batch, d}), a(gate, {c.batch, c.value_heads}),
      b(gate, {c.batch, c.value_heads}), a_log(DType::f32, {c.value_heads}),
      dt_bias(DType::f32, {c.value_heads}), indices(DType::i32, {c.batch}),
      out(c.out, {c.batch, c.value_heads, c.v}), ref_out(c.out, {c.batch, c.value_heads, c.v}),
      weight(c.weight, {d, c.width}), bias(c.weight, {d});
  Host state(c.state, {slots, c.value_heads, c.v, c.k});
  Host pool = c.channel_major_pool ? Host(c.conv, {slots, d, c.columns}, {d * c.columns, 1, d})
                                   : Host(c.conv, {slots, d, c.columns});
  for (std::int64_t i = 0; i < state.elements(); ++i) state.set(i, 0.1 * normal(rng));
  for (std::int64_t i = 0; i < pool.elements(); ++i) pool.set(i, normal(rng));
  for (std::int64_t i = 0; i < weight.elements(); ++i) weight.set(i, 0.5 * normal(rng));
  for (std::int64_t i = 0; i < bias.elements(); ++i) bias.set(i, 0.2 * normal(rng));
  Host ref_state = state, ref_pool = pool;
  const std::vector<unsigned char> initial_state = state.storage, initial_pool = pool.storage;
  for (std::int64_t i = 0; i < c.value_heads; ++i) {
    a_log.set(i, 0.5 * normal(rng));
    dt_bias.set(i, 0.5 * normal(rng));
  }
  // Distinct slots from the top; row 1 is padding (-1, or 0 under nonpositive), row 3 (when
  // there is one) has an index >= slots, which the kernel also treats as padding.
  std::vector<bool> owned(static_cast<std::size_t>(slots), false);
  for (std::int64_t n = 0; n < c.batch; ++n) {
    std::int64_t s = slots - 1 - n;
    if (n == 1) {
      s = c.rule == GdnInvalidIndex::nonpositive ? 0 : -1;
    } else if (n == 3) {
      s = slots + 7;
    } else {
      owned[static_cast<std::size_t>(s)] = true;
    }
    indices.set(n, static_cast<double>(s));
  }

  GdnDecodeOptions options;
  options.invalid_index = c.rule;
  options.conv = GdnDecodeConv{weight.view(), c.bias ? bias.view() : TensorView{}, pool.view(),
                               c.silu ? ConvActivation::silu : ConvActivation::none};
  options.conv->force_cluster = c.force_cluster;
  options.conv->force_stages = c.force_stages;
  const TensorView v_qkv = qkv.view(), v_a = a.view(), v_b = b.view(), v_alog = a_log.view(),
                   v_dt = dt_bias.view(), v_state = state.view(), v_idx = indices.view(),
                   v_out = out.view();
  const ops::decode::Args args{c.gated ? ops::decode::Form::gated : ops::decode::Form::raw,
                               &v_qkv,
                               &v_a,
                               &v_b,
                               c.gated ? nullptr : &v_alog,
                               c.gated ? nullptr : &v_dt,
                               &v_state,
                               &v_idx,
                               &v_out,
                               &options};
  const ops::decode::ConvProblem problem = ops::decode::ConvFamily::check(args);
  DeviceLimits device = DeviceLimits::for_arch(c.arch);
  device.sm_count = c.sm_count;
  const auto planned = ops::decode::ConvFamily::plan(problem, device);
  REQUIRE(planned.plan.launches.size() == 1);
  const PlannedLaunch& launch = planned.plan.launches.back();
  REQUIRE(launch.spec.str() == expected_spec);
  const GdnDecodeConvParams params =
      ops::decode::ConvFamily::params(args, problem, planned.choice, nullptr);
  const unsigned cluster = launch.shape.cluster.x;

  GdnDecodeOptions ref_options = options;
  ref_options.conv->conv_state = ref_pool.view();
  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    for (std::int64_t i = 0; i < qkv.elements(); ++i) qkv.set(i, normal(rng));
    for (std::int64_t i = 0; i < a.elements(); ++i) {
      const double x = normal(rng), y = normal(rng);
      a.set(i, c.gated ? reference::gdn_log_decay(x, a_log.get(i % c.value_heads), 0.0, 20.0) : x);
      b.set(i, c.gated ? reference::gdn_sigmoid(y) : y);
    }
    std::fill(out.storage.begin(), out.storage.end(), 0xFF);  // NaN in every float format
    emulated_launch_clusters(kernel, launch.shape.grid.x, launch.shape.block.x, cluster,
                             launch.shape.dynamic_smem / sizeof(float), params);
    TensorView r_state = ref_state.view(), r_out = ref_out.view();
    reference::gdn_decode_conv_reference(v_qkv, v_a, v_b, c.gated ? nullptr : &v_alog,
                                         c.gated ? nullptr : &v_dt, r_state, v_idx, r_out,
                                         ref_options);
    // The conv pool: the same values moved and rounded the same way, bytewise.
    CHECK(pool.storage == ref_pool.storage);
    const bool coarse = c.qkv != DType::f32 || c.state != DType::f32 || c.out != DType::f32;
    const double atol = coarse ? 2e-2 : 1e-4, rtol = coarse ? 1e-2 : 1e-4;
    const std::int64_t bad_out = test::count_mismatches("out", out, ref_out, atol, rtol);
    const std::int64_t bad_state = test::count_mismatches("state", state, ref_state, atol, rtol);
    CHECK(bad_out == 0);
    CHECK(bad_state == 0);
    // Padding rows: exact zeros.
    for (std::int64_t n : {1, 3}) {
      if (n >= c.batch) continue;
      for (std::int64_t i = 0; i < c.value_heads * c.v; ++i) {
        CHECK(out.get(n * c.value_heads * c.v + i) == 0.0);
      }
    }
  }
  // Slots no valid row owns are bit-identical in both pools.
  const std::size_t esize = size_of(c.state);
  for (std::int64_t s = 0; s < slots; ++s) {
    if (owned[static_cast<std::size_t>(s)]) continue;
    CAPTURE(s);
    const std::size_t begin = static_cast<std::size_t>(s * slot) * esize;
    CHECK(std::equal(state.storage.begin() + static_cast<std::ptrdiff_t>(begin),
                     state.storage.begin() + static_cast<std::ptrdiff_t>(
                                                 begin + static_cast<std::size_t>(slot) * esize),
                     initial_state.begin() + static_cast<std::ptrdiff_t>(begin)));
    const std::size_t cesize = size_of(c.conv);
    const std::size_t cbegin = static_cast<std::size_t>(s * d * c.columns) * cesize;
    const std::size_t cend = cbegin + static_cast<std::size_t>(d * c.columns) * cesize;
    CHECK(std::equal(pool.storage.begin() + static_cast<std::ptrdiff_t>(cbegin),
                     pool.storage.begin() + static_cast<std::ptrdiff_t>(cend),
                     initial_pool.begin() + static_cast<std::ptrdiff_t>(cbegin)));
  }
}

TEST_CASE("gdn_decode fused conv emulated: bf16 inputs and conv pool, f32 state, raw gates") {
  Case c;
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=32,v=32,width=4,warps=8,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=1@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                            __nv_bfloat16, 32, 32, 4, 8, false, kGdnInvalidNegative, true, 1>);
}

TEST_CASE("gdn_decode fused conv emulated: f32, gated, nonpositive, no bias, no SiLU, W = 2") {
  Case c;
  c.qkv = c.out = c.weight = c.conv = DType::f32;
  c.gated = true;
  c.bias = false;
  c.silu = false;
  c.width = 2;
  c.columns = 1;
  c.rule = GdnInvalidIndex::nonpositive;
  c.k = 16;  // half the lanes hold no element of K
  c.v = 16;
  c.heads = 1;
  c.value_heads = 2;
  c.sm_count = 132;  // 5 blocks on 132 SMs: 32 warps, one state row each
  c.arch = Arch{8, 9};
  run(c,
      "gdn_decode_conv:qkv=f32,gate=f32,a_log=f32,dt_bias=f32,state=f32,out=f32,index=i32,"
      "weight=f32,conv_state=f32,k=16,v=16,width=2,warps=32,gated=1,l2norm=1,"
      "invalid=nonpositive,silu=0,state_vec=1@sm_89",
      &emulated_conv_kernel<float, float, float, float, float, float, 16, 16, 2, 32, true,
                            kGdnInvalidNonpositive, false, 1>);
}

TEST_CASE("gdn_decode fused conv emulated: f16 state, f32 weights, channel-major pool, L > W-1") {
  Case c;
  c.state = DType::f16;
  c.weight = DType::f32;
  c.conv = DType::f32;
  c.channel_major_pool = true;
  c.columns = 5;  // columns 3..4 are never touched
  c.k = 64;
  c.v = 16;
  c.heads = 1;
  c.value_heads = 3;  // G = 3: 48 rows over 8 warps of 4 rows, the last pass half empty
  c.batch = 4;
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f16,out=bf16,index=i32,"
      "weight=f32,conv_state=f32,k=64,v=16,width=4,warps=8,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=2@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, __half, __nv_bfloat16, float, float, 64,
                            16, 4, 8, false, kGdnInvalidNegative, true, 2>);
}

TEST_CASE("gdn_decode fused conv emulated: f32 state in 16-byte vectors over three passes") {
  Case c;
  c.k = 128;  // 32 lanes x 4 floats: one float4 per lane and row
  c.v = 16;
  c.heads = 1;
  c.value_heads = 5;  // 80 rows over 8 warps of 4 rows: both register sets, then the first again
  c.batch = 4;
  c.sm_count = 1;  // 4 blocks >= 4 per SM: 8 warps
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=128,v=16,width=4,warps=8,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=4@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                            __nv_bfloat16, 128, 16, 4, 8, false, kGdnInvalidNegative, true, 4>);
}

TEST_CASE("gdn_decode fused conv emulated: more channels than two per thread (K = 256)") {
  // 2K + V = 528 channels over 8 warps: three passes of the channel loops, the last with 16
  // channels (a thread's first, second and third channel).
  Case c;
  c.k = 256;
  c.v = 16;
  c.heads = 1;
  c.value_heads = 1;
  c.batch = 4;
  c.sm_count = 1;
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=256,v=16,width=4,warps=8,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=4@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                            __nv_bfloat16, 256, 16, 4, 8, false, kGdnInvalidNegative, true, 4>);
}

TEST_CASE("gdn_decode fused conv emulated: the state ring of 2, 3 and 4 stages") {
  // 80 rows (G = 5, V = 16) over 8 warps of 4 rows: 3 sets, the last with 16 rows, so the ring
  // wraps (2 stages), is filled past the end (4 stages: empty groups) and both; the slot rows
  // (padding, index >= slots) skip the ring altogether.
  Case c;
  c.k = 128;  // 32 lanes x 4 floats: one 16-byte copy per lane and row
  c.v = 16;
  c.heads = 1;
  c.value_heads = 5;
  c.batch = 5;
  c.sm_count = 1;  // 5 blocks >= 4 per SM: 8 warps
  const std::string spec =
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=128,v=16,width=4,warps=8,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=4,stages=";
  SUBCASE("2 stages") {
    c.force_stages = 2;
    run(c, spec + "2@sm_90",
        &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                              __nv_bfloat16, 128, 16, 4, 8, false, kGdnInvalidNegative, true, 4, 1,
                              2>);
  }
  SUBCASE("3 stages, f32 conv pool and weights, nonpositive rule") {
    c.force_stages = 3;
    c.conv = c.weight = DType::f32;
    c.rule = GdnInvalidIndex::nonpositive;
    run(c,
        "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
        "weight=f32,conv_state=f32,k=128,v=16,width=4,warps=8,gated=0,l2norm=1,"
        "invalid=nonpositive,silu=1,state_vec=4,stages=3@sm_90",
        &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, float, float, 128,
                              16, 4, 8, false, kGdnInvalidNonpositive, true, 4, 1, 3>);
  }
  SUBCASE("4 stages") {
    c.force_stages = 4;
    run(c, spec + "4@sm_90",
        &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                              __nv_bfloat16, 128, 16, 4, 8, false, kGdnInvalidNegative, true, 4, 1,
                              4>);
  }
}

TEST_CASE("gdn_decode fused conv emulated: clusters of 8 (B = 5 on 132 SMs), blocks at once") {
  // 5 (row, q/k head) blocks < 2 per SM: each is a cluster of 8 blocks of 8 state rows that
  // convolve all 64 q/k channels and write the columns of 8 of them after the cluster barrier;
  // 4 warps each (72 channels); the cluster's blocks run at once.
  Case c;
  c.heads = 1;
  c.value_heads = 2;
  c.sm_count = 132;
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=32,v=32,width=4,warps=4,gated=0,l2norm=1,invalid=negative,"
      "silu=1,state_vec=1,cluster=8@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, __nv_bfloat16,
                            __nv_bfloat16, 32, 32, 4, 4, false, kGdnInvalidNegative, true, 1, 8>);
}

TEST_CASE("gdn_decode fused conv emulated: clusters of 4, 8-byte state, channel-major pool") {
  // 4 blocks in clusters of 4 (forced: the planner's rule keeps 64 rows a block in groups of
  // 128); 32 rows per block, 128 q/k channels convolved by each (32 of them written by each):
  // 160 channels over 8 warps; f32 conv pool [slots, L, D] with a column past W - 1. (Small
  // enough for CI's ThreadSanitizer stage, which runs this file: ~4 s of OS threads per cluster
  // there.)
  Case c;
  c.k = 64;
  c.v = 32;
  c.heads = 1;
  c.value_heads = 4;
  c.batch = 4;
  c.sm_count = 8;
  c.force_cluster = 4;
  c.conv = c.weight = DType::f32;
  c.channel_major_pool = true;
  c.columns = 4;
  c.rule = GdnInvalidIndex::nonpositive;
  run(c,
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,"
      "weight=f32,conv_state=f32,k=64,v=32,width=4,warps=8,gated=0,l2norm=1,"
      "invalid=nonpositive,silu=1,state_vec=2,cluster=4@sm_90",
      &emulated_conv_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16, float, float, 64,
                            32, 4, 8, false, kGdnInvalidNonpositive, true, 2, 4>);
}

}  // namespace
}  // namespace kjit
