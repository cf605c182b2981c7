// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill: median GPU time, M tokens/s, estimated TFLOP/s, host time per
// call, and the ratio to fla's chunk_gated_delta_rule figures of BENCHMARKING.md (same H200,
// same shapes: K = V = 128, bf16 q/k/v, raw bf16 gates, f32 state pool, varlen with uneven
// lengths). A small shape is first checked against the float64 reference.
// KJIT_PREFILL_ANCHOR_LIB=<library>: an anchor kernel (PrefillAnchor below) timed beside kjit on
// every shape, on the same inputs, its out and final state compared with kjit's.
//
//   bench_gdn_prefill [results.jsonl] [profile]   (KJIT_PREFILL_BENCH_SWEEP=1: also every tile;
//   KJIT_PREFILL_BENCH_NO_VERIFY=1: a failed check does not end the run;
//   KJIT_PREFILL_BENCH_FEW_ONLY=1 / KJIT_PREFILL_BENCH_MAIN_ONLY=1: one of the two tables;
//   KJIT_PREFILL_BENCH_FEW_SHAPES="16/16/8x4096,...": the few-sequences table on these shapes)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "anchor_library.hpp"
#include "harness.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/runtime.hpp"
#include "ops/gdn_prefill_reference.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"
#include "templates/gdn_prefill/params.h"

