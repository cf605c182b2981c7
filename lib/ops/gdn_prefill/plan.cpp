// SPDX-License-Identifier: Apache-2.0
// gdn_prefill's planner: the path (fused, chunked, context-parallel), the value tile, the
// launches of each path and their specs. Pure: a function of the Problem and the device.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "codegen/families.hpp"
#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "ops/gdn_prefill/family.hpp"

namespace kjit::ops::prefill {
namespace {

// What the planner decided and why: the typed Choice's values (chunked: the two-kernel path,
// else the fused kernel; cp_chunks > 0: its context-parallel variant) and the plan's reasons.
struct Decision {
  bool chunked = false;
  int bv = 0;
  bool wgmma = false;
  std::int64_t cp_chunks = 0;
  int cp_stages = 2;
  // The sequential state kernel's input stages (state_stages).
  int state_stages = 2;
  // The warp-specialized kernel (gdn_prefill_ws) in place of the chunk and state kernels.
  bool ws = false;
  std::vector<std::string> reasons;
};

// Input stages of a state kernel's value tile `bv` (the sequential kernel and the
// context-parallel passes): 3 for a wide tile on sm_90 and later where they fit the shared
// memory (handed over by mbarriers, no block barrier per chunk: warps drift up to a chunk apart;
// measured on the H200 against 2 stages with a barrier: 1-3.6% faster per call on the sequential
// path, 8.5-10% on the context-parallel one, docs/performance.md "The state kernel's stages
// handed over by mbarriers"), else 2.
int state_stages(const Problem& pr, int bv, const DeviceLimits& device) {
  if (!gdn_prefill_state_wide(bv) || device.arch.major < 9) return 2;
  return gdn_prefill_state_smem(static_cast<int>(pr.k), bv, 3).total <=
                 device.max_smem_per_block_optin
             ? 3
             : 2;
}

// `forced_bv`: the value tile options.force_mode names (0: the planner's).
Decision choose_tile(const Problem& pr, int forced_bv, const DeviceLimits& device) {
  Decision choice;
  if (forced_bv != 0) {
    // (parse_mode checked that the tile is one of value_tiles.)
    choice.bv = forced_bv;
    choice.reasons.push_back(fmt::format("value tile {} forced by options.force_mode", forced_bv));
    return choice;
  }
  std::vector<int> tiles = value_tiles(pr.k, pr.v);
  // A tile whose shared memory the device cannot give one block is no choice at all (sm_86 and
  // sm_89 opt in to 99 KiB: bv64 at K = 128 needs 105.5 KiB there). Forced tiles are left to
  // the launch check, which names the limit.
  std::erase_if(tiles, [&](int bv) {
    const std::int64_t smem = gdn_prefill_smem(static_cast<int>(pr.k), bv).total;
    if (smem <= device.max_smem_per_block_optin) return false;
    choice.reasons.push_back(
        fmt::format("value tile {} rejected: {} bytes of shared memory > {} per block on {}", bv,
                    smem, device.max_smem_per_block_optin, device.name));
    return true;
  });
  if (tiles.empty()) {
    throw PlanError(fmt::format(
        "{}: no value tile fits the {} bytes of shared memory a block may use on {} (K = {}, "
        "V = {})",
        kOp, device.max_smem_per_block_optin, device.name, pr.k, pr.v));
  }
  // Blocks are (sequence, value head, value tile); each walks its sequence's chunks. A smaller
  // tile recomputes the chunk's A, T and P once more per extra tile but multiplies the blocks:
  // take the largest tile that still gives two blocks per SM, never below 32.
  const std::int64_t want = 2 * std::int64_t{device.sm_count};
  for (int bv : tiles) {
    const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / bv);
    if (blocks >= want || bv == 32 || bv == tiles.back()) {
      choice.bv = bv;
      choice.reasons.push_back(fmt::format(
          "value tile {}: {} blocks ({} sequences x {} value heads x {} tiles){}", bv, blocks,
          pr.seqs, pr.value_heads, pr.v / bv,
          blocks >= want ? fmt::format(" >= 2 per SM ({})", want)
                         : fmt::format(" < 2 per SM ({}); smaller tiles are not worth the "
                                       "recompute",
                                       want)));
      return choice;
    }
    choice.reasons.push_back(
        fmt::format("value tile {} rejected: {} blocks < 2 per SM ({})", bv, blocks, want));
  }
  fail("no value tile fits");  // unreachable: 16 divides every accepted V
}

// The path and, on the chunked path, the state kernel's value tile. The chunked path takes the
// chunk-local work (A, its inverse, P, the decays) off the sequential path; it needs bf16
// inputs, 16-byte v rows and the shared memory of both kernels. `forced_chunked`: a chunked
// mode (forced_bv: its tile, 0: the planner's); `shown`: the mode as the caller spelled it, for
// messages.
Decision choose_path(const Problem& pr, bool forced_chunked, int forced_bv,
                     const DeviceLimits& device, std::string_view shown) {
  const auto smem_of = [&](int bv) {
    return std::int64_t{
        gdn_prefill_state_smem(static_cast<int>(pr.k), bv, state_stages(pr, bv, device)).total};
  };
  const std::int64_t chunk_smem = gdn_prefill_chunk_smem(static_cast<int>(pr.k)).total;
  std::string why_not;
  std::vector<std::string> reasons;
  std::vector<int> tiles;
  if (!pr.bf16) {
    why_not = "q/k/v are f16, and the chunked path's state kernel multiplies raw bf16 rows";
  } else if (!pr.v16) {
    why_not =
        "v is not 16-byte aligned with token and head strides that are multiples of 8 elements "
        "(the chunked path copies v rows 16 bytes at a time)";
  } else if (chunk_smem > device.max_smem_per_block_optin) {
    why_not = fmt::format("its chunk kernel needs {} bytes of shared memory > {} per block on {}",
                          chunk_smem, device.max_smem_per_block_optin, device.name);
  } else {
    // Preference, from a sweep of every tile over 16..256 (sequence, value head) pairs on the
    // H200 (docs/performance.md, "The state kernel's value tile"): the smallest tile whose
    // blocks still fit one wave of one block per SM, since a chain split over more SMs walks
    // its chunks faster; 16 rows when even those fit, else 64 (32 never won); all of V in one
    // block of 8 warps once the 64-row blocks would double up on SMs (each chunk's q, k, T' and
    // P then cross into shared memory once per pair, not once per tile).
    const std::int64_t pairs = pr.seqs * pr.value_heads;
    const std::int64_t sms = device.sm_count;
    std::vector<int> order = pairs * (pr.v / 16) <= sms   ? std::vector<int>{16, 32, 64}
                             : pairs * (pr.v / 64) <= sms ? std::vector<int>{64, 32, 16}
                                                          : std::vector<int>{128, 64, 32, 16};
    if (forced_bv != 0) order = {forced_bv};
    for (int bv : order) {
      if (pr.v % bv != 0 || bv * pr.k > state_tile_limit(bv)) continue;
      if (smem_of(bv) > device.max_smem_per_block_optin) {
        reasons.push_back(fmt::format(
            "chunked value tile {} rejected: {} bytes of shared memory > {} per block on {}", bv,
            smem_of(bv), device.max_smem_per_block_optin, device.name));
        continue;
      }
      tiles.push_back(bv);
    }
    if (tiles.empty()) why_not = "no value tile of its state kernel fits the shared memory";
  }
  if (!why_not.empty()) {
    if (forced_chunked) {
      throw PlanError(fmt::format("{}: options.force_mode '{}': the chunked path cannot run: {}",
                                  kOp, shown, why_not));
    }
    Decision fused = choose_tile(pr, 0, device);
    fused.reasons.insert(
        fused.reasons.begin(),
        fmt::format("fused single-kernel path: the chunked path is out, {}", why_not));
    return fused;
  }
  Decision choice;
  choice.chunked = true;
  choice.bv = tiles.front();
  choice.state_stages = state_stages(pr, choice.bv, device);
  choice.reasons = std::move(reasons);
  choice.reasons.insert(
      choice.reasons.begin(),
      fmt::format("chunked path{}: kernel 1 computes every chunk's T' = (I + A)^-1 diag(beta), "
                  "P and decay scales at once; kernel 2 walks each sequence's chunks with only "
                  "the state-dependent products on the sequential path",
                  forced_chunked ? " (forced by options.force_mode)" : ""));
  choice.reasons.push_back(fmt::format(
      "state kernel value tile {}{}: {} blocks ({} sequences x {} value heads x {} tiles), {} "
      "bytes of shared memory each{}",
      choice.bv,
      forced_bv != 0 ? " (forced)"
      : choice.bv == 128 && pr.seqs * pr.value_heads * (pr.v / 64) > device.sm_count
          ? fmt::format(" (all of V: the 64-row blocks of {} pairs would not fit {} SMs one each)",
                        pr.seqs * pr.value_heads, device.sm_count)
          : std::string(),
      pr.seqs * pr.value_heads * (pr.v / choice.bv), pr.seqs, pr.value_heads, pr.v / choice.bv,
      smem_of(choice.bv),
      choice.state_stages == 3
          ? "; 3 input stages handed over by mbarriers (sm_90 and later), no block barrier "
            "per chunk"
          : ""));
  return choice;
}

// The context-parallel path (few long sequences). A sequence's chunks are cut into segments of
// L chunks; the state recurrence is affine in the state, so segment s's end state is X_s M_s +
// B_s with M_s [K, K] its end state from the identity (v = 0) and B_s its end state from zero.
// A segment pass computes M_s, B_s of the middle segments in parallel (and segment 0 exactly), a
// scan walks X_{s+1} = X_s M_s + B_s per sequence in f32, and a resume pass reruns segments 1 ..
// S - 1 from their exact X_s with outputs. Exact (no state is assumed), at about 2.2x the state
// kernel's work, in exchange for parallelism: it pays when the (sequence, value head) pairs
// leave most SMs idle.
struct CpDecision {
  std::int64_t chunks = 0;  // L; 0: not taken
  int bv = 0;
  int stages = 2;
  std::string reason;   // why taken (chunks > 0)
  std::string why_not;  // why not (an empty string with chunks == 0: not considered)
};

// The state rows per block of the context-parallel passes: the widest wide tile that divides K
// and V and whose shared memory a block may have (0: none).
int cp_tile(const Problem& pr, const DeviceLimits& device) {
  for (int bv : {128, 64}) {
    if (pr.k % bv != 0 || pr.v % bv != 0 || bv * pr.k > state_tile_limit(bv)) continue;
    if (gdn_prefill_state_smem(static_cast<int>(pr.k), bv).total <=
        device.max_smem_per_block_optin) {
      return bv;
    }
  }
  return 0;
}

// `forced_chunks`: L from the mode (0: the planner's). `user_workspace`: bytes of the caller's
// options.workspace (-1: kjit allocates it). The rule, from the H200 (docs/performance.md):
// the sequential state kernel takes (longest sequence) x t per chunk; the context-parallel
// passes about 2.2 x (all chunks x HV x V / bv) / SMs x t. With P (sequence, value head) pairs
// of equal length that is a gain of SMs / (2.2 P): taken when 3 P <= SMs. L spreads the resume
// pass over about one wave of blocks, at least kCpMinChunks so the scan stays short.
// `explain`: format the reason texts (plans); a launch's memo key needs only the numbers.
CpDecision decide_cp(const Problem& pr, const DeviceLimits& device, std::int64_t user_workspace,
                     std::int64_t forced_chunks, bool forced, int forced_stages, bool explain) {
  constexpr std::int64_t kCpMinChunks = 16;
  CpDecision d;
  if (pr.k > 128) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: K = {} > 128 (its passes use the wide state tiles)", pr.k);
    return d;
  }
  d.bv = cp_tile(pr, device);
  if (d.bv == 0) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: no state tile of 64 or 128 rows fits the {} bytes of shared "
          "memory a block may use on {}",
          device.max_smem_per_block_optin, device.name);
    return d;
  }
  const std::int64_t tiles = pr.v / d.bv;
  const std::int64_t pairs = pr.seqs * pr.value_heads;
  const std::int64_t work = pr.tokens / kGdnPrefillChunk * pr.value_heads * tiles;
  std::int64_t chunks = forced_chunks;
  if (chunks == 0) {
    chunks = std::max<std::int64_t>(kCpMinChunks, (work + device.sm_count - 1) / device.sm_count);
  }
  if (!forced) {
    if (3 * pairs > std::int64_t{device.sm_count}) {
      if (explain)
        d.why_not = fmt::format(
            "no context-parallel path: {} (sequence, value head) pairs, 3 x {} > {} SMs (it does "
            "~2.2x the state work; it pays when the pairs leave most SMs idle)",
            pairs, pairs, device.sm_count);
      return d;
    }
    if (pr.tokens < 3 * kGdnPrefillChunk * chunks * pr.seqs) {
      if (explain)
        d.why_not = fmt::format(
            "no context-parallel path: {} tokens over {} sequences are fewer than 3 segments of {} "
            "chunks each",
            pr.tokens, pr.seqs, chunks);
      return d;
    }
  }
  const std::int64_t need = cp_workspace_bytes(pr, chunks);
  if (user_workspace >= 0 && user_workspace < need) {
    if (explain)
      d.why_not = fmt::format(
          "{}context-parallel path: options.workspace holds {} bytes, it needs {} (segments of {} "
          "chunks)",
          forced ? "" : "no ", user_workspace, need, chunks);
    return d;
  }
  const std::int64_t segments = cp_segments(pr, chunks);
  const std::int64_t resume_blocks = segments * pr.value_heads * tiles;
  if (resume_blocks + segments * pr.value_heads * (pr.k / d.bv) >
      std::int64_t{device.max_grid_dim[0]}) {
    if (explain)
      d.why_not =
          fmt::format("context-parallel path out: {} segment ids x {} value heads exceed grid x",
                      segments, pr.value_heads);
    return d;
  }
  // Unless forced, the stages of the sequential kernel's rule (state_stages).
  const auto stage_fits = [&](int stages) {
    return gdn_prefill_state_smem(static_cast<int>(pr.k), d.bv, stages).total <=
           device.max_smem_per_block_optin;
  };
  d.stages = forced_stages > 0 ? forced_stages : state_stages(pr, d.bv, device);
  if (!stage_fits(d.stages)) {
    if (explain)
      d.why_not = fmt::format(
          "context-parallel path out: {} input stages of the {}-row tile need {} bytes of shared "
          "memory > {} per block on {}",
          d.stages, d.bv, gdn_prefill_state_smem(static_cast<int>(pr.k), d.bv, d.stages).total,
          device.max_smem_per_block_optin, device.name);
    return d;
  }
  d.chunks = chunks;
  if (explain)
    d.reason = fmt::format(
        "context-parallel state{}: segments of {} chunks ({} tokens), {} segment ids; {} "
        "(sequence, "
        "value head) pairs would leave {} of {} SMs idle. Segment pass: end states from zero and "
        "the identity (the segment's linear map M) in parallel; scan: X_(s+1) = X_s M_s + B_s in "
        "f32; resume pass: each segment from its exact initial state, value tile {}, {} input "
        "stages",
        forced ? " (forced by options.force_mode)" : "", chunks, chunks * kGdnPrefillChunk,
        segments, pairs, std::max<std::int64_t>(0, device.sm_count - pairs * tiles),
        device.sm_count, d.bv, d.stages);
  return d;
}

