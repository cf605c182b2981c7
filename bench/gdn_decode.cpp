// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet packed decode: median GPU time, bandwidth and its ratio to a same-run
// device-to-device copy of the same bytes, for the Qwen3-Next shapes of BENCHMARKING.md
// (H = 16, K = V = 128, bf16 q/k/v, f32 state). Cold data: L2 flushed per shape and the calls
// rotate through >= 512 MB of pool slots. Each shape is first checked against the float64
// reference on a sample of rows.
//
// KJIT_GDN_BENCH_VARIANTS (default "planner") lists the configurations to time on every shape,
// separated by ';': "planner" is the planner's choice, otherwise
// "<mode>[:bv=N,stages=N,bps=N,hints=L/S,order=slot|given]" forces a grid mode ("planner": the
// planner's), V tile, bulk stages, resident blocks per SM, state cache hints and row order. A
// summary table of every shape x variant is printed last. KJIT_GDN_BENCH_SLOTS=sorted gives each
// call its slots in ascending order instead of a random permutation. KJIT_GDN_BENCH_SERVING=1
// adds the serving protocol's table and its slot read-modify-write floor (serving_table), "only"
// runs them alone, once per variant.
// KJIT_BENCH_CUPTI=1:
// B = 1 also by kernel duration beside an empty kernel and a copy (bench/activity_timer.hpp);
// in the fused table also each forced cluster size, and an empty kernel of each plan's grid with
// and without its clusters.
// KJIT_GDN_BENCH_STATE_LAYOUT=kv passes every pool K-major (fla's layout: each slot [HV, K, V],
// V contiguous, as its transposed view; the state_layout=kv kernels), "vk" or unset the V-major
// pool; the slot bytes, the calls and the copies they are compared with are the same.
// KJIT_GDN_BENCH_FUSED_CONV=1 adds the fused decode step's table (fused_conv_table: gdn_decode
// with options.conv against causal_conv1d_update + gdn_decode, and gdn_decode alone, W = 4,
// bf16 conv weights and pool, SiLU), "only" runs it alone.
//
//   bench_gdn_decode [results.jsonl]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "activity_timer.hpp"
#include "harness.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "ops/gdn_reference.hpp"
#include "support/numeric.hpp"

namespace {

using kjit::DType;
using kjit::TensorView;
using kjit::bench::check_floor;
using kjit::bench::DeviceBuffer;
using kjit::bench::floor_output;
using kjit::bench::FloorCandidate;
using kjit::bench::FloorSample;

constexpr std::int64_t kHeads = 16, kDim = 128;
constexpr std::size_t kRotationBytes = std::size_t{512} << 20;

/// KJIT_GDN_BENCH_STATE_LAYOUT=kv: pools are K-major (see the header).
bool k_major_pools() {
  static const bool k_major = [] {
    const char* env = std::getenv("KJIT_GDN_BENCH_STATE_LAYOUT");
    return env != nullptr && std::string(env) == "kv";
  }();
  return k_major;
}

/// A pool [slots, HV, V, K] of f32 at `data` (K = V = kDim), in the layout the bench runs: K
/// contiguous, or the transpose of contiguous [slots, HV, K, V] slots.
TensorView pool_at(void* data, std::int64_t slots, std::int64_t value_heads) {
  const std::int64_t slot = value_heads * kDim * kDim;
  return k_major_pools()
             ? TensorView::strided(data, DType::f32, {slots, value_heads, kDim, kDim},
                                   {slot, kDim * kDim, 1, kDim})
             : TensorView::contiguous(data, DType::f32, {slots, value_heads, kDim, kDim});
}

TensorView view(const DeviceBuffer& buffer, DType dtype, std::initializer_list<std::int64_t> shape,
                std::size_t byte_offset = 0) {
  return TensorView::contiguous(static_cast<char*>(buffer.get()) + byte_offset, dtype, shape);
}

template <typename T>
std::vector<T> download(const DeviceBuffer& buffer, std::size_t offset_bytes, std::size_t count) {
  std::vector<T> host(count);
  kjit::bench::check(kjit::bench::cu().cuCtxSynchronize(), "cuCtxSynchronize");
  kjit::bench::check(
      kjit::bench::cu().cuMemcpyDtoH(host.data(), buffer.ptr() + offset_bytes, count * sizeof(T)),
      "cuMemcpyDtoH");
  return host;
}

struct Result {
  bool ok = true;
  double max_err = 0;
};

/// One configuration to time: the planner's, or forced options.
struct Variant {
  std::string name = "planner";
  std::string mode;
  int bv = 0, stages = 0, blocks_per_sm = 0;
  std::string hints;
  kjit::GdnRowOrder order = kjit::GdnRowOrder::automatic;

