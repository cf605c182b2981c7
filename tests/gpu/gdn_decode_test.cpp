// SPDX-License-Identifier: Apache-2.0
// gdn_decode on the GPU against the float64 reference: every dtype combination, several steps
// feeding the pool back, invalid indices under both rules (pool bit-identical), the grid
// boundaries (B*HV = 65535, 65536, 131072; B = 70000), strided views, both forms, and the
// persistent and bulk modes (tile loops that wrap the register sets and the shared-memory ring
// many times, invalid rows inside the ring, every stage count).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "common/gpu_tensor.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"

namespace kjit {
namespace {

using support::load_as_double;

using test::Tensor;

struct Case {
  std::int64_t batch = 5, heads = 2, value_heads = 4, k = 128, v = 128;
  DType qkv = DType::bf16, gate = DType::bf16, state = DType::f32, out = DType::bf16;
  DType index = DType::i32, a_log = DType::f32, dt_bias = DType::bf16;
  GdnInvalidIndex rule = GdnInvalidIndex::negative;
  bool gated = false;
  bool l2norm = true;
  int steps = 3;
  /// Extra elements per row / slot; index stride.
  std::int64_t qkv_pad = 0, gate_pad = 0, slot_pad = 0, out_pad = 0, index_stride = 1;
  /// Rows whose index is invalid (every `invalid_every`-th row; 0: none).
  std::int64_t invalid_every = 4;
  std::string force_mode;
  int force_bv = 0, force_stages = 0, force_blocks_per_sm = 0;
  std::string force_cache_hints;
  GdnRowOrder row_order = GdnRowOrder::automatic;
  /// Steps after the first run as a captured CUDA graph (the first loads the kernels).
  bool capture = false;
  std::string expect_mode;
  /// Whether the plan must (1) or must not (0) take the rows in slot order; -1: not checked.
  int expect_ordered = -1;
  /// The planner's state load hint, checked when not empty (e.g. "staged").
  std::string expect_load_hint;
  /// The pool as fla keeps it: [slots, HV, K, V] contiguous per slot, passed as its transpose
  /// (strides [slot, V*K, 1, V]); the plan must be the state_layout=kv specialization.
  bool k_major = false;