// The context-parallel decision for a call: the one the plan takes (choose) and, without
// texts, the memo key's (it depends on T and the caller's workspace, which the key does not
// hold). chunks == 0 when not taken or not considered (only auto and the context-parallel modes
// consider it).
CpDecision cp_decision(const Problem& pr, const DeviceLimits& device, bool explain) {
  if (pr.forced_kind == ModeKind::automatic) {
    return decide_cp(pr, device, pr.user_workspace, 0, false, 0, explain);
  }
  if (pr.forced_kind != ModeKind::context_parallel) return {};
  return decide_cp(pr, device, pr.user_workspace, pr.forced_cp_chunks, true, pr.forced_stages,
                   explain);
}

// The arch-specific target of warpgroup wgmma: sm_90a, which only compute capability 9.0 runs
// (not sm_100 and later).
constexpr Arch kSm90a{9, 0, 'a'};
bool has_sm90a(const DeviceLimits& device) {
  return device.arch.major == 9 && device.arch.minor == 0;
}

// The sm_90a kernels' one shape: the wgmma state kernel, the context-parallel passes on wgmma and
// the warp-specialized kernel all take K = V = 128 on compute capability 9.0 only.
bool sm90a_k_v_128(const Problem& pr, const DeviceLimits& device) {
  return pr.k == 128 && pr.v == 128 && has_sm90a(device);
}

