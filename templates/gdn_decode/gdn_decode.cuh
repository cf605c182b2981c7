// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet packed decode: one recurrent step for B rows of [q | k | v], the state of each
// row read from and written back to a slot of a pool [slots, HV, V, K] (K contiguous, or V
// contiguous: kStateLayout, see KMajorTileDecoder).
//
// The work is split into state tiles [kBV, K] of one (row n, value head hv); each is read once
// with kVecBytes-wide accesses, updated in registers and written once, so the kernel moves the
// bandwidth floor 2 * B * HV * V * K * sizeof(state) plus the small q/k/v/gate reads. How
// blocks get their tiles is the grid mode:
// - flat / split / folded: one tile per block (folded: a grid-stride loop once x runs out).
//   Every load of a tile is issued before the first is waited for; latency is hidden by the
//   many resident blocks.
// - persistent: about as many blocks as fit on the device, each walking tiles with a stride of
//   the grid; the state and inputs of the next tile are loaded into a second register set
//   while the current tile is reduced and written, so an SM's loads never drain between tiles.
// - bulk (sm_90): persistent blocks whose state tiles arrive through the bulk copy engine
//   (cp.async.bulk, completing on an mbarrier) into a ring of kStages shared-memory stages;
//   one thread keeps kStages tiles in flight per block with no registers spent on them, the
//   other threads only read shared memory, compute and store.
//
// Rows in slot order (kOrdered; flat, split, folded): gdn_decode_order_kernel first ranks the
// rows by slot, and grid row i then takes the row of the i-th smallest slot, so the blocks
// walk the pool in address order whatever order the caller's rows are in.
//
// Thread layout: a row of K elements is kChunks chunks of kVecBytes; kLanesPerRow lanes (a
// power of two <= 32) split a row, so a warp covers kRowsPerWarp adjacent rows (adjacent in
// memory: one coalesced access per instruction) and each thread repeats that for
// kRowsPerThread rows. H.k and H.q are sub-warp shuffle reductions.
//
// Math per row v of the tile (all f32), with alpha = exp(g):
//   dk = H_old.k, dq = H_old.q
//   u  = beta * (v - alpha * dk)
//   H  = alpha * H_old + u k^T
//   o  = H.q = alpha * dq + u * (k.q)
// which needs both reductions from the old state at once (one pass, more ILP).
#pragma once

#include "templates/common/cp_async.cuh"
#include "templates/common/gdn_math.cuh"
#include "templates/common/grid_dependency.cuh"
#include "templates/common/mbarrier.cuh"
#include "templates/common/vec.cuh"
#include "templates/gdn_decode/params.h"

namespace kjit {
namespace gdn_decode_detail {

__host__ __device__ constexpr int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

/// A if kFirst, else B (no <type_traits> under NVRTC).
template <bool kFirst, typename A, typename B>
struct Select {
  using type = A;
};
template <typename A, typename B>
struct Select<false, A, B> {
  using type = B;
};

/// kBytes / 4 raw 32-bit words (kBytes == 2: one 16-bit word) read with one vector load, with
/// the cache hint kHint (GdnCacheHint): .cs streams (evict first: the state is touched once per
/// step and should not evict q/k/v and gates from L2), plain leaves the default policy, and
/// L2::256B asks L2 to fetch whole 256-byte blocks from memory (fewer, larger DRAM bursts).
template <int kBytes, int kHint>
__device__ __forceinline__ void load_words(const void* ptr,
                                           unsigned int (&w)[kBytes >= 4 ? kBytes / 4 : 1]) {
  if constexpr (kHint == kGdnHintL2Prefetch) {
    if constexpr (kBytes == 16) {
      asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
                   : "l"(ptr));
    } else if constexpr (kBytes == 8) {
      asm volatile("ld.global.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
                   : "=r"(w[0]), "=r"(w[1])
                   : "l"(ptr));
    } else if constexpr (kBytes == 4) {
      asm volatile("ld.global.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(w[0]) : "l"(ptr));
    } else {
      unsigned short h;
      asm volatile("ld.global.L1::no_allocate.L2::256B.u16 %0, [%1];" : "=h"(h) : "l"(ptr));
      w[0] = h;
    }
  } else {
    using W = typename vec::Word<kBytes>::type;
    const W* p = static_cast<const W*>(ptr);
    vec::to_words(kHint == kGdnHintStream ? __ldcs(p) : *p, w);
  }
}

/// The store twin of load_words: .cs (evict first) or plain (write-back, default policy).
template <int kBytes, int kHint>
__device__ __forceinline__ void store_words(void* ptr,
                                            const unsigned int (&w)[kBytes >= 4 ? kBytes / 4 : 1]) {
  using W = typename vec::Word<kBytes>::type;
  W* p = static_cast<W*>(ptr);
  const W v = static_cast<W>(vec::from_words(w));
  if constexpr (kHint == kGdnHintStream) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

/// One chunk of kBytes of a state row: raw bits in flight, unpacked to f32 later, so that
/// every load of a thread is issued before the first one is waited for. kLoadHint and
/// kStoreHint: GdnCacheHint of the pool accesses.
template <typename T, int kBytes, int kLoadHint = kGdnHintStream, int kStoreHint = kGdnHintStream>
struct Chunk {
  static constexpr int kElems = kBytes / int(sizeof(T));
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned int w[kWords];

  __device__ __forceinline__ void load(const T* ptr) { load_words<kBytes, kLoadHint>(ptr, w); }
  /// Plain load (no cache hint), for a tile already staged in shared memory.
  __device__ __forceinline__ void load_plain(const T* ptr) { vec::load<kBytes>(ptr, w); }
  __device__ __forceinline__ void unpack(float (&x)[kElems]) const {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kElems; ++i) x[i] = __uint_as_float(w[i]);
    } else if constexpr (kBytes == 2) {
      x[0] = vec::Bits<T>::to_f32(w[0] & 0xffffu);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        x[2 * i] = vec::Bits<T>::to_f32(w[i] & 0xffffu);
        x[2 * i + 1] = vec::Bits<T>::to_f32(w[i] >> 16);
      }
    }
  }
  __device__ __forceinline__ void pack(const float (&x)[kElems]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kElems; ++i) w[i] = __float_as_uint(x[i]);
    } else if constexpr (kBytes == 2) {
      w[0] = vec::Bits<T>::from_f32(x[0]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        w[i] = vec::pack2<T>(x[2 * i], x[2 * i + 1]);
      }
    }
  }
  __device__ __forceinline__ void store(T* ptr) const { store_words<kBytes, kStoreHint>(ptr, w); }
};

