// SPDX-License-Identifier: Apache-2.0
// The fused decode step (gdn_decode with options.conv, issue 22) on the GPU against the
// two-kernel sequence it replaces (kjit's causal_conv1d_update into a conv-output buffer, then
// gdn_decode on it) on the same inputs and copies of both pools: the conv pools bytewise equal,
// out and the state pool equal within rounding (the delta rule's sums run in another order),
// both against the float64 composed reference too; slots no valid row owns bytewise unchanged
// in both pools; padding rows (both rules, and an index >= slots) zero. Qwen3-Next's shape at
// B = 1, 3 and 256, odd sizes, every dtype class, both forms, several steps feeding both pools
// back.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/gpu_tensor.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"

namespace kjit {
namespace {

using test::Tensor;

struct Case {
  std::int64_t batch = 5, heads = 16, value_heads = 32, k = 128, v = 128, width = 4;
  /// Conv pool columns (>= width - 1); channel_major: the pool stored [slots, L, D].
  std::int64_t columns = 3;
  bool channel_major = false;
  DType qkv = DType::bf16, state = DType::f32, weight = DType::bf16, conv = DType::bf16;
  DType index = DType::i32;
  bool gated = false, bias = true, silu = true;
  GdnInvalidIndex rule = GdnInvalidIndex::negative;
  /// Every invalid_every-th row is padding (0: none); row 2 (when B > 4) has an index >= slots.
  std::int64_t invalid_every = 4;
  int steps = 3;
  /// options.conv->force_cluster and force_stages (0: the planner's choice).
  int force_cluster = 0;
  int force_stages = 0;

