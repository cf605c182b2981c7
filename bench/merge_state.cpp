// SPDX-License-Identifier: Apache-2.0
// merge_state benchmark (method: shared/BENCHMARKING.md). bf16, D in {64,128,256,512},
// H in {8,32,64,128,256}, T in {1,64,4096,16384}: median GPU us, GB/s, ratio to a same-size
// device copy, the mode the planner chose; every shape is first checked against the float64
// reference on sampled rows. Inputs rotate through >= 512 MB of buffers so timed calls read
// cold data.
//
// KJIT_MERGE_BENCH_DIRTY=1: each shape also timed with 64 MiB of unrelated writes before every
// call, leaving L2 dirty as a serving engine's previous kernels do. KJIT_BENCH_CUPTI=1: T = 1
// shapes also by kernel duration beside an empty kernel and a copy (bench/activity_timer.hpp),
// and, with an anchor, the anchor and kjit at T <= 64 by kernel duration under three L2 states
// (warm, flushed, dirtied before each call).
// KJIT_MERGE_BENCH_SHAPES=DxHxT,...: only those shapes of the table (e.g. 512x128x4096).
// KJIT_MERGE_BENCH_MODES=m1,m2,...: time these forced modes beside the planner's on each shape
// (options.force_mode, suffixes included: e.g. token_major:c1,flat:c1:t128); implies --modes.
//
// KJIT_MERGE_ANCHOR_LIB=<library>: an anchor merge kernel (MergeAnchor below, e.g. vLLM's CUDA
// merge_attn_states built outside the repository) timed beside kjit on each shape, on the same
// inputs and protocol (L2 flushed; also L2 dirty with KJIT_MERGE_BENCH_DIRTY=1). It takes vLLM's
// layout (LSE [H, T], natural log), so kjit runs once more in that layout (lse_layout
// head_major, base e) on the same buffers, under the planner's plan and each forced mode; the
// ratio anchor/kjit is between runs in that layout, and the anchor's output is checked against
// each of kjit's (a mismatch fails the run). KJIT_MERGE_BENCH_ANCHOR_PASSES=N repeats the
// anchor and kjit in turn N times per shape (the spread between passes of one kernel).
//
//   bench_merge_state [out.jsonl] [--modes]   (--modes: also time every forced grid mode)
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

// kjit/types.hpp before harness.hpp: GCC's -Wshadow otherwise reports DType's i32 / i64
// enumerators as shadowing kjit::i32 / kjit::i64 of templates/common/types.h.
#include "kjit/types.hpp"
// (keep this order)
#include "activity_timer.hpp"
#include "anchor_library.hpp"
#include "harness.hpp"
#include "kjit/error.hpp"
#include "kjit/ops/merge_state.hpp"
#include "ops/merge_state_reference.hpp"
#include "support/numeric.hpp"