template <int kInvalidRule>
__device__ __forceinline__ bool invalid_slot(long long slot, long long num_slots) {
  const bool below = kInvalidRule == kGdnInvalidNonpositive ? slot <= 0 : slot < 0;
  // Out-of-range slots are a caller error (caught by the debug check); treating them as
  // invalid keeps the kernel from writing outside the pool.
  return below || slot >= num_slots;
}

/// The sort key of row n for gdn_decode_order_kernel: slot * 2^kGdnOrderRowBits + n, the slot
/// -1 for a row without state (under kInvalidRule, or >= num_slots), so keys are distinct and
/// ascend with the slot.
template <typename IndexT, int kInvalidRule>
__device__ __forceinline__ i64 order_key(const GdnDecodeParams& p, u64 n) {
  long long slot = static_cast<long long>(
      static_cast<const IndexT*>(p.indices)[static_cast<i64>(n) * p.index_stride]);
  if (invalid_slot<kInvalidRule>(slot, p.num_slots)) slot = -1;
  return static_cast<i64>(slot) * (i64{1} << kGdnOrderRowBits) + static_cast<i64>(n);
}

/// Row n, value head hv and V tile vt of a tile id. Tiles of one (n, hv) are adjacent ids, so
/// neighbouring blocks stream adjacent memory.
struct TileCoord {
  u32 n, hv, vt;
};
template <u32 kTiles>
__device__ __forceinline__ TileCoord tile_coord(const GdnDecodeParams& p, u64 id) {
  const u64 nh = id / kTiles;
  return TileCoord{static_cast<u32>(nh / p.num_value_heads),
                   static_cast<u32>(nh % p.num_value_heads), static_cast<u32>(id % kTiles)};
}

/// One state tile's worth of work for this thread: the raw inputs (loads issued, not yet
/// waited for), the raw state words, and the arithmetic that turns them into the new state
/// and the output. The phases are separate so that the persistent modes can issue the loads of
/// the next tile before finishing the current one.
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, int kK, int kV, int kBV, int kWarps, int kVecBytes,
          int kLoadHint, int kStoreHint, bool kGated, bool kL2Norm, int kInvalidRule>
struct TileDecoder {
  using StateChunk = Chunk<StateT, kVecBytes, kLoadHint, kStoreHint>;
  static constexpr int kVec = StateChunk::kElems;
  static constexpr int kChunks = kK / kVec;
  static constexpr int kLanesPerRow = kChunks >= 32 ? 32 : pow2_at_least(kChunks);
  static constexpr int kChunksPerLane = (kChunks + kLanesPerRow - 1) / kLanesPerRow;
  static constexpr bool kRagged = kChunks % kLanesPerRow != 0;
  static constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  static constexpr int kRowsPerThread = kBV / (kWarps * kRowsPerWarp);
  static constexpr int kElems = kChunksPerLane * kVec;
  /// Row sums reduced by halving exchanges when the 2 * kRowsPerThread sums (H.k and H.q per
  /// row) fit the lanes of a row: each exchange sends half of a lane's sums, so a lane ends with
  /// one whole sum (25 shuffles instead of 80 for 8 rows over 32 lanes), and only the lanes
  /// owning a row load its v and store its out. On the H200, bench_gdn_decode, same run, it took
  /// 0.6-2.1% less time per step at B * HV >= 8192 (architecture.md).
  static constexpr int kSums = 2 * kRowsPerThread;
  static constexpr bool kCompact =
      kSums <= kLanesPerRow && (kRowsPerThread & (kRowsPerThread - 1)) == 0;
  /// Compact reduction: sum j ends in the lanes j * kSumStride .. + kSumStride - 1 of a row.
  static constexpr int kSumStride = kCompact ? kLanesPerRow / kSums : 1;

  /// q/k/v/gates of one tile as stored (converted only in finish, so loading never waits).
  struct Inputs {
    QkvT q[kElems];
    QkvT k[kElems];
    /// Compact reduction: v[0] is the v of the row this lane owns (own_row()).
    QkvT v[kCompact ? 1 : kRowsPerThread];
    GateT a, b;
    ALogT a_log;
    DtBiasT dt_bias;
  };
  struct State {
    StateChunk raw[kRowsPerThread][kChunksPerLane];
  };

  int warp, sub, row_in_warp;

  __device__ __forceinline__ TileDecoder()
      : warp(static_cast<int>(threadIdx.x >> 5)),
        sub(static_cast<int>(threadIdx.x & 31u) % kLanesPerRow),
        row_in_warp(static_cast<int>(threadIdx.x & 31u) / kLanesPerRow) {}

  // Local row of repetition r: warps interleave, so one instruction of a warp touches
  // kRowsPerWarp adjacent rows.
  __device__ __forceinline__ int local_row(int r) const {
    return (r * kWarps + warp) * kRowsPerWarp + row_in_warp;
  }
  __device__ __forceinline__ int chunk_of(int j) const { return j * kLanesPerRow + sub; }
  /// Compact reduction: the repetition whose sums (H.k at 2r, H.q at 2r + 1) this lane ends
  /// with.
  __device__ __forceinline__ int own_row() const { return sub / kSumStride / 2; }
  __device__ __forceinline__ bool chunk_live(int j) const {
    return !kRagged || chunk_of(j) < kChunks;
  }

