// SPDX-License-Identifier: Apache-2.0
// Element bits and raw vector accesses shared by every family: f32 <-> the bits of a float /
// __half / __nv_bfloat16 element (a 16-bit element in the low half of a 32-bit word), the raw
// word type of one 2-, 4-, 8- or 16-byte access, and loads and stores of such words.
//
// Values in flight are held as integer words, not as arrays of __half / __nv_bfloat16: the
// compiler turns integer vector types into single vector instructions, arrays of 16-bit
// floating types it does not, and a batch of 16-bit values costs half the registers as words.
// NVRTC-clean (no <type_traits>), and host-compilable under tests/common/cuda_host_emulation.hpp
// (it uses only the bit casts, half / bf16 conversions, uint2 / uint4 and __stwb found there).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "templates/common/types.h"

namespace kjit {
namespace vec {

/// Element -> f32, and f32 -> element rounded to nearest even (the host references round the
/// same way).
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

/// f32 -> tf32, the operand format of tf32 mma (1 sign, 8 exponent, 10 mantissa bits: an f32 bit
/// pattern with the 13 low bits clear), rounded to nearest with ties away from zero as
/// cvt.rna.tf32.f32 rounds: half a tf32 ulp added to the bit pattern, the 13 bits below it
/// cleared. Two integer instructions, where sm_90 expands the cvt into ~4 with a NaN check (a
/// third of the prefill chunk kernel's block-product stretches). A carry into the exponent is
/// the correct rounding up, and inf stays inf; only NaNs whose payload lies in the 13 low bits
/// would become inf. Checked on the host against a rounding in double
/// (tests/unit/templates_common_emulated_test.cpp).
__device__ __forceinline__ u32 to_tf32_bits(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

/// An element's bits as the element (elem) and as f32 (to_f32), and f32 rounded to nearest even
/// as the element's bits (from_f32). A 16-bit element's bits are the low half of the word;
/// from_f32 leaves the high half zero. to_f32 takes the bits in any unsigned type (u32, or the
/// unsigned short a 16-bit element was read as): the width NVVM sees changes the code it emits. For
/// bf16, to_f32 is a shift and to_f32(elem(bits)) a cvt.f32.bf16: the same value, not the same
/// machine code.
template <typename T>
struct Bits;
template <>
struct Bits<float> {
  static __device__ __forceinline__ float elem(u32 bits) { return __uint_as_float(bits); }
  template <typename B>
  static __device__ __forceinline__ float to_f32(B bits) {
    return __uint_as_float(static_cast<u32>(bits));
  }
  static __device__ __forceinline__ u32 from_f32(float x) { return __float_as_uint(x); }
};
template <>
struct Bits<__half> {
  static __device__ __forceinline__ __half elem(u32 bits) {
    return __ushort_as_half(static_cast<unsigned short>(bits));
  }
  template <typename B>
  static __device__ __forceinline__ float to_f32(B bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  }
  static __device__ __forceinline__ u32 from_f32(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
};
template <>
struct Bits<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 elem(u32 bits) {
    return __ushort_as_bfloat16(static_cast<unsigned short>(bits));
  }
  // bf16 is the high half of an f32: widening is a shift.
  template <typename B>
  static __device__ __forceinline__ float to_f32(B bits) {
    return __uint_as_float(static_cast<u32>(bits) << 16);
  }
  static __device__ __forceinline__ u32 from_f32(float x) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
};

/// Element k of elements of T packed into 32-bit words (two per word for 16-bit T, the first
/// in the low half), as f32.
template <typename T>
__device__ __forceinline__ float get(const u32* w, int k) {
  if constexpr (sizeof(T) == 4) {
    return Bits<T>::to_f32(w[k]);
  } else {
    return Bits<T>::to_f32((w[k / 2] >> (16 * (k % 2))) & 0xffffu);
  }
}

/// Two f32 rounded to 16-bit T, packed into one word (`lo` in the low half).
template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  return Bits<T>::from_f32(lo) | (Bits<T>::from_f32(hi) << 16);
}

/// The raw type of one kBytes access (one instruction).
template <int kBytes>
struct Word;
template <>
struct Word<16> {
  using type = uint4;
};
template <>
struct Word<8> {
  using type = uint2;
};
template <>
struct Word<4> {
  using type = unsigned int;
};
template <>
struct Word<2> {
  using type = unsigned short;
};

/// A raw access's value as 32-bit words (a 16-bit access in the low half of one word), and back.
__device__ __forceinline__ void to_words(const uint4& r, u32 (&w)[4]) {
  w[0] = r.x;
  w[1] = r.y;
  w[2] = r.z;
  w[3] = r.w;
}
__device__ __forceinline__ void to_words(const uint2& r, u32 (&w)[2]) {
  w[0] = r.x;
  w[1] = r.y;
}
__device__ __forceinline__ void to_words(unsigned int r, u32 (&w)[1]) { w[0] = r; }
__device__ __forceinline__ void to_words(unsigned short r, u32 (&w)[1]) { w[0] = r; }

__device__ __forceinline__ uint4 from_words(const u32 (&w)[4]) {
  return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ uint2 from_words(const u32 (&w)[2]) { return make_uint2(w[0], w[1]); }
__device__ __forceinline__ unsigned int from_words(const u32 (&w)[1]) { return w[0]; }

/// The words of one kBytes access at `p` (aligned to kBytes), with a plain load. The vector is
/// unpacked where it is loaded, not through to_words: for the conv and fused-decode loads of a
/// f32 vector, that split the 16-byte load into 4 + 4 + 8 bytes (their PTX).
template <int kBytes>
__device__ __forceinline__ void load(const void* p, u32 (&w)[kBytes >= 4 ? kBytes / 4 : 1]) {
  if constexpr (kBytes == 16) {
    const uint4 r = *static_cast<const uint4*>(p);
    w[0] = r.x;
    w[1] = r.y;
    w[2] = r.z;
    w[3] = r.w;
  } else if constexpr (kBytes == 8) {
    const uint2 r = *static_cast<const uint2*>(p);
    w[0] = r.x;
    w[1] = r.y;
  } else if constexpr (kBytes == 4) {
    w[0] = *static_cast<const unsigned int*>(p);
  } else {
    static_assert(kBytes == 2, "2, 4, 8 or 16 bytes");
    w[0] = *static_cast<const unsigned short*>(p);
  }
}

/// The words of one kBytes access stored at `p` (aligned to kBytes), with a plain store. NVVM may
/// split a plain 16-byte store into narrower ones; store_wb does not.
template <int kBytes>
__device__ __forceinline__ void store(void* p, const u32 (&w)[kBytes >= 4 ? kBytes / 4 : 1]) {
  using W = typename Word<kBytes>::type;
  *static_cast<W*>(p) = static_cast<W>(from_words(w));
}

/// One 16-byte store as one instruction. A plain `*p = v` through uint4* is split by NVVM into
/// four 4-byte stores for most tokens of an unrolled batch (PTX of the bf16 conv prefill
/// kernel: 6 of every 8 output rows), four times the store instructions and L2 requests;
/// __stwb is the default write-back store (st.global.wb) and always stays one v4 store.
__device__ __forceinline__ void store16(uint4* p, uint4 v) { __stwb(p, v); }
__device__ __forceinline__ void store8(uint2* p, uint2 v) { __stwb(p, v); }

/// store with __stwb: one instruction per access, whatever the width.
template <int kBytes>
__device__ __forceinline__ void store_wb(void* p, const u32 (&w)[kBytes >= 4 ? kBytes / 4 : 1]) {
  using W = typename Word<kBytes>::type;
  __stwb(static_cast<W*>(p), static_cast<W>(from_words(w)));
}

/// kN 32-bit words at `p` with the widest loads their count allows: 16 bytes at a time for a
/// multiple of 4 words, else one 8- or 4-byte load (`p` aligned to min(16, 4 kN) bytes).
template <int kN>
__device__ __forceinline__ void load_words(const void* p, u32 (&w)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kN; k += 4) {
      const uint4 v = static_cast<const uint4*>(p)[k / 4];
      w[k] = v.x;
      w[k + 1] = v.y;
      w[k + 2] = v.z;
      w[k + 3] = v.w;
    }
  } else if constexpr (kN == 2) {
    const uint2 v = *static_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    static_assert(kN == 1, "1, 2 or a multiple of 4 words");
    w[0] = *static_cast<const u32*>(p);
  }
}

/// The store twin of load_words, one instruction per vector (store16 / store8).
template <int kN>
__device__ __forceinline__ void store_words_wb(void* p, const u32 (&w)[kN]) {
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int k = 0; k < kN; k += 4) {
      store16(static_cast<uint4*>(p) + k / 4, make_uint4(w[k], w[k + 1], w[k + 2], w[k + 3]));
    }
  } else if constexpr (kN == 2) {
    store8(static_cast<uint2*>(p), make_uint2(w[0], w[1]));
  } else {
    static_assert(kN == 1, "1, 2 or a multiple of 4 words");
    *static_cast<u32*>(p) = w[0];
  }
}

