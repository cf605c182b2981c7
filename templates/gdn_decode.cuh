// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet packed decode: one recurrent step for B rows of [q | k | v], the state of each
// row read from and written back to a slot of a pool [slots, HV, V, K] (K contiguous).
//
// One block owns one state tile [kBV, K] of one (row n, value head hv): it is read once with
// 16-byte (kVecBytes) loads, updated in registers and written once, so the kernel moves the
// bandwidth floor 2 * B * HV * V * K * sizeof(state) plus the small q/k/v/gate reads.
//
// Thread layout: a row of K elements is kChunks chunks of kVecBytes; kLanesPerRow lanes (a
// power of two <= 32) split a row, so a warp covers kRowsPerWarp adjacent rows (adjacent in
// memory: one coalesced access per instruction) and each thread repeats that for
// kRowsPerThread rows. H.k and H.q are sub-warp shuffle reductions; no shared memory, no
// barriers, so a block whose index is invalid can leave early.
//
// Math per row v of the tile (all f32), with alpha = exp(g):
//   dk = H_old.k, dq = H_old.q
//   u  = beta * (v - alpha * dk)
//   H  = alpha * H_old + u k^T
//   o  = H.q = alpha * dq + u * (k.q)
// which needs both reductions from the old state at once (one pass, more ILP).
#pragma once

#include "kjit/common/gdn_math.cuh"
#include "kjit/gdn_decode_params.h"

namespace kjit {
namespace gdn_decode_detail {

__host__ __device__ constexpr int pow2_at_least(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

/// f32 <-> 16-bit storage bits, for unpacking raw vector words.
template <typename T>
__device__ __forceinline__ float bits16_to_f32(unsigned int bits);
template <>
__device__ __forceinline__ float bits16_to_f32<__half>(unsigned int bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
}
template <>
__device__ __forceinline__ float bits16_to_f32<__nv_bfloat16>(unsigned int bits) {
  return __uint_as_float(bits << 16);
}
template <typename T>
__device__ __forceinline__ unsigned int f32_to_bits16(float x);
template <>
__device__ __forceinline__ unsigned int f32_to_bits16<__half>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
template <>
__device__ __forceinline__ unsigned int f32_to_bits16<__nv_bfloat16>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/// kBytes / 4 raw 32-bit words read with one vector load. Streaming hint (.cs): the state is
/// touched once per step, so it should not evict q/k/v and gates from L2.
template <int kBytes>
__device__ __forceinline__ void load_words(const void* ptr, unsigned int (&w)[kBytes / 4]) {
  if constexpr (kBytes == 16) {
    const uint4 v = __ldcs(static_cast<const uint4*>(ptr));
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  } else if constexpr (kBytes == 8) {
    const uint2 v = __ldcs(static_cast<const uint2*>(ptr));
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kBytes == 4, "vector width must be 4, 8 or 16 bytes here");
    w[0] = __ldcs(static_cast<const unsigned int*>(ptr));
  }
}

template <int kBytes>
__device__ __forceinline__ void store_words(void* ptr, const unsigned int (&w)[kBytes / 4]) {
  if constexpr (kBytes == 16) {
    __stcs(static_cast<uint4*>(ptr), make_uint4(w[0], w[1], w[2], w[3]));
  } else if constexpr (kBytes == 8) {
    __stcs(static_cast<uint2*>(ptr), make_uint2(w[0], w[1]));
  } else {
    static_assert(kBytes == 4, "vector width must be 4, 8 or 16 bytes here");
    __stcs(static_cast<unsigned int*>(ptr), w[0]);
  }
}

/// One chunk of kBytes of a state row: raw bits in flight, unpacked to f32 later, so that
/// every load of a thread is issued before the first one is waited for.
template <typename T, int kBytes>
struct Chunk {
  static constexpr int kElems = kBytes / int(sizeof(T));
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  unsigned int w[kWords];

  __device__ __forceinline__ void load(const T* ptr) {
    if constexpr (kBytes == 2) {
      w[0] = __ldcs(reinterpret_cast<const unsigned short*>(ptr));
    } else {
      load_words<kBytes>(ptr, w);
    }
  }
  __device__ __forceinline__ void unpack(float (&x)[kElems]) const {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kElems; ++i) x[i] = __uint_as_float(w[i]);
    } else if constexpr (kBytes == 2) {
      x[0] = bits16_to_f32<T>(w[0] & 0xffffu);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        x[2 * i] = bits16_to_f32<T>(w[i] & 0xffffu);
        x[2 * i + 1] = bits16_to_f32<T>(w[i] >> 16);
      }
    }
  }
  __device__ __forceinline__ void pack(const float (&x)[kElems]) {
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int i = 0; i < kElems; ++i) w[i] = __float_as_uint(x[i]);
    } else if constexpr (kBytes == 2) {
      w[0] = f32_to_bits16<T>(x[0]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        w[i] = f32_to_bits16<T>(x[2 * i]) | (f32_to_bits16<T>(x[2 * i + 1]) << 16);
      }
    }
  }
  __device__ __forceinline__ void store(T* ptr) const {
    if constexpr (kBytes == 2) {
      __stcs(reinterpret_cast<unsigned short*>(ptr), static_cast<unsigned short>(w[0]));
    } else {
      store_words<kBytes>(ptr, w);
    }
  }
};

