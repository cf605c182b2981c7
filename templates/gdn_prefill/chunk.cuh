// SPDX-License-Identifier: Apache-2.0
// Gated DeltaNet chunked prefill, chunked path, kernel 1 of 2: everything of a chunk that does
// not depend on the recurrent state, for every chunk of every sequence at once.
//
// One block of 4 warps per (chunk, q/k head h). With q, k the raw bf16 rows and rq_i = 1 / |q_i|,
// rk_i = 1 / |k_i| (1 without L2 norm), the raw products G = K K^T and Q K^T are computed once
// per key head (exact bf16 products, f32 sums; the norms enter as f32 factors, so normalized
// rows are never rounded; |k_i|^2 is G's diagonal and |q_i|^2 the diagonal of the diagonal
// blocks of Q Q^T, one more mma pair per k step); then for each of the HV / H value heads hv of the
// group, with gamma the chunk-local cumulative log decay and beta of hv:
//   A  = strictly-lower beta_i rk_i rk_j G_ij e^(gamma_i - gamma_j)        (f32)
//   T  = (I + A)^-1                (f32 diagonal 16x16 blocks, then tf32 mma block products)
//   T' = T diag(beta)              -> workspace, bf16 rows [token, hv, 64]
//   P  = tril(s rq_i rk_j (Q K^T)_ij e^(gamma_i - gamma_j))                -> workspace, bf16
//   scales_i = {s e^gamma_i / |q_i|, e^gamma_i / |k_i|, e^(gamma_last - gamma_i) / |k_i|,
//               e^gamma_last}                                              -> workspace, float4
// with s the output scale (p.scale): it enters only through the rows of q, so the state kernel
// stores its outputs without another multiply. With kStateP the state kernel forms P itself
// (state.cuh, form_p): this kernel then skips Q K^T and P and stores each row's factors of P
// instead (gdn_prefill_p_factors, in P's workspace region).
// The state kernel (state.cuh) multiplies raw bf16 q and k with the state and
// applies the norms and decays through these scales, so normalized q/k are never stored.
//
// Chunks are numbered without knowing the lengths on the host: chunk c of sequence n is block
// floor(cu[n] / 64) + n + c. These ids never collide (floor((bos + L) / 64) + 1 >=
// floor(bos / 64) + ceil(L / 64)) and stay below floor(T / 64) + N, the grid size; each warp
// finds a chunk's sequence by a 32-way search on cu_seqlens (find_chunk) and skips ids that are
// holes. The workspace is indexed by token, so holes cost no memory.
//
// Each block walks its chunk ids in a grid-stride loop. The raw q/k rows of the next chunk are
// copied with cp.async into the q/k tiles as soon as the current chunk's products have read
// them, so the copy overlaps everything after the products (gates, A, P, the inverse, the
// stores); the next gates are loaded one step ahead into registers likewise. Each warp computes
// the gates (the decay scan) itself, so no barrier separates them from A and P; a warp stores
// the P rows it computed.
//
// The inverse: with T_ii the inverses of the four diagonal blocks (I + A_ii) (warp i, forward
// substitution in f32, one column per lane), the 32x32 halves are T10 = -T11 A10 T00 and
// T32 = -T33 A32 T22, and the lower-left quadrant is -T2 A_BL T1 (T1, T2 the inverses of the
// 32x32 halves). The block products run on tf32 mma (11 significant bits, f32 sums), transposed
// (C^T = B^T A^T) so that a product's accumulator is the next product's A operand. The f32
// blocks T_ii, T10 and T32 are parked in the unused upper blocks of A's tile. Where the products
// take f16 operands (F16Operands), A's off-diagonal blocks and the parked blocks are stored as f16
// (each in the first 32 bytes of its f32 place's rows) and read by ldmatrix.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/common/cp_async.cuh"
#include "templates/common/gdn_math.cuh"
#include "templates/common/grid_dependency.cuh"
#include "templates/common/mma.cuh"
#include "templates/common/swizzle.cuh"
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "templates/common/wgmma.cuh"
// sm_90a (the planner's wgmma plans compile both kernels for it): the products K K^T and
// Q K^T run as two warpgroup wgmma reading q and k from 128-byte-swizzled shared memory instead
// of mma.sync with per-warp ldmatrix (docs/performance.md, "The chunk kernel's products on
// wgmma": 7-9% slower with no-swizzle core matrices).
#define KJIT_GDN_CHUNK_WGMMA 1
#else
#define KJIT_GDN_CHUNK_WGMMA 0
#endif
#include "templates/gdn_prefill/gdn_prefill.cuh"
#include "templates/gdn_prefill/params.h"

namespace kjit {
namespace gdn_prefill_chunk_detail {

using gdn_prefill_detail::ex2;
using gdn_prefill_detail::kLog2e;

constexpr int kLdA = 68;  // f32 row pitch of A (and of the parked T blocks)
/// The same rows' pitch in 16-bit elements: an f16 16x16 block (F16Operands) sits in the first 32
/// bytes of each row of its f32 block's place, rows 272 bytes apart (17 16-byte units: the eight
/// rows of an 8 x 8 matrix in eight different bank groups, as ldmatrix wants them).
constexpr int kLdH = 2 * kLdA;

/// Whether the inverse's block products take f16 operands (F16Operands, see there): where the
/// kernel normalizes k itself and beta is a sigmoid (raw gates).
constexpr bool inverse_f16(bool l2norm, bool gated) { return l2norm && !gated; }

/// An int as a type (a warp index, a flag), for code compiled once per value.
template <int kValue>
struct Constant {
  static constexpr int value = kValue;
};

/// A 16x16 mma A operand in tf32: two k-slices of 8 columns. The order of k inside a product
/// is free as long as A and B agree, so slice s takes column 8 s + 2 t4 as its k = t4 and column
/// 8 s + 2 t4 + 1 as its k = t4 + 4: then an accumulator's two adjacent columns are directly the
/// next product's A operand, and B's two k values are one float2 load.
struct TfA {
  u32 s[2][4];
};

/// A 16x16 mma A operand in f16 (m16n8k16's layout: k in order, no reordering needed).
struct H16A {
  u32 r[4];
};

/// The inverse's block products on tf32 operands (any input) or on f16 operands (half the mma
/// instructions; only where every operand is bounded far inside f16's range, see F16Operands).
/// tf32 operands (11 significant bits, f32 range) with f32 sums are enough: the blocks of T leave
/// the kernels as bf16 (8 bits), so the products' rounding stays well inside the store's.
struct TfOperands {
  using A = TfA;
  /// A operand Y^T of the f32 16x16 block Y stored row-major (pitch kLdA): element (r, c) =
  /// Y[c][r].
  static __device__ __forceinline__ A load_transposed(const float* y, int g, int t4) {
    A a;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const float* c0 = y + (8 * ks + 2 * t4) * kLdA;
      a.s[ks][0] = mma::to_tf32(c0[g]);
      a.s[ks][1] = mma::to_tf32(c0[g + 8]);
      a.s[ks][2] = mma::to_tf32(c0[kLdA + g]);
      a.s[ks][3] = mma::to_tf32(c0[kLdA + g + 8]);
    }
    return a;
  }
  /// A operand from a 16x16 accumulator (two n-tiles of 8 columns).
  static __device__ __forceinline__ A from_acc(const float (&z)[2][4]) {
    A a;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      a.s[ks][0] = mma::to_tf32(z[ks][0]);
      a.s[ks][1] = mma::to_tf32(z[ks][2]);
      a.s[ks][2] = mma::to_tf32(z[ks][1]);
      a.s[ks][3] = mma::to_tf32(z[ks][3]);
    }
    return a;
  }
  /// c += a X^T for the f32 16x16 block X stored row-major: B element (k, n) = X[n][k].
  static __device__ __forceinline__ void mma_bt(float (&c)[2][4], const A& a, const float* x, int g,
                                                int t4) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float* row = x + (8 * nt + g) * kLdA + 2 * t4;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const float2 xb = *reinterpret_cast<const float2*>(row + 8 * ks);
        mma::mma_tf32(c[nt], a.s[ks], mma::to_tf32(xb.x), mma::to_tf32(xb.y));
      }
    }
  }
  /// The same for a parked block of T (f32, row-major like A's).
  static __device__ __forceinline__ void mma_bt_parked(float (&c)[2][4], const A& a, const float* t,
                                                       int g, int t4) {
    mma_bt(c, a, t, g, t4);
  }
  /// With c = -(T_ij)^T (the products compute -T_ij^T), parks T_ij (f32, row-major) at `dst`:
  /// dst[n][m] = -c[m][n].
  static __device__ __forceinline__ void park(float* dst, const float (&c)[2][4], int g, int t4) {
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int m = g + 8 * (e >> 1), n = 8 * nt + 2 * t4 + (e & 1);
        dst[n * kLdA + m] = -c[nt][e];
      }
    }
  }
  /// Parks column `col` (x[r] = T_r,col) of a diagonal block of T at `dst` (f32, row-major).
  static __device__ __forceinline__ void park_column(float* dst, const float (&x)[16], int col) {
#pragma unroll
    for (int r = 0; r < 16; ++r) dst[r * kLdA + col] = x[r];
  }
};

