// SPDX-License-Identifier: Apache-2.0
// gdn_decode with options.conv (the fused decode step, issue 22): its plan (one launch of the
// gdn_decode_conv kernel, legal at every batch), that the plain step's plan is what it was
// without the option, the validation messages of every conv argument and refused option, and
// the composed reference against a hand computation of one row.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/plan.hpp"
#include "ops/gdn_reference.hpp"

namespace kjit {
namespace {

/// Fake, 256-byte aligned device addresses: planning only looks at their alignment.
void* fake(std::uintptr_t n) { return reinterpret_cast<void*>((n + 1) << 28); }

struct Views {
  TensorView qkv, a, b, a_log, dt_bias, state, indices, out, weight, bias, pool;
};

/// Qwen3-Next's layer at TP1 by default: H = 16, HV = 32, K = V = 128, W = 4.
Views views(std::int64_t batch, std::int64_t heads = 16, std::int64_t value_heads = 32,
            std::int64_t k = 128, std::int64_t v = 128, std::int64_t width = 4,
            std::int64_t slots = 8) {
  Views w;
  const std::int64_t d = 2 * heads * k + value_heads * v;
  w.qkv = TensorView::contiguous(fake(0), DType::bf16, {batch, d});
  w.a = TensorView::contiguous(fake(1), DType::bf16, {batch, value_heads});
  w.b = TensorView::contiguous(fake(2), DType::bf16, {batch, value_heads});
  w.a_log = TensorView::contiguous(fake(3), DType::f32, {value_heads});
  w.dt_bias = TensorView::contiguous(fake(4), DType::bf16, {value_heads});
  w.state = TensorView::contiguous(fake(5), DType::f32, {slots, value_heads, v, k});
  w.indices = TensorView::contiguous(fake(6), DType::i32, {batch});
  w.out = TensorView::contiguous(fake(7), DType::bf16, {batch, value_heads, v});
  w.weight = TensorView::contiguous(fake(8), DType::bf16, {d, width});
  w.bias = TensorView::contiguous(fake(9), DType::bf16, {d});
  w.pool = TensorView::contiguous(fake(10), DType::bf16, {slots, d, width - 1});
  return w;
}

GdnDecodeOptions conv_options(const Views& w) {
  GdnDecodeOptions options;
  options.conv = GdnDecodeConv{w.weight, w.bias, w.pool, ConvActivation::silu};
  return options;
}

Plan plan(const Views& w, const GdnDecodeOptions& options,
          const DeviceLimits& device = DeviceLimits::for_arch(Arch{9, 0})) {
  return plan_gdn_decode(w.qkv, w.a, w.b, w.a_log, w.dt_bias, w.state, w.indices, w.out, options,
                         device);
}

/// The message of the E that planning throws, empty if it throws none.
template <typename E>
std::string failure(const Views& w, const GdnDecodeOptions& options, const DeviceLimits& device) {
  try {
    plan(w, options, device);
  } catch (const E& error) {
    return error.what();
  }
  return {};
}

std::string rejection(const Views& w, const GdnDecodeOptions& options) {
  return failure<InvalidArgument>(w, options, DeviceLimits::for_arch(Arch{9, 0}));
}

TEST_CASE("gdn_decode fused conv plan: one gdn_decode_conv launch per (row, q/k head)") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  for (std::int64_t batch : {1, 2, 3, 256, 4096, 1 << 20}) {
    CAPTURE(batch);
    const Views w = views(batch);
    const Plan p = plan(w, conv_options(w), h200);
    REQUIRE(p.launches.size() == 1);
    const PlannedLaunch& launch = p.launches[0];
    CHECK(p.mode == "fused_conv");
    CHECK(launch.spec.family == "gdn_decode_conv");
    // While the (row, q/k head) blocks are at most a quarter of the SMs (B = 1, 2) each is a
    // cluster of 4 blocks with 64 of the group's 256 state rows each (not 8 of 32), which
    // convolve all 256 q/k channels: 320 channels over 16 warps (512 threads, one channel each);
    // from B = 3 one block per (row, q/k head).
    const bool clustered = batch * 16 * 4 <= 132;
    CHECK(launch.shape.grid.x == batch * 16 * (clustered ? 4 : 1));
    CHECK(launch.shape.cluster == (clustered ? Dim3{4, 1, 1} : Dim3{}));
    CHECK(launch.shape.block.x == (clustered ? 512u : batch * 16 >= 4 * 132 ? 256u : 1024u));
    // q, k [128] each, v of 2 value heads [256], 2 alphas and betas: 516 floats; clustered, the
    // new pool columns of 64 q/k channels [64][3] besides.
    CHECK(launch.shape.dynamic_smem == (clustered ? 516 + 192 : 516) * 4);
    for (const LimitCheck& check : launch.checks) CHECK(check.ok());
  }
  const Views w = views(1);
  CHECK(plan(w, conv_options(w), h200).launches[0].spec.str() ==
        "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,"
        "weight=bf16,conv_state=bf16,k=128,v=128,width=4,warps=16,gated=0,l2norm=1,"
        "invalid=negative,silu=1,state_vec=4,cluster=4@sm_90");
  // Without the option the plain step's plan (and spec) is untouched.
  CHECK(plan(w, {}, h200).launches.back().spec.family == "gdn_decode");
}

TEST_CASE("gdn_decode fused conv plan: clusters only on sm_90 and later, only even splits") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  // B = 1 on sm_80: no clusters there, one 32-warp block per (row, q/k head).
  {
    const Views w = views(1);
    const Plan p = plan(w, conv_options(w), DeviceLimits::for_arch(Arch{8, 0}));
    CHECK(p.launches[0].shape.cluster == Dim3{});
    CHECK(p.launches[0].spec.get_or("cluster", "1") == "1");
  }
  // B = 2 (32 blocks): the smallest cluster whose grid covers half the SMs, 2 x 32 x 4 >= 132.
  {
    const Views w = views(2);
    const Plan p = plan(w, conv_options(w), h200);
    CHECK(p.launches[0].shape.cluster == Dim3{4, 1, 1});
    CHECK(p.launches[0].shape.grid.x == 2 * 16 * 4);
    CHECK(p.launches[0].spec.get("cluster") == "4");
    CHECK(p.to_json().find("\"cluster\":[4,1,1]") != std::string::npos);
    CHECK(p.explain().find("cluster (4, 1, 1)") != std::string::npos);
    for (const LimitCheck& check : p.launches[0].checks) CHECK(check.ok());
  }
  // B = 5 (80 blocks, more than a quarter of the SMs): no cluster (from B = 4 clusters lost).
  {
    const Views w = views(5);
    CHECK(plan(w, conv_options(w), h200).launches[0].shape.cluster == Dim3{});
  }
  // A group of 4 state rows (HV = H, V = 4 is not a head dim; use V = 16 with HV = H): 16 rows
  // split at most 4 ways (4 rows per block; groups under 128 rows have no 64-row floor).
  {
    const Views w = views(1, 16, 16, 16, 16);
    const Plan p = plan(w, conv_options(w), h200);
    CHECK(p.launches[0].shape.cluster == Dim3{4, 1, 1});
  }
  // Unclustered plans do not name a cluster in their JSON.
  {
    const Views w = views(256);
    CHECK(plan(w, conv_options(w), h200).to_json().find("cluster") == std::string::npos);
  }
}