template <int kInvalidRule>
__device__ __forceinline__ bool invalid_slot(long long slot, long long num_slots) {
  const bool below = kInvalidRule == kGdnInvalidNonpositive ? slot <= 0 : slot < 0;
  // Out-of-range slots are a caller error (caught by the debug check); treating them as
  // invalid keeps the kernel from writing outside the pool.
  return below || slot >= num_slots;
}

/// Processes state tile `vt` of (row n, value head hv). Whole-block uniform: every thread of the
/// block takes the same branches.
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, int kK, int kV, int kBV, int kWarps, int kVecBytes,
          bool kGated, bool kL2Norm, int kInvalidRule>
__device__ __forceinline__ void decode_tile(const GdnDecodeParams& p, u32 n, u32 hv, u32 vt) {
  using StateChunk = Chunk<StateT, kVecBytes>;
  constexpr int kVec = StateChunk::kElems;
  constexpr int kChunks = kK / kVec;
  constexpr int kLanesPerRow = kChunks >= 32 ? 32 : pow2_at_least(kChunks);
  constexpr int kChunksPerLane = (kChunks + kLanesPerRow - 1) / kLanesPerRow;
  constexpr bool kRagged = kChunks % kLanesPerRow != 0;
  constexpr int kRowsPerWarp = 32 / kLanesPerRow;
  constexpr int kRowsPerThread = kBV / (kWarps * kRowsPerWarp);
  constexpr int kElems = kChunksPerLane * kVec;

  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int sub = lane % kLanesPerRow;
  const int row_in_warp = lane / kLanesPerRow;
  // Local row of repetition r: warps interleave, so one instruction of a warp touches
  // kRowsPerWarp adjacent rows.
  auto local_row = [&](int r) { return (r * kWarps + warp) * kRowsPerWarp + row_in_warp; };
  auto chunk_of = [&](int j) { return j * kLanesPerRow + sub; };
  auto chunk_live = [&](int j) { return !kRagged || chunk_of(j) < kChunks; };

  const long long slot = static_cast<long long>(
      static_cast<const IndexT*>(p.indices)[static_cast<i64>(n) * p.index_stride]);
  OutT* out = static_cast<OutT*>(p.out) + static_cast<i64>(n) * p.out_row_stride +
              static_cast<i64>(hv) * kV + static_cast<i64>(vt) * kBV;
  if (invalid_slot<kInvalidRule>(slot, p.num_slots)) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      if (sub == 0) out[local_row(r)] = gdn::from_f32<OutT>(0.0f);
    }
    return;
  }

  // Issue every state load of this thread first: they are the only long-latency traffic.
  StateT* tile = static_cast<StateT*>(p.state) + slot * p.state_slot_stride +
                 (static_cast<i64>(hv) * kV + static_cast<i64>(vt) * kBV) * kK;
  StateChunk raw[kRowsPerThread][kChunksPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      if (chunk_live(j)) raw[r][j].load(tile + local_row(r) * kK + chunk_of(j) * kVec);
    }
  }

  // q, k of this thread's K positions, normalized with norms reduced over the row's lanes.
  const QkvT* row = static_cast<const QkvT*>(p.qkv) + static_cast<i64>(n) * p.qkv_row_stride;
  const u32 h = hv / p.heads_per_group;
  const QkvT* q_ptr = row + static_cast<i64>(h) * kK;
  const QkvT* k_ptr = row + static_cast<i64>(p.num_heads + h) * kK;
  const QkvT* v_ptr = row + static_cast<i64>(2 * p.num_heads) * kK + static_cast<i64>(hv) * kV +
                      static_cast<i64>(vt) * kBV;
  float q[kElems];
  float k[kElems];
  float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunksPerLane; ++j) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      const int i = j * kVec + e;
      const int pos = chunk_of(j) * kVec + e;
      q[i] = chunk_live(j) ? gdn::to_f32(q_ptr[pos]) : 0.0f;
      k[i] = chunk_live(j) ? gdn::to_f32(k_ptr[pos]) : 0.0f;
      q_sq += q[i] * q[i];
      k_sq += k[i] * k[i];
    }
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

  // Gates of (n, hv).
  float g, beta;
  if constexpr (kGated) {
    g = static_cast<const float*>(p.a)[static_cast<i64>(n) * p.a_row_stride + hv];
    beta = static_cast<const float*>(p.b)[static_cast<i64>(n) * p.b_row_stride + hv];
  } else {
    const float a =
        gdn::to_f32(static_cast<const GateT*>(p.a)[static_cast<i64>(n) * p.a_row_stride + hv]);
    const float b =
        gdn::to_f32(static_cast<const GateT*>(p.b)[static_cast<i64>(n) * p.b_row_stride + hv]);
    const float a_log = gdn::to_f32(static_cast<const ALogT*>(p.a_log)[hv]);
    const float dt_bias = gdn::to_f32(static_cast<const DtBiasT*>(p.dt_bias)[hv]);
    g = gdn::log_decay(a, a_log, dt_bias, p.softplus_threshold);
    beta = gdn::sigmoid(b);
  }
  const float alpha = expf(g);

  float v[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) v[r] = gdn::to_f32(v_ptr[local_row(r)]);

  // Partial dot products of the old state with k and q; then one interleaved reduction.
  float state[kRowsPerThread][kElems];
  float dk[kRowsPerThread], dq[kRowsPerThread];
