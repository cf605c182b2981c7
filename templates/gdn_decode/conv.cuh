// SPDX-License-Identifier: Apache-2.0
// The fused Gated DeltaNet decode step (issue 22): the causal conv update (S = 1, optional
// SiLU) of mixed_qkv and the delta-rule step in one kernel, so a decode step reads mixed_qkv
// once and launches once instead of causal_conv1d_update + gdn_decode.
//
// One block per (row n, q/k head h). A value head needs the conv output of its own V channels
// and of its q/k head's 2K channels, which the HV / H value heads of the group and all their V
// tiles share; a block that owns the whole group owns every channel it convolves, so each
// channel's conv-pool columns are read and then written by one thread of one block, with no
// other reader anywhere in the grid (a split over V tiles or value heads would have several
// blocks read q/k history that one of them overwrites: a race without a grid-wide barrier).
//
// Phase 1 (every thread, channels strided by the block size): with the slot's load in flight,
// the slot-independent loads (bias + w[W-1] x of each channel, the gates); then, with the first
// pass's state rows loading, the history, the conv output of the group's 2K + G V channels into
// shared memory, rounded to mixed_qkv's dtype (as the two-kernel sequence stores it), and the
// new pool columns. Three dependent round trips to memory before the first arithmetic on the
// state become two.
// Phase 2 (each warp, state rows strided by the warps): q and k norms and k.q per warp from
// shared memory, then per state row H.k and H.q (warp sums), u = beta (v - alpha H.k), the new
// row alpha H + u k and out = alpha H.q + u k.q. The state moves in kStateVec-element vectors
// (one 16-byte access per lane and row for an f32 state at K = 128), in two register sets of
// kRows rows: the next set's loads are issued before the current set's reductions, so a warp's
// loads stay in flight while it computes. A padding row writes zeros to its G V outputs and
// touches neither pool.
//
// Clustered form (kCluster = C > 1, sm_90, a cluster of C consecutive blocks per (row, q/k
// head)): block r of the cluster takes the group's state rows [r R / C, (r + 1) R / C) with
// their v channels (their only reader and writer), and convolves all 2K q/k channels itself, so
// nothing passes between the blocks before the step. The q/k pool columns have C readers: each
// block arrives at the cluster barrier once it has read them, and writes its share, channels
// [r 2K / C, (r + 1) 2K / C) (kept in shared memory meanwhile), only after waiting for it at its
// end, when the step is done. A small batch then spreads its state over C times more SMs, with
// no cluster barrier between the pool reads and the state arithmetic (the form before met at one
// and copied the other blocks' q/k outputs from their shared memory there).
#pragma once

#include "templates/common/cluster.cuh"
// (Its *_portable copies are plain ones where the emulated tests compile this as host C++.)
#include "templates/common/cp_async.cuh"
#include "templates/common/gdn_math.cuh"
#include "templates/common/vec.cuh"
#include "templates/gdn_decode/conv_params.h"

namespace kjit {
namespace gdn_decode_conv_detail {

template <int kInvalidRule>
__device__ __forceinline__ bool invalid_slot(long long slot, long long num_slots) {
  const bool below = kInvalidRule == kGdnInvalidNonpositive ? slot <= 0 : slot < 0;
  return below || slot >= num_slots;
}

/// kVec state elements at `src` (aligned to their size, 4..16 bytes, or one element) as f32, in
/// one load instruction: the state is most of the bytes a step moves, and scalar accesses
/// issue a load per element.
template <typename T, int kVec>
__device__ __forceinline__ void load_state_vec(const T* src, float (&dst)[kVec]) {
  if constexpr (kVec == 1) {
    dst[0] = gdn::to_f32(*src);
  } else {
    constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "4-, 8- or 16-byte vectors");
    vec::Raw<T, kVec> raw;
    raw.load(src);
#pragma unroll
    for (int i = 0; i < kVec; ++i) dst[i] = raw.get(i);
  }
}

/// The inverse of load_state_vec: kVec floats rounded to T, stored in one instruction.
template <typename T, int kVec>
__device__ __forceinline__ void store_state_vec(T* dst, const float (&src)[kVec]) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  if constexpr (kVec == 1) {
    *dst = gdn::from_f32<T>(src[0]);
  } else {
    u32 w[kBytes / 4];
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) {
      if constexpr (sizeof(T) == 4) {
        w[i] = vec::Bits<T>::from_f32(src[i]);
      } else {
        w[i] = vec::pack2<T>(src[2 * i], src[2 * i + 1]);
      }
    }
    vec::store<kBytes>(dst, w);
  }
}

}  // namespace gdn_decode_conv_detail