namespace {

using kjit::DType;
using kjit::TensorView;

constexpr std::size_t kPoolBytes = std::size_t{512} << 20;
constexpr std::size_t kAlign = 256;

std::size_t round_up(std::size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

/// One problem size laid out as `slots` copies of (v_a, v_b, v_out) in one pool and
/// (s_a, s_b, s_out) in another; call i uses a slot far from call i-1's.
struct Pools {
  std::int64_t t, h, d;
  std::size_t v_bytes, s_bytes, slots;
  kjit::bench::DeviceBuffer v_pool, s_pool;

  Pools(std::int64_t tokens, std::int64_t heads, std::int64_t dim, std::size_t v_tensor,
        std::size_t s_tensor, std::size_t n)
      : t(tokens),
        h(heads),
        d(dim),
        v_bytes(v_tensor),
        s_bytes(s_tensor),
        slots(n),
        v_pool(3 * v_tensor * n),
        s_pool(3 * s_tensor * n) {}

  void* v(std::size_t slot, int which) const {
    return static_cast<char*>(v_pool.get()) +
           (3 * slot + static_cast<std::size_t>(which)) * v_bytes;
  }
  void* s(std::size_t slot, int which) const {
    return static_cast<char*>(s_pool.get()) +
           (3 * slot + static_cast<std::size_t>(which)) * s_bytes;
  }
  TensorView vv(std::size_t slot, int which) const {
    return TensorView::contiguous(v(slot, which), DType::bf16, {t, h, d});
  }
  TensorView sv(std::size_t slot, int which) const {
    return TensorView::contiguous(s(slot, which), DType::f32, {t, h});
  }
  /// The same LSE buffer read as [H, T] (vLLM's layout).
  TensorView sv_head_major(std::size_t slot, int which) const {
    return TensorView::contiguous(s(slot, which), DType::f32, {h, t});
  }
};

void run_merge(const Pools& p, std::size_t slot, const kjit::MergeStateOptions& options,
               kjit::Stream stream) {
  kjit::merge_state(p.vv(slot, 0), p.sv(slot, 0), p.vv(slot, 1), p.sv(slot, 1), p.vv(slot, 2),
                    p.sv(slot, 2), options, stream);
}

/// Max abs error over tokens {0, T/2, T-1} (all heads) of slot 0 against the reference; -1 on
/// a NaN or an error above tolerance (bf16: 1e-2 + 2^-8 |v|; s: 1e-4 max(1, |s|)).
double verify(kjit::bench::Gpu& gpu, const Pools& p, const kjit::MergeStateOptions& options,
              std::string* detail) {
  run_merge(p, 0, options, gpu.stream);
  gpu.synchronize();
  const std::int64_t row = p.h * p.d;
  double max_err = 0.0;
  for (std::int64_t t : {std::int64_t{0}, p.t / 2, p.t - 1}) {
    std::vector<std::uint16_t> a(static_cast<std::size_t>(row)), b(a.size()), o(a.size());
    std::vector<float> sa(static_cast<std::size_t>(p.h)), sb(sa.size()), so(sa.size());
    const std::size_t v_off = static_cast<std::size_t>(t * row * 2);
    const std::size_t s_off = static_cast<std::size_t>(t * p.h * 4);
    auto get = [&](void* dst, const void* base, std::size_t offset, std::size_t bytes) {
      kjit::bench::check(
          kjit::bench::cu().cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(base) + offset, bytes),
          "cuMemcpyDtoH");
    };
    get(a.data(), p.v(0, 0), v_off, a.size() * 2);
    get(b.data(), p.v(0, 1), v_off, b.size() * 2);
    get(o.data(), p.v(0, 2), v_off, o.size() * 2);
    get(sa.data(), p.s(0, 0), s_off, sa.size() * 4);
    get(sb.data(), p.s(0, 1), s_off, sb.size() * 4);
    get(so.data(), p.s(0, 2), s_off, so.size() * 4);
    const auto ref = kjit::reference::merge_state(
        TensorView::contiguous(a.data(), DType::bf16, {1, p.h, p.d}),
        TensorView::contiguous(sa.data(), DType::f32, {1, p.h}),
        TensorView::contiguous(b.data(), DType::bf16, {1, p.h, p.d}),
        TensorView::contiguous(sb.data(), DType::f32, {1, p.h}), options);
    for (std::int64_t hh = 0; hh < p.h; ++hh) {
      const double s_want = ref.s_at(0, hh);
      const double s_got = so[static_cast<std::size_t>(hh)];
      if (std::isnan(s_got) ||
          !(std::fabs(s_got - s_want) <= 1e-4 * std::max(1.0, std::fabs(s_want)))) {
        *detail = fmt::format("s[{}, {}] = {} expected {}", t, hh, s_got, s_want);
        return -1.0;
      }
      for (std::int64_t dd = 0; dd < p.d; ++dd) {
        const double got = kjit::support::bf16_to_float(o[static_cast<std::size_t>(hh * p.d + dd)]);
        const double want = ref.v_at(0, hh, dd);
        const double err = std::fabs(got - want);
        if (std::isnan(got) || !(err <= 1e-2 + std::ldexp(std::fabs(want), -8))) {
          *detail = fmt::format("v[{}, {}, {}] = {} expected {}", t, hh, dd, got, want);
          return -1.0;
        }
        max_err = std::max(max_err, err);
      }
    }
  }
  return max_err;
}

// A merge anchor loaded from KJIT_MERGE_ANCHOR_LIB (bench/anchor_library.hpp). Its C ABI:
//   int kjit_anchor_merge_attn_states(stream, out, out_lse, prefix, prefix_lse, suffix,
//       suffix_lse, tokens, heads, head_size, token_stride, head_stride, dtype, error,
//       error_bytes): v [T, H, D] (strides in elements, last dimension contiguous; dtype 0 f32,
//       1 f16, 2 bf16), LSE f32 [H, T] natural log (out_lse may be null); 0 on success.
// prefix/suffix are kjit's a/b: the merge is symmetric, so the order changes nothing.
struct MergeAnchor {
  using Merge = int (*)(void*, void*, float*, const void*, const float*, const void*, const float*,
                        long long, long long, long long, long long, long long, int, char*, int);
  kjit::bench::AnchorLibrary library;
  Merge merge = nullptr;

