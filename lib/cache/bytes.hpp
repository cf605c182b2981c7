// SPDX-License-Identifier: Apache-2.0
// The byte encodings of the cache's files (entries and bundles): little-endian integers of 1 to 8
// bytes, the big-endian 64-bit halves of a key, and length-prefixed fields. One set for both
// formats (each file used to carry its own).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kjit::cache {

/// Appends the low `count` bytes of `value`, least significant first.
inline void put_le(std::string& out, std::uint64_t value, int count) {
  for (int i = 0; i < count; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

/// Reads `count` little-endian bytes at `offset` (the caller checked the bounds).
inline std::uint64_t get_le(std::string_view bytes, std::size_t offset, int count) {
  std::uint64_t value = 0;
  for (int i = 0; i < count; ++i) {
    value |= std::uint64_t{static_cast<unsigned char>(bytes[offset + static_cast<std::size_t>(i)])}
             << (8 * i);
  }
  return value;
}

inline void put_be64(std::string& out, std::uint64_t value) {
  for (int i = 7; i >= 0; --i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

inline std::uint64_t get_be64(std::string_view bytes, std::size_t offset) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < 8; ++i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  }
  return value;
}

/// A field: its length in 8 little-endian bytes, then its bytes.
inline void put_field(std::string& out, std::string_view field) {
  put_le(out, field.size(), 8);
  out.append(field);
}

}  // namespace kjit::cache