/// The body of gdn_decode_conv_kernel for block blockIdx.x = (n * H + h) * C + r, with `smem`
/// the block's shared memory (gdn_decode_conv_smem_floats floats: q [K], k [K], v [G V],
/// alpha [G], beta [G], and with clusters the new q/k pool columns of its share
/// [2K / C][W - 1]; with kStages > 0, from the next 16-byte boundary, the state ring
/// [kStages][kWarps][kRows][K]). Separate from the __global__ entry so a host test can run it with
/// memory of its own.
///
/// kStages (0, or 2..4; unclustered blocks with 16-byte state vectors): each warp's sets of kRows
/// state rows come through a ring of kStages sets in shared memory (cp.async) instead of two
/// register sets, so kStages - 1 sets per warp are in flight while one is computed, without the
/// registers a load in flight holds. A block of 8 warps walking its group's 256 rows kept ~1.5
/// sets in flight per warp in registers.
template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, typename WeightT, typename ConvT, int kK, int kV,
          int kWidth, int kWarps, bool kGated, bool kL2Norm, int kInvalidRule, bool kSilu,
          int kStateVec, int kCluster = 1, int kStages = 0>
__device__ __forceinline__ void gdn_decode_conv_block(const GdnDecodeConvParams& p, float* smem) {
  static_assert(kK % 16 == 0 && kK >= 16 && kK <= 256, "K: a multiple of 16 in 16..256");
  static_assert(kV % 16 == 0 && kV >= 16 && kV <= 256, "V: a multiple of 16 in 16..256");
  static_assert(kWidth >= 2 && kWidth <= 8, "conv width in 2..8");
  static_assert(kWarps >= 1 && kWarps <= 32, "1..32 warps");
  static_assert(kStateVec == 1 || kK % (32 * kStateVec) == 0,
                "state vectors: a warp covers 32 x kStateVec columns of a row per access");
  // q/k/state elements per lane: element i = e kStateVec + j is column
  // 32 kStateVec e + kStateVec lane + j (so each access is one kStateVec vector per lane).
  constexpr int kPer = (kK + 31) / 32;
  constexpr int kAccesses = kPer / kStateVec;
  // State rows per register set (two sets: 2 kRows rows in flight per warp); K = 256 holds one
  // (64 registers a thread in 32-warp blocks).
  constexpr int kRows = gdn_decode_conv_rows_per_set(kK);

  static_assert(gdn_decode_conv_cluster_size(kCluster), "clusters of 1, 2, 4 or 8 blocks");
  static_assert(2 * kK % kCluster == 0, "q/k channels split evenly over the cluster");
  static_assert(gdn_decode_conv_stage_count(kStages), "a ring of 2..4 stages, or none");
  static_assert(kStages == 0 || (kCluster == 1 && kStateVec * sizeof(StateT) == 16),
                "staged: unclustered blocks with 16-byte state vectors");

  const u32 group = p.heads_per_group;
  const u64 block = blockIdx.x / kCluster;
  const u32 rank = static_cast<u32>(blockIdx.x % kCluster);  // in the cluster (consecutive x)
  const u32 n = static_cast<u32>(block / p.num_heads);
  const u32 h = static_cast<u32>(block % p.num_heads);
  const int rows = static_cast<int>(group) * kV;  // state rows (and v channels) of the group
  // This block's part: state rows (v channels) [row_begin, row_end), and the q/k channels whose
  // pool columns it writes, [qk_begin, qk_begin + qk_share) (all 2K without clusters). It
  // convolves all 2K q/k channels and its v channels. The planner clusters only groups whose
  // rows split evenly.
  constexpr int qk_share = 2 * kK / kCluster;
  const int qk_begin = static_cast<int>(rank) * qk_share;
  const int row_begin = static_cast<int>(rank) * (rows / kCluster);
  const int row_end = row_begin + rows / kCluster;
  const int channels = 2 * kK + (row_end - row_begin);
  const int tid = static_cast<int>(threadIdx.x);
  const int threads = kWarps * 32;

  float* q_s = smem;
  float* k_s = smem + kK;
  float* v_s = smem + 2 * kK;
  float* alpha_s = v_s + rows;
  float* beta_s = alpha_s + group;
  // With clusters: the new pool columns of the block's q/k share, written after the cluster
  // barrier ([qk_share][W - 1], each channel's columns in pool order).
  float* qk_columns_s = beta_s + group;

  // The block's i-th channel is the group's channel t = slot_of(i) (q/k first, then v; also its
  // float in shared memory), global channel h K + t (q), H K + h K + t - K (k) or
  // 2 H K + h G V + t - 2K (v).
  const auto slot_of = [&](int i) -> int {
    return i < 2 * kK ? i : 2 * kK + row_begin + (i - 2 * kK);
  };
  const auto channel = [&](int t) -> i64 {
    if (t < kK) return static_cast<i64>(h) * kK + t;
    if (t < 2 * kK) return static_cast<i64>(p.num_heads + h) * kK + (t - kK);
    return static_cast<i64>(2 * p.num_heads) * kK + static_cast<i64>(h) * rows + (t - 2 * kK);
  };
  const QkvT* x_row = static_cast<const QkvT*>(p.qkv) + static_cast<i64>(n) * p.qkv_row_stride;
  const WeightT* weight = static_cast<const WeightT*>(p.conv_weight);
  const WeightT* bias = static_cast<const WeightT*>(p.conv_bias);

  // Everything that does not depend on the slot is loaded in the same round trip as the slot:
  // the conv's first term bias + w[W-1] x per channel (into shared memory; the same thread adds
  // the history below, in causal_conv1d's order) and the gates.
  const long long slot = static_cast<long long>(
      static_cast<const IndexT*>(p.indices)[static_cast<i64>(n) * p.index_stride]);
  for (int i = tid; i < channels; i += threads) {
    const int t = slot_of(i);
    const i64 c = channel(t);
    const float w_last =
        gdn::to_f32(weight[c * p.weight_channel_stride + (kWidth - 1) * p.weight_tap_stride]);
    smem[t] = (bias != nullptr ? gdn::to_f32(bias[c * p.bias_stride]) : 0.0f) +
              w_last * gdn::to_f32(x_row[c]);
  }
  for (int t = tid; t < static_cast<int>(group); t += threads) {
    const u32 hv = h * group + static_cast<u32>(t);
    float g, beta;
    const float a =
        gdn::to_f32(static_cast<const GateT*>(p.a)[static_cast<i64>(n) * p.a_row_stride + hv]);
    const float b =
        gdn::to_f32(static_cast<const GateT*>(p.b)[static_cast<i64>(n) * p.b_row_stride + hv]);
    if constexpr (kGated) {
      g = a;
      beta = b;
    } else {
      g = gdn::log_decay(a, gdn::to_f32(static_cast<const ALogT*>(p.a_log)[hv]),
                         gdn::to_f32(static_cast<const DtBiasT*>(p.dt_bias)[hv]),
                         p.softplus_threshold);
      beta = gdn::sigmoid(b);
    }
    alpha_s[t] = expf(g);
    beta_s[t] = beta;
  }

  OutT* out = static_cast<OutT*>(p.out) + static_cast<i64>(n) * p.out_row_stride +
              static_cast<i64>(h) * rows;
  if (gdn_decode_conv_detail::invalid_slot<kInvalidRule>(slot, p.num_slots)) {
    // No state in either pool: zeros out, both pools untouched (every thread of every block of
    // the cluster returns here: they share the row).
    for (int r = row_begin + tid; r < row_end; r += threads) out[r] = gdn::from_f32<OutT>(0.0f);
    return;
  }

  // The first pass's state rows are loaded now, in the same round trip as the conv history, so
  // their latency overlaps the conv and the barrier instead of following them.
  const int lane = tid & 31;
  const int warp = tid >> 5;
  StateT* state =
      static_cast<StateT*>(p.state) + slot * p.state_slot_stride + static_cast<i64>(h) * rows * kK;
  const auto state_col = [&](int e) { return 32 * kStateVec * e + kStateVec * lane; };
  // Two register sets of kRows rows: the loads of the next pass are issued before the current
  // pass's reductions, so a warp always has state loads in flight.
  float xa[kRows][kPer];
  [[maybe_unused]] float xb[kRows][kPer];
  [[maybe_unused]] const auto load_rows = [&](float(&x)[kRows][kPer], int base) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = base + i * kWarps + warp;
#pragma unroll
      for (int e = 0; e < kAccesses; ++e) {
        float v[kStateVec];
        if (r < row_end && state_col(e) < kK) {
          gdn_decode_conv_detail::load_state_vec<StateT, kStateVec>(
              state + static_cast<i64>(r) * kK + state_col(e), v);
        } else {
#pragma unroll
          for (int j = 0; j < kStateVec; ++j) v[j] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kStateVec; ++j) x[i][e * kStateVec + j] = v[j];
      }
    }
  };
  constexpr int kStep = kWarps * kRows;
  // kStages: set s (rows row_begin + s kStep + i kWarps + warp) lives in ring place s % kStages;
  // every set is one commit group, empty past the group's rows, so the group count stays one per
  // set. The ring starts at the first 16-byte boundary past the floats above (none of them is a
  // q/k column: no clusters here).
  [[maybe_unused]] StateT* const ring =
      reinterpret_cast<StateT*>(smem + ((2 * kK + static_cast<int>(group) * (kV + 2) + 3) & ~3));
  [[maybe_unused]] const auto ring_rows = [&](int set) {
    return ring + ((set % (kStages > 0 ? kStages : 1)) * kWarps + warp) * kRows * kK;
  };
  [[maybe_unused]] const auto stage_rows = [&](int set) {
    StateT* const place = ring_rows(set);
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = row_begin + set * kStep + i * kWarps + warp;
      if (r < row_end) {
#pragma unroll
        for (int e = 0; e < kAccesses; ++e) {
          cp_async::copy16_portable(place + i * kK + state_col(e),
                                    state + static_cast<i64>(r) * kK + state_col(e));
        }
      }
    }
    cp_async::commit_portable();
  };
  if constexpr (kStages > 0) {
#pragma unroll
    for (int set = 0; set + 1 < kStages; ++set) stage_rows(set);
  } else {
    load_rows(xa, row_begin);
  }

  // Phase 1, the history: the conv output of the group's channels and their new pool columns.
  ConvT* pool = static_cast<ConvT*>(p.conv_state) + slot * p.conv_slot_stride;
  for (int i = tid; i < channels; i += threads) {
    const int t = slot_of(i);
    const i64 c = channel(t);
    ConvT* column = pool + c * p.conv_channel_stride;
    float hist[kWidth - 1];
#pragma unroll
    for (int j = 0; j < kWidth - 1; ++j) hist[j] = gdn::to_f32(column[j * p.conv_column_stride]);
    float acc = smem[t];
#pragma unroll
    for (int j = 0; j < kWidth - 1; ++j) {
      acc += gdn::to_f32(weight[c * p.weight_channel_stride + j * p.weight_tap_stride]) * hist[j];
    }
    if constexpr (kSilu) acc = __fdividef(acc, 1.0f + __expf(-acc));
    const float x_new = gdn::to_f32(x_row[c]);
    if (kCluster == 1 || t >= 2 * kK) {
      // This thread is the channel's only reader, so it may overwrite the columns it read.
#pragma unroll
      for (int j = 0; j + 1 < kWidth - 1; ++j) {
        column[j * p.conv_column_stride] = gdn::from_f32<ConvT>(hist[j + 1]);
      }
      column[(kWidth - 2) * p.conv_column_stride] = gdn::from_f32<ConvT>(x_new);
    } else if (t - qk_begin >= 0 && t - qk_begin < qk_share) {
      // A q/k channel of this block's share: the other blocks of the cluster read its columns
      // too, so the new ones wait in shared memory for the cluster barrier (end of the kernel).
      float* staged = qk_columns_s + (t - qk_begin) * (kWidth - 1);
#pragma unroll
      for (int j = 0; j + 1 < kWidth - 1; ++j) staged[j] = hist[j + 1];
      staged[kWidth - 2] = x_new;
    }
    smem[t] = gdn::to_f32(gdn::from_f32<QkvT>(acc));
  }
  // This block has read its q/k history: every value was consumed above (the conv outputs stored
  // to shared memory), so those loads have returned before the arrival issues, ahead of any
  // block's writes of the new columns, which follow its wait. Relaxed: a release arrival waited
  // for the state rows still in flight (~8% of the warps' stall samples at B = 1, the block's
  // barrier behind it another 14%: docs/performance.md).
  if constexpr (kCluster > 1) cluster::arrive_relaxed();
  __syncthreads();

  // Phase 2: norms and k.q, per warp (K / 32 elements per lane).
  float q[kPer], k[kPer];
  float q_sq = 0.0f, k_sq = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int i = state_col(e / kStateVec) + e % kStateVec;
    q[e] = i < kK ? q_s[i] : 0.0f;
    k[e] = i < kK ? k_s[i] : 0.0f;
    q_sq += q[e] * q[e];
    k_sq += k[e] * k[e];
  }
  float q_factor = p.scale;
  if constexpr (kL2Norm) {
    q_factor *= gdn::l2_inv_norm(gdn::group_sum<32>(q_sq));
    const float k_factor = gdn::l2_inv_norm(gdn::group_sum<32>(k_sq));
#pragma unroll
    for (int e = 0; e < kPer; ++e) k[e] *= k_factor;
  }
  float kq = 0.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    q[e] *= q_factor;
    kq += k[e] * q[e];
  }
  kq = gdn::group_sum<32>(kq);

  // Block-uniform trip counts: every warp runs the same shuffles (rows past the group's are
  // zeros and stored nowhere), which also keeps the host emulation's block-wide exchanges in step.
  const auto update_rows = [&](const float(&x)[kRows][kPer], int base) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int r = base + i * kWarps + warp;
      float dk = 0.0f, dq = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        dk += x[i][e] * k[e];
        dq += x[i][e] * q[e];
      }
      dk = gdn::group_sum<32>(dk);
      dq = gdn::group_sum<32>(dq);
      if (r >= row_end) continue;
      const int head = r / kV;
      const float alpha = alpha_s[head];
      const float u = beta_s[head] * (v_s[r] - alpha * dk);