  static std::optional<MergeAnchor> open() {
    auto library = kjit::bench::AnchorLibrary::open("KJIT_MERGE_ANCHOR_LIB");
    if (!library) return std::nullopt;
    const auto merge = library->symbol<Merge>("kjit_anchor_merge_attn_states");
    if (merge == nullptr) return std::nullopt;
    return MergeAnchor{*library, merge};
  }

  /// What the anchor's kernel names contain, for its kernel durations (vLLM's kernel name; an
  /// anchor whose kernels are named otherwise reports no durations).
  static std::string kernel_name_part() { return "merge_attn_states"; }

  /// Enqueues the anchor on slot `slot` of `p`; false (and `error`) if it refused or failed.
  bool run(const Pools& p, std::size_t slot, kjit::Stream stream, std::string* error) const {
    char message[512] = "";
    const int rc = merge(stream, p.v(slot, 2), static_cast<float*>(p.s(slot, 2)), p.v(slot, 0),
                         static_cast<const float*>(p.s(slot, 0)), p.v(slot, 1),
                         static_cast<const float*>(p.s(slot, 1)), static_cast<long long>(p.t),
                         static_cast<long long>(p.h), static_cast<long long>(p.d),
                         static_cast<long long>(p.h * p.d), static_cast<long long>(p.d), 2, message,
                         sizeof message);
    if (rc != 0) *error = message;
    return rc == 0;
  }
};

/// kjit on the anchor's layout: LSE [H, T] in base e.
kjit::MergeStateOptions anchor_layout_options(kjit::bench::Gpu& gpu) {
  kjit::MergeStateOptions options;
  options.lse_base = kjit::LseBase::e;
  options.lse_layout = kjit::LseLayout::head_major;
  options.runtime = &gpu.runtime();
  options.device = gpu.device;
  return options;
}

void run_merge_head_major(const Pools& p, std::size_t slot, const kjit::MergeStateOptions& options,
                          kjit::Stream stream) {
  kjit::merge_state(p.vv(slot, 0), p.sv_head_major(slot, 0), p.vv(slot, 1),
                    p.sv_head_major(slot, 1), p.vv(slot, 2), p.sv_head_major(slot, 2), options,
                    stream);
}

/// One kjit plan (the planner's or a forced mode) on the anchor's layout, beside the anchor.
struct KjitBeside {
  std::string mode;        // "" for the planner's choice
  std::string plan_error;  // set when this forced mode is not legal for the shape
  bool matches = false;    // output within tolerance of the anchor's
  std::string mismatch;    // the first element out of tolerance
  double us = 0, dirty_us = 0, max_abs = 0, max_rel = 0, lse_max_abs = 0;
};

/// Median kernel durations (CUPTI, us; -1 when no record came back) of one call with L2 warm
/// (back-to-back calls), flushed and dirtied before each call. The flush and the dirtying writes
/// are memsets, not kernels, so only the call's own kernels are in the records.
struct Durations {
  double warm = -1, flushed = -1, dirty = -1;
};
Durations durations_of(kjit::bench::ActivityTimer& timer, kjit::bench::Gpu& gpu,
                       const std::function<void(kjit::Stream)>& call, const std::string& name) {
  const auto timed = [&](void (*before)(kjit::bench::Gpu&)) {
    const auto enqueue = [&](kjit::Stream stream) {
      if (before != nullptr) before(gpu);
      call(stream);
    };
    return timer.median_us(gpu, enqueue, 50, name).value_or(-1);
  };
  return Durations{timed(nullptr), timed(&kjit::bench::flush_l2), timed(&kjit::bench::dirty_l2)};
}

struct AnchorResult {
  bool ran = false;   // false: the anchor refused the shape or failed (`error`)
  std::string error;  // why it did not run
  double us = 0, dirty_us = 0;
  std::vector<KjitBeside> kjit;
  // Small calls (T <= kDurationMaxTokens) with KJIT_BENCH_CUPTI=1: kernel durations of the anchor
  // and of kjit's planner run in the anchor's layout, where event pairs measure their own floor.
  std::optional<Durations> anchor_durations, kjit_durations;
};

// The largest T whose calls are also compared by kernel duration (event pairs read ~4-7 us for
// any call below that).
constexpr std::int64_t kDurationMaxTokens = 64;

/// Slot 0's output (v rows of up to 64 tokens spread over T, and the whole LSE) after `enqueue`,
/// written over poison (0xFF bytes: NaN in bf16 and f32) so that an element left unwritten fails.
struct Output {
  std::vector<std::uint16_t> v;
  std::vector<float> s;
};
std::vector<std::int64_t> sampled_tokens(std::int64_t t) {
  std::vector<std::int64_t> tokens;
  const std::int64_t n = std::min<std::int64_t>(t, 64);
  for (std::int64_t i = 0; i < n; ++i) tokens.push_back(n == 1 ? 0 : i * (t - 1) / (n - 1));
  return tokens;
}
Output output_after(kjit::bench::Gpu& gpu, const Pools& p,
                    const std::function<void(kjit::Stream)>& enqueue) {
  using kjit::bench::check;
  using kjit::bench::cu;
  const auto v_out = reinterpret_cast<CUdeviceptr>(p.v(0, 2));
  const auto s_out = reinterpret_cast<CUdeviceptr>(p.s(0, 2));
  check(cu().cuMemsetD8Async(v_out, 0xFF, p.v_bytes, gpu.cu_stream()), "cuMemsetD8Async");
  check(cu().cuMemsetD8Async(s_out, 0xFF, p.s_bytes, gpu.cu_stream()), "cuMemsetD8Async");
  enqueue(gpu.stream);
  gpu.synchronize();
  const std::size_t row = static_cast<std::size_t>(p.h * p.d);
  const std::vector<std::int64_t> tokens = sampled_tokens(p.t);
  Output out;
  out.v.resize(tokens.size() * row);
  out.s.resize(static_cast<std::size_t>(p.t * p.h));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    check(cu().cuMemcpyDtoH(out.v.data() + i * row,
                            v_out + static_cast<std::size_t>(tokens[i]) * row * 2, row * 2),
          "cuMemcpyDtoH");
  }
  check(cu().cuMemcpyDtoH(out.s.data(), s_out, out.s.size() * 4), "cuMemcpyDtoH");
  return out;
}

