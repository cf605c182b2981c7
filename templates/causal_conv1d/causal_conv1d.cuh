// SPDX-License-Identifier: Apache-2.0
// causal_conv1d: short causal depthwise convolution over varlen sequences (prefill) or decode
// rows (update), with each sequence's last inputs kept in a conv-state pool.
//   y[t, c] = act(bias[c] + sum_{j=0}^{W-1} w[c, W-1-j] * in[t-j, c])
// in[t-j] for t-j < 0 comes from the sequence's history (pool columns, or zeros). Every thread
// owns kVec consecutive channels of a run of tokens and keeps the W-1 previous inputs of each
// channel in registers, so every input is read once (plus a W-1 token halo per chunk).
//
// Memory bound: the inputs of a batch of kChunk tokens are all loaded before any arithmetic,
// so each thread has kChunk vector loads in flight; in the prefill modes the next batch's
// loads are issued before the current batch is computed and stored (two register buffers), so
// loads stay in flight while a thread computes. A chunked-prefill work item covers kSpan
// tokens (several batches), so that what an item pays before its first load can be issued
// (the sequence lookup, weights, the W-1 token halo) is spread over kSpan tokens. The grid is
// 1-D with a grid-stride loop over 64-bit work items: legal for every T, N, B and D (no grid
// y/z at all).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/causal_conv1d/params.h"
// (Its *_portable copies are plain ones where the emulated tests compile this as host C++.)
#include "templates/common/cp_async.cuh"
#include "templates/common/vec.cuh"

namespace kjit {

namespace conv_detail {

using vec::Bits;
using vec::Block;
using vec::Raw;

template <typename T>
__device__ __forceinline__ float load1(const T* p) {
  return vec::to_f32(*p);
}
template <typename T>
__device__ __forceinline__ void store1(T* p, float v) {
  *p = vec::from_f32<T>(v);
}

template <typename T, int kVec>
__device__ __forceinline__ void load_vec(const T* p, float (&v)[kVec]) {
  Raw<T, kVec> raw;
  raw.load(p);
#pragma unroll
  for (int k = 0; k < kVec; ++k) v[k] = raw.get(k);
}

/// kVec floats rounded to T, stored with one instruction (vec::store16 / store8: a plain 16-byte
/// store is split by NVVM for most tokens of an unrolled batch).
template <typename T, int kVec>
__device__ __forceinline__ void store_vec(T* p, const float (&v)[kVec]) {
  constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  if constexpr (kVec == 1) {
    store1(p, v[0]);
  } else {
    constexpr int kWords = kBytes / 4;
    unsigned int w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (sizeof(T) == 4) {
        w[i] = __float_as_uint(v[i]);
      } else {
        w[i] = vec::pack2<T>(v[2 * i], v[2 * i + 1]);
      }
    }
    if constexpr (kWords == 4) {
      vec::store16(reinterpret_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
    } else if constexpr (kWords == 2) {
      vec::store8(reinterpret_cast<uint2*>(p), make_uint2(w[0], w[1]));
    } else {
      *reinterpret_cast<unsigned int*>(p) = w[0];
    }
  }
}

/// Element i of an i32 / i64 array (bytes 4 or 8) with a stride.
__device__ __forceinline__ i64 load_int(const void* base, i64 i, i64 stride, u32 bytes) {
  if (bytes == 8) return static_cast<const i64*>(base)[i * stride];
  return static_cast<i64>(static_cast<const int*>(base)[i * stride]);
}

__device__ __forceinline__ bool slot_valid(i64 slot, const CausalConv1dParams& p) {
  return !(slot < 0 || (p.nonpositive_invalid != 0 && slot == 0) || slot >= p.num_slots);
}

/// Per-thread state of one (run of tokens, channel group): weights, bias and the W-1 previous
/// inputs of each of its kVec channels, oldest first. kPacked (the update's rows): 16-bit
/// weights stay in TW's raw words, two a register, widened by a shift at each use: a row has
/// one or a few tokens, and registers bound how many threads, and so how many loads, an SM
/// keeps in flight (docs/performance.md, "The update's registers"). The prefill modes keep
/// them as floats, converted once, for the many tokens of a span.
template <typename TW, int kWidth, int kVec, bool kSilu, bool kPacked>
struct Conv {
  /// Weight (channel k, tap j) is element k * kWidth + j of w_raw; w_f[j][k] when not packed.
  static constexpr int kWeights = kWidth * kVec;
  static constexpr int kWeightWords = (kWeights * static_cast<int>(sizeof(TW)) + 3) / 4;
  unsigned int w_raw[kPacked ? kWeightWords : 1];
  float w_f[kPacked ? 1 : kWidth][kVec];
  float b[kVec];
  float h[kWidth - 1][kVec];