  std::string str() const {
    return fmt::format(
        "B={} H={} HV={} K={} V={} W={} L={}{} qkv={} state={} weight={} conv={} index={} "
        "gated={} bias={} silu={} rule={} force_cluster={} force_stages={}",
        batch, heads, value_heads, k, v, width, columns, channel_major ? " (channel-major)" : "",
        to_string(qkv), to_string(state), to_string(weight), to_string(conv), to_string(index),
        gated, bias, silu, rule == GdnInvalidIndex::negative ? "negative" : "nonpositive",
        force_cluster, force_stages);
  }
};

bool close(double got, double want, double atol, double rtol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

void run_case(const Case& c) {
  CAPTURE(c.str());
  test::runtime();
  test::Rng rng(test::fresh_seed());
  std::normal_distribution<double> normal(0.0, 1.0);
  const std::int64_t d = 2 * c.heads * c.k + c.value_heads * c.v;
  const std::int64_t slots = c.batch + 4, slot_elems = c.value_heads * c.v * c.k;
  const DType gate = c.gated ? DType::f32 : c.qkv;
  Tensor x(c.qkv, {c.batch, d}), conv_out(c.qkv, {c.batch, d}), a(gate, {c.batch, c.value_heads}),
      b(gate, {c.batch, c.value_heads}), a_log(DType::f32, {c.value_heads}),
      dt_bias(DType::bf16, {c.value_heads}), indices(c.index, {c.batch}),
      out_seq(c.qkv, {c.batch, c.value_heads, c.v}),
      out_fused(c.qkv, {c.batch, c.value_heads, c.v}),
      out_ref(c.qkv, {c.batch, c.value_heads, c.v}), weight(c.weight, {d, c.width}),
      bias(c.weight, {d}), state_seq(c.state, {slots, c.value_heads, c.v, c.k}),
      state_fused(c.state, {slots, c.value_heads, c.v, c.k}),
      state_ref(c.state, {slots, c.value_heads, c.v, c.k});
  const std::vector<std::int64_t> pool_shape = {slots, d, c.columns};
  const std::vector<std::int64_t> pool_strides =
      c.channel_major ? std::vector<std::int64_t>{d * c.columns, 1, d}
                      : std::vector<std::int64_t>{d * c.columns, c.columns, 1};
  Tensor conv_seq(c.conv, pool_shape, pool_strides), conv_fused(c.conv, pool_shape, pool_strides),
      conv_ref(c.conv, pool_shape, pool_strides);

  for (std::int64_t i = 0; i < state_seq.elements(); ++i) state_seq.set(i, 0.1 * normal(rng));
  for (std::int64_t i = 0; i < conv_seq.elements(); ++i) conv_seq.set(i, normal(rng));
  for (std::int64_t i = 0; i < weight.elements(); ++i) weight.set(i, 0.5 * normal(rng));
  for (std::int64_t i = 0; i < bias.elements(); ++i) bias.set(i, 0.2 * normal(rng));
  for (std::int64_t i = 0; i < c.value_heads; ++i) {
    a_log.set(i, 0.5 * normal(rng));
    dt_bias.set(i, 0.5 * normal(rng));
  }
  state_fused.host = state_ref.host = state_seq.host;
  conv_fused.host = conv_ref.host = conv_seq.host;
  const std::vector<unsigned char> state_initial = state_seq.host, conv_initial = conv_seq.host;
  std::vector<bool> owned(static_cast<std::size_t>(slots), false);
  std::vector<int> perm(static_cast<std::size_t>(slots));
  for (std::int64_t s = 0; s < slots; ++s) perm[static_cast<std::size_t>(s)] = static_cast<int>(s);
  std::shuffle(perm.begin() + 1, perm.end(), rng);  // slot 0 kept for the nonpositive rule
  std::vector<bool> padding(static_cast<std::size_t>(c.batch), false);
  for (std::int64_t n = 0; n < c.batch; ++n) {
    std::int64_t s = perm[static_cast<std::size_t>(n + 1)];
    if (c.invalid_every > 0 && n % c.invalid_every == 1) {
      s = c.rule == GdnInvalidIndex::nonpositive ? 0 : -1 - n;
      padding[static_cast<std::size_t>(n)] = true;
    } else if (c.invalid_every > 0 && n == 2 && c.batch > 4 &&
               !test::runtime().settings().debug_checks) {
      // (the debug check, KJIT_DEBUG_CHECKS=1, refuses what the kernels treat as padding)
      s = slots + 11;
      padding[static_cast<std::size_t>(n)] = true;
    } else {
      owned[static_cast<std::size_t>(s)] = true;
    }
    indices.set(n, static_cast<double>(s));
  }
  for (Tensor* t : {&a_log, &dt_bias, &indices, &weight, &bias, &state_seq, &state_fused, &conv_seq,
                    &conv_fused}) {
    t->upload();
  }

  CausalConv1dOptions conv_options;
  conv_options.activation = c.silu ? ConvActivation::silu : ConvActivation::none;
  conv_options.invalid_index = c.rule == GdnInvalidIndex::nonpositive
                                   ? ConvInvalidIndex::nonpositive
                                   : ConvInvalidIndex::negative;
  conv_options.runtime = &test::runtime();
  conv_options.device = test::device();
  GdnDecodeOptions options;
  options.runtime = &test::runtime();
  options.device = test::device();
  options.invalid_index = c.rule;
  GdnDecodeOptions fused = options;
  fused.conv = GdnDecodeConv{weight.view(true), c.bias ? bias.view(true) : TensorView{},
                             conv_fused.view(true), conv_options.activation};
  fused.conv->force_cluster = c.force_cluster;
  fused.conv->force_stages = c.force_stages;
  GdnDecodeOptions ref_options = options;
  ref_options.conv = GdnDecodeConv{weight.view(false), c.bias ? bias.view(false) : TensorView{},
                                   conv_ref.view(false), conv_options.activation};

  const Stream stream = test::stream();
  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    for (std::int64_t i = 0; i < x.elements(); ++i) x.set(i, normal(rng));
    for (std::int64_t i = 0; i < a.elements(); ++i) {
      const double u = normal(rng), w = normal(rng);
      a.set(i, c.gated ? reference::gdn_log_decay(u, a_log.get(i % c.value_heads), 0.0, 20.0) : u);
      b.set(i, c.gated ? reference::gdn_sigmoid(w) : w);
    }
    for (Tensor* t : {&x, &a, &b}) t->upload();
    out_seq.poison();
    out_fused.poison();
    conv_out.poison();

    // The two-kernel sequence.
    causal_conv1d_update(x.view(true), weight.view(true), c.bias ? bias.view(true) : TensorView{},
                         conv_seq.view(true), indices.view(true), TensorView{}, conv_out.view(true),
                         conv_options, stream);
    if (c.gated) {
      gdn_decode_gated(conv_out.view(true), a.view(true), b.view(true), state_seq.view(true),
                       indices.view(true), out_seq.view(true), options, stream);
    } else {
      gdn_decode(conv_out.view(true), a.view(true), b.view(true), a_log.view(true),
                 dt_bias.view(true), state_seq.view(true), indices.view(true), out_seq.view(true),
                 options, stream);
    }
    // The fused step.
    if (c.gated) {
      gdn_decode_gated(x.view(true), a.view(true), b.view(true), state_fused.view(true),
                       indices.view(true), out_fused.view(true), fused, stream);
    } else {
      gdn_decode(x.view(true), a.view(true), b.view(true), a_log.view(true), dt_bias.view(true),
                 state_fused.view(true), indices.view(true), out_fused.view(true), fused, stream);
    }
    // The reference.
    const TensorView h_a_log = a_log.view(false), h_dt = dt_bias.view(false);
    reference::gdn_decode_conv_reference(x.view(false), a.view(false), b.view(false),
                                         c.gated ? nullptr : &h_a_log, c.gated ? nullptr : &h_dt,
                                         state_ref.view(false), indices.view(false),
                                         out_ref.view(false), ref_options);

    // Both conv pools: the same bytes as each other and as the reference.
    const std::vector<unsigned char> conv_seq_bytes = conv_seq.download();
    const std::vector<unsigned char> conv_fused_bytes = conv_fused.download();
    CHECK(conv_fused_bytes == conv_seq_bytes);
    CHECK(conv_fused_bytes == conv_ref.host);

    out_seq.host = out_seq.download();
    out_fused.host = out_fused.download();
    state_seq.host = state_seq.download();
    state_fused.host = state_fused.download();
    const bool coarse = c.qkv != DType::f32 || c.state != DType::f32;
    const double atol = coarse ? 2e-2 : 1e-4, rtol = coarse ? 1e-2 : 1e-4;
    std::int64_t bad_out = 0, bad_state = 0;
    for (std::int64_t i = 0; i < out_fused.elements(); ++i) {
      const double got = out_fused.get(i);
      if (!close(got, out_seq.get(i), atol, rtol) || !close(got, out_ref.get(i), atol, rtol)) {
        if (bad_out++ < 3) {
          MESSAGE(fmt::format("out[{}]: fused {} two-kernel {} reference {}", i, got,
                              out_seq.get(i), out_ref.get(i)));
        }
      }
    }
    for (std::int64_t i = 0; i < state_fused.elements(); ++i) {
      const double got = state_fused.get(i);
      if (!close(got, state_seq.get(i), atol, rtol) || !close(got, state_ref.get(i), atol, rtol)) {
        if (bad_state++ < 3) {
          MESSAGE(fmt::format("state[{}]: fused {} two-kernel {} reference {}", i, got,
                              state_seq.get(i), state_ref.get(i)));
        }
      }
    }
    CHECK(bad_out == 0);
    CHECK(bad_state == 0);
    std::int64_t nonzero = 0;
    for (std::int64_t n = 0; n < c.batch; ++n) {
      if (!padding[static_cast<std::size_t>(n)]) continue;
      for (std::int64_t i = 0; i < c.value_heads * c.v; ++i) {
        if (out_fused.get(n * c.value_heads * c.v + i) != 0.0) ++nonzero;
      }
    }
    CHECK(nonzero == 0);
  }
  // Slots no valid row owns: bytewise what they were, in both pools of the fused step.
  const std::size_t esize = size_of(c.state), cesize = size_of(c.conv);
  const std::vector<unsigned char> pool = conv_fused.download();
  for (std::int64_t s = 0; s < slots; ++s) {
    if (owned[static_cast<std::size_t>(s)]) continue;
    CAPTURE(s);
    const auto begin =
        static_cast<std::ptrdiff_t>(static_cast<std::size_t>(s * slot_elems) * esize);
    const auto end =
        begin + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(slot_elems) * esize);
    CHECK(std::equal(state_fused.host.begin() + begin, state_fused.host.begin() + end,
                     state_initial.begin() + begin));
    std::int64_t changed = 0;
    for (std::int64_t ch = 0; ch < d; ++ch) {
      for (std::int64_t col = 0; col < c.columns; ++col) {
        const std::int64_t e = s * pool_strides[0] + ch * pool_strides[1] + col * pool_strides[2];
        const auto at = static_cast<std::ptrdiff_t>(static_cast<std::size_t>(e) * cesize);
        if (!std::equal(pool.begin() + at, pool.begin() + at + static_cast<std::ptrdiff_t>(cesize),
                        conv_initial.begin() + at)) {
          ++changed;
        }
      }
    }
    CHECK(changed == 0);
  }
}

TEST_CASE("gdn_decode fused conv gpu: Qwen3-Next shape at B = 1, 3, 256 vs the two kernels") {
  for (std::int64_t batch : {1, 3, 256}) {
    Case c;
    c.batch = batch;
    run_case(c);
  }
}

TEST_CASE("gdn_decode fused conv gpu: forced clusters at large batches and none at B = 1") {
  // Clusters where the planner takes none (B = 256: 4096 clusters of 8, 8192 of 2; B = 70000
  // with HV = H: 70000 clusters of 4 past 65535 in x), and none where it takes 8 (B = 1).
  for (const auto& [batch, cluster] : {std::pair<std::int64_t, int>{256, 8}, {256, 2}, {1, 1}}) {
    Case c;
    c.batch = batch;
    c.force_cluster = cluster;
    c.steps = 2;
    run_case(c);
  }
  Case c;
  c.batch = 70000;
  c.heads = 1;
  c.value_heads = 1;
  c.k = 64;
  c.v = 16;
  c.force_cluster = 4;
  c.steps = 1;
  run_case(c);
}

TEST_CASE("gdn_decode fused conv gpu: the state ring of 2, 3 and 4 stages") {
  // Qwen3-Next at B = 256 (8-warp blocks, 256 rows: 8 sets) in each ring; B = 3 unclustered
  // (32-warp blocks, 2 sets); 5 value heads of 48 rows per group (8 warps, a last set of 16
  // rows) with the nonpositive rule and an f32 conv pool.
  for (int stages : {2, 3, 4}) {
    Case c;
    c.batch = 256;
    c.force_stages = stages;
    c.steps = 2;
    run_case(c);
  }
  Case c;
  c.batch = 3;
  c.force_cluster = 1;
  c.force_stages = 3;
  run_case(c);
  c = Case{};
  c.batch = 600;
  c.heads = 1;
  c.value_heads = 5;
  c.v = 48;
  c.conv = DType::f32;
  c.rule = GdnInvalidIndex::nonpositive;
  c.force_stages = 4;
  c.steps = 2;
  run_case(c);
}

TEST_CASE("gdn_decode fused conv gpu: odd sizes, dtypes, rules, forms") {
  Case c;
  c.batch = 7;
  c.heads = 3;
  c.value_heads = 6;
  c.k = 48;
  c.v = 80;
  c.width = 3;
  c.columns = 5;
  c.qkv = DType::f16;
  c.weight = DType::f32;
  c.conv = DType::f16;
  c.state = DType::bf16;
  c.index = DType::i64;
  run_case(c);

  c = Case{};
  c.batch = 9;
  c.heads = 2;
  c.value_heads = 2;
  c.k = 16;
  c.v = 256;
  c.width = 2;
  c.qkv = c.weight = c.conv = c.state = DType::f32;
  c.gated = true;
  c.bias = false;
  c.silu = false;
  c.rule = GdnInvalidIndex::nonpositive;
  run_case(c);

  c = Case{};
  c.batch = 33;
  c.heads = 4;
  c.value_heads = 16;
  c.k = 256;
  c.v = 64;
  c.channel_major = true;
  c.columns = 4;
  c.conv = DType::f32;
  c.rule = GdnInvalidIndex::nonpositive;
  run_case(c);
}

TEST_CASE("gdn_decode fused conv gpu: many blocks per SM (8-warp blocks), W = 8") {
  Case c;
  c.batch = 700;
  c.heads = 2;
  c.value_heads = 8;
  c.k = 64;
  c.v = 64;
  c.width = 8;
  c.columns = 7;
  c.steps = 2;
  run_case(c);
}

}  // namespace
}  // namespace kjit
