// SPDX-License-Identifier: Apache-2.0
// causal_conv1d benchmark (method: shared/BENCHMARKING.md), Qwen3-Next sizes at TP1: D = 8192
// channels (mixed_qkv), W = 4, bf16 x / out / weight / bias / pool, SiLU.
// - Prefill: 8k, 32k and 128k tokens in 16 uneven sequences; median GPU us and the ratio to a
//   same-run device copy of the bytes that must move (x read, out written, the pool columns read
//   and written; weights are negligible). Target >= 0.90.
// - Decode update (S = 1): B = 1, 32, 256, 2048 rows at random slots of a pool twice the batch;
//   against the same-run copy rate and an empty kernel. Targets: within 1 us of the empty kernel
//   at B = 1, >= 0.85 of the copy rate from B = 256. Beside each, the slot read-modify-write
//   floor (bench_slot_rmw: the same bytes moved with nothing else, on the timed calls' slot lists
//   under the same protocol; kFloorShapes, check_floor) as floor us and floor us / kjit us, in the
//   JSON and a table after the update's lines.
// Every shape is first checked against the float64 reference on a slice of 64 channels (outputs
// and pool columns). L2 is flushed before each shape and the inputs rotate through >= 512 MB of
// buffers where the call is smaller than that, so timed calls read cold data.
//
//   bench_causal_conv1d [results.jsonl]
//   KJIT_CONV_BENCH_CHUNK=16   force the tokens per batch of loads (options.force_chunk)
//   KJIT_CONV_BENCH_SPAN=128   force the prefill's tokens per work item (force_span; 8..256)
//   KJIT_CONV_BENCH_MODES=min_blocks=4,stages=1,vec=4+min_blocks=4
//                              tuning candidates, each timed beside the default on the same
//                              inputs in the same process (and checked against the reference):
//                              a comma-separated list, each candidate '+'-joined key=value of
//                              min_blocks (force_min_blocks), stages (force_stages), vec, chunk,
//                              span. A candidate that does not apply to a shape (stages of 2 or
//                              more for the update) or forces a value out of range prints a
//                              line with "skipped" and the reason, and the others still run.
//   KJIT_CONV_BENCH_UPDATE_ONLY=1  the update's shapes (and their floor) alone, no prefill.
//   KJIT_BENCH_CUPTI=1         the update at B = 1 also by kernel duration, beside its padding
//                              rows, an empty kernel and a copy of the same bytes
//                              (bench/activity_timer.hpp): the event pairs' floor (~3.5 us)
//                              hides what the 1 us target is about.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iterator>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// kjit/types.hpp before harness.hpp: GCC's -Wshadow otherwise reports DType's i32 / i64
// enumerators as shadowing kjit::i32 / kjit::i64 of templates/common/types.h.
#include "kjit/types.hpp"
// (keep this order)
#include "activity_timer.hpp"
#include "harness.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "ops/causal_conv1d/family.hpp"
#include "support/numeric.hpp"

namespace {

using kjit::DType;
using kjit::TensorView;
using kjit::bench::check_floor;
using kjit::bench::DeviceBuffer;
using kjit::bench::download_words;
using kjit::bench::floor_output;
using kjit::bench::FloorCandidate;
using kjit::bench::FloorSample;

constexpr std::int64_t kDim = 8192;
constexpr std::int64_t kWidth = 4;
constexpr std::int64_t kCols = kWidth - 1;
constexpr std::size_t kColdBytes = std::size_t{512} << 20;
/// Channels of the reference check.
constexpr std::int64_t kCheckDim = 64;

std::vector<unsigned char> download(const DeviceBuffer& buffer, std::size_t offset,
                                    std::size_t bytes) {
  std::vector<unsigned char> host(bytes);
  kjit::bench::check(kjit::bench::cu().cuCtxSynchronize(), "cuCtxSynchronize");
  kjit::bench::check(kjit::bench::cu().cuMemcpyDtoH(host.data(), buffer.ptr() + offset, bytes),
                     "cuMemcpyDtoH");
  return host;
}

void upload(DeviceBuffer& buffer, const void* host, std::size_t bytes) {
  kjit::bench::check(kjit::bench::cu().cuCtxSynchronize(), "cuCtxSynchronize");
  kjit::bench::check(kjit::bench::cu().cuMemcpyHtoD(buffer.ptr(), host, bytes), "cuMemcpyHtoD");
}

/// A [rows, cols] slice of the first kCheckDim channels of a row-major [rows, kDim] bf16 tensor
/// on the host: download the whole rows (strided slice of the channels).
TensorView slice(std::vector<unsigned char>& host, std::int64_t rows) {
  return TensorView::strided(host.data(), DType::bf16, {rows, kCheckDim}, {kDim, 1});
}

/// Worst |got - want| / (1e-5 + |want| / 128) over the checked slice (bf16 out).
double worst(const std::vector<unsigned char>& out, std::int64_t rows,
             const std::vector<double>& want) {
  double w = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < kCheckDim; ++c) {
      const double g = kjit::support::load_as_double(out.data(), DType::bf16, r * kDim + c);
      const double e = want[static_cast<std::size_t>(r * kCheckDim + c)];
      w = std::max(w, std::isfinite(g) ? std::abs(g - e) / (1e-5 + std::abs(e) / 128) : 1e30);
    }
  }
  return w;
}

