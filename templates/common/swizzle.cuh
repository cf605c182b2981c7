// SPDX-License-Identifier: Apache-2.0
// The 128-byte-swizzled layout of a 64-row bf16 tile in shared memory (wgmma's layout type 1,
// wgmma::descriptor_sw128): columns in slices of 64 (128-byte rows), one slice of 64 rows after
// another (kSlice bytes each); row r of a slice at r * 128 with its 16-byte chunk j at chunk
// j ^ (r % 8), so the eight rows of an 8 x 8 matrix sit in eight different bank groups and a
// copy moves whole 128-byte lines. The swizzle is taken from address bits 4..9: every tile
// starts on kAtom bytes. Plain address arithmetic, for any target.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace sw128 {

/// Bytes of one 64-column slice of a 64-row tile.
inline constexpr u32 kSlice = 64 * 128;
/// Bytes of 8 rows: the swizzle's period, and the tiles' alignment.
inline constexpr u32 kAtom = 8 * 128;
/// The slice stride of a pair tile: two 64-row tiles X and Y interleaved by slice (X's slice s at
/// 2 s kSlice, Y's right behind it), so that each slice of both is one 128-row slice and a
/// wgmma reads X and Y as one 128-row B operand (n = 128): its A operand is then read once for
/// both products instead of once each. X alone, and Y at X + kSlice, are tiles of this stride.
inline constexpr u32 kPairSlice = 2 * kSlice;

/// Byte offset of row `row`'s 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7), slices
/// kSliceStride apart (kPairSlice: a tile of a pair).
template <u32 kSliceStride = kSlice>
__device__ __forceinline__ int offset(int row, int chunk) {
  return (chunk >> 3) * int(kSliceStride) + row * 128 + (((chunk ^ row) & 7) << 4);
}

/// offset(row, chunk) in the first slice (chunk < 8) where the caller knows row % 8 as `phase`
/// apart from row (a lane's g) and chunk is a constant once unrolled: the XOR is then one
/// instruction on a value the caller already holds, where offset() rebuilds it from row (the ws
/// kernel's decay pass: ~6 instructions a store, 5% of the call, docs/performance.md).
__device__ __forceinline__ u32 offset_first_slice(int row, int chunk, int phase) {
  return u32(row) * 128u + ((u32(chunk) << 4) ^ (u32(phase) << 4));
}

/// The start of K-major k-step ks (columns 16 ks .. 16 ks + 15) of the tile at shared address
/// `tile`, for its wgmma descriptor: 32 bytes into the row's 128-byte line, in slice ks / 4
/// (slices kSliceStride apart).
template <u32 kSliceStride = kSlice>
__device__ __forceinline__ u32 k_step(u32 tile, int ks) {
  return tile + u32(ks >> 2) * kSliceStride + u32(ks & 3) * 32;
}

}  // namespace sw128
}  // namespace kjit