  kjit::GdnDecodeOptions applied_to(kjit::GdnDecodeOptions options) const {
    options.force_mode = mode;
    options.force_bv = bv;
    options.force_stages = stages;
    options.force_blocks_per_sm = blocks_per_sm;
    options.force_cache_hints = hints;
    options.row_order = order;
    return options;
  }
};

std::vector<Variant> parse_variants(const char* text) {
  std::vector<Variant> variants;
  std::string all = text != nullptr && *text != '\0' ? text : "planner";
  std::size_t at = 0;
  while (at <= all.size()) {
    const std::size_t end = std::min(all.find(';', at), all.size());
    const std::string item = all.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    Variant v;
    v.name = item;
    const std::size_t colon = item.find(':');
    v.mode = item.substr(0, colon);
    if (v.mode == "planner") v.mode.clear();
    if (colon != std::string::npos) {
      std::string rest = item.substr(colon + 1);
      std::size_t pos = 0;
      while (pos < rest.size()) {
        const std::size_t comma = std::min(rest.find(',', pos), rest.size());
        const std::string kv = rest.substr(pos, comma - pos);
        pos = comma + 1;
        const std::size_t eq = kv.find('=');
        if (eq == std::string::npos) continue;
        const std::string key = kv.substr(0, eq);
        const int value = std::atoi(kv.c_str() + eq + 1);
        if (key == "hints") v.hints = kv.substr(eq + 1);
        if (key == "order") {
          v.order = kv.substr(eq + 1) == "slot"    ? kjit::GdnRowOrder::by_slot
                    : kv.substr(eq + 1) == "given" ? kjit::GdnRowOrder::as_given
                                                   : kjit::GdnRowOrder::automatic;
        }
        if (key == "bv") v.bv = value;
        if (key == "stages") v.stages = value;
        if (key == "bps") v.blocks_per_sm = value;
      }
    }
    variants.push_back(v);
  }
  return variants;
}

struct Row {
  std::int64_t value_heads, batch;
  std::vector<std::string> cells;
};

/// Runs one step on rotation 0 and compares sampled rows (out and their slots) with the
/// float64 reference.
Result verify(std::int64_t batch, std::int64_t value_heads, const DeviceBuffer& qkv,
              const DeviceBuffer& ab, const DeviceBuffer& params, const DeviceBuffer& pool,
              const DeviceBuffer& indices, const DeviceBuffer& out,
              const kjit::GdnDecodeOptions& options, kjit::bench::Gpu& gpu) {
  const std::int64_t width = 2 * kHeads * kDim + value_heads * kDim;
  const std::int64_t slot_elems = value_heads * kDim * kDim;
  const std::vector<std::int64_t> rows = {0, batch / 2, batch - 1};
  const auto slots = download<std::int32_t>(indices, 0, static_cast<std::size_t>(batch));
  // Host copies of the sampled rows, as a 3-row problem with slots 0..2.
  const std::int64_t n_rows = static_cast<std::int64_t>(rows.size());
  std::vector<std::uint16_t> h_qkv, h_a, h_b;
  std::vector<float> h_state, h_params = download<float>(params, 0, 2 * value_heads);
  for (std::int64_t n : rows) {
    auto q = download<std::uint16_t>(qkv, n * width * 2, width);
    h_qkv.insert(h_qkv.end(), q.begin(), q.end());
    auto a = download<std::uint16_t>(ab, n * value_heads * 2, value_heads);
    auto b = download<std::uint16_t>(ab, (batch + n) * value_heads * 2, value_heads);
    h_a.insert(h_a.end(), a.begin(), a.end());
    h_b.insert(h_b.end(), b.begin(), b.end());
    auto s = download<float>(pool, slots[n] * slot_elems * 4, slot_elems);
    h_state.insert(h_state.end(), s.begin(), s.end());
  }
  std::vector<std::int32_t> h_idx(rows.size());
  std::iota(h_idx.begin(), h_idx.end(), 0);
  std::vector<std::uint16_t> h_out(rows.size() * value_heads * kDim);

  kjit::gdn_decode(view(qkv, DType::bf16, {batch, width}),
                   view(ab, DType::bf16, {batch, value_heads}),
                   view(ab, DType::bf16, {batch, value_heads}, batch * value_heads * 2),
                   view(params, DType::f32, {value_heads}),
                   view(params, DType::f32, {value_heads}, value_heads * 4),
                   pool_at(pool.get(), std::int64_t(pool.bytes() / 4 / slot_elems), value_heads),
                   view(indices, DType::i32, {batch}),
                   view(out, DType::bf16, {batch, value_heads, kDim}), options, gpu.stream);
  gpu.synchronize();

  std::vector<double> want_out(h_out.size());
  kjit::reference::gdn_decode_reference(
      TensorView::contiguous(h_qkv.data(), DType::bf16, {n_rows, width}),
      TensorView::contiguous(h_a.data(), DType::bf16, {n_rows, value_heads}),
      TensorView::contiguous(h_b.data(), DType::bf16, {n_rows, value_heads}),
      TensorView::contiguous(h_params.data(), DType::f32, {value_heads}),
      TensorView::contiguous(h_params.data() + value_heads, DType::f32, {value_heads}),
      pool_at(h_state.data(), n_rows, value_heads),
      TensorView::contiguous(h_idx.data(), DType::i32, {n_rows}),
      TensorView::contiguous(h_out.data(), DType::bf16, {n_rows, value_heads, kDim}), options,
      want_out);
  Result result;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const std::int64_t n = rows[r];
    auto got = download<std::uint16_t>(out, n * value_heads * kDim * 2, value_heads * kDim);
    for (std::int64_t i = 0; i < value_heads * kDim; ++i) {
      const double g = kjit::support::bf16_to_float(got[i]);
      const double w = want_out[r * value_heads * kDim + i];
      const double err = std::fabs(g - w);
      result.max_err = std::max(result.max_err, err);
      if (!(err <= 2e-2 + 1e-2 * std::fabs(w))) result.ok = false;
    }
    auto state = download<float>(pool, slots[n] * slot_elems * 4, slot_elems);
    for (std::int64_t i = 0; i < slot_elems; ++i) {
      const double w = h_state[r * slot_elems + i];
      const double err = std::fabs(state[i] - w);
      if (!(err <= 1e-4 + 1e-4 * std::fabs(w))) result.ok = false;
    }
  }
  return result;
}

/// The floor kernels timed beside every serving cell: bench_slot_rmw shapes (rows per warp,
/// warps per block, pool cache hint), each given the call's slots as drawn and in ascending order
/// (gdn_decode visits them in slot order from 512 MiB of state; a floor may take the better
/// order for free). The floor of a cell is the fastest candidate that passed its check.
constexpr kjit::bench::FloorShape kFloorShapes[] = {
    {8, 1, "plain"}, {8, 1, "cs"}, {16, 1, "plain"}, {4, 4, "plain"}, {8, 1, "l2_256"}};