TEST_CASE("gdn_decode fused conv plan: options.conv->force_cluster") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  const auto forced = [](const Views& w, int cluster) {
    GdnDecodeOptions options = conv_options(w);
    options.conv->force_cluster = cluster;
    return options;
  };
  // B = 256 would take no cluster: forced to 4, 4096 clusters of 4 blocks of 64 rows.
  {
    const Views w = views(256);
    const Plan p = plan(w, forced(w, 4), h200);
    CHECK(p.launches[0].shape.cluster == Dim3{4, 1, 1});
    CHECK(p.launches[0].shape.grid.x == 256 * 16 * 4);
    CHECK(p.launches[0].spec.get("cluster") == "4");
    CHECK(p.explain().find("forced (options.conv->force_cluster = 4)") != std::string::npos);
    for (const LimitCheck& check : p.launches[0].checks) CHECK(check.ok());
  }
  // 70000 rows of one head (the GPU test's case): 280000 blocks in clusters of 4, grid x only.
  {
    const Views w = views(70000, 1, 1, 64, 16);
    const Plan p = plan(w, forced(w, 4), h200);
    CHECK(p.launches[0].shape.grid == Dim3{280000, 1, 1});
    CHECK(p.launches[0].shape.cluster == Dim3{4, 1, 1});
    for (const LimitCheck& check : p.launches[0].checks) CHECK(check.ok());
  }
  // B = 1 would take clusters of 8: forced to 1, one block per (row, q/k head), as on sm_80.
  {
    const Views w = views(1);
    const Plan p = plan(w, forced(w, 1), h200);
    CHECK(p.launches[0].shape.cluster == Dim3{});
    CHECK(p.launches[0].spec.get_or("cluster", "1") == "1");
    CHECK(p.launches[0].shape.grid.x == 16);
    CHECK(p.launches[0].shape.block.x == 1024);  // 16 blocks < 4 per SM: 32 warps each
    CHECK(p.explain().find("no cluster: forced (options.conv->force_cluster = 1)") !=
          std::string::npos);
  }
  // Refused: a size that is not 0, 1, 2, 4, 8 (argument), clusters before sm_90 and splits of
  // fewer than 4 rows (plan).
  const Views w = views(1);
  CHECK(failure<InvalidArgument>(w, forced(w, 3), h200)
            .find("options.conv->force_cluster = 3 is not accepted; accepted: 0 (the planner's "
                  "choice), 1 (no cluster), 2, 4 or 8") != std::string::npos);
  CHECK(failure<PlanError>(w, forced(w, 2), DeviceLimits::for_arch(Arch{8, 9}))
            .find("force_cluster = 2 needs thread-block clusters (sm_90 or later); the device is "
                  "sm_89") != std::string::npos);
  const Views small = views(1, 16, 16, 16, 16);  // 16 state rows per group
  CHECK(failure<PlanError>(small, forced(small, 8), h200)
            .find("force_cluster = 8 does not split the group's 16 state rows") !=
        std::string::npos);
}