  __device__ __forceinline__ long long load_slot(const GdnDecodeParams& p, u32 n) const {
    return static_cast<long long>(
        static_cast<const IndexT*>(p.indices)[static_cast<i64>(n) * p.index_stride]);
  }
  __device__ __forceinline__ bool invalid(const GdnDecodeParams& p, long long slot) const {
    return invalid_slot<kInvalidRule>(slot, p.num_slots);
  }
  __device__ __forceinline__ static StateT* tile_ptr(const GdnDecodeParams& p, long long slot,
                                                     TileCoord c) {
    return static_cast<StateT*>(p.state) + slot * p.state_slot_stride +
           (static_cast<i64>(c.hv) * kV + static_cast<i64>(c.vt) * kBV) * kK;
  }
  __device__ __forceinline__ OutT* out_ptr(const GdnDecodeParams& p, TileCoord c) const {
    return static_cast<OutT*>(p.out) + static_cast<i64>(c.n) * p.out_row_stride +
           static_cast<i64>(c.hv) * kV + static_cast<i64>(c.vt) * kBV;
  }

  /// kGdnHintStaged: this thread's chunks of the tile, cp.async (16 bytes, L2 only) into the
  /// same places of `stage` ([kBV, K] as in the pool), one commit group. Each lane reads back
  /// only what it copied, so cp.async.wait_group alone orders the reads.
  __device__ __forceinline__ void stage_state(const GdnDecodeParams& p, long long slot, TileCoord c,
                                              StateT* stage) const {
    static_assert(kVecBytes == 16, "cp.async copies 16 bytes");
    const StateT* tile = tile_ptr(p, slot, c);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
      for (int j = 0; j < kChunksPerLane; ++j) {
        if (chunk_live(j)) {
          const int at = local_row(r) * kK + chunk_of(j) * kVec;
          cp_async::copy16(stage + at, tile + at);
        }
      }
    }
    cp_async::commit();
  }

  /// Streaming loads of this thread's state words straight from the pool.
  __device__ __forceinline__ void load_state(const GdnDecodeParams& p, long long slot, TileCoord c,
                                             State& s) const {
    const StateT* tile = tile_ptr(p, slot, c);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
      for (int j = 0; j < kChunksPerLane; ++j) {
        if (chunk_live(j)) s.raw[r][j].load(tile + local_row(r) * kK + chunk_of(j) * kVec);
      }
    }
  }
  /// This thread's state words from a tile staged in shared memory ([kBV, K], as in the pool).
  __device__ __forceinline__ void load_state_staged(const StateT* tile, State& s) const {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
      for (int j = 0; j < kChunksPerLane; ++j) {
        if (chunk_live(j)) s.raw[r][j].load_plain(tile + local_row(r) * kK + chunk_of(j) * kVec);
      }
    }
  }

  __device__ __forceinline__ void load_inputs(const GdnDecodeParams& p, TileCoord c,
                                              Inputs& in) const {
    const QkvT* row = static_cast<const QkvT*>(p.qkv) + static_cast<i64>(c.n) * p.qkv_row_stride;
    const u32 h = c.hv / p.heads_per_group;
    const QkvT* q_ptr = row + static_cast<i64>(h) * kK;
    const QkvT* k_ptr = row + static_cast<i64>(p.num_heads + h) * kK;
    const QkvT* v_ptr = row + static_cast<i64>(2 * p.num_heads) * kK + static_cast<i64>(c.hv) * kV +
                        static_cast<i64>(c.vt) * kBV;
    // A lane's kVec adjacent q (and k) elements in one load when the row allows it: 16 scalar
    // loads per lane and tile otherwise, each a request of its own, next to 4 of state.
    constexpr int kQkBytes = kVec * int(sizeof(QkvT));
    constexpr bool kQkVector = kQkBytes == 8 || kQkBytes == 16;
    const bool qk_vector = kQkVector && ((reinterpret_cast<unsigned long long>(q_ptr) |
                                          reinterpret_cast<unsigned long long>(k_ptr)) &
                                         static_cast<unsigned long long>(kQkBytes - 1)) == 0;
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      const int pos = chunk_of(j) * kVec;
      if constexpr (kQkVector) {
        if (qk_vector && chunk_live(j)) {
          using Vec = typename vec::Word<kQkBytes>::type;
          const Vec qv = *reinterpret_cast<const Vec*>(q_ptr + pos);
          const Vec kv = *reinterpret_cast<const Vec*>(k_ptr + pos);
          memcpy(&in.q[j * kVec], &qv, kQkBytes);
          memcpy(&in.k[j * kVec], &kv, kQkBytes);
          continue;
        }
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        in.q[j * kVec + e] = chunk_live(j) ? q_ptr[pos + e] : gdn::from_f32<QkvT>(0.0f);
        in.k[j * kVec + e] = chunk_live(j) ? k_ptr[pos + e] : gdn::from_f32<QkvT>(0.0f);
      }
    }