// KJIT_GDN_BENCH_SERVING=1 ("only": this table alone): a serving engine's pool holds more slots
// than the batch and the previous layer's kernels leave L2 full of their (dirty) data. HV = 32,
// pools 1x (each call a permutation of the whole pool, as the main table), 2x and 8x the batch
// with random distinct slots per call (16 draws, taken in turn), and
// 2x with each call's slots sorted; every call timed after an L2 flush ("flushed") and after
// 64 MiB of unrelated writes ("dirty"). GPU us and the ratio to a same-run cold copy of the
// bytes the call moves, each copy preceded by the same flush or writes (both leave dirty lines
// in L2 that the next kernel writes back; the JSON also has the ratio to the rotation copy).
// With KJIT_BENCH_CUPTI=1, B <= 32 at the 2x random pool also by kernel duration.
//
// A second table follows: each cell's floor, the same bytes moved with nothing else
// (bench_slot_rmw_kernel, templates/bench/bench.cuh: the call's state slots read and written back
// in place, qkv and the gates read, out written once, no arithmetic), timed right after the call
// under the same protocol on the same slot lists in the same turn (the draw of timed call i is
// the call's), in us and as floor us / kjit us: 1.000 or more means kjit moves the step's bytes
// as fast as the access pattern allows, below 1 by how much it does not. The floor is the
// fastest of kFloorShapes, each with the slots as drawn and in ascending order (not in the 2x
// sorted column, where they already are), and only of candidates that passed check_floor on
// that pool first (a failure is printed and fails the bench). JSON: floor_us, floor_ratio, the
// winner (floor_kernel), the fastest with the slots as drawn (floor_given_us) and every
// candidate's us.
bool serving_table(kjit::bench::Gpu& gpu, const kjit::GdnDecodeOptions& options, std::FILE* json,
                   kjit::bench::ActivityTimer* durations) {
  constexpr std::int64_t value_heads = 32, draws = 16;
  const std::int64_t width = 2 * kHeads * kDim + value_heads * kDim;
  const std::size_t slot_bytes = static_cast<std::size_t>(value_heads * kDim * kDim * 4);
  std::vector<kjit::bench::SlotRmw> floor_kernels;
  for (const kjit::bench::FloorShape& shape : kFloorShapes) {
    floor_kernels.emplace_back(gpu, shape.rows, shape.warps, shape.hint);
  }
  std::printf(
      "\nserving protocol: gdn_decode HV=32, median GPU us (ratio to a cold copy of the same "
      "bytes, flushed or dirtied before each copy as before each call)\n%6s | %-31s | %-31s | "
      "%-31s | %-31s\n%6s | %15s %15s | %15s %15s | %15s %15s | %15s %15s\n",
      "B", "pool 1x (a permutation)", "pool 2x, random slots", "pool 8x, random slots",
      "pool 2x, sorted slots", "", "flushed", "dirty", "flushed", "dirty", "flushed", "dirty",
      "flushed", "dirty");
  bool all_ok = true;
  std::string floor_table;
  for (std::int64_t batch : {1, 32, 256, 1024, 2048}) {
    DeviceBuffer qkv(static_cast<std::size_t>(batch * width * 2));
    DeviceBuffer ab(static_cast<std::size_t>(2 * batch * value_heads * 2));
    DeviceBuffer params(static_cast<std::size_t>(2 * value_heads * 4));
    DeviceBuffer out(static_cast<std::size_t>(batch * value_heads * kDim * 2));
    DeviceBuffer indices(static_cast<std::size_t>(draws * batch * 4));
    DeviceBuffer ascending_indices(indices.bytes());
    const std::uint64_t seed = 0x51a7u + static_cast<std::uint64_t>(batch);
    kjit::bench::fill_random(qkv, DType::bf16, qkv.bytes() / 2, seed);
    kjit::bench::fill_random(ab, DType::bf16, ab.bytes() / 2, seed + 1);
    kjit::bench::fill_random(params, DType::f32, params.bytes() / 4, seed + 2, 0.5);
    const TensorView v_qkv = view(qkv, DType::bf16, {batch, width});
    const TensorView v_a = view(ab, DType::bf16, {batch, value_heads});
    const TensorView v_b = view(ab, DType::bf16, {batch, value_heads},
                                static_cast<std::size_t>(batch * value_heads * 2));
    const TensorView v_alog = view(params, DType::f32, {value_heads});
    const TensorView v_dtb =
        view(params, DType::f32, {value_heads}, static_cast<std::size_t>(value_heads * 4));
    const TensorView v_out = view(out, DType::bf16, {batch, value_heads, kDim});
    const std::size_t moved =
        2 * slot_bytes * static_cast<std::size_t>(batch) +
        static_cast<std::size_t>(batch * width * 2 + 2 * batch * value_heads * 2 +
                                 batch * value_heads * kDim * 2);
    // The floor moves these bytes too: qkv and both gates (one buffer) read, out written. Its
    // output after the check's call (delta 1), from the inputs' words.
    kjit::SlotRmwParams floor_params{};
    floor_params.slot_bytes = slot_bytes;
    floor_params.inputs[0] = qkv.get();
    floor_params.input_bytes[0] = qkv.bytes();
    floor_params.inputs[1] = ab.get();
    floor_params.input_bytes[1] = ab.bytes();
    floor_params.output = out.get();
    floor_params.output_bytes = out.bytes();
    std::vector<std::uint32_t> want_floor_out;
    {
      auto words = download<std::uint32_t>(qkv, 0, qkv.bytes() / 4);
      const auto gates = download<std::uint32_t>(ab, 0, ab.bytes() / 4);
      words.insert(words.end(), gates.begin(), gates.end());
      want_floor_out = floor_output(words, out.bytes() / 4, 1);
    }
    // The copy reference meets L2 as each call does (a flush or dirtying writes before every
    // copy); the rotation copy of the main table is kept beside it in the JSON.
    const double copy_rotation = kjit::bench::copy_gbs(gpu, moved);
    const double copy_flushed = kjit::bench::copy_gbs(gpu, moved, kjit::bench::L2Protocol::flushed);
    const double copy_dirty = kjit::bench::copy_gbs(gpu, moved, kjit::bench::L2Protocol::dirty);
    std::printf("%6lld |", static_cast<long long>(batch));
    floor_table += fmt::format("{:6} |", batch);
    std::string durations_line, floor_failures;
    struct Layout {
      std::int64_t factor;
      bool sorted;
      const char* name;
    };
    for (const Layout layout : {Layout{1, false, "1x_random"}, Layout{2, false, "2x_random"},
                                Layout{8, false, "8x_random"}, Layout{2, true, "2x_sorted"}}) {
      const std::int64_t slots = layout.factor * batch;
      DeviceBuffer pool(static_cast<std::size_t>(slots) * slot_bytes);
      kjit::bench::fill_random(pool, DType::f32, pool.bytes() / 4, seed + 3, 0.1);
      std::vector<std::int32_t> all(static_cast<std::size_t>(slots)), picked;
      std::iota(all.begin(), all.end(), 0);
      std::mt19937_64 rng(seed + 4);
      for (std::int64_t d = 0; d < draws; ++d) {
        std::shuffle(all.begin(), all.end(), rng);
        const auto first = picked.size();
        picked.insert(picked.end(), all.begin(), all.begin() + batch);
        if (layout.sorted)
          std::sort(picked.begin() + static_cast<std::ptrdiff_t>(first), picked.end());
      }
      indices.upload(picked.data(), picked.size() * 4);
      const std::vector<std::int32_t> ascending = kjit::bench::sorted_per_list(picked, batch);
      ascending_indices.upload(ascending.data(), ascending.size() * 4);
      const TensorView pool_view = pool_at(pool.get(), slots, value_heads);
      const Result check =
          verify(batch, value_heads, qkv, ab, params, pool, indices, out, options, gpu);
      all_ok = all_ok && check.ok;

      // The floor candidates of this pool, each checked on the first slot list: three slots of
      // it and one it leaves alone (none in the 1x pool, where every call touches every slot).
      floor_params.pool = pool.get();
      std::vector<FloorSample> samples = kjit::bench::floor_samples(picked.data(), batch, slots);
      const auto snapshot = [&] { kjit::bench::snapshot_floor_samples(samples, pool, slot_bytes); };
      snapshot();
      std::vector<FloorCandidate> floors;
      for (const kjit::bench::SlotRmw& kernel : floor_kernels) {
        for (const bool in_order : {false, true}) {
          if (in_order && layout.sorted) continue;
          const FloorCandidate candidate{&kernel, in_order};
          kjit::SlotRmwParams first = floor_params;
          first.slots =
              static_cast<const std::int32_t*>((in_order ? ascending_indices : indices).get());
          const std::string why =
              check_floor(gpu, candidate, first, batch, pool, samples, out, want_floor_out);
          if (why.empty()) {
            floors.push_back(candidate);
          } else {
            floor_failures += fmt::format("FLOOR CHECK FAILED: B={} pool {} {}: {}\n", batch,
                                          layout.name, candidate.name(), why);
            all_ok = false;
            snapshot();  // a failed check may leave its + 1 behind: the next compares from here
          }
        }
      }

      // One step on the next of the `draws` slot lists (`call` counts the steps).
      std::int64_t call = 0;
      const auto step = [&](kjit::Stream stream) {
        kjit::gdn_decode(v_qkv, v_a, v_b, v_alog, v_dtb, pool_view,
                         view(indices, DType::i32, {batch},
                              static_cast<std::size_t>((call++ % draws) * batch * 4)),
                         v_out, options, stream);
      };
      for (const bool dirty : {false, true}) {
        const auto before_each = [&](kjit::Stream) {
          dirty ? kjit::bench::dirty_l2(gpu) : kjit::bench::flush_l2(gpu);
        };
        const std::int64_t first_call = call;
        const double us = kjit::bench::median_gpu_us(gpu, step, 100, 10, before_each);
        const double gbs = static_cast<double>(moved) / (us * 1e3);
        const double ratio = gbs / (dirty ? copy_dirty : copy_flushed);
        std::printf(" %8.2f (%.2f)%s", us, ratio, check.ok ? "" : "!");
        // The floor on the slot lists the step's timed calls had, in the same turn.
        kjit::bench::FloorBest best;
        for (const FloorCandidate& candidate : floors) {
          std::int64_t floor_call = first_call;
          const DeviceBuffer& lists = candidate.ascending ? ascending_indices : indices;
          const double candidate_us = kjit::bench::median_gpu_us(
              gpu,
              [&](kjit::Stream stream) {
                kjit::SlotRmwParams p = floor_params;
                p.slots = reinterpret_cast<const std::int32_t*>(
                    static_cast<const char*>(lists.get()) + (floor_call++ % draws) * batch * 4);
                candidate.kernel->launch(stream, p, static_cast<std::size_t>(batch));
              },
              100, 10, before_each);
          best.add(candidate, candidate_us);
        }
        const double floor_us = best.us;
        floor_table += floor_us > 0 ? fmt::format(" {:8.2f} ({:.3f})", floor_us, floor_us / us)
                                    : fmt::format(" {:>16}", "no floor");
        if (json != nullptr) {
          std::fprintf(json,
                       "{\"op\":\"gdn_decode_serving\",\"state_layout\":\"%s\",\"HV\":32,"
                       "\"B\":%lld,\"pool\":\"%s\","
                       "\"l2\":\"%s\",\"us\":%.3f,\"copy_ratio\":%.4f,"
                       "\"copy_ratio_rotation\":%.4f,\"check\":%s,\"floor_us\":%.3f,"
                       "\"floor_ratio\":%.4f,\"floor_kernel\":\"%s\",\"floor_given_us\":%.3f,"
                       "\"floor_candidates\":{%s}}\n",
                       k_major_pools() ? "kv" : "vk", static_cast<long long>(batch), layout.name,
                       dirty ? "dirty" : "flushed", us, ratio, gbs / copy_rotation,
                       check.ok ? "true" : "false", floor_us, floor_us > 0 ? floor_us / us : -1.0,
                       best.kernel.c_str(), best.given_us, best.candidates_json.c_str());
        }
      }
      std::printf(" |");
      floor_table += " |";
      std::fflush(stdout);
      // Calls this small are below the event pairs' floor: with KJIT_BENCH_CUPTI=1 the 2x random
      // pool is also timed by kernel duration under both protocols (the flush and the dirtying
      // writes are memsets, outside the records).
      if (durations != nullptr && batch <= 32 && layout.factor == 2 && !layout.sorted) {
        double by_protocol[2] = {-1, -1};
        for (const bool dirty : {false, true}) {
          by_protocol[dirty ? 1 : 0] =
              durations
                  ->median_us(
                      gpu,
                      [&](kjit::Stream stream) {
                        dirty ? kjit::bench::dirty_l2(gpu) : kjit::bench::flush_l2(gpu);
                        step(stream);
                      },
                      50, "gdn_decode_kernel")
                  .value_or(-1);
        }
        durations_line = fmt::format(
            "       B={} pool 2x random, kernel durations (CUPTI): flushed {:.2f} us, dirty {:.2f} "
            "us\n",
            batch, by_protocol[0], by_protocol[1]);
      }
    }
    std::printf(" copy GB/s: rotation %.0f, flushed %.0f, dirty %.0f\n", copy_rotation,
                copy_flushed, copy_dirty);
    std::printf("%s%s", durations_line.c_str(), floor_failures.c_str());
    floor_table += "\n";
  }
  std::printf(
      "\nslot read-modify-write floor of each cell above: the same bytes moved with nothing else "
      "(bench_slot_rmw on the calls' slot lists, same protocol; best of %zu kernel shapes x slots "
      "as drawn / ascending), median GPU us (floor us / kjit us; >= 1.000: kjit at the floor)\n%6s "
      "| %-33s | %-33s | %-33s | "
      "%-33s\n%6s | %16s %16s | %16s %16s | %16s %16s | %16s %16s\n%s",
      std::size(kFloorShapes), "B", "pool 1x (a permutation)", "pool 2x, random slots",
      "pool 8x, random slots", "pool 2x, sorted slots", "", "flushed", "dirty", "flushed", "dirty",
      "flushed", "dirty", "flushed", "dirty", floor_table.c_str());
  return all_ok;
}