/// f16 operands, f32 sums: the same 10-bit mantissa as tf32, a range of 6.5e4. Taken only where
/// k is unit length (normalized in the kernel) and beta = sigmoid(b) <= 1: then |T_ij| <= beta_i
/// <= 1 (column j of T is x_r = -beta_r k_r . w_(r-1) with w_r = (I - beta_r k_r k_r^T) w_(r-1),
/// w_j = k_j, a contraction; the decay scales entry (i, j) by e^(g_i - g_j) <= 1), |A_ij| <= 1,
/// and the partial products fed back as operands are sums of at most 32 such terms (X_m0 of step
/// 5c) (docs/performance.md, "What FlashInfer's aux warpgroup does per chunk").
/// The operands are stored as f16 where they are made, in the first 32 bytes of each row of their
/// f32 block's place (pitch kLdH): A's off-diagonal blocks row-major (the decay pass's
/// store_a_pair), T's parked blocks as T^T (the accumulators' orientation, and the forward
/// substitution's columns as rows), so every operand is one ldmatrix. The same roundings as
/// rounding the f32 blocks at each load: the results are bit for bit those of f32 storage.
struct F16Operands {
  using A = H16A;
  static __device__ __forceinline__ const __nv_bfloat16* b16(const float* block) {
    return reinterpret_cast<const __nv_bfloat16*>(block);  // (ldmatrix moves 16-bit words)
  }
  /// A operand T^T of a parked block of T (stored as T^T).
  static __device__ __forceinline__ A load_transposed(const float* t, int, int) {
    A a;
    mma::load_a(a.r, b16(t), kLdH);
    return a;
  }
  /// A operand from a 16x16 accumulator (two n-tiles of 8 columns: n-tile s is k-half s).
  static __device__ __forceinline__ A from_acc(const float (&z)[2][4]) {
    return A{{mma::pack_f16(z[0][0], z[0][1]), mma::pack_f16(z[0][2], z[0][3]),
              mma::pack_f16(z[1][0], z[1][1]), mma::pack_f16(z[1][2], z[1][3])}};
  }
  /// c += a X^T for an off-diagonal block X of A (row-major): B element (k, n) = X[n][k].
  static __device__ __forceinline__ void mma_bt(float (&c)[2][4], const A& a, const float* x, int,
                                                int) {
    u32 b[4];
    mma::load_b2(b, b16(x), kLdH);
    mma::mma_f16(c[0], a.r, b[0], b[1]);
    mma::mma_f16(c[1], a.r, b[2], b[3]);
  }
  /// c += a T^T for a parked block of T (stored as T^T = S): B element (k, n) = S[k][n].
  static __device__ __forceinline__ void mma_bt_parked(float (&c)[2][4], const A& a, const float* t,
                                                       int, int) {
    u32 b[4];
    mma::load_b2_trans(b, b16(t), kLdH);
    mma::mma_f16(c[0], a.r, b[0], b[1]);
    mma::mma_f16(c[1], a.r, b[2], b[3]);
  }
  /// With c = -(T_ij)^T, parks T_ij at `dst` as T_ij^T = -c: lane (g, t4) holds row g + 8 hf,
  /// columns 8 nt + 2 t4 and + 1 of it, one 4-byte store each.
  static __device__ __forceinline__ void park(float* dst, const float (&c)[2][4], int g, int t4) {
    __half* const d = reinterpret_cast<__half*>(dst);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        *reinterpret_cast<u32*>(d + (g + 8 * hf) * kLdH + 8 * nt + 2 * t4) =
            mma::pack_f16(-c[nt][2 * hf], -c[nt][2 * hf + 1]);
      }
    }
  }
  /// Parks column `col` (x[r] = T_r,col) of a diagonal block of T at `dst`: row `col` of T^T,
  /// two 16-byte stores.
  static __device__ __forceinline__ void park_column(float* dst, const float (&x)[16], int col) {
    uint4* const row = reinterpret_cast<uint4*>(reinterpret_cast<__half*>(dst) + col * kLdH);
    row[0] = make_uint4(mma::pack_f16(x[0], x[1]), mma::pack_f16(x[2], x[3]),
                        mma::pack_f16(x[4], x[5]), mma::pack_f16(x[6], x[7]));
    row[1] = make_uint4(mma::pack_f16(x[8], x[9]), mma::pack_f16(x[10], x[11]),
                        mma::pack_f16(x[12], x[13]), mma::pack_f16(x[14], x[15]));
  }
};

/// Stores A's pair (i, j), (i, j + 1) into its tile: f32, or where the inverse takes f16
/// operands (kF16) and the pair lies left of the diagonal block, f16 in the block's f16 place
/// (F16Operands). The diagonal blocks stay f32: the forward substitution reads them.
template <bool kF16>
__device__ __forceinline__ void store_a_pair(float* s_a, int i, int j, float x0, float x1,
                                             bool off_diagonal) {
  if (kF16 && off_diagonal) {
    __half* const a = reinterpret_cast<__half*>(s_a);
    *reinterpret_cast<u32*>(a + i * kLdH + 32 * (j >> 4) + (j & 15)) = mma::pack_f16(x0, x1);
  } else {
    *reinterpret_cast<float2*>(s_a + i * kLdA + j) = make_float2(x0, x1);
  }
}

__device__ __forceinline__ void zero_acc(float (&c)[2][4]) {
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.f;
}

/// Whether T' blocks go to shared memory by stmatrix (sm_90 and later; store_t_block).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
inline constexpr bool kStmatrixStores = false;
#else
inline constexpr bool kStmatrixStores = true;
#endif

/// Stores block (bi, bj) of T' = T diag(beta) as bf16 from c = -(T_ij)^T; `element(r, c)` is the
/// address of T' element (r, c) (a padded tile in the chunk kernel, a swizzled one in ws.cuh;
/// 16-byte aligned where c is a multiple of 8). Each 8 x 8 quarter is stored transposed:
/// kStmatrix (sm_90 and later) by one stmatrix .trans for the four quarters, otherwise by a
/// movmatrix each and a 4-byte store of two adjacent columns of one T' row (instead of eight
/// 2-byte stores). (A parameter, not only the target's: the emulated tests run both.)
template <bool kStmatrix, typename Element>
__device__ __forceinline__ void store_t_block(Element&& element, const float* s_beta, int bi,
                                              int bj, const float (&c)[2][4], int g, int t4) {
  const float b[2] = {s_beta[16 * bj + g], s_beta[16 * bj + g + 8]};
  // Quarter 2 nt + mh: rows m = 8 mh.., columns n = 8 nt.. of c (lane: row g, columns 2 t4, + 1),
  // which go to T' rows 16 bi + 8 nt.., columns 16 bj + 8 mh.. transposed.
  u32 quarter[4];
#pragma unroll
  for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
    for (int mh = 0; mh < 2; ++mh) {
      quarter[2 * nt + mh] = mma::pack_bf16(-c[nt][2 * mh] * b[mh], -c[nt][2 * mh + 1] * b[mh]);
    }
  }
  if constexpr (kStmatrix) {
    // Lane 8 i + k gives the address of quarter i's T' row k.
    const int lane = 4 * g + t4, i = lane >> 3;
    mma::stmatrix_x4_trans(
        mma::smem_addr(element(16 * bi + 8 * (i >> 1) + (lane & 7), 16 * bj + 8 * (i & 1))),
        quarter);
  } else {
    // Transposed in registers: the lane then holds row g of n and columns 2 t4, + 1 of m.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int mh = 0; mh < 2; ++mh) {
        *reinterpret_cast<u32*>(element(16 * bi + 8 * nt + g, 16 * bj + 8 * mh + 2 * t4)) =
            mma::transpose8x8(quarter[2 * nt + mh]);
      }
    }
  }
}