#pragma unroll
    for (int r = 0; r < (kCompact ? 1 : kRowsPerThread); ++r) {
      in.v[r] = v_ptr[local_row(kCompact ? own_row() : r)];
    }
    in.a = static_cast<const GateT*>(p.a)[static_cast<i64>(c.n) * p.a_row_stride + c.hv];
    in.b = static_cast<const GateT*>(p.b)[static_cast<i64>(c.n) * p.b_row_stride + c.hv];
    if constexpr (!kGated) {
      in.a_log = static_cast<const ALogT*>(p.a_log)[c.hv];
      in.dt_bias = static_cast<const DtBiasT*>(p.dt_bias)[c.hv];
    }
  }

  /// A tile whose row has no state: zeros to its part of out, the pool untouched.
  __device__ __forceinline__ void write_zeros(const GdnDecodeParams& p, TileCoord c) const {
    OutT* out = out_ptr(p, c);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      if (sub == 0) out[local_row(r)] = gdn::from_f32<OutT>(0.0f);
    }
  }

  /// The step itself for a valid slot: normalizes q/k, reduces the old state against them,
  /// writes the new state back to the pool and this tile's part of out. The old state comes
  /// from registers (loaded by load_state or load_state_staged).
  __device__ __forceinline__ void finish(const GdnDecodeParams& p, TileCoord c, long long slot,
                                         const Inputs& in, State& s) const {
    step(p, c, slot, in, [&](int r, int j, float(&x)[kVec]) { s.raw[r][j].unpack(x); });
  }

  /// finish() for a tile staged by stage_state: waits for the copies, then reads each chunk
  /// from shared memory once per pass (reductions, then update) instead of holding the tile
  /// in registers.
  __device__ __forceinline__ void finish_staged(const GdnDecodeParams& p, TileCoord c,
                                                long long slot, const Inputs& in,
                                                const StateT* stage) const {
    cp_async::wait<0>();
    step(p, c, slot, in, [&](int r, int j, float(&x)[kVec]) {
      StateChunk chunk;
      chunk.load_plain(stage + local_row(r) * kK + chunk_of(j) * kVec);
      chunk.unpack(x);
    });
  }

  /// Halving exchanges of the compact reduction, kHalf = half the sums a lane still holds: a
  /// lane whose bit kHalf * kSumStride of sub is set keeps the upper half and sends the lower,
  /// its partner the reverse; the kept half absorbs what arrives. Afterwards a lane holds sum
  /// sub / kSumStride, partial over the lanes that differ in the bits below kSumStride.
  /// Constant indices, so the sums stay in registers.
  template <int kHalf>
  __device__ __forceinline__ void reduce_halving(float (&sums)[kSums]) const {
    if constexpr (kHalf >= 1) {
      constexpr int kBit = kHalf * kSumStride;
      const bool upper = (sub & kBit) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? sums[i] : sums[i + kHalf];
        const float keep = upper ? sums[i + kHalf] : sums[i];
        sums[i] = keep + __shfl_xor_sync(0xffffffffu, send, kBit);
      }
      reduce_halving<kHalf / 2>(sums);
    }
  }

  /// The arithmetic of a step; `old_state(r, j, x)` gives chunk j of repetition r's row as f32
  /// (live chunks only).
  template <typename OldState>
  __device__ __forceinline__ void step(const GdnDecodeParams& p, TileCoord c, long long slot,
                                       const Inputs& in, const OldState& old_state) const {
    float q[kElems];
    float k[kElems];
    float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      q[i] = gdn::to_f32(in.q[i]);
      k[i] = gdn::to_f32(in.k[i]);
      q_sq += q[i] * q[i];
      k_sq += k[i] * k[i];
    }
    float q_factor = p.scale;
    if constexpr (kL2Norm) {
      q_factor *= gdn::l2_inv_norm(gdn::group_sum<kLanesPerRow>(q_sq));
      const float k_factor = gdn::l2_inv_norm(gdn::group_sum<kLanesPerRow>(k_sq));
#pragma unroll
      for (int i = 0; i < kElems; ++i) k[i] *= k_factor;
    }
    float kq = 0.0f;
#pragma unroll
    for (int i = 0; i < kElems; ++i) {
      q[i] *= q_factor;
      kq += k[i] * q[i];
    }
    kq = gdn::group_sum<kLanesPerRow>(kq);

    float g, beta;
    if constexpr (kGated) {
      g = gdn::to_f32(in.a);
      beta = gdn::to_f32(in.b);
    } else {
      g = gdn::log_decay(gdn::to_f32(in.a), gdn::to_f32(in.a_log), gdn::to_f32(in.dt_bias),
                         p.softplus_threshold);
      beta = gdn::sigmoid(gdn::to_f32(in.b));
    }
    const float alpha = expf(g);

    // Partial dot products of the old state with k and q; then one interleaved reduction.
    float dk[kRowsPerThread], dq[kRowsPerThread];
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      dk[r] = 0.0f;
      dq[r] = 0.0f;
#pragma unroll
      for (int j = 0; j < kChunksPerLane; ++j) {
        if (!chunk_live(j)) continue;
        float x[kVec];
        old_state(r, j, x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          dk[r] += x[e] * k[j * kVec + e];
          dq[r] += x[e] * q[j * kVec + e];
        }
      }
    }
    // u per row; out is stored here by the compact reduction's owner lanes.
    float u[kRowsPerThread];
    OutT* out = out_ptr(p, c);
    if constexpr (kCompact) {
      float sums[kSums];
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        sums[2 * r] = dk[r];
        sums[2 * r + 1] = dq[r];
      }
      reduce_halving<kSums / 2>(sums);
#pragma unroll
      for (int offset = kSumStride / 2; offset > 0; offset /= 2) {
        sums[0] += __shfl_xor_sync(0xffffffffu, sums[0], offset);
      }
      // Lanes of row r: sum 2r (H.k) where bit kSumStride of sub is clear, 2r + 1 (H.q) where set.
      const float other = __shfl_xor_sync(0xffffffffu, sums[0], kSumStride);
      const bool holds_dq = (sub & kSumStride) != 0;
      const float own_dk = holds_dq ? other : sums[0];
      const float own_dq = holds_dq ? sums[0] : other;
      const float own_u = beta * (gdn::to_f32(in.v[0]) - alpha * own_dk);
      if (sub % (2 * kSumStride) == 0) {
        out[local_row(own_row())] = gdn::from_f32<OutT>(alpha * own_dq + own_u * kq);
      }
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) {
        u[r] = __shfl_sync(0xffffffffu, own_u, 2 * r * kSumStride, kLanesPerRow);
      }
    } else {
#pragma unroll
      for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
#pragma unroll
        for (int r = 0; r < kRowsPerThread; ++r) {
          dk[r] += __shfl_xor_sync(0xffffffffu, dk[r], offset);
          dq[r] += __shfl_xor_sync(0xffffffffu, dq[r], offset);
        }
      }
#pragma unroll
      for (int r = 0; r < kRowsPerThread; ++r) u[r] = beta * (gdn::to_f32(in.v[r]) - alpha * dk[r]);
    }

    // A staged tile is read again from shared memory rather than kept in registers from the
    // first pass (the compiler would otherwise merge the two reads).
    if constexpr (kLoadHint == kGdnHintStaged) asm volatile("" ::: "memory");
    StateT* tile = tile_ptr(p, slot, c);
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
      for (int j = 0; j < kChunksPerLane; ++j) {
        if (!chunk_live(j)) continue;
        float x[kVec];
        old_state(r, j, x);
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[e] = alpha * x[e] + u[r] * k[j * kVec + e];
        StateChunk chunk;
        chunk.pack(x);
        chunk.store(tile + local_row(r) * kK + chunk_of(j) * kVec);
      }
      if constexpr (!kCompact) {
        if (sub == 0) out[local_row(r)] = gdn::from_f32<OutT>(alpha * dq[r] + u[r] * kq);
      }
    }
  }
};

