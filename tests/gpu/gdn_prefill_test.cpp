// SPDX-License-Identifier: Apache-2.0
// gdn_prefill on the GPU against the float64 token-by-token reference: mixed lengths (0, 1, 63,
// 64, 65, 1000) in one batch, one 100k-token sequence, padding indices, has_initial_state,
// f16/bf16 inputs, f32/bf16 pools, a separate final-state output, state checkpoints (every 64
// and 128 tokens, against the reference's, with outputs and final states bit-identical to a run
// without them), and T decode steps against one prefill of T tokens.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/gpu.hpp"
#include "common/host_data.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/runtime.hpp"
#include "ops/gdn_prefill_reference.hpp"
#include "support/numeric.hpp"
#include "templates/common/tensor_map.h"

namespace kjit {
namespace {

using test::Bytes;
using test::compare;
using test::DeviceBuffer;
using test::Diff;
using test::random_bytes;

struct Case {
  std::vector<std::int64_t> lengths;
  std::int64_t heads = 2, value_heads = 4, k = 128, v = 128;
  DType in = DType::bf16, state = DType::f32, out = DType::bf16;
  DType cu = DType::i32, index = DType::i32;
  bool precomputed = false;
  bool separate_final = false;
  bool all_have_state = false;  // has_initial_state passed as data == nullptr
  std::string force_mode;
  // > 0: also write state checkpoints every this many tokens, and run once more without them
  // to show they change nothing else.
  std::int64_t ckpt_every = 0;
  // Pass a caller-owned (poisoned) workspace instead of letting the call allocate one.
  bool workspace = false;
  // Run the call as a CUDA graph: captured on a stream of its own (after one warm-up call that
  // loads the kernels), then replayed. Needs separate_final (the warm-up must not move the pool).
  bool capture = false;
  // false: q and k are used as given (then drawn with norm ~0.9, so the recurrence stays
  // bounded).
  bool l2norm = true;
  // Precomputed gates only: g drawn from [-max_decay, 0]. Near 0 the state carries over the
  // whole sequence (a segment started from an assumed state fails); far below, e^(gamma) of a
  // chunk's later rows underflows f32 (every decay factor must then come from differences).
  double max_decay = 0.2;
  // When not empty: the mode the planner must choose must start with this (e.g. "chunked_cp").
  std::string expect_mode;
  // >= 0: every kernel of the chunked plan must have statep = this (who forms P).
  int expect_state_p = -1;
  // The pool, final states and checkpoints as fla keeps states: each [HV, K, V] block
  // contiguous, passed as its transpose (strides [row, V*K, 1, V]); the plan must take the
  // state_layout=kv kernels. The reference reads and writes them through the same strides.
  bool k_major = false;
  // out's heads this many elements further apart than V (rows hv * (V + pad) apart), the gaps
  // checked untouched: 2 makes the strides even but not multiples of 4.
  std::int64_t out_head_pad = 0;
  // The runtime the call runs on (its settings: e.g. the TMA paths); null: test::runtime().
  Runtime* runtime = nullptr;
};

DeviceBuffer upload(const Bytes& host) {
  DeviceBuffer buffer(host.size());
  buffer.upload(host.data(), host.size());
  return buffer;
}

/// Whether the test device is compute capability 9.0 (the sm_90a kernels: wgmma, the
/// warp-specialized kernel); otherwise says that `what` is skipped and why.
bool on_compute_capability_9_0(const char* what) {
  const DeviceLimits limits = test::runtime().device_limits(test::device());
  if (limits.arch.major == 9 && limits.arch.minor == 0) return true;
  MESSAGE("skipped: " << what << " needs compute capability 9.0; this device is "
                      << limits.arch.str());
  return false;
}

void run_case(const Case& c) {
  test::Rng rng(test::fresh_seed());
  const std::int64_t n = static_cast<std::int64_t>(c.lengths.size());
  const std::int64_t h = c.heads, hv = c.value_heads, kd = c.k, vd = c.v;
  std::vector<std::int64_t> cu{0};
  for (std::int64_t len : c.lengths) cu.push_back(cu.back() + len);
  const std::int64_t t = cu.back();
  const std::int64_t slots = n + 3;

  Bytes cu_host((static_cast<std::size_t>(n) + 1) * size_of(c.cu));
  for (std::int64_t i = 0; i <= n; ++i) {
    support::store_from_double(cu_host.data(), c.cu, i, static_cast<double>(cu[i]));
  }
  // Every 4th sequence is padding (-1); the others take distinct slots from the top, so slots
  // 0 and slots-1 stay unnamed and must come back bit-identical.
  Bytes idx_host(static_cast<std::size_t>(n) * size_of(c.index));
  Bytes init_host(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    support::store_from_double(idx_host.data(), c.index, i,
                               i % 4 == 3 ? -1.0 : double(slots - 2 - i));
    init_host[static_cast<std::size_t>(i)] = c.all_have_state || i % 3 != 1 ? 1 : 0;
  }
  const double qk_scale = c.l2norm ? 1.0 : 0.9 / std::sqrt(static_cast<double>(kd));
  const Bytes q = random_bytes(rng, c.in, t * h * kd, qk_scale);
  const Bytes k = random_bytes(rng, c.in, t * h * kd, qk_scale);
  const Bytes v = random_bytes(rng, c.in, t * hv * vd, 1.0);
  Bytes ga, gb, a_log, dt_bias;
  if (c.precomputed) {
    ga.resize(static_cast<std::size_t>(t * hv) * 4);
    gb.resize(ga.size());
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (std::int64_t i = 0; i < t * hv; ++i) {
      support::store_from_double(ga.data(), DType::f32, i, -c.max_decay * unit(rng));
      support::store_from_double(gb.data(), DType::f32, i, unit(rng));
    }
  } else {
    ga = random_bytes(rng, DType::bf16, t * hv, 1.0);
    gb = random_bytes(rng, DType::bf16, t * hv, 1.0);
    a_log = random_bytes(rng, DType::f32, hv, 0.5, -1.0);
    dt_bias = random_bytes(rng, DType::f32, hv, 0.5);
  }
  const Bytes pool = random_bytes(rng, c.state, slots * hv * vd * kd, 0.3);

  DeviceBuffer dq = upload(q), dk = upload(k), dv = upload(v), dga = upload(ga), dgb = upload(gb);
  DeviceBuffer dalog = upload(c.precomputed ? Bytes(4) : a_log);
  DeviceBuffer ddt = upload(c.precomputed ? Bytes(4) : dt_bias);
  DeviceBuffer dcu = upload(cu_host), didx = upload(idx_host), dinit = upload(init_host);
  DeviceBuffer dpool = upload(pool);
  const std::int64_t out_hs = vd + c.out_head_pad;  // out's head stride
  const auto out_view = [&](void* data) {
    return TensorView::strided(data, c.out, {t, hv, vd}, {hv * out_hs, out_hs, 1});
  };
  DeviceBuffer dout(static_cast<std::size_t>(t * hv * out_hs) * size_of(c.out));
  dout.poison();
  const std::int64_t final_elems = n * hv * vd * kd;
  DeviceBuffer dfinal(c.separate_final ? static_cast<std::size_t>(final_elems) * size_of(c.state)
                                       : 0);
  if (c.separate_final) dfinal.poison();

  auto gates_of = [&](void* a, void* b, void* al, void* dt) {
    const DType gd = c.precomputed ? DType::f32 : DType::bf16;
    TensorView va = TensorView::contiguous(a, gd, {t, hv});
    TensorView vb = TensorView::contiguous(b, gd, {t, hv});
    return c.precomputed ? GdnGates::precomputed(va, vb)
                         : GdnGates::raw(va, vb, TensorView::contiguous(al, DType::f32, {hv}),
                                         TensorView::contiguous(dt, DType::f32, {hv}));
  };

  // Checkpoints: rows are shifted by one (row 0 and the last row belong to no sequence) and
  // padded by 64 elements each, so unnamed rows and gaps must come back poisoned.
  const bool ckpt = c.ckpt_every > 0;
  const std::vector<std::int64_t> starts =
      ckpt ? gdn_prefill_checkpoint_starts(cu, c.ckpt_every) : std::vector<std::int64_t>{0};
  const std::int64_t ckpt_total = starts.back();
  const std::int64_t ckpt_rows = ckpt ? ckpt_total + 2 : 0;
  const std::int64_t state_elems = hv * vd * kd;
  const std::int64_t ckpt_stride = state_elems + 64;
  Bytes starts_host(static_cast<std::size_t>(n + 1) * 8);
  for (std::int64_t i = 0; i <= n; ++i) {
    support::store_from_double(
        starts_host.data(), DType::i64, i,
        static_cast<double>(starts[static_cast<std::size_t>(ckpt ? i : 0)] + (ckpt ? 1 : 0)));
  }
  const std::size_t ckpt_bytes =
      static_cast<std::size_t>(ckpt_rows * ckpt_stride) * size_of(c.state);
  DeviceBuffer dstarts = upload(starts_host);
  DeviceBuffer dckpt(ckpt_bytes);
  if (ckpt) dckpt.poison();
  if (ckpt) {
    MESSAGE("checkpoints every " << c.ckpt_every << " tokens: " << ckpt_total << " rows");
  }
  // A [rows, HV, V, K] state tensor in the case's layout, rows `row_stride` elements apart.
  const auto states_view = [&](void* data, std::int64_t rows, std::int64_t row_stride) {
    return c.k_major ? TensorView::strided(data, c.state, {rows, hv, vd, kd},
                                           {row_stride, vd * kd, 1, vd})
                     : TensorView::strided(data, c.state, {rows, hv, vd, kd},
                                           {row_stride, vd * kd, kd, 1});
  };
  const auto ckpt_view = [&](void* data) { return states_view(data, ckpt_rows, ckpt_stride); };

  // The workspace the plan reports (more than gdn_prefill_workspace_bytes on the
  // context-parallel path), and the mode it chose.
  std::int64_t ws_bytes = gdn_prefill_workspace_bytes(t, hv);
  {
    GdnPrefillOptions plan_options;
    plan_options.l2norm_qk = c.l2norm;
    plan_options.force_mode = c.force_mode;
    if (ckpt) {
      plan_options.checkpoint_every_n_tokens = c.ckpt_every;
      plan_options.state_checkpoints = ckpt_view(dckpt.get());
      plan_options.checkpoint_cu_starts =
          TensorView::contiguous(dstarts.get(), DType::i64, {n + 1});
    }
    const Plan plan = plan_gdn_prefill(
        TensorView::contiguous(dq.get(), c.in, {t, h, kd}),
        TensorView::contiguous(dk.get(), c.in, {t, h, kd}),
        TensorView::contiguous(dv.get(), c.in, {t, hv, vd}),
        gates_of(dga.get(), dgb.get(), dalog.get(), ddt.get()),
        TensorView::contiguous(dcu.get(), c.cu, {n + 1}),
        states_view(dpool.get(), slots, hv * vd * kd),
        TensorView::contiguous(didx.get(), c.index, {n}),
        c.all_have_state ? TensorView{} : TensorView::contiguous(dinit.get(), DType::u8, {n}),
        out_view(dout.get()), plan_options, test::runtime().device_limits(test::device()));
    MESSAGE("mode " << plan.mode);
    if (!c.expect_mode.empty()) CHECK(plan.mode.starts_with(c.expect_mode));
    for (const PlannedLaunch& launch : plan.launches) {
      const bool touches_state =
          launch.spec.family == "gdn_prefill" || launch.spec.family == "gdn_prefill_ws" ||
          launch.spec.family == "gdn_prefill_state" || launch.spec.family == "gdn_prefill_state_cp";
      CHECK(launch.spec.get_or("state_layout", "vk") == (c.k_major && touches_state ? "kv" : "vk"));
      // Both kernels of a chunked plan agree on who forms P.
      if (c.expect_state_p >= 0 && launch.spec.family != "gdn_prefill_cp_scan") {
        CHECK(launch.spec.get_or("statep", "0") == std::to_string(c.expect_state_p));
      }
    }
    for (const std::string& r : plan.reasons) {
      if (r.starts_with("workspace for T = ")) ws_bytes = std::stoll(r.substr(r.find(": ") + 2));
    }
  }
  DeviceBuffer dws(c.workspace ? static_cast<std::size_t>(std::max<std::int64_t>(ws_bytes, 1)) : 0);
  if (c.workspace) dws.poison();
  REQUIRE((!c.capture || c.separate_final));

  // One call on the given pool / final / out buffers, with or without checkpoints.
  const auto launch = [&](DeviceBuffer& pool_buf, DeviceBuffer& final_buf, DeviceBuffer& out_buf,
                          bool with_ckpt) {
    GdnPrefillOptions options;
    if (c.workspace) options.workspace = TensorView::contiguous(dws.get(), DType::u8, {ws_bytes});
    options.l2norm_qk = c.l2norm;
    options.runtime = c.runtime != nullptr ? c.runtime : &test::runtime();
    options.device = test::device();
    options.force_mode = c.force_mode;
    if (c.separate_final) {
      options.final_state = states_view(final_buf.get(), n, hv * vd * kd);
    }
    if (with_ckpt) {
      options.checkpoint_every_n_tokens = c.ckpt_every;
      options.state_checkpoints = ckpt_view(dckpt.get());
      options.checkpoint_cu_starts = TensorView::contiguous(dstarts.get(), DType::i64, {n + 1});
    }
    const auto call = [&](Stream stream) {
      gdn_prefill(
          TensorView::contiguous(dq.get(), c.in, {t, h, kd}),
          TensorView::contiguous(dk.get(), c.in, {t, h, kd}),
          TensorView::contiguous(dv.get(), c.in, {t, hv, vd}),
          gates_of(dga.get(), dgb.get(), dalog.get(), ddt.get()),
          TensorView::contiguous(dcu.get(), c.cu, {n + 1}),
          states_view(pool_buf.get(), slots, hv * vd * kd),
          TensorView::contiguous(didx.get(), c.index, {n}),
          c.all_have_state ? TensorView{} : TensorView::contiguous(dinit.get(), DType::u8, {n}),
          out_view(out_buf.get()), options, stream);
    };
    if (!c.capture) {
      call(test::stream());
      return;
    }
    call(test::stream());  // loads the kernels: nothing may compile or load under capture
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
    // The replay alone must produce every output.
    out_buf.poison();
    final_buf.poison();
    test::check_cu(test::cu().cuGraphLaunch(exec, stream), "cuGraphLaunch");
    test::check_cu(test::cu().cuStreamSynchronize(stream), "cuStreamSynchronize");
    (void)test::cu().cuGraphExecDestroy(exec);
    (void)test::cu().cuGraphDestroy(graph);
    (void)test::cu().cuStreamDestroy(stream);
  };
  launch(dpool, dfinal, dout, ckpt);
  test::sync();

  // The reference on host copies of the same inputs.
  Bytes ref_out(static_cast<std::size_t>(t * hv * vd) * size_of(c.out), 0),
      ref_pool = pool, ref_final(dfinal.bytes(), 0);
  Bytes ref_ckpt(ckpt_bytes, 0xFF);
  Bytes hq = q, hk = k, hvv = v, hga = ga, hgb = gb, hal = a_log, hdt = dt_bias;
  Bytes hstarts = starts_host;
  GdnPrefillOptions ref_options;
  ref_options.l2norm_qk = c.l2norm;
  if (c.separate_final) {
    ref_options.final_state = states_view(ref_final.data(), n, hv * vd * kd);
  }
  if (ckpt) {
    ref_options.checkpoint_every_n_tokens = c.ckpt_every;
    ref_options.state_checkpoints = ckpt_view(ref_ckpt.data());
    ref_options.checkpoint_cu_starts = TensorView::contiguous(hstarts.data(), DType::i64, {n + 1});
  }
  ops::gdn_prefill_reference(
      TensorView::contiguous(hq.data(), c.in, {t, h, kd}),
      TensorView::contiguous(hk.data(), c.in, {t, h, kd}),
      TensorView::contiguous(hvv.data(), c.in, {t, hv, vd}),
      gates_of(hga.data(), hgb.data(), hal.data(), hdt.data()),
      TensorView::contiguous(cu_host.data(), c.cu, {n + 1}),
      states_view(ref_pool.data(), slots, hv * vd * kd),
      TensorView::contiguous(idx_host.data(), c.index, {n}),
      c.all_have_state ? TensorView{} : TensorView::contiguous(init_host.data(), DType::u8, {n}),
      TensorView::contiguous(ref_out.data(), c.out, {t, hv, vd}), ref_options);

  Bytes got_out_raw(dout.bytes());
  dout.download(got_out_raw.data(), got_out_raw.size());
  // out's rows gathered from its strides; the gaps between heads keep the poison.
  Bytes got_out(ref_out.size());
  {
    const std::size_t es = size_of(c.out), row = static_cast<std::size_t>(vd) * es;
    std::size_t touched_gaps = 0;
    for (std::int64_t r = 0; r < t * hv; ++r) {
      const auto from = got_out_raw.begin() + static_cast<std::ptrdiff_t>(r * out_hs * es);
      std::copy(from, from + static_cast<std::ptrdiff_t>(row), got_out.begin() + r * row);
      touched_gaps += static_cast<std::size_t>(std::count_if(
          from + static_cast<std::ptrdiff_t>(row), from + static_cast<std::ptrdiff_t>(out_hs * es),
          [](unsigned char b) { return b != 0xFF; }));
    }
    CHECK(touched_gaps == 0);
  }
  Bytes got_pool(dpool.bytes());
  dpool.download(got_pool.data(), got_pool.size());
  test::check_close("out", got_out, ref_out, c.out, 2e-2);
  test::check_close("pool", got_pool, ref_pool, c.state, 2e-2);
  // Unnamed slots (0 and the last two) are bit-identical: padding is never clamped into them.
  const std::size_t slot_bytes = static_cast<std::size_t>(hv * vd * kd) * size_of(c.state);
  for (std::int64_t s : {std::int64_t{0}, slots - 1}) {
    CHECK(std::equal(got_pool.begin() + s * slot_bytes, got_pool.begin() + (s + 1) * slot_bytes,
                     pool.begin() + s * slot_bytes));
  }
  Bytes got_final(dfinal.bytes());
  dfinal.download(got_final.data(), got_final.size());
  if (c.separate_final) {
    CHECK(got_pool == pool);  // the pool is only read
    test::check_close("final_state", got_final, ref_final, c.state, 2e-2);
  }
  if (!ckpt) return;

  // Checkpoints: the named rows (1 .. total) against the reference's, with the final state's
  // tolerance; row 0, the last row and every row's 64-element tail stay poisoned (0xFF).
  Bytes got_ckpt(ckpt_bytes);
  dckpt.download(got_ckpt.data(), got_ckpt.size());
  const std::size_t esize = size_of(c.state);
  const std::size_t row_bytes = static_cast<std::size_t>(ckpt_stride) * esize;
  const std::size_t state_bytes = static_cast<std::size_t>(state_elems) * esize;
  Bytes got_named, ref_named;
  bool unnamed_poisoned = true;
  for (std::int64_t r = 0; r < ckpt_rows; ++r) {
    const auto row = got_ckpt.begin() + static_cast<std::ptrdiff_t>(r * row_bytes);
    const bool named = r >= 1 && r <= ckpt_total;
    const auto poisoned_from = named ? row + static_cast<std::ptrdiff_t>(state_bytes) : row;
    unnamed_poisoned &= std::all_of(poisoned_from, row + static_cast<std::ptrdiff_t>(row_bytes),
                                    [](unsigned char x) { return x == 0xFF; });
    if (named) {
      got_named.insert(got_named.end(), row, row + static_cast<std::ptrdiff_t>(state_bytes));
      const auto ref_row = ref_ckpt.begin() + static_cast<std::ptrdiff_t>(r * row_bytes);
      ref_named.insert(ref_named.end(), ref_row,
                       ref_row + static_cast<std::ptrdiff_t>(state_bytes));
    }
  }
  CHECK(unnamed_poisoned);
  if (ckpt_total > 0) {
    test::check_close("checkpoints", got_named, ref_named, c.state, 2e-2);
  }

  // The same call without checkpoints (fresh pool, poisoned outputs): out, pool and final
  // states bit-identical, since checkpoints only read the state registers.
  DeviceBuffer dpool2 = upload(pool);
  DeviceBuffer dout2(dout.bytes()), dfinal2(dfinal.bytes());
  dout2.poison();
  if (c.separate_final) dfinal2.poison();
  launch(dpool2, dfinal2, dout2, false);
  test::sync();
  Bytes out2(dout2.bytes()), pool2(dpool2.bytes()), final2(dfinal2.bytes());
  dout2.download(out2.data(), out2.size());
  dpool2.download(pool2.data(), pool2.size());
  dfinal2.download(final2.data(), final2.size());
  CHECK(out2 == got_out_raw);
  CHECK(pool2 == got_pool);
  CHECK(final2 == got_final);
}

// Checkpoints every 64 tokens over lengths 0 to 1000 with f32 out, i64 offsets, precomputed
// gates and a separate final state, under force_mode `mode`.
Case checkpoint_case(const std::string& mode) {
  Case c;
  c.lengths = {130, 0, 64, 1, 1000};
  c.force_mode = mode;
  c.out = DType::f32;
  c.cu = DType::i64;
  c.precomputed = true;
  c.separate_final = true;
  c.ckpt_every = 64;
  return c;
}

}  // namespace

TEST_CASE("gdn_prefill: mixed lengths 0, 1, 63, 64, 65, 1000 in one batch, bf16, f32 pool") {
  Case c;
  c.lengths = {0, 1, 63, 64, 65, 1000, 17, 128};
  run_case(c);
}

TEST_CASE("gdn_prefill: every value tile of both paths on the same batch") {
  for (const std::string mode : {"bv64", "bv32", "bv16", "chunked", "chunked_bv128", "chunked_bv64",
                                 "chunked_bv32", "chunked_bv16"}) {
    CAPTURE(mode);
    Case c;
    c.lengths = {65, 0, 130, 1};
    c.force_mode = mode;
    run_case(c);
  }
}

// P = tril(Q K^T ...) formed by the state kernel (the planner's choice for the whole-V tile
// without GVA; _p1 elsewhere) or by the chunk kernel (_p0), on the same batch, with gates that
// decay by up to e^-8 per token: e^(gamma) of a chunk's late rows then underflows f32 (gamma
// down to ~-500), so only differences of gamma may enter a factor.
void state_p_case(const std::string& mode, int state_p, double max_decay) {
  CAPTURE(mode);
  CAPTURE(max_decay);
  Case c;
  c.lengths = {65, 0, 1000, 1, 64, 200};
  c.heads = 2;
  c.value_heads = 2;
  c.precomputed = true;
  c.max_decay = max_decay;
  c.force_mode = mode;
  c.expect_state_p = state_p;
  run_case(c);
}

TEST_CASE("gdn_prefill chunked: P formed by the state kernel (whole-V tile, H = HV), fast decay") {
  for (const double max_decay : {0.2, 8.0}) state_p_case("chunked_bv128", 1, max_decay);
}

TEST_CASE("gdn_prefill chunked: P formed by either kernel on every wide tile, GVA, checkpoints") {
  for (const auto& [mode, state_p] :
       std::vector<std::pair<std::string, int>>{{"chunked_bv128_p0", 0},
                                                {"chunked_bv64_p1", 1},
                                                {"chunked_bv64", 0},
                                                {"chunked_cp2_p1", 1},
                                                {"chunked_cp2", 0}}) {
    for (const double max_decay : {0.2, 8.0}) state_p_case(mode, state_p, max_decay);
  }
  for (const auto& [mode, state_p] : std::vector<std::pair<std::string, int>>{
           {"chunked_bv128", 0}, {"chunked_bv128_p1", 1}, {"chunked_cp3_p1", 1}}) {
    CAPTURE(mode);
    Case c;  // GVA (2 value heads per key head), raw gates, checkpoints
    c.lengths = {300, 64, 0, 129};
    c.ckpt_every = 64;
    c.force_mode = mode;
    c.expect_state_p = state_p;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill: f16 inputs, bf16 pool, precomputed gates, separate final state, i64") {
  Case c;
  c.lengths = {64, 1, 65, 0, 200};
  c.in = DType::f16;
  c.state = DType::bf16;
  c.out = DType::f32;
  c.cu = DType::i64;
  c.index = DType::i64;
  c.precomputed = true;
  c.separate_final = true;
  c.all_have_state = true;
  run_case(c);
}

TEST_CASE("gdn_prefill chunked: a caller's workspace, i64 indices, precomputed gates") {
  Case c;
  c.lengths = {64, 1, 65, 0, 200, 130};
  c.cu = DType::i64;
  c.index = DType::i64;
  c.precomputed = true;
  c.workspace = true;
  c.force_mode = "chunked";
  run_case(c);
}

TEST_CASE("gdn_prefill: q and k without L2 norm, both paths") {
  for (const std::string mode : {"chunked", "bv32"}) {
    CAPTURE(mode);
    Case c;
    c.lengths = {200, 1, 64, 0, 129};
    c.l2norm = false;
    c.force_mode = mode;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill chunked: bf16 pool, f32 and f16 out, separate final state") {
  for (DType out : {DType::f32, DType::f16}) {
    CAPTURE(to_string(out));
    Case c;
    c.lengths = {1000, 0, 63, 64, 65, 1, 257};
    c.state = DType::bf16;
    c.out = out;
    c.separate_final = true;
    c.force_mode = "chunked";
    run_case(c);
  }
}

TEST_CASE("gdn_prefill chunked: CUDA graph capture (stream-ordered workspace) and replay") {
  for (bool caller_workspace : {false, true}) {
    CAPTURE(caller_workspace);
    Case c;
    c.lengths = {300, 0, 1, 130, 64};
    c.separate_final = true;
    c.capture = true;
    c.workspace = caller_workspace;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill chunked: 4096 sequences of 0 to 5 tokens and a long one") {
  // 4096 is the most the state kernel takes longest first (its order region); 4097 keeps the
  // index order. Equal lengths, ties in the ranking, must still give a permutation.
  for (int seqs : {4096, 4097}) {
    CAPTURE(seqs);
    Case c;
    for (int i = 0; i < seqs - 1; ++i) c.lengths.push_back(i % 6);
    c.lengths.push_back(3000);
    c.heads = 1;
    c.value_heads = 2;
    c.force_mode = "chunked";
    run_case(c);
  }
}

TEST_CASE("gdn_prefill chunked: 128 and 129 sequences, where the ranking moves kernels") {
  // Up to 128 sequences every state-kernel block ranks them itself before it waits for the
  // chunk kernel; from 129 on the chunk kernel ranks them into the workspace. Both at the
  // smallest (128 threads) and the largest state block, with ties and empty sequences, and
  // under capture (the programmatic edge between the kernels in a graph).
  for (int seqs : {128, 129}) {
    for (const std::string mode : {"chunked_bv16", "chunked_bv128"}) {
      for (bool capture : {false, true}) {
        CAPTURE(seqs);
        CAPTURE(mode);
        CAPTURE(capture);
        Case c;
        for (int i = 0; i < seqs - 1; ++i) c.lengths.push_back((i * 37) % 150);
        c.lengths.push_back(700);
        c.heads = 1;
        c.value_heads = 2;
        c.force_mode = mode;
        c.capture = capture;
        c.separate_final = capture;
        run_case(c);
      }
    }
  }
}

TEST_CASE("gdn_prefill: K and V of 64 and 256, GVA") {
  for (auto [kd, vd] : {std::pair{64, 64}, std::pair{256, 256}, std::pair{64, 128}}) {
    CAPTURE(kd);
    CAPTURE(vd);
    Case c;
    c.lengths = {63, 65, 1};
    c.heads = 1;
    c.value_heads = 3;
    c.k = kd;
    c.v = vd;
    run_case(c);
    c.force_mode = "bv16";  // the fused kernel too
    run_case(c);
    if (kd == 64) {  // the wide tiles at K = 64 (wgmma on sm_90)
      c.force_mode = "chunked_bv64";
      run_case(c);
      if (vd == 128) {
        c.force_mode = "chunked_bv128";
        run_case(c);
      }
    }
  }
}

TEST_CASE("gdn_prefill chunked: the wide tiles on warpgroup wgmma (sm_90a, force_mode _wgmma)") {
  if (!on_compute_capability_9_0("wgmma")) return;
  for (const std::string mode : {"chunked_bv128_wgmma", "chunked_bv64_wgmma"}) {
    CAPTURE(mode);
    Case c;
    c.lengths = {65, 0, 130, 1, 1000, 63, 64};
    c.force_mode = mode;
    run_case(c);
    run_case(checkpoint_case(mode));
  }
  Case c;  // bf16 pool, f16 out, K = 64 with V = 128 (wide tile of 128 rows at K = 64), GVA
  c.lengths = {63, 65, 1, 300};
  c.heads = 1;
  c.value_heads = 3;
  c.k = 64;
  c.state = DType::bf16;
  c.out = DType::f16;
  c.force_mode = "chunked_bv128_wgmma";
  run_case(c);
  // out's strides even but not multiples of 4 (the alignment the checks accept), bf16 and f32.
  for (const DType out : {DType::bf16, DType::f32}) {
    CAPTURE(out);
    Case padded;
    padded.lengths = {65, 1, 200, 64};
    padded.out = out;
    padded.out_head_pad = 2;
    padded.force_mode = "chunked_bv128_wgmma";
    run_case(padded);
  }
}

TEST_CASE("gdn_prefill chunked: P formed by the wgmma state kernel's two warpgroups (_wgmma_p1)") {
  if (!on_compute_capability_9_0("wgmma")) return;
  // Gates of down to e^-8 per token: a difference of gammas may overflow above the diagonal.
  for (const double max_decay : {0.2, 8.0}) state_p_case("chunked_bv128_wgmma_p1", 1, max_decay);
  {
    Case c;  // GVA (2 value heads per key head), raw gates, checkpoints
    c.lengths = {300, 64, 0, 129};
    c.ckpt_every = 64;
    c.force_mode = "chunked_bv128_wgmma_p1";
    c.expect_state_p = 1;
    run_case(c);
  }
  Case c;  // K = 64 (four k-steps), bf16 pool, f16 out, lengths around the chunk
  c.lengths = {63, 65, 1, 300, 128};
  c.heads = 1;
  c.value_heads = 1;
  c.k = 64;
  c.state = DType::bf16;
  c.out = DType::f16;
  c.force_mode = "chunked_bv128_wgmma_p1";
  c.expect_state_p = 1;
  run_case(c);
}

TEST_CASE(
    "gdn_prefill chunked_ws: Runtime::encode_tensor_map takes the kernel's maps, refuses bad "
    "ones") {
  if (!on_compute_capability_9_0("the warp-specialized kernel's tensor maps")) return;
  DeviceBuffer buffer(1 << 20);
  TensorMapRequest r;  // q of [T = 1000, H = 4, 128] bf16, boxes of a 64-column slice x 64 tokens
  r.element = DType::bf16;
  r.rank = 3;
  r.base = buffer.get();
  r.dims[0] = 128;
  r.dims[1] = 4;
  r.dims[2] = 1000;
  r.strides[0] = 256;
  r.strides[1] = 4 * 256;
  r.box[0] = 64;
  r.box[1] = 1;
  r.box[2] = 64;
  r.swizzle_bytes = 128;
  TensorMap map{};
  std::string why;
  CHECK(test::runtime().encode_tensor_map(r, &map, &why));
  CHECK(why.empty());
  TensorMapRequest out = r;  // out's boxes: a state warp's 16 values, 32-byte swizzle
  out.box[0] = 16;
  out.swizzle_bytes = 32;
  CHECK(test::runtime().encode_tensor_map(out, &map, &why));
  TensorMapRequest bad = r;
  bad.base = static_cast<unsigned char*>(buffer.get()) + 8;  // not 16-byte aligned
  CHECK_FALSE(test::runtime().encode_tensor_map(bad, &map, &why));
  MESSAGE("refused: " << why);
  CHECK(why.find("not 16-byte aligned") != std::string::npos);
  bad = r;
  bad.box[0] = 128;  // 256-byte rows under a 128-byte swizzle
  CHECK_FALSE(test::runtime().encode_tensor_map(bad, &map, &why));
  CHECK(why.find("128-byte swizzle") != std::string::npos);
  bad = r;
  bad.swizzle_bytes = 48;
  CHECK_FALSE(test::runtime().encode_tensor_map(bad, &map, &why));
  CHECK(why.find("swizzle") != std::string::npos);
  // (kjit's own checks refuse these before the driver: compute-sanitizer's memcheck counts every
  // failed driver call as an error, and the ws cases run under it.)
}

TEST_CASE("gdn_prefill chunked_ws: cp.async copies and plain stores (KJIT_TENSOR_MAPS=0)") {
  if (!on_compute_capability_9_0("the warp-specialized kernel")) return;
  const std::string mode = "chunked_ws";
  // A runtime of the suite's settings whose calls take the ws kernel's paths without TMA tensor
  // maps (the other cases take them: on by default), destroyed with the case (as planner_test's).
  Settings settings = test::runtime().settings();
  settings.tensor_map_loads = settings.tensor_map_stores = false;
  Runtime plain_runtime(settings);
  {
    Case c;  // lengths around the chunk and the stage ring
    c.lengths = {65, 0, 130, 1, 1000, 63, 64, 2000, 192, 193};
    c.force_mode = mode;
    c.expect_mode = mode;
    c.runtime = &plain_runtime;
    run_case(c);
  }
  {
    Case c;  // out heads 4 bytes apart from a multiple of 16 (no map of out: plain stores), K-major
    c.lengths = {129, 5, 640};
    c.k_major = true;
    c.out_head_pad = 2;
    c.force_mode = mode;
    c.runtime = &plain_runtime;
    run_case(c);
  }
  run_case([&] {  // f32 out (plain stores), checkpoints, precomputed gates
    Case c = checkpoint_case(mode);
    c.runtime = &plain_runtime;
    return c;
  }());
}

TEST_CASE("gdn_prefill chunked_ws: the warp-specialized kernel (sm_90a), every option") {
  if (!on_compute_capability_9_0("the warp-specialized kernel")) return;
  const std::string mode = "chunked_ws";
  {
    Case c;  // TMA boxes into out heads padded to 272 bytes, GVA, maps encoded for a graph replay
    c.lengths = {129, 5, 640, 64};
    c.heads = 1;
    c.value_heads = 3;
    c.out_head_pad = 8;
    c.separate_final = true;
    c.capture = true;
    c.force_mode = mode;
    run_case(c);
  }
  {
    Case c;  // lengths around the chunk and the stage ring (0, 1, 63 .. 2000), raw bf16 gates
    c.lengths = {65, 0, 130, 1, 1000, 63, 64, 2000, 192, 193};
    c.force_mode = mode;
    c.expect_mode = mode;
    run_case(c);
  }
  run_case(checkpoint_case(mode));  // f32 out, i64 offsets, precomputed gates, final states apart
  {
    Case c;  // GVA (3 value heads per key head), bf16 pool, f16 out, every sequence from the pool
    c.lengths = {63, 65, 1, 300};
    c.heads = 1;
    c.value_heads = 3;
    c.state = DType::bf16;
    c.out = DType::f16;
    c.all_have_state = true;
    c.force_mode = mode;
    run_case(c);
  }
  {
    Case c;  // fla's K-major pool, out heads padded (strides even, not multiples of 4)
    c.lengths = {129, 5, 640};
    c.k_major = true;
    c.out_head_pad = 2;
    c.force_mode = mode;
    run_case(c);
  }
  for (const double max_decay : {0.2, 8.0}) {
    CAPTURE(max_decay);
    Case c;  // precomputed gates down to e^-8 per token: P's exponentials overflow above the
             // diagonal, and e^gamma of a chunk's later rows underflows
    c.lengths = {65, 0, 1000, 1, 64, 200};
    c.heads = 2;
    c.value_heads = 2;
    c.precomputed = true;
    c.max_decay = max_decay;
    c.force_mode = mode;
    run_case(c);
  }
  {
    Case c;  // without the L2 norm; i64 indices
    c.lengths = {300, 17, 64};
    c.l2norm = false;
    c.index = DType::i64;
    c.force_mode = mode;
    run_case(c);
  }
  {
    Case c;  // 200 sequences: more than a block ranks, so they run in index order
    test::Rng rng(test::fresh_seed());
    std::uniform_int_distribution<std::int64_t> length(0, 300);
    for (int i = 0; i < 200; ++i) c.lengths.push_back(length(rng));
    c.heads = 1;
    c.value_heads = 1;
    c.force_mode = mode;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill: one 100k-token sequence next to short ones (H = HV = 1)") {
  Case c;
  c.lengths = {100000, 1, 63};
  c.heads = 1;
  c.value_heads = 1;
  run_case(c);
}

// Padding sequences are 3 and 7 (1000 and 130 tokens: they write checkpoints from a zero
// state), has_initial_state = 0 on 1, 4 and 7.
TEST_CASE("gdn_prefill: checkpoints every 64 tokens, lengths 0 to 1000, padding, bf16 pool") {
  Case c;
  c.lengths = {0, 1, 63, 1000, 64, 65, 128, 130};
  c.state = DType::bf16;
  c.ckpt_every = 64;
  run_case(c);
}

TEST_CASE("gdn_prefill: checkpoints every 128 tokens, lengths 0 to 1000, padding, f32 pool") {
  Case c;
  c.lengths = {0, 1, 63, 1000, 64, 65, 128, 130, 255, 256, 257};
  c.ckpt_every = 128;
  run_case(c);
}

TEST_CASE("gdn_prefill: checkpoints with every value tile and a separate final state") {
  for (const std::string mode : {"bv64", "bv32", "bv16"}) {
    CAPTURE(mode);
    Case c = checkpoint_case(mode);
    c.in = DType::f16;
    c.index = DType::i64;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill chunked: checkpoints with every value tile and a separate final state") {
  for (const std::string mode : {"chunked_bv128", "chunked_bv64", "chunked_bv32", "chunked_bv16"}) {
    CAPTURE(mode);
    run_case(checkpoint_case(mode));
  }
}

TEST_CASE("gdn_prefill: checkpoints with K and V of 64 and 256, GVA") {
  for (auto [kd, vd, every] :
       {std::tuple{64, 64, 64}, std::tuple{256, 256, 64}, std::tuple{64, 128, 128}}) {
    CAPTURE(kd);
    CAPTURE(vd);
    CAPTURE(every);
    Case c;
    c.lengths = {63, 65, 1, 127, 128};
    c.heads = 1;
    c.value_heads = 3;
    c.k = kd;
    c.v = vd;
    c.ckpt_every = every;
    // Every 64: 65, 127 (padding) and 128 write 1, 1 and 2; every 128: only 128 writes one.
    run_case(c);
  }
}

TEST_CASE("gdn_prefill: T decode steps equal one prefill of T tokens") {
  test::Rng rng(test::fresh_seed());
  const std::int64_t t = 130, h = 1, hv = 2, kd = 128, vd = 128;
  const std::int64_t row = 2 * h * kd + hv * vd;
  const Bytes mixed = random_bytes(rng, DType::bf16, t * row, 1.0);
  const Bytes a = random_bytes(rng, DType::bf16, t * hv, 1.0);
  const Bytes b = random_bytes(rng, DType::bf16, t * hv, 1.0);
  const Bytes a_log = random_bytes(rng, DType::f32, hv, 0.5, -1.0);
  const Bytes dt_bias = random_bytes(rng, DType::f32, hv, 0.5);
  const Bytes pool = random_bytes(rng, DType::f32, 2 * hv * vd * kd, 0.3);
  Bytes idx(4);
  support::store_from_double(idx.data(), DType::i32, 0, 1.0);
  Bytes cu(8);
  support::store_from_double(cu.data(), DType::i32, 0, 0.0);
  support::store_from_double(cu.data(), DType::i32, 1, double(t));

  DeviceBuffer dmixed = upload(mixed), da = upload(a), db = upload(b), dal = upload(a_log),
               ddt = upload(dt_bias), didx = upload(idx), dcu = upload(cu);
  DeviceBuffer pool_decode = upload(pool), pool_prefill = upload(pool);
  DeviceBuffer out_decode(static_cast<std::size_t>(t * hv * vd) * 2);
  DeviceBuffer out_prefill(out_decode.bytes());
  out_decode.poison();
  out_prefill.poison();

  GdnDecodeOptions dopt;
  dopt.runtime = &test::runtime();
  dopt.device = test::device();
  for (std::int64_t i = 0; i < t; ++i) {
    auto* base = static_cast<unsigned char*>(dmixed.get()) + i * row * 2;
    gdn_decode(
        TensorView::contiguous(base, DType::bf16, {1, row}),
        TensorView::contiguous(static_cast<unsigned char*>(da.get()) + i * hv * 2, DType::bf16,
                               {1, hv}),
        TensorView::contiguous(static_cast<unsigned char*>(db.get()) + i * hv * 2, DType::bf16,
                               {1, hv}),
        TensorView::contiguous(dal.get(), DType::f32, {hv}),
        TensorView::contiguous(ddt.get(), DType::f32, {hv}),
        TensorView::contiguous(pool_decode.get(), DType::f32, {2, hv, vd, kd}),
        TensorView::contiguous(didx.get(), DType::i32, {1}),
        TensorView::contiguous(static_cast<unsigned char*>(out_decode.get()) + i * hv * vd * 2,
                               DType::bf16, {1, hv, vd}),
        dopt, test::stream());
  }
  // The same tokens as [T, H, K] / [T, HV, V] views into the packed rows.
  GdnPrefillOptions popt;
  popt.runtime = &test::runtime();
  popt.device = test::device();
  auto* m = static_cast<unsigned char*>(dmixed.get());
  gdn_prefill(TensorView::strided(m, DType::bf16, {t, h, kd}, {row, kd, 1}),
              TensorView::strided(m + h * kd * 2, DType::bf16, {t, h, kd}, {row, kd, 1}),
              TensorView::strided(m + 2 * h * kd * 2, DType::bf16, {t, hv, vd}, {row, vd, 1}),
              GdnGates::raw(TensorView::contiguous(da.get(), DType::bf16, {t, hv}),
                            TensorView::contiguous(db.get(), DType::bf16, {t, hv}),
                            TensorView::contiguous(dal.get(), DType::f32, {hv}),
                            TensorView::contiguous(ddt.get(), DType::f32, {hv})),
              TensorView::contiguous(dcu.get(), DType::i32, {2}),
              TensorView::contiguous(pool_prefill.get(), DType::f32, {2, hv, vd, kd}),
              TensorView::contiguous(didx.get(), DType::i32, {1}), TensorView{},
              TensorView::contiguous(out_prefill.get(), DType::bf16, {t, hv, vd}), popt,
              test::stream());
  test::sync();
  Bytes od(out_decode.bytes()), op(out_prefill.bytes()), sd(pool_decode.bytes()),
      sp(pool_prefill.bytes());
  out_decode.download(od.data(), od.size());
  out_prefill.download(op.data(), op.size());
  pool_decode.download(sd.data(), sd.size());
  pool_prefill.download(sp.data(), sp.size());
  const Diff eo = compare(op, od, DType::bf16);
  const Diff es = compare(sp, sd, DType::f32);
  MESSAGE("prefill vs decode: out rel " << eo.rel << " (max abs " << eo.max_abs << "), state rel "
                                        << es.rel << " (max abs " << es.max_abs << ")");
  CHECK(eo.non_finite == 0);
  CHECK(eo.rel <= 2e-2);
  CHECK(es.rel <= 2e-2);
}

// The context-parallel path (segment pass, scan, resume pass): forced with short segments so
// that every kind of segment appears (a sequence of one segment, of two, of many; padding and
// has_initial_state = 0 among them).
TEST_CASE("gdn_prefill context-parallel: mixed lengths 0 .. 4097, segments of 1, 2 and 3 chunks") {
  // (The planner's stages: 3 on sm_90 and later, handed over by mbarriers; _s2 forces the two
  // stages with a block barrier per chunk that other GPUs take.)
  for (const std::string mode :
       {"chunked_cp1", "chunked_cp2", "chunked_cp3_s3", "chunked_cp2_s2"}) {
    CAPTURE(mode);
    Case c;
    c.lengths = {0, 1, 63, 64, 65, 1000, 4097, 130, 700};
    c.force_mode = mode;
    c.expect_mode = mode.substr(0, 11);
    run_case(c);
  }
}

TEST_CASE("gdn_prefill context-parallel: checkpoints every 64 and 128 tokens") {
  for (const char* mode : {"chunked_cp2", "chunked_cp3"}) {
    CAPTURE(mode);
    run_case(checkpoint_case(mode));
    Case c;
    c.lengths = {0, 1, 63, 1000, 64, 65, 128, 130, 2000};
    c.state = DType::bf16;
    c.force_mode = mode;
    c.ckpt_every = 128;
    run_case(c);
  }
}

TEST_CASE("gdn_prefill context-parallel: K and V of 64 and 256, GVA, dtypes, final state") {
  for (const auto& [k, v] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {64, 64}, {64, 128}, {128, 64}, {128, 256}}) {
    CAPTURE(k);
    CAPTURE(v);
    Case c;
    c.lengths = {700, 1, 1500, 300};
    c.heads = 2;
    c.value_heads = 4;
    c.k = k;
    c.v = v;
    c.state = k == 64 ? DType::bf16 : DType::f32;
    c.out = v == 64 ? DType::f32 : DType::f16;
    c.cu = DType::i64;
    c.index = DType::i64;
    c.separate_final = v != 128;
    c.force_mode = "chunked_cp2";
    c.expect_mode = "chunked_cp2";
    run_case(c);
  }
}

TEST_CASE("gdn_prefill context-parallel: a caller's workspace, precomputed gates, no L2 norm") {
  Case c;
  c.lengths = {3000, 5, 2000};
  c.workspace = true;
  c.precomputed = true;
  c.force_mode = "chunked_cp4";
  c.expect_mode = "chunked_cp4";
  run_case(c);
  c.l2norm = false;
  c.workspace = false;
  c.precomputed = false;
  run_case(c);
}

TEST_CASE("gdn_prefill context-parallel: CUDA graph capture and replay") {
  Case c;
  c.lengths = {5000, 70};
  c.separate_final = true;
  c.capture = true;
  c.force_mode = "chunked_cp5";
  c.expect_mode = "chunked_cp5";
  run_case(c);
}

// The segment and resume passes on warpgroup wgmma (the planner's choice on compute capability
// 9.0 at K = V = 128; the cases above force the mma.sync passes): every kind of segment, padding
// and has_initial_state = 0, checkpoints, a bf16 pool, f16 out, GVA, the K-major pool.
TEST_CASE("gdn_prefill context-parallel: the passes on warpgroup wgmma (force_mode _wgmma)") {
  if (!on_compute_capability_9_0("the context-parallel passes on wgmma")) return;
  for (const std::string mode :
       {"chunked_cp1_wgmma", "chunked_cp2_wgmma", "chunked_cp3_s3_wgmma"}) {
    CAPTURE(mode);
    Case c;
    c.lengths = {0, 1, 63, 64, 65, 1000, 4097, 130, 700};
    c.force_mode = mode;
    c.expect_mode = "chunked_cp";
    run_case(c);
  }
  run_case(checkpoint_case("chunked_cp2_wgmma"));
  Case c;
  c.lengths = {700, 1, 1500, 300};
  c.heads = 2;
  c.value_heads = 4;
  c.state = DType::bf16;
  c.out = DType::f16;
  c.force_mode = "chunked_cp2_wgmma";
  c.expect_mode = "chunked_cp2";
  run_case(c);
  c.k_major = true;
  c.state = DType::f32;
  c.out = DType::bf16;
  run_case(c);
}

// The planner's own choice: 1 and 2 sequences of up to 200k tokens (H = HV = 1), with and without
// an initial state (sequence 1 of a batch has has_initial_state = 0).
TEST_CASE("gdn_prefill context-parallel: chosen for 1 and 2 long sequences, up to 200k tokens") {
  for (const auto& lengths :
       std::vector<std::vector<std::int64_t>>{{200000}, {150000, 50000}, {20000, 9000}}) {
    CAPTURE(lengths.size());
    CAPTURE(lengths[0]);
    Case c;
    c.lengths = lengths;
    c.heads = 1;
    c.value_heads = 1;
    c.expect_mode = "chunked_cp";
    run_case(c);
  }
  Case few;
  few.lengths = {1};
  few.heads = 1;
  few.value_heads = 1;
  few.expect_mode = "chunked_bv";  // one token: nothing to split
  run_case(few);
}

// The plan memo keys the context-parallel path by its segment length, not by T: 2 x 40000 and
// 2 x 50000 tokens (H = HV = 1) both take segments of 16 chunks, but 80 and 99 segment ids size
// the passes' grids. Run back to back in one runtime (the second from the memo's point of view
// a hit on the first's key, before the key held the segment ids), each against the reference.
TEST_CASE("gdn_prefill context-parallel: one segment length, two token counts, one runtime") {
  for (const std::int64_t length : {40000, 50000, 40000}) {
    CAPTURE(length);
    Case c;
    c.lengths = {length, length};
    c.heads = 1;
    c.value_heads = 1;
    c.expect_mode = "chunked_cp16";
    run_case(c);
  }
}

// g close to 0 over 100k tokens: every segment's initial state matters to the end. A segment
// started from zero (or from any assumed state) would miss the carried state by far more than
// the tolerance (the float64 algebra test in tests/unit shows the size of that miss).
TEST_CASE("gdn_prefill context-parallel: slowly decaying gates over 100k tokens") {
  Case c;
  c.lengths = {100000};
  c.heads = 1;
  c.value_heads = 1;
  c.precomputed = true;
  c.max_decay = 1e-5;
  c.expect_mode = "chunked_cp";
  run_case(c);
  c.lengths = {60000, 40000};
  c.force_mode = "chunked_cp64";
  c.expect_mode = "chunked_cp64";
  run_case(c);
}

// fla's layout (each [HV, K, V] state block contiguous, passed transposed) for the pool, the
// separate final states and the checkpoints: every path and value tile (fused, sequential
// chunked with narrow and wide tiles, context-parallel), f32 and bf16 pools, padding indices
// and has_initial_state, checkpoints, varlen, K != V, and graph replay.
TEST_CASE("gdn_prefill: K-major pool, final states and checkpoints (fla's layout)") {
  for (const std::string mode : {"bv64", "bv16", "chunked", "chunked_bv128", "chunked_bv64",
                                 "chunked_bv32", "chunked_bv16", "chunked_cp2"}) {
    for (DType state : {DType::f32, DType::bf16}) {
      CAPTURE(mode);
      CAPTURE(to_string(state));
      Case c;
      c.k_major = true;
      c.lengths = {0, 1, 63, 64, 65, 1000, 130, 17};
      c.state = state;
      c.force_mode = mode;
      c.expect_mode = mode.starts_with("chunked_cp") ? "chunked_cp" : "";
      run_case(c);
    }
  }
  for (const char* mode : {"", "bv32", "chunked_bv64", "chunked_cp3"}) {
    CAPTURE(mode);
    Case c = checkpoint_case(mode);  // checkpoints every 64, separate final state
    c.k_major = true;
    run_case(c);
    c.state = DType::bf16;
    c.ckpt_every = 128;
    c.separate_final = false;
    c.lengths = {0, 1, 63, 1000, 64, 65, 128, 130, 2000};
    run_case(c);
  }
  const std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t> shapes[] = {
      {64, 128, 2, 8}, {128, 64, 1, 4}, {256, 256, 2, 2}, {64, 64, 4, 4}};
  for (auto [kd, vd, h, hv] : shapes) {
    CAPTURE(kd);
    CAPTURE(vd);
    Case c;
    c.k_major = true;
    c.lengths = {300, 0, 64, 129};
    c.k = kd;
    c.v = vd;
    c.heads = h;
    c.value_heads = hv;
    c.ckpt_every = 64;
    run_case(c);
  }
  Case f16;  // the fused kernel by itself (f16 inputs), bf16 pool, separate final state
  f16.k_major = true;
  f16.lengths = {64, 1, 65, 0, 200};
  f16.in = DType::f16;
  f16.state = DType::bf16;
  f16.index = DType::i64;
  f16.precomputed = true;
  f16.separate_final = true;
  run_case(f16);
  Case graph;  // captured and replayed
  graph.k_major = true;
  graph.lengths = {70, 0, 1, 300};
  graph.separate_final = true;
  graph.capture = true;
  run_case(graph);
}

}  // namespace kjit