namespace {

using kjit::DType;
using kjit::TensorView;
using kjit::bench::DeviceBuffer;

constexpr std::int64_t kDim = 128;

struct Inputs {
  std::int64_t tokens = 0, seqs = 0, heads = 0, value_heads = 0;
  std::vector<std::int32_t> cu;
  DeviceBuffer q, k, v, a, b, a_log, dt_bias, cu_dev, pool, indices, out;
};

// Equal lengths (the last sequence takes the remainder).
std::vector<std::int32_t> equal_offsets(std::int64_t tokens, std::int64_t seqs) {
  std::vector<std::int32_t> cu{0};
  for (std::int64_t i = 1; i <= seqs; ++i) {
    cu.push_back(static_cast<std::int32_t>(i == seqs ? tokens : tokens / seqs * i));
  }
  return cu;
}

Inputs make_inputs(std::int64_t tokens, std::int64_t seqs, std::int64_t heads,
                   std::int64_t value_heads, bool equal = false) {
  Inputs in{tokens,
            seqs,
            heads,
            value_heads,
            equal ? equal_offsets(tokens, seqs) : kjit::bench::uneven_offsets(tokens, seqs, 7),
            DeviceBuffer(static_cast<std::size_t>(tokens * heads * kDim) * 2),
            DeviceBuffer(static_cast<std::size_t>(tokens * heads * kDim) * 2),
            DeviceBuffer(static_cast<std::size_t>(tokens * value_heads * kDim) * 2),
            DeviceBuffer(static_cast<std::size_t>(tokens * value_heads) * 2),
            DeviceBuffer(static_cast<std::size_t>(tokens * value_heads) * 2),
            DeviceBuffer(static_cast<std::size_t>(value_heads) * 4),
            DeviceBuffer(static_cast<std::size_t>(value_heads) * 4),
            DeviceBuffer(static_cast<std::size_t>(seqs + 1) * 4),
            DeviceBuffer(static_cast<std::size_t>(seqs * value_heads * kDim * kDim) * 4),
            DeviceBuffer(static_cast<std::size_t>(seqs) * 4),
            DeviceBuffer(static_cast<std::size_t>(tokens * value_heads * kDim) * 2)};
  using kjit::bench::fill_random;
  fill_random(in.q, DType::bf16, static_cast<std::size_t>(tokens * heads * kDim), 1);
  fill_random(in.k, DType::bf16, static_cast<std::size_t>(tokens * heads * kDim), 2);
  fill_random(in.v, DType::bf16, static_cast<std::size_t>(tokens * value_heads * kDim), 3);
  fill_random(in.a, DType::bf16, static_cast<std::size_t>(tokens * value_heads), 4);
  fill_random(in.b, DType::bf16, static_cast<std::size_t>(tokens * value_heads), 5);
  fill_random(in.a_log, DType::f32, static_cast<std::size_t>(value_heads), 6, 0.5);
  fill_random(in.dt_bias, DType::f32, static_cast<std::size_t>(value_heads), 7, 0.5);
  fill_random(in.pool, DType::f32, static_cast<std::size_t>(seqs * value_heads * kDim * kDim), 8,
              0.1);
  in.cu_dev.upload(in.cu);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(seqs));
  for (std::int64_t i = 0; i < seqs; ++i)
    idx[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  in.indices.upload(idx);
  return in;
}

// A contiguous view of a device buffer.
TensorView view(const DeviceBuffer& buffer, DType dtype,
                std::initializer_list<std::int64_t> shape) {
  return TensorView::contiguous(buffer.get(), dtype, shape);
}

// The bench's raw gates (a, b, A_log, dt_bias) of `in`.
kjit::GdnGates raw_gates(const Inputs& in) {
  const std::int64_t t = in.tokens, hv = in.value_heads;
  return kjit::GdnGates::raw(view(in.a, DType::bf16, {t, hv}), view(in.b, DType::bf16, {t, hv}),
                             view(in.a_log, DType::f32, {hv}), view(in.dt_bias, DType::f32, {hv}));
}

// gdn_prefill on `in` with q, k and the gates given (the anchor's prepared inputs), or `in`'s own.
void call(Inputs& in, const DeviceBuffer& q, const DeviceBuffer& k, const kjit::GdnGates& gates,
          const kjit::GdnPrefillOptions& options, kjit::Stream stream) {
  const std::int64_t t = in.tokens, h = in.heads, hv = in.value_heads, n = in.seqs;
  kjit::gdn_prefill(
      view(q, DType::bf16, {t, h, kDim}), view(k, DType::bf16, {t, h, kDim}),
      view(in.v, DType::bf16, {t, hv, kDim}), gates, view(in.cu_dev, DType::i32, {n + 1}),
      view(in.pool, DType::f32, {n, hv, kDim, kDim}), view(in.indices, DType::i32, {n}),
      TensorView{}, view(in.out, DType::bf16, {t, hv, kDim}), options, stream);
}
void call(Inputs& in, const kjit::GdnPrefillOptions& options, kjit::Stream stream) {
  call(in, in.q, in.k, raw_gates(in), options, stream);
}

// Downloads a device buffer of `dtype` to host bytes.
std::vector<unsigned char> host_copy(const DeviceBuffer& buffer) {
  std::vector<unsigned char> host(buffer.bytes());
  buffer.download(host.data(), host.size());
  return host;
}

// ||got - ref|| / ||ref|| over every element.
double relative_l2(const std::vector<unsigned char>& got, const std::vector<unsigned char>& ref,
                   DType dtype) {
  double d2 = 0, r2 = 0;
  const auto count = static_cast<std::int64_t>(got.size() / kjit::size_of(dtype));
  for (std::int64_t i = 0; i < count; ++i) {
    const double x = kjit::support::load_as_double(got.data(), dtype, i);
    const double y = kjit::support::load_as_double(ref.data(), dtype, i);
    d2 += (x - y) * (x - y);
    r2 += y * y;
  }
  return std::sqrt(d2 / std::max(r2, 1e-300));
}

/// One call on a small uneven batch against the float64 reference: relative L2 error of out and
/// of the pool.
bool verify(kjit::bench::Gpu& gpu, const kjit::GdnPrefillOptions& options) {
  Inputs in = make_inputs(1500, 5, 2, 4);
  auto pool = host_copy(in.pool);
  call(in, options, gpu.stream);
  gpu.synchronize();
  auto q = host_copy(in.q), k = host_copy(in.k), v = host_copy(in.v), a = host_copy(in.a),
       b = host_copy(in.b), al = host_copy(in.a_log), dt = host_copy(in.dt_bias);
  std::vector<std::int32_t> idx(5);
  for (int i = 0; i < 5; ++i) idx[static_cast<std::size_t>(i)] = i;
  std::vector<unsigned char> ref_out(in.out.bytes());
  const std::int64_t t = 1500, h = 2, hv = 4, n = 5;
  kjit::ops::gdn_prefill_reference(
      TensorView::contiguous(q.data(), DType::bf16, {t, h, kDim}),
      TensorView::contiguous(k.data(), DType::bf16, {t, h, kDim}),
      TensorView::contiguous(v.data(), DType::bf16, {t, hv, kDim}),
      kjit::GdnGates::raw(TensorView::contiguous(a.data(), DType::bf16, {t, hv}),
                          TensorView::contiguous(b.data(), DType::bf16, {t, hv}),
                          TensorView::contiguous(al.data(), DType::f32, {hv}),
                          TensorView::contiguous(dt.data(), DType::f32, {hv})),
      TensorView::contiguous(in.cu.data(), DType::i32, {n + 1}),
      TensorView::contiguous(pool.data(), DType::f32, {n, hv, kDim, kDim}),
      TensorView::contiguous(idx.data(), DType::i32, {n}), TensorView{},
      TensorView::contiguous(ref_out.data(), DType::bf16, {t, hv, kDim}), {});
  const double eo = relative_l2(host_copy(in.out), ref_out, DType::bf16);
  const double es = relative_l2(host_copy(in.pool), pool, DType::f32);
  std::printf("verify (T=1500, 5 seqs, H=2, HV=4): out rel err %.2e, state rel err %.2e -> %s\n",
              eo, es, eo <= 2e-2 && es <= 2e-2 ? "ok" : "FAILED");
  return eo <= 2e-2 && es <= 2e-2;
}

// The plan gdn_prefill runs for `in` under `options` (its mode names the path).
kjit::Plan plan_of(kjit::bench::Gpu& gpu, Inputs& in, const kjit::GdnPrefillOptions& options) {
  const std::int64_t t = in.tokens, h = in.heads, hv = in.value_heads, n = in.seqs;
  return kjit::plan_gdn_prefill(
      view(in.q, DType::bf16, {t, h, kDim}), view(in.k, DType::bf16, {t, h, kDim}),
      view(in.v, DType::bf16, {t, hv, kDim}), raw_gates(in), view(in.cu_dev, DType::i32, {n + 1}),
      view(in.pool, DType::f32, {n, hv, kDim, kDim}), view(in.indices, DType::i32, {n}),
      TensorView{}, view(in.out, DType::bf16, {t, hv, kDim}), options,
      gpu.runtime().device_limits(gpu.device));
}

// Dynamic shared memory that leaves room for at most two (100 KiB) or one (160 KiB) block per
// SM on an H100/H200 (227 KiB per SM).
constexpr std::uint32_t kTwoBlocksPerSmSmem = 100 * 1024;
constexpr std::uint32_t kOneBlockPerSmSmem = 160 * 1024;

// The parameters of a launch over `in` that every path shares (kernel_us and ws_profile add
// their workspace, value tiles or profile).
kjit::GdnPrefillParams launch_params(Inputs& in) {
  const std::int64_t t = in.tokens, h = in.heads, hv = in.value_heads, n = in.seqs;
  kjit::GdnPrefillParams p{};
  p.q = in.q.get();
  p.k = in.k.get();
  p.v = in.v.get();
  p.a = in.a.get();
  p.b = in.b.get();
  p.a_log = in.a_log.get();
  p.dt_bias = in.dt_bias.get();
  p.cu_seqlens = in.cu_dev.get();
  p.state_indices = in.indices.get();
  p.state = in.pool.get();
  p.out = in.out.get();
  p.q_stride_t = p.k_stride_t = h * kDim;
  p.q_stride_h = p.k_stride_h = kDim;
  p.v_stride_t = p.out_stride_t = hv * kDim;
  p.v_stride_h = p.out_stride_h = kDim;
  p.a_stride_t = p.b_stride_t = hv;
  p.state_slot_stride = hv * kDim * kDim;
  p.index_stride = 1;
  p.num_slots = n;
  p.num_seqs = static_cast<std::uint32_t>(n);
  p.num_value_heads = static_cast<std::uint32_t>(hv);
  p.heads_per_group = static_cast<std::uint32_t>(hv / h);
  p.num_heads = static_cast<std::uint32_t>(h);
  p.num_tokens = t;
  p.scale = 1.0f;
  p.softplus_threshold = 20.0f;
  return p;
}

/// The chunk kernel (kernel 1 of the chunked path) alone, launched through the runtime from the
/// plan gdn_prefill would run, to split the call's time between its two kernels. The parameter
/// block is packed as lib/ops/gdn_prefill/launch.cpp does for this bench's contiguous inputs.
// GPU us of one of the chunked path's two kernels launched alone (launch 0: the chunk kernel;
// 1: the state kernel, after one chunk-kernel launch filled the workspace). 0 on the fused path.
// `min_dynamic_smem` > 0 raises that launch's dynamic shared memory, which caps how many of its
// blocks share an SM (an occupancy experiment: the kernel does not use the extra bytes).
double kernel_us(kjit::bench::Gpu& gpu, Inputs& in, const kjit::GdnPrefillOptions& options,
                 std::size_t launch, std::uint32_t min_dynamic_smem = 0) {
  const std::int64_t t = in.tokens, hv = in.value_heads, n = in.seqs;
  kjit::Plan plan = plan_of(gpu, in, options);
  if (plan.launches.size() < 2 || launch >= plan.launches.size()) return 0.0;
  std::uint32_t& smem = plan.launches[launch].shape.dynamic_smem;
  smem = std::max(smem, min_dynamic_smem);
  const kjit::Runtime::ResolvedPlan resolved = gpu.runtime().resolve(plan, gpu.device);
  const kjit::GdnPrefillWorkspace layout =
      kjit::gdn_prefill_workspace(static_cast<std::uint64_t>(t), static_cast<std::uint64_t>(hv));
  // The context-parallel plan ("chunked_cp<L>_bv128", "_wgmma" on sm_90a): its segment regions
  // after the rest.
  const bool cp = plan.launches.size() == 4;
  const std::int64_t cp_chunks =
      cp ? std::stoll(plan.mode.substr(10, plan.mode.find("_bv") - 10)) : 0;
  const std::int64_t segments = cp ? t / (64 * cp_chunks) + n : 0;
  // The state kernel's value tile (its spec's bv): its blocks are (sequence, value head, tile),
  // so the tile count must match the grid (v_tiles = 1 with bv = 64 sent half the blocks past the
  // last sequence).
  const std::int64_t bv = std::stoll(plan.launches[1].spec.get_or("bv", std::to_string(kDim)));
  const kjit::GdnPrefillCpWorkspace cp_layout =
      kjit::gdn_prefill_cp_workspace(layout.total, static_cast<std::uint64_t>(segments),
                                     static_cast<std::uint64_t>(hv), kDim, kDim);
  DeviceBuffer ws(static_cast<std::size_t>(cp ? cp_layout.total : layout.total));
  kjit::GdnPrefillParams p = launch_params(in);
  auto* base = static_cast<unsigned char*>(ws.get());
  p.ws_t = base + layout.t;
  p.ws_p = base + layout.p;
  p.ws_scales = base + layout.scales;
  // The sequence order the call's state kernel takes (lib/ops/gdn_prefill/launch.cpp): longest
  // first for 2 .. kGdnPrefillOrderMaxSeqs sequences. Left null, the state kernel alone took the
  // sequences in index order, 1.4x longer than in the call at 128k tokens in 16 uneven sequences
  // (1532 us against 1090 under Nsight Compute; docs/performance.md).
  p.ws_order = !cp && n > 1 && n <= kjit::kGdnPrefillOrderMaxSeqs ? base + layout.order : nullptr;
  if (cp) {
    p.cp_b = reinterpret_cast<float*>(base + cp_layout.b);
    p.cp_m = reinterpret_cast<float*>(base + cp_layout.m);
    p.cp_x = reinterpret_cast<float*>(base + cp_layout.x);
    p.cp_segment_chunks = cp_chunks;
    p.cp_segments = segments;
    p.k_tiles = static_cast<std::uint32_t>(kDim / bv);
  }
  p.v_tiles = static_cast<std::uint32_t>(kDim / bv);
  // The launches before this one, once: they fill what it reads.
  for (std::size_t i = 0; i < launch; ++i)
    gpu.runtime().launch(resolved, i, gpu.stream, &p, sizeof p);
  return kjit::bench::median_gpu_us(
      gpu,
      [&](kjit::Stream stream) { gpu.runtime().launch(resolved, launch, stream, &p, sizeof p); },
      10, 2);
}

/// The span, in chunk steps, of blocks of `chunks` chunks each on `sms` SMs, one block per SM at a
/// time, each block in the given order taken by the SM that frees first.
std::int64_t packed_span(const std::vector<std::int64_t>& chunks, int sms) {
  std::priority_queue<std::int64_t, std::vector<std::int64_t>, std::greater<>> free_at;
  for (int i = 0; i < std::max(sms, 1); ++i) free_at.push(0);
  std::int64_t span = 0;
  for (const std::int64_t c : chunks) {
    const std::int64_t end = free_at.top() + c;
    free_at.pop();
    free_at.push(end);
    span = std::max(span, end);
  }
  return span;
}

/// packed_span of one block per (sequence, value head) walking its sequence's chunks: sequences
/// longest first (kjit's ws blocks and state kernel) or in index order (FlashInfer's kernel).
/// The call's GPU time over this span is its time per chunk step, apart from how the order packs
/// the blocks (docs/performance.md, "The step, not the schedule, is the gap").
std::int64_t greedy_span(const std::vector<std::int32_t>& cu, std::int64_t value_heads, int sms,
                         bool longest_first) {
  std::vector<std::int64_t> seq_chunks;
  for (std::size_t i = 0; i + 1 < cu.size(); ++i) {
    seq_chunks.push_back((cu[i + 1] - cu[i] + kjit::kGdnPrefillChunk - 1) / kjit::kGdnPrefillChunk);
  }
  if (longest_first) std::stable_sort(seq_chunks.begin(), seq_chunks.end(), std::greater<>());
  std::vector<std::int64_t> blocks;
  for (const std::int64_t c : seq_chunks) blocks.insert(blocks.end(), value_heads, c);
  return packed_span(blocks, sms);
}

/// The profile build's block timeline (warp 0's cells of each block: start and end in ns, SM,
/// chunks): the call's span from the first block's start to the last block's end, the share of
/// it the SMs held a block, and the share a longest-first packing of the same chunk counts onto
/// the SMs would give (blocks of equal speed per chunk): what the order and the lengths cost,
/// apart from the speed of a chunk.
void ws_timeline(const std::vector<std::uint64_t>& host, std::uint64_t blocks, int warps, int sites,
                 int sm_count) {
  using S = kjit::GdnWsProfileSite;
  std::uint64_t first = UINT64_MAX, last = 0, held = 0, latest_start = 0;
  std::vector<std::int64_t> chunks;
  // Each block's ns per chunk, and whether it started in the first wave (before any block
  // ended): if the blocks' speed varies, the slowest long block, not the packing, sets the end.
  std::vector<double> ns_per_chunk, first_wave_ns, later_ns;
  std::uint64_t first_end = UINT64_MAX;
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t* cell = host.data() + b * static_cast<std::uint64_t>(warps * sites);
    first_end = std::min(first_end, cell[S::kWsProfBlockEnd]);
  }
  for (std::uint64_t b = 0; b < blocks; ++b) {
    const std::uint64_t* cell = host.data() + b * static_cast<std::uint64_t>(warps * sites);
    if (cell[S::kWsProfBlockEnd] < cell[S::kWsProfBlockStart]) return;  // not recorded
    first = std::min(first, cell[S::kWsProfBlockStart]);
    last = std::max(last, cell[S::kWsProfBlockEnd]);
    latest_start = std::max(latest_start, cell[S::kWsProfBlockStart]);
    const std::uint64_t took = cell[S::kWsProfBlockEnd] - cell[S::kWsProfBlockStart];
    held += took;
    // (Warp 0 counts each of its chunks once.)
    chunks.push_back(static_cast<std::int64_t>(cell[S::kWsProfChunks]));
    // (Blocks of a few chunks are mostly their prologue and epilogue: left out of the spread.)
    if (cell[S::kWsProfChunks] >= 16) {
      const double ns = static_cast<double>(took) / static_cast<double>(cell[S::kWsProfChunks]);
      ns_per_chunk.push_back(ns);
      (cell[S::kWsProfBlockStart] < first_end ? first_wave_ns : later_ns).push_back(ns);
    }
  }
  if (blocks == 0 || last <= first || sm_count <= 0) return;
  std::sort(chunks.begin(), chunks.end(), std::greater<>());
  const std::int64_t total = std::accumulate(chunks.begin(), chunks.end(), std::int64_t{0});
  const double span = static_cast<double>(last - first);
  const double packed =
      static_cast<double>(total) /
      (static_cast<double>(packed_span(chunks, sm_count)) * static_cast<double>(sm_count));
  std::printf(
      "  timeline: %llu blocks on %d SMs, %.1f us from the first start to the last end; SMs held "
      "a block %.1f%% of it (longest-first packing of the same chunks: %.1f%%); last start at "
      "%.1f us\n",
      static_cast<unsigned long long>(blocks), sm_count, span / 1e3,
      100.0 * static_cast<double>(held) / (span * sm_count), 100.0 * packed,
      static_cast<double>(latest_start - first) / 1e3);
  const auto spread = [](std::vector<double> v) {
    if (v.empty()) return std::string("-");
    std::sort(v.begin(), v.end());
    return fmt::format("{:.0f} / {:.0f} / {:.0f} ({} blocks)", v.front(), v[v.size() / 2], v.back(),
                       v.size());
  };
  std::printf(
      "  timeline: ns per chunk of blocks of >= 16 chunks, min / median / max: all %s; started "
      "before the first end %s; later %s\n",
      spread(ns_per_chunk).c_str(), spread(first_wave_ns).c_str(), spread(later_ns).c_str());
}