  __device__ __forceinline__ float w(int j, int k) const {
    if constexpr (!kPacked) {
      return w_f[j][k];
    } else {
      return vec::get<TW>(w_raw, k * kWidth + j);
    }
  }

  /// Weights and bias of channels c0..c0+kVec-1: one contiguous [kVec, W] block of 16-byte
  /// vectors and one bias vector where the launch's flags say the layout allows (a scalar load
  /// per element, each lane 2 W bytes from the next, costs a wavefront per lane), else element
  /// by element through the strides.
  __device__ __forceinline__ void load_weights(const CausalConv1dParams& p, i64 c0) {
    const TW* weight = static_cast<const TW*>(p.weight);
    bool done = false;
    if constexpr ((kWeights * sizeof(TW)) % 16 == 0) {
      if ((p.vector_flags & kConvWeightBlock) != 0) {
        Block<TW, kWeights> blk;
        blk.load(weight + c0 * kWidth);
        if constexpr (kPacked) {
#pragma unroll
          for (int i = 0; i < kWeightWords; ++i) w_raw[i] = blk.w[i];
        } else {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
#pragma unroll
            for (int j = 0; j < kWidth; ++j) w_f[j][k] = blk.get(k * kWidth + j);
          }
        }
        done = true;
      }
    }
    if (!done) {
      if constexpr (kPacked) {
#pragma unroll
        for (int i = 0; i < kWeightWords; ++i) w_raw[i] = 0u;
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
#pragma unroll
        for (int j = 0; j < kWidth; ++j) {
          const float x =
              load1(weight + (c0 + k) * p.weight_channel_stride + j * p.weight_tap_stride);
          if constexpr (!kPacked) {
            w_f[j][k] = x;
          } else {
            const int e = k * kWidth + j;
            const unsigned int bits = Bits<TW>::from_f32(x);
            if constexpr (sizeof(TW) == 4) {
              w_raw[e] = bits;
            } else {
              w_raw[e / 2] |= bits << (16 * (e % 2));
            }
          }
        }
      }
    }
    const TW* bias = static_cast<const TW*>(p.bias);
    if constexpr (kVec > 1 && kVec * sizeof(TW) <= 16) {
      if ((p.vector_flags & kConvBiasVector) != 0) {
        load_vec<TW, kVec>(bias + c0, b);
        return;
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      b[k] = bias != nullptr ? load1(bias + (c0 + k) * p.bias_stride) : 0.0f;
    }
  }

  /// One token: y from the input and the history, then the input joins the history.
  __device__ __forceinline__ void step(const float (&in)[kVec], float (&y)[kVec]) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float acc = b[k] + w(kWidth - 1, k) * in[k];
#pragma unroll
      for (int j = 0; j < kWidth - 1; ++j) acc += w(j, k) * h[j][k];
      // SiLU with the fast division (2 ulp, div.full.f32 as Triton's `/` on f32): IEEE
      // division expands to ~10 instructions with a slow-path branch, per channel and token, in
      // a kernel whose instruction issue is close to its bandwidth's budget. For acc < -87
      // (exp(-acc) past 2^126) it returns 0, the limit of acc * sigmoid(acc) to f32 precision.
      if constexpr (kSilu) acc = __fdividef(acc, 1.0f + __expf(-acc));
      y[k] = acc;
#pragma unroll
      for (int j = 0; j + 1 < kWidth - 1; ++j) h[j][k] = h[j + 1][k];
      h[kWidth - 2][k] = in[k];
    }
  }
};

/// Pointer to element (token offset `t_off`, channel c0) of x / out.
template <typename T, int kVec>
__device__ __forceinline__ T* at(const void* base, i64 t_off, i64 c0, i64 channel_stride) {
  return const_cast<T*>(static_cast<const T*>(base)) + t_off + c0 * channel_stride;
}