struct Common {
  DeviceBuffer weight{kDim * kWidth * 2}, bias{kDim * 2};
  /// The weights' and the bias' bytes in one buffer: the update floor's second input
  /// (bench_slot_rmw reads two inputs; x is the first), so that it reads what the update reads.
  DeviceBuffer weight_bias{kDim * (kWidth + 1) * 2};
  std::vector<unsigned char> weight_host, bias_host;
  explicit Common(std::uint64_t seed) {
    kjit::bench::fill_random(weight, DType::bf16, kDim * kWidth, seed, 0.5);
    kjit::bench::fill_random(bias, DType::bf16, kDim, seed + 1);
    weight_host = download(weight, 0, weight.bytes());
    bias_host = download(bias, 0, bias.bytes());
    std::vector<unsigned char> both = weight_host;
    both.insert(both.end(), bias_host.begin(), bias_host.end());
    upload(weight_bias, both.data(), both.size());
  }
  TensorView weight_view() const {
    return TensorView::contiguous(weight.get(), DType::bf16, {kDim, kWidth});
  }
  TensorView bias_view() const { return TensorView::contiguous(bias.get(), DType::bf16, {kDim}); }
  // Host views of the checked channels.
  TensorView weight_slice() {
    return TensorView::contiguous(weight_host.data(), DType::bf16, {kCheckDim, kWidth});
  }
  TensorView bias_slice() {
    return TensorView::contiguous(bias_host.data(), DType::bf16, {kCheckDim});
  }
};

int forced(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::atoi(text) : 0;
}

void print_json(std::FILE* json, const std::string& line) {
  std::printf("%s\n", line.c_str());
  if (json != nullptr) std::fprintf(json, "%s\n", line.c_str());
}

/// One tuning candidate of KJIT_CONV_BENCH_MODES: its text and the options it forces.
struct Candidate {
  std::string name;
  int min_blocks = 0, vec = 0, chunk = 0, span = 0, stages = 0;
  void apply(kjit::CausalConv1dOptions& o) const {
    if (min_blocks != 0) o.force_min_blocks = min_blocks;
    if (vec != 0) o.force_vec = vec;
    if (chunk != 0) o.force_chunk = chunk;
    if (span != 0) o.force_span = span;
    if (stages != 0) o.force_stages = stages;
  }
};

std::vector<Candidate> candidates() {
  std::vector<Candidate> out;
  const char* text = std::getenv("KJIT_CONV_BENCH_MODES");
  if (text == nullptr) return out;
  const std::string all = text;
  std::size_t at = 0;
  while (at <= all.size()) {
    const std::size_t end = std::min(all.find(',', at), all.size());
    const std::string name = all.substr(at, end - at);
    at = end + 1;
    if (name.empty()) continue;
    Candidate c;
    c.name = name;
    std::size_t k = 0;
    while (k < name.size()) {
      const std::size_t stop = std::min(name.find('+', k), name.size());
      const std::string item = name.substr(k, stop - k);
      k = stop + 1;
      const std::size_t eq = item.find('=');
      const std::string key = item.substr(0, eq);
      const int value = eq == std::string::npos ? 0 : std::atoi(item.c_str() + eq + 1);
      int* field = key == "min_blocks" ? &c.min_blocks
                   : key == "vec"      ? &c.vec
                   : key == "chunk"    ? &c.chunk
                   : key == "span"     ? &c.span
                   : key == "stages"   ? &c.stages
                                       : nullptr;
      if (field == nullptr || value == 0) {
        std::printf(
            "KJIT_CONV_BENCH_MODES: '%s' in '%s' is not key=value with a key of min_blocks, "
            "vec, chunk, span, stages\n",
            item.c_str(), name.c_str());
        std::exit(2);
      }
      *field = value;
    }
    out.push_back(c);
  }
  return out;
}

/// What one configuration of a shape measured: GPU us, the reference check and the spec.
struct Measured {
  double us = 0;
  double err = 0;
  bool pool_ok = false;
  std::string mode, spec;
};