TEST_CASE("gdn_decode fused conv plan: options.conv->force_stages") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  const auto forced = [](const Views& w, int stages, int cluster = 0) {
    GdnDecodeOptions options = conv_options(w);
    options.conv->force_stages = stages;
    options.conv->force_cluster = cluster;
    return options;
  };
  // The planner's own plans take no ring (spec without stages, two register sets).
  for (std::int64_t batch : {1, 4, 256}) {
    const Views w = views(batch);
    const Plan p = plan(w, conv_options(w), h200);
    CHECK_FALSE(p.launches[0].spec.has("stages"));
    CHECK(p.explain().find("two register sets of 4 rows per warp") != std::string::npos);
  }
  // B = 256 (8-warp blocks) forced to 2, 3, 4 stages: the ring follows the 16-byte-aligned
  // floats (2K + G (V + 2) = 516 floats -> 2064 bytes), stages x 8 warps x 4 rows x 512 bytes.
  for (int stages : {2, 3, 4}) {
    CAPTURE(stages);
    const Views w = views(256);
    const Plan p = plan(w, forced(w, stages), h200);
    CHECK(p.launches[0].spec.get("stages") == std::to_string(stages));
    CHECK(p.launches[0].shape.block.x == 256);
    CHECK(p.launches[0].shape.dynamic_smem == 2064 + stages * 8 * 4 * 512);
    CHECK(p.explain().find(fmt::format("a ring of {} sets of 4 rows per warp", stages)) !=
          std::string::npos);
    for (const LimitCheck& check : p.launches[0].checks) CHECK(check.ok());
  }
  // 1 is the register sets, said as forced; the spec is the planner's.
  {
    const Views w = views(256);
    const Plan p = plan(w, forced(w, 1), h200);
    CHECK(p.launches[0].spec == plan(w, conv_options(w), h200).launches[0].spec);
    CHECK(p.explain().find("forced (options.conv->force_stages = 1)") != std::string::npos);
  }
  // Refused: a count that is not 0..4 (argument); a clustered plan (B = 1 on an H200 clusters
  // unless told not to) and state vectors narrower than 16 bytes (plan).
  const Views one = views(1);
  CHECK(failure<InvalidArgument>(one, forced(one, 5), h200)
            .find("options.conv->force_stages = 5 is not accepted; accepted: 0 (the planner's "
                  "choice), 1 (state rows in registers), 2, 3 or 4") != std::string::npos);
  CHECK(failure<InvalidArgument>(one, forced(one, -1), h200)
            .find("force_stages = -1 is not accepted") != std::string::npos);
  CHECK(failure<PlanError>(one, forced(one, 3), h200)
            .find("force_stages = 3 needs an unclustered plan; this one takes clusters of 4 "
                  "blocks") != std::string::npos);
  CHECK(plan(one, forced(one, 3, 1), h200).launches[0].spec.get("stages") == "3");
  // B = 4: 64 blocks of 32 warps (unclustered on an H200); 3 stages are 196,608 bytes of ring,
  // 4 would be 262,144, more than a block may have: refused by the launch checks.
  const Views four = views(4);
  CHECK(plan(four, forced(four, 3), h200).launches[0].shape.dynamic_smem == 2064 + 3 * 32 * 2048);
  CHECK(failure<PlanError>(four, forced(four, 4), h200).find("shared memory") != std::string::npos);
  const Views narrow = views(256, 16, 32, 64, 128);  // K = 64: 32 lanes x 2 floats
  CHECK(failure<PlanError>(narrow, forced(narrow, 2), h200)
            .find("force_stages = 2 needs 16-byte state vectors (cp.async copies 16 bytes); this "
                  "plan accesses the state 8 bytes per lane (K = 64") != std::string::npos);
}

