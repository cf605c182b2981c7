// SPDX-License-Identifier: Apache-2.0
// Warp-level tensor-core helpers: mma.sync m16n8k16 (bf16 x bf16 -> f32) and ldmatrix fragment
// loads from shared memory. sm_80 and later; NVRTC-clean (inline PTX only).
//
// Fragment ownership (lane = 4 * g + t, g in 0..7, t in 0..3), PTX ISA "mma.m16n8k16":
//   A 16x16 (row): a[0] (g, 2t..2t+1), a[1] (g+8, 2t..), a[2] (g, 2t+8..), a[3] (g+8, 2t+8..)
//   B 16x8 (col):  b[0] (k 2t..2t+1, n g), b[1] (k 2t+8.., n g)
//   C 16x8 f32:    c[0], c[1] (g, 2t..2t+1), c[2], c[3] (g+8, 2t..2t+1)
// Each 32-bit register holds two bf16, the lower column (or k) in the low half.
#pragma once

#include <cuda_bf16.h>

#include "templates/common/swizzle.cuh"
#include "templates/common/types.h"
#include "templates/common/vec.cuh"

namespace kjit {
namespace mma {

/// Shared-memory address of a generic pointer into shared memory, for ldmatrix.
__device__ __forceinline__ u32 smem_addr(const void* ptr) {
  return static_cast<u32>(__cvta_generic_to_shared(ptr));
}

/// Two f32 -> one register of two bf16 (round to nearest even); `lo` in the low half.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return (u32(__bfloat16_as_ushort(v.y)) << 16) | u32(__bfloat16_as_ushort(v.x));
}

/// Two f32 -> one register of two f16 (round to nearest even); `lo` in the low half. The caller
/// keeps the values inside f16's range (6.5e4): beyond it they become infinite.
__device__ __forceinline__ u32 pack_f16(float lo, float hi) {
  return (u32(__half_as_ushort(__float2half_rn(hi))) << 16) |
         u32(__half_as_ushort(__float2half_rn(lo)));
}

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// The transpose of an 8 x 8 matrix of 16-bit elements spread over a warp as an mma accumulator
/// tile is (lane holds row lane / 4, columns 2 (lane % 4) and + 1, the lower column in the low
/// half): afterwards lane holds row lane / 4 of the transpose in the same way.
__device__ __forceinline__ u32 transpose8x8(u32 x) {
  u32 y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

/// d += a * b for one 16x8x16 tile.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// d += a * b for one 16x8x16 tile of f16 operands, f32 accumulate.
__device__ __forceinline__ void mma_f16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

#endif
/// f32 -> tf32 operand bits (vec::to_tf32_bits: round to nearest, ties away, on the bit pattern).
__device__ __forceinline__ u32 to_tf32(float x) { return vec::to_tf32_bits(x); }

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// d += a * b for one 16x8x8 tile of tf32 operands, f32 accumulate.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/// ldmatrix_x4's inverse (sm_90 and later): lanes 8 i .. 8 i + 7 give the row addresses of 8 x 8
/// matrix i, and lane l's r[i] is matrix i's row l / 4, columns 2 (l % 4) and + 1 (an mma
/// fragment's layout). One instruction for what four 4-byte stores of a warp write.
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :
               : "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

/// stmatrix_x4 with each 8 x 8 matrix transposed: matrix i's row k (at lane 8 i + k's address)
/// receives column k of the fragment, i.e. lane l's r[i] lands in rows 2 (l % 4) and + 1,
/// column l / 4.
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, const u32 (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
               :
               : "r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

#endif
/// A fragment of the 16x16 tile whose element (r, c) is base[r * ld + c] (row-major, the
/// reduction dim contiguous). base and ld * 2 bytes must be 16-byte aligned.
__device__ __forceinline__ void load_a(u32 (&a)[4], const __nv_bfloat16* base, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4(a, smem_addr(base + (i + 8 * (m & 1)) * ld + 8 * (m >> 1)));
}

/// B fragments of two adjacent 16x8 tiles (n 0..7 -> b[0], b[1]; n 8..15 -> b[2], b[3]) whose
/// element (k, n) is base[n * ld + k] (the reduction dim contiguous, "col").
__device__ __forceinline__ void load_b2(u32 (&b)[4], const __nv_bfloat16* base, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4(b, smem_addr(base + (i + 8 * (m >> 1)) * ld + 8 * (m & 1)));
}

/// As load_b2, for a tile stored the other way: element (k, n) is base[k * ld + n].
__device__ __forceinline__ void load_b2_trans(u32 (&b)[4], const __nv_bfloat16* base, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4_trans(b, smem_addr(base + (i + 8 * (m & 1)) * ld + 8 * (m >> 1)));
}

/// A fragment of the 16x16 tile whose element (r, c) is base[c * ld + r] (stored transposed:
/// the m dim contiguous), e.g. V^T from V rows. base and ld * 2 bytes must be 16-byte aligned.
__device__ __forceinline__ void load_a_trans(u32 (&a)[4], const __nv_bfloat16* base, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4_trans(a, smem_addr(base + (i + 8 * (m >> 1)) * ld + 8 * (m & 1)));
}

/// load_a from a 128-byte-swizzled 64-row tile at shared address `tile` (swizzle.cuh): rows
/// row0 .. row0 + 15 (row0 a multiple of 8), columns col0 .. col0 + 15 (col0 a multiple of 16).
/// The eight rows of each 8 x 8 matrix sit in eight different chunks: no bank conflicts.
/// kSliceStride: the tile's (sw128::kPairSlice for a tile of a pair).
template <u32 kSliceStride = sw128::kSlice>
__device__ __forceinline__ void load_a_sw128(u32 (&a)[4], u32 tile, int row0, int col0) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4(
      a, tile + u32(sw128::offset<kSliceStride>(row0 + i + 8 * (m & 1), (col0 >> 3) + (m >> 1))));
}

/// load_a_trans from a 128-byte-swizzled 64-row tile at shared address `tile` (swizzle.cuh): the
/// A fragment of the 16 x 16 block whose element (r, c) is the tile's (row0 + c, col0 + r), i.e.
/// rows row0 .. row0 + 15 (a multiple of 8) and columns col0 .. col0 + 15 (a multiple of 8) read
/// transposed. Conflict-free like load_a_sw128.
__device__ __forceinline__ void load_a_trans_sw128(u32 (&a)[4], u32 tile, int row0, int col0) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int m = lane >> 3, i = lane & 7;
  ldmatrix_x4_trans(a, tile + u32(sw128::offset(row0 + i + 8 * (m >> 1), (col0 >> 3) + (m & 1))));
}

/// The 16 x 16 diagonal block of X X^T for rows row0 .. row0 + 15 of a 128-byte-swizzled bf16
/// tile at shared address `tile`, kKSteps k-steps of 16 columns, added into `acc`: X's A fragment
/// is also its B fragment (n-tile 0: columns row0 .. row0 + 7, n-tile 1: row0 + 8 .. row0 + 15).
/// Odd k-steps go into a second accumulator, added at the end: two chains of kKSteps / 2
/// dependent mma each instead of one of kKSteps (the chunk warpgroup waits them out alone).
/// kLoadsFirst: every k-step's fragment loaded before the first mma (4 kKSteps registers), so
/// that the ldmatrix latencies overlap one another where the shared pipe is busy.
/// kSliceStride: the tile's, as load_a_sw128's.
template <int kKSteps, bool kLoadsFirst = false, u32 kSliceStride = sw128::kSlice>
__device__ __forceinline__ void gram_diagonal_block_sw128(float (&acc)[2][4], u32 tile, int row0) {
  float odd[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  u32 frag[kLoadsFirst ? kKSteps : 1][4];
  if constexpr (kLoadsFirst) {
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) load_a_sw128<kSliceStride>(frag[ks], tile, row0, 16 * ks);
  }
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) {
    u32(&a)[4] = frag[kLoadsFirst ? ks : 0];
    if constexpr (!kLoadsFirst) load_a_sw128<kSliceStride>(a, tile, row0, 16 * ks);
    float(&c)[2][4] = ks % 2 == 0 ? acc : odd;
    mma_bf16(c[0], a, a[0], a[2]);
    mma_bf16(c[1], a, a[1], a[3]);
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] += odd[n][e];
  }
}

