// SPDX-License-Identifier: Apache-2.0
// The gdn_decode kernel template's K-major specialization (state_layout=kv, KMajorTileDecoder)
// compiled as host C++ and run on the CPU, each block's threads at once with their shuffles
// meeting at a barrier (tests/common/cuda_warp_emulation.hpp), against the float64 reference:
// f32, bf16 and f16 pools (16-byte and 2-byte vectors), both gate forms, both invalid-index
// rules, flat, split and folded grids, several steps on one pool. Parameters and launch shape
// come from the op's own plan and Family::params, whose spec must be the instantiated kernel.
// Tiles of one warp and of several (whose column sums meet in shared memory: a static here).
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
// Shared memory for the K-major tile's reduction over warps: a function-local static is shared
// by a block's threads (blocks run one after another). Around the include only, `extern` and the
// staged path's dynamic array are spelled so that its declaration (`extern __shared__ ...
// stage_bytes[]`, V-major, never instantiated here) still parses as a static: a pointer to an
// array of unknown bound.
#undef __shared__
#define __shared__ static
#define extern
#define stage_bytes (*emulated_stage_bytes)
// (the host compiler does not know #pragma unroll: tests/CMakeLists.txt silences that here)
#include "templates/gdn_decode/gdn_decode.cuh"
#undef stage_bytes
#undef extern