/// The blocks of T parked in the unused upper blocks of A's tile (the operands' park and
/// park_column say how they are stored), and A's blocks: the place of block (r, c).
__device__ __forceinline__ float* parked_block(float* s_a, int r, int c) {
  return s_a + (16 * r) * kLdA + 16 * c;
}
/// T_ii at (0, i + 1) for i < 3, T33 at (1, 2); T10 at (1, 3), T32 at (2, 3).
__device__ __forceinline__ float* t_diag_block(float* s_a, int i) {
  return i < 3 ? parked_block(s_a, 0, i + 1) : parked_block(s_a, 1, 2);
}

/// scale / |q| of row g + 8 hf of q's block row `q_block` into s_rq, from the diagonal block of
/// Q Q^T (qq, mma::gram_diagonal_block_sw128's), by the lane that holds that diagonal element
/// (mma::holds_diagonal); without the norm, the scale alone.
template <bool kL2Norm>
__device__ __forceinline__ void store_inverse_q_norm(const float (&qq)[2][4], int hf, int q_block,
                                                     float* s_rq, float scale, int g) {
  const float d = mma::own_diagonal(qq[hf], hf, g);
  s_rq[16 * q_block + g + 8 * hf] = scale * (kL2Norm ? gdn::l2_inv_norm_unguarded(d) : 1.f);
}

/// Step 2 of a chunk: the inverse norms from the diagonals of K K^T (block row `k_block` of
/// acc_g, the warp's) and of Q Q^T (acc_qq, the diagonal block of q's block row `q_block`): row g
/// of a 16x16 accumulator block sits in n-tile 0, row g + 8 in n-tile 1, in the one lane of the
/// quad with 2 t4 + (e & 1) = g, which stores it. The output scale rides on 1 / |q| (see the top
/// of the file). !kWithQ: the k norms only (acc_qq, s_rq and scale not read).
template <bool kL2Norm, bool kWithQ = true>
__device__ __forceinline__ void store_inverse_norms(const float (&acc_g)[8][4],
                                                    const float (&acc_qq)[2][4], int k_block,
                                                    int q_block, float* s_rk, float* s_rq,
                                                    float scale, int g, int t4) {
  // Each diagonal element sits in one lane of its quad, which stores its norm: no shuffles (a
  // quad sum of two shuffles was two round trips on the busy shared pipe, Nsight Compute).
  if (!mma::holds_diagonal(g, t4)) return;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float dk = 0.f;
#pragma unroll
    for (int jb = 0; jb < 4; ++jb) {
      if (jb == k_block) dk = mma::own_diagonal(acc_g[2 * jb + hf], hf, g);
    }
    s_rk[16 * k_block + g + 8 * hf] = kL2Norm ? gdn::l2_inv_norm_unguarded(dk) : 1.f;
    if constexpr (kWithQ) store_inverse_q_norm<kL2Norm>(acc_qq, hf, q_block, s_rq, scale, g);
  }
}

/// A warp's raw gates of one (chunk, value head) in registers, two rows per lane (2 lane, 2 lane
/// + 1), with A_log and dt_bias, loaded a step ahead of their use. They stay in their own type
/// until used: converted at the load, each conversion waited for its load there (8% of a lone
/// chunk block's stall samples, docs/performance.md).
template <typename Tgate, typename Tparam, bool kGated>
struct ChunkGates {
  Tgate a[2] = {Tgate{}, Tgate{}}, b[2] = {Tgate{}, Tgate{}};
  Tparam a_log{}, dt_bias{};

  /// The rows' a and b and the head's A_log and dt_bias.
  __device__ __forceinline__ void load(const GdnPrefillParams& p, i64 t0, int rows, u32 hv,
                                       int lane) {
    load_rows(p, t0, rows, hv, lane);
    load_head(p, hv);
  }

  /// A_log and dt_bias of value head hv (nothing when g is given): the warp-specialized kernel's
  /// block keeps one head, so it loads them once, not with every chunk's rows. Loaded every
  /// chunk, they were converted to uniform registers right at the load, a full load latency
  /// a chunk in the chunk warpgroup's products stretch (docs/performance.md).
  __device__ __forceinline__ void load_head(const GdnPrefillParams& p, u32 hv) {
    if constexpr (!kGated) {
      a_log = static_cast<const Tparam*>(p.a_log)[hv];
      dt_bias = static_cast<const Tparam*>(p.dt_bias)[hv];
    }
  }

  /// a and b of rows 2 lane and 2 lane + 1 of the chunk at t0 (`rows` >= 1 rows long). Rows past
  /// the end load the chunk's last row (scan_gates masks them) instead of being skipped: a load
  /// under a branch leaves its scoreboard unwaited on the other path, so ptxas waited for it
  /// before the register's next write, when the next loads shared that scoreboard: a full load
  /// latency a chunk (docs/performance.md).
  __device__ __forceinline__ void load_rows(const GdnPrefillParams& p, i64 t0, int rows, u32 hv,
                                            int lane) {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int r = 2 * lane + x < rows ? 2 * lane + x : rows - 1;
      a[x] = static_cast<const Tgate*>(p.a)[(t0 + r) * p.a_stride_t + hv];
      b[x] = static_cast<const Tgate*>(p.b)[(t0 + r) * p.b_stride_t + hv];
    }
  }

  /// Step 3: g (log decay) and beta of the chunk's `rows` rows (0 past them), the inclusive scan
  /// gamma into the warp's s_gamma, beta into s_beta, and the column factors of the
  /// off-diagonal blocks: with gamma_ref the gamma of the last row of the column's 16-row block,
  /// e^(gamma_i - gamma_j) = e^(gamma_i - gamma_ref) e^(gamma_ref - gamma_j) for every row i of
  /// a later block, both factors <= 1 (gamma does not rise): s_cf[j] = rk_j e^(gamma_ref -
  /// gamma_j), s_ref[b] = gamma_ref of block b. `load_next()` runs once these gates are
  /// converted (it may load the next ones into this object). s_gamma, s_ref and Scanned hold
  /// gamma in log2 units (gamma log2(e), scaled with g before the scan), so that each decay is one
  /// ex2 of a difference, e^(gamma_i - gamma_j) = ex2(s_gamma[i] - s_gamma[j]), with no multiply.
  template <typename LoadNext>
  __device__ __forceinline__ void scan(const GdnPrefillParams& p, int rows, int lane,
                                       const float* s_rk, float* s_gamma, float* s_beta,
                                       float* s_cf, float* s_ref, LoadNext&& load_next) {
    const Scanned sc = scan_gates(p, rows, lane, s_gamma, s_ref, load_next);
    store_beta_and_factors(sc, lane, s_rk, s_beta, s_cf);
  }

  /// What scan_gates leaves for store_beta_and_factors.
  struct Scanned {
    float beta[2], g0, incl, ref;
  };

  /// The part of scan() that needs neither the norms nor s_beta free: g, beta and gamma's scan,
  /// gamma and gamma_ref stored.
  template <typename LoadNext>
  __device__ __forceinline__ Scanned scan_gates(const GdnPrefillParams& p, int rows, int lane,
                                                float* s_gamma, float* s_ref,
                                                LoadNext&& load_next) {
    float gl[2], bl[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int r = 2 * lane + x;
      // Converted on every lane, then masked (a branch would leave the loads unwaited, as above).
      if constexpr (kGated) {
        gl[x] = kLog2e * gdn::to_f32(a[x]);
        bl[x] = gdn::to_f32(b[x]);
      } else {
        gl[x] = kLog2e * gdn::fast_log_decay(gdn::to_f32(a[x]), gdn::to_f32(a_log),
                                             gdn::to_f32(dt_bias), p.softplus_threshold);
        bl[x] = gdn::fast_sigmoid(gdn::to_f32(b[x]));
      }
      gl[x] = r < rows ? gl[x] : 0.f;
      bl[x] = r < rows ? bl[x] : 0.f;
    }
    const float local = gl[0] + gl[1];
    float incl = local;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const float g0 = incl - local + gl[0];
    s_gamma[2 * lane] = g0;
    s_gamma[2 * lane + 1] = incl;
    const float ref = __shfl_sync(0xffffffffu, incl, (lane & ~7) | 7);
    if ((lane & 7) == 0) s_ref[lane >> 3] = ref;
    // The next gates' loads after the shuffles: issued before them, ptxas reused a load's address
    // registers for a shuffle's result, which then waited (long scoreboard) until the saturated
    // load queue had taken the load.
    load_next();
    return Scanned{{bl[0], bl[1]}, g0, incl, ref};
  }

  /// The rest of scan(): beta stored, and the column factors from the norms.
  static __device__ __forceinline__ void store_beta_and_factors(const Scanned& sc, int lane,
                                                                const float* s_rk, float* s_beta,
                                                                float* s_cf) {
    s_beta[2 * lane] = sc.beta[0];
    s_beta[2 * lane + 1] = sc.beta[1];
    const float2 rk = *reinterpret_cast<const float2*>(s_rk + 2 * lane);
    *reinterpret_cast<float2*>(s_cf + 2 * lane) =
        make_float2(rk.x * ex2(sc.ref - sc.g0), rk.y * ex2(sc.ref - sc.incl));
  }
};

