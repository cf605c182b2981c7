// SPDX-License-Identifier: Apache-2.0
// gdn_prefill's sm_90a kernels run on the CPU by tests/common/sm90_emulation.hpp: the
// warp-specialized kernel (templates/gdn_prefill/ws.cuh, its three warpgroups as 384 fibers) and
// the default chunked path on the H200 (the chunk kernel's wgmma products, then the wgmma state
// kernel with its stages handed over by mbarriers), in random interleavings, cp.async copies and
// their mbarrier arrivals landing late, wgmma reading its shared operands only when retired.
// Outputs, pool and checkpoints against the float64 reference; a deadlock, a barrier arrival
// with another thread count, an arrival on an uninitialized mbarrier or a shared access out of
// bounds fails the case with what was seen. Parameters and launch shapes come from the op's own
// plan (a forced mode on compute capability 9.0) and Family::params, whose specs must be the
// instantiated kernels. This is the only coverage these kernels' synchronization gets where no
// H200 is at hand (CI); the GPU suite runs them on the hardware with compute-sanitizer.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/host_data.hpp"
#include "common/triangular.hpp"
#include "kjit/device.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/types.hpp"
#include "ops/gdn_prefill/family.hpp"
#include "ops/gdn_prefill_reference.hpp"
#include "support/numeric.hpp"
// (keep this order: the emulation header defines __device__ & co. for the template)
#include "common/sm90_emulation.hpp"
// (the host compiler does not know #pragma unroll: tests/CMakeLists.txt silences that here)
#include "templates/gdn_prefill/ws.cuh"

