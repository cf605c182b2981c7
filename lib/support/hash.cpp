// SPDX-License-Identifier: Apache-2.0
#include "support/hash.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace kjit::support {

std::string Hash128::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

bool Hash128::parse_hex(std::string_view text, Hash128* out) {
  if (text.size() != 32) return false;
  std::uint64_t words[2] = {0, 0};
  for (std::size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    std::uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<std::uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<std::uint64_t>(c - 'a' + 10);
    } else {
      return false;
    }
    words[i / 16] = (words[i / 16] << 4) | digit;
  }
  out->high = words[0];
  out->low = words[1];
  return true;
}

Hash128 xxh3_128(std::string_view bytes) noexcept {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return Hash128{h.high64, h.low64};
}

std::uint64_t xxh3_64(std::string_view bytes) noexcept {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace kjit::support