/// Writes zeros to the output rows of tokens [0, count) starting at token offset `t_off`.
template <typename TOut, int kVec>
__device__ __forceinline__ void zero_rows(const CausalConv1dParams& p, i64 t_off, i64 t_stride,
                                          i64 count, i64 c0) {
  float z[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) z[k] = 0.0f;
  for (i64 t = 0; t < count; ++t) {
    TOut* dst = at<TOut, kVec>(p.out, t_off + t * t_stride, c0, p.out_channel_stride);
    if constexpr (kVec == 1) {
      store1(dst, 0.0f);
    } else {
      store_vec<TOut, kVec>(dst, z);
    }
  }
}

/// Loads tokens [t0, min(t0 + kChunk, count)) of x (token offsets x_off + i * x_ts).
template <typename TIn, int kVec, int kChunk>
__device__ __forceinline__ void load_batch(const CausalConv1dParams& p,
                                           Raw<TIn, kVec> (&xs)[kChunk], i64 x_off, i64 x_ts,
                                           i64 t0, i64 count, i64 c0) {
#pragma unroll
  for (int u = 0; u < kChunk; ++u) {
    if (t0 + u < count) {
      xs[u].load(at<TIn, kVec>(p.x, x_off + (t0 + u) * x_ts, c0, p.x_channel_stride));
    }
  }
}

/// Runs the loaded tokens [t0, min(t0 + kChunk, count)) through `conv` and stores their outputs
/// (token offsets o_off + i * o_ts).
template <typename TIn, typename TOut, int kWidth, int kVec, int kChunk, bool kSilu, typename TW,
          bool kPacked>
__device__ __forceinline__ void compute_batch(const CausalConv1dParams& p,
                                              Conv<TW, kWidth, kVec, kSilu, kPacked>& conv,
                                              const Raw<TIn, kVec> (&xs)[kChunk], i64 o_off,
                                              i64 o_ts, i64 t0, i64 count, i64 c0) {
#pragma unroll
  for (int u = 0; u < kChunk; ++u) {
    if (t0 + u < count) {
      float in[kVec], y[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) in[k] = xs[u].get(k);
      conv.step(in, y);
      TOut* dst = at<TOut, kVec>(p.out, o_off + (t0 + u) * o_ts, c0, p.out_channel_stride);
      if constexpr (kVec == 1) {
        store1(dst, y[0]);
      } else {
        store_vec<TOut, kVec>(dst, y);
      }
    }
  }
}

/// Runs tokens [begin, count) through `conv`, kChunk tokens' loads at a time before their
/// arithmetic.
template <typename TIn, typename TOut, int kWidth, int kVec, int kChunk, bool kSilu, typename TW,
          bool kPacked>
__device__ __forceinline__ void run_tokens(const CausalConv1dParams& p,
                                           Conv<TW, kWidth, kVec, kSilu, kPacked>& conv, i64 x_off,
                                           i64 x_ts, i64 o_off, i64 o_ts, i64 begin, i64 count,
                                           i64 c0) {
  for (i64 t0 = begin; t0 < count; t0 += kChunk) {
    Raw<TIn, kVec> xs[kChunk];
    load_batch<TIn, kVec, kChunk>(p, xs, x_off, x_ts, t0, count, c0);
    compute_batch<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, xs, o_off, o_ts, t0, count, c0);
  }
}

/// Runs tokens [0, count) through `conv` with two batches of loads: batch k + 1 is issued
/// before batch k is computed and stored, so a thread always has loads in flight while it
/// computes (memory latency overlaps the arithmetic and the stores). `first` holds batch 0,
/// already issued by the caller (its loads overlap the caller's pool / halo reads). In place
/// (out == x, sequential mode) this is still exact: the rows loaded ahead are later rows than
/// the ones stored, and each thread owns its channels.
template <typename TIn, typename TOut, int kWidth, int kVec, int kChunk, bool kSilu, typename TW,
          bool kPacked>