// KJIT_PREFILL_BENCH_PROFILE=1 with a build of the warp-specialized kernel that has
// KJIT_GDN_WS_PROFILE 1 in templates/gdn_prefill/params.h (measurement only): one launch with
// GdnPrefillParams::profile set, and per role (the chunk warpgroup, state warpgroups 0 and 1)
// the clock cycles per chunk at each site of its loop, summed over the role's warps and blocks
// and divided by their chunk iterations. Prints why when the plan is not chunked_ws or the
// kernel was built without the sites.
void ws_profile(kjit::bench::Gpu& gpu, Inputs& in, const kjit::GdnPrefillOptions& options) {
  const kjit::Plan plan = plan_of(gpu, in, options);
  if (plan.mode != "chunked_ws") {
    std::printf("  (profile: mode %s, not chunked_ws; KJIT_PREFILL_BENCH_FORCE=chunked_ws)\n",
                plan.mode.c_str());
    return;
  }
  constexpr int kWarps = kjit::kGdnPrefillWsThreads / 32;
  constexpr int kSites = kjit::kGdnWsProfileSites;
  const std::uint64_t blocks = plan.launches[0].shape.grid.count();
  const std::size_t cells = static_cast<std::size_t>(blocks) * kWarps * kSites;
  DeviceBuffer profile(cells * sizeof(std::uint64_t));
  const kjit::Runtime::ResolvedPlan resolved = gpu.runtime().resolve(plan, gpu.device);
  kjit::GdnPrefillParams p = launch_params(in);
  p.v_tiles = 1;
  p.profile = static_cast<unsigned long long*>(profile.get());
  // Once without the profile (compile, first touch), then once with it from zeros.
  kjit::GdnPrefillParams plain = p;
  plain.profile = nullptr;
  gpu.runtime().launch(resolved, 0, gpu.stream, &plain, sizeof plain);
  gpu.synchronize();
  profile.upload(std::vector<std::uint64_t>(cells, 0));
  gpu.runtime().launch(resolved, 0, gpu.stream, &p, sizeof p);
  gpu.synchronize();
  std::vector<std::uint64_t> host(cells);
  profile.download(host.data(), cells * sizeof(std::uint64_t));
  struct Role {
    const char* name;
    int first_warp;
    std::vector<int> sites;
  };
  using S = kjit::GdnWsProfileSite;
  // A role's sites, in loop order: the enum lists the chunk warpgroup's, then the state
  // warpgroups' (params.h).
  const auto sites_between = [](int first, int end) {
    std::vector<int> sites;
    for (int site = first; site < end; ++site) sites.push_back(site);
    return sites;
  };
  const std::vector<int> chunk_sites = sites_between(S::kWsProfChunkFull, S::kWsProfStateFull);
  const std::vector<int> state_sites = sites_between(S::kWsProfStateFull, S::kWsProfBlockStart);
  const std::vector<Role> roles = {{"chunk warpgroup", 8, chunk_sites},
                                   {"state warpgroup 0", 0, state_sites},
                                   {"state warpgroup 1", 4, state_sites}};
  for (const Role& role : roles) {
    std::uint64_t chunks = 0, total = 0;
    std::vector<std::uint64_t> sum(kSites, 0);
    for (std::uint64_t b = 0; b < blocks; ++b) {
      for (int w = role.first_warp; w < role.first_warp + 4; ++w) {
        const std::uint64_t* cell =
            host.data() + (b * kWarps + static_cast<std::uint64_t>(w)) * kSites;
        chunks += cell[S::kWsProfChunks];
        for (int site : role.sites) sum[static_cast<std::size_t>(site)] += cell[site];
      }
    }
    for (int site : role.sites) total += sum[static_cast<std::size_t>(site)];
    if (chunks == 0) {
      std::printf("  (profile: no chunks counted: build the kernel with KJIT_GDN_WS_PROFILE 1)\n");
      return;
    }
    std::printf("  %-17s %7.0f cycles/chunk:", role.name,
                static_cast<double>(total) / static_cast<double>(chunks));
    for (int site : role.sites) {
      const double cycles =
          static_cast<double>(sum[static_cast<std::size_t>(site)]) / static_cast<double>(chunks);
      std::printf(" %s %.0f (%.0f%%)", kjit::gdn_ws_profile_site_name(site), cycles,
                  100.0 * static_cast<double>(sum[static_cast<std::size_t>(site)]) /
                      static_cast<double>(total));
    }
    std::printf("\n");
  }
  ws_timeline(host, blocks, kWarps, kSites, gpu.limits.sm_count);
}