// The context-parallel passes (segment and resume) on warpgroup wgmma: the sequential whole-V
// kernel's tiles and handoff (K = V = 128, 3 stages, sm_90a), where their blocks without outputs
// (the middle segments' end states from zero and from the identity) skip q, P and the products
// that feed only O, as on mma.sync. Measured on the H100 (docs/performance.md, "The
// context-parallel passes on wgmma"): 11-16% less per call at 1 and 2 sequences of 16k-128k
// tokens, HV = 16 and 32 (segment pass 15-17% and resume pass 12-26% faster).
bool cp_wgmma_fits(const Problem& pr, const DeviceLimits& device, const Decision& choice) {
  return choice.cp_chunks > 0 && choice.bv == 128 && choice.cp_stages >= 3 &&
         sm90a_k_v_128(pr, device);
}

void take_cp_wgmma(Decision& choice, std::string_view why) {
  choice.wgmma = true;
  choice.reasons.push_back(fmt::format(
      "context-parallel passes and the chunk kernel's products on warpgroup wgmma, compiled for "
      "sm_90a ({}; whole-V tile, K = V = 128, 3 stages)",
      why));
}

// The sequential whole-V state kernel on warpgroup wgmma (sm_90a, compute capability 9.0 only):
// with its operand tiles 128-byte swizzled it took the call at 128k tokens from 1710 to 1553 us
// (H = HV = 16) and from 3222 to 2694 (HV = 32) on the H200, 6-17% less at every whole-V shape
// of bench_gdn_prefill, beside the mma.sync tile that forms P itself (docs/performance.md,
// "The wgmma state kernel's tiles, swizzled"); the chunk kernel's products on wgmma from swizzled
// tiles then took 128k/16 from 1553 to 1380 us ("The chunk kernel's products on wgmma,
// swizzled"). Chosen where measured: K = V = 128 with the 3 stages handed over by mbarriers, for
// the context-parallel passes too since December (cp_wgmma_fits); the 64-row tile and other sizes
// keep mma.sync.
void prefer_wgmma(const Problem& pr, const DeviceLimits& device, Decision& choice) {
  if (choice.chunked && cp_wgmma_fits(pr, device, choice)) {
    take_cp_wgmma(choice, "the planner's choice");
    return;
  }
  if (!choice.chunked || choice.cp_chunks > 0 || choice.bv != 128 || choice.state_stages < 3 ||
      !sm90a_k_v_128(pr, device)) {
    return;
  }
  choice.wgmma = true;
  choice.reasons.push_back(
      "both kernels on warpgroup wgmma, compiled for sm_90a (whole-V tile, K = V = 128, 3 "
      "stages: 16-20% less time per call than mma.sync on the H200); the chunk kernel forms P");
}