__device__ __forceinline__ void run_tokens_pipelined(const CausalConv1dParams& p,
                                                     Conv<TW, kWidth, kVec, kSilu, kPacked>& conv,
                                                     Raw<TIn, kVec> (&first)[kChunk], i64 x_off,
                                                     i64 o_off, i64 count, i64 c0) {
  const i64 x_ts = p.x_token_stride, o_ts = p.out_token_stride;
  Raw<TIn, kVec> second[kChunk];
  // Two batches per iteration, so that the buffers swap roles without register copies.
  for (i64 t0 = 0; t0 < count; t0 += 2 * kChunk) {
    load_batch<TIn, kVec, kChunk>(p, second, x_off, x_ts, t0 + kChunk, count, c0);
    compute_batch<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, first, o_off, o_ts, t0, count,
                                                          c0);
    if (t0 + kChunk >= count) break;
    load_batch<TIn, kVec, kChunk>(p, first, x_off, x_ts, t0 + 2 * kChunk, count, c0);
    compute_batch<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, second, o_off, o_ts, t0 + kChunk,
                                                          count, c0);
  }
}

/// Reads x[t_off, c0 + k] for every k as floats (any channel stride).
template <typename TIn, int kVec>
__device__ __forceinline__ void load_x(const CausalConv1dParams& p, i64 t_off, i64 c0,
                                       float (&v)[kVec]) {
  const TIn* src = at<TIn, kVec>(p.x, t_off, c0, p.x_channel_stride);
  if constexpr (kVec == 1) {
    v[0] = load1(src);
  } else {
    load_vec<TIn, kVec>(src, v);
  }
}

template <typename TState>
__device__ __forceinline__ TState* state_at(const CausalConv1dParams& p, i64 slot, i64 c, i64 col) {
  return static_cast<TState*>(p.state) + slot * p.state_slot_stride + c * p.state_channel_stride +
         col * p.state_col_stride;
}

/// The pool columns of one slot and kVec channels, by the planner's access mode.
template <typename TState, int kVec, int kWidth, ConvStateAccess kAccess>
struct PoolIo {
  /// h[j][k] = column first + j of channel c0 + k (block access: first is 0).
  static __device__ __forceinline__ void read(const CausalConv1dParams& p, i64 slot, i64 c0,
                                              i64 first, float (&h)[kWidth - 1][kVec]) {
    if constexpr (kAccess == ConvStateAccess::block) {
      Block<TState, kVec*(kWidth - 1)> b;
      b.load(state_at<TState>(p, slot, c0, 0));
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
#pragma unroll
        for (int j = 0; j < kWidth - 1; ++j) h[j][k] = b.get(k * (kWidth - 1) + j);
      }
    } else if constexpr (kAccess == ConvStateAccess::channels) {
#pragma unroll
      for (int j = 0; j < kWidth - 1; ++j) {
        load_vec<TState, kVec>(state_at<TState>(p, slot, c0, first + j), h[j]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
#pragma unroll
        for (int j = 0; j < kWidth - 1; ++j) {
          h[j][k] = load1(state_at<TState>(p, slot, c0 + k, first + j));
        }
      }
    }
  }
  /// Columns 0..W-2 of channels c0..c0+kVec-1 = v.
  static __device__ __forceinline__ void write(const CausalConv1dParams& p, i64 slot, i64 c0,
                                               const float (&v)[kWidth - 1][kVec]) {
    if constexpr (kAccess == ConvStateAccess::block) {
      Block<TState, kVec*(kWidth - 1)> b;
#pragma unroll
      for (int i = 0; i < Block<TState, kVec*(kWidth - 1)>::kWords; ++i) b.w[i] = 0;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
#pragma unroll
        for (int j = 0; j < kWidth - 1; ++j) b.set(k * (kWidth - 1) + j, v[j][k]);
      }
      b.store(state_at<TState>(p, slot, c0, 0));
    } else {
#pragma unroll
      for (int j = 0; j < kWidth - 1; ++j) write_column(p, slot, c0, j, v[j]);
    }
  }
  /// One column (not the block access: it moves whole blocks only).
  static __device__ __forceinline__ void write_column(const CausalConv1dParams& p, i64 slot, i64 c0,
                                                      i64 col, const float (&v)[kVec]) {
    if constexpr (kAccess == ConvStateAccess::channels) {
      store_vec<TState, kVec>(state_at<TState>(p, slot, c0, col), v);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) store1(state_at<TState>(p, slot, c0 + k, col), v[k]);
    }
  }
};