/// Compares the anchor's output `got` with kjit's `want` (the sampled v rows and the LSE).
void compare(const Pools& p, const Output& got, const Output& want, KjitBeside* r) {
  r->matches = true;
  const std::vector<std::int64_t> tokens = sampled_tokens(p.t);
  const auto row = static_cast<std::size_t>(p.h * p.d);
  const auto dim = static_cast<std::size_t>(p.d);
  for (std::size_t i = 0; i < want.v.size(); ++i) {
    const double a = kjit::support::bf16_to_float(got.v[i]);
    const double k = kjit::support::bf16_to_float(want.v[i]);
    const double err = std::fabs(a - k);
    // Two fp32 merges rounded to bf16 may differ by one bf16 step (2^-7 relative).
    if (r->matches &&
        (std::isnan(a) || std::isnan(k) || !(err <= 1e-2 + std::ldexp(std::fabs(k), -7)))) {
      r->matches = false;
      r->mismatch = fmt::format("v[{}, {}, {}]: anchor {} kjit {}", tokens[i / row],
                                (i % row) / dim, i % dim, a, k);
    }
    if (!std::isnan(err)) {
      r->max_abs = std::max(r->max_abs, err);
      r->max_rel = std::max(r->max_rel, err / std::max(std::fabs(k), 1.0 / 64));
    }
  }
  const auto tokens_total = static_cast<std::size_t>(p.t);
  for (std::size_t i = 0; i < want.s.size(); ++i) {
    const double a = got.s[i], k = want.s[i];
    const double err = std::fabs(a - k);
    if (r->matches &&
        (std::isnan(a) || std::isnan(k) || !(err <= 1e-4 * std::max(1.0, std::fabs(k))))) {
      r->matches = false;
      r->mismatch = fmt::format("lse[{}, {}] (head, token): anchor {} kjit {}", i / tokens_total,
                                i % tokens_total, a, k);
    }
    if (!std::isnan(err)) r->lse_max_abs = std::max(r->lse_max_abs, err);
  }
}