/// TileDecoder for a K-major pool (kGdnStateKMajor: element (v, k) at k * V + v). A tile is the
/// kBV columns vt * kBV .. + kBV - 1 of V for every k, i.e. K lines of kBV contiguous elements.
/// kLanesPerLine lanes split a line into kVecBytes vectors, so a warp instruction covers
/// kLinesPerWarp adjacent lines, each a whole run of kBV * sizeof(state) bytes (16-byte
/// coalesced accesses, lanes walking V). Each thread holds kLinesPerThread lines (k values) of
/// its kVec columns: H.k and H.q of a column are sums over k, reduced over the lanes of other
/// lines (shuffles) and, with several warps, over the warps (shared memory). q and k norms and
/// k.q are sums over all of K, which every warp reduces for itself from K / 32 elements per
/// lane. The same interface as TileDecoder, for the one-tile-per-block modes.
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, int kK, int kV, int kBV, int kWarps, int kVecBytes,
          int kLoadHint, int kStoreHint, bool kGated, bool kL2Norm, int kInvalidRule>
struct KMajorTileDecoder {
  using StateChunk = Chunk<StateT, kVecBytes, kLoadHint, kStoreHint>;
  static constexpr int kVec = StateChunk::kElems;
  static constexpr int kLanesPerLine = kBV / kVec;
  static_assert(kBV % kVec == 0 && kLanesPerLine >= 1 && kLanesPerLine <= 32 &&
                    (kLanesPerLine & (kLanesPerLine - 1)) == 0,
                "a line of the tile is a power of two <= 32 of vectors");
  static constexpr int kLinesPerWarp = 32 / kLanesPerLine;
  static_assert(kK % (kLinesPerWarp * kWarps) == 0, "K is whole lines for every warp");
  static constexpr int kLinesPerThread = kK / (kLinesPerWarp * kWarps);
  /// Rows of the V-major decoder's name for the same count (the kernel's static_asserts).
  static constexpr int kRowsPerWarp = kLinesPerWarp;
  /// q and k elements per lane for the norms and k.q (k = lane + 32 i).
  static constexpr int kNormElems = (kK + 31) / 32;

  struct Inputs {
    /// q, k at this lane's norm positions.
    QkvT q_norm[kNormElems];
    QkvT k_norm[kNormElems];
    /// q, k at this thread's lines.
    QkvT q[kLinesPerThread];
    QkvT k[kLinesPerThread];
    /// v of this thread's columns.
    QkvT v[kVec];
    GateT a, b;
    ALogT a_log;
    DtBiasT dt_bias;
  };
  struct State {
    StateChunk raw[kLinesPerThread];
  };

  int warp, lane, column, line_in_warp;

  __device__ __forceinline__ KMajorTileDecoder()
      : warp(static_cast<int>(threadIdx.x >> 5)),
        lane(static_cast<int>(threadIdx.x & 31u)),
        column(static_cast<int>(threadIdx.x & 31u) % kLanesPerLine),
        line_in_warp(static_cast<int>(threadIdx.x & 31u) / kLanesPerLine) {}

  // The k of repetition r: warps interleave, so one instruction of a warp touches
  // kLinesPerWarp adjacent lines.
  __device__ __forceinline__ int line(int r) const {
    return (r * kWarps + warp) * kLinesPerWarp + line_in_warp;
  }

  __device__ __forceinline__ long long load_slot(const GdnDecodeParams& p, u32 n) const {
    return static_cast<long long>(
        static_cast<const IndexT*>(p.indices)[static_cast<i64>(n) * p.index_stride]);
  }
  __device__ __forceinline__ bool invalid(const GdnDecodeParams& p, long long slot) const {
    return invalid_slot<kInvalidRule>(slot, p.num_slots);
  }
  /// Element (v = vt * kBV, k = 0) of the tile; line k starts kV elements further per k.
  __device__ __forceinline__ static StateT* tile_ptr(const GdnDecodeParams& p, long long slot,
                                                     TileCoord c) {
    return static_cast<StateT*>(p.state) + slot * p.state_slot_stride +
           static_cast<i64>(c.hv) * kV * kK + static_cast<i64>(c.vt) * kBV;
  }
  __device__ __forceinline__ OutT* out_ptr(const GdnDecodeParams& p, TileCoord c) const {
    return static_cast<OutT*>(p.out) + static_cast<i64>(c.n) * p.out_row_stride +
           static_cast<i64>(c.hv) * kV + static_cast<i64>(c.vt) * kBV;
  }

  __device__ __forceinline__ void load_state(const GdnDecodeParams& p, long long slot, TileCoord c,
                                             State& s) const {
    const StateT* tile = tile_ptr(p, slot, c);
#pragma unroll
    for (int r = 0; r < kLinesPerThread; ++r) {
      s.raw[r].load(tile + static_cast<i64>(line(r)) * kV + column * kVec);
    }
  }

  __device__ __forceinline__ void load_inputs(const GdnDecodeParams& p, TileCoord c,
                                              Inputs& in) const {
    const QkvT* row = static_cast<const QkvT*>(p.qkv) + static_cast<i64>(c.n) * p.qkv_row_stride;
    const u32 h = c.hv / p.heads_per_group;
    const QkvT* q_ptr = row + static_cast<i64>(h) * kK;
    const QkvT* k_ptr = row + static_cast<i64>(p.num_heads + h) * kK;
    const QkvT* v_ptr = row + static_cast<i64>(2 * p.num_heads) * kK + static_cast<i64>(c.hv) * kV +
                        static_cast<i64>(c.vt) * kBV;
#pragma unroll
    for (int i = 0; i < kNormElems; ++i) {
      const int at = lane + 32 * i;
      const bool live = kK % 32 == 0 || at < kK;
      in.q_norm[i] = live ? q_ptr[at] : gdn::from_f32<QkvT>(0.0f);
      in.k_norm[i] = live ? k_ptr[at] : gdn::from_f32<QkvT>(0.0f);
    }
#pragma unroll
    for (int r = 0; r < kLinesPerThread; ++r) {
      in.q[r] = q_ptr[line(r)];
      in.k[r] = k_ptr[line(r)];
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) in.v[e] = v_ptr[column * kVec + e];
    in.a = static_cast<const GateT*>(p.a)[static_cast<i64>(c.n) * p.a_row_stride + c.hv];
    in.b = static_cast<const GateT*>(p.b)[static_cast<i64>(c.n) * p.b_row_stride + c.hv];
    if constexpr (!kGated) {
      in.a_log = static_cast<const ALogT*>(p.a_log)[c.hv];
      in.dt_bias = static_cast<const DtBiasT*>(p.dt_bias)[c.hv];
    }
  }