// The warp-specialized kernel in place of the two chunked kernels, unforced. It keeps T', P and
// the scales on chip (the two kernels move ~1.07 GB of them through DRAM at 128k tokens, H = HV
// = 16) but walks a chunk on one SM in about the time the two kernels spend on it in all; so it
// pays where DRAM is slow next to the SMs. Where value heads share a q/k head (HV > H) it pays
// less: the chunk kernel computes a chunk's K K^T and K Q^T once per q/k head for the group's
// value heads, the warp-specialized kernel once per value head. Measured (docs/performance.md,
// "The planner's choice between the two kernels and the warp-specialized one", and its
// December update): on the H100 (3.35 TB/s, 25 GB/s per SM) it was 1.16-1.22x faster at 16/16
// 32k and 128k in 16 sequences, 16 x 8192 and 8 x 4096, level at HV = 32 before the kernel's
// later 8% cuts, slower at 8k in 4 sequences (HV = 16 and 32: short chains in one wave) and with
// 64 or fewer pairs. On the H200 (4.8 TB/s, 36 GB/s per SM), after those cuts, in one call: at
// HV = H 1.4% (32k/16) and 2.6% (128k/16) faster than the two kernels, at HV = 2H 7% and 9%
// slower. The threshold then sat between those points (below 40 GB/s per SM where HV = H, below
// 30 where HV > H). With the kernel's later cuts, at HV = 2H on the H200 it measured within 1% of
// the two kernels (128k/32 2166-2174 against 2192 us, 32k/32 580-582 against 584); once S became
// the first products' register A (docs/performance.md, "S as register A"), 15% and 13% faster
// (128k/32 1831.8-1833.0 against 2163.8 us, 32k/32 495.3-496.2 against 571.1; 4b7d212's kernel
// already 8% and 6% faster there) and 1.5% slower at 8k in 4 sequences, which the chunk count
// below keeps on the two kernels. So one threshold, 40 GB/s per SM, for every group size;
// (sequence, value head) pairs filling at least 7/8 of the SMs, 48 or more chunks per SM in all,
// and at most kGdnPrefillRankInStateMaxSeqs sequences (the blocks rank them longest first; the
// measured calls all did). With the TMA paths (thirty-first session, H100, equal lengths) the
// kernel was 1.21-1.49x faster than the two kernels at 15.5 and 31 chunks per SM (16/16 16 x 512
// 90.4 against 121.2 us, 8 x 2048 139.3 against 207.1; 16/32 4 x 2048, 8 x 1024, 16 x 512
// 1.21-1.26x; 8k in 4 uneven sequences at HV = 2H 1.13x): below 30 GB/s per SM the chunk count
// asks 15 per SM; between 30 and 40 (the H200) it keeps 48 until measured there.
constexpr std::int64_t kWsMaxBytesPerSmSecond = 40'000'000'000;
constexpr std::int64_t kWsSlowDramBytesPerSmSecond = 30'000'000'000;
constexpr std::int64_t kWsMinChunksPerSm = 48;
constexpr std::int64_t kWsMinChunksPerSmSlowDram = 15;

struct WsVerdict {
  bool pays = false;
  std::string why;  // the plan's text either way (empty: the kernel does not apply)
};