/// The anchor on `p`, then kjit in the anchor's layout under each of `modes` ("" = planner):
/// every output checked against the anchor's, every call timed under the bench's protocols
/// (L2 flushed first; with `dirty_protocol` also L2 dirtied before each call), each call on the
/// next slot of the same rotation.
AnchorResult run_anchor(kjit::bench::Gpu& gpu, const Pools& p, const MergeAnchor& anchor,
                        const std::vector<std::string>& modes, int reps, bool dirty_protocol,
                        kjit::bench::ActivityTimer* durations) {
  AnchorResult r;
  bool failed = false;
  const Output got = output_after(
      gpu, p, [&](kjit::Stream stream) { failed = !anchor.run(p, 0, stream, &r.error); });
  if (failed) return r;
  r.ran = true;
  std::size_t call = 0;
  const auto dirty = [&](kjit::Stream) { kjit::bench::dirty_l2(gpu); };
  const auto anchor_call = [&](kjit::Stream stream) {
    std::string error;
    if (!anchor.run(p, (call++ * 7919) % p.slots, stream, &error)) {
      std::fprintf(stderr, "anchor %s failed: %s\n", anchor.library.name().c_str(), error.c_str());
      std::exit(1);
    }
  };
  kjit::bench::flush_l2(gpu);
  r.us = kjit::bench::median_gpu_us(gpu, anchor_call, reps);
  if (dirty_protocol) r.dirty_us = kjit::bench::median_gpu_us(gpu, anchor_call, reps, 10, dirty);
  const bool by_duration = durations != nullptr && p.t <= kDurationMaxTokens;
  if (by_duration) {
    r.anchor_durations = durations_of(*durations, gpu, anchor_call, anchor.kernel_name_part());
  }
  for (const std::string& mode : modes) {
    KjitBeside k;
    k.mode = mode;
    kjit::MergeStateOptions options = anchor_layout_options(gpu);
    options.force_mode = mode;
    try {
      kjit::plan_merge_state(p.vv(0, 0), p.sv_head_major(0, 0), p.vv(0, 1), p.sv_head_major(0, 1),
                             p.vv(0, 2), p.sv_head_major(0, 2), options, gpu.limits);
    } catch (const kjit::Error& e) {
      if (mode.empty()) throw;
      k.plan_error = e.what();
      r.kjit.push_back(k);
      continue;
    }
    const Output want = output_after(
        gpu, p, [&](kjit::Stream stream) { run_merge_head_major(p, 0, options, stream); });
    compare(p, got, want, &k);
    const auto kjit_call = [&](kjit::Stream stream) {
      run_merge_head_major(p, (call++ * 7919) % p.slots, options, stream);
    };
    kjit::bench::flush_l2(gpu);
    k.us = kjit::bench::median_gpu_us(gpu, kjit_call, reps);
    if (dirty_protocol) k.dirty_us = kjit::bench::median_gpu_us(gpu, kjit_call, reps, 10, dirty);
    if (by_duration && mode.empty()) {
      r.kjit_durations = durations_of(*durations, gpu, kjit_call, "merge_state_kernel");
    }
    r.kjit.push_back(k);
  }
  return r;
}