/// Entry e of (history ++ the row's tokens) for kVec channels: from registers or from x.
template <typename TIn, int kVec, int kWidth>
__device__ __forceinline__ void column_entry(const CausalConv1dParams& p,
                                             const float (&h)[kWidth - 1][kVec], i64 e, i64 x_off,
                                             i64 c0, float (&v)[kVec]) {
  if (e < kWidth - 1) {
#pragma unroll
    for (int j = 0; j < kWidth - 1; ++j) {
      if (j == e) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[k] = h[j][k];
      }
    }
  } else {
    load_x<TIn, kVec>(p, x_off + (e - (kWidth - 1)) * p.x_token_stride, c0, v);
  }
}

/// The staged prefill (kStages > 0; the default where it applies): x's batches go to shared memory
/// by cp.async (16 bytes per token, no register held while in flight), kStages - 1 batches ahead of
/// the one computed, so a thread keeps up to (kStages - 1) x kChunk loads in flight with the
/// registers of one batch. Each thread reads back only the slots it wrote, so no barrier is
/// needed: cp.async.wait_group makes a thread's own copies visible to it. On the host (the
/// emulated tests) the copy is a plain one and commit / wait do nothing.
/// The block's stages: [stage][token of the batch][thread], 16 bytes each (a function of its own,
/// so that only kernels with stages declare shared memory).
template <int kSlots>
__device__ __forceinline__ uint4* stage_slots() {
#if defined(__CUDA_ARCH__)
  __shared__ uint4 slots[kSlots];
#else
  // Host emulation: one block at a time, its threads one after another, each in its own slots.
  static uint4 slots[kSlots];
#endif
  return slots;
}

/// Issues tokens [t0, min(t0 + kChunk, count)) of x into one stage (`stage`: this thread's slot
/// of token 0 of the stage; token u is kConvBlockThreads slots further) and commits them as one
/// group (an empty group past the end, so that the group count stays one per batch).
template <typename TIn, int kVec, int kChunk>
__device__ __forceinline__ void stage_batch(const CausalConv1dParams& p, uint4* stage, i64 x_off,
                                            i64 t0, i64 count, i64 c0) {
  static_assert(kVec * sizeof(TIn) == 16, "the staged prefill moves 16-byte vectors");
#pragma unroll
  for (int u = 0; u < kChunk; ++u) {
    if (t0 + u < count) {
      cp_async::copy16_portable(
          stage + u * kConvBlockThreads,
          at<TIn, kVec>(p.x, x_off + (t0 + u) * p.x_token_stride, c0, p.x_channel_stride));
    }
  }
  cp_async::commit_portable();
}

/// run_tokens_pipelined through shared memory: batches 0..kStages-2 were issued by the caller
/// (stage_batch into stages 0..kStages-2); batch b + kStages - 1 is issued into the stage batch
/// b - 1 was read from, before batch b is computed and stored.
template <typename TIn, typename TOut, int kWidth, int kVec, int kChunk, int kStages, bool kSilu,
          typename TW, bool kPacked>
__device__ __forceinline__ void run_tokens_staged(const CausalConv1dParams& p,
                                                  Conv<TW, kWidth, kVec, kSilu, kPacked>& conv,
                                                  uint4* mine, i64 x_off, i64 o_off, i64 count,
                                                  i64 c0) {
  constexpr int kStageSlots = kChunk * kConvBlockThreads;
  const i64 batches = (count + kChunk - 1) / kChunk;
  for (i64 b = 0; b < batches; ++b) {
    // Groups committed: batches 0..b + kStages - 2; at most kStages - 2 pending: batch b is in.
    cp_async::wait_portable<kStages - 2>();
    stage_batch<TIn, kVec, kChunk>(p, mine + ((b + kStages - 1) % kStages) * kStageSlots, x_off,
                                   (b + kStages - 1) * kChunk, count, c0);
    const uint4* stage = mine + (b % kStages) * kStageSlots;
    Raw<TIn, kVec> xs[kChunk];
#pragma unroll
    for (int u = 0; u < kChunk; ++u) {
      if (b * kChunk + u < count) {
        const uint4 v = stage[u * kConvBlockThreads];
        xs[u].w[0] = v.x;
        xs[u].w[1] = v.y;
        xs[u].w[2] = v.z;
        xs[u].w[3] = v.w;
      }
    }
    compute_batch<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, xs, o_off, p.out_token_stride,
                                                          b * kChunk, count, c0);
  }
}

}  // namespace conv_detail