// `explain`: format the text (plans); the memo key needs only the verdict.
WsVerdict ws_pays(const Problem& pr, const DeviceLimits& device, bool explain) {
  WsVerdict v;
  // What the kernel takes: the path prefer_wgmma picks (bf16 rows, 16-byte v, K = V = 128 on
  // sm_90a, the whole-V tile), which the planner's other rules decide from the same fields.
  if (!pr.bf16 || !pr.v16 || !sm90a_k_v_128(pr, device) || pr.seqs == 0) {
    return v;
  }
  const std::int64_t sms = std::max(device.sm_count, 1);
  const std::int64_t per_sm = device.dram_bytes_per_sm_second();
  const std::int64_t pairs = pr.seqs * pr.value_heads;
  const std::int64_t chunks =
      (pr.tokens + kGdnPrefillChunk - 1) / kGdnPrefillChunk * pr.value_heads;
  const bool fast_dram = per_sm >= kWsMaxBytesPerSmSecond;
  const bool few_pairs = 8 * pairs < 7 * sms;
  const std::int64_t min_chunks_per_sm =
      per_sm < kWsSlowDramBytesPerSmSecond ? kWsMinChunksPerSmSlowDram : kWsMinChunksPerSm;
  const bool few_chunks = chunks < min_chunks_per_sm * sms;
  const bool unranked = pr.seqs > static_cast<std::int64_t>(kGdnPrefillRankInStateMaxSeqs);
  v.pays = !fast_dram && !few_pairs && !few_chunks && !unranked;
  if (!explain) return v;
  const double gbps = static_cast<double>(per_sm) * 1e-9;
  const std::string group =
      pr.value_heads > pr.heads
          ? fmt::format("{} value heads share each of {} q/k heads", pr.value_heads, pr.heads)
          : std::string("one value head per q/k head");
  if (v.pays) {
    v.why = fmt::format(
        "warp-specialized kernel in place of the two kernels: {:.1f} GB/s of DRAM bandwidth per "
        "SM (< {} with {}) makes their workspace traffic cost more than its on-chip chunk work; "
        "{} (sequence, value head) pairs for {} SMs, {} chunks x value heads (>= {} per SM); "
        "measured 1.16-1.22x faster on the H100 (1.13-1.49x at 15.5-31 chunks per SM with its "
        "TMA paths), and on the H200 1.01-1.03x (HV = H) and 1.15-1.18x (HV = 2H) at such shapes",
        gbps, kWsMaxBytesPerSmSecond / 1'000'000'000, group, pairs, sms, chunks, min_chunks_per_sm);
  } else {
    v.why = fmt::format(
        "two kernels, not the warp-specialized one: {}",
        fast_dram   ? fmt::format("{:.1f} GB/s of DRAM bandwidth per SM (>= {} with {}: the "
                                    "workspace traffic is cheap enough)",
                                  gbps, kWsMaxBytesPerSmSecond / 1'000'000'000, group)
        : few_pairs ? fmt::format("{} (sequence, value head) pairs leave more than 1/8 of {} SMs "
                                  "idle (one block walks each)",
                                  pairs, sms)
        : few_chunks
            ? fmt::format("{} chunks x value heads, fewer than {} per SM (short chains: the two "
                          "kernels spread a chunk's work over more SMs)",
                          chunks, min_chunks_per_sm)
            : fmt::format("{} sequences, more than the {} its blocks rank longest first", pr.seqs,
                          kGdnPrefillRankInStateMaxSeqs));
  }
  return v;
}

// The warp-specialized kernel in place of the two kernels (forced or the planner's): its fields;
// the two kernels' tiles, stages and reasons no longer apply.
void take_ws(Decision& choice) {
  choice.bv = 128;
  choice.wgmma = true;
  choice.ws = true;
  choice.cp_chunks = 0;
  choice.reasons.clear();
}

// What the warp-specialized kernel does, for the plan's reasons.
std::string ws_layout_text() {
  return fmt::format(
      "per (sequence, value head) one block of {} threads, compiled for sm_90a; a chunk "
      "warpgroup loads each chunk's q, k, v rows into {} shared-memory stages (TMA boxes where "
      "the call's tensors take maps and KJIT_TENSOR_MAPS allows, cp.async copies otherwise) and "
      "computes T', P and the scales there one chunk ahead; two state warpgroups carry the state "
      "on wgmma and store bf16 out by TMA boxes likewise; no workspace",
      kGdnPrefillWsThreads, kGdnPrefillWsStages);
}

// Turns the planner's two-kernel wgmma path into the warp-specialized kernel where ws_pays.
void prefer_ws(const Problem& pr, const DeviceLimits& device, Decision& choice) {
  if (!choice.chunked || !choice.wgmma || choice.cp_chunks > 0 || choice.bv != 128) return;
  WsVerdict verdict = ws_pays(pr, device, true);
  if (verdict.why.empty()) return;
  if (!verdict.pays) {
    choice.reasons.push_back(std::move(verdict.why));
    return;
  }
  take_ws(choice);
  choice.reasons.push_back(std::move(verdict.why));
  choice.reasons.push_back(ws_layout_text());
}

// The path and tiles of a call. The state kernel's wide tiles (value tile >= 64, K <= 128) can
// multiply on warpgroup wgmma, which reads each chunk's k, q, T' and P from shared memory once
// per four warps instead of once per warp. It exists only in the arch-specific target sm_90a
// (not on sm_100 and later); the planner takes it for the whole-V tile (prefer_wgmma), and a
// "_wgmma" mode asks for it on the 64-row tile too.
Decision choose(const Problem& pr, const DeviceLimits& device) {
  const std::string_view force = pr.mode();
  switch (pr.forced_kind) {
    case ModeKind::automatic: {
      Decision choice = choose_path(pr, false, 0, device, force);
      if (choice.chunked) {
        const CpDecision cp = cp_decision(pr, device, true);
        if (cp.chunks > 0) {
          choice.cp_chunks = cp.chunks;
          choice.cp_stages = cp.stages;
          choice.bv = cp.bv;
          choice.reasons.back() = cp.reason;  // in place of the sequential state kernel's tile
        } else {
          choice.reasons.push_back(cp.why_not);
        }
      }
      prefer_wgmma(pr, device, choice);
      prefer_ws(pr, device, choice);
      return choice;
    }
    case ModeKind::fused:
      return choose_tile(pr, pr.forced_bv, device);
    case ModeKind::context_parallel: {
      Decision choice = choose_path(pr, true, 0, device, force);
      const CpDecision cp = cp_decision(pr, device, true);
      if (!cp.why_not.empty()) {
        throw PlanError(
            fmt::format("{}: options.force_mode '{}': the context-parallel path cannot run: {}",
                        kOp, force, cp.why_not));
      }
      choice.cp_chunks = cp.chunks;
      choice.cp_stages = cp.stages;
      choice.bv = cp.bv;
      choice.reasons.back() = cp.reason;  // in place of the sequential state kernel's tile
      if (pr.forced_wgmma) {
        if (!cp_wgmma_fits(pr, device, choice)) {
          throw PlanError(fmt::format(
              "{}: options.force_mode '{}': the context-parallel passes on warpgroup wgmma need "
              "compute capability 9.0 (sm_90a), K = V = 128 (the whole-V tile) and 3 input "
              "stages; here {}, K = {}, V = {}, value tile {}, {} stages",
              kOp, force, device.arch.str(), pr.k, pr.v, choice.bv, choice.cp_stages));
        }
        take_cp_wgmma(choice, fmt::format("forced by options.force_mode '{}'", force));
      }
      return choice;
    }
    case ModeKind::warp_specialized: {
      // Its own limits first: the chunked path's whole-V tile below does not exist at V = 64,
      // and its refusal then named a tile instead of K and V.
      if (!sm90a_k_v_128(pr, device)) {
        throw PlanError(fmt::format(
            "{}: options.force_mode '{}': the warp-specialized kernel needs compute capability "
            "9.0 (sm_90a: wgmma, setmaxnreg) and K = V = 128; here {}, K = {}, V = {}",
            kOp, force, device.arch.str(), pr.k, pr.v));
      }
      // What the chunked path needs (bf16 rows, v aligned for 16-byte copies) holds for it too.
      Decision choice = choose_path(pr, true, 128, device, force);
      take_ws(choice);
      choice.reasons.push_back(
          fmt::format("warp-specialized kernel (forced by options.force_mode '{}'): {}", force,
                      ws_layout_text()));
      return choice;
    }
    case ModeKind::chunked:
      break;
  }
  Decision choice = choose_path(pr, true, pr.forced_bv, device, force);
  if (!pr.forced_wgmma) return choice;
  // (A wide tile at K > 128 never gets here: state_tile_limit refuses it in parse_mode.)
  if (!has_sm90a(device) || !gdn_prefill_state_wide(choice.bv)) {
    throw PlanError(fmt::format(
        "{}: options.force_mode '{}': warpgroup wgmma needs compute capability 9.0 (sm_90a), a "
        "value tile of 64 or 128 and K <= 128; here {}, value tile {}, K = {}",
        kOp, force, device.arch.str(), choice.bv, pr.k));
  }
  choice.wgmma = true;
  choice.reasons.push_back(
      fmt::format("state kernel and the chunk kernel's products on warpgroup wgmma (forced by "
                  "options.force_mode '{}'): both compiled for sm_90a",
                  force));
  return choice;
}

std::string checkpoint_reason(std::int64_t every) {
  return every > 0 ? fmt::format(
                         "state checkpoints every {} tokens ({} chunks of {}): each sequence "
                         "writes floor(length / {}) states to options.state_checkpoints from "
                         "row checkpoint_cu_starts[n] (kernel ckpt=1)",
                         every, every / kGdnPrefillChunk, kGdnPrefillChunk, every)
                   : std::string("no state checkpoints (kernel ckpt=0)");
}

// Blocks of the chunk kernel along x: a grid-stride loop covers the floor(T / 64) + N chunk ids,
// so the launch shape (and the memoized plan) does not depend on T. About 32 blocks per SM in
// all, whatever H is: ~10 waves of the 3 resident blocks, so the last wave's imbalance is
// small, while blocks past the chunk count of a short call exit at once.
std::int64_t chunk_grid_x(const Problem& pr, const DeviceLimits& device) {
  return std::max<std::int64_t>(1, (32 * std::int64_t{device.sm_count} + pr.heads - 1) / pr.heads);
}

// Every specialization value of the three gdn_prefill families for a problem, by parameter
// name, computed once: each family's spec (family_spec) keeps the ones it declares.
using SpecValues = std::vector<std::pair<std::string, std::string>>;

// `stages`: the state kernels' input stages (Decision::state_stages or cp_stages).
SpecValues spec_values(const Problem& pr, int bv, int stages, bool state_p) {
  return {{"qkv", std::string(to_string(pr.qkv))},
          {"gate", std::string(to_string(pr.gate))},
          {"param", std::string(to_string(pr.param))},
          {"state", std::string(to_string(pr.state))},
          {"out", std::string(to_string(pr.out))},
          {"cu", std::string(to_string(pr.cu))},
          {"index", std::string(to_string(pr.index))},
          {"k", std::to_string(pr.k)},
          {"v", std::to_string(pr.v)},
          {"bv", std::to_string(bv)},
          {"gated", pr.gated ? "1" : "0"},
          {"l2norm", pr.l2norm ? "1" : "0"},
          {"ckpt", pr.checkpoint_every > 0 ? "1" : "0"},
          {"phase", "1"},
          {"stages", std::to_string(stages)},
          // Left out of V-major specs (the families' omitted default): their text is unchanged.
          {"state_layout", pr.k_major ? "kv" : "vk"},
          {"statep", state_p ? "1" : "0"}};
}

KernelSpec family_spec(std::string_view family, const SpecValues& values, Arch arch) {
  SpecValues params;
  for (const codegen::ParamDecl& decl : codegen::find_family(family).params) {
    for (const auto& value : values) {
      if (value.first == decl.name) params.push_back(value);
    }
  }
  return KernelSpec::make(family, std::move(params), arch);
}

// The context-parallel plan: the chunk kernel, the segment pass (starting during the chunk
// kernel's tail when each of its blocks fills an SM), the scan, the resume pass.
Plan make_cp_plan(const Problem& pr, Plan plan, KernelSpec chunk_spec, LaunchShape chunk_shape,
                  SpecValues values, const Decision& choice, const DeviceLimits& device) {
  const std::int64_t segments = cp_segments(pr, choice.cp_chunks);
  const std::int64_t v_tiles = pr.v / choice.bv, k_tiles = pr.k / choice.bv;
  // (choice.wgmma: the passes on warpgroup wgmma, sm_90a; the scan stays on the device's target.)
  const Arch pass_arch = choice.wgmma ? kSm90a : device.arch;
  KernelSpec segment_spec = family_spec("gdn_prefill_state_cp", values, pass_arch);
  // (A std::string built first and moved in: assigning the literal made GCC 12 at -O3 report a
  // false -Wrestrict overlap, which failed Release builds with KJIT_WERROR.)
  for (auto& value : values) {
    if (value.first == "phase") value.second = std::string(1, '2');
  }
  KernelSpec resume_spec = family_spec("gdn_prefill_state_cp", values, pass_arch);
  KernelSpec scan_spec = family_spec("gdn_prefill_cp_scan", values, device.arch);
  const auto state_shape = [&](std::int64_t blocks) {
    if (blocks > device.max_grid_dim[0]) {
      throw PlanError(fmt::format("{}: grid x is {}, a context-parallel pass needs {} blocks", kOp,
                                  device.max_grid_dim[0], blocks));
    }
    LaunchShape shape;
    shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
    shape.block = Dim3{static_cast<std::uint32_t>(32 * gdn_prefill_state_warps(choice.bv)), 1, 1};
    shape.dynamic_smem =
        gdn_prefill_state_smem(static_cast<int>(pr.k), choice.bv, choice.cp_stages).total;
    return shape;
  };
  LaunchShape segment_shape = state_shape(segments * pr.value_heads * (v_tiles + k_tiles));
  segment_shape.overlaps_previous =
      supports_programmatic_launch(device.arch) &&
      occupancy_blocks_per_sm(segment_shape, device, FunctionLimits{}) == 1;
  const LaunchShape resume_shape = state_shape(segments * pr.value_heads * v_tiles);
  const std::int64_t scan_blocks = pr.seqs * pr.value_heads * (pr.v / kGdnPrefillCpScanRows);
  if (scan_blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the context-parallel scan needs {} blocks", kOp,
                                device.max_grid_dim[0], scan_blocks));
  }
  LaunchShape scan_shape;
  scan_shape.grid = Dim3{static_cast<std::uint32_t>(scan_blocks), 1, 1};
  scan_shape.block = Dim3{kGdnPrefillCpScanThreads, 1, 1};
  scan_shape.dynamic_smem = gdn_prefill_cp_scan_smem(static_cast<int>(pr.k));
  plan.reasons.push_back(fmt::format(
      "chunk kernel: {} x {} blocks; segment pass: {} blocks ({} segment ids x {} value heads x "
      "({} state + {} identity tiles)){}; scan: {} blocks of {} rows; resume pass: {} blocks",
      chunk_shape.grid.x, chunk_shape.grid.y, segment_shape.grid.x, segments, pr.value_heads,
      v_tiles, k_tiles,
      segment_shape.overlaps_previous ? ", started during the chunk kernel's tail" : "",
      scan_shape.grid.x, kGdnPrefillCpScanRows, resume_shape.grid.x));
  plan.reasons.push_back(
      fmt::format("workspace: T x HV x {} bytes plus {} bytes of segment states and maps",
                  2 * kGdnPrefillWsRowBytes + kGdnPrefillWsScaleBytes,
                  cp_workspace_bytes(pr, choice.cp_chunks) -
                      gdn_prefill_workspace_bytes(pr.tokens, pr.value_heads)));
  for (auto [spec, shape] :
       {std::pair{&chunk_spec, chunk_shape}, std::pair{&segment_spec, segment_shape},
        std::pair{&scan_spec, scan_shape}, std::pair{&resume_spec, resume_shape}}) {
    PlannedLaunch launch{std::move(*spec), shape, check_launch(shape, device)};
    require_legal(launch.checks, fmt::format("{} ({})", kOp, launch.spec.str()));
    plan.launches.push_back(std::move(launch));
  }
  return plan;
}