#pragma unroll
      for (int e = 0; e < kAccesses; ++e) {
        if (state_col(e) < kK) {
          float nv[kStateVec];
#pragma unroll
          for (int j = 0; j < kStateVec; ++j) {
            nv[j] = alpha * x[i][e * kStateVec + j] + u * k[e * kStateVec + j];
          }
          gdn_decode_conv_detail::store_state_vec<StateT, kStateVec>(
              state + static_cast<i64>(r) * kK + state_col(e), nv);
        }
      }
      if (lane == 0) out[r] = gdn::from_f32<OutT>(alpha * dq + u * kq);
    }
  };
  if constexpr (kStages > 0) {
    const int sets = (row_end - row_begin + kStep - 1) / kStep;
    for (int set = 0; set < sets; ++set) {
      // Into the place set - 1 used: this lane read it (its values are in the stores of the last
      // update_rows) before this copy is issued.
      stage_rows(set + kStages - 1);
      cp_async::wait_portable<kStages - 1>();
      const StateT* const place = ring_rows(set);
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int r = row_begin + set * kStep + i * kWarps + warp;
#pragma unroll
        for (int e = 0; e < kAccesses; ++e) {
          float v[kStateVec];
          if (r < row_end) {
            gdn_decode_conv_detail::load_state_vec<StateT, kStateVec>(place + i * kK + state_col(e),
                                                                      v);
          } else {
#pragma unroll
            for (int j = 0; j < kStateVec; ++j) v[j] = 0.0f;
          }
#pragma unroll
          for (int j = 0; j < kStateVec; ++j) xa[i][e * kStateVec + j] = v[j];
        }
      }
      update_rows(xa, row_begin + set * kStep);
    }
    // (Empty groups past the end: nothing left in flight that a later block's ring could meet.)
    cp_async::wait_portable<0>();
  } else {
    for (int base = row_begin; base < row_end; base += 2 * kStep) {
      if (base + kStep < row_end) load_rows(xb, base + kStep);
      update_rows(xa, base);
      if (base + kStep >= row_end) break;
      if (base + 2 * kStep < row_end) load_rows(xa, base + 2 * kStep);
      update_rows(xb, base + kStep);
    }
  }
  if constexpr (kCluster > 1) {
    // Every block of the cluster has read the q/k history once all have arrived: this block's
    // share of the new columns replaces it (consecutive threads on consecutive columns).
    cluster::wait();
    for (int e = tid; e < qk_share * (kWidth - 1); e += threads) {
      const int i = e / (kWidth - 1), j = e % (kWidth - 1);
      pool[channel(qk_begin + i) * p.conv_channel_stride + j * p.conv_column_stride] =
          gdn::from_f32<ConvT>(qk_columns_s[e]);
    }
  }
}

template <typename QkvT, typename GateT, typename ALogT, typename DtBiasT, typename StateT,
          typename OutT, typename IndexT, typename WeightT, typename ConvT, int kK, int kV,
          int kWidth, int kWarps, bool kGated, bool kL2Norm, int kInvalidRule, bool kSilu,
          int kStateVec, int kCluster = 1, int kStages = 0>
__global__ void __launch_bounds__(kWarps * 32) gdn_decode_conv_kernel(GdnDecodeConvParams p) {
  extern __shared__ __align__(16) float gdn_decode_conv_smem[];
  gdn_decode_conv_block<QkvT, GateT, ALogT, DtBiasT, StateT, OutT, IndexT, WeightT, ConvT, kK, kV,
                        kWidth, kWarps, kGated, kL2Norm, kInvalidRule, kSilu, kStateVec, kCluster,
                        kStages>(p, gdn_decode_conv_smem);
}

}  // namespace kjit