TEST_CASE("gdn_decode_conv specs: clusters of 1, 2, 4, 8 blocks, only from sm_90") {
  const std::string base =
      "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,"
      "weight=bf16,conv_state=bf16,k=128,v=128,width=4,warps=8,gated=0,l2norm=1,"
      "invalid=negative,silu=1,state_vec=4";
  const auto refusal = [&](const std::string& tail) {
    try {
      KernelSpec::parse(base + tail);
    } catch (const Error& error) {
      return std::string(error.what());
    }
    return std::string();
  };
  CHECK(refusal(",cluster=8@sm_90").empty());
  CHECK(refusal(",cluster=2@sm_100a").empty());
  CHECK(refusal(",cluster=3@sm_90").find("cluster = 3; accepted: 1, 2, 4 or 8 blocks") !=
        std::string::npos);
  CHECK(refusal(",cluster=2@sm_80").find("cluster = 2 needs sm_90 or later") != std::string::npos);
  CHECK(refusal(",cluster=9@sm_90").find("out of range; accepted: 1..8") != std::string::npos);
  // The state ring: 2..4 stages, unclustered, 16-byte vectors (f32 x 4 here; f16 x 4 is 8 bytes).
  CHECK(refusal(",stages=3@sm_90").empty());
  CHECK(refusal(",stages=1@sm_90").find("stages = 1; accepted: 0 (no ring), 2, 3 or 4") !=
        std::string::npos);
  CHECK(refusal(",cluster=2,stages=2@sm_90")
            .find("stages = 2 needs cluster = 1 and 16-byte state vectors; the spec has cluster = "
                  "2 and 16-byte vectors") != std::string::npos);
  std::string half = base;
  half.replace(half.find("state=f32"), 9, "state=f16");
  try {
    KernelSpec::parse(half + ",stages=2@sm_90");
    FAIL("an f16 state in 8-byte vectors took a ring");
  } catch (const Error& error) {
    CHECK(std::string(error.what()).find("cluster = 1 and 8-byte vectors") != std::string::npos);
  }
}

TEST_CASE("launch checks: clusters of more than 8 blocks, partial clusters, sm_80") {
  const DeviceLimits h200 = DeviceLimits::for_arch(Arch{9, 0});
  LaunchShape shape;
  shape.grid = Dim3{64, 1, 1};
  shape.block = Dim3{256, 1, 1};
  const auto failed = [](const std::vector<LimitCheck>& checks) {
    std::string names;
    for (const LimitCheck& check : checks) {
      if (!check.ok()) names += check.limit + ";";
    }
    return names;
  };
  shape.cluster = Dim3{8, 1, 1};
  CHECK(failed(check_launch(shape, h200)).empty());
  shape.cluster = Dim3{16, 1, 1};
  CHECK(failed(check_launch(shape, h200)) == "blocks per cluster (portable size);");
  shape.cluster = Dim3{3, 1, 1};
  CHECK(failed(check_launch(shape, h200)) == "grid.x modulo cluster.x;");
  shape.cluster = Dim3{0, 1, 1};
  CHECK(failed(check_launch(shape, h200)).find("cluster.x >= 1") != std::string::npos);
  shape.cluster = Dim3{2, 1, 1};
  CHECK(failed(check_launch(shape, DeviceLimits::for_arch(Arch{8, 0}))) ==
        "blocks per cluster (portable size);");
  try {
    shape.cluster = Dim3{16, 1, 1};
    require_legal(check_launch(shape, h200), "test launch");
    FAIL("a cluster of 16 blocks passed");
  } catch (const PlanError& error) {
    CHECK(std::string(error.what()) ==
          "test launch: blocks per cluster (portable size) is 8 at most, the launch needs 16");
  }
}