/// Step 4 for row block kRow of a decayed product X (K K^T for A, Q K^T for P): element (i, j) =
/// f_i e^(gamma_i - gamma_j) X_ij with f_i = row_factor(i); below the diagonal block the decay is
/// a row factor times the column factor s_cf, the diagonal block takes one exponential per
/// element (masked by selects: the upper part's exponentials may overflow and are discarded).
/// kWithDiagonal = 0 (A): strictly lower, the upper blocks left alone (the parked T blocks live
/// there); 1 (P): the diagonal included and the upper blocks zero. kRow is a constant, so which
/// blocks are off-diagonal, diagonal or zero is known at compile time (13% of this pass's
/// instructions were branches when it was not). The values go back into x, stored afterwards by
/// store_row_block: stores between the loads chained each pair's loads behind the previous
/// store (docs/performance.md, "The decay pass's loads behind its stores"), and the
/// warp-specialized kernel computes A before A's tile is free.
template <int kRow, int kWithDiagonal, typename RowFactor>
__device__ __forceinline__ void decay_row_block(float (&x)[8][4], const float* s_gamma,
                                                const float* s_ref, const float* s_cf,
                                                const float* s_rk, int g, int t4,
                                                RowFactor&& row_factor) {
  const auto put = [&](int nt, int hf, float x0, float x1) {
    x[nt][2 * hf] = x0;
    x[nt][2 * hf + 1] = x1;
  };
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int i = kRow * 16 + g + 8 * hf;
    const float gi = s_gamma[i], fi = row_factor(i);
#pragma unroll
    for (int jb = 0; jb < 4; ++jb) {
      if (jb < kRow) {
        const float rf = fi * ex2(gi - s_ref[jb]);
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int nt = 2 * jb + h2, j = nt * 8 + 2 * t4;
          const float2 cf = *reinterpret_cast<const float2*>(s_cf + j);
          put(nt, hf, rf * cf.x * x[nt][2 * hf], rf * cf.y * x[nt][2 * hf + 1]);
        }
      } else if (jb == kRow) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
          const int nt = 2 * jb + h2, j = nt * 8 + 2 * t4;
          const float2 gj = *reinterpret_cast<const float2*>(s_gamma + j);
          const float2 kj = *reinterpret_cast<const float2*>(s_rk + j);
          const float x0 = fi * kj.x * ex2(gi - gj.x) * x[nt][2 * hf];
          const float x1 = fi * kj.y * ex2(gi - gj.y) * x[nt][2 * hf + 1];
          put(nt, hf, i + kWithDiagonal > j ? x0 : 0.f, i + kWithDiagonal > j + 1 ? x1 : 0.f);
        }
      } else if (kWithDiagonal) {
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) put(2 * jb + h2, hf, 0.f, 0.f);
      }
    }
  }
}

/// Stores what decay_row_block<kRow, kWithDiagonal> left in x: the blocks left of and on
/// the diagonal block of row block kRow (kAll: the zero blocks right of it too), through
/// store_pair(i, j, x_j, x_j+1, off_diagonal).
template <int kRow, bool kAll = false, typename StorePair>
__device__ __forceinline__ void store_row_block(const float (&x)[8][4], int g, int t4,
                                                StorePair&& store_pair) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
#pragma unroll
    for (int nt = 0; nt < (kAll ? 8 : 2 * kRow + 2); ++nt) {
      store_pair(kRow * 16 + g + 8 * hf, nt * 8 + 2 * t4, x[nt][2 * hf], x[nt][2 * hf + 1],
                 nt < 2 * kRow);
    }
  }
}

/// y = x, element by element (the compiler keeps only the elements read later).
__device__ __forceinline__ void copy_acc(float (&y)[8][4], const float (&x)[8][4]) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) y[nt][e] = x[nt][e];
  }
}

/// Whether element (row, col) of a 16 x 16 diagonal block of P^T lies in its lower-left 8 x 8
/// quarter, wholly below the diagonal: zero, written once by the warp-specialized kernel with the
/// blocks left of it and never by decay_col_block.
__device__ __forceinline__ constexpr bool pt_zero_quarter(int row_in_block, int col_in_block) {
  return row_in_block >= 8 && col_in_block < 8;
}

/// Step 4 for P transposed, row block kRow of X = K Q^T (the warp-specialized kernel's chunk
/// warpgroup, where wgmma gives warp w K's block row w and q's rows stay in order): element
/// (j, i) = e^(gamma_i - gamma_j) rk_j X_ji for i >= j. The blocks i > j split the decay as
/// decay_row_block does, e^(gamma_i - gamma_ref) e^(gamma_ref - gamma_j) with gamma_ref of block
/// kRow, both factors <= 1; the diagonal block takes one exponential per element (masked by
/// selects); the blocks left of it (i < j) and the diagonal block's lower-left 8 x 8 quarter are
/// zero and not written (nothing else writes them).
/// Warp w thus does 3 - w off-diagonal blocks here and w in A's row block w: balanced. Without
/// rq_i: the caller scales O's columns by it instead.
/// Every value is computed (into x, which the caller no longer needs) before the first
/// store_pair: a store into shared memory may alias s_gamma, s_cf and s_rk for the compiler, so
/// interleaved it reloaded them after each store and chained every pair's loads, exponentials
/// and store one after another (docs/performance.md, "The decay pass's loads behind its stores").
template <int kRow, typename StorePair>
__device__ __forceinline__ void decay_col_block(float (&x)[8][4], const float* s_gamma,
                                                const float* s_ref, const float* s_cf,
                                                const float* s_rk, int g, int t4,
                                                StorePair&& store_pair) {
  const float ref = s_ref[kRow];
#pragma unroll
  for (int ib = kRow; ib < 4; ++ib) {
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int nt = 2 * ib + h2, i = nt * 8 + 2 * t4;
      const float2 gi = *reinterpret_cast<const float2*>(s_gamma + i);
      if (ib > kRow) {
        const float c0 = ex2(gi.x - ref), c1 = ex2(gi.y - ref);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float cf = s_cf[kRow * 16 + g + 8 * hf];
          x[nt][2 * hf] *= cf * c0;
          x[nt][2 * hf + 1] *= cf * c1;
        }
      } else {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          if (pt_zero_quarter(8 * hf, 8 * h2)) continue;
          const int j = kRow * 16 + g + 8 * hf;
          const float gj = s_gamma[j], kj = s_rk[j];
          const float x0 = kj * ex2(gi.x - gj) * x[nt][2 * hf];
          const float x1 = kj * ex2(gi.y - gj) * x[nt][2 * hf + 1];
          x[nt][2 * hf] = i >= j ? x0 : 0.f;
          x[nt][2 * hf + 1] = i + 1 >= j ? x1 : 0.f;
        }
      }
    }
  }