bool prefill(kjit::bench::Gpu& gpu, Common& common, std::int64_t tokens,
             const std::vector<Candidate>& cands, std::FILE* json) {
  constexpr std::int64_t kSeqs = 16;
  const std::vector<std::int32_t> cu = kjit::bench::uneven_offsets(tokens, kSeqs, 7);
  const std::size_t x_bytes = static_cast<std::size_t>(tokens * kDim * 2);
  const std::size_t sets = std::max<std::size_t>(1, kColdBytes / (2 * x_bytes));
  DeviceBuffer x(x_bytes * sets), out(x_bytes * sets);
  const std::int64_t slots = 2 * kSeqs;
  DeviceBuffer pool(static_cast<std::size_t>(slots * kDim * kCols * 2));
  DeviceBuffer cu_dev(cu.size() * 4), idx_dev(kSeqs * 4);
  kjit::bench::fill_random(x, DType::bf16, x_bytes * sets / 2, 11);
  kjit::bench::fill_random(pool, DType::bf16, pool.bytes() / 2, 12);
  std::vector<std::int32_t> idx(kSeqs);
  for (std::int64_t n = 0; n < kSeqs; ++n)
    idx[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(2 * n + 1);
  upload(cu_dev, cu.data(), cu.size() * 4);
  upload(idx_dev, idx.data(), idx.size() * 4);
  kjit::CausalConv1dOptions o;
  o.activation = kjit::ConvActivation::silu;
  o.runtime = &gpu.runtime();
  o.device = gpu.device;
  o.force_chunk = forced("KJIT_CONV_BENCH_CHUNK");
  o.force_span = forced("KJIT_CONV_BENCH_SPAN");
  auto views = [&](std::size_t set) {
    return std::pair{TensorView::contiguous(reinterpret_cast<void*>(x.ptr() + set * x_bytes),
                                            DType::bf16, {tokens, kDim}),
                     TensorView::contiguous(reinterpret_cast<void*>(out.ptr() + set * x_bytes),
                                            DType::bf16, {tokens, kDim})};
  };
  const TensorView pool_view =
      TensorView::contiguous(pool.get(), DType::bf16, {slots, kDim, kCols});
  const TensorView cu_view = TensorView::contiguous(cu_dev.get(), DType::i32, {kSeqs + 1});
  const TensorView idx_view = TensorView::contiguous(idx_dev.get(), DType::i32, {kSeqs});
  const std::size_t bytes = 2 * x_bytes + static_cast<std::size_t>(2 * kSeqs * kDim * kCols * 2);

  auto measure = [&](const kjit::CausalConv1dOptions& opt) {
    auto call = [&](std::size_t set, kjit::Stream stream) {
      const auto [xv, ov] = views(set);
      kjit::causal_conv1d(xv, common.weight_view(), common.bias_view(), pool_view, cu_view,
                          idx_view, TensorView{}, ov, opt, stream);
    };
    Measured m;
    const kjit::Plan plan = kjit::plan_causal_conv1d(
        views(0).first, common.weight_view(), common.bias_view(), pool_view, cu_view, idx_view,
        TensorView{}, views(0).second, opt, gpu.limits);
    m.mode = plan.mode;
    m.spec = plan.launches[0].spec.str();
    // Check: one call against the reference on the first kCheckDim channels.
    std::vector<unsigned char> pool_ref = download(pool, 0, pool.bytes());
    std::vector<unsigned char> x_host = download(x, 0, x_bytes);
    call(0, gpu.stream);
    gpu.synchronize();
    std::vector<unsigned char> out_host = download(out, 0, x_bytes);
    std::vector<unsigned char> pool_after = download(pool, 0, pool.bytes());
    std::vector<std::int32_t> cu_host = cu;
    const std::vector<double> want = kjit::reference::causal_conv1d(
        slice(x_host, tokens), common.weight_slice(), common.bias_slice(),
        TensorView::strided(pool_ref.data(), DType::bf16, {slots, kCheckDim, kCols},
                            {kDim * kCols, kCols, 1}),
        TensorView::contiguous(cu_host.data(), DType::i32, {kSeqs + 1}),
        TensorView::contiguous(idx.data(), DType::i32, {kSeqs}), TensorView{}, opt);
    m.err = worst(out_host, tokens, want);
    m.pool_ok = true;
    for (std::int64_t s = 0; s < slots; ++s) {
      for (std::int64_t c = 0; c < kCheckDim; ++c) {
        for (std::int64_t j = 0; j < kCols; ++j) {
          const std::size_t at = static_cast<std::size_t>(((s * kDim + c) * kCols + j) * 2);
          // The reference updated pool_ref's checked channels in place.
          m.pool_ok =
              m.pool_ok && pool_ref[at] == pool_after[at] && pool_ref[at + 1] == pool_after[at + 1];
        }
      }
    }
    kjit::bench::flush_l2(gpu);
    std::size_t n = 0;
    m.us = kjit::bench::median_gpu_us(
        gpu, [&](kjit::Stream st) { call(n++ % sets, st); },
        x_bytes > (std::size_t{1} << 30) ? 50 : 100);
    return m;
  };

  const Measured base = measure(o);
  bool ok = base.err <= 1.0 && base.pool_ok;
  const double copy = kjit::bench::copy_gbs(gpu, bytes);
  const double gbs = static_cast<double>(bytes) / (base.us * 1e3);
  print_json(
      json,
      fmt::format("{{\"op\":\"causal_conv1d\",\"tokens\":{},\"seqs\":{},\"dim\":{},\"width\":{},"
                  "\"us\":{:.2f},\"gbs\":{:.1f},\"copy_gbs\":{:.1f},\"ratio_to_copy\":{:.3f},"
                  "\"mode\":\"{}\",\"spec\":\"{}\",\"check_worst\":{:.3f},\"pool_ok\":{}}}",
                  tokens, kSeqs, kDim, kWidth, base.us, gbs, copy, gbs / copy, base.mode, base.spec,
                  base.err, base.pool_ok));
  for (const Candidate& cand : cands) {
    kjit::CausalConv1dOptions co = o;
    cand.apply(co);
    try {
      const Measured m = measure(co);
      ok &= m.err <= 1.0 && m.pool_ok;
      const double cgbs = static_cast<double>(bytes) / (m.us * 1e3);
      print_json(json,
                 fmt::format("{{\"op\":\"causal_conv1d\",\"tokens\":{},\"candidate\":\"{}\","
                             "\"us\":{:.2f},\"default_us\":{:.2f},\"speedup\":{:.3f},"
                             "\"ratio_to_copy\":{:.3f},\"spec\":\"{}\",\"check_worst\":{:.3f},"
                             "\"pool_ok\":{}}}",
                             tokens, cand.name, m.us, base.us, base.us / m.us, cgbs / copy, m.spec,
                             m.err, m.pool_ok));
    } catch (const kjit::Error& e) {  // a plan refused, or a forced value out of range
      print_json(json, fmt::format("{{\"op\":\"causal_conv1d\",\"tokens\":{},\"candidate\":"
                                   "\"{}\",\"skipped\":\"{}\"}}",
                                   tokens, cand.name, e.what()));
    }
  }
  return ok;
}

/// The update's slot read-modify-write floor (bench_slot_rmw_kernel, templates/bench/bench.cuh):
/// the bytes an update call moves and nothing else, i.e. each row's conv-state slot (D x (W-1)
/// bf16 = 48 KiB, contiguous in the default layout) read and written back in place, x and the
/// weights + bias read once, out written once, no arithmetic. A shape is rows of 512 bytes per
/// warp, warps per block and the pool's cache hint; a block moves rows x warps x 512 bytes of one
/// slot, so rows x warps must divide the slot's 96 rows of 512 bytes. gdn_decode's five
/// (serving_table in bench/gdn_decode.cpp) and 4 x 1 (twice 8 x 1's blocks, for small batches).
constexpr kjit::bench::FloorShape kFloorShapes[] = {{8, 1, "plain"},  {8, 1, "cs"},
                                                    {16, 1, "plain"}, {4, 4, "plain"},
                                                    {8, 1, "l2_256"}, {4, 1, "plain"}};
constexpr std::size_t kSlotBytes = static_cast<std::size_t>(kDim * kCols * 2);

constexpr bool floor_tiles_divide_slot() {
  for (const kjit::bench::FloorShape& shape : kFloorShapes) {
    if (kSlotBytes % (static_cast<std::size_t>(shape.rows * shape.warps) * 512) != 0) return false;
  }
  return true;
}
static_assert(floor_tiles_divide_slot(), "every floor shape's tile must divide a conv-state slot");

bool decode(kjit::bench::Gpu& gpu, Common& common, std::int64_t batch, double empty_us,
            const std::vector<Candidate>& cands,
            const std::vector<kjit::bench::SlotRmw>& floor_kernels, std::string* floor_table,
            kjit::bench::ActivityTimer* durations, std::FILE* json) {
  const std::int64_t slot_elems = kDim * kCols;
  const std::size_t row_bytes = static_cast<std::size_t>(kDim * 2);
  const std::size_t step_bytes = static_cast<std::size_t>(batch) *
                                 (2 * row_bytes + 2 * static_cast<std::size_t>(slot_elems) * 2);
  // Pool: twice the batch, and >= 512 MB so that rotating slot sets reads cold rows.
  const std::int64_t slots = std::max<std::int64_t>(
      2 * batch, static_cast<std::int64_t>(kColdBytes / static_cast<std::size_t>(slot_elems * 2)));
  DeviceBuffer pool(static_cast<std::size_t>(slots * slot_elems * 2));
  kjit::bench::fill_random(pool, DType::bf16, static_cast<std::size_t>(slots * slot_elems), 21);
  const std::size_t io_bytes = static_cast<std::size_t>(batch) * row_bytes;
  const std::size_t windows =
      std::max<std::size_t>(1, std::min<std::size_t>(64, kColdBytes / io_bytes));
  DeviceBuffer x(io_bytes * windows), out(io_bytes * windows);
  kjit::bench::fill_random(x, DType::bf16, io_bytes * windows / 2, 22);
  // 32 index sets of `batch` distinct random slots each (distinct within a set).
  constexpr int kSets = 32;
  std::mt19937_64 rng(23);
  std::vector<std::int32_t> idx(static_cast<std::size_t>(kSets * batch));
  std::vector<std::int32_t> all(static_cast<std::size_t>(slots));
  std::iota(all.begin(), all.end(), 0);
  for (int s = 0; s < kSets; ++s) {
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + batch, idx.begin() + s * batch);
  }
  DeviceBuffer idx_dev(idx.size() * 4);
  upload(idx_dev, idx.data(), idx.size() * 4);
  // The same sets, each sorted ascending: the floor candidates that take the slots in address
  // order.
  const std::vector<std::int32_t> ascending = kjit::bench::sorted_per_list(idx, batch);
  DeviceBuffer ascending_dev(ascending.size() * 4);
  upload(ascending_dev, ascending.data(), ascending.size() * 4);
  kjit::CausalConv1dOptions o;
  o.activation = kjit::ConvActivation::silu;
  o.runtime = &gpu.runtime();
  o.device = gpu.device;

  // The floor's bytes: the slots (read and written back), x read, weights + bias read (one
  // buffer of the same bytes), out written; inputs[0] and output move to each call's window.
  kjit::SlotRmwParams floor_params{};
  floor_params.pool = pool.get();
  floor_params.slot_bytes = kSlotBytes;
  floor_params.inputs[0] = x.get();
  floor_params.input_bytes[0] = io_bytes;
  floor_params.inputs[1] = common.weight_bias.get();
  floor_params.input_bytes[1] = common.weight_bias.bytes();
  floor_params.output = out.get();
  floor_params.output_bytes = io_bytes;
  // Each candidate checked on set 0 (window 0) first: three slots of it and one it leaves alone.
  bool floor_ok = true;
  std::vector<FloorCandidate> floors;
  {
    std::vector<std::uint32_t> inputs = download_words(x, 0, io_bytes / 4);
    const std::vector<std::uint32_t> wb =
        download_words(common.weight_bias, 0, common.weight_bias.bytes() / 4);
    inputs.insert(inputs.end(), wb.begin(), wb.end());
    const std::vector<std::uint32_t> want_out = floor_output(inputs, io_bytes / 4, 1);
    std::vector<FloorSample> samples = kjit::bench::floor_samples(idx.data(), batch, slots);
    const auto snapshot = [&] { kjit::bench::snapshot_floor_samples(samples, pool, kSlotBytes); };
    snapshot();
    for (const kjit::bench::SlotRmw& kernel : floor_kernels) {
      for (const bool in_order : {false, true}) {
        const FloorCandidate candidate{&kernel, in_order};
        kjit::SlotRmwParams first = floor_params;
        first.slots = static_cast<const kjit::i32*>((in_order ? ascending_dev : idx_dev).get());
        const std::string why =
            check_floor(gpu, candidate, first, batch, pool, samples, out, want_out);
        if (why.empty()) {
          floors.push_back(candidate);
        } else {
          std::printf("FLOOR CHECK FAILED: update B=%lld %s: %s\n", static_cast<long long>(batch),
                      candidate.name().c_str(), why.c_str());
          floor_ok = false;
          snapshot();  // a failed check may leave its + 1 behind: the next compares from here
        }
      }
    }
  }
  // What the floor timed: the fastest candidate (floor_us, its name), the fastest with the slots
  // as drawn, and every candidate's us (JSON).
  kjit::bench::FloorBest best;

  auto view_x = [&](std::size_t w) {
    return TensorView::contiguous(reinterpret_cast<void*>(x.ptr() + w * io_bytes), DType::bf16,
                                  {batch, 1, kDim});
  };
  auto view_out = [&](std::size_t w) {
    return TensorView::contiguous(reinterpret_cast<void*>(out.ptr() + w * io_bytes), DType::bf16,
                                  {batch, 1, kDim});
  };
  const TensorView pool_view =
      TensorView::contiguous(pool.get(), DType::bf16, {slots, kDim, kCols});
  auto idx_view = [&](int s) {
    return TensorView::contiguous(
        reinterpret_cast<void*>(idx_dev.ptr() + static_cast<std::size_t>(s * batch) * 4),
        DType::i32, {batch});
  };
  const TensorView pool_columns =
      TensorView::strided(pool.get(), DType::bf16, {slots, kDim, kCols}, {slot_elems, 1, kDim});
  std::size_t n = 1;
  // The check of set 0 on the first kCheckDim channels, then the step timed on rotating sets,
  // and the same step with vLLM's pool layout, [slots, W-1, D] seen as [slots, D, W-1] (same
  // bytes, the planner's per-column vector access instead of whole slot blocks). With
  // `with_floor`, right after the step (default layout) each checked floor candidate under the
  // same protocol: L2 flushed, then the same calls (warm-up and timed) on the same slot sets and
  // x / out windows in the same turn (its counter starts where the step's did). The vLLM layout
  // moves the same bytes, so its floor is the same one (pool_w_d_floor_ratio).
  auto measure = [&](const kjit::CausalConv1dOptions& opt, double* columns_us, bool with_floor) {
    auto call = [&](std::size_t i, const TensorView& pv, kjit::Stream stream) {
      kjit::causal_conv1d_update(view_x(i % windows), common.weight_view(), common.bias_view(), pv,
                                 idx_view(static_cast<int>(i % kSets)), TensorView{},
                                 view_out(i % windows), opt, stream);
    };
    Measured m;
    const kjit::Plan plan = kjit::plan_causal_conv1d_update(
        view_x(0), common.weight_view(), common.bias_view(), pool_view, idx_view(0), TensorView{},
        view_out(0), opt, gpu.limits);
    m.mode = plan.mode;
    m.spec = plan.launches[0].spec.str();
    const std::vector<unsigned char> pool_before = download(pool, 0, pool.bytes());
    std::vector<unsigned char> x_host = download(x, 0, io_bytes);
    call(0, pool_view, gpu.stream);
    gpu.synchronize();
    const std::vector<unsigned char> out_host = download(out, 0, io_bytes);
    const std::vector<unsigned char> pool_after = download(pool, 0, pool.bytes());
    std::vector<unsigned char> pool_ref = pool_before;
    const std::vector<double> want = kjit::reference::causal_conv1d_update(
        TensorView::strided(x_host.data(), DType::bf16, {batch, 1, kCheckDim}, {kDim, kDim, 1}),
        common.weight_slice(), common.bias_slice(),
        TensorView::strided(pool_ref.data(), DType::bf16, {slots, kCheckDim, kCols},
                            {slot_elems, kCols, 1}),
        TensorView::contiguous(idx.data(), DType::i32, {batch}), TensorView{}, opt);
    m.err = worst(out_host, batch, want);
    m.pool_ok = true;
    for (std::int64_t s = 0; s < slots && m.pool_ok; ++s) {
      const std::size_t at = static_cast<std::size_t>(s * slot_elems * 2);
      const std::size_t count = static_cast<std::size_t>(kCheckDim * kCols * 2);
      m.pool_ok = std::equal(pool_after.begin() + static_cast<std::ptrdiff_t>(at),
                             pool_after.begin() + static_cast<std::ptrdiff_t>(at + count),
                             pool_ref.begin() + static_cast<std::ptrdiff_t>(at));
    }
    kjit::bench::flush_l2(gpu);
    const std::size_t first_call = n;
    m.us = kjit::bench::median_gpu_us(gpu, [&](kjit::Stream st) { call(n++, pool_view, st); });
    for (std::size_t k = 0; k < (with_floor ? floors.size() : 0); ++k) {
      const FloorCandidate& candidate = floors[k];
      const DeviceBuffer& lists = candidate.ascending ? ascending_dev : idx_dev;
      std::size_t floor_call = first_call;
      kjit::bench::flush_l2(gpu);
      const double candidate_us = kjit::bench::median_gpu_us(gpu, [&](kjit::Stream st) {
        const std::size_t i = floor_call++;
        kjit::SlotRmwParams p = floor_params;
        p.slots = reinterpret_cast<const kjit::i32*>(
            lists.ptr() + (i % kSets) * static_cast<std::size_t>(batch) * 4);
        p.inputs[0] = reinterpret_cast<const void*>(x.ptr() + (i % windows) * io_bytes);
        p.output = reinterpret_cast<void*>(out.ptr() + (i % windows) * io_bytes);
        candidate.kernel->launch(st, p, static_cast<std::size_t>(batch));
      });
      best.add(candidate, candidate_us);
    }
    kjit::bench::flush_l2(gpu);
    *columns_us =
        kjit::bench::median_gpu_us(gpu, [&](kjit::Stream st) { call(n++, pool_columns, st); });
    return m;
  };

  double columns_us = 0;
  const Measured base = measure(o, &columns_us, true);
  bool ok = base.err <= 1.0 && base.pool_ok && floor_ok;
  const double us = base.us, err = base.err;
  const bool pool_ok = base.pool_ok;
  // Every index a padding index (-1): each row reads its index and writes zeros, so the time is
  // one dependent load less than the real step (the slot decides where the pool row is); what
  // is left over an empty kernel is the index load and the stores.
  const std::vector<std::int32_t> padding(static_cast<std::size_t>(batch), -1);
  DeviceBuffer padding_dev(padding.size() * 4);
  upload(padding_dev, padding.data(), padding.size() * 4);
  const TensorView padding_view = TensorView::contiguous(padding_dev.get(), DType::i32, {batch});
  // One call of the default update on the next x / out window, with the given slot indices (the
  // call's rotating set, or every row padding).
  const auto update_call = [&](bool padding_rows, kjit::Stream s) {
    const std::size_t i = n++;
    kjit::causal_conv1d_update(view_x(i % windows), common.weight_view(), common.bias_view(),
                               pool_view,
                               padding_rows ? padding_view : idx_view(static_cast<int>(i % kSets)),
                               TensorView{}, view_out(i % windows), o, s);
  };
  kjit::bench::flush_l2(gpu);
  const double padding_us =
      kjit::bench::median_gpu_us(gpu, [&](kjit::Stream s) { update_call(true, s); });
  if (batch == 1 && durations != nullptr) {
    const auto timed = durations->beside_empty_and_copy(
        gpu, [&](kjit::Stream s) { update_call(false, s); }, "causal_conv1d_kernel", step_bytes);
    const double padding_duration =
        durations
            ->median_us(
                gpu, [&](kjit::Stream s) { update_call(true, s); }, 50, "causal_conv1d_kernel")
            .value_or(-1);
    std::printf(
        "B=1 kernel durations (CUPTI): update %.2f us (%+.2f over the empty kernel), padding rows "
        "%.2f us, empty kernel %.2f us, copy of the same bytes %.2f us\n",
        timed.call, timed.call - timed.empty, padding_duration, timed.empty, timed.copy);
  }
  const double copy = kjit::bench::copy_gbs(gpu, step_bytes);
  const double gbs = static_cast<double>(step_bytes) / (us * 1e3);
  // floor_ratio = floor us / kjit us (1.000 or more: kjit at the floor); floor_ratio_to_copy: the
  // floor's rate against the copy's, i.e. what the access pattern itself costs.
  const double floor_us = best.us;
  const bool has_floor = floor_us > 0;
  const double floor_ratio = has_floor ? floor_us / us : -1.0;
  const double floor_to_copy =
      has_floor ? static_cast<double>(step_bytes) / (floor_us * 1e3) / copy : -1.0;
  print_json(json,
             fmt::format("{{\"op\":\"causal_conv1d_update\",\"batch\":{},\"steps\":1,\"dim\":{},"
                         "\"width\":{},\"us\":{:.2f},\"empty_kernel_us\":{:.2f},\"over_empty_us\":"
                         "{:.2f},\"gbs\":{:.1f},\"copy_gbs\":{:.1f},\"ratio_to_copy\":{:.3f},"
                         "\"padding_rows_us\":{:.2f},\"pool_w_d_us\":{:.2f},"
                         "\"pool_w_d_ratio_to_copy\":{:.3f},\"check_worst\":{:.3f},"
                         "\"pool_ok\":{},\"floor_us\":{:.3f},\"floor_ratio\":{:.4f},"
                         "\"floor_kernel\":\"{}\",\"floor_given_us\":{:.3f},"
                         "\"floor_ratio_to_copy\":{:.4f},\"pool_w_d_floor_ratio\":{:.4f},"
                         "\"floor_check\":{},\"floor_candidates\":{{{}}}}}",
                         batch, kDim, kWidth, us, empty_us, us - empty_us, gbs, copy, gbs / copy,
                         padding_us, columns_us,
                         static_cast<double>(step_bytes) / (columns_us * 1e3) / copy, err, pool_ok,
                         floor_us, floor_ratio, best.kernel, best.given_us, floor_to_copy,
                         has_floor ? floor_us / columns_us : -1.0, floor_ok, best.candidates_json));
  *floor_table +=
      has_floor
          ? fmt::format("{:6} | {:8.2f} ({:.3f}) | {:8.2f} ({:.3f}) | {:11.3f} | {:11.3f} | {}\n",
                        batch, us, gbs / copy, floor_us, floor_to_copy, floor_ratio,
                        floor_us / columns_us, best.kernel)
          : fmt::format(
                "{:6} | {:8.2f} ({:.3f}) | no floor (every candidate failed its "
                "check)\n",
                batch, us, gbs / copy);
  for (const Candidate& cand : cands) {
    kjit::CausalConv1dOptions co = o;
    cand.apply(co);
    try {
      double cand_columns_us = 0;
      const Measured m = measure(co, &cand_columns_us, false);
      ok &= m.err <= 1.0 && m.pool_ok;
      const double cgbs = static_cast<double>(step_bytes) / (m.us * 1e3);
      print_json(json,
                 fmt::format("{{\"op\":\"causal_conv1d_update\",\"batch\":{},\"candidate\":"
                             "\"{}\",\"us\":{:.2f},\"default_us\":{:.2f},\"speedup\":{:.3f},"
                             "\"over_empty_us\":{:.2f},\"ratio_to_copy\":{:.3f},\"pool_w_d_us\":"
                             "{:.2f},\"default_pool_w_d_us\":{:.2f},\"pool_w_d_ratio_to_copy\":"
                             "{:.3f},\"floor_ratio\":{:.4f},\"spec\":\"{}\",\"check_worst\":"
                             "{:.3f},\"pool_ok\":{}}}",
                             batch, cand.name, m.us, us, us / m.us, m.us - empty_us, cgbs / copy,
                             cand_columns_us, columns_us,
                             static_cast<double>(step_bytes) / (cand_columns_us * 1e3) / copy,
                             has_floor ? floor_us / m.us : -1.0, m.spec, m.err, m.pool_ok));
    } catch (const kjit::Error& e) {  // a plan refused, or a forced value out of range
      print_json(json, fmt::format("{{\"op\":\"causal_conv1d_update\",\"batch\":{},"
                                   "\"candidate\":\"{}\",\"skipped\":\"{}\"}}",
                                   batch, cand.name, e.what()));
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  auto gpu = kjit::bench::Gpu::open(&why);
  if (!gpu) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  std::FILE* json = argc > 1 ? std::fopen(argv[1], "w") : nullptr;
  Common common(5);
  const std::vector<Candidate> cands = candidates();
  bool ok = true;
  try {
    std::printf(
        "causal_conv1d D=%lld W=%lld bf16, SiLU, 16 uneven sequences; median GPU us of "
        "cold calls\n",
        static_cast<long long>(kDim), static_cast<long long>(kWidth));
    if (!kjit::bench::env_is_one("KJIT_CONV_BENCH_UPDATE_ONLY")) {
      for (const std::int64_t tokens : {8192, 32768, 131072})
        ok &= prefill(*gpu, common, tokens, cands, json);
    }
    std::vector<kjit::bench::SlotRmw> floor_kernels;
    for (const kjit::bench::FloorShape& shape : kFloorShapes) {
      floor_kernels.emplace_back(*gpu, shape.rows, shape.warps, shape.hint);
    }
    const double empty_us = kjit::bench::empty_kernel_us(*gpu);
    std::printf(
        "causal_conv1d_update S=1, random slots of a >= 512 MB pool; empty kernel %.2f us\n",
        empty_us);
    std::string floor_table;
    kjit::bench::ActivityTimer* const durations = kjit::bench::ActivityTimer::requested();
    for (const std::int64_t batch : {1, 32, 256, 2048})
      ok &= decode(*gpu, common, batch, empty_us, cands, floor_kernels, &floor_table, durations,
                   json);
    std::printf(
        "\nslot read-modify-write floor of the update: the same bytes moved with nothing else "
        "(bench_slot_rmw on the timed calls' slot sets and x / out windows, L2 flushed, same "
        "rotation; best of %zu kernel shapes x slots as drawn / ascending), median GPU us (ratio "
        "to the copy); floor/kjit = floor us / kjit us (>= 1.000: kjit at the floor), also for "
        "the update in vLLM's pool layout (same bytes)\n%6s | %-16s | %-16s | %11s | %11s | "
        "%s\n%s",
        std::size(kFloorShapes), "B", "kjit (to copy)", "floor (to copy)", "floor/kjit",
        "vLLM layout", "floor kernel", floor_table.c_str());
  } catch (const kjit::Error& e) {
    std::printf("FAILED: %s\n", e.what());
    ok = false;
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    ok = false;
  }
  if (json != nullptr) std::fclose(json);
  std::printf("%s\n", ok ? "all shapes match the reference" : "SOME SHAPES FAILED THE CHECK");
  return ok ? 0 : 1;
}