/// kVec elements of T held as raw 32-bit words until used: a batch of loads in flight then
/// costs half the registers of the same values as floats (16-bit types). The caller guarantees
/// that a vector (kVec > 1) is contiguous and aligned to kVec * sizeof(T) <= 16 bytes.
template <typename T, int kVec>
struct Raw {
  static constexpr int kBytes = kVec * static_cast<int>(sizeof(T));
  static_assert(kBytes <= 16, "at most 16 bytes per access");
  static constexpr int kWords = kBytes >= 4 ? kBytes / 4 : 1;
  u32 w[kWords];

  __device__ __forceinline__ void load(const T* p) { vec::load<kBytes>(p, w); }
  __device__ __forceinline__ float get(int k) const { return vec::get<T>(w, k); }
};

/// kElems contiguous elements of T (a multiple of 16 bytes, 16-byte aligned) held as raw words,
/// loaded and stored 16 bytes per instruction.
template <typename T, int kElems>
struct Block {
  static constexpr int kBytes = kElems * static_cast<int>(sizeof(T));
  static_assert(kBytes % 16 == 0, "a block is whole 16-byte vectors");
  static constexpr int kWords = kBytes / 4;
  u32 w[kWords];

  __device__ __forceinline__ void load(const T* p) { load_words<kWords>(p, w); }
  __device__ __forceinline__ void store(T* p) const { store_words_wb<kWords>(p, w); }
  __device__ __forceinline__ float get(int e) const { return vec::get<T>(w, e); }
  /// Every element of a word is set before the block is stored (the caller sets all of them).
  __device__ __forceinline__ void set(int e, float v) {
    if constexpr (sizeof(T) == 4) {
      w[e] = __float_as_uint(v);
    } else {
      const u32 bits = Bits<T>::from_f32(v);
      w[e / 2] = e % 2 == 0 ? (w[e / 2] & 0xffff0000u) | bits : (w[e / 2] & 0xffffu) | (bits << 16);
    }
  }
};

}  // namespace vec
}  // namespace kjit