#pragma unroll
  for (int nt = 2 * kRow; nt < 8; ++nt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      if (pt_zero_quarter(8 * hf, 8 * (nt - 2 * kRow))) continue;  // (past the diagonal block: no)
      store_pair(kRow * 16 + g + 8 * hf, nt * 8 + 2 * t4, x[nt][2 * hf], x[nt][2 * hf + 1]);
    }
  }
}

/// Calls pass(Constant<w>{}) for w = warp (0..3): code compiled once per warp index.
template <typename Pass>
__device__ __forceinline__ void per_warp_index(int warp, Pass&& pass) {
  switch (warp) {
    case 0:
      pass(Constant<0>{});
      break;
    case 1:
      pass(Constant<1>{});
      break;
    case 2:
      pass(Constant<2>{});
      break;
    default:
      pass(Constant<3>{});
      break;
  }
}

/// Step 5a, half-warp h of warp w < 2 (block b = 2 w + h): T_bb = (I + A_bb)^-1 by forward
/// substitution, lane c (mod 16) owning column c:
/// x_r = -sum_{m<r} A_rm x_m (r > c), x_c = 1, x_r = 0 above (exact zeros in the sums); parked in
/// A's tile (Ops::park_column) and stored as T' (times beta_c) through `element`. Right-looking:
/// once x_m is known it goes into every later row's sum, so x_{m+1} is one FMA behind x_m. Each sum
/// still adds its terms in the order m = 0, 1, ... (the same roundings as summing row by row), but
/// the row-by-row form waited for row r's loads and then its whole FMA chain before row r + 1 could
/// finish: the ws kernel's profile measured this step at ~2000 cycles of the inverting state
/// warpgroup's chunk (docs/performance.md). A's columns are read four at a time (float4 of each row
/// below).
template <typename Ops, typename Element>
__device__ __forceinline__ void invert_diagonal_block(float* s_a, const float* s_beta0, int warp,
                                                      int lane, Element&& element) {
  // Each half-warp of warps 0 and 1 takes one block (block 2 warp + lane / 16); warps 2 and 3 go
  // straight to the barrier behind this step. (Both half-warps of every warp used to compute the
  // same column of the warp's block: half of the step's instructions were duplicates.)
  if (warp >= 2) return;
  const int blk = 2 * warp + (lane >> 4);
  const int c = lane & 15;
  const float* ab = s_a + (16 * blk) * kLdA + 16 * blk;
  float x[16], acc[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) acc[r] = 0.f;
#pragma unroll
  for (int m4 = 0; m4 < 16; m4 += 4) {
    float4 a[16];
#pragma unroll
    for (int r = m4 + 1; r < 16; ++r) a[r] = *reinterpret_cast<const float4*>(ab + r * kLdA + m4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = m4 + e;
      x[m] = m < c ? 0.f : (m == c ? 1.f : -acc[m]);
#pragma unroll
      for (int r = m + 1; r < 16; ++r) {
        const float arm = e == 0 ? a[r].x : e == 1 ? a[r].y : e == 2 ? a[r].z : a[r].w;
        acc[r] = fmaf(arm, x[m], acc[r]);
      }
    }
  }
  Ops::park_column(t_diag_block(s_a, blk), x, c);
  const float bc = s_beta0[16 * blk + c];
#pragma unroll
  for (int r = 0; r < 16; ++r)
    *element(16 * blk + r, 16 * blk + c) = __float2bfloat16_rn(x[r] * bc);
}

/// Step 5b, products in transposed form (c = -T_ij^T, Z = X^T); T' blocks through `element`:
///   warp 0: T10 = -T11 (A10 T00)            warp 1: T32 = -T33 (A32 T22)
///   warp 2: T21 = -T22 (A21 T11); Z21 = (A21 T11)^T and Z31 = (A31 T11)^T kept
///   warp 3: Z20 = (A20 T00)^T, Z30 = (A30 T00)^T kept
template <typename Ops, bool kStmatrix, typename Element>
__device__ __forceinline__ void invert_first_products(float* s_a, const float* s_beta0, int warp,
                                                      int g, int t4, float (&z1)[2][4],
                                                      float (&z2)[2][4], Element&& element) {
  const auto a_blk = [&](int r, int c) {
    return static_cast<const float*>(parked_block(s_a, r, c));
  };
  zero_acc(z1);
  zero_acc(z2);
  float c[2][4];
  zero_acc(c);
  if (warp == 0) {
    Ops::mma_bt(z1, Ops::load_transposed(t_diag_block(s_a, 0), g, t4), a_blk(1, 0), g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t_diag_block(s_a, 1), g, t4);
    Ops::park(parked_block(s_a, 1, 3), c, g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 1, 0, c, g, t4);
  } else if (warp == 1) {
    Ops::mma_bt(z1, Ops::load_transposed(t_diag_block(s_a, 2), g, t4), a_blk(3, 2), g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t_diag_block(s_a, 3), g, t4);
    Ops::park(parked_block(s_a, 2, 3), c, g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 3, 2, c, g, t4);
  } else if (warp == 2) {
    const typename Ops::A t11 = Ops::load_transposed(t_diag_block(s_a, 1), g, t4);
    Ops::mma_bt(z1, t11, a_blk(2, 1), g, t4);
    Ops::mma_bt(z2, t11, a_blk(3, 1), g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t_diag_block(s_a, 2), g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 2, 1, c, g, t4);
  } else {
    const typename Ops::A t00 = Ops::load_transposed(t_diag_block(s_a, 0), g, t4);
    Ops::mma_bt(z1, t00, a_blk(2, 0), g, t4);
    Ops::mma_bt(z2, t00, a_blk(3, 0), g, t4);
  }
}

/// Step 5c (after a barrier behind 5b), T' blocks through `element`:
///   warp 0: T20 = -T22 (A20 T00 + A21 T10)
///   warp 2: T31 = -(T32 X21 + T33 X31), X_m1 = A_m1 T11 (Z21, Z31 of 5b)
///   warp 3: T30 = -(T32 X20 + T33 X30), X_m0 = A_m0 T00 + A_m1 T10
template <typename Ops, bool kStmatrix, typename Element>
__device__ __forceinline__ void invert_second_products(float* s_a, const float* s_beta0, int warp,
                                                       int g, int t4, float (&z1)[2][4],
                                                       float (&z2)[2][4], Element&& element) {
  const auto a_blk = [&](int r, int c) {
    return static_cast<const float*>(parked_block(s_a, r, c));
  };
  float* const t10 = parked_block(s_a, 1, 3);
  float* const t32 = parked_block(s_a, 2, 3);
  float c[2][4];
  zero_acc(c);
  if (warp == 0) {
    zero_acc(z1);
    Ops::mma_bt(z1, Ops::load_transposed(t_diag_block(s_a, 0), g, t4), a_blk(2, 0), g, t4);
    Ops::mma_bt(z1, Ops::load_transposed(t10, g, t4), a_blk(2, 1), g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t_diag_block(s_a, 2), g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 2, 0, c, g, t4);
  } else if (warp == 2) {
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t32, g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z2), t_diag_block(s_a, 3), g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 3, 1, c, g, t4);
  } else if (warp == 3) {
    const typename Ops::A t10a = Ops::load_transposed(t10, g, t4);
    Ops::mma_bt(z1, t10a, a_blk(2, 1), g, t4);
    Ops::mma_bt(z2, t10a, a_blk(3, 1), g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z1), t32, g, t4);
    Ops::mma_bt_parked(c, Ops::from_acc(z2), t_diag_block(s_a, 3), g, t4);
    store_t_block<kStmatrix>(element, s_beta0, 3, 0, c, g, t4);
  }
}