TEST_CASE("gdn_decode fused conv plan: the gated form, f32 weights, no bias, no activation") {
  Views w = views(2, 4, 16, 64, 64, 2);
  w.weight.dtype = DType::f32;
  w.bias = TensorView{};
  GdnDecodeOptions options = conv_options(w);
  options.conv->activation = ConvActivation::none;
  options.invalid_index = GdnInvalidIndex::nonpositive;
  TensorView g = TensorView::contiguous(fake(11), DType::f32, {2, 16});
  const Plan p = plan_gdn_decode_gated(w.qkv, g, g, w.state, w.indices, w.out, options,
                                       DeviceLimits::for_arch(Arch{8, 0}));
  REQUIRE(p.launches.size() == 1);
  CHECK(p.op == "gdn_decode_gated");
  CHECK(p.launches[0].spec.get("gated") == "1");
  CHECK(p.launches[0].spec.get("silu") == "0");
  CHECK(p.launches[0].spec.get("weight") == "f32");
  CHECK(p.launches[0].spec.get("width") == "2");
  CHECK(p.launches[0].spec.get("invalid") == "nonpositive");
}

TEST_CASE("gdn_decode fused conv plan: too much shared memory is a PlanError") {
  // H = 1, HV = 128, K = V = 256: one block holds the conv output of all 128 value heads,
  // 2*256 + 128*258 floats = 134 KB, over sm_86's opt-in limit (99 KiB).
  const Views w = views(1, 1, 128, 256, 256);
  CHECK_THROWS_AS(plan(w, conv_options(w), DeviceLimits::for_arch(Arch{8, 6})), PlanError);
}

TEST_CASE("gdn_decode fused conv in the op catalog: kjit plan and manifests reach its kernel") {
  const OpInfo& op = find_op("gdn_decode_conv");
  const ShapeValues values = complete_shape_values(
      op, {{"batch", "1"}, {"heads", "16"}, {"v_heads", "32"}, {"k", "128"}, {"v", "128"}}, true);
  CHECK(values.at("width") == "4");
  CHECK(values.at("conv_state_dtype") == "bf16");
  const Plan p = plan_from_shape(op, values, DeviceLimits::for_arch(Arch{9, 0}));
  REQUIRE(p.launches.size() == 1);
  CHECK(p.launches[0].spec.str() ==
        "gdn_decode_conv:qkv=bf16,gate=bf16,a_log=f32,dt_bias=bf16,state=f32,out=bf16,index=i32,"
        "weight=bf16,conv_state=bf16,k=128,v=128,width=4,warps=16,gated=0,l2norm=1,"
        "invalid=negative,silu=1,state_vec=4,cluster=4@sm_90");
  ShapeValues gated = values;
  gated["gated"] = "1";
  gated["silu"] = "0";
  gated["width"] = "2";
  CHECK(plan_from_shape(op, gated, DeviceLimits::for_arch(Arch{8, 0}))
            .launches[0]
            .spec.get("gated") == "1");
  gated["width"] = "9";
  CHECK_THROWS_AS(plan_from_shape(op, gated, DeviceLimits::for_arch(Arch{9, 0})), InvalidArgument);
}

TEST_CASE("gdn_decode fused conv validation names the argument, its value and what is accepted") {
  Views w = views(4);
  w.weight.shape[1] = 9;
  CHECK(rejection(w, conv_options(w)).find("options.conv->weight") != std::string::npos);

  w = views(4);
  w.weight.shape[0] -= 8;
  CHECK(rejection(w, conv_options(w)).find("D = 2*H*K + HV*V = 8192") != std::string::npos);

  w = views(4);
  w.weight.dtype = DType::f16;
  CHECK(rejection(w, conv_options(w)).find("mixed_qkv's (bf16) or f32") != std::string::npos);

  w = views(4);
  w.bias.dtype = DType::f32;
  CHECK(rejection(w, conv_options(w)).find("options.conv->bias") != std::string::npos);

  w = views(4);
  w.pool.shape[2] = 2;
  CHECK(rejection(w, conv_options(w)).find("L >= W - 1 = 3") != std::string::npos);

  w = views(4);
  w.pool.shape[0] = 9;
  CHECK(rejection(w, conv_options(w)).find("slots = 8") != std::string::npos);

  w = views(4);
  w.pool.dtype = DType::i32;
  CHECK(rejection(w, conv_options(w)).find("conv_state") != std::string::npos);

  w = views(4);
  w.pool.data = nullptr;
  CHECK(rejection(w, conv_options(w)).find("null") != std::string::npos);

  w = views(4);
  GdnDecodeOptions options = conv_options(w);
  options.force_mode = "flat";
  CHECK(rejection(w, options).find("options.force_mode = 'flat' does not apply") !=
        std::string::npos);
  options = conv_options(w);
  options.row_order = GdnRowOrder::by_slot;
  CHECK(rejection(w, options).find("by_slot") != std::string::npos);
  options = conv_options(w);
  options.force_bv = 4;
  CHECK(rejection(w, options).find("force_bv") != std::string::npos);

  // A V-contiguous state pool runs only without the conv.
  w = views(4);
  w.state.strides[2] = 1;
  w.state.strides[3] = 128;
  CHECK(rejection(w, conv_options(w)).find("K contiguous") != std::string::npos);
  // The step's own checks still apply.
  w = views(4);
  w.out.shape[2] = 64;
  CHECK(rejection(w, conv_options(w)).find("out") != std::string::npos);
}