Plan make_chunked_plan(const Problem& pr, Decision choice, const DeviceLimits& device) {
  const std::int64_t every = pr.checkpoint_every;
  Plan plan;
  plan.op = kOp;
  plan.mode = choice.cp_chunks > 0
                  ? fmt::format("chunked_cp{}_bv{}{}", choice.cp_chunks, choice.bv,
                                choice.wgmma ? "_wgmma" : "")
                  : fmt::format("chunked_bv{}{}", choice.bv, choice.wgmma ? "_wgmma" : "");
  plan.reasons = std::move(choice.reasons);
  plan.device = device;
  plan.reasons.push_back(checkpoint_reason(every));
  plan.reasons.push_back(
      fmt::format("workspace: T x HV x {} bytes (T' and P rows, scales; options.workspace, else "
                  "cuMemAllocAsync on the call's stream)",
                  2 * kGdnPrefillWsRowBytes + kGdnPrefillWsScaleBytes));
  if (pr.seqs == 0) {
    plan.reasons.push_back("no sequences: nothing to launch");
    return plan;
  }
  // Who forms each chunk's P = tril(Q K^T ...). The state kernel's wide mma.sync tiles can, from
  // the q and k tiles they hold anyway: the chunk kernel then skips Q K^T and the P rows (24%
  // less chunk-kernel time at 128k tokens), the state kernel forms P during the chunk before
  // (14% more state-kernel time). Measured on the H200 (docs/performance.md, "P formed by the
  // state kernel"), that pays for the whole-V tile of the sequential path without GVA (3-5%
  // less per call at H = HV = 16); with GVA the chunk kernel's Q K^T serves HV / H value heads
  // and the state kernel would form it once per value head, 4 warps (bv = 64) each take 2-3 of
  // the ten 16 x 16 blocks, and the context-parallel passes form P twice per chunk: slower.
  const bool wide_mma_sync = gdn_prefill_state_wide(choice.bv) && !choice.wgmma;
  // On wgmma the whole-V tile's two warpgroups form half of P's columns each, during the chunk
  // before (3 stages handed over by mbarriers, the sequential kernel).
  const bool wgmma_can_form_p =
      choice.wgmma && choice.bv == 128 && choice.cp_chunks == 0 && choice.state_stages >= 3;
  if (pr.forced_state_p == 1 && !wide_mma_sync && !wgmma_can_form_p) {
    throw PlanError(fmt::format(
        "{}: options.force_mode '{}': P is formed by the state kernel's wide mma.sync tiles "
        "(value tile 64 or 128) or its sequential whole-V wgmma tile with 3 stages (this plan's "
        "tile is {}{}, {} stages{})",
        kOp, pr.mode_text, choice.bv, choice.wgmma ? " on wgmma" : "",
        choice.cp_chunks > 0 ? choice.cp_stages : choice.state_stages,
        choice.cp_chunks > 0 ? ", in the context-parallel passes" : ""));
  }
  // (K = V = 128 with the 3 stages handed over by mbarriers only: the configurations measured.
  // With V = 256 two tiles per value head would each form P; K = 64 and the 2-stage form, which
  // forms P within the step behind a block barrier, have not run on a GPU in this form.)
  const bool state_p = pr.forced_state_p >= 0
                           ? pr.forced_state_p == 1
                           : wide_mma_sync && choice.bv == 128 && choice.cp_chunks == 0 &&
                                 choice.state_stages >= 3 && pr.heads == pr.value_heads &&
                                 pr.k == 128 && pr.v == 128;
  plan.reasons.push_back(
      state_p ? "P formed by the state kernel from its q and k tiles, during the chunk before (the "
                "chunk kernel writes P's row factors instead of P: no Q K^T there)"
              : "P formed by the chunk kernel (the state kernel forms it only with its whole-V "
                "mma.sync tile, sequential, H = HV, K = V = 128, 3 stages)");
  const SpecValues values = spec_values(
      pr, choice.bv, choice.cp_chunks > 0 ? choice.cp_stages : choice.state_stages, state_p);
  // The chunk kernel's K K^T and Q K^T run on warpgroup wgmma from 128-byte-swizzled tiles
  // (sm_90a) in a wgmma plan and at K = 128 on every other chunked plan of compute capability 9.0:
  // the chunk kernel alone took 9-20% less than on mma.sync at K = 128 (docs/performance.md,
  // "The chunk kernel's products on wgmma, swizzled"); K = 64 and 256 (12 bytes of spills there)
  // are not measured and keep mma.sync unless the plan is a wgmma one.
  const bool chunk_wgmma = choice.wgmma || (has_sm90a(device) && pr.k == 128);
  if (chunk_wgmma && !choice.wgmma) {
    plan.reasons.push_back(
        "chunk kernel's K K^T and Q K^T on warpgroup wgmma, compiled for sm_90a (K = 128 on "
        "compute capability 9.0: 9-20% less chunk-kernel time than mma.sync on the H200); the "
        "state kernel on mma.sync");
  }
  KernelSpec chunk_spec =
      family_spec("gdn_prefill_chunk", values, chunk_wgmma ? kSm90a : device.arch);
  KernelSpec state_spec =
      family_spec("gdn_prefill_state", values, choice.wgmma ? kSm90a : device.arch);
  if (pr.heads > device.max_grid_dim[1]) {
    throw PlanError(fmt::format("{}: grid y is {}, the chunk kernel needs H = {}", kOp,
                                device.max_grid_dim[1], pr.heads));
  }
  LaunchShape chunk_shape;
  chunk_shape.grid = Dim3{static_cast<std::uint32_t>(chunk_grid_x(pr, device)),
                          static_cast<std::uint32_t>(pr.heads), 1};
  chunk_shape.block = Dim3{kGdnPrefillThreads, 1, 1};
  chunk_shape.dynamic_smem = gdn_prefill_chunk_smem(static_cast<int>(pr.k)).total;
  if (choice.cp_chunks > 0) {
    return make_cp_plan(pr, std::move(plan), chunk_spec, chunk_shape, values, choice, device);
  }
  const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / choice.bv);
  if (blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the state kernel needs {} blocks", kOp,
                                device.max_grid_dim[0], blocks));
  }
  LaunchShape state_shape;
  state_shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  state_shape.block =
      Dim3{static_cast<std::uint32_t>(32 * gdn_prefill_state_warps(choice.bv)), 1, 1};
  state_shape.dynamic_smem =
      gdn_prefill_state_smem(static_cast<int>(pr.k), choice.bv, choice.state_stages).total;
  // The state kernel's blocks take the SMs the chunk kernel's last blocks leave, and find their
  // sequence and load their initial state before they wait for its results.
  // Started early, the blocks land on the SMs the chunk kernel frees first, as many per SM as
  // fit, so the longest sequences (the first blocks) would share SMs while others idle. So the
  // overlap is taken only where each block gets an SM of its own: when one block's shared
  // memory already fills more than half an SM (the value tile of 128), or when the grid fits
  // the SMs and asking for just over half an SM's shared memory costs nothing.
  const bool one_per_sm = occupancy_blocks_per_sm(state_shape, device, FunctionLimits{}) == 1;
  // The least shared memory (in 128-byte steps) of which an SM holds one block only.
  const std::int64_t smem_one_per_sm =
      (device.max_smem_per_sm / 2 - device.reserved_smem_per_block + 1 + 127) / 128 * 128;
  const bool spread = !one_per_sm && blocks <= device.sm_count &&
                      smem_one_per_sm <= device.max_smem_per_block_optin;
  state_shape.overlaps_previous =
      supports_programmatic_launch(device.arch) && (one_per_sm || spread);
  if (state_shape.overlaps_previous && spread) {
    state_shape.dynamic_smem = static_cast<std::uint32_t>(smem_one_per_sm);
  }
  plan.reasons.push_back(fmt::format(
      "chunk kernel: {} x {} blocks of {} threads loop over the floor(T / {}) + N chunk ids, {} "
      "bytes of shared memory; state kernel: one block per (sequence, value head, value tile), "
      "{}",
      chunk_shape.grid.x, chunk_shape.grid.y, kGdnPrefillThreads, kGdnPrefillChunk,
      chunk_shape.dynamic_smem,
      orders_longest_first(pr)
          ? fmt::format("longest sequences first (ranked by chunk count, by the state kernel's "
                        "blocks up to {} sequences, else by the chunk kernel; a sequence bounds "
                        "the time once it starts late)",
                        kGdnPrefillRankInStateMaxSeqs)
          : fmt::format("in sequence order (longest-first ranking is kept for 2 to {} sequences)",
                        kGdnPrefillOrderMaxSeqs)));
  plan.reasons.push_back(
      state_shape.overlaps_previous
          ? fmt::format("state kernel starts while the chunk kernel's last blocks run "
                        "(programmatic dependent launch): it ranks the sequences and loads the "
                        "initial states, then waits for the chunk kernel's results{}",
                        spread ? fmt::format("; its {} blocks ask for {} bytes of shared memory "
                                             "(one block per SM, as on an idle GPU)",
                                             blocks, smem_one_per_sm)
                               : std::string())
      : !supports_programmatic_launch(device.arch)
          ? fmt::format("state kernel starts after the chunk kernel (programmatic dependent "
                        "launch needs sm_90 or later; {})",
                        device.arch.str())
          : fmt::format("state kernel starts after the chunk kernel: {} blocks, several per "
                        "SM, would pile onto the SMs the chunk kernel frees first",
                        blocks));
  PlannedLaunch chunk{std::move(chunk_spec), chunk_shape, check_launch(chunk_shape, device)};
  require_legal(chunk.checks, fmt::format("{} ({})", kOp, chunk.spec.str()));
  PlannedLaunch rec{std::move(state_spec), state_shape, check_launch(state_shape, device)};
  require_legal(rec.checks, fmt::format("{} ({})", kOp, rec.spec.str()));
  plan.launches.push_back(std::move(chunk));
  plan.launches.push_back(std::move(rec));
  return plan;
}

