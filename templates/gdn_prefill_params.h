// SPDX-License-Identifier: Apache-2.0
// Parameter block and shared-memory layout of the Gated DeltaNet chunked prefill kernel
// (templates/gdn_prefill.cuh), shared with host code (lib/ops/gdn_prefill.cpp): the host sizes
// the dynamic shared memory with the same function the kernel carves it with.
#pragma once

#include "kjit/common/types.h"

// The layout function runs on both sides; host compilers do not know __host__ __device__.
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define KJIT_GDN_PREFILL_HD __host__ __device__
#else
#define KJIT_GDN_PREFILL_HD
#endif

namespace kjit {

/// Tokens per chunk of the WY algorithm.
inline constexpr int kGdnPrefillChunk = 64;
/// Threads per block (4 warps: each owns 16 rows of a 64-row chunk product).
inline constexpr int kGdnPrefillThreads = 128;

/// Byte offsets of the kernel's shared-memory buffers for key dim `k` and value tile `bv`.
/// bf16 tiles have 8 elements of row padding (16 bytes) so ldmatrix rows land on distinct bank
/// groups; f32 tiles are [64][72].
struct GdnPrefillSmem {
  u32 q;      // bf16 [64][k + 8]: L2-normalized q of the chunk
  u32 k;      // bf16 [64][k + 8]: L2-normalized k of the chunk
  u32 s;      // bf16 [bv][k + 8]: the state tile at chunk start (mma operand copy)
  u32 a;      // f32 [64][72]: gated strictly-lower beta K K^T; later Vn^T and decayed Vn^T
  u32 t;      // f32 [64][72]: (I + A)^-1, lower blocks; upper blocks are scratch
  u32 p;      // bf16 [64][72]: causal gated q k^T
  u32 r;      // bf16 [bv][72]: R^T = (beta (v - e^gamma k S^T))^T
  u32 gamma;  // f32 [64]: chunk-local cumulative log decay
  u32 beta;   // f32 [64]
  u32 total;  // bytes in all
};

KJIT_GDN_PREFILL_HD constexpr u32 gdn_prefill_align16(u32 bytes) { return (bytes + 15u) & ~15u; }

KJIT_GDN_PREFILL_HD constexpr GdnPrefillSmem gdn_prefill_smem(int k, int bv) {
  GdnPrefillSmem m{};
  const u32 row_k = u32(k + 8) * 2u;
  const u32 tile64_f32 = 64u * 72u * 4u;
  const u32 vn_pair = 2u * u32(bv) * 72u * 2u;
  u32 at = 0;
  m.q = at;
  at += gdn_prefill_align16(64u * row_k);
  m.k = at;
  at += gdn_prefill_align16(64u * row_k);
  m.s = at;
  at += gdn_prefill_align16(u32(bv) * row_k);
  m.a = at;
  at += gdn_prefill_align16(tile64_f32 > vn_pair ? tile64_f32 : vn_pair);
  m.t = at;
  at += tile64_f32;
  m.p = at;
  at += 64u * 72u * 2u;
  m.r = at;
  at += gdn_prefill_align16(u32(bv) * 72u * 2u);
  m.gamma = at;
  at += 64u * 4u;
  m.beta = at;
  at += 64u * 4u;
  m.total = at;
  return m;
}

/// Arguments of one prefill call. Pointers are typed by the kernel's template parameters; all
/// strides are in elements of the tensor they belong to; the last dimension of every tensor is
/// contiguous.
struct GdnPrefillParams {
  /// q, k [T, H, K]; v [T, HV, V].
  const void* q;
  const void* k;
  const void* v;
  /// Raw gates: a, b [T, HV]; precomputed: g (log decay) and beta [T, HV], f32.
  const void* a;
  const void* b;
  /// [HV] each; unused with precomputed gates.
  const void* a_log;
  const void* dt_bias;
  /// [N + 1] token offsets of the sequences.
  const void* cu_seqlens;
  /// [N] pool slot of each sequence; < 0 (or >= num_slots): padding, runs from a zero state
  /// and never touches the pool.
  const void* state_indices;
  /// [N] u8, 0: the sequence starts from a zero state. nullptr: every sequence has one.
  const unsigned char* has_initial_state;
  /// [slots, HV, V, K] pool, inner [HV, V, K] contiguous.
  void* state;
  /// [N, HV, V, K] final states; nullptr: written back into the pool slot in place.
  void* final_state;
  /// [T, HV, V].
  void* out;
  /// Checkpoint kernels only (kCkpt): [ckpt_rows, HV, V, K] states, inner [HV, V, K]
  /// contiguous; sequence n writes its state after every ckpt_every_chunks full chunks to row
  /// checkpoint_starts[n] + j.
  void* checkpoints;
  /// [N + 1] i64: first checkpoint row of each sequence.
  const i64* checkpoint_starts;
  i64 q_stride_t, q_stride_h;
  i64 k_stride_t, k_stride_h;
  i64 v_stride_t, v_stride_h;
  i64 a_stride_t, b_stride_t;
  i64 out_stride_t, out_stride_h;
  i64 state_slot_stride;
  i64 final_seq_stride;
  i64 index_stride;
  i64 has_init_stride;
  i64 num_slots;
  i64 ckpt_slot_stride;
  /// Rows of `checkpoints`: a row outside [0, ckpt_rows) is not written (device-side starts are
  /// not checked on the host; this keeps a wrong prefix from writing out of bounds).
  i64 ckpt_rows;
  /// checkpoint_every_n_tokens / kGdnPrefillChunk (>= 1 with checkpoints).
  i64 ckpt_every_chunks;
  u32 num_seqs;
  u32 num_value_heads;
  /// HV / H: value heads per q/k head.
  u32 heads_per_group;
  /// V / BV.
  u32 v_tiles;
  float scale;
  float softplus_threshold;
};

}  // namespace kjit

#undef KJIT_GDN_PREFILL_HD