  /// Whether this thread writes its columns of out: the first line of the first warp.
  __device__ __forceinline__ bool writes_out() const { return warp == 0 && line_in_warp == 0; }

  __device__ __forceinline__ void write_zeros(const GdnDecodeParams& p, TileCoord c) const {
    if (!writes_out()) return;
    OutT* out = out_ptr(p, c);
#pragma unroll
    for (int e = 0; e < kVec; ++e) out[column * kVec + e] = gdn::from_f32<OutT>(0.0f);
  }

  __device__ __forceinline__ void finish(const GdnDecodeParams& p, TileCoord c, long long slot,
                                         const Inputs& in, State& s) const {
    float q_sq = 0.0f, k_sq = 0.0f, kq_raw = 0.0f;
#pragma unroll
    for (int i = 0; i < kNormElems; ++i) {
      const float qx = gdn::to_f32(in.q_norm[i]);
      const float kx = gdn::to_f32(in.k_norm[i]);
      q_sq += qx * qx;
      k_sq += kx * kx;
      kq_raw += kx * qx;
    }
    float q_factor = p.scale;
    float k_factor = 1.0f;
    if constexpr (kL2Norm) {
      q_factor *= gdn::l2_inv_norm(gdn::group_sum<32>(q_sq));
      k_factor = gdn::l2_inv_norm(gdn::group_sum<32>(k_sq));
    }
    const float kq = gdn::group_sum<32>(kq_raw) * (k_factor * q_factor);

    float g, beta;
    if constexpr (kGated) {
      g = gdn::to_f32(in.a);
      beta = gdn::to_f32(in.b);
    } else {
      g = gdn::log_decay(gdn::to_f32(in.a), gdn::to_f32(in.a_log), gdn::to_f32(in.dt_bias),
                         p.softplus_threshold);
      beta = gdn::sigmoid(gdn::to_f32(in.b));
    }
    const float alpha = expf(g);

    // Partial H.k and H.q of this thread's columns over its lines, then over the other lines
    // of the warp (lanes kLanesPerLine apart) and the other warps.
    float k_line[kLinesPerThread];
    float dk[kVec], dq[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      dk[e] = 0.0f;
      dq[e] = 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kLinesPerThread; ++r) {
      k_line[r] = gdn::to_f32(in.k[r]) * k_factor;
      const float q_line = gdn::to_f32(in.q[r]) * q_factor;
      float x[kVec];
      s.raw[r].unpack(x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        dk[e] += x[e] * k_line[r];
        dq[e] += x[e] * q_line;
      }
    }
#pragma unroll
    for (int offset = kLanesPerLine; offset < 32; offset *= 2) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        dk[e] += __shfl_xor_sync(0xffffffffu, dk[e], offset);
        dq[e] += __shfl_xor_sync(0xffffffffu, dq[e], offset);
      }
    }
    if constexpr (kWarps > 1) {
      // Each warp's column sums, then every thread adds the warps' sums of its columns. The
      // second barrier keeps the next tile of a grid-stride loop from overwriting them early.
      __shared__ float warp_sums[kWarps][2][kBV];
      if (line_in_warp == 0) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          warp_sums[warp][0][column * kVec + e] = dk[e];
          warp_sums[warp][1][column * kVec + e] = dq[e];
        }
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        dk[e] = 0.0f;
        dq[e] = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          dk[e] += warp_sums[w][0][column * kVec + e];
          dq[e] += warp_sums[w][1][column * kVec + e];
        }
      }
      __syncthreads();
    }
    float u[kVec];
    float o[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      u[e] = beta * (gdn::to_f32(in.v[e]) - alpha * dk[e]);
      o[e] = alpha * dq[e] + u[e] * kq;
    }
    if (writes_out()) {
      OutT* out = out_ptr(p, c);
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[column * kVec + e] = gdn::from_f32<OutT>(o[e]);
    }

    StateT* tile = tile_ptr(p, slot, c);
#pragma unroll
    for (int r = 0; r < kLinesPerThread; ++r) {
      float x[kVec];
      s.raw[r].unpack(x);
#pragma unroll
      for (int e = 0; e < kVec; ++e) x[e] = alpha * x[e] + u[e] * k_line[r];
      StateChunk chunk;
      chunk.pack(x);
      chunk.store(tile + static_cast<i64>(line(r)) * kV + column * kVec);
    }
  }
};

}  // namespace gdn_decode_detail

/// The rows of a step in slot order, for gdn_decode_kernel with kOrdered: p.order[rank] = the
/// key (order_key) of each row, rank = how many keys are smaller. On the H200 a step whose
/// blocks visit the pool in address order moves 1-4% more bytes per second than one visiting
/// it in a random order (architecture.md). Each block ranks kGdnOrderRowsPerBlock rows against
/// all B keys (B <= the planner's bound, so the quadratic count stays a few microseconds),
/// eight threads per row over a shared-memory tile of keys.
template <typename IndexT, int kInvalidRule>
__global__ void __launch_bounds__(kGdnOrderThreads)
    gdn_decode_order_kernel(const GdnDecodeParams p) {
  using gdn_decode_detail::order_key;
  constexpr int kParts = kGdnOrderThreads / kGdnOrderRowsPerBlock;
  constexpr u32 kTile = 1024;
  __shared__ i64 keys[kTile];
  __shared__ u32 below_in_part[kParts][kGdnOrderRowsPerBlock];
  // The decode kernel may be scheduled now; it waits for this grid before it reads a key.
  grid_dependency::allow_dependent_launch();
  // A warp is one part: its lanes are 32 rows, and each key it reads is a broadcast.
  const int row = static_cast<int>(threadIdx.x) % kGdnOrderRowsPerBlock;
  const int part = static_cast<int>(threadIdx.x) / kGdnOrderRowsPerBlock;
  const u64 n = static_cast<u64>(blockIdx.x) * kGdnOrderRowsPerBlock + row;
  const bool live = n < p.batch;
  const i64 mine = live ? order_key<IndexT, kInvalidRule>(p, n) : 0;
  u32 below = 0;
  for (u64 base = 0; base < p.batch; base += kTile) {
    const u32 count = static_cast<u32>(p.batch - base < kTile ? p.batch - base : kTile);
    __syncthreads();  // every thread is done with the previous tile
    for (u32 i = threadIdx.x; i < count; i += kGdnOrderThreads) {
      keys[i] = order_key<IndexT, kInvalidRule>(p, base + i);
    }
    __syncthreads();
    for (u32 i = static_cast<u32>(part); i < count; i += kParts) below += keys[i] < mine ? 1u : 0u;
  }
  below_in_part[part][row] = below;
  __syncthreads();
  if (part == 0 && live) {
    u32 rank = 0;
#pragma unroll
    for (int q = 0; q < kParts; ++q) rank += below_in_part[q][row];
    p.order[rank] = mine;
  }
}