// The warp-specialized path's one launch: a block per (sequence, value head), longest first when
// the block can rank the sequences itself (up to kGdnPrefillRankInStateMaxSeqs).
Plan make_ws_plan(const Problem& pr, Decision choice, const DeviceLimits& device) {
  Plan plan;
  plan.op = kOp;
  plan.mode = "chunked_ws";
  plan.reasons = std::move(choice.reasons);
  plan.device = device;
  plan.reasons.push_back(checkpoint_reason(pr.checkpoint_every));
  if (pr.seqs == 0) {
    plan.reasons.push_back("no sequences: nothing to launch");
    return plan;
  }
  const std::int64_t blocks = pr.seqs * pr.value_heads;
  if (blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the warp-specialized kernel needs {} blocks",
                                kOp, device.max_grid_dim[0], blocks));
  }
  LaunchShape shape;
  shape.grid = Dim3{static_cast<std::uint32_t>(blocks), 1, 1};
  shape.block = Dim3{kGdnPrefillWsThreads, 1, 1};
  shape.dynamic_smem = gdn_prefill_ws_smem(static_cast<int>(pr.k)).total;
  plan.reasons.push_back(fmt::format(
      "{} blocks, {} bytes of shared memory each (one per SM); sequences {}", blocks,
      shape.dynamic_smem,
      ws_ranks_sequences(pr)
          ? "longest first (ranked by each block: a sequence bounds the time once it starts late)"
          : fmt::format("in index order (blocks rank up to {} sequences)",
                        kGdnPrefillRankInStateMaxSeqs)));
  KernelSpec spec =
      family_spec("gdn_prefill_ws", spec_values(pr, 128, kGdnPrefillWsStages, true), kSm90a);
  PlannedLaunch launch{std::move(spec), shape, check_launch(shape, device)};
  require_legal(launch.checks, fmt::format("{} ({})", kOp, launch.spec.str()));
  plan.launches.push_back(std::move(launch));
  return plan;
}