TEST_CASE("gdn reference: the fused step by hand (one row, W = 2, K = V = 16)") {
  const std::int64_t k = 16, v = 16, d = 2 * k + v;
  std::vector<float> qkv(d), weight(d * 2), bias(d), pool(2 * d), state(2 * v * k), out(v);
  std::vector<float> a{0.3f}, b{-0.2f}, a_log{0.1f}, dt_bias{0.05f};
  std::vector<std::int32_t> index{1};
  for (std::int64_t i = 0; i < d; ++i) {
    qkv[i] = std::sin(0.7f * static_cast<float>(i));
    weight[2 * i] = 0.3f + 0.01f * static_cast<float>(i);
    weight[2 * i + 1] = -0.2f + 0.02f * static_cast<float>(i % 5);
    bias[i] = 0.01f * static_cast<float>(i % 3);
    pool[i] = 9.0f;  // slot 0: untouched
    pool[d + i] = std::cos(0.3f * static_cast<float>(i));
  }
  for (std::size_t i = 0; i < state.size(); ++i) state[i] = 0.01f * static_cast<float>(i % 7);
  const std::vector<float> pool_before = pool, state_before = state;
  auto view = [](std::vector<float>& x, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(x.data(), DType::f32, shape);
  };
  GdnDecodeOptions options;
  options.conv = GdnDecodeConv{view(weight, {d, 2}), view(bias, {d}), view(pool, {2, d, 1}),
                               ConvActivation::silu};
  const TensorView v_qkv = view(qkv, {1, d}), v_a = view(a, {1, 1}), v_b = view(b, {1, 1}),
                   v_alog = view(a_log, {1}), v_dt = view(dt_bias, {1});
  std::vector<double> got(v);
  reference::gdn_decode_conv_reference(v_qkv, v_a, v_b, &v_alog, &v_dt, view(state, {2, 1, v, k}),
                                       TensorView::contiguous(index.data(), DType::i32, {1}),
                                       view(out, {1, 1, v}), options, got);

  // By hand: y = silu(bias + w0 * history + w1 * x), rounded to f32, then one gdn_step.
  std::vector<double> y(d);
  for (std::int64_t c = 0; c < d; ++c) {
    const double acc =
        static_cast<double>(bias[c]) +
        static_cast<double>(weight[2 * c]) * static_cast<double>(pool_before[d + c]) +
        static_cast<double>(weight[2 * c + 1]) * static_cast<double>(qkv[c]);
    y[c] = static_cast<double>(static_cast<float>(acc / (1.0 + std::exp(-acc))));
  }
  std::vector<double> h(state_before.begin() + v * k, state_before.end());
  std::vector<double> want(v);
  const double g =
      reference::gdn_log_decay(static_cast<double>(a[0]), static_cast<double>(a_log[0]),
                               static_cast<double>(dt_bias[0]), 20.0);
  reference::gdn_step(
      h, std::span<const double>(y.data(), k), std::span<const double>(y.data() + k, k),
      std::span<const double>(y.data() + 2 * k, v), g,
      reference::gdn_sigmoid(static_cast<double>(b[0])), 1.0 / std::sqrt(16.0), true, want);
  for (std::int64_t i = 0; i < v; ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  for (std::int64_t c = 0; c < d; ++c) {
    CHECK(pool[d + c] == qkv[c]);  // W - 1 = 1 column: the new input
    CHECK(pool[c] == 9.0f);
  }
  for (std::int64_t i = 0; i < v * k; ++i) CHECK(state[i] == state_before[i]);  // slot 0
}

}  // namespace
}  // namespace kjit