/// The shapes KJIT_MERGE_BENCH_SHAPES names ("DxHxT,..."); empty: every shape.
std::vector<std::array<std::int64_t, 3>> shape_filter() {
  std::vector<std::array<std::int64_t, 3>> shapes;
  const char* env = std::getenv("KJIT_MERGE_BENCH_SHAPES");
  if (env == nullptr) return shapes;
  std::string text = env;
  for (std::size_t at = 0; at < text.size();) {
    const std::size_t end = std::min(text.find(',', at), text.size());
    long long d = 0, h = 0, t = 0;
    if (std::sscanf(text.substr(at, end - at).c_str(), "%lldx%lldx%lld", &d, &h, &t) == 3) {
      shapes.push_back({d, h, t});
    } else {
      std::fprintf(stderr, "KJIT_MERGE_BENCH_SHAPES: '%s' is not DxHxT (ignored)\n",
                   text.substr(at, end - at).c_str());
    }
    at = end + 1;
  }
  return shapes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool all_modes = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--modes") == 0) {
      all_modes = true;
    } else {
      json_path = argv[i];
    }
  }
  // Forced modes timed beside the planner's: --modes: every grid mode; KJIT_MERGE_BENCH_MODES:
  // the listed ones (with geometry suffixes, for A/B runs).
  std::vector<std::string> forced_modes;
  if (all_modes)
    forced_modes.assign(std::begin(kjit::kMergeStateModes), std::end(kjit::kMergeStateModes));
  if (const char* env = std::getenv("KJIT_MERGE_BENCH_MODES"); env != nullptr && *env != '\0') {
    forced_modes.clear();
    const std::string text = env;
    for (std::size_t at = 0; at <= text.size();) {
      const std::size_t end = std::min(text.find(',', at), text.size());
      if (end > at) forced_modes.push_back(text.substr(at, end - at));
      at = end + 1;
    }
  }
  const auto shapes = shape_filter();
  std::string why;
  auto opened = kjit::bench::Gpu::open(&why);
  if (!opened) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 0;
  }
  kjit::bench::Gpu& gpu = *opened;
  std::FILE* json = json_path.empty() ? nullptr : std::fopen(json_path.c_str(), "w");
  const bool dirty_protocol = kjit::bench::env_is_one("KJIT_MERGE_BENCH_DIRTY");
  // KJIT_BENCH_CUPTI=1: T = 1 shapes also by kernel duration (bench/activity_timer.hpp).
  kjit::bench::ActivityTimer* const durations = kjit::bench::ActivityTimer::requested();
  const double empty_us = kjit::bench::empty_kernel_us(gpu);
  std::printf("device %s, %d SMs; empty kernel %.2f us (event pair)\n", gpu.limits.name.c_str(),
              gpu.limits.sm_count, empty_us);
  const std::optional<MergeAnchor> anchor = MergeAnchor::open();
  // KJIT_MERGE_BENCH_ANCHOR_PASSES=N: the anchor and kjit timed N times in turn on each shape,
  // so that a difference can be set against the spread between passes of the same kernel.
  const char* passes_env = std::getenv("KJIT_MERGE_BENCH_ANCHOR_PASSES");
  const int anchor_passes = passes_env != nullptr ? std::clamp(std::atoi(passes_env), 1, 20) : 1;
  if (anchor) {
    std::printf("anchor: %s (KJIT_MERGE_ANCHOR_LIB), beside kjit on LSE [H, T] base e\n",
                anchor->library.name().c_str());
  } else {
    std::printf("anchor: off (set KJIT_MERGE_ANCHOR_LIB to time one beside kjit)\n");
  }
  std::printf("%-5s %-5s %-6s %-12s %-16s %10s %9s %6s %7s  %s\n", "D", "H", "T", "mode", "spec",
              "us", "GB/s", "copy", "vs_sgl", "check");
  int failures = 0;
  for (std::int64_t d : {64, 128, 256, 512}) {
    for (std::int64_t h : {8, 32, 64, 128, 256}) {
      for (std::int64_t t : {1, 64, 4096, 16384}) {
        if (!shapes.empty() && std::find(shapes.begin(), shapes.end(),
                                         std::array<std::int64_t, 3>{d, h, t}) == shapes.end()) {
          continue;
        }
        const std::size_t v_tensor = round_up(static_cast<std::size_t>(t * h * d * 2));
        const std::size_t s_tensor = round_up(static_cast<std::size_t>(t * h * 4));
        const std::size_t slot_bytes = 3 * (v_tensor + s_tensor);
        // A set larger than the pool is far larger than L2: one set is cold by itself.
        const std::size_t slots =
            slot_bytes >= kPoolBytes ? 1 : std::max<std::size_t>(2, kPoolBytes / slot_bytes);
        Pools pools(t, h, d, v_tensor, s_tensor, slots);
        kjit::bench::fill_random(pools.v_pool, DType::bf16, pools.v_pool.bytes() / 2, 1);
        kjit::bench::fill_random(pools.s_pool, DType::f32, pools.s_pool.bytes() / 4, 2, 10.0);

        const double bytes =
            3.0 * static_cast<double>(t * h * d) * 2 + 3.0 * static_cast<double>(t * h) * 4;
        const double copy = kjit::bench::copy_gbs(gpu, static_cast<std::size_t>(bytes));
        std::vector<std::string> modes = {""};
        modes.insert(modes.end(), forced_modes.begin(), forced_modes.end());
        for (const std::string& mode : modes) {
          kjit::MergeStateOptions options;
          options.lse_base = kjit::LseBase::two;
          options.force_mode = mode;
          options.runtime = &gpu.runtime();
          options.device = gpu.device;
          kjit::Plan plan;
          try {
            plan = kjit::plan_merge_state(pools.vv(0, 0), pools.sv(0, 0), pools.vv(0, 1),
                                          pools.sv(0, 1), pools.vv(0, 2), pools.sv(0, 2), options,
                                          gpu.limits);
          } catch (const kjit::Error& e) {
            if (mode.empty()) throw;
            // A forced geometry this shape cannot take: said, and the next mode timed.
            std::printf("      =%s: %s\n", mode.c_str(), e.what());
            continue;
          }
          const kjit::KernelSpec& spec = plan.launches.at(0).spec;
          const std::string spec_text = fmt::format("v{}c{}", spec.get("vec"), spec.get("chunks"));
          std::string detail;
          const double err = verify(gpu, pools, options, &detail);
          if (err < 0) ++failures;
          std::size_t call = 0;
          kjit::bench::flush_l2(gpu);
          const int reps = bytes > 1e9 ? 50 : 100;
          const double us = kjit::bench::median_gpu_us(
              gpu,
              [&](kjit::Stream stream) {
                // A stride through the slots that revisits none within one measurement.
                run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
              },
              reps);
          // Serving protocol: the same rotation, each call after 64 MiB of unrelated writes
          // that leave L2 dirty (kjit::bench::dirty_l2).
          double dirty_us = 0;
          if (dirty_protocol) {
            dirty_us = kjit::bench::median_gpu_us(
                gpu,
                [&](kjit::Stream stream) {
                  run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
                },
                reps, 10, [&](kjit::Stream) { kjit::bench::dirty_l2(gpu); });
          }
          const double gbs = bytes / (us * 1e3);
          const std::string label = mode.empty() ? plan.mode : "=" + mode;
          std::printf("%-5lld %-5lld %-6lld %-12s %-16s %10.2f %9.0f %6.3f %7.2f  %s%s\n",
                      static_cast<long long>(d), static_cast<long long>(h),
                      static_cast<long long>(t), label.c_str(), spec_text.c_str(), us, gbs,
                      gbs / copy, gbs / 1270.0,
                      err < 0 ? "FAIL " : fmt::format("ok {:.4f}", err).c_str(), detail.c_str());
          if (dirty_protocol) {
            // Against a copy that meets L2 as the call does (dirtied before each copy), and
            // the rotation copy of the line above.
            const double copy_dirty = kjit::bench::copy_gbs(gpu, static_cast<std::size_t>(bytes),
                                                            kjit::bench::L2Protocol::dirty);
            std::printf(
                "      L2 dirty before each call: %.2f us, ratio to a copy dirtied the same way "
                "%.3f (to the rotation copy %.3f)\n",
                dirty_us, bytes / (dirty_us * 1e3) / copy_dirty, bytes / (dirty_us * 1e3) / copy);
          }
          if (t == 1) std::printf("      T=1: %.2f us over the empty kernel\n", us - empty_us);
          if (t == 1 && durations != nullptr) {
            // Kernel durations (CUPTI) beside an empty kernel and a copy of the same bytes, all
            // warm: a T = 1 call's data fits in L2 anyway.
            const auto timed = durations->beside_empty_and_copy(
                gpu,
                [&](kjit::Stream stream) {
                  run_merge(pools, (call++ * 7919) % pools.slots, options, stream);
                },
                "merge_state_kernel", static_cast<std::size_t>(bytes));
            std::printf(
                "      T=1 kernel durations (CUPTI): merge %.2f us, empty kernel %.2f us, copy "
                "of the same bytes %.2f us\n",
                timed.call, timed.empty, timed.copy);
          }
          std::fflush(stdout);
          if (json != nullptr) {
            std::fprintf(json,
                         "{\"bench\":\"merge_state\",\"dtype\":\"bf16\",\"D\":%lld,\"H\":%lld,"
                         "\"T\":%lld,\"mode\":\"%s\",\"forced\":%s,\"vec\":%s,\"chunks\":%s,"
                         "\"us\":%.3f,\"gbs\":%.1f,\"copy_gbs\":%.1f,\"ratio_copy\":%.4f,"
                         "\"empty_us\":%.3f,\"dirty_us\":%.3f,\"ok\":%s,\"max_err\":%.6f}\n",
                         static_cast<long long>(d), static_cast<long long>(h),
                         static_cast<long long>(t), plan.mode.c_str(),
                         mode.empty() ? "false" : "true", spec.get("vec").c_str(),
                         spec.get("chunks").c_str(), us, gbs, copy, gbs / copy, empty_us, dirty_us,
                         err < 0 ? "false" : "true", err < 0 ? 0.0 : err);
            std::fflush(json);
          }
        }
        for (int pass = 0; anchor && pass < anchor_passes; ++pass) {
          const int reps = bytes > 1e9 ? 50 : 100;
          const AnchorResult a =
              run_anchor(gpu, pools, *anchor, modes, reps, dirty_protocol, durations);
          const std::string pass_label =
              anchor_passes > 1 ? fmt::format(" (pass {} of {})", pass + 1, anchor_passes) : "";
          if (!a.ran) {
            std::printf("      anchor: did not run: %s\n", a.error.c_str());
            break;
          } else if (dirty_protocol) {
            std::printf("      anchor%s %.2f us, L2 dirty before each call %.2f us\n",
                        pass_label.c_str(), a.us, a.dirty_us);
          } else {
            std::printf("      anchor%s %.2f us\n", pass_label.c_str(), a.us);
          }
          if (a.anchor_durations && a.kjit_durations) {
            const Durations& ad = *a.anchor_durations;
            const Durations& kd = *a.kjit_durations;
            const auto ratio = [](double x, double y) { return x > 0 && y > 0 ? x / y : -1.0; };
            std::printf(
                "      kernel durations (CUPTI) warm / L2 flushed / L2 dirty before each call: "
                "anchor %.2f / %.2f / %.2f us, kjit on LSE [H, T] base e %.2f / %.2f / %.2f us, "
                "anchor/kjit %.3f / %.3f / %.3f\n",
                ad.warm, ad.flushed, ad.dirty, kd.warm, kd.flushed, kd.dirty,
                ratio(ad.warm, kd.warm), ratio(ad.flushed, kd.flushed), ratio(ad.dirty, kd.dirty));
            if (json != nullptr) {
              std::fprintf(json,
                           "{\"bench\":\"merge_state_anchor_durations\",\"D\":%lld,\"H\":%lld,"
                           "\"T\":%lld,\"anchor_warm_us\":%.3f,\"anchor_flushed_us\":%.3f,"
                           "\"anchor_dirty_us\":%.3f,\"kjit_warm_us\":%.3f,"
                           "\"kjit_flushed_us\":%.3f,\"kjit_dirty_us\":%.3f}\n",
                           static_cast<long long>(d), static_cast<long long>(h),
                           static_cast<long long>(t), ad.warm, ad.flushed, ad.dirty, kd.warm,
                           kd.flushed, kd.dirty);
            }
          }
          for (const KjitBeside& k : a.kjit) {
            const std::string label = k.mode.empty() ? "kjit" : "kjit =" + k.mode;
            if (!k.plan_error.empty()) {
              std::printf("      %s: %s\n", label.c_str(), k.plan_error.c_str());
              continue;
            }
            if (!k.matches) ++failures;
            std::printf(
                "      %s on LSE [H, T] base e: %.2f us, anchor/kjit %.3f%s; check against the "
                "anchor %s: max abs %.5f, max rel %.5f, LSE max abs %.2e%s%s\n",
                label.c_str(), k.us, a.us / k.us,
                dirty_protocol ? fmt::format(" (L2 dirty: {:.2f} us, anchor/kjit {:.3f})",
                                             k.dirty_us, a.dirty_us / k.dirty_us)
                                     .c_str()
                               : "",
                k.matches ? "ok" : "ANCHOR MISMATCH", k.max_abs, k.max_rel, k.lse_max_abs,
                k.matches ? "" : ": ", k.mismatch.c_str());
            if (json != nullptr) {
              std::fprintf(json,
                           "{\"bench\":\"merge_state_anchor\",\"anchor\":\"%s\",\"dtype\":"
                           "\"bf16\",\"D\":%lld,\"H\":%lld,\"T\":%lld,\"kjit_mode\":\"%s\","
                           "\"ok\":%s,\"anchor_us\":%.3f,\"kjit_us\":%.3f,"
                           "\"anchor_dirty_us\":%.3f,\"kjit_dirty_us\":%.3f,\"max_abs\":%.6f,"
                           "\"max_rel\":%.6f,\"lse_max_abs\":%.3e}\n",
                           anchor->library.name().c_str(), static_cast<long long>(d),
                           static_cast<long long>(h), static_cast<long long>(t), k.mode.c_str(),
                           k.matches ? "true" : "false", a.us, k.us, a.dirty_us, k.dirty_us,
                           k.max_abs, k.max_rel, k.lse_max_abs);
              std::fflush(json);
            }
          }
          std::fflush(stdout);
        }
      }
    }
  }
  if (json != nullptr) std::fclose(json);
  std::printf("%s\n", failures == 0 ? "all shapes correct"
                                    : fmt::format("{} shape(s) WRONG", failures).c_str());
  return failures == 0 ? 0 : 1;
}