Plan make_plan(const Problem& pr, Decision choice, const DeviceLimits& device) {
  const std::int64_t every = pr.checkpoint_every;
  const bool ckpt = every > 0;
  if (pr.k_major) {
    choice.reasons.push_back(
        "state layout kv: the pool (and the final states and checkpoints) have V contiguous "
        "(strides [*, V*K, 1, V]: a transposed [.., HV, K, V] tensor); the state kernels read and "
        "write element (v, k) at k * V + v (spec state_layout=kv)");
  }
  if (choice.ws) return make_ws_plan(pr, std::move(choice), device);
  if (choice.chunked) {
    return make_chunked_plan(pr, std::move(choice), device);
  }
  KernelSpec spec = family_spec("gdn_prefill", spec_values(pr, choice.bv, 2, false), device.arch);
  Plan plan;
  plan.op = kOp;
  plan.mode = fmt::format("bv{}", choice.bv);
  plan.reasons = std::move(choice.reasons);
  plan.device = device;
  plan.reasons.push_back(
      ckpt
          ? fmt::format("state checkpoints every {} tokens ({} chunks of {}): each sequence writes "
                        "floor(length / {}) states to options.state_checkpoints from row "
                        "checkpoint_cu_starts[n] (kernel ckpt=1)",
                        every, every / kGdnPrefillChunk, kGdnPrefillChunk, every)
          : std::string("no state checkpoints (kernel ckpt=0)"));
  if (pr.seqs == 0) {
    plan.reasons.push_back("no sequences: nothing to launch");
    return plan;
  }
  const std::int64_t blocks = pr.seqs * pr.value_heads * (pr.v / choice.bv);
  LaunchShape shape;
  shape.grid =
      Dim3{static_cast<std::uint32_t>(std::min<std::int64_t>(blocks, (std::int64_t{1} << 32) - 1)),
           1, 1};
  shape.block = Dim3{kGdnPrefillThreads, 1, 1};
  shape.dynamic_smem = gdn_prefill_smem(static_cast<int>(pr.k), choice.bv).total;
  if (blocks > device.max_grid_dim[0]) {
    throw PlanError(fmt::format("{}: grid x is {}, the launch needs {} blocks", kOp,
                                device.max_grid_dim[0], blocks));
  }
  plan.reasons.push_back(fmt::format(
      "one block of {} threads per (sequence, value head, value tile) walks its chunks of {} "
      "tokens; {} bytes of dynamic shared memory",
      kGdnPrefillThreads, kGdnPrefillChunk, shape.dynamic_smem));
  PlannedLaunch launch{std::move(spec), shape, check_launch(shape, device)};
  require_legal(launch.checks, fmt::format("{} ({})", kOp, launch.spec.str()));
  plan.launches.push_back(std::move(launch));
  return plan;
}

}  // namespace

std::int64_t cp_workspace_bytes(const Problem& pr, std::int64_t chunks) {
  const GdnPrefillWorkspace base = gdn_prefill_workspace(
      static_cast<std::uint64_t>(pr.tokens), static_cast<std::uint64_t>(pr.value_heads));
  return static_cast<std::int64_t>(
      gdn_prefill_cp_workspace(base.total, static_cast<std::uint64_t>(cp_segments(pr, chunks)),
                               static_cast<std::uint64_t>(pr.value_heads),
                               static_cast<std::uint64_t>(pr.k), static_cast<std::uint64_t>(pr.v))
          .total);
}

Problem Family::memo_problem(const Problem& problem, const DeviceLimits& limits) {
  Problem key = problem;
  key.cp_chunks = cp_decision(problem, limits, false).chunks;
  key.cp_segment_ids = key.cp_chunks > 0 ? cp_segments(problem, key.cp_chunks) : 0;
  key.ws_by_planner =
      problem.forced_kind == ModeKind::automatic && ws_pays(problem, limits, false).pays;
  key.tokens = 0;
  key.user_workspace = -1;
  key.caller_workspace = false;
  return key;
}

Planned<Choice> Family::plan(const Problem& problem, const DeviceLimits& limits) {
  Decision decision = choose(problem, limits);
  Choice choice;
  choice.path = !decision.chunked        ? Path::fused
                : decision.ws            ? Path::warp_specialized
                : decision.cp_chunks > 0 ? Path::context_parallel
                                         : Path::chunked;
  choice.bv = decision.bv;
  choice.wgmma = decision.wgmma;
  choice.cp_chunks = decision.cp_chunks;
  choice.cp_stages = decision.cp_stages;
  return {make_plan(problem, std::move(decision), limits), choice};
}

}  // namespace kjit::ops::prefill