/// Minimum blocks per SM of __launch_bounds__: kMinBlocks when not 0 (a tuning candidate), else
/// single-token rows (the decode update, chunk 1) at 5 blocks per SM: 94
/// registers, no spills (128 and 4 blocks before); the other modes at the compiler's choice (0:
/// no minimum), as before.
template <ConvMode kMode, int kChunk, int kMinBlocks>
inline constexpr int kConvMinBlocks = kMinBlocks != 0
                                          ? kMinBlocks
                                          : (kMode == ConvMode::rows && kChunk == 1 ? 5 : 0);

/// The kernel of every mode. TIn / TOut: x / out; TW: weight and bias; TState: the pool.
/// kChunk: tokens per batch of loads. kSpan: tokens per work item of the chunked mode (0 in the
/// other modes). kMinBlocks: 0 or the minimum blocks per SM to compile for (kConvMinBlocks).
/// kStages: 0 or the shared-memory stages of the chunked prefill's batches (run_tokens_staged;
/// the plans' default where 16-byte accesses allow). kMinBlocks is a tuning candidate.
template <typename TIn, typename TOut, typename TW, typename TState, int kWidth, int kVec,
          int kChunk, int kSpan, ConvMode kMode, ConvStateAccess kAccess, bool kSilu,
          int kMinBlocks = 0, int kStages = 0>