// A prefill anchor loaded from KJIT_PREFILL_ANCHOR_LIB (bench/anchor_library.hpp), e.g.
// FlashInfer's SM90 kernel wrapped in a small library built outside the repository. Its C ABI:
//   int kjit_anchor_gdn_prefill(stream, out, final_state, q, k, v, initial_state, alpha, beta,
//       cu_seqlens, workspace, seqs, heads, value_heads, head_size, tokens, scale, sm_count,
//       error, error_bytes): q and k L2-normalized, alpha = e^g and beta f32 [T, HV], states
//       f32 [N, HV, V, K] (dense, one per sequence), cu_seqlens i64, out bf16 [T, HV, K];
//   int kjit_anchor_l2norm(stream, in, out, rows, dim): the normalization pass engines run
//       before such a kernel (bf16 rows).
struct PrefillAnchor {
  using Prefill = int (*)(void*, void*, float*, const void*, const void*, const void*, const float*,
                          const float*, const float*, const long long*, void*, int, int, int, int,
                          long long, float, int, char*, int);
  using Norm = int (*)(void*, const void*, void*, long long, int);
  kjit::bench::AnchorLibrary library;
  Prefill prefill = nullptr;
  Norm norm = nullptr;

  static std::optional<PrefillAnchor> open() {
    auto library = kjit::bench::AnchorLibrary::open("KJIT_PREFILL_ANCHOR_LIB");
    if (!library) return std::nullopt;
    const auto prefill = library->symbol<Prefill>("kjit_anchor_gdn_prefill");
    const auto norm = library->symbol<Norm>("kjit_anchor_l2norm");
    if (prefill == nullptr || norm == nullptr) return std::nullopt;
    return PrefillAnchor{*library, prefill, norm};
  }
};

// The anchor on `in`'s shape: its kernel alone and with the q/k normalization pass (GPU us), and
// its out and final state against kjit's from the same initial state (relative L2).
// same_inputs_us: kjit on the anchor's inputs (q and k normalized by the anchor's pass, g and beta
// precomputed, no in-kernel norms), i.e. the same work as the anchor's kernel alone.
struct AnchorRun {
  double kernel_us = 0, with_norm_us = 0, out_diff = 0, state_diff = 0, same_inputs_us = 0;
};