/// The lane of a quad (g = lane / 4, t4 = lane % 4) that holds the diagonal element of row g (or
/// g + 8) of a 16 x 16 accumulator block: column 2 t4 or 2 t4 + 1 is g.
__device__ __forceinline__ bool holds_diagonal(int g, int t4) { return t4 == (g >> 1); }

/// That element of n-tile hf (rows g + 8 hf), valid in the lane that holds_diagonal().
__device__ __forceinline__ float own_diagonal(const float (&tile)[4], int hf, int g) {
  return (g & 1) != 0 ? tile[2 * hf + 1] : tile[2 * hf];
}

/// A fragment from an f32 row-major tile (element (r, c) at base[r * ld + c]), rounded to
/// bf16. base and ld * 4 bytes must be 8-byte aligned.
__device__ __forceinline__ void load_a_f32(u32 (&a)[4], const float* base, int ld) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int g = lane >> 2, t = lane & 3;
  const float2 x0 = *reinterpret_cast<const float2*>(base + g * ld + 2 * t);
  const float2 x1 = *reinterpret_cast<const float2*>(base + (g + 8) * ld + 2 * t);
  const float2 x2 = *reinterpret_cast<const float2*>(base + g * ld + 2 * t + 8);
  const float2 x3 = *reinterpret_cast<const float2*>(base + (g + 8) * ld + 2 * t + 8);
  a[0] = pack_bf16(x0.x, x0.y);
  a[1] = pack_bf16(x1.x, x1.y);
  a[2] = pack_bf16(x2.x, x2.y);
  a[3] = pack_bf16(x3.x, x3.y);
}

}  // namespace mma
}  // namespace kjit