#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    dk[r] = 0.0f;
    dq[r] = 0.0f;
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      float x[kVec];
      if (chunk_live(j)) {
        raw[r][j].unpack(x);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) x[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        state[r][j * kVec + e] = x[e];
        dk[r] += x[e] * k[j * kVec + e];
        dq[r] += x[e] * q[j * kVec + e];
      }
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int r = 0; r < kRowsPerThread; ++r) {
      dk[r] += __shfl_xor_sync(0xffffffffu, dk[r], offset);
      dq[r] += __shfl_xor_sync(0xffffffffu, dq[r], offset);
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerThread; ++r) {
    const float u = beta * (v[r] - alpha * dk[r]);
#pragma unroll
    for (int j = 0; j < kChunksPerLane; ++j) {
      float x[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        x[e] = alpha * state[r][j * kVec + e] + u * k[j * kVec + e];
      }
      if (chunk_live(j)) {
        raw[r][j].pack(x);
        raw[r][j].store(tile + local_row(r) * kK + chunk_of(j) * kVec);
      }
    }
    if (sub == 0) out[local_row(r)] = gdn::from_f32<OutT>(alpha * dq[r] + u * kq);
  }
}

}  // namespace gdn_decode_detail

/// One GDN decode step. Template parameters, in the order of the family declaration:
/// element types of qkv, a/b (raw form), A_log, dt_bias, state pool, out, indices; head dims
/// kK, kV; tile rows kBV; warps per block; state vector width in bytes; grid mode
/// (GdnDecodeMode); gated form (a/b hold f32 g/beta); L2-normalize q, k; GdnInvalidRule.
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, int kK, int kV, int kBV, int kWarps, int kVecBytes,
          int kMode, bool kGated, bool kL2Norm, int kInvalidRule>
__global__ void __launch_bounds__(kWarps * 32) gdn_decode_kernel(const GdnDecodeParams p) {
  static_assert(kVecBytes % int(sizeof(StateT)) == 0, "a vector holds whole state elements");
  static_assert(kK % (kVecBytes / int(sizeof(StateT))) == 0, "K is whole vectors");
  static_assert(kV % kBV == 0, "V is whole tiles");
  constexpr int kChunks = kK / (kVecBytes / int(sizeof(StateT)));
  constexpr int kLanesPerRow = kChunks >= 32 ? 32 : gdn_decode_detail::pow2_at_least(kChunks);
  static_assert(kBV % (kWarps * (32 / kLanesPerRow)) == 0,
                "a tile is whole rows-per-warp for every warp");
  constexpr u32 kTiles = kV / kBV;

  const auto tile = [&p](u32 n, u32 hv, u32 vt) {
    gdn_decode_detail::decode_tile<QkvT, GateT, ALogT, DtBiasT, StateT, OutT, IndexT, kK, kV, kBV,
                                   kWarps, kVecBytes, kGated, kL2Norm, kInvalidRule>(p, n, hv, vt);
  };
  if constexpr (kMode == kGdnDecodeFlat) {
    tile(blockIdx.y / p.num_value_heads, blockIdx.y % p.num_value_heads, blockIdx.x);
  } else if constexpr (kMode == kGdnDecodeSplit) {
    tile(blockIdx.z, blockIdx.y, blockIdx.x);
  } else {
    static_assert(kMode == kGdnDecodeFolded, "unknown grid mode");
    // Tiles of one (n, hv) are adjacent ids, so neighbouring blocks stream adjacent memory.
    for (u64 id = blockIdx.x; id < p.total_tiles; id += gridDim.x) {
      const u64 nh = id / kTiles;
      tile(static_cast<u32>(nh / p.num_value_heads), static_cast<u32>(nh % p.num_value_heads),
           static_cast<u32>(id % kTiles));
    }
  }
}

}  // namespace kjit