AnchorRun run_anchor(kjit::bench::Gpu& gpu, const PrefillAnchor& anchor, Inputs& in,
                     const kjit::GdnPrefillOptions& options) {
  using kjit::support::load_as_double;
  const std::int64_t t = in.tokens, h = in.heads, hv = in.value_heads, n = in.seqs;
  const auto qk_rows = static_cast<std::size_t>(t * h), gates = static_cast<std::size_t>(t * hv),
             state_bytes = static_cast<std::size_t>(n * hv * kDim * kDim) * 4;
  DeviceBuffer qn(qk_rows * kDim * 2), kn(qk_rows * kDim * 2), alpha(gates * 4), beta(gates * 4),
      cu64(static_cast<std::size_t>(n + 1) * 8), state_in(state_bytes), state_out(state_bytes),
      out(gates * kDim * 2), workspace(std::size_t{1} << 20), log_decay(gates * 4);
  // The gates as the anchor takes them, from the bench's raw ones by the reference's formulas.
  const auto a = host_copy(in.a), b = host_copy(in.b), a_log = host_copy(in.a_log),
             dt_bias = host_copy(in.dt_bias);
  std::vector<float> host_alpha(gates), host_beta(gates), host_g(gates);
  for (std::size_t i = 0; i < gates; ++i) {
    const auto head = static_cast<std::int64_t>(i % static_cast<std::size_t>(hv));
    const auto at = static_cast<std::int64_t>(i);
    const double g = kjit::reference::gdn_log_decay(
        load_as_double(a.data(), DType::bf16, at), load_as_double(a_log.data(), DType::f32, head),
        load_as_double(dt_bias.data(), DType::f32, head), options.softplus_threshold);
    host_g[i] = static_cast<float>(g);
    host_alpha[i] = static_cast<float>(std::exp(g));
    host_beta[i] =
        static_cast<float>(kjit::reference::gdn_sigmoid(load_as_double(b.data(), DType::bf16, at)));
  }
  alpha.upload(host_alpha);
  beta.upload(host_beta);
  log_decay.upload(host_g);
  cu64.upload(std::vector<long long>(in.cu.begin(), in.cu.end()));
  kjit::bench::check(kjit::bench::cu().cuMemcpyDtoDAsync(state_in.ptr(), in.pool.ptr(), state_bytes,
                                                         gpu.cu_stream()),
                     "cuMemcpyDtoDAsync");
  char error[512] = "";
  const auto enqueue = [&](bool with_norm) {
    void* stream = gpu.cu_stream();
    if (with_norm &&
        (anchor.norm(stream, in.q.get(), qn.get(), static_cast<long long>(qk_rows), kDim) != 0 ||
         anchor.norm(stream, in.k.get(), kn.get(), static_cast<long long>(qk_rows), kDim) != 0)) {
      std::fprintf(stderr, "anchor l2norm failed\n");
      std::exit(1);
    }
    if (anchor.prefill(
            stream, out.get(), static_cast<float*>(state_out.get()), qn.get(), kn.get(), in.v.get(),
            static_cast<const float*>(state_in.get()), static_cast<const float*>(alpha.get()),
            static_cast<const float*>(beta.get()), static_cast<const long long*>(cu64.get()),
            workspace.get(), static_cast<int>(n), static_cast<int>(h), static_cast<int>(hv),
            static_cast<int>(kDim), static_cast<long long>(t),
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(kDim))), gpu.limits.sm_count,
            error, sizeof error) != 0) {
      std::fprintf(stderr, "anchor %s failed: %s\n", anchor.library.name().c_str(), error);
      std::exit(1);
    }
  };
  AnchorRun run;
  // One call of each from the same initial state (kjit updates the pool in place).
  call(in, options, gpu.stream);
  enqueue(true);
  gpu.synchronize();
  run.out_diff = relative_l2(host_copy(out), host_copy(in.out), DType::bf16);
  run.state_diff = relative_l2(host_copy(state_out), host_copy(in.pool), DType::f32);
  kjit::bench::flush_l2(gpu);
  run.kernel_us = kjit::bench::median_gpu_us(
      gpu, [&](kjit::Stream) { enqueue(false); }, 20, 3);
  kjit::bench::flush_l2(gpu);
  run.with_norm_us = kjit::bench::median_gpu_us(
      gpu, [&](kjit::Stream) { enqueue(true); }, 20, 3);
  // kjit on the same inputs (qn and kn hold the normalized rows since the first call above).
  kjit::GdnPrefillOptions same = options;
  same.l2norm_qk = false;
  const kjit::GdnGates given = kjit::GdnGates::precomputed(view(log_decay, DType::f32, {t, hv}),
                                                           view(beta, DType::f32, {t, hv}));
  const auto same_call = [&](kjit::Stream stream) { call(in, qn, kn, given, same, stream); };
  kjit::bench::flush_l2(gpu);
  run.same_inputs_us = kjit::bench::median_gpu_us(gpu, same_call, 20, 3);
  return run;
}

struct Anchor {
  std::int64_t heads, value_heads, tokens, seqs;
  double fla_us;
};

// A few long sequences of equal length, with the figures the issue measured on the same H200 in
// one device call (FlashInfer's SM90 kernel without its context-parallel path, FlashQLA's
// kernel without its q/k norm pass; 0: not measured there). Quoted, not measured by this bench:
// FlashInfer runs beside it with KJIT_PREFILL_ANCHOR_LIB, FlashQLA in the same process as kjit's
// Python package (bench/python/bench_gdn_prefill_anchors.py; docs/performance.md, "FlashQLA
// beside kjit in one process").
struct FewShape {
  std::int64_t heads, value_heads, seqs, length;
  double flashinfer_us, flashqla_us;
};