namespace kjit {
// The kernels' `extern __shared__ unsigned char smem[]` (the chunk kernel's in namespace kjit,
// the state and ws kernels' in gdn_prefill_detail): the emulated block's shared memory (blocks
// run one after another), the largest an sm_90 block may have. (The templates' parameters
// called smem shadow them: tests/CMakeLists.txt silences that here.)
alignas(1024) unsigned char smem[227 * 1024];
namespace gdn_prefill_detail {
alignas(1024) unsigned char smem[227 * 1024];
}  // namespace gdn_prefill_detail

namespace {

using test::Bytes;
using test::random_bytes;

/// One launch of a plan: the spec it must have and how to emulate the kernel instantiated for it.
struct Kernel {
  std::string spec;
  kjit_sm90_emulation::LaunchReport (*launch)(const PlannedLaunch&, const GdnPrefillParams&,
                                              std::uint64_t seed);
};

/// Emulates `kKernel` over the launch shape of `launch`, with `kSmem` as its shared memory.
template <auto kKernel, unsigned char* kSmem, std::size_t kSmemBytes>
kjit_sm90_emulation::LaunchReport emulate(const PlannedLaunch& launch,
                                          const GdnPrefillParams& params, std::uint64_t seed) {
  REQUIRE(launch.shape.dynamic_smem <= kSmemBytes);
  return kjit_sm90_emulation::launch(
      kKernel, EmulatedDim3{launch.shape.grid.x, launch.shape.grid.y, launch.shape.grid.z},
      launch.shape.block.x, kSmem, launch.shape.dynamic_smem, params, seed);
}

/// The first launch of the two-kernel and context-parallel plans here: the sm_90a chunk kernel
/// (raw bf16 gates, q and k normalized).
const Kernel kChunkSm90a{
    "gdn_prefill_chunk:qkv=bf16,gate=bf16,param=f32,cu=i32,k=128,gated=0,l2norm=1@sm_90a",
    &emulate<&gdn_prefill_chunk_kernel<__nv_bfloat16, __nv_bfloat16, float, int, 128, false, true,
                                       false>,
             smem, sizeof(smem)>};

/// The context-parallel scan between the two passes, on the host: the scan kernel keeps rows in
/// block-wide __shared__ arrays, which the emulation does not have (cp.cuh). Per sequence and
/// value head, X_1 = B_0 and X_(s+1) = X_s M_s + B_s, stored for s = 1 .. S - 1 at id z0 + s, in
/// the scan kernel's layouts (cu_seqlens int32, K = V = 128).
kjit_sm90_emulation::LaunchReport host_scan(const PlannedLaunch&, const GdnPrefillParams& p,
                                            std::uint64_t) {
  constexpr std::int64_t kd = 128, vd = 128;
  const std::int64_t hv_count = p.num_value_heads;
  const std::int64_t span = p.cp_segment_chunks * kGdnPrefillChunk;
  const auto* cu = static_cast<const std::int32_t*>(p.cu_seqlens);
  const auto rows = [&](float* base, std::int64_t z, std::int64_t hv) {
    return base + (z * hv_count + hv) * vd * kd;
  };
  for (std::int64_t n = 0; n < std::int64_t{p.num_seqs}; ++n) {
    const std::int64_t bos = cu[n], eos = cu[n + 1];
    const std::int64_t segments = eos > bos ? (eos - bos + span - 1) / span : 1;
    if (segments < 2) continue;
    const std::int64_t z0 = bos / span + n;
    for (std::int64_t hv = 0; hv < hv_count; ++hv) {
      std::vector<float> x(rows(p.cp_b, z0, hv), rows(p.cp_b, z0, hv) + vd * kd);
      for (std::int64_t s = 1; s < segments; ++s) {
        std::copy(x.begin(), x.end(), rows(p.cp_x, z0 + s, hv));
        if (s == segments - 1) break;
        const float* b = rows(p.cp_b, z0 + s, hv);
        const float* m = p.cp_m + ((z0 + s) * hv_count + hv) * kd * kd;
        std::vector<float> next(x.size());
        for (std::int64_t v = 0; v < vd; ++v) {
          for (std::int64_t c = 0; c < kd; ++c) {
            double acc = b[v * kd + c];
            for (std::int64_t r = 0; r < kd; ++r) {
              acc += double(x[static_cast<std::size_t>(v * kd + r)]) * m[r * kd + c];
            }
            next[static_cast<std::size_t>(v * kd + c)] = static_cast<float>(acc);
          }
        }
        x = std::move(next);
      }
    }
  }
  return {};
}

struct Case {
  /// options.force_mode.
  std::string mode = "chunked_ws";
  std::vector<std::int64_t> lengths;
  std::int64_t heads = 1, value_heads = 2;
  DType state = DType::f32, out = DType::bf16;
  bool precomputed = false;
  /// > 0: checkpoints every this many tokens (rows against the reference's).
  std::int64_t ckpt_every = 0;
  /// The pool and checkpoints as fla keeps states: each [HV, K, V] block contiguous, passed as
  /// its transpose (the state_layout=kv kernels).
  bool k_major = false;
  /// Keys close to one direction per head (k = u + noise / 4): k_i . k_j near 1 after the norms,
  /// so the off-diagonal blocks of T = (I + A)^-1 are as large as the diagonal ones. With
  /// independent random keys they are ~0.05, and an error in the inverse's block products (a
  /// transposed operand) moved the outputs by less than the tolerance.
  bool correlated_keys = false;
  /// Interleavings to run (each a seed of the scheduler), every one checked: 4, or under ASan 1
  /// (it checks the memory accesses, which every interleaving makes alike) and under TSan 2 (it
  /// checks the happens-before order of every pair of accesses in the interleaving it sees, not
  /// only of those that happened to collide).
#if defined(KJIT_EMU_ASAN)
  int schedules = 1;
#elif defined(KJIT_EMU_TSAN)
  int schedules = 2;
#else
  int schedules = 4;
#endif
};

void run(const Case& c, const std::vector<Kernel>& kernels) {
  CAPTURE(c.mode);
  test::Rng rng(test::fresh_seed());
  const std::int64_t n = static_cast<std::int64_t>(c.lengths.size());
  const std::int64_t h = c.heads, hv = c.value_heads, kd = 128, vd = 128;
  std::vector<std::int64_t> cu{0};
  for (std::int64_t len : c.lengths) cu.push_back(cu.back() + len);
  const std::int64_t t = cu.back();
  const std::int64_t slots = n + 2;
  Bytes cu_host(static_cast<std::size_t>(n + 1) * 4), idx_host(static_cast<std::size_t>(n) * 4),
      init_host(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i <= n; ++i) {
    support::store_from_double(cu_host.data(), DType::i32, i, static_cast<double>(cu[i]));
  }
  // Sequence 2 is padding (-1), sequence 1 starts from zeros; the others take slots from the
  // top, so slot 0 is named by no sequence and must come back bit-identical.
  for (std::int64_t i = 0; i < n; ++i) {
    support::store_from_double(idx_host.data(), DType::i32, i,
                               i == 2 ? -1.0 : double(slots - 1 - i));
    init_host[static_cast<std::size_t>(i)] = i == 1 ? 0 : 1;
  }
  const Bytes q = random_bytes(rng, DType::bf16, t * h * kd, 1.0);
  Bytes k = random_bytes(rng, DType::bf16, t * h * kd, 1.0);
  if (c.correlated_keys) {
    const Bytes u = random_bytes(rng, DType::f32, h * kd, 1.0);
    for (std::int64_t i = 0; i < t * h * kd; ++i) {
      const double x = support::load_as_double(u.data(), DType::f32, i % (h * kd)) +
                       0.25 * support::load_as_double(k.data(), DType::bf16, i);
      support::store_from_double(k.data(), DType::bf16, i, x);
    }
  }
  const Bytes v = random_bytes(rng, DType::bf16, t * hv * vd, 1.0);
  Bytes ga, gb, a_log = random_bytes(rng, DType::f32, hv, 0.5, -1.0),
                dt_bias = random_bytes(rng, DType::f32, hv, 0.5);
  if (c.precomputed) {
    ga.resize(static_cast<std::size_t>(t * hv) * 4);
    gb.resize(ga.size());
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (std::int64_t i = 0; i < t * hv; ++i) {
      support::store_from_double(ga.data(), DType::f32, i, -0.2 * unit(rng));
      support::store_from_double(gb.data(), DType::f32, i, unit(rng));
    }
  } else {
    ga = random_bytes(rng, DType::bf16, t * hv, 1.0);
    gb = random_bytes(rng, DType::bf16, t * hv, 1.0);
  }
  const Bytes pool = random_bytes(rng, c.state, slots * hv * vd * kd, 0.3);

  const bool ckpt = c.ckpt_every > 0;
  const std::vector<std::int64_t> starts =
      ckpt ? gdn_prefill_checkpoint_starts(cu, c.ckpt_every) : std::vector<std::int64_t>{0};
  const std::int64_t ckpt_rows = ckpt ? starts.back() : 0;
  const std::int64_t state_elems = hv * vd * kd;
  Bytes starts_host(static_cast<std::size_t>(n + 1) * 8);
  for (std::int64_t i = 0; i <= n; ++i) {
    support::store_from_double(starts_host.data(), DType::i64, i,
                               ckpt ? static_cast<double>(starts[static_cast<std::size_t>(i)]) : 0);
  }
  const auto states_view = [&](void* data, std::int64_t rows) {
    return c.k_major ? TensorView::strided(data, c.state, {rows, hv, vd, kd},
                                           {state_elems, vd * kd, 1, vd})
                     : TensorView::strided(data, c.state, {rows, hv, vd, kd},
                                           {state_elems, vd * kd, kd, 1});
  };

  // The reference on copies of the inputs.
  Bytes ref_out(static_cast<std::size_t>(t * hv * vd) * size_of(c.out), 0), ref_pool = pool;
  Bytes ref_ckpt(static_cast<std::size_t>(ckpt_rows * state_elems) * size_of(c.state), 0xFF);
  Bytes hq = q, hk = k, hvv = v, hga = ga, hgb = gb, hal = a_log, hdt = dt_bias;
  const auto gates_of = [&](void* a, void* b, void* al, void* dt) {
    const DType gd = c.precomputed ? DType::f32 : DType::bf16;
    const TensorView va = TensorView::contiguous(a, gd, {t, hv});
    const TensorView vb = TensorView::contiguous(b, gd, {t, hv});
    return c.precomputed ? GdnGates::precomputed(va, vb)
                         : GdnGates::raw(va, vb, TensorView::contiguous(al, DType::f32, {hv}),
                                         TensorView::contiguous(dt, DType::f32, {hv}));
  };
  {
    GdnPrefillOptions ref_options;
    if (ckpt) {
      ref_options.checkpoint_every_n_tokens = c.ckpt_every;
      ref_options.state_checkpoints = states_view(ref_ckpt.data(), ckpt_rows);
      ref_options.checkpoint_cu_starts =
          TensorView::contiguous(starts_host.data(), DType::i64, {n + 1});
    }
    ops::gdn_prefill_reference(TensorView::contiguous(hq.data(), DType::bf16, {t, h, kd}),
                               TensorView::contiguous(hk.data(), DType::bf16, {t, h, kd}),
                               TensorView::contiguous(hvv.data(), DType::bf16, {t, hv, vd}),
                               gates_of(hga.data(), hgb.data(), hal.data(), hdt.data()),
                               TensorView::contiguous(cu_host.data(), DType::i32, {n + 1}),
                               states_view(ref_pool.data(), slots),
                               TensorView::contiguous(idx_host.data(), DType::i32, {n}),
                               TensorView::contiguous(init_host.data(), DType::u8, {n}),
                               TensorView::contiguous(ref_out.data(), c.out, {t, hv, vd}),
                               ref_options);
  }

  for (int schedule = 0; schedule < c.schedules; ++schedule) {
    CAPTURE(schedule);
    Bytes got_pool = pool, got_out(ref_out.size(), 0xFF), got_ckpt(ref_ckpt.size(), 0xFF);
    Bytes kq = q, kk = k, kv = v, kga = ga, kgb = gb, kal = a_log, kdt = dt_bias;
    const TensorView vq = TensorView::contiguous(kq.data(), DType::bf16, {t, h, kd});
    const TensorView vk = TensorView::contiguous(kk.data(), DType::bf16, {t, h, kd});
    const TensorView vv = TensorView::contiguous(kv.data(), DType::bf16, {t, hv, vd});
    const GdnGates gates = gates_of(kga.data(), kgb.data(), kal.data(), kdt.data());
    const TensorView vcu = TensorView::contiguous(cu_host.data(), DType::i32, {n + 1});
    const TensorView vpool = states_view(got_pool.data(), slots);
    const TensorView vidx = TensorView::contiguous(idx_host.data(), DType::i32, {n});
    const TensorView vinit = TensorView::contiguous(init_host.data(), DType::u8, {n});
    const TensorView vout = TensorView::contiguous(got_out.data(), c.out, {t, hv, vd});
    GdnPrefillOptions options;
    options.force_mode = c.mode;
    if (ckpt) {
      options.checkpoint_every_n_tokens = c.ckpt_every;
      options.state_checkpoints = states_view(got_ckpt.data(), ckpt_rows);
      options.checkpoint_cu_starts =
          TensorView::contiguous(starts_host.data(), DType::i64, {n + 1});
    }
    const ops::prefill::Args args{&vq,    &vk,   &vv,    &gates, &vcu,
                                  &vpool, &vidx, &vinit, &vout,  &options};
    const ops::prefill::Problem problem = ops::prefill::Family::check(args);
    const auto planned = ops::prefill::Family::plan(problem, DeviceLimits::for_arch(Arch{9, 0}));
    REQUIRE(planned.plan.launches.size() == kernels.size());
    // The chunked path's workspace (T', P, scales, ranks), poisoned: every byte the state kernel
    // reads must have been written by the chunk kernel.
    Bytes workspace(
        static_cast<std::size_t>(ops::prefill::Family::workspace_bytes(problem, planned.choice)),
        0xFF);
    GdnPrefillParams params =
        ops::prefill::Family::params(args, problem, planned.choice, workspace.data());
    // The ws kernel's TMA paths through maps of the emulation's form (the runtime encodes the
    // same requests with the driver): interleavings 0, 1, 2, 3 take loads and stores, neither
    // (cp.async copies, plain stores), the loads only, the stores only.
    const bool tma_loads = schedule % 4 == 0 || schedule % 4 == 2;
    const bool tma_stores = schedule % 4 == 0 || schedule % 4 == 3;
    CAPTURE(tma_loads);
    CAPTURE(tma_stores);
    const auto encode = [](const ops::prefill::TensorMapSlot& slot) {
      const TensorMapRequest& r = slot.request;
      kjit_sm90_emulation::encode_tensor_map(*slot.map, r.base, r.rank, r.dims, r.strides, r.box,
                                             static_cast<std::uint32_t>(size_of(r.element)),
                                             r.swizzle_bytes);
    };
    if (tma_loads) {
      const ops::prefill::InputTensorMaps maps =
          ops::prefill::input_tensor_maps(params, problem, planned.choice);
      for (int i = 0; i < maps.count; ++i) encode(maps.slots[i]);
      params.tma_inputs = maps.count > 0 ? 1 : 0;
      if (c.mode == "chunked_ws") REQUIRE(maps.count == 3);
    }
    if (tma_stores) {
      const auto slot = ops::prefill::output_tensor_map(params, problem, planned.choice);
      if (slot) encode(*slot);
      params.tma_out = slot ? 1 : 0;
      if (c.mode == "chunked_ws") REQUIRE(slot.has_value() == (c.out == DType::bf16));
    }
    for (std::size_t i = 0; i < kernels.size(); ++i) {
      const PlannedLaunch& launch = planned.plan.launches[i];
      REQUIRE(launch.spec.str() == kernels[i].spec);
      const auto report = kernels[i].launch(launch, params, rng());
      MESSAGE(fmt::format("{}: {} blocks of {} threads: {} fiber switches, {} late landings",
                          launch.spec.str(), launch.shape.grid.x, launch.shape.block.x,
                          report.switches, report.landings_late));
      REQUIRE_MESSAGE(report.ok, report.failure);
    }

    test::check_close("out", got_out, ref_out, c.out, 1e-2);
    test::check_close("pool", got_pool, ref_pool, c.state, 1e-2);
    // Slot 0 (no sequence's) and the padding sequence's untouched.
    const std::size_t slot_bytes = static_cast<std::size_t>(state_elems) * size_of(c.state);
    CHECK(std::equal(got_pool.begin(), got_pool.begin() + static_cast<std::ptrdiff_t>(slot_bytes),
                     pool.begin()));
    if (ckpt) {
      MESSAGE("checkpoints: " << ckpt_rows << " rows");
      test::check_close("checkpoints", got_ckpt, ref_ckpt, c.state, 1e-2);
    }
  }
}

TEST_CASE("gdn_prefill ws emulated: lengths around the chunk and the stage ring, raw gates") {
  Case c;
  // 0 and 1 token; 65 and 130 end one row into a chunk; 200 runs four chunks through the three
  // stages and the two T' / P^T slots. Sequence 2 (1 token) is padding. Two q/k heads of two
  // value heads each (every other case has one q/k head: a block reading another head's q or k
  // rows, or another value head's gates, passed them all).
  c.lengths = {65, 0, 1, 200, 130};
  c.heads = 2;
  c.value_heads = 4;
  run(c, {{"gdn_prefill_ws:qkv=bf16,gate=bf16,param=f32,state=f32,out=bf16,cu=i32,index=i32,"
           "k=128,v=128,gated=0,l2norm=1,ckpt=0@sm_90a",
           &emulate<&gdn_prefill_ws_kernel<__nv_bfloat16, __nv_bfloat16, float, float,
                                           __nv_bfloat16, int, int, 128, 128, false, true, false>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

TEST_CASE("gdn_prefill ws emulated: keys close to one direction, raw gates (the f16 inverse)") {
  Case c;
  c.lengths = {200, 3, 1, 70};
  c.correlated_keys = true;
  run(c, {{"gdn_prefill_ws:qkv=bf16,gate=bf16,param=f32,state=f32,out=bf16,cu=i32,index=i32,"
           "k=128,v=128,gated=0,l2norm=1,ckpt=0@sm_90a",
           &emulate<&gdn_prefill_ws_kernel<__nv_bfloat16, __nv_bfloat16, float, float,
                                           __nv_bfloat16, int, int, 128, 128, false, true, false>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

/// One head, checkpoints every 64 tokens, precomputed gates, a bf16 pool and f32 outputs.
Case checkpoint_case(std::string mode, std::vector<std::int64_t> lengths) {
  Case c;
  c.mode = std::move(mode);
  c.lengths = std::move(lengths);
  c.heads = 1;
  c.value_heads = 1;
  c.state = DType::bf16;
  c.out = DType::f32;
  c.precomputed = true;
  c.ckpt_every = 64;
  return c;
}

TEST_CASE("gdn_prefill ws emulated: checkpoints every 64 tokens, precomputed gates, bf16 pool") {
  run(checkpoint_case("chunked_ws", {64, 1, 129, 190}),
      {{"gdn_prefill_ws:qkv=bf16,gate=f32,param=f32,state=bf16,out=f32,cu=i32,index=i32,"
        "k=128,v=128,gated=1,l2norm=1,ckpt=1@sm_90a",
        &emulate<&gdn_prefill_ws_kernel<__nv_bfloat16, float, float, __nv_bfloat16, float, int, int,
                                        128, 128, true, true, true>,
                 gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

TEST_CASE("gdn_prefill ws emulated: fla's K-major pool, three value heads per key head") {
  Case c;
  c.lengths = {129, 5, 1, 70};
  c.heads = 1;
  c.value_heads = 3;
  c.state = DType::bf16;
  c.k_major = true;
  run(c, {{"gdn_prefill_ws:qkv=bf16,gate=bf16,param=f32,state=bf16,out=bf16,cu=i32,index=i32,"
           "k=128,v=128,gated=0,l2norm=1,ckpt=0,state_layout=kv@sm_90a",
           &emulate<&gdn_prefill_ws_kernel<__nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16,
                                           __nv_bfloat16, int, int, 128, 128, false, true, false,
                                           kGdnStateKMajor>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

/// invert_chunk alone: A (a chunk's strictly lower 64 x 64, row-major) stored as the decay pass
/// stores it (store_a_pair), inverted by four warps, T' read back as f32. kL2Norm / kGated choose
/// the operands as in the kernels (f16 for <true, false>, tf32 otherwise).
struct InvertParams {
  const float* a;
  const float* beta;
  float* t;
};

template <bool kL2Norm, bool kGated, bool kStmatrix>
void invert_chunk_kernel(InvertParams p) {
  using namespace gdn_prefill_chunk_detail;
  constexpr int kLdT = 72;
  float* const s_a = reinterpret_cast<float*>(smem);
  float* const s_beta = s_a + 64 * kLdA;
  __nv_bfloat16* const s_t = reinterpret_cast<__nv_bfloat16*>(s_beta + 64);
  const int tid = static_cast<int>(threadIdx.x);
  for (int e = tid; e < 64 * 32; e += 128) {
    const int i = e / 32, j = 2 * (e % 32);
    if ((j >> 4) <= (i >> 4)) {
      store_a_pair<inverse_f16(kL2Norm, kGated)>(s_a, i, j, p.a[i * 64 + j], p.a[i * 64 + j + 1],
                                                 (j >> 4) < (i >> 4));
    }
  }
  for (int e = tid; e < 64; e += 128) s_beta[e] = p.beta[e];
  // Blocks of T' the inverse does not write (above the diagonal) keep a NaN poison.
  for (int e = tid; e < 64 * kLdT; e += 128) s_t[e] = __float2bfloat16_rn(NAN);
  __syncthreads();
  invert_chunk<kL2Norm, kGated, kStmatrix>(
      s_a, s_beta, tid >> 5, tid & 31, [&](int r, int c) { return s_t + r * kLdT + c; },
      [] { __syncthreads(); });
  __syncthreads();
  for (int e = tid; e < 64 * 64; e += 128) p.t[e] = __bfloat162float(s_t[(e / 64) * kLdT + e % 64]);
}

/// Every 16 x 16 block of T' = (I + A)^-1 diag(beta) on or below the diagonal against float64,
/// relative to the block's own size: A from unit keys cycling over four directions (with noise)
/// and small betas, so that even the blocks farthest from the diagonal hold entries ~1e-2 and a
/// block computed from a wrong (e.g. transposed) operand misses by about its own size.
/// kStmatrix: T' stored by stmatrix (sm_90 and later) or by movmatrix and 4-byte stores.
template <bool kL2Norm, bool kGated, bool kStmatrix = true>
void check_invert_chunk(test::Rng& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<double> dirs(4 * 128), keys(64 * 128), gamma(64), beta(64);
  for (double& x : dirs) x = normal(rng);
  double g = 0;
  for (int i = 0; i < 64; ++i) {
    double norm = 0;
    for (int d = 0; d < 128; ++d) {
      keys[i * 128 + d] = dirs[(i % 4) * 128 + d] + 0.3 * normal(rng);
      norm += keys[i * 128 + d] * keys[i * 128 + d];
    }
    for (int d = 0; d < 128; ++d) keys[i * 128 + d] /= std::sqrt(norm);
    g -= 0.01 * unit(rng);
    gamma[i] = g;
    beta[i] = 0.05 + 0.25 * unit(rng);
  }
  std::vector<float> a(64 * 64, 0.f), beta_f(64), t(64 * 64);
  std::vector<double> a64(64 * 64, 0.0);  // A as the kernel receives it (rounded to f32)
  for (int i = 0; i < 64; ++i) {
    beta_f[i] = static_cast<float>(beta[i]);
    for (int j = 0; j < i; ++j) {
      double dot = 0;
      for (int d = 0; d < 128; ++d) dot += keys[i * 128 + d] * keys[j * 128 + d];
      a[i * 64 + j] = static_cast<float>(beta[i] * std::exp(gamma[i] - gamma[j]) * dot);
      a64[i * 64 + j] = a[i * 64 + j];
    }
  }
  // T' = (I + A)^-1 diag(beta).
  std::vector<double> ref = test::unit_lower_inverse(a64, 64);
  for (int r = 0; r < 64; ++r) {
    for (int j = 0; j <= r; ++j) ref[r * 64 + j] *= beta[j];
  }
  const InvertParams params{a.data(), beta_f.data(), t.data()};
  const auto report =
      kjit_sm90_emulation::launch(&invert_chunk_kernel<kL2Norm, kGated, kStmatrix>,
                                  EmulatedDim3{1, 1, 1}, 128, smem, sizeof(smem), params, rng());
  REQUIRE_MESSAGE(report.ok, report.failure);
  for (int bi = 0; bi < 4; ++bi) {
    for (int bj = 0; bj <= bi; ++bj) {
      double err = 0, size = 0;
      for (int r = 16 * bi; r < 16 * bi + 16; ++r) {
        for (int c = 16 * bj; c < 16 * bj + 16; ++c) {
          const double want = r >= c ? ref[r * 64 + c] : 0.0;
          err += (t[r * 64 + c] - want) * (t[r * 64 + c] - want);
          size += want * want;
        }
      }
      CAPTURE(bi);
      CAPTURE(bj);
      CAPTURE(std::sqrt(size));
      CHECK(std::sqrt(size) > 1e-3);  // the data makes every block count
      CHECK(std::sqrt(err) <= 1e-2 * std::sqrt(size));
    }
  }
}

TEST_CASE("gdn_prefill: the chunk inverse, every block of T' against float64 (f16 and tf32)") {
  test::Rng rng(test::fresh_seed());
  SUBCASE("f16 operands (k normalized in the kernel, raw gates)") {
    check_invert_chunk<true, false>(rng);
  }
  SUBCASE("tf32 operands (precomputed gates)") { check_invert_chunk<true, true>(rng); }
  SUBCASE("tf32 operands (k as given)") { check_invert_chunk<false, false>(rng); }
  // The stores of T' before sm_90 (movmatrix and 4-byte stores; the emulation compiles as sm_90).
  SUBCASE("f16 operands, T' stored as before sm_90") {
    check_invert_chunk<true, false, false>(rng);
  }
  SUBCASE("tf32 operands, T' stored as before sm_90") {
    check_invert_chunk<true, true, false>(rng);
  }
}

// The two kernels H200 runs by default for these shapes (the chunk kernel's wgmma products, then
// the wgmma state kernel's three stages handed over by mbarriers), through a poisoned workspace.
TEST_CASE("gdn_prefill chunked emulated: the sm_90a chunk kernel, then the wgmma state kernel") {
  Case c;
  c.mode = "chunked_bv128_wgmma";
  c.lengths = {65, 0, 1, 200, 130};
  run(c, {kChunkSm90a,
          {"gdn_prefill_state:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
           "ckpt=0,stages=3@sm_90a",
           &emulate<&gdn_prefill_state_kernel<__nv_bfloat16, float, __nv_bfloat16, int, int, 128,
                                              128, 128, false, kGdnStateVMajor, 3, false>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

// The segment and resume passes on warpgroup wgmma (the planner's on compute capability 9.0 at K
// = V = 128): segments of one chunk, so that sequences of 1, 2, 3 and 4 segments (padding among
// them, sequence 1 from zeros) run the segment pass's state and identity tiles, the resume pass
// from the scan's states, and the last segment's final state.
TEST_CASE("gdn_prefill context-parallel emulated: the segment and resume passes on wgmma") {
  Case c;
  c.mode = "chunked_cp1_wgmma";
  c.lengths = {200, 1, 65, 130, 0, 64};
  run(c, {kChunkSm90a,
          {"gdn_prefill_state_cp:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
           "ckpt=0,phase=1,stages=3@sm_90a",
           &emulate<&gdn_prefill_state_cp_kernel<__nv_bfloat16, float, __nv_bfloat16, int, int, 128,
                                                 128, 128, false, 1, 3>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>},
          {"gdn_prefill_cp_scan:cu=i32,k=128,v=128@sm_90", &host_scan},
          {"gdn_prefill_state_cp:qkv=bf16,state=f32,out=bf16,cu=i32,index=i32,k=128,v=128,bv=128,"
           "ckpt=0,phase=2,stages=3@sm_90a",
           &emulate<&gdn_prefill_state_cp_kernel<__nv_bfloat16, float, __nv_bfloat16, int, int, 128,
                                                 128, 128, false, 2, 3>,
                    gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

// The same with checkpoints every 64 tokens (only blocks with the exact state write them),
// precomputed gates, a bf16 pool and f32 outputs.
TEST_CASE("gdn_prefill context-parallel emulated: wgmma passes, checkpoints, bf16 pool") {
  const Case c = checkpoint_case("chunked_cp1_wgmma", {130, 1, 64, 200});
  const auto pass = [](int phase) {
    return fmt::format(
        "gdn_prefill_state_cp:qkv=bf16,state=bf16,out=f32,cu=i32,index=i32,k=128,v=128,bv=128,"
        "ckpt=1,phase={},stages=3@sm_90a",
        phase);
  };
  run(c, {{"gdn_prefill_chunk:qkv=bf16,gate=f32,param=f32,cu=i32,k=128,gated=1,l2norm=1@sm_90a",
           &emulate<
               &gdn_prefill_chunk_kernel<__nv_bfloat16, float, float, int, 128, true, true, false>,
               smem, sizeof(smem)>},
          {pass(1), &emulate<&gdn_prefill_state_cp_kernel<__nv_bfloat16, __nv_bfloat16, float, int,
                                                          int, 128, 128, 128, true, 1, 3>,
                             gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>},
          {"gdn_prefill_cp_scan:cu=i32,k=128,v=128@sm_90", &host_scan},
          {pass(2), &emulate<&gdn_prefill_state_cp_kernel<__nv_bfloat16, __nv_bfloat16, float, int,
                                                          int, 128, 128, 128, true, 2, 3>,
                             gdn_prefill_detail::smem, sizeof(gdn_prefill_detail::smem)>}});
}

/// A problem and the choice of the warp-specialized kernel at K = V = 128, bf16 q/k/v and out,
/// for the tensor-map rules.
ops::prefill::Problem ws_map_problem(std::int64_t tokens) {
  ops::prefill::Problem pr;
  pr.tokens = tokens;
  pr.seqs = 3;
  pr.heads = 2;
  pr.value_heads = 4;
  pr.k = pr.v = 128;
  pr.qkv = pr.out = DType::bf16;
  return pr;
}
ops::prefill::Choice ws_choice() {
  ops::prefill::Choice ws;
  ws.path = ops::prefill::Path::warp_specialized;
  return ws;
}

TEST_CASE("gdn_prefill input_tensor_maps: the ws kernel's calls get q, k and v maps TMA can take") {
  using ops::prefill::Choice;
  using ops::prefill::Path;
  using ops::prefill::Problem;
  alignas(64) static unsigned char buffer[4096];
  const Problem pr = ws_map_problem(1000);
  const Choice ws = ws_choice();
  const auto params = [&] {
    GdnPrefillParams p{};
    p.q = buffer;
    p.k = buffer + 64;
    p.v = buffer + 128;
    // q and k as views of one [T, 2 H + HV, 128] projection (an engine's mixed_qkv).
    p.q_stride_t = p.k_stride_t = p.v_stride_t = 8 * 128;
    p.q_stride_h = p.k_stride_h = p.v_stride_h = 128;
    return p;
  };
  GdnPrefillParams p = params();
  const ops::prefill::InputTensorMaps maps = ops::prefill::input_tensor_maps(p, pr, ws);
  REQUIRE(maps.count == 3);
  CHECK(maps.slots[0].map == &p.q_map);
  CHECK(maps.slots[1].map == &p.k_map);
  CHECK(maps.slots[2].map == &p.v_map);
  for (int i = 0; i < 3; ++i) {
    const TensorMapRequest& r = maps.slots[i].request;
    CAPTURE(i);
    CHECK(r.element == DType::bf16);
    CHECK(r.rank == 3);
    CHECK(r.dims[0] == 128);
    CHECK(r.dims[1] == (i == 2 ? 4u : 2u));
    CHECK(r.dims[2] == 1000);
    CHECK(r.strides[0] == 256);   // a head: 128 bf16
    CHECK(r.strides[1] == 2048);  // a token: 8 heads' rows
    CHECK(r.box[0] == 64);        // one 128-byte sw128 slice
    CHECK(r.box[1] == 1);
    CHECK(r.box[2] == 64);  // a chunk
    CHECK(r.swizzle_bytes == 128);
  }
  CHECK(maps.slots[0].request.base == buffer);
  CHECK(maps.slots[2].request.base == buffer + 128);

  // No maps: other paths, an address TMA cannot take, strides of no whole 16 bytes, T >= 2^31.
  Choice chunked = ws;
  chunked.path = Path::chunked;
  CHECK(ops::prefill::input_tensor_maps(p, pr, chunked).count == 0);
  p = params();
  p.k = buffer + 8;
  CHECK(ops::prefill::input_tensor_maps(p, pr, ws).count == 0);
  p = params();
  p.v_stride_t = 8 * 128 + 4;
  CHECK(ops::prefill::input_tensor_maps(p, pr, ws).count == 0);
  p = params();
  p.q_stride_h = 0;
  CHECK(ops::prefill::input_tensor_maps(p, pr, ws).count == 0);
  p = params();
  Problem long_call = pr;
  long_call.tokens = std::int64_t{1} << 31;
  CHECK(ops::prefill::input_tensor_maps(p, long_call, ws).count == 0);
  long_call.tokens = (std::int64_t{1} << 31) - 1;
  CHECK(ops::prefill::input_tensor_maps(p, long_call, ws).count == 3);
  Problem short_call = pr;  // no whole chunk
  short_call.tokens = 63;
  CHECK(ops::prefill::input_tensor_maps(p, short_call, ws).count == 0);
  short_call.tokens = 64;
  CHECK(ops::prefill::input_tensor_maps(p, short_call, ws).count == 3);
}

TEST_CASE("gdn_prefill output_tensor_map: bf16 out of the ws kernel, in boxes of a state warp") {
  using ops::prefill::Choice;
  using ops::prefill::Path;
  using ops::prefill::Problem;
  alignas(64) static unsigned char buffer[4096];
  const Problem pr = ws_map_problem(777);
  const Choice ws = ws_choice();
  GdnPrefillParams p{};
  p.out = buffer + 16;
  p.out_stride_t = 4 * 136;  // heads padded to 272 bytes
  p.out_stride_h = 136;
  const auto slot = ops::prefill::output_tensor_map(p, pr, ws);
  REQUIRE(slot.has_value());
  CHECK(slot->map == &p.out_map);
  const TensorMapRequest& r = slot->request;
  CHECK(r.base == buffer + 16);
  CHECK(r.element == DType::bf16);
  CHECK(r.rank == 3);
  CHECK(r.dims[0] == 128);
  CHECK(r.dims[1] == 4);
  CHECK(r.dims[2] == 777);
  CHECK(r.strides[0] == 272);
  CHECK(r.strides[1] == 4 * 272);
  CHECK(r.box[0] == 16);  // a state warp's 16 values
  CHECK(r.box[1] == 1);
  CHECK(r.box[2] == 64);
  CHECK(r.swizzle_bytes == 32);

  Problem other = pr;
  other.out = DType::f32;
  CHECK_FALSE(ops::prefill::output_tensor_map(p, other, ws).has_value());
  other = pr;
  other.tokens = std::int64_t{1} << 31;
  CHECK_FALSE(ops::prefill::output_tensor_map(p, other, ws).has_value());
  other.tokens = 63;
  CHECK_FALSE(ops::prefill::output_tensor_map(p, other, ws).has_value());
  Choice chunked = ws;
  chunked.path = Path::chunked;
  CHECK_FALSE(ops::prefill::output_tensor_map(p, pr, chunked).has_value());
  GdnPrefillParams q = p;
  q.out = buffer + 8;
  CHECK_FALSE(ops::prefill::output_tensor_map(q, pr, ws).has_value());
  q = p;
  q.out_stride_t = 4 * 136 + 1;
  CHECK_FALSE(ops::prefill::output_tensor_map(q, pr, ws).has_value());
}

}  // namespace
}  // namespace kjit