/// The block products' operands: InverseOperands<kF16>::type.
template <bool kF16>
struct InverseOperands {
  using type = TfOperands;
};
template <>
struct InverseOperands<true> {
  using type = F16Operands;
};

/// Steps 5a-c: T = (I + A)^-1 of the chunk whose A (and parked blocks) are in s_a, T' stored
/// through `element`; `sync()` is the barrier of the four warps between the steps (each reads
/// blocks another warp parked). kL2Norm, kGated: the kernel's (k normalized in the kernel; gates
/// given precomputed). The block products take f16 operands where that guarantees |T| <= 1 (k
/// normalized here and beta a sigmoid: F16Operands), tf32 otherwise.
template <bool kL2Norm, bool kGated, bool kStmatrix = kStmatrixStores, typename Element,
          typename Sync>
__device__ __forceinline__ void invert_chunk(float* s_a, const float* s_beta0, int warp, int lane,
                                             Element&& element, Sync&& sync) {
  using Ops = typename InverseOperands<inverse_f16(kL2Norm, kGated)>::type;
  const int g = lane >> 2, t4 = lane & 3;
  invert_diagonal_block<Ops>(s_a, s_beta0, warp, lane, element);
  sync();
  float z1[2][4], z2[2][4];
  invert_first_products<Ops, kStmatrix>(s_a, s_beta0, warp, g, t4, z1, z2, element);
  sync();
  invert_second_products<Ops, kStmatrix>(s_a, s_beta0, warp, g, t4, z1, z2, element);
}

#if KJIT_GDN_CHUNK_WGMMA
/// What chunk_products_wgmma computes besides K K^T: nothing, Q K^T, or K Q^T (P transposed).
enum ChunkP : int { kChunkPNone = 0, kChunkPQK = 1, kChunkPKQ = 2 };

/// Step 1 on wgmma: the whole 64 x 64 products G = K K^T (acc_g) and, kP, Q K^T or K Q^T (acc_p)
/// from the 128-byte-swizzled k and q tiles at `k_addr`, `q_addr` (the blocks above the diagonal
/// are computed and never read), and, kL2Norm, on mma.sync while they run, the diagonal block of Q
/// Q^T of the tile's block row `qq_row` (its A fragment is also its B fragment); waits for all.
/// `while_running()` runs after the wgmma are issued, before they are waited for.
/// kPaired: k and q are a pair tile (sw128::kPairSlice, q at k_addr + sw128::kSlice). (K K^T
/// and K Q^T as one n = 128 wgmma of the pair, reading K once, made the ws kernel 2-3% slower on
/// the H100 at HV = H and spilled its chunk role: docs/performance.md, "k and q as one pair
/// tile".)
template <int kKSteps, bool kL2Norm, int kP, bool kPaired = false,
          typename WhileRunning = void (*)()>
__device__ __forceinline__ void chunk_products_wgmma(
    float (&acc_g)[8][4], float (&acc_p)[8][4], float (&acc_qq)[2][4], u32 k_addr, u32 q_addr,
    int qq_row, WhileRunning&& while_running = [] {}) {
  constexpr u32 kStride = kPaired ? sw128::kPairSlice : sw128::kSlice;
  const u64 k_desc = wgmma::descriptor_sw128(k_addr, 16, sw128::kAtom),
            q_desc = wgmma::descriptor_sw128(q_addr, 16, sw128::kAtom);
  wgmma::hold_registers(acc_g);
  if constexpr (kP != kChunkPNone) wgmma::hold_registers(acc_p);
  wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    const u64 kd = wgmma::advance(k_desc, sw128::k_step<kStride>(0, ks));
    wgmma::mma_m64n64k16_ss<0>(acc_g, kd, kd);
    if constexpr (kP == kChunkPQK) {
      wgmma::mma_m64n64k16_ss<0>(acc_p, wgmma::advance(q_desc, sw128::k_step<kStride>(0, ks)), kd);
    } else if constexpr (kP == kChunkPKQ) {
      wgmma::mma_m64n64k16_ss<0>(acc_p, kd, wgmma::advance(q_desc, sw128::k_step<kStride>(0, ks)));
    }
  }
  wgmma::commit();
  if constexpr (kL2Norm) {
    mma::gram_diagonal_block_sw128<kKSteps, false, kStride>(acc_qq, q_addr, 16 * qq_row);
  }
  while_running();
  wgmma::wait<0>();
  wgmma::hold_registers(acc_g);
  if constexpr (kP != kChunkPNone) wgmma::hold_registers(acc_p);
}
#endif

}  // namespace gdn_prefill_chunk_detail

/// Template parameters: element types of q/k, of the raw gates a/b (f32 for precomputed g and
/// beta), of A_log/dt_bias and of cu_seqlens; K; kGated: a/b hold g and beta; kL2Norm; kStateP:
/// the state kernel forms P itself (its wide mma.sync tiles), so this kernel skips Q K^T and P
/// and writes, where P's rows would go, each row's factors of P (gdn_prefill_p_factors).
template <typename Tin, typename Tgate, typename Tparam, typename Tcu, int kK, bool kGated,
          bool kL2Norm, bool kStateP = false>