// GPU us of the planner's choice and of the sequential chunked path ("chunked"), and the floor:
// bytes that must move (q, k, v, gates read, out written, states read and written) over a
// same-run cold copy of that size, and FLOPs (6KV + 4 * 64 (K + V) per token and value head)
// over the ~790 TFLOP/s measured bf16 GEMM rate. KJIT_PREFILL_BENCH_CP="16,32,64": also each
// segment length forced (chunked_cp<L>); KJIT_PREFILL_BENCH_TILES="16,32,64,128": each value
// tile of the sequential chunked path (chunked_bv<N>), on more pair counts.
void few_sequences_table(kjit::bench::Gpu& gpu, const kjit::GdnPrefillOptions& options,
                         const std::optional<PrefillAnchor>& anchor, FILE* json) {
  const std::vector<FewShape> shapes = {
      {16, 16, 1, 32768, 1615, 400}, {16, 16, 2, 16384, 776, 591},    {16, 16, 4, 8192, 394, 396},
      {16, 16, 8, 4096, 209, 331},   {16, 16, 1, 131072, 6502, 1362}, {16, 32, 1, 32768, 1547, 821},
      {16, 16, 16, 8192, 787, 0},
  };
  // With a tile sweep, pair counts between the rows above too (the value tile's crossovers
  // lie between 32 and 128 (sequence, value head) pairs on 132 SMs).
  const std::vector<FewShape> crossover_shapes = {
      {16, 16, 3, 8192, 0, 0}, {16, 32, 2, 16384, 0, 0}, {16, 16, 6, 8192, 0, 0},
      {16, 32, 4, 8192, 0, 0}, {16, 16, 12, 4096, 0, 0},
  };
  // Extra columns, each a forced mode: KJIT_PREFILL_BENCH_CP entries are segment lengths ("32"
  // runs chunked_cp32, "63_s2" chunked_cp63_s2), KJIT_PREFILL_BENCH_TILES entries value tiles
  // of the sequential chunked path ("64" runs chunked_bv64).
  std::vector<std::pair<std::string, std::string>> sweep;  // column label, force_mode
  const auto add_sweep = [&](const char* variable, const char* label, const char* mode) {
    const char* env = std::getenv(variable);
    for (std::string rest = env != nullptr ? env : ""; !rest.empty();) {
      const std::size_t comma = rest.find(',');
      const std::string entry = rest.substr(0, comma);
      sweep.emplace_back(label + entry, mode + entry);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    }
  };
  add_sweep("KJIT_PREFILL_BENCH_CP", "cp", "chunked_cp");
  add_sweep("KJIT_PREFILL_BENCH_TILES", "bv", "chunked_bv");
  std::vector<FewShape> table = shapes;
  if (std::getenv("KJIT_PREFILL_BENCH_TILES") != nullptr) {
    table.insert(table.end(), crossover_shapes.begin(), crossover_shapes.end());
  }
  // KJIT_PREFILL_BENCH_FEW_SHAPES="16/16/8x512,16/16/8x4096,...": these shapes (H/HV/seqs x
  // length) instead, e.g. one block count at several lengths to split a call into a cost per
  // chunk step and a cost per call.
  if (const char* list = std::getenv("KJIT_PREFILL_BENCH_FEW_SHAPES"); list != nullptr) {
    table.clear();
    for (std::string rest = list; !rest.empty();) {
      const std::size_t comma = rest.find(',');
      const std::string entry = rest.substr(0, comma);
      rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
      long long heads = 0, value_heads = 0, seqs = 0, length = 0;
      if (std::sscanf(entry.c_str(), "%lld/%lld/%lldx%lld", &heads, &value_heads, &seqs, &length) !=
              4 ||
          heads < 1 || value_heads < heads || value_heads % heads != 0 || seqs < 1 || length < 1) {
        std::fprintf(stderr,
                     "KJIT_PREFILL_BENCH_FEW_SHAPES: '%s' is not H/HV/SEQSxLEN (HV a multiple "
                     "of H, all >= 1)\n",
                     entry.c_str());
        std::exit(2);
      }
      table.push_back({heads, value_heads, seqs, length, 0, 0});
    }
  }
  // Without an anchor library: the FlashInfer figures (quoted, marked *).
  std::printf(
      "\nfew long sequences (equal lengths), GPU us\n%4s %4s %11s | %-22s %9s | %9s %7s | "
      "%8s %6s | %9s %9s %7s %9s | %9s",
      "H", "HV", "seqs x len", "planner's mode", "GPU us", "chunked", "gain", "floor", "of it",
      "anchor", "+norm", "anch/kj", "diff", "FlashQLA*");
  for (const auto& [label, mode] : sweep) std::printf(" %9s", label.c_str());
  std::printf("\n");
  // A quoted figure, or "-" where the issue has none (0): a "0*" read as a measurement.
  const auto print_quoted = [](double us) {
    if (us > 0) {
      std::printf("%8.0f*", us);
    } else {
      std::printf("%9s", "-");
    }
  };
  for (const FewShape& s : table) {
    const std::int64_t tokens = s.seqs * s.length;
    Inputs in = make_inputs(tokens, s.seqs, s.heads, s.value_heads, true);
    const kjit::Plan plan = plan_of(gpu, in, options);
    kjit::bench::flush_l2(gpu);
    const double us = kjit::bench::median_gpu_us(
        gpu, [&](kjit::Stream stream) { call(in, options, stream); }, 20, 3);
    kjit::GdnPrefillOptions sequential = options;
    sequential.force_mode = "chunked";
    kjit::bench::flush_l2(gpu);
    const double seq_us = kjit::bench::median_gpu_us(
        gpu, [&](kjit::Stream stream) { call(in, sequential, stream); }, 10, 2);
    const double bytes =
        static_cast<double>(tokens) *
            static_cast<double>(2 * s.heads * kDim * 2 + 2 * s.value_heads * kDim * 2 +
                                2 * s.value_heads * 2) +
        2.0 * static_cast<double>(s.seqs * s.value_heads * kDim * kDim * 4);
    const double copy = kjit::bench::copy_gbs(gpu, static_cast<std::size_t>(bytes));
    const double flops = (6.0 * kDim * kDim + 4.0 * 64 * (kDim + kDim)) *
                         static_cast<double>(tokens * s.value_heads);
    const double floor_us = std::max(bytes / (copy * 1e3), flops / 790e6);
    std::printf("%4lld %4lld %4lld x %-6lld | %-22s %9.1f | %9.1f %6.2fx | %8.1f %5.0f%% | ",
                static_cast<long long>(s.heads), static_cast<long long>(s.value_heads),
                static_cast<long long>(s.seqs), static_cast<long long>(s.length), plan.mode.c_str(),
                us, seq_us, seq_us / us, floor_us, 100.0 * floor_us / us);
    if (anchor) {
      const AnchorRun a = run_anchor(gpu, *anchor, in, options);
      std::printf("%9.1f %9.1f %6.2fx %.0e/%.0e | ", a.kernel_us, a.with_norm_us, a.kernel_us / us,
                  a.out_diff, a.state_diff);
    } else {
      print_quoted(s.flashinfer_us);
      std::printf(" %9s %7s %9s | ", "", "", "");
    }
    print_quoted(s.flashqla_us);
    if (plan.launches.size() == 4) {
      std::printf(" | chunk %.1f + segments %.1f + scan %.1f + resume %.1f",
                  kernel_us(gpu, in, options, 0), kernel_us(gpu, in, options, 1),
                  kernel_us(gpu, in, options, 2), kernel_us(gpu, in, options, 3));
    }
    for (const auto& [label, mode] : sweep) {
      kjit::GdnPrefillOptions forced = options;
      forced.force_mode = mode;
      kjit::bench::flush_l2(gpu);
      std::printf(" %9.1f",
                  kjit::bench::median_gpu_us(
                      gpu, [&](kjit::Stream stream) { call(in, forced, stream); }, 10, 2));
    }
    std::printf("\n");
    // With a profile build (KJIT_PREFILL_BENCH_PROFILE=1, see ws_profile): the ws kernel's
    // stretches and its blocks' timeline on this shape too.
    if (kjit::bench::env_is_one("KJIT_PREFILL_BENCH_PROFILE") && plan.mode == "chunked_ws") {
      ws_profile(gpu, in, options);
    }
    std::fflush(stdout);
    if (json != nullptr) {
      std::fprintf(json,
                   "{\"bench\":\"gdn_prefill_few\",\"heads\":%lld,\"value_heads\":%lld,"
                   "\"seqs\":%lld,\"length\":%lld,\"mode\":\"%s\",\"gpu_us\":%.2f,"
                   "\"chunked_us\":%.2f,\"floor_us\":%.2f}\n",
                   static_cast<long long>(s.heads), static_cast<long long>(s.value_heads),
                   static_cast<long long>(s.seqs), static_cast<long long>(s.length),
                   plan.mode.c_str(), us, seq_us, floor_us);
    }
  }
}

}  // namespace