  std::string str() const {
    return fmt::format(
        "B={} H={} HV={} K={} V={} qkv={} gate={} state={} out={} index={} rule={} gated={} "
        "pads=({},{},{},{},{}) mode={} bv={} stages={} bps={} hints={} order={} capture={} "
        "k_major={}",
        batch, heads, value_heads, k, v, to_string(qkv), to_string(gate), to_string(state),
        to_string(out), to_string(index),
        rule == GdnInvalidIndex::negative ? "negative" : "nonpositive", gated, qkv_pad, gate_pad,
        slot_pad, out_pad, index_stride, force_mode, force_bv, force_stages, force_blocks_per_sm,
        force_cache_hints, static_cast<int>(row_order), capture, k_major);
  }
};

bool is16(DType d) { return d == DType::bf16 || d == DType::f16; }

/// |got - want| <= atol + rtol |want|; reports the first few failures.
void compare(const char* what, const Tensor& got_t, const std::vector<unsigned char>& got_bytes,
             const Tensor& want, double atol, double rtol,
             const std::vector<bool>* mask = nullptr) {
  std::int64_t bad = 0;
  double worst = 0;
  for (std::int64_t i = 0; i < want.elements(); ++i) {
    if (mask != nullptr && !(*mask)[static_cast<std::size_t>(i)]) continue;
    const double g = load_as_double(got_bytes.data(), got_t.dtype, i);
    const double w = want.get(i);
    const double err = std::fabs(g - w);
    if (!(err <= atol + rtol * std::fabs(w))) {
      if (bad < 5) MESSAGE(fmt::format("{}[{}]: got {} want {}", what, i, g, w));
      ++bad;
    }
    if (std::isfinite(err)) worst = std::max(worst, err);
  }
  CHECK_MESSAGE(bad == 0,
                fmt::format("{}: {} elements out of tolerance (max err {})", what, bad, worst));
}

void run_case(const Case& c) {
  INFO(c.str());
  test::runtime();  // the runtime first, then its context current for device buffers
  test::Rng rng(test::fresh_seed());
  const std::int64_t width = 2 * c.heads * c.k + c.value_heads * c.v;
  const std::int64_t slots = c.batch + 2;
  Tensor qkv(c.qkv, {c.batch, width}, {width + c.qkv_pad, 1});
  Tensor a(c.gated ? DType::f32 : c.gate, {c.batch, c.value_heads},
           {c.value_heads + c.gate_pad, 1});
  Tensor b(c.gated ? DType::f32 : c.gate, {c.batch, c.value_heads},
           {c.value_heads + c.gate_pad, 1});
  Tensor a_log(c.a_log, {c.value_heads});
  Tensor dt_bias(c.dt_bias, {c.value_heads});
  const std::int64_t slot_size = c.value_heads * c.v * c.k;
  // The reference reads the pool through its strides, so both layouts share it.
  Tensor state(c.state, {slots, c.value_heads, c.v, c.k},
               c.k_major ? std::vector<std::int64_t>{slot_size + c.slot_pad, c.v * c.k, 1, c.v}
                         : std::vector<std::int64_t>{slot_size + c.slot_pad, c.v * c.k, c.k, 1});
  Tensor indices(c.index, {c.batch}, {c.index_stride});
  Tensor out(c.out, {c.batch, c.value_heads, c.v}, {c.value_heads * c.v + c.out_pad, c.v, 1});
  Tensor ref_out(c.out, out.shape, out.strides);

  // Valid rows get distinct slots from 1..slots-1 (slot 0 is left for the nonpositive rule's
  // null block); invalid rows get -1, or 0 under the nonpositive rule.
  std::vector<std::int64_t> free_slots(static_cast<std::size_t>(slots - 1));
  std::iota(free_slots.begin(), free_slots.end(), 1);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  for (std::int64_t i = 0; i < indices.elements(); ++i) indices.set(i, -3);  // stride padding
  for (std::int64_t n = 0; n < c.batch; ++n) {
    std::int64_t slot = free_slots[static_cast<std::size_t>(n)];
    if (c.invalid_every > 0 && n % c.invalid_every == 1) {
      slot = (c.rule == GdnInvalidIndex::nonpositive && (n / c.invalid_every) % 2 == 0) ? 0 : -1;
    }
    indices.set(n * c.index_stride, static_cast<double>(slot));
  }
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (std::int64_t i = 0; i < c.value_heads; ++i) {
    a_log.set(i, uniform(rng));
    dt_bias.set(i, 0.5 * uniform(rng));
  }
  state.fill(rng, 0.1);
  const std::vector<unsigned char> initial_state = state.host;
  state.upload();
  indices.upload();
  a_log.upload();
  dt_bias.upload();

  GdnDecodeOptions options;
  options.runtime = &test::runtime();
  options.device = test::device();
  options.invalid_index = c.rule;
  options.l2norm_qk = c.l2norm;
  options.force_mode = c.force_mode;
  options.force_bv = c.force_bv;
  options.force_stages = c.force_stages;
  options.force_blocks_per_sm = c.force_blocks_per_sm;
  options.force_cache_hints = c.force_cache_hints;
  options.row_order = c.row_order;
  const auto call = [&](Stream stream) {
    if (c.gated) {
      gdn_decode_gated(qkv.view(true), a.view(true), b.view(true), state.view(true),
                       indices.view(true), out.view(true), options, stream);
    } else {
      gdn_decode(qkv.view(true), a.view(true), b.view(true), a_log.view(true), dt_bias.view(true),
                 state.view(true), indices.view(true), out.view(true), options, stream);
    }
  };
  // One step as a CUDA graph, captured on a stream of its own and replayed once (the state is
  // updated in place, so only the replay may run it).
  const auto call_in_graph = [&] {
    test::sync();
    CUstream stream = nullptr;
    test::check_cu(test::cu().cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    test::check_cu(test::cu().cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                   "cuStreamBeginCapture");
    std::string failure;
    try {
      call(reinterpret_cast<Stream>(stream));
    } catch (const Error& error) {
      failure = error.what();
    }
    CUgraph graph = nullptr;
    const CUresult end = test::cu().cuStreamEndCapture(stream, &graph);
    CAPTURE(failure);
    CHECK(failure.empty());
    test::check_cu(end, "cuStreamEndCapture");
    REQUIRE(graph != nullptr);
    CUgraphExec exec = nullptr;
    test::check_cu(test::cu().cuGraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
    test::check_cu(test::cu().cuGraphLaunch(exec, stream), "cuGraphLaunch");
    test::check_cu(test::cu().cuStreamSynchronize(stream), "cuStreamSynchronize");
    (void)test::cu().cuGraphExecDestroy(exec);
    (void)test::cu().cuGraphDestroy(graph);
    (void)test::cu().cuStreamDestroy(stream);
  };

  for (int step = 0; step < c.steps; ++step) {
    CAPTURE(step);
    qkv.fill(rng, 1.0);
    if (c.gated) {
      std::normal_distribution<double> normal(0.0, 1.0);
      for (std::int64_t i = 0; i < a.elements(); ++i) {
        a.set(i, reference::gdn_log_decay(normal(rng), a_log.get(i % c.value_heads), 0.0, 20.0));
        b.set(i, reference::gdn_sigmoid(normal(rng)));
      }
    } else {
      a.fill(rng, 1.0);
      b.fill(rng, 1.0);
    }
    qkv.upload();
    a.upload();
    b.upload();
    out.poison();
    if (c.capture && step > 0) {
      call_in_graph();
    } else {
      call(test::stream());
    }
    if (c.gated) {
      reference::gdn_decode_gated_reference(qkv.view(false), a.view(false), b.view(false),
                                            state.view(false), indices.view(false),
                                            ref_out.view(false), options);
    } else {
      reference::gdn_decode_reference(qkv.view(false), a.view(false), b.view(false),
                                      a_log.view(false), dt_bias.view(false), state.view(false),
                                      indices.view(false), ref_out.view(false), options);
    }
    test::sync();
    const bool coarse = is16(c.qkv) || is16(c.state) || is16(c.out) || is16(c.gate);
    const double atol = coarse ? 2e-2 : 1e-4, rtol = coarse ? 1e-2 : 1e-4;
    // Only the [B, HV, V] elements: the row padding of out stays poisoned.
    std::vector<bool> out_mask(static_cast<std::size_t>(ref_out.elements()), false);
    for (std::int64_t n = 0; n < c.batch; ++n) {
      for (std::int64_t i = 0; i < c.value_heads * c.v; ++i) {
        out_mask[static_cast<std::size_t>(n * out.strides[0] + i)] = true;
      }
    }
    compare("out", out, out.download(), ref_out, atol, rtol, &out_mask);
    compare("state", state, state.download(), state, atol, rtol);
  }

  // Slots no valid row owns, and the slot padding, are bit-identical to what was uploaded.
  const std::vector<unsigned char> final_state = state.download();
  std::vector<bool> owned(static_cast<std::size_t>(slots), false);
  for (std::int64_t n = 0; n < c.batch; ++n) {
    const auto slot = static_cast<std::int64_t>(indices.get(n * c.index_stride));
    const bool invalid = c.rule == GdnInvalidIndex::nonpositive ? slot <= 0 : slot < 0;
    if (!invalid) owned[static_cast<std::size_t>(slot)] = true;
  }
  const std::size_t esize = size_of(c.state);
  std::int64_t changed = 0;
  for (std::int64_t s = 0; s < slots; ++s) {
    const std::size_t begin = static_cast<std::size_t>(s * state.strides[0]) * esize;
    const std::size_t end =
        std::min(final_state.size(), static_cast<std::size_t>((s + 1) * state.strides[0]) * esize);
    const std::size_t owned_end = owned[static_cast<std::size_t>(s)]
                                      ? begin + static_cast<std::size_t>(slot_size) * esize
                                      : begin;
    for (std::size_t i = owned_end; i < end; ++i) changed += final_state[i] != initial_state[i];
  }
  CHECK_MESSAGE(changed == 0,
                fmt::format("{} bytes changed outside the slots of valid rows", changed));
  {
    const Plan plan =
        plan_gdn_decode(qkv.view(true), a.view(true), b.view(true), a_log.view(true),
                        dt_bias.view(true), state.view(true), indices.view(true), out.view(true),
                        options, test::runtime().device_limits(test::device()));
    if (!c.expect_mode.empty()) CHECK(plan.mode == c.expect_mode);
    if (!c.expect_load_hint.empty()) {
      CHECK(plan.launches.back().spec.get("load_hint") == c.expect_load_hint);
    }
    if (c.expect_ordered >= 0) {
      CHECK(plan.launches.back().spec.get_int("ordered") == c.expect_ordered);
      CHECK(plan.launches.size() == (c.expect_ordered == 1 ? 2u : 1u));
    }
    CHECK(plan.launches.back().spec.get_or("state_layout", "vk") == (c.k_major ? "kv" : "vk"));
  }
}

TEST_CASE("gdn_decode gpu: every dtype combination, three steps") {
  for (DType qkv : {DType::bf16, DType::f16, DType::f32}) {
    for (DType state : {DType::f32, DType::bf16, DType::f16}) {
      for (DType index : {DType::i32, DType::i64}) {
        Case c;
        c.qkv = c.gate = c.out = c.dt_bias = qkv;
        c.state = state;
        c.index = index;
        run_case(c);
      }
    }
  }
  Case mixed;  // f32 output and f32 gates with bf16 inputs
  mixed.out = DType::f32;
  mixed.gate = DType::f32;
  mixed.a_log = DType::bf16;
  run_case(mixed);
}

TEST_CASE("gdn_decode gpu: head dims") {
  const std::pair<std::int64_t, std::int64_t> dims[] = {
      {64, 64}, {128, 128}, {256, 256}, {64, 256}, {256, 64}, {80, 48}, {16, 16}, {96, 112}};
  for (auto [k, v] : dims) {
    for (DType state : {DType::f32, DType::bf16}) {
      Case c;
      c.k = k;
      c.v = v;
      c.state = state;
      c.batch = 3;
      c.steps = 2;
      run_case(c);
    }
  }
}

TEST_CASE("gdn_decode gpu: invalid indices under both rules leave their slots bit-identical") {
  for (GdnInvalidIndex rule : {GdnInvalidIndex::negative, GdnInvalidIndex::nonpositive}) {
    Case c;
    c.rule = rule;
    c.batch = 9;
    c.invalid_every = 2;
    run_case(c);
    c.l2norm = false;
    c.gated = true;
    run_case(c);
  }
}

TEST_CASE("gdn_decode gpu: grid boundaries") {
  struct Shape {
    std::int64_t batch, value_heads;
    const char* mode;
  };
  for (Shape s : {Shape{65535, 1, "flat"}, Shape{65536, 1, "folded"}, Shape{32768, 2, "split"},
                  Shape{32768, 4, "split"}, Shape{70000, 1, "folded"}}) {
    Case c;
    c.batch = s.batch;
    c.heads = 1;
    c.value_heads = s.value_heads;
    c.k = c.v = 16;
    c.steps = 1;
    c.invalid_every = 1000;
    c.expect_mode = s.mode;
    run_case(c);
  }
}

TEST_CASE("gdn_decode gpu: every grid mode and tile size decodes the same tiles") {
  for (const char* mode : {"flat", "split", "folded"}) {
    for (int bv : {0, 1, 8, 32, 64}) {
      Case c;
      c.batch = 7;
      c.heads = 3;
      c.value_heads = 6;
      c.force_mode = mode;
      c.force_bv = bv;
      c.steps = 1;
      run_case(c);
    }
  }
}

// One block per SM and small V tiles: every block walks hundreds of tiles, so both register
// sets of the persistent loop and every stage of the bulk ring are reused many times, with
// invalid rows (no copy, a plain arrival) mixed in.
TEST_CASE("gdn_decode gpu: persistent and bulk modes loop over many tiles") {
  for (const char* mode : {"persistent", "bulk"}) {
    for (int bps : {1, 2}) {
      Case c;
      c.batch = 300;
      c.heads = 3;
      c.value_heads = 6;
      c.force_mode = mode;
      c.force_bv = 8;
      c.force_blocks_per_sm = bps;
      c.steps = 2;
      run_case(c);
    }
  }
  for (int stages : {1, 2, 3, 8}) {
    Case c;
    c.batch = 97;
    c.value_heads = 6;
    c.heads = 2;
    c.force_mode = "bulk";
    c.force_bv = 16;
    c.force_stages = stages;
    c.force_blocks_per_sm = 1;
    c.invalid_every = 3;
    c.steps = 2;
    run_case(c);
  }
}

TEST_CASE("gdn_decode gpu: persistent and bulk modes, dtypes, head dims, forms, rules") {
  for (const char* mode : {"persistent", "bulk"}) {
    for (DType state : {DType::f32, DType::bf16, DType::f16}) {
      for (int bv : {0, 2, 64}) {
        Case c;
        c.batch = 11;
        c.heads = 3;
        c.value_heads = 6;
        c.state = state;
        c.force_mode = mode;
        c.force_bv = bv;
        c.steps = 2;
        run_case(c);
      }
    }
    const std::pair<std::int64_t, std::int64_t> dims[] = {{64, 256}, {256, 64}, {80, 48}, {16, 16}};
    for (auto [k, v] : dims) {
      Case c;
      c.k = k;
      c.v = v;
      c.batch = 9;
      c.force_mode = mode;
      c.steps = 2;
      run_case(c);
    }
    Case gated;
    gated.force_mode = mode;
    gated.gated = true;
    gated.l2norm = false;
    gated.rule = GdnInvalidIndex::nonpositive;
    gated.batch = 13;
    gated.invalid_every = 2;
    gated.qkv = gated.out = DType::f32;
    gated.index = DType::i64;
    run_case(gated);
    Case strided;  // padded rows; a slot stride that keeps 16-byte alignment
    strided.force_mode = mode;
    strided.batch = 6;
    strided.qkv_pad = 40;
    strided.gate_pad = 3;
    strided.slot_pad = 8;
    strided.out_pad = 5;
    strided.index_stride = 2;
    run_case(strided);
  }
  Case narrow;  // 4-byte aligned pool: persistent runs, bulk is refused by the planner
  narrow.force_mode = "persistent";
  narrow.slot_pad = 3;
  narrow.batch = 6;
  run_case(narrow);
}

TEST_CASE("gdn_decode gpu: persistent and bulk modes at the grid boundaries") {
  for (const char* mode : {"persistent", "bulk"}) {
    for (std::int64_t value_heads : {1, 4}) {
      Case c;
      c.batch = value_heads == 1 ? 70000 : 32768;
      c.heads = 1;
      c.value_heads = value_heads;
      c.k = c.v = 16;
      c.steps = 1;
      c.invalid_every = 1000;
      c.force_mode = mode;
      c.expect_mode = mode;
      run_case(c);
    }
  }
}

// Every cache hint on every vector width (16, 8, 4 and 2-byte accesses), and a register cap
// on a one-tile-per-block grid.
TEST_CASE("gdn_decode gpu: cache hints and register caps") {
  for (const char* hints :
       {"stream/plain", "plain/stream", "plain/plain", "l2_256/stream", "l2_256/plain"}) {
    for (std::int64_t slot_pad : {0, 2, 3}) {
      Case c;
      c.batch = 6;
      c.slot_pad = slot_pad;
      c.force_cache_hints = hints;
      c.steps = 2;
      run_case(c);
    }
    Case narrow;
    narrow.batch = 5;
    narrow.state = DType::bf16;
    narrow.slot_pad = 1;
    narrow.force_cache_hints = hints;
    run_case(narrow);
  }
  for (const char* mode : {"flat", "folded"}) {
    Case c;
    c.batch = 9;
    c.force_mode = mode;
    c.force_blocks_per_sm = 6;
    run_case(c);
  }
}

// State tiles staged in shared memory by cp.async (the planner's choice for large grids):
// every one-tile mode, both state widths, tiles of one to many rows per thread, head dims with
// ragged lanes (K = 96) and several rows per warp (K = 16, 64), both store hints.
TEST_CASE("gdn_decode gpu: staged state loads in every one-tile mode") {
  for (const char* mode : {"flat", "split", "folded"}) {
    for (DType state : {DType::f32, DType::bf16}) {
      for (int bv : {0, 8, 32}) {
        for (const char* hints : {"staged/stream", "staged/plain"}) {
          Case c;
          c.batch = 9;
          c.force_mode = mode;
          c.state = state;
          c.force_bv = bv;
          c.force_cache_hints = hints;
          c.steps = 2;
          c.expect_load_hint = "staged";
          run_case(c);
        }
      }
    }
  }
  const std::pair<std::int64_t, std::int64_t> dims[] = {{16, 16}, {64, 64}, {96, 112}, {256, 256}};
  for (auto [k, v] : dims) {
    for (DType state : {DType::f32, DType::bf16}) {
      Case c;
      c.k = k;
      c.v = v;
      c.state = state;
      c.batch = 4;
      c.force_cache_hints = "staged/stream";
      c.expect_load_hint = "staged";
      run_case(c);
    }
  }
  // The planner stages a step of >= 512 MiB of state on its own (here 1.0 GiB, and 512 MiB at
  // the threshold, HV = 32, f32); invalid rows under both rules among them.
  for (GdnInvalidIndex rule : {GdnInvalidIndex::negative, GdnInvalidIndex::nonpositive}) {
    Case c;
    c.batch = rule == GdnInvalidIndex::negative ? 512 : 256;
    c.heads = 16;
    c.value_heads = 32;
    c.rule = rule;
    c.invalid_every = 3;
    c.expect_load_hint = "staged";
    c.expect_ordered = 1;  // and in slot order (>= 512 MiB)
    run_case(c);
  }
  Case small;
  small.batch = 1;
  small.heads = 16;
  small.value_heads = 32;
  small.expect_load_hint = "stream";
  run_case(small);
}

TEST_CASE("gdn_decode gpu: rows in slot order") {
  // Forced at small sizes: every one-tile mode, both rules, both index types (i64 strided),
  // both forms, staged and register loads, the ranking kernel's partial block (B = 37) and
  // its tiles of 1024 keys (B = 1025, 2049), one row, and steps replayed from a CUDA graph.
  for (const char* mode : {"", "flat", "split", "folded"}) {
    for (GdnInvalidIndex rule : {GdnInvalidIndex::negative, GdnInvalidIndex::nonpositive}) {
      for (DType index : {DType::i32, DType::i64}) {
        Case c;
        c.batch = 37;
        c.force_mode = mode;
        c.rule = rule;
        c.index = index;
        c.index_stride = index == DType::i64 ? 3 : 1;
        c.invalid_every = 3;
        c.row_order = GdnRowOrder::by_slot;
        c.expect_ordered = 1;
        c.steps = 2;
        run_case(c);
      }
    }
  }
  Case staged;
  staged.batch = 21;
  staged.force_cache_hints = "staged/stream";
  staged.row_order = GdnRowOrder::by_slot;
  staged.expect_ordered = 1;
  staged.expect_load_hint = "staged";
  run_case(staged);
  staged.gated = true;
  staged.state = DType::bf16;
  run_case(staged);
  for (std::int64_t batch : {1, 2, 1025, 2049}) {
    Case c;
    c.batch = batch;
    c.heads = 1;
    c.value_heads = 2;
    c.k = 32;
    c.v = 32;
    c.invalid_every = batch > 2 ? 5 : 0;
    c.row_order = GdnRowOrder::by_slot;
    c.expect_ordered = 1;
    c.steps = 2;
    run_case(c);
  }
  for (GdnRowOrder order : {GdnRowOrder::by_slot, GdnRowOrder::as_given}) {
    Case c;
    c.batch = 40;
    c.row_order = order;
    c.expect_ordered = order == GdnRowOrder::by_slot ? 1 : 0;
    c.capture = true;
    c.steps = 3;
    run_case(c);
  }
}

TEST_CASE("gdn_decode gpu: strided views") {
  Case c;
  c.batch = 6;
  c.qkv_pad = 40;
  c.gate_pad = 3;
  c.slot_pad = 8;
  c.out_pad = 5;
  c.index_stride = 2;
  run_case(c);
  c.slot_pad = 3;  // f32 pool rows only 4-byte aligned: narrower vectors
  c.index = DType::i64;
  run_case(c);
  c.state = DType::bf16;
  c.slot_pad = 1;  // 2-byte aligned
  run_case(c);
}

TEST_CASE("gdn_decode gpu: small batches (split V tiles) and Qwen3-Next shapes") {
  for (std::int64_t batch : {1, 2, 32}) {
    Case c;
    c.batch = batch;
    c.heads = 16;
    c.value_heads = 32;
    c.invalid_every = 0;
    c.steps = 2;
    run_case(c);
  }
}

// fla's layout: each slot [HV, K, V] with V contiguous, passed as the transposed view. Every
// dtype of the pool, head dims whose lines take 1..8 warps (and odd K, V), both rules with
// padding rows, both forms, each one-tile grid mode and forced tiles, rows in slot order,
// padded and misaligned slot strides (narrower vectors), graph replay, and grid boundaries.
TEST_CASE("gdn_decode gpu: K-major pool (V contiguous, fla's layout)") {
  for (DType state : {DType::f32, DType::bf16, DType::f16}) {
    for (DType qkv : {DType::bf16, DType::f32}) {
      Case c;
      c.k_major = true;
      c.state = state;
      c.qkv = c.gate = c.out = c.dt_bias = qkv;
      c.index = state == DType::bf16 ? DType::i64 : DType::i32;
      run_case(c);
    }
  }
  const std::pair<std::int64_t, std::int64_t> dims[] = {{64, 64}, {256, 256}, {64, 256}, {256, 64},
                                                        {80, 48}, {16, 16},   {96, 112}, {48, 128}};
  for (auto [k, v] : dims) {
    for (DType state : {DType::f32, DType::bf16}) {
      Case c;
      c.k_major = true;
      c.k = k;
      c.v = v;
      c.state = state;
      c.batch = 3;
      c.steps = 2;
      run_case(c);
    }
  }
  for (GdnInvalidIndex rule : {GdnInvalidIndex::negative, GdnInvalidIndex::nonpositive}) {
    Case c;
    c.k_major = true;
    c.rule = rule;
    c.batch = 9;
    c.invalid_every = 2;
    run_case(c);
    c.l2norm = false;
    c.gated = true;
    run_case(c);
  }
  for (const char* mode : {"flat", "split", "folded"}) {
    for (int bv : {0, 16, 32}) {
      Case c;
      c.k_major = true;
      c.batch = 7;
      c.heads = 3;
      c.value_heads = 6;
      c.force_mode = mode;
      c.force_bv = bv;
      c.steps = 1;
      c.expect_mode = mode;
      run_case(c);
    }
  }
  for (const char* hints : {"plain/plain", "l2_256/stream"}) {
    Case c;
    c.k_major = true;
    c.force_cache_hints = hints;
    c.force_blocks_per_sm = 4;
    c.steps = 1;
    run_case(c);
  }
  for (GdnRowOrder order : {GdnRowOrder::by_slot, GdnRowOrder::as_given}) {
    Case c;
    c.k_major = true;
    c.batch = 40;
    c.row_order = order;
    c.expect_ordered = order == GdnRowOrder::by_slot ? 1 : 0;
    c.capture = true;
    c.steps = 3;
    run_case(c);
  }
  Case strided;
  strided.k_major = true;
  strided.batch = 6;
  strided.qkv_pad = 40;
  strided.gate_pad = 3;
  strided.slot_pad = 8;
  strided.out_pad = 5;
  strided.index_stride = 2;
  run_case(strided);
  strided.slot_pad = 3;  // f32 pool slots only 4-byte aligned: narrower vectors
  run_case(strided);
  strided.state = DType::bf16;
  strided.slot_pad = 1;  // 2-byte aligned
  run_case(strided);
  for (std::int64_t batch : {1, 32}) {  // Qwen3-Next decode shapes
    Case c;
    c.k_major = true;
    c.batch = batch;
    c.heads = 16;
    c.value_heads = 32;
    c.invalid_every = 0;
    c.steps = 2;
    run_case(c);
  }
  Case boundary;  // B * HV = 65536: beyond grid y, split
  boundary.k_major = true;
  boundary.batch = 32768;
  boundary.heads = 1;
  boundary.value_heads = 2;
  boundary.k = boundary.v = 16;
  boundary.steps = 1;
  boundary.invalid_every = 1000;
  boundary.expect_mode = "split";
  run_case(boundary);
}

TEST_CASE("gdn_decode gpu: debug check rejects repeated indices") {
  test::runtime();
  Tensor qkv(DType::bf16, {2, 2 * 16 + 16});
  Tensor ab(DType::bf16, {2, 1});
  Tensor vec(DType::f32, {1});
  Tensor state(DType::f32, {4, 1, 16, 16});
  Tensor indices(DType::i32, {2});
  Tensor out(DType::bf16, {2, 1, 16});
  indices.set(0, 3);
  indices.set(1, 3);
  indices.upload();
  GdnDecodeOptions options;
  options.runtime = &test::runtime();
  options.device = test::device();
  options.debug_check_indices = true;
  CHECK_THROWS_WITH_AS(
      gdn_decode(qkv.view(true), ab.view(true), ab.view(true), vec.view(true), vec.view(true),
                 state.view(true), indices.view(true), out.view(true), options, test::stream()),
      doctest::Contains("repeats"), InvalidArgument);
}

}  // namespace
}  // namespace kjit