/// One GDN decode step. Template parameters, in the order of the family declaration:
/// element types of qkv, a/b (raw form), A_log, dt_bias, state pool, out, indices; head dims
/// kK, kV; tile rows kBV; warps per block; state vector width in bytes; grid mode
/// (GdnDecodeMode); shared-memory stages (bulk mode; 0 otherwise); blocks per SM the grid
/// assumes resident (registers are capped so that they fit; 0: no cap); GdnCacheHint of the
/// state loads and stores; gated form (a/b hold f32 g/beta); L2-normalize q, k; GdnInvalidRule;
/// rows in slot order (p.order, from gdn_decode_order_kernel launched just before); layout of
/// the pool's [HV, V, K] block (GdnStateLayout; K-major: KMajorTileDecoder, kBV columns of V
/// per tile).
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, int kK, int kV, int kBV, int kWarps, int kVecBytes,
          int kMode, int kStages, int kMinBlocks, int kLoadHint, int kStoreHint, bool kGated,
          bool kL2Norm, int kInvalidRule, bool kOrdered, int kStateLayout = kGdnStateVMajor>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks > 0 ? kMinBlocks : 1)
    gdn_decode_kernel(const GdnDecodeParams p) {
  constexpr bool kKMajor = kStateLayout == kGdnStateKMajor;
  static_assert(kVecBytes % int(sizeof(StateT)) == 0, "a vector holds whole state elements");
  static_assert(kKMajor || kK % (kVecBytes / int(sizeof(StateT))) == 0, "K is whole vectors");
  static_assert(kV % kBV == 0, "V is whole tiles");
  static_assert(!kKMajor || ((kMode == kGdnDecodeFlat || kMode == kGdnDecodeSplit ||
                              kMode == kGdnDecodeFolded) &&
                             kLoadHint != kGdnHintStaged),
                "a K-major pool is for the one-tile-per-block modes with register loads");
  using Decoder = typename gdn_decode_detail::Select<
      kKMajor,
      gdn_decode_detail::KMajorTileDecoder<QkvT, GateT, ALogT, DtBiasT, StateT, OutT, IndexT, kK,
                                           kV, kBV, kWarps, kVecBytes, kLoadHint, kStoreHint,
                                           kGated, kL2Norm, kInvalidRule>,
      gdn_decode_detail::TileDecoder<QkvT, GateT, ALogT, DtBiasT, StateT, OutT, IndexT, kK, kV, kBV,
                                     kWarps, kVecBytes, kLoadHint, kStoreHint, kGated, kL2Norm,
                                     kInvalidRule>>::type;
  static_assert(kKMajor || kBV % (kWarps * Decoder::kRowsPerWarp) == 0,
                "a tile is whole rows-per-warp for every warp");
  static_assert(kMode == kGdnDecodeBulk ? kStages >= 1 && kStages <= 8 : kStages == 0,
                "stages belong to the bulk mode alone");
  static_assert(kLoadHint != kGdnHintStaged ||
                    (kMode != kGdnDecodePersistent && kMode != kGdnDecodeBulk && kVecBytes == 16),
                "staged loads are for the one-tile-per-block modes with 16-byte vectors");
  static_assert(
      !kOrdered || kMode == kGdnDecodeFlat || kMode == kGdnDecodeSplit || kMode == kGdnDecodeFolded,
      "slot order is for the one-tile-per-block modes");
  constexpr u32 kTiles = kV / kBV;
  using gdn_decode_detail::tile_coord;
  using gdn_decode_detail::TileCoord;
  const Decoder d;

  // The keys come from the order kernel, which may still be running (programmatic launch).
  if constexpr (kOrdered) grid_dependency::wait_for_previous_grid();

  // One tile, every load issued before the first is waited for.
  const auto one_tile = [&](TileCoord c) {
    long long slot;
    if constexpr (kOrdered) {
      // Grid row i is the row of the i-th smallest key: one load gives the row and its slot.
      const i64 key = p.order[c.n];
      c.n = static_cast<u32>(key & ((i64{1} << kGdnOrderRowBits) - 1));
      slot = static_cast<long long>(key >> kGdnOrderRowBits);
    } else {
      slot = d.load_slot(p, c.n);
    }
    if (d.invalid(p, slot)) {
      d.write_zeros(p, c);
      return;
    }
    typename Decoder::Inputs in;
    if constexpr (kLoadHint == kGdnHintStaged) {
      extern __shared__ __align__(16) unsigned char stage_bytes[];
      StateT* stage = reinterpret_cast<StateT*>(stage_bytes);
      d.stage_state(p, slot, c, stage);
      d.load_inputs(p, c, in);
      d.finish_staged(p, c, slot, in, stage);
    } else {
      typename Decoder::State s;
      d.load_state(p, slot, c, s);
      d.load_inputs(p, c, in);
      d.finish(p, c, slot, in, s);
    }
  };

  if constexpr (kMode == kGdnDecodeFlat) {
    one_tile(TileCoord{blockIdx.y / p.num_value_heads, blockIdx.y % p.num_value_heads, blockIdx.x});
  } else if constexpr (kMode == kGdnDecodeSplit) {
    one_tile(TileCoord{blockIdx.z, blockIdx.y, blockIdx.x});
  } else if constexpr (kMode == kGdnDecodeFolded) {
    for (u64 id = blockIdx.x; id < p.total_tiles; id += gridDim.x)
      one_tile(tile_coord<kTiles>(p, id));
  } else if constexpr (kMode == kGdnDecodePersistent) {
    // Two register sets, used alternately (the loop is unrolled by two so that each set stays
    // in fixed registers): while one tile is reduced and stored, the next one's loads are in
    // flight. Slots are read one tile further ahead still, so issuing the state loads of the
    // next tile never waits on an index load.
    struct Work {
      u64 id;
      TileCoord c;
      long long slot;
      typename Decoder::Inputs in;
      typename Decoder::State s;
    };
    const u64 stride = gridDim.x;
    if (blockIdx.x >= p.total_tiles) return;
    const auto issue = [&](Work& w, u64 id, long long slot) {
      w.id = id;
      w.c = tile_coord<kTiles>(p, id);
      w.slot = slot;
      d.load_inputs(p, w.c, w.in);
      if (!d.invalid(p, slot)) d.load_state(p, slot, w.c, w.s);
    };
    const auto slot_of = [&](u64 id) { return d.load_slot(p, tile_coord<kTiles>(p, id).n); };
    Work a, b;
    issue(a, blockIdx.x, slot_of(blockIdx.x));
    long long next_slot = blockIdx.x + stride < p.total_tiles ? slot_of(blockIdx.x + stride) : -1;
    const auto step = [&](Work& cur, Work& next) {
      const u64 next_id = cur.id + stride;
      const bool more = next_id < p.total_tiles;
      if (more) {
        issue(next, next_id, next_slot);
        if (next_id + stride < p.total_tiles) next_slot = slot_of(next_id + stride);
      }
      if (d.invalid(p, cur.slot)) {
        d.write_zeros(p, cur.c);
      } else {
        d.finish(p, cur.c, cur.slot, cur.in, cur.s);
      }
      return more;
    };
    while (step(a, b) && step(b, a)) {
    }
  } else {
    static_assert(kMode == kGdnDecodeBulk, "unknown grid mode");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    using namespace gdn_decode_detail;
    constexpr int kTileElems = kBV * kK;
    constexpr u32 kTileBytes = static_cast<u32>(kTileElems * int(sizeof(StateT)));
    static_assert(kTileBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
    extern __shared__ __align__(128) unsigned char gdn_decode_ring[];
    StateT* const ring = reinterpret_cast<StateT*>(gdn_decode_ring);
    __shared__ __align__(8) u64 full[kStages];
    __shared__ long long staged_slot[kStages];

    const u64 stride = gridDim.x;
    // Uniform per block, and before any barrier: a block without tiles leaves at once.
    if (blockIdx.x >= p.total_tiles) return;
    const bool producer = threadIdx.x == 0;
    if (producer) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) mbarrier::init(&full[s], 1);
      mbarrier::fence_init();
    }
    __syncthreads();

    // The producer stages tile `id` into stage s: its slot for the consumers, then either the
    // bulk copy (the barrier completes when its bytes land) or, for a row with no state, a
    // plain arrival. It reads slots one tile ahead of what it stages, so no copy waits on an
    // index load.
    const u64 policy = producer ? mbarrier::evict_first_policy() : 0;
    long long ahead_slot = 0;
    const auto stage = [&](int s, u64 id, long long slot) {
      staged_slot[s] = slot;
      if (d.invalid(p, slot)) {
        mbarrier::arrive(&full[s]);
      } else {
        mbarrier::arrive_expect_tx(&full[s], kTileBytes);
        mbarrier::bulk_load(ring + s * kTileElems,
                            Decoder::tile_ptr(p, slot, tile_coord<kTiles>(p, id)), kTileBytes,
                            &full[s], policy);
      }
    };
    const auto slot_of = [&](u64 id) { return d.load_slot(p, tile_coord<kTiles>(p, id).n); };
    if (producer) {
      for (int s = 0; s < kStages; ++s) {
        const u64 id = blockIdx.x + static_cast<u64>(s) * stride;
        if (id < p.total_tiles) stage(s, id, slot_of(id));
      }
      const u64 ahead = blockIdx.x + kStages * stride;
      if (ahead < p.total_tiles) ahead_slot = slot_of(ahead);
    }

    // Consumers (every thread): inputs of the next tile are loaded while this one finishes;
    // two register sets used alternately, as in the persistent mode.
    u64 id = blockIdx.x;
    u32 iteration = 0;
    typename Decoder::Inputs in_a, in_b;
    d.load_inputs(p, tile_coord<kTiles>(p, id), in_a);
    const auto step = [&](typename Decoder::Inputs& cur, typename Decoder::Inputs& next) {
      const u64 next_id = id + stride;
      const bool more = next_id < p.total_tiles;
      if (more) d.load_inputs(p, tile_coord<kTiles>(p, next_id), next);
      const int s = static_cast<int>(iteration % kStages);
      mbarrier::wait(&full[s], (iteration / kStages) & 1u);
      const long long slot = staged_slot[s];
      const bool valid = !d.invalid(p, slot);
      typename Decoder::State st;
      if (valid) d.load_state_staged(ring + s * kTileElems, st);
      // Every thread has its words of stage s (and its slot) in registers: refill it.
      __syncthreads();
      if (producer) {
        const u64 refill = id + kStages * stride;
        if (refill < p.total_tiles) {
          stage(s, refill, ahead_slot);
          if (refill + stride < p.total_tiles) ahead_slot = slot_of(refill + stride);
        }
      }
      const TileCoord c = tile_coord<kTiles>(p, id);
      if (valid) {
        d.finish(p, c, slot, cur, st);
      } else {
        d.write_zeros(p, c);
      }
      id = next_id;
      ++iteration;
      return more;
    };
    while (step(in_a, in_b) && step(in_b, in_a)) {
    }
#else
    // The planner never chooses bulk below sm_90; a hand-made spec that does fails loudly.
    __trap();
#endif
  }
}

}  // namespace kjit