namespace kjit {
namespace {

using Host = test::HostTensor;

struct Case {
  std::int64_t batch = 5, heads = 1, value_heads = 2, k = 64, v = 64;
  DType qkv = DType::bf16, state = DType::f32, out = DType::bf16;
  bool gated = false;
  GdnInvalidIndex rule = GdnInvalidIndex::negative;
  std::string force_mode;
  int force_bv = 0;
  /// Elements the pool's base is moved by (1: 2-byte aligned 16-bit pools, 2-byte vectors).
  std::int64_t pool_offset = 0;
  int steps = 2;
};

/// Runs `kernel` for case `c` (whose plan must be `spec`) and compares with the reference.
template <typename Kernel>
void run(const Case& c, const std::string& expected_spec, Kernel kernel) {
  CAPTURE(expected_spec);
  std::mt19937_64 rng(0x6d2a5u + static_cast<std::uint64_t>(c.k * 131 + c.v));
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::int64_t width = 2 * c.heads * c.k + c.value_heads * c.v;
  const std::int64_t slots = c.batch + 2, slot = c.value_heads * c.v * c.k;
  const DType gate = c.gated ? DType::f32 : c.qkv;
  Host qkv(c.qkv, {c.batch, width}), a(gate, {c.batch, c.value_heads}),
      b(gate, {c.batch, c.value_heads}), a_log(DType::f32, {c.value_heads}),
      dt_bias(DType::f32, {c.value_heads}), indices(DType::i32, {c.batch}),
      out(c.out, {c.batch, c.value_heads, c.v}), ref_out(c.out, {c.batch, c.value_heads, c.v});
  // fla's layout: each slot [HV, K, V], passed as its transpose.
  Host state(c.state, {slots, c.value_heads, c.v, c.k}, {slot, c.v * c.k, 1, c.v}, c.pool_offset);
  Host ref_state = state;
  for (std::int64_t i = 0; i < state.elements(); ++i) state.set(i, 0.1 * normal(rng));
  std::copy(state.storage.begin(), state.storage.end(), ref_state.storage.begin());
  const std::vector<unsigned char> initial = state.storage;
  for (std::int64_t i = 0; i < c.value_heads; ++i) {
    a_log.set(i, 0.5 * normal(rng));
    dt_bias.set(i, 0.5 * normal(rng));
  }
  // Distinct slots 1.. from the top; every third row is padding (-1, or 0 under nonpositive).
  std::vector<bool> owned(static_cast<std::size_t>(slots), false);
  for (std::int64_t n = 0; n < c.batch; ++n) {
    std::int64_t s = slots - 1 - n;
    if (n % 3 == 1)
      s = c.rule == GdnInvalidIndex::nonpositive ? 0 : -1;
    else
      owned[static_cast<std::size_t>(s)] = true;
    indices.set(n, static_cast<double>(s));
  }

  GdnDecodeOptions options;
  options.invalid_index = c.rule;
  options.force_mode = c.force_mode;
  options.force_bv = c.force_bv;
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
  const ops::decode::Problem problem = ops::decode::Family::check(args);
  const auto planned = ops::decode::Family::plan(problem, DeviceLimits::for_arch(Arch{9, 0}));
  REQUIRE(planned.plan.launches.size() == 1);
  const PlannedLaunch& launch = planned.plan.launches.back();
  REQUIRE(launch.spec.str() == expected_spec);
  const GdnDecodeParams params =
      ops::decode::Family::params(args, problem, planned.choice, nullptr);

  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    for (std::int64_t i = 0; i < qkv.elements(); ++i) qkv.set(i, normal(rng));
    for (std::int64_t i = 0; i < a.elements(); ++i) {
      const double x = normal(rng), y = normal(rng);
      a.set(i, c.gated ? reference::gdn_log_decay(x, a_log.get(i % c.value_heads), 0.0, 20.0) : x);
      b.set(i, c.gated ? reference::gdn_sigmoid(y) : y);
    }
    std::fill(out.storage.begin(), out.storage.end(), 0xFF);  // NaN in every float format
    emulated_launch_threads(
        kernel, EmulatedDim3{launch.shape.grid.x, launch.shape.grid.y, launch.shape.grid.z},
        launch.shape.block.x, params);
    TensorView r_state = ref_state.view(), r_out = ref_out.view();
    if (c.gated) {
      reference::gdn_decode_gated_reference(v_qkv, v_a, v_b, r_state, v_idx, r_out, options);
    } else {
      reference::gdn_decode_reference(v_qkv, v_a, v_b, v_alog, v_dt, r_state, v_idx, r_out,
                                      options);
    }
    const bool coarse = c.qkv != DType::f32 || c.state != DType::f32 || c.out != DType::f32;
    const double atol = coarse ? 2e-2 : 1e-4, rtol = coarse ? 1e-2 : 1e-4;
    const std::int64_t bad_out = test::count_mismatches("out", out, ref_out, atol, rtol);
    const std::int64_t bad_state = test::count_mismatches("state", state, ref_state, atol, rtol);
    CHECK(bad_out == 0);
    CHECK(bad_state == 0);
  }
  // Slots no valid row owns are bit-identical.
  const std::size_t esize = size_of(c.state);
  for (std::int64_t s = 0; s < slots; ++s) {
    if (owned[static_cast<std::size_t>(s)]) continue;
    const std::size_t begin = state.offset_bytes + static_cast<std::size_t>(s * slot) * esize;
    CHECK(std::equal(state.storage.begin() + static_cast<std::ptrdiff_t>(begin),
                     state.storage.begin() + static_cast<std::ptrdiff_t>(
                                                 begin + static_cast<std::size_t>(slot) * esize),
                     initial.begin() + static_cast<std::ptrdiff_t>(begin)));
  }
}

TEST_CASE("gdn_decode emulated: K-major f32 pool, 16-byte vectors, flat grid, raw gates") {
  Case c;
  c.force_bv = 16;  // 4 lanes per line of 16 columns, 8 lines per access: one warp for K = 64
  run(c,
      "gdn_decode:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,k=64,"
      "v=64,bv=16,warps=1,vec_bytes=16,mode=flat,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=0,l2norm=1,invalid=negative,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<__nv_bfloat16, __nv_bfloat16, float, float, float, __nv_bfloat16, int, 64,
                         64, 16, 1, 16, kGdnDecodeFlat, 0, 0, kGdnHintStream, kGdnHintStream, false,
                         true, kGdnInvalidNegative, false, kGdnStateKMajor>);
}

TEST_CASE("gdn_decode emulated: K-major bf16 pool, gated form, folded grid, nonpositive rule") {
  Case c;
  c.state = DType::bf16;
  c.v = 32;
  c.heads = 2;
  c.value_heads = 4;
  c.gated = true;
  c.rule = GdnInvalidIndex::nonpositive;
  c.force_mode = "folded";
  c.force_bv = 16;  // 2 lanes of 8 bf16 per line, 16 lines per access: one warp for K = 64
  run(c,
      "gdn_decode:qkv=bf16,gate=f32,a_log=f32,dt_bias=f32,state=bf16,out=bf16,index=i32,k=64,"
      "v=32,bv=16,warps=1,vec_bytes=16,mode=folded,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=1,l2norm=1,invalid=nonpositive,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<__nv_bfloat16, float, float, float, __nv_bfloat16, __nv_bfloat16, int, 64,
                         32, 16, 1, 16, kGdnDecodeFolded, 0, 0, kGdnHintStream, kGdnHintStream,
                         true, true, kGdnInvalidNonpositive, false, kGdnStateKMajor>);
}

TEST_CASE("gdn_decode emulated: K-major f16 pool 2-byte aligned (scalar lanes), split grid") {
  Case c;
  c.qkv = DType::f32;
  c.out = DType::f32;
  c.state = DType::f16;
  c.k = 32;
  c.v = 32;
  c.pool_offset = 1;  // 2-byte vectors: 32 lanes of one element per line, K = 32 lines
  c.force_mode = "split";
  run(c,
      "gdn_decode:qkv=f32,gate=f32,a_log=f32,dt_bias=f32,state=f16,out=f32,index=i32,k=32,v=32,"
      "bv=32,warps=1,vec_bytes=2,mode=split,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=0,l2norm=1,invalid=negative,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<float, float, float, float, __half, float, int, 32, 32, 32, 1, 2,
                         kGdnDecodeSplit, 0, 0, kGdnHintStream, kGdnHintStream, false, true,
                         kGdnInvalidNegative, false, kGdnStateKMajor>);
}

// The planner's own tiles for K = V = 128: 128-byte lines, K split over 4 (f32) or 8 (bf16)
// warps whose column sums meet in shared memory; and 3 warps for K = 48.
TEST_CASE("gdn_decode emulated: K-major tiles over several warps (the planner's K = V = 128)") {
  Case f32;
  f32.k = f32.v = 128;
  f32.heads = 2;
  f32.value_heads = 4;
  f32.batch = 4;
  run(f32,
      "gdn_decode:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=f32,out=bf16,index=i32,k=128,"
      "v=128,bv=32,warps=4,vec_bytes=16,mode=flat,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=0,l2norm=1,invalid=negative,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<__nv_bfloat16, __nv_bfloat16, float, float, float, __nv_bfloat16, int, 128,
                         128, 32, 4, 16, kGdnDecodeFlat, 0, 0, kGdnHintStream, kGdnHintStream,
                         false, true, kGdnInvalidNegative, false, kGdnStateKMajor>);
  Case bf16 = f32;
  bf16.state = DType::bf16;
  bf16.gated = true;
  run(bf16,
      "gdn_decode:qkv=bf16,gate=f32,a_log=f32,dt_bias=f32,state=bf16,out=bf16,index=i32,k=128,"
      "v=128,bv=64,warps=8,vec_bytes=16,mode=flat,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=1,l2norm=1,invalid=negative,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<__nv_bfloat16, float, float, float, __nv_bfloat16, __nv_bfloat16, int, 128,
                         128, 64, 8, 16, kGdnDecodeFlat, 0, 0, kGdnHintStream, kGdnHintStream, true,
                         true, kGdnInvalidNegative, false, kGdnStateKMajor>);
  Case odd;
  odd.k = 48;
  odd.v = 128;
  odd.state = DType::bf16;
  odd.force_mode = "folded";
  run(odd,
      "gdn_decode:qkv=bf16,gate=bf16,a_log=f32,dt_bias=f32,state=bf16,out=bf16,index=i32,k=48,"
      "v=128,bv=64,warps=3,vec_bytes=16,mode=folded,stages=0,min_blocks=0,load_hint=stream,"
      "store_hint=stream,gated=0,l2norm=1,invalid=negative,ordered=0,state_layout=kv@sm_90",
      &gdn_decode_kernel<__nv_bfloat16, __nv_bfloat16, float, float, __nv_bfloat16, __nv_bfloat16,
                         int, 48, 128, 64, 3, 16, kGdnDecodeFolded, 0, 0, kGdnHintStream,
                         kGdnHintStream, false, true, kGdnInvalidNegative, false, kGdnStateKMajor>);
}

}  // namespace
}  // namespace kjit
