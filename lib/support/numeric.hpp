// SPDX-License-Identifier: Apache-2.0
// Host-side conversions between float and the 16-bit formats kernels read and write, for CPU
// references and tests. Bit-exact with the device's round-to-nearest-even conversions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kjit/types.hpp"

namespace kjit::support {

inline float bf16_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline std::uint16_t float_to_bf16(float value) noexcept {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  // Round to nearest, ties to even, on the 16 bits that are dropped.
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float f16_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline std::uint16_t float_to_f16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint16_t sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) return static_cast<std::uint16_t>(sign | 0x7E00u);
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return static_cast<std::uint16_t>(sign | 0x7C00u);  // rounds to inf
  if (magnitude < 6.103515625e-05f) {
    // Subnormal range: quantum 2^-24; nearbyint rounds half to even.
    const float scaled = std::nearbyint(magnitude * 16777216.0f);
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(scaled));
  }
  std::uint32_t abs_bits = bits & 0x7FFFFFFFu;
  // Rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  abs_bits += 0x0FFFu + ((abs_bits >> 13) & 1u);
  const std::uint32_t half = (abs_bits >> 13) - (112u << 10);
  return static_cast<std::uint16_t>(sign | half);
}

/// Reads element `index` of a host buffer of `dtype` as double (f16, bf16, f32, f64, i32, i64,
/// u8).
inline double load_as_double(const void* data, DType dtype, std::int64_t index) noexcept {
  const auto* bytes = static_cast<const unsigned char*>(data);
  switch (dtype) {
    case DType::f16: {
      std::uint16_t v;
      std::memcpy(&v, bytes + index * 2, 2);
      return f16_to_float(v);
    }
    case DType::bf16: {
      std::uint16_t v;
      std::memcpy(&v, bytes + index * 2, 2);
      return bf16_to_float(v);
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, bytes + index * 4, 4);
      return v;
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, bytes + index * 8, 8);
      return v;
    }
    case DType::i32: {
      std::int32_t v;
      std::memcpy(&v, bytes + index * 4, 4);
      return v;
    }
    case DType::i64: {
      std::int64_t v;
      std::memcpy(&v, bytes + index * 8, 8);
      return static_cast<double>(v);
    }
    case DType::u8:
      return bytes[index];
    case DType::e4m3:
      break;
  }
  return std::nan("");
}

/// Writes `value` rounded to `dtype` (nearest even) into element `index` of a host buffer.
inline void store_from_double(void* data, DType dtype, std::int64_t index, double value) noexcept {
  auto* bytes = static_cast<unsigned char*>(data);
  switch (dtype) {
    case DType::f16: {
      const std::uint16_t v = float_to_f16(static_cast<float>(value));
      std::memcpy(bytes + index * 2, &v, 2);
      return;
    }
    case DType::bf16: {
      const std::uint16_t v = float_to_bf16(static_cast<float>(value));
      std::memcpy(bytes + index * 2, &v, 2);
      return;
    }
    case DType::f32: {
      const float v = static_cast<float>(value);
      std::memcpy(bytes + index * 4, &v, 4);
      return;
    }
    case DType::f64:
      std::memcpy(bytes + index * 8, &value, 8);
      return;
    case DType::i32: {
      const auto v = static_cast<std::int32_t>(value);
      std::memcpy(bytes + index * 4, &v, 4);
      return;
    }
    case DType::i64: {
      const auto v = static_cast<std::int64_t>(value);
      std::memcpy(bytes + index * 8, &v, 8);
      return;
    }
    case DType::u8:
      bytes[index] = static_cast<unsigned char>(value);
      return;
    case DType::e4m3:
      return;
  }
}

}  // namespace kjit::support