// KJIT_GDN_BENCH_FUSED_CONV=1 ("only": this table alone): issue 22's fused decode step. HV = 32,
// H = 16, K = V = 128, W = 4, bf16 mixed_qkv / weights / conv pool, f32 state pool, SiLU, at
// B = 1, 4, 16, 64 and 256; median GPU us (cold: L2 flushed once, both pools rotated through >= 512
// MB of state slots as the main table does) of gdn_decode alone (on an already convolved
// mixed_qkv), the two-kernel sequence (kjit's causal_conv1d_update into a conv-output buffer, then
// gdn_decode on it) and the fused step, beside an empty kernel. Before timing, the sequence and
// the fused step run once on identical copies of both pools: the conv pools must be bytewise
// equal and out / the state of the sampled rows within rounding ("check"). The target:
// the fused step at B = 1 no slower than gdn_decode alone + 1 us. KJIT_GDN_BENCH_FUSED_CLUSTERS
// (e.g. "1,2,4,8") times the fused step with each forced cluster size too (options.conv->
// force_cluster, each checked the same way; a size the planner refuses prints why), and
// KJIT_GDN_BENCH_FUSED_STAGES (e.g. "1,2,3,4") each state ring (options.conv->force_stages).
bool fused_conv_table(kjit::bench::Gpu& gpu, const kjit::GdnDecodeOptions& base,
                      kjit::bench::ActivityTimer* durations, std::FILE* json) {
  constexpr std::int64_t value_heads = 32, conv_width = 4;
  const std::int64_t width = 2 * kHeads * kDim + value_heads * kDim;
  const std::size_t slot_bytes = static_cast<std::size_t>(value_heads * kDim * kDim * 4);
  const std::size_t conv_slot_bytes = static_cast<std::size_t>(width * (conv_width - 1) * 2);
  const double empty_us = kjit::bench::empty_kernel_us(gpu);
  std::printf(
      "\nfused decode step (gdn_decode + options.conv) HV=32 H=16 K=V=128 W=4 bf16, f32 state; "
      "median GPU us, cold; empty kernel %.2f us\n%6s | %12s | %18s | %12s | %8s | %s\n",
      empty_us, "B", "gdn_decode", "conv + gdn_decode", "fused", "check", "fused vs alone + 1 us");
  // KJIT_GDN_BENCH_FUSED_CLUSTERS="1,2,4,8": also each forced cluster size at every batch;
  // KJIT_GDN_BENCH_FUSED_STAGES="1,2,3,4": each forced state ring (options.conv->force_stages).
  const auto int_list = [](const char* name) {
    std::vector<int> values;
    if (const char* list = std::getenv(name)) {
      for (const char* at = list; *at != '\0';) {
        char* end = nullptr;
        const long value = std::strtol(at, &end, 10);
        if (end == at) break;
        values.push_back(static_cast<int>(value));
        at = *end == ',' ? end + 1 : end;
      }
    }
    return values;
  };
  struct Forced {
    const char* option;
    int value;
  };
  std::vector<Forced> forced_variants;
  for (int cluster : int_list("KJIT_GDN_BENCH_FUSED_CLUSTERS")) {
    forced_variants.push_back({"force_cluster", cluster});
  }
  for (int stages : int_list("KJIT_GDN_BENCH_FUSED_STAGES")) {
    forced_variants.push_back({"force_stages", stages});
  }
  bool all_ok = true;
  for (std::int64_t batch : {1, 4, 16, 64, 256}) {
    const std::size_t step_bytes = slot_bytes * static_cast<std::size_t>(batch);
    const std::int64_t rotations =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(kRotationBytes / step_bytes));
    const std::int64_t slots = rotations * batch;
    DeviceBuffer x(static_cast<std::size_t>(batch * width * 2));
    DeviceBuffer y(static_cast<std::size_t>(batch * width * 2));
    DeviceBuffer ab(static_cast<std::size_t>(2 * batch * value_heads * 2));
    DeviceBuffer params(static_cast<std::size_t>(2 * value_heads * 4));
    DeviceBuffer weight(static_cast<std::size_t>(width * (conv_width + 1) * 2));
    DeviceBuffer indices(static_cast<std::size_t>(slots * 4));
    DeviceBuffer out_seq(static_cast<std::size_t>(batch * value_heads * kDim * 2));
    DeviceBuffer out_fused(static_cast<std::size_t>(batch * value_heads * kDim * 2));
    // Pools "a" (sequence, gdn_decode alone) and "b" (fused): the same contents to begin with.
    DeviceBuffer pool_a(static_cast<std::size_t>(slots) * slot_bytes);
    DeviceBuffer pool_b(static_cast<std::size_t>(slots) * slot_bytes);
    DeviceBuffer conv_a(static_cast<std::size_t>(slots) * conv_slot_bytes);
    DeviceBuffer conv_b(static_cast<std::size_t>(slots) * conv_slot_bytes);
    const std::uint64_t seed = 0xf0c5u + static_cast<std::uint64_t>(batch);
    kjit::bench::fill_random(x, DType::bf16, x.bytes() / 2, seed);
    kjit::bench::fill_random(ab, DType::bf16, ab.bytes() / 2, seed + 1);
    kjit::bench::fill_random(params, DType::f32, params.bytes() / 4, seed + 2, 0.5);
    kjit::bench::fill_random(weight, DType::bf16, weight.bytes() / 2, seed + 3, 0.5);
    for (DeviceBuffer* pool : {&pool_a, &pool_b}) {
      kjit::bench::fill_random(*pool, DType::f32, pool->bytes() / 4, seed + 4, 0.1);
    }
    for (DeviceBuffer* pool : {&conv_a, &conv_b}) {
      kjit::bench::fill_random(*pool, DType::bf16, pool->bytes() / 2, seed + 5);
    }
    std::vector<std::int32_t> perm(static_cast<std::size_t>(slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed + 6));
    indices.upload(perm.data(), perm.size() * 4);

    auto indices_for = [&](std::int64_t rotation) {
      return view(indices, DType::i32, {batch}, static_cast<std::size_t>(rotation * batch * 4));
    };
    const TensorView v_x = view(x, DType::bf16, {batch, width});
    const TensorView v_y = view(y, DType::bf16, {batch, width});
    const TensorView v_a = view(ab, DType::bf16, {batch, value_heads});
    const TensorView v_b = view(ab, DType::bf16, {batch, value_heads},
                                static_cast<std::size_t>(batch * value_heads * 2));
    const TensorView v_alog = view(params, DType::f32, {value_heads});
    const TensorView v_dtb =
        view(params, DType::f32, {value_heads}, static_cast<std::size_t>(value_heads * 4));
    const TensorView v_weight = view(weight, DType::bf16, {width, conv_width});
    const TensorView v_bias =
        view(weight, DType::bf16, {width}, static_cast<std::size_t>(width * conv_width * 2));
    const TensorView v_out_seq = view(out_seq, DType::bf16, {batch, value_heads, kDim});
    const TensorView v_out_fused = view(out_fused, DType::bf16, {batch, value_heads, kDim});
    const TensorView v_pool_a = pool_at(pool_a.get(), slots, value_heads);
    const TensorView v_pool_b = pool_at(pool_b.get(), slots, value_heads);
    const TensorView v_conv_a = view(conv_a, DType::bf16, {slots, width, conv_width - 1});
    const TensorView v_conv_b = view(conv_b, DType::bf16, {slots, width, conv_width - 1});
    kjit::CausalConv1dOptions conv_options;
    conv_options.activation = kjit::ConvActivation::silu;
    conv_options.runtime = base.runtime;
    conv_options.device = base.device;
    kjit::GdnDecodeOptions fused = base;
    fused.conv = kjit::GdnDecodeConv{v_weight, v_bias, v_conv_b, kjit::ConvActivation::silu};

    const auto sequence = [&](std::int64_t rotation, kjit::Stream stream) {
      kjit::causal_conv1d_update(v_x, v_weight, v_bias, v_conv_a, indices_for(rotation),
                                 TensorView{}, v_y, conv_options, stream);
      kjit::gdn_decode(v_y, v_a, v_b, v_alog, v_dtb, v_pool_a, indices_for(rotation), v_out_seq,
                       base, stream);
    };
    const auto fused_step_with = [&](const kjit::GdnDecodeOptions& options, std::int64_t rotation,
                                     kjit::Stream stream) {
      kjit::gdn_decode(v_x, v_a, v_b, v_alog, v_dtb, v_pool_b, indices_for(rotation), v_out_fused,
                       options, stream);
    };
    const auto fused_step = [&](std::int64_t rotation, kjit::Stream stream) {
      fused_step_with(fused, rotation, stream);
    };

    // Check: one call of the sequence and one of the fused step (with `options`) on identical
    // pools (b made a copy of a first): conv pools bytewise, out and sampled state rows within
    // rounding.
    const auto check_fused = [&](const kjit::GdnDecodeOptions& options, double* max_err) {
      for (auto [from, to] : {std::pair{&pool_a, &pool_b}, std::pair{&conv_a, &conv_b}}) {
        kjit::bench::check(kjit::bench::cu().cuMemcpyDtoDAsync(to->ptr(), from->ptr(),
                                                               from->bytes(), gpu.cu_stream()),
                           "cuMemcpyDtoDAsync");
      }
      sequence(0, gpu.stream);
      fused_step_with(options, 0, gpu.stream);
      gpu.synchronize();
      bool same = download<std::uint8_t>(conv_a, 0, conv_a.bytes()) ==
                  download<std::uint8_t>(conv_b, 0, conv_b.bytes());
      *max_err = 0;
      const auto got = download<std::uint16_t>(out_fused, 0, out_fused.bytes() / 2);
      const auto want = download<std::uint16_t>(out_seq, 0, out_seq.bytes() / 2);
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double g = kjit::support::bf16_to_float(got[i]);
        const double w = kjit::support::bf16_to_float(want[i]);
        *max_err = std::max(*max_err, std::fabs(g - w));
        if (!(std::fabs(g - w) <= 2e-2 + 1e-2 * std::fabs(w))) same = false;
      }
      for (std::int64_t n : {std::int64_t{0}, batch - 1}) {
        const std::size_t at =
            static_cast<std::size_t>(perm[static_cast<std::size_t>(n)]) * slot_bytes;
        const auto sa = download<float>(pool_a, at, slot_bytes / 4);
        const auto sb = download<float>(pool_b, at, slot_bytes / 4);
        for (std::size_t i = 0; i < sa.size(); ++i) {
          if (!(std::fabs(sa[i] - sb[i]) <= 1e-4 + 1e-4 * std::fabs(sa[i]))) same = false;
        }
      }
      return same;
    };
    double max_err = 0;
    const bool ok = check_fused(fused, &max_err);
    all_ok = all_ok && ok;

    std::int64_t call = 0;
    kjit::bench::flush_l2(gpu);
    const double alone_us = kjit::bench::median_gpu_us(gpu, [&](kjit::Stream stream) {
      kjit::gdn_decode(v_y, v_a, v_b, v_alog, v_dtb, v_pool_a, indices_for(call++ % rotations),
                       v_out_seq, base, stream);
    });
    kjit::bench::flush_l2(gpu);
    const double seq_us = kjit::bench::median_gpu_us(
        gpu, [&](kjit::Stream stream) { sequence(call++ % rotations, stream); });
    kjit::bench::flush_l2(gpu);
    const double fused_us = kjit::bench::median_gpu_us(
        gpu, [&](kjit::Stream stream) { fused_step(call++ % rotations, stream); });
    const bool target = fused_us <= alone_us + 1.0;
    std::printf("%6lld | %12.2f | %18.2f | %12.2f | %8s | %s (%+.2f us)\n",
                static_cast<long long>(batch), alone_us, seq_us, fused_us, ok ? "ok" : "FAILED",
                batch == 1 ? (target ? "met" : "MISSED") : "-", fused_us - alone_us);
    if (batch == 1 && durations != nullptr) {
      const auto timed = durations->beside_empty_and_copy(
          gpu, [&](kjit::Stream stream) { fused_step(call++ % rotations, stream); },
          "gdn_decode_conv_kernel", 2 * step_bytes);
      const auto alone = durations->beside_empty_and_copy(
          gpu,
          [&](kjit::Stream stream) {
            kjit::gdn_decode(v_y, v_a, v_b, v_alog, v_dtb, v_pool_a,
                             indices_for(call++ % rotations), v_out_seq, base, stream);
          },
          "gdn_decode_kernel", 2 * step_bytes);
      std::printf(
          "B=1 kernel durations (CUPTI): fused %.2f us, gdn_decode alone %.2f us, empty kernel "
          "%.2f us\n",
          timed.call, alone.call, timed.empty);
    }
    // B = 1 by kernel duration: what an empty kernel of a fused plan's grid costs with and
    // without its clusters (where the fused step's time over gdn_decode alone goes).
    const auto empty_in_shape = [&](const kjit::GdnDecodeOptions& options) {
      if (batch != 1 || durations == nullptr) return;
      const kjit::LaunchShape shape =
          kjit::plan_gdn_decode(v_x, v_a, v_b, v_alog, v_dtb, v_pool_b, indices_for(0), v_out_fused,
                                options, gpu.limits)
              .launches.front()
              .shape;
      kjit::LaunchShape plain = shape;
      plain.cluster = kjit::Dim3{1, 1, 1};
      const auto shaped_empty_us = [&](const kjit::LaunchShape& s) {
        return durations
            ->median_us(
                gpu, [&](kjit::Stream) { gpu.launch_empty(s); }, 50, "bench_kernel")
            .value_or(-1);
      };
      std::printf(
          "         empty kernel of grid %u x %u threads (CUPTI): %.2f us unclustered, "
          "%.2f us in clusters of %u\n",
          shape.grid.x, shape.block.x, shaped_empty_us(plain), shaped_empty_us(shape),
          shape.cluster.x);
    };
    empty_in_shape(fused);
    // The fused step with each forced cluster size (KJIT_GDN_BENCH_FUSED_CLUSTERS) and state
    // ring (KJIT_GDN_BENCH_FUSED_STAGES), each checked like the planner's first: where the
    // planner's rules should switch.
    for (const Forced& variant : forced_variants) {
      kjit::GdnDecodeOptions forced = fused;
      const bool by_cluster = std::string(variant.option) == "force_cluster";
      (by_cluster ? forced.conv->force_cluster : forced.conv->force_stages) = variant.value;
      try {
        kjit::plan_gdn_decode(v_x, v_a, v_b, v_alog, v_dtb, v_pool_b, indices_for(0), v_out_fused,
                              forced, gpu.limits);
      } catch (const kjit::PlanError& error) {
        std::printf("%6s   %s=%d skipped: %s\n", "", variant.option, variant.value, error.what());
        continue;
      }
      double forced_err = 0;
      const bool forced_ok = check_fused(forced, &forced_err);
      all_ok = all_ok && forced_ok;
      kjit::bench::flush_l2(gpu);
      const double forced_us = kjit::bench::median_gpu_us(
          gpu, [&](kjit::Stream stream) { fused_step_with(forced, call++ % rotations, stream); });
      std::printf("%6s   %s=%d: fused %.2f us (x%.3f of the planner's), %s\n", "", variant.option,
                  variant.value, forced_us, fused_us / forced_us, forced_ok ? "ok" : "FAILED");
      if (batch == 1 && durations != nullptr) {
        const double forced_duration =
            durations
                ->median_us(
                    gpu,
                    [&](kjit::Stream stream) {
                      fused_step_with(forced, call++ % rotations, stream);
                    },
                    50, "gdn_decode_conv_kernel")
                .value_or(-1);
        std::printf("%6s   %s=%d: kernel duration (CUPTI) %.2f us\n", "", variant.option,
                    variant.value, forced_duration);
        empty_in_shape(forced);
      }
      if (json != nullptr) {
        std::fprintf(json,
                     "{\"op\":\"gdn_decode_fused_conv\",\"B\":%lld,\"%s\":%d,"
                     "\"fused_us\":%.3f,\"planner_fused_us\":%.3f,\"check\":%s,"
                     "\"max_err\":%.3e}\n",
                     static_cast<long long>(batch), variant.option, variant.value, forced_us,
                     fused_us, forced_ok ? "true" : "false", forced_err);
      }
    }
    std::fflush(stdout);
    if (json != nullptr) {
      std::fprintf(json,
                   "{\"op\":\"gdn_decode_fused_conv\",\"H\":16,\"HV\":32,\"K\":128,\"V\":128,"
                   "\"W\":4,\"B\":%lld,\"alone_us\":%.3f,\"sequence_us\":%.3f,"
                   "\"fused_us\":%.3f,\"empty_us\":%.3f,\"check\":%s,\"max_err\":%.3e}\n",
                   static_cast<long long>(batch), alone_us, seq_us, fused_us, empty_us,
                   ok ? "true" : "false", max_err);
    }
  }
  return all_ok;
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
  kjit::GdnDecodeOptions base;
  base.runtime = &gpu->runtime();
  base.device = gpu->device;
  const std::vector<Variant> variants = parse_variants(std::getenv("KJIT_GDN_BENCH_VARIANTS"));
  const char* slot_order = std::getenv("KJIT_GDN_BENCH_SLOTS");
  const bool sorted_slots = slot_order != nullptr && std::string(slot_order) == "sorted";
  // KJIT_BENCH_CUPTI=1: B = 1 also by kernel duration (bench/activity_timer.hpp).
  kjit::bench::ActivityTimer* const durations = kjit::bench::ActivityTimer::requested();
  const char* fused_conv = std::getenv("KJIT_GDN_BENCH_FUSED_CONV");
  if (fused_conv != nullptr && std::string(fused_conv) == "only") {
    const bool ok = fused_conv_table(*gpu, base, durations, json);
    if (json != nullptr) std::fclose(json);
    return ok ? 0 : 1;
  }
  const char* serving = std::getenv("KJIT_GDN_BENCH_SERVING");
  if (serving != nullptr && std::string(serving) == "only") {
    bool ok = true;
    for (const Variant& variant : variants) {
      std::printf("\nvariant %s", variant.name.c_str());
      ok = serving_table(*gpu, variant.applied_to(base), json, durations) && ok;
    }
    if (json != nullptr) std::fclose(json);
    return ok ? 0 : 1;
  }
  std::vector<Row> rows;
  std::printf("gdn_decode H=16 K=V=128 bf16 qkv, f32 state (%s); median GPU us of %s; slots %s\n",
              k_major_pools() ? "K-major pools, state_layout=kv" : "V-major pools",
              "cold calls (L2 flushed, pools rotated)",
              sorted_slots ? "ascending within each call" : "a random permutation");
  bool all_ok = true;
  for (std::int64_t value_heads : {32, 64}) {
    for (std::int64_t batch : {1, 8, 32, 256, 1024, 2048}) {
      const std::int64_t width = 2 * kHeads * kDim + value_heads * kDim;
      const std::size_t slot_bytes = static_cast<std::size_t>(value_heads * kDim * kDim * 4);
      const std::size_t step_bytes = slot_bytes * static_cast<std::size_t>(batch);
      const std::int64_t rotations =
          std::max<std::int64_t>(1, static_cast<std::int64_t>(kRotationBytes / step_bytes));
      const std::int64_t slots = rotations * batch;

      DeviceBuffer qkv(static_cast<std::size_t>(batch * width * 2));
      DeviceBuffer ab(static_cast<std::size_t>(2 * batch * value_heads * 2));
      DeviceBuffer params(static_cast<std::size_t>(2 * value_heads * 4));
      DeviceBuffer pool(static_cast<std::size_t>(slots) * slot_bytes);
      DeviceBuffer indices(static_cast<std::size_t>(slots * 4));
      DeviceBuffer out(static_cast<std::size_t>(batch * value_heads * kDim * 2));
      const std::uint64_t seed = 0x9d2c5680u + static_cast<std::uint64_t>(batch * value_heads);
      kjit::bench::fill_random(qkv, DType::bf16, qkv.bytes() / 2, seed);
      kjit::bench::fill_random(ab, DType::bf16, ab.bytes() / 2, seed + 1);
      kjit::bench::fill_random(params, DType::f32, params.bytes() / 4, seed + 2, 0.5);
      kjit::bench::fill_random(pool, DType::f32, pool.bytes() / 4, seed + 3, 0.1);
      std::vector<std::int32_t> perm(static_cast<std::size_t>(slots));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937_64(seed + 4));
      if (sorted_slots) {
        for (std::int64_t r = 0; r < rotations; ++r) {
          std::sort(perm.begin() + r * batch, perm.begin() + (r + 1) * batch);
        }
      }
      indices.upload(perm.data(), perm.size() * 4);

      const TensorView pool_view = pool_at(pool.get(), slots, value_heads);
      auto views_for = [&](std::int64_t rotation) {
        return view(indices, DType::i32, {batch}, static_cast<std::size_t>(rotation * batch * 4));
      };
      const TensorView v_qkv = view(qkv, DType::bf16, {batch, width});
      const TensorView v_a = view(ab, DType::bf16, {batch, value_heads});
      const TensorView v_b = view(ab, DType::bf16, {batch, value_heads},
                                  static_cast<std::size_t>(batch * value_heads * 2));
      const TensorView v_alog = view(params, DType::f32, {value_heads});
      const TensorView v_dtb =
          view(params, DType::f32, {value_heads}, static_cast<std::size_t>(value_heads * 4));
      const TensorView v_out = view(out, DType::bf16, {batch, value_heads, kDim});

      std::int64_t call = 0;
      const std::size_t moved =
          2 * step_bytes +
          static_cast<std::size_t>(batch * width * 2 + 2 * batch * value_heads * 2 +
                                   batch * value_heads * kDim * 2);
      const int reps = moved > (std::size_t{1} << 30) ? 50 : 100;
      const double copy = kjit::bench::copy_gbs(*gpu, moved);
      Row row{value_heads, batch, {}};
      for (const Variant& variant : variants) {
        const kjit::GdnDecodeOptions options = variant.applied_to(base);
        kjit::Plan plan;
        try {
          plan = kjit::plan_gdn_decode(v_qkv, v_a, v_b, v_alog, v_dtb, pool_view, views_for(0),
                                       v_out, options, gpu->limits);
        } catch (const kjit::Error& error) {
          std::printf("HV=%2lld B=%4lld  %-28s  not planned: %s\n",
                      static_cast<long long>(value_heads), static_cast<long long>(batch),
                      variant.name.c_str(), error.what());
          row.cells.push_back("-");
          continue;
        }
        const kjit::KernelSpec& spec = plan.launches.back().spec;
        const Result check =
            verify(batch, value_heads, qkv, ab, params, pool, indices, out, options, *gpu);
        all_ok = all_ok && check.ok;

        kjit::bench::flush_l2(*gpu);
        const double us = kjit::bench::median_gpu_us(
            *gpu,
            [&](kjit::Stream stream) {
              kjit::gdn_decode(v_qkv, v_a, v_b, v_alog, v_dtb, pool_view,
                               views_for(call++ % rotations), v_out, options, stream);
            },
            reps);
        // Host cost: back-to-back calls without sync, wall time / count (the GPU queue absorbs
        // them; the plan is memoized by now).
        constexpr int kHostCalls = 20;
        gpu->synchronize();
        const auto host_start = std::chrono::steady_clock::now();
        for (int i = 0; i < kHostCalls; ++i) {
          kjit::gdn_decode(v_qkv, v_a, v_b, v_alog, v_dtb, pool_view, views_for(call++ % rotations),
                           v_out, options, gpu->stream);
        }
        const auto host_stop = std::chrono::steady_clock::now();
        gpu->synchronize();
        const double host_us =
            std::chrono::duration<double, std::micro>(host_stop - host_start).count() / kHostCalls;
        if (batch == 1 && durations != nullptr) {
          // Kernel durations (CUPTI) beside an empty kernel and a copy of the same bytes.
          const auto timed = durations->beside_empty_and_copy(
              *gpu,
              [&](kjit::Stream stream) {
                kjit::gdn_decode(v_qkv, v_a, v_b, v_alog, v_dtb, pool_view,
                                 views_for(call++ % rotations), v_out, options, stream);
              },
              "gdn_decode_kernel", moved);
          std::printf(
              "HV=%2lld B=1 kernel durations (CUPTI, %zu launch(es)): step %.2f us, empty kernel "
              "%.2f us, copy of the same bytes %.2f us\n",
              static_cast<long long>(value_heads), plan.launches.size(), timed.call, timed.empty,
              timed.copy);
        }
        const double gbs = static_cast<double>(moved) / (us * 1e3);
        const kjit::Dim3 grid = plan.launches.back().shape.grid;
        const std::string line = fmt::format(
            "HV={:>2} B={:>4}  {:<28}  {:>9.2f} us  {:>7.1f} GB/s  copy {:>7.1f} GB/s  ratio "
            "{:.3f}  mode={} bv={} warps={} stages={} bps={} grid={}x{}x{}  check={} (max err "
            "{:.2e}) ordered={} host {:.1f} us",
            value_heads, batch, variant.name, us, gbs, copy, gbs / copy, plan.mode, spec.get("bv"),
            spec.get("warps"), spec.get("stages"), spec.get("min_blocks"), grid.x, grid.y, grid.z,
            check.ok ? "ok" : "FAILED", check.max_err, spec.get("ordered"), host_us);
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
        row.cells.push_back(fmt::format("{:.2f}/{:.3f}{}", us, gbs / copy, check.ok ? "" : "!"));
        if (json != nullptr) {
          std::fprintf(
              json,
              "{\"op\":\"gdn_decode\",\"variant\":\"%s\",\"state_layout\":\"%s\",\"H\":16,"
              "\"HV\":%lld,\"B\":%lld,"
              "\"K\":128,\"V\":128,\"qkv\":\"bf16\",\"state\":\"f32\",\"us\":%.3f,"
              "\"gbs\":%.1f,\"copy_gbs\":%.1f,\"ratio\":%.4f,\"bytes\":%zu,\"mode\":\"%s\","
              "\"spec\":\"%s\",\"check\":%s,\"max_err\":%.3e,\"host_us\":%.2f}\n",
              variant.name.c_str(), k_major_pools() ? "kv" : "vk",
              static_cast<long long>(value_heads), static_cast<long long>(batch), us, gbs, copy,
              gbs / copy, moved, plan.mode.c_str(), spec.str().c_str(), check.ok ? "true" : "false",
              check.max_err, host_us);
        }
      }
      rows.push_back(std::move(row));
    }
  }
  // Summary: median us / ratio to the same-run copy, one column per variant.
  std::printf("\nsummary (us/ratio; ! = check failed)\n%-12s", "shape");
  for (const Variant& variant : variants) std::printf(" | %s", variant.name.c_str());
  std::printf("\n");
  for (const Row& row : rows) {
    std::printf("HV=%-2lld B=%-4lld", static_cast<long long>(row.value_heads),
                static_cast<long long>(row.batch));
    for (const std::string& cell : row.cells) std::printf(" | %s", cell.c_str());
    std::printf("\n");
  }
  if (kjit::bench::env_is_one("KJIT_GDN_BENCH_SERVING")) {
    all_ok = serving_table(*gpu, base, json, durations) && all_ok;
  }
  if (kjit::bench::env_is_one("KJIT_GDN_BENCH_FUSED_CONV")) {
    all_ok = fused_conv_table(*gpu, base, durations, json) && all_ok;
  }
  if (json != nullptr) std::fclose(json);
  return all_ok ? 0 : 1;
}