// Three blocks per SM (<= 170 registers): a block's barriers and latencies are covered by the
// other resident blocks.
__global__ void __launch_bounds__(kGdnPrefillThreads, 3)
    gdn_prefill_chunk_kernel(const GdnPrefillParams p) {
  using namespace gdn_prefill_detail;
  using namespace gdn_prefill_chunk_detail;
  static_assert(kK == 64 || kK == 128 || kK == 256, "K must be 64, 128 or 256");
  static_assert(sizeof(Tin) == 2, "q/k are 16-bit rows");
  [[maybe_unused]] constexpr int kLdK = kK + 8;  // bf16 row pitch of q and k (mma.sync path)
  constexpr int kLd = 72;                        // bf16 row pitch of the staging tiles
  constexpr int kKSteps = kK / 16;
  constexpr int kRowCopies = kK / 8;  // 16-byte copies per q/k row
  constexpr GdnPrefillChunkSmem kSmem = gdn_prefill_chunk_smem(kK);

#if KJIT_GDN_CHUNK_WGMMA
  // The swizzled q and k tiles take their swizzle from address bits 4..9.
  extern __shared__ __align__(1024) unsigned char smem[];
#else
  extern __shared__ __align__(16) unsigned char smem[];
#endif
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.q);
  __nv_bfloat16* s_k = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.k);
  float* s_a = reinterpret_cast<float*>(smem + kSmem.a);
  __nv_bfloat16* s_p = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.p);
  __nv_bfloat16* s_t = reinterpret_cast<__nv_bfloat16*>(smem + kSmem.t);
  float* s_rq = reinterpret_cast<float*>(smem + kSmem.rq);
  float* s_rk = reinterpret_cast<float*>(smem + kSmem.rk);
  // The f32 blocks of T are parked in the upper blocks of A's tile (parked_block, t_diag_block).

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Every warp computes the gates itself into its own copies of the per-row vectors (no barrier
  // between the gates and their use); the later stages read warp 0's beta.
  float* s_gamma = reinterpret_cast<float*>(smem + kSmem.gamma) + 64 * warp;
  float* s_beta = reinterpret_cast<float*>(smem + kSmem.beta) + 64 * warp;
  float* s_cf = reinterpret_cast<float*>(smem + kSmem.cf) + 64 * warp;
  float* s_ref = reinterpret_cast<float*>(smem + kSmem.ref) + 4 * warp;
  const float* s_beta0 = reinterpret_cast<const float*>(smem + kSmem.beta);
  const u32 h = blockIdx.y;
  const Tcu* cu = static_cast<const Tcu*>(p.cu_seqlens);
  const auto base = [&](i64 m) { return static_cast<i64>(__ldg(cu + m)) / 64 + m; };
  // The state kernel may start once every block of this one has: its blocks then take the SMs
  // this kernel's last blocks leave, rank the sequences and load their initial states, and wait
  // for this kernel's results only after that.
  grid_dependency::allow_dependent_launch();
  if (p.num_seqs == 0) return;
  if (blockIdx.y == 0 && p.ws_order != nullptr && p.num_seqs > kGdnPrefillRankInStateMaxSeqs) {
    rank_sequences_longest_first<Tcu>(p, i64(blockIdx.x) * kGdnPrefillThreads + tid,
                                      i64(gridDim.x) * kGdnPrefillThreads);
  }
  const i64 chunk_ids = p.num_tokens / 64 + i64(p.num_seqs);

  // The first chunk id >= b (in steps of the grid) that is a chunk, with its first token and
  // row count; chunk_ids when none is left.
  i64 next_t0 = 0;
  int next_rows = 0;
  const auto find_chunk = [&](i64 b) {
    for (; b < chunk_ids; b += gridDim.x) {
      // The sequence this chunk id belongs to: the largest n with base(n) <= b (base does not
      // decrease), found by the warp together: each lane tests one of 32 evenly spaced candidates
      // of the range, the ballot's highest lane narrows it to one stride; one load per level (one
      // level up to 32 sequences, two up to 1024), where a binary search was a chain of dependent
      // loads and ~220 instructions in each chunk's prologue. b below base(0): no candidate holds.
      i64 lo = 0, count = p.num_seqs;
      bool found = true;
      for (;;) {
        const i64 stride = (count + 31) / 32;
        const i64 m = lo + i64(lane) * stride;
        const u32 below = __ballot_sync(0xffffffffu, m < lo + count && base(m) <= b);
        if (below == 0) {
          found = false;
          break;
        }
        const i64 last = i64(31 - __clz(below)) * stride;
        count = count - last < stride ? count - last : stride;
        lo += last;
        if (stride == 1) break;
      }
      if (!found) continue;
      const i64 bos = static_cast<i64>(__ldg(cu + lo));
      const i64 eos = static_cast<i64>(__ldg(cu + lo + 1));
      const i64 t0 = bos + 64 * (b - base(lo));
      if (t0 < eos) {
        next_t0 = t0;
        next_rows = static_cast<int>(eos - t0 < 64 ? eos - t0 : 64);
        return b;
      }
    }
    return chunk_ids;
  };

  // Raw q and k rows of a chunk into s_q / s_k (rows past the end are zero-filled).
  const Tin* q_head = static_cast<const Tin*>(p.q) + i64(h) * p.q_stride_h;
  const Tin* k_head = static_cast<const Tin*>(p.k) + i64(h) * p.k_stride_h;
#if KJIT_GDN_CHUNK_WGMMA
  // 128-byte-swizzled tiles for wgmma (templates/common/swizzle.cuh, as the state kernel's).
  // Eight consecutive threads copy one 128-byte line of a row into
  // one 128-byte line of shared memory (the no-swizzle core matrices took 8x the shared-memory
  // wavefronts and 2x the L2 sectors per copy in the state kernel; docs/performance.md). q's
  // 16-row blocks are stored in reverse order, so that the product's row block w, which wgmma
  // gives warp w, is Q K^T's block row 3 - w: warp w then takes G's block row w and Q K^T's
  // 3 - w, the balanced split of the triangles below. Moving whole 8-row groups keeps each row's
  // swizzle (r % 8).
  static_assert(kSmem.q % sw128::kAtom == 0 && kSmem.k % sw128::kAtom == 0,
                "the swizzled tiles start on 1024-byte boundaries");
  static_assert(kGdnPrefillThreads % kRowCopies == 0, "whole rows per pass");
  constexpr int kRowsPerPass = kGdnPrefillThreads / kRowCopies;  // 16, 8 or 4
  const int copy_part = tid % kRowCopies, copy_r0 = tid / kRowCopies;
  // sw128::offset(copy_r0 + r, copy_part) of pass r, split into the part fixed per thread and the
  // per-pass row and swizzle, so that each pass adds a constant where it can.
  const u32 copy_base = u32(copy_part >> 3) * sw128::kSlice + u32(copy_r0) * 128;
  const auto copy_qk = [&](i64 t0, int rows) {
    const Tin* src_q = q_head + (t0 + copy_r0) * p.q_stride_t + copy_part * 8;
    const Tin* src_k = k_head + (t0 + copy_r0) * p.k_stride_t + copy_part * 8;
    unsigned char* const dst_q = reinterpret_cast<unsigned char*>(s_q) + copy_base;
    unsigned char* const dst_k = reinterpret_cast<unsigned char*>(s_k) + copy_base;
#pragma unroll
    for (int i = 0; i < 64 / kRowsPerPass; ++i) {
      const int r = i * kRowsPerPass;  // this pass's row offset (copy_r0 < kRowsPerPass)
      const bool valid = copy_r0 + r < rows;
      // (copy_r0 + r) % 8: constant over the passes when kRowsPerPass is a multiple of 8.
      const u32 swz = u32(((copy_part ^ (copy_r0 + r)) & 7) << 4);
      const int q_row = (3 - r / 16) * 16 + r % 16;  // q's reversed 16-row blocks
      cp_async::copy16(dst_q + q_row * 128 + swz, valid ? src_q : q_head, valid);
      cp_async::copy16(dst_k + r * 128 + swz, valid ? src_k : k_head, valid);
      src_q += kRowsPerPass * p.q_stride_t;
      src_k += kRowsPerPass * p.k_stride_t;
    }
    cp_async::commit();
  };
#else
  // A thread copies the same 16-byte part of every kRowStep-th row: one address computation,
  // then pointer steps.
  constexpr int kRowStep = kGdnPrefillThreads / kRowCopies;
  const int copy_part = tid % kRowCopies, copy_r0 = tid / kRowCopies;
  const auto copy_qk = [&](i64 t0, int rows) {
    const Tin* src_q = q_head + (t0 + copy_r0) * p.q_stride_t + copy_part * 8;
    const Tin* src_k = k_head + (t0 + copy_r0) * p.k_stride_t + copy_part * 8;
    __nv_bfloat16* dst_q = s_q + copy_r0 * kLdK + copy_part * 8;
    __nv_bfloat16* dst_k = s_k + copy_r0 * kLdK + copy_part * 8;
#pragma unroll 4
    for (int i = 0; i < 64 / kRowStep; ++i) {
      const bool valid = copy_r0 + i * kRowStep < rows;
      cp_async::copy16(dst_q + i * kRowStep * kLdK, valid ? src_q : q_head, valid);
      cp_async::copy16(dst_k + i * kRowStep * kLdK, valid ? src_k : k_head, valid);
      src_q += kRowStep * p.q_stride_t;
      src_k += kRowStep * p.k_stride_t;
    }
    cp_async::commit();
  };
#endif

  // Every warp holds the raw gates of the next value head in registers (with its A_log and
  // dt_bias), loaded one step ahead, so no gate load latency sits between the barriers.
  ChunkGates<Tgate, Tparam, kGated> gates;

  i64 b = find_chunk(blockIdx.x);
  if (b >= chunk_ids) return;
  copy_qk(next_t0, next_rows);
  gates.load(p, next_t0, next_rows, h * p.heads_per_group, lane);
  // The blocks of T' above the diagonal blocks are zero, and nothing else writes them.
  for (int e = tid; e < 64 * 64; e += kGdnPrefillThreads) {
    const int r = e >> 6, c = e & 63;
    if ((c >> 4) > (r >> 4)) s_t[r * kLd + c] = __float2bfloat16_rn(0.f);
  }

  const u32 hv_count = p.num_value_heads;
#pragma unroll 1
  while (b < chunk_ids) {
    const i64 t0 = next_t0;
    const int rows = next_rows;
    // The next chunk of this block (its cu_seqlens loads overlap the wait for this one's rows).
    const i64 b_next = find_chunk(b + gridDim.x);
    cp_async::wait<0>();
#if KJIT_GDN_CHUNK_WGMMA
    wgmma::fence_shared_writes();  // the rows this thread copied, before wgmma reads them
#endif
    __syncthreads();

    // 1. Raw G = K K^T and Q K^T, lower block triangles, balanced: warp w takes G's block row w
    // and Q K^T's block row 3 - w (five 16x16 blocks each), and the diagonal block of Q Q^T of
    // block row 3 - w: the squared norms |k_i|^2 and |q_i|^2 are the diagonals (exact bf16
    // products, f32 sums), so no separate pass over the rows is needed.
    const int rg = warp, rp = 3 - warp;
    float acc_g[8][4], acc_p[8][4], acc_qq[2][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_g[i][e] = acc_p[i][e] = 0.f;
    }
    zero_acc(acc_qq);
#if KJIT_GDN_CHUNK_WGMMA
    {
      // The diagonal block of Q Q^T of block row rp is stored at block position 3 - rp = warp.
      chunk_products_wgmma<kKSteps, kL2Norm, kStateP ? kChunkPNone : kChunkPQK>(
          acc_g, acc_p, acc_qq, mma::smem_addr(s_k), mma::smem_addr(s_q), warp);
    }
#else
#pragma unroll 2
    for (int ks = 0; ks < kKSteps; ++ks) {
      u32 ak[4], aq[4];
      mma::load_a(ak, s_k + rg * 16 * kLdK + ks * 16, kLdK);
      mma::load_a(aq, s_q + rp * 16 * kLdK + ks * 16, kLdK);
      if constexpr (kL2Norm) {
        // The diagonal block of Q Q^T: a 16 x 16 block's A fragment is also its B fragment
        // (rows g and g + 8 of the block are the two n-tiles' columns), so nothing is loaded.
        mma::mma_bf16(acc_qq[0], aq, aq[0], aq[2]);
        mma::mma_bf16(acc_qq[1], aq, aq[1], aq[3]);
      }
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        if (np <= rg || (!kStateP && np <= rp)) {
          u32 bk[4];
          mma::load_b2(bk, s_k + np * 16 * kLdK + ks * 16, kLdK);
          if (np <= rg) {
            mma::mma_bf16(acc_g[2 * np], ak, bk[0], bk[1]);
            mma::mma_bf16(acc_g[2 * np + 1], ak, bk[2], bk[3]);
          }
          if (!kStateP && np <= rp) {
            mma::mma_bf16(acc_p[2 * np], aq, bk[0], bk[1]);
            mma::mma_bf16(acc_p[2 * np + 1], aq, bk[2], bk[3]);
          }
        }
      }
    }
#endif
    // 2. Inverse norms from the diagonals (K K^T's block row rg, Q Q^T's diagonal block of row rp).
    store_inverse_norms<kL2Norm>(acc_g, acc_qq, rg, rp, s_rk, s_rq, p.scale, g, t4);
    // Every warp is done with s_q / s_k (and the norms are visible): the next chunk's rows go in.
    __syncthreads();
    if (b_next < chunk_ids) copy_qk(next_t0, next_rows);

    const i64 ws_row0 = t0 * hv_count;
#pragma unroll 1
    for (u32 e = 0; e < p.heads_per_group; ++e) {
      const u32 hv = h * p.heads_per_group + e;

      // 3. Gates of hv: g (log decay) and beta per row, then the inclusive scan gamma (each warp
      // its own copy); the next value head's (or chunk's) gates load once these are converted.
      gates.scan(p, rows, lane, s_rk, s_gamma, s_beta, s_cf, s_ref, [&] {
        if (e + 1 < p.heads_per_group) {
          gates.load(p, t0, rows, hv + 1, lane);
        } else if (b_next < chunk_ids) {
          gates.load(p, next_t0, next_rows, h * p.heads_per_group, lane);
        }
      });
      // The gates are this warp's own; the P rows it rewrites below are the ones it stored in
      // stage 6 of the previous value head.
      __syncwarp();

      // 4. A (f32, strictly lower; block row rg) and P (bf16, lower with the diagonal; block
      // row rp, zero above the diagonal block) of hv (decay_row_block), compiled once per warp
      // index (rg = warp, rp = 3 - warp as constants).
      per_warp_index(warp, [&](auto warp_index) {
        constexpr int kW = decltype(warp_index)::value;
        // Into a copy: the products serve every value head of the group.
        float y[8][4];
        copy_acc(y, acc_g);
        decay_row_block<kW, 0>(y, s_gamma, s_ref, s_cf, s_rk, g, t4,
                               [&](int i) { return s_beta[i] * s_rk[i]; });
        store_row_block<kW>(y, g, t4, [&](int i, int j, float x0, float x1, bool off_diagonal) {
          store_a_pair<inverse_f16(kL2Norm, kGated)>(s_a, i, j, x0, x1, off_diagonal);
        });
        if constexpr (!kStateP) {
          copy_acc(y, acc_p);
          decay_row_block<3 - kW, 1>(y, s_gamma, s_ref, s_cf, s_rk, g, t4,
                                     [&](int i) { return s_rq[i]; });
          store_row_block<3 - kW, true>(y, g, t4, [&](int i, int j, float x0, float x1, bool) {
            *reinterpret_cast<u32*>(s_p + i * kLd + j) = mma::pack_bf16(x0, x1);
          });
        }
      });
      if (tid < 64 && tid < rows) {
        const float gi = s_gamma[tid], g_last = s_gamma[63];
        const float eg = ex2(gi);
        const float4 sc =
            make_float4(s_rq[tid] * eg, s_rk[tid] * eg, s_rk[tid] * ex2(g_last - gi), ex2(g_last));
        static_cast<float4*>(p.ws_scales)[ws_row0 + i64(tid) * hv_count + hv] = sc;
        if constexpr (kStateP) {
          static_cast<float4*>(p.ws_p)[ws_row0 + i64(tid) * hv_count + hv] =
              gdn_prefill_p_factors(gi, s_rq[tid], s_rk[tid]);
        }
      }
      __syncthreads();

      // 5a-c. T = (I + A)^-1: the diagonal blocks by forward substitution, then the block
      // products (see the top of the file), T' into the staging tile.
      invert_chunk<kL2Norm, kGated>(
          s_a, s_beta0, warp, lane, [&](int r, int c) { return s_t + r * kLd + c; },
          [] { __syncthreads(); });
      __syncthreads();

      // 6. T' and P rows of hv to the workspace (16-byte stores of whole rows): warp w stores the
      // rows of block row 3 - w, whose P rows it wrote itself.
      {
        __nv_bfloat16* dst_t = static_cast<__nv_bfloat16*>(p.ws_t) + (ws_row0 + hv) * 64;
        __nv_bfloat16* dst_p = static_cast<__nv_bfloat16*>(p.ws_p) + (ws_row0 + hv) * 64;
#pragma unroll
        for (int it = 0; it < 4; ++it) {
          const int r = 16 * rp + 4 * it + (lane >> 3), part = lane & 7;
          if (r < rows) {
            const i64 off = i64(r) * hv_count * 64 + part * 8;
            *reinterpret_cast<uint4*>(dst_t + off) =
                *reinterpret_cast<const uint4*>(s_t + r * kLd + part * 8);
            if constexpr (!kStateP) {
              *reinterpret_cast<uint4*>(dst_p + off) =
                  *reinterpret_cast<const uint4*>(s_p + r * kLd + part * 8);
            }
          }
        }
      }
      // The next value head rewrites A and T' only after its own barriers, which every thread
      // reaches after its share of these copies; gamma and P are per warp.
    }
    b = b_next;
  }
}

}  // namespace kjit