int run(int argc, char** argv) {
  std::string why;
  auto gpu = kjit::bench::Gpu::open(&why);
  if (!gpu) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  FILE* json = argc > 1 ? std::fopen(argv[1], "a") : nullptr;
  kjit::GdnPrefillOptions options;
  options.runtime = &gpu->runtime();
  options.device = gpu->device;
  // KJIT_PREFILL_BENCH_FORCE=<mode>: the whole table under options.force_mode (A/B runs, e.g.
  // "chunked_wgmma" for the state kernel on warpgroup wgmma).
  if (const char* force = std::getenv("KJIT_PREFILL_BENCH_FORCE"); force != nullptr) {
    options.force_mode = force;
    std::printf("options.force_mode = %s\n", force);
  }
  // "profile": a few calls of one large shape only, for a profiler's per-kernel split (before
  // the checks below, so that the profiler's first matching launch is one of these calls).
  if (argc > 2 && std::string(argv[2]) == "profile") {
    Inputs in = make_inputs(131072, 16, 16, 16);
    for (int i = 0; i < 5; ++i) call(in, options, gpu->stream);
    gpu->synchronize();
    std::printf("profile: 5 calls of H = HV = 16, T = 131072, 16 sequences\n");
    return 0;
  }
  // "profile_chunk1": the chunk kernel alone with one block per SM (the occupancy experiment
  // below), for a profiler's view of a single chunk block's latency (before the checks, so
  // that the profiler's first matching launch is one of these).
  if (argc > 2 && std::string(argv[2]) == "profile_chunk1") {
    Inputs in = make_inputs(131072, 16, 16, 16);
    std::printf(
        "profile_chunk1: chunk kernel alone, one block per SM, H = HV = 16, T = 131072: "
        "%.1f us\n",
        kernel_us(*gpu, in, options, 0, kOneBlockPerSmSmem));
    return 0;
  }

  // KJIT_PREFILL_BENCH_NO_VERIFY=1: the checks report but do not end the run (measurement builds
  // whose results are wrong on purpose, e.g. KJIT_GDN_WS_PACE).
  const bool must_verify = std::getenv("KJIT_PREFILL_BENCH_NO_VERIFY") == nullptr;
  if (!verify(*gpu, options) && must_verify) return 1;
  const std::optional<PrefillAnchor> anchor = PrefillAnchor::open();
  if (anchor) std::printf("anchor: %s (KJIT_PREFILL_ANCHOR_LIB)\n", anchor->library.name().c_str());
  {
    // The context-parallel path on the same check, forced with short segments.
    kjit::GdnPrefillOptions cp = options;
    cp.force_mode = "chunked_cp2";
    std::printf("(force_mode chunked_cp2) ");
    if (!verify(*gpu, cp) && must_verify) return 1;
  }
  if (const char* few = std::getenv("KJIT_PREFILL_BENCH_FEW_ONLY"); few != nullptr) {
    few_sequences_table(*gpu, options, anchor, json);
    if (json != nullptr) std::fclose(json);
    return 0;
  }
  // fla chunk_gated_delta_rule on the same H200 (BENCHMARKING.md), GPU us per call.
  const std::vector<Anchor> anchors = {
      {16, 16, 8192, 4, 284}, {16, 16, 32768, 16, 1076}, {16, 16, 131072, 16, 4179},
      {16, 32, 8192, 4, 510}, {16, 32, 32768, 16, 1973}, {16, 32, 131072, 16, 7795},
  };
  // "chunk us" and "state us": each kernel of the chunked path launched alone (their sum is
  // more than the call's time by the state kernel's overlap with the chunk kernel's tail).
  // With an anchor: also kjit on the anchor's inputs ("same in": q and k normalized by its pass,
  // g and beta precomputed, no norms in the kernel), the same work as the anchor's kernel alone.
  // fla's column is quoted (marked *), not run here: the speedup is against those H200 figures.
  std::printf("%4s %4s %8s %5s | %10s %10s %8s %9s | %8s %8s | %9s %9s | %9s %9s %7s %9s%s  %s\n",
              "H", "HV", "T", "seqs", "GPU us", "Mtok/s", "TFLOP/s", "host us", "fla us*",
              "speedup", "chunk us", "state us", "anchor", "+norm", "anch/kj", "diff",
              anchor ? fmt::format(" | {:>9} {:>7}", "same in", "anch/si").c_str() : "",
              "planner's mode");
  // Per shape, for the chunk-step lines below the table.
  struct StepRow {
    const Anchor* shape;
    double us, anchor_us;
    std::string mode;
    std::vector<std::int32_t> cu;
  };
  std::vector<StepRow> steps;
  for (const Anchor& s : anchors) {
    Inputs in = make_inputs(s.tokens, s.seqs, s.heads, s.value_heads);
    kjit::bench::flush_l2(*gpu);
    const double us = kjit::bench::median_gpu_us(
        *gpu, [&](kjit::Stream stream) { call(in, options, stream); }, 20, 3);
    // Host cost: back-to-back calls without sync, wall time / count (the GPU queue absorbs
    // them; the first call memoized the plan).
    constexpr int kHostCalls = 200;
    gpu->synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kHostCalls; ++i) call(in, options, gpu->stream);
    const auto stop = std::chrono::steady_clock::now();
    gpu->synchronize();
    const double host_us =
        std::chrono::duration<double, std::micro>(stop - start).count() / kHostCalls;
    const double mtok = static_cast<double>(s.tokens) / us;
    const double flops = (6.0 * kDim * kDim + 4.0 * 64 * (kDim + kDim)) *
                         static_cast<double>(s.tokens * s.value_heads);
    const double tflops = flops / (us * 1e6);
    // Each kernel alone: only the paths of two kernels or more ("-" for one launch).
    const double chunk_us = kernel_us(*gpu, in, options, 0);
    const double state_us = kernel_us(*gpu, in, options, 1);
    const auto alone = [](double kernel) {
      return kernel > 0 ? fmt::format("{:9.1f}", kernel) : fmt::format("{:>9}", "-");
    };
    std::printf("%4lld %4lld %8lld %5lld | %10.1f %10.2f %8.1f %9.2f | %7.0f* %7.2fx | %s %s |",
                static_cast<long long>(s.heads), static_cast<long long>(s.value_heads),
                static_cast<long long>(s.tokens), static_cast<long long>(s.seqs), us, mtok, tflops,
                host_us, s.fla_us, s.fla_us / us, alone(chunk_us).c_str(), alone(state_us).c_str());
    double anchor_us = 0;
    if (anchor) {
      const AnchorRun a = run_anchor(*gpu, *anchor, in, options);
      anchor_us = a.kernel_us;
      std::printf(" %9.1f %9.1f %6.2fx %.0e/%.0e | %9.1f %6.2fx", a.kernel_us, a.with_norm_us,
                  a.kernel_us / us, a.out_diff, a.state_diff, a.same_inputs_us,
                  a.kernel_us / a.same_inputs_us);
    }
    // The planner's mode: it depends on the device (the warp-specialized kernel where DRAM is
    // slow per SM).
    const std::string mode = plan_of(*gpu, in, options).mode;
    std::printf("  %s\n", mode.c_str());
    steps.push_back({&s, us, anchor_us, mode, in.cu});
    std::fflush(stdout);
    if (json != nullptr) {
      std::fprintf(json,
                   "{\"bench\":\"gdn_prefill\",\"heads\":%lld,\"value_heads\":%lld,\"tokens\":%lld,"
                   "\"seqs\":%lld,\"gpu_us\":%.2f,\"mtokens_per_s\":%.3f,\"tflops\":%.2f,"
                   "\"host_us\":%.3f,\"fla_us\":%.0f,\"fla_quoted\":true,"
                   "\"speedup_vs_fla\":%.3f}\n",
                   static_cast<long long>(s.heads), static_cast<long long>(s.value_heads),
                   static_cast<long long>(s.tokens), static_cast<long long>(s.seqs), us, mtok,
                   tflops, host_us, s.fla_us, s.fla_us / us);
    }
  }
  std::printf(
      "* fla us: chunk_gated_delta_rule on the H200 of BENCHMARKING.md, quoted, not run in "
      "this call\n");
  // The chunk step: one block per (sequence, value head) and SM walks a sequence, so a call's
  // time is its step times the span of its blocks' packing (greedy_span). kjit's ws blocks take
  // the sequences longest first, FlashInfer's kernel in index order.
  std::printf(
      "\nchunk step, GPU us / span of the blocks in chunk steps on %d SMs (one block per "
      "SM; kjit's ws blocks longest first, the anchor's in index order)\n",
      gpu->limits.sm_count);
  std::printf("%4s %4s %8s %5s | %12s %12s | %10s %10s  %s\n", "H", "HV", "T", "seqs",
              "span longest", "span index", "kjit step", "anch step", "planner's mode");
  for (const StepRow& r : steps) {
    const int sms = gpu->limits.sm_count;
    const std::int64_t lpt = greedy_span(r.cu, r.shape->value_heads, sms, true);
    const std::int64_t index = greedy_span(r.cu, r.shape->value_heads, sms, false);
    // (The two kernels spread a chunk over both kernels' blocks: no step of this kind.)
    const auto step = [](bool applies, double us, std::int64_t span) {
      return applies ? fmt::format("{:10.2f}", us / static_cast<double>(span))
                     : fmt::format("{:>10}", "-");
    };
    std::printf("%4lld %4lld %8lld %5lld | %12lld %12lld | %s %s  %s\n",
                static_cast<long long>(r.shape->heads),
                static_cast<long long>(r.shape->value_heads),
                static_cast<long long>(r.shape->tokens), static_cast<long long>(r.shape->seqs),
                static_cast<long long>(lpt), static_cast<long long>(index),
                step(r.mode == "chunked_ws", r.us, lpt).c_str(),
                step(r.anchor_us > 0, r.anchor_us, index).c_str(), r.mode.c_str());
  }
  if (std::getenv("KJIT_PREFILL_BENCH_MAIN_ONLY") == nullptr) {
    few_sequences_table(*gpu, options, anchor, json);
  }
  if (kjit::bench::env_is_one("KJIT_PREFILL_BENCH_PROFILE")) {
    std::printf("\nwarp-specialized kernel, cycles per chunk and warp at each site of its loop\n");
    for (const Anchor& s : anchors) {
      Inputs in = make_inputs(s.tokens, s.seqs, s.heads, s.value_heads);
      std::printf("%lld/%lld, %lld tokens, %lld seqs\n", static_cast<long long>(s.heads),
                  static_cast<long long>(s.value_heads), static_cast<long long>(s.tokens),
                  static_cast<long long>(s.seqs));
      ws_profile(*gpu, in, options);
      std::fflush(stdout);
    }
  }
  // KJIT_PREFILL_BENCH_OCCUPANCY=1: each kernel of the chunked path alone with its blocks per SM
  // capped by padding its dynamic shared memory (3 = the chunk kernel's own occupancy; the
  // state kernel's 128-row tile has one block per SM already). What a fused kernel would get
  // from one chunk warpgroup per SM.
  if (kjit::bench::env_is_one("KJIT_PREFILL_BENCH_OCCUPANCY")) {
    std::printf(
        "\nchunk kernel alone, blocks per SM capped (GPU us)\n%4s %4s %8s %5s | %9s %9s "
        "%9s | %9s\n",
        "H", "HV", "T", "seqs", "own (3)", "2 per SM", "1 per SM", "state us");
    for (const Anchor& s : anchors) {
      if (s.tokens < 32768) continue;
      Inputs in = make_inputs(s.tokens, s.seqs, s.heads, s.value_heads);
      std::printf(
          "%4lld %4lld %8lld %5lld | %9.1f %9.1f %9.1f | %9.1f\n", static_cast<long long>(s.heads),
          static_cast<long long>(s.value_heads), static_cast<long long>(s.tokens),
          static_cast<long long>(s.seqs), kernel_us(*gpu, in, options, 0),
          kernel_us(*gpu, in, options, 0, kTwoBlocksPerSmSmem),
          kernel_us(*gpu, in, options, 0, kOneBlockPerSmSmem), kernel_us(*gpu, in, options, 1));
      std::fflush(stdout);
    }
  }
  // The chunked path's value tiles, each forced (the table above is the planner's choice):
  // KJIT_PREFILL_BENCH_SWEEP=1 (a minute more; the fused bv64 column is slow at 128k).
  if (!kjit::bench::env_is_one("KJIT_PREFILL_BENCH_SWEEP")) {
    if (json != nullptr) std::fclose(json);
    return 0;
  }
  std::printf(
      "\nchunked path, value tile forced: GPU us (speedup vs fla's quoted H200 figures)\n"
      "%4s %4s %8s %5s |",
      "H", "HV", "T", "seqs");
  const std::vector<std::string> modes = {"chunked_bv128", "chunked_bv32", "chunked_bv64", "bv64"};
  for (const std::string& m : modes) std::printf(" %16s", m.c_str());
  std::printf(" | chunk kernel us\n");
  for (const Anchor& s : anchors) {
    Inputs in = make_inputs(s.tokens, s.seqs, s.heads, s.value_heads);
    std::printf("%4lld %4lld %8lld %5lld |", static_cast<long long>(s.heads),
                static_cast<long long>(s.value_heads), static_cast<long long>(s.tokens),
                static_cast<long long>(s.seqs));
    for (const std::string& m : modes) {
      kjit::GdnPrefillOptions forced = options;
      forced.force_mode = m;
      kjit::bench::flush_l2(*gpu);
      const double us = kjit::bench::median_gpu_us(
          *gpu, [&](kjit::Stream stream) { call(in, forced, stream); }, 10, 2);
      std::printf(" %9.1f (%4.2fx)", us, s.fla_us / us);
    }
    std::printf(" | %9.1f\n", kernel_us(*gpu, in, options, 0));
    std::fflush(stdout);
  }
  if (json != nullptr) std::fclose(json);
  return 0;
}

// A plan the forced mode cannot take (KJIT_PREFILL_BENCH_FORCE) or any other kjit::Error ends
// the run with its message.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kjit::Error& error) {
    std::fprintf(stderr, "bench_gdn_prefill: %s\n", error.what());
    return 1;
  }
}