// (The minimum in parentheses: its template argument list's commas would split the macro's.)
__global__ void __launch_bounds__(kConvBlockThreads, (kConvMinBlocks<kMode, kChunk, kMinBlocks>))
    causal_conv1d_kernel(const CausalConv1dParams p) {
  using namespace conv_detail;
  static_assert(kWidth >= 2 && kWidth <= 8, "W in 2..8");
  static_assert(kMode != ConvMode::chunked || (kSpan >= kWidth - 1 && kSpan >= kChunk),
                "a span covers the W-1 token halo of the next one and at least one batch");
  static_assert(kMode == ConvMode::chunked || kSpan == 0, "spans belong to the chunked mode");
  static_assert(
      kStages == 0 || (kMode == ConvMode::chunked && kStages >= 2 && kVec * sizeof(TIn) == 16 &&
                       kStages * kChunk <= kConvMaxStagedTokens),
      "stages: the chunked mode's 16-byte accesses, 2.. stages, <= 48 KiB per block");
  // The staged prefill's batches (only kernels with stages declare the shared memory).
  uint4* mine = nullptr;
  if constexpr (kStages > 0) {
    mine = stage_slots<kStages * kChunk * kConvBlockThreads>() + threadIdx.x;
  }
  using Pool = PoolIo<TState, kVec, kWidth, kAccess>;
  const u64 stride = static_cast<u64>(gridDim.x) * blockDim.x;
  const u64 groups = p.channel_groups;
  for (u64 item = static_cast<u64>(blockIdx.x) * blockDim.x + threadIdx.x; item < p.num_items;
       item += stride) {
    const u64 unit = item / groups;
    const i64 c0 = static_cast<i64>(item - unit * groups) * kVec;
    Conv<TW, kWidth, kVec, kSilu, kMode == ConvMode::rows> conv;

    if constexpr (kMode == ConvMode::rows) {
      const i64 row = static_cast<i64>(unit);
      i64 S = p.num_tokens;
      i64 x_off = row * p.x_row_stride;
      i64 o_off = row * p.out_row_stride;
      // Weights and the first tokens do not depend on the slot: loaded before the index, their
      // latency overlaps the index -> pool chain (a decode step is that chain at small B).
      conv.load_weights(p, c0);
      if (p.query_start_loc != nullptr) {
        // Varlen rows: x is [T, D] and the row's tokens are query_start_loc[row]..[row + 1],
        // clamped into 0..T so that bad offsets can never address outside x.
        const i64 T = p.num_tokens;
        i64 begin = load_int(p.query_start_loc, row, p.query_start_stride, p.query_start_bytes);
        i64 end = load_int(p.query_start_loc, row + 1, p.query_start_stride, p.query_start_bytes);
        begin = begin < 0 ? 0 : (begin > T ? T : begin);
        end = end < begin ? begin : (end > T ? T : end);
        S = end - begin;
        x_off = begin * p.x_token_stride;
        o_off = begin * p.out_token_stride;
        // A row without tokens has no output and leaves its slot untouched (vLLM's rule).
        if (S == 0) continue;
      }
      Raw<TIn, kVec> first_batch[kChunk];
      load_batch<TIn, kVec, kChunk>(p, first_batch, x_off, p.x_token_stride, 0, S, c0);
      const i64 slot = load_int(p.state_indices, row, p.index_stride, p.index_bytes);
      if (!slot_valid(slot, p)) {
        zero_rows<TOut, kVec>(p, o_off, p.out_token_stride, S, c0);
        continue;
      }
      // Speculative: the history of `a` accepted tokens starts at column a - 1; clamped so that
      // a bad count can never address outside the slot.
      i64 first = 0;
      if (p.num_accepted != nullptr) {
        const i64 a = load_int(p.num_accepted, row, p.accepted_stride, p.accepted_bytes);
        const i64 most = p.state_len - (kWidth - 1) + 1;
        first = (a < 1 ? 1 : (a > most ? most : a)) - 1;
      }
      Pool::read(p, slot, c0, first, conv.h);
      const bool spec = p.num_accepted != nullptr;
      if (spec) {
        // Speculative: column k of the slot takes entry k + 1 of (history ++ x) (the next step
        // picks its history by its acceptance count), k < min(W - 2 + S, L). Written before any
        // output: x may be out (in place), and these read the history as it was loaded.
        const i64 cols = (kWidth - 2 + S) < p.state_len ? (kWidth - 2 + S) : p.state_len;
        if constexpr (kAccess == ConvStateAccess::block) {
          // (The block access moves whole [vec, W-1] blocks: columns 0..W-2 together.)
          float nv[kWidth - 1][kVec];
#pragma unroll
          for (int col = 0; col < kWidth - 1; ++col) {
            column_entry<TIn, kVec, kWidth>(p, conv.h, col + 1, x_off, c0, nv[col]);
          }
          Pool::write(p, slot, c0, nv);
        } else {
          for (i64 col = 0; col < cols; ++col) {
            float v[kVec];
            column_entry<TIn, kVec, kWidth>(p, conv.h, col + 1, x_off, c0, v);
            Pool::write_column(p, slot, c0, col, v);
          }
        }
      }
      compute_batch<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, first_batch, o_off,
                                                            p.out_token_stride, 0, S, c0);
      run_tokens<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, x_off, p.x_token_stride, o_off,
                                                         p.out_token_stride, kChunk, S, c0);
      // Not speculative: the slot takes the last W - 1 inputs of (history ++ x), which is what
      // the steps leave in conv.h (each token's input was loaded before its output was stored,
      // so this is exact in place too). Written from registers after the outputs, no column
      // array is held beside the history (fewer registers: more threads per SM, more loads in
      // flight).
      if (!spec) Pool::write(p, slot, c0, conv.h);
    } else {
      // Prefill: which sequence and which tokens of it. The weights first: they do not depend on
      // the answer, so their loads overlap the search's.
      conv.load_weights(p, c0);
      i64 n = 0, first_token = 0;
      if constexpr (kMode == ConvMode::chunked) {
        // The largest n with floor(cu[n] / kSpan) + n <= unit (non-decreasing in n).
        i64 lo = 0, hi = p.num_seqs - 1;
        while (lo < hi) {
          const i64 mid = (lo + hi + 1) / 2;
          const i64 base = load_int(p.cu_seqlens, mid, p.cu_stride, p.cu_bytes) / kSpan + mid;
          if (base <= static_cast<i64>(unit)) {
            lo = mid;
          } else {
            hi = mid - 1;
          }
        }
        n = lo;
        const i64 start = load_int(p.cu_seqlens, n, p.cu_stride, p.cu_bytes);
        first_token = (static_cast<i64>(unit) - (start / kSpan + n)) * kSpan;
      } else {
        n = static_cast<i64>(unit);
      }
      const i64 start = load_int(p.cu_seqlens, n, p.cu_stride, p.cu_bytes);
      const i64 len = load_int(p.cu_seqlens, n + 1, p.cu_stride, p.cu_bytes) - start;
      if (first_token >= len) continue;  // an id past the sequence's spans, or no tokens
      const i64 count = kMode == ConvMode::chunked
                            ? (len - first_token < kSpan ? len - first_token : kSpan)
                            : len;
      const i64 x_off = (start + first_token) * p.x_token_stride;
      const i64 o_off = (start + first_token) * p.out_token_stride;
      // The first batch does not depend on the slot: issued with the index load, so that its
      // latency overlaps the index -> pool (or halo) reads below. (Staged: the first kStages - 1
      // batches, into shared memory.)
      Raw<TIn, kVec> first_batch[kStages > 0 ? 1 : kChunk];
      if constexpr (kStages > 0) {
#pragma unroll
        for (int s = 0; s + 1 < kStages; ++s) {
          stage_batch<TIn, kVec, kChunk>(p, mine + s * kChunk * kConvBlockThreads, x_off,
                                         s * kChunk, count, c0);
        }
      } else {
        load_batch<TIn, kVec, kChunk>(p, first_batch, x_off, p.x_token_stride, 0, count, c0);
      }
      const i64 slot = load_int(p.state_indices, n, p.index_stride, p.index_bytes);
      if (!slot_valid(slot, p)) {
        // (Staged: the copies land before the next item's reuse the same slots.)
        if constexpr (kStages > 0) cp_async::wait_portable<0>();
        zero_rows<TOut, kVec>(p, o_off, p.out_token_stride, count, c0);
        continue;
      }
      if (first_token == 0) {
        const bool has =
            p.has_initial_state == nullptr || p.has_initial_state[n * p.has_initial_stride] != 0;
        if (has) {
          Pool::read(p, slot, c0, 0, conv.h);
        } else {
#pragma unroll
          for (int j = 0; j < kWidth - 1; ++j) {
#pragma unroll
            for (int k = 0; k < kVec; ++k) conv.h[j][k] = 0.0f;
          }
        }
      } else {
        // The halo: the W - 1 inputs before the span, all inside the sequence (spans are at
        // least W - 1 tokens long).
#pragma unroll
        for (int j = 0; j < kWidth - 1; ++j) {
          load_x<TIn, kVec>(p, x_off - (kWidth - 1 - j) * p.x_token_stride, c0, conv.h[j]);
        }
      }
      if constexpr (kStages > 0) {
        run_tokens_staged<TIn, TOut, kWidth, kVec, kChunk, kStages, kSilu>(p, conv, mine, x_off,
                                                                           o_off, count, c0);
        cp_async::wait_portable<0>();  // the empty groups past the end, before the next item's
                                       // copies
      } else {
        run_tokens_pipelined<TIn, TOut, kWidth, kVec, kChunk, kSilu>(p, conv, first_batch, x_off,
                                                                     o_off, count, c0);
      }
      // The slot's new columns, by the thread that read it (the sequence's first span), after
      // its tokens: no batch of loads is in flight any more, so the column values do not add
      // to the registers the loop needs. A sequence within its first span (sequential: always)
      // leaves its last W - 1 inputs, or the history shifted by fewer tokens, in conv.h (read
      // from registers, since x may be out in place). A longer one's are x rows len - W + 1 ..
      // len - 1, all inside the sequence (len > span >= W - 1) and not written (out of place).
      if (first_token == 0) {
        if (count == len) {
          Pool::write(p, slot, c0, conv.h);
        } else {
          float nv[kWidth - 1][kVec];
#pragma unroll
          for (int j = 0; j < kWidth - 1; ++j) {
            load_x<TIn, kVec>(p, (start + len - (kWidth - 1) + j) * p.x_token_stride, c0, nv[j]);
          }
          Pool::write(p, slot, c0, nv);
        }
      }
    }
  }
}

}  // namespace kjit
