// SPDX-License-Identifier: Apache-2.0
// XXH3 wrappers. XXH_INLINE_ALL keeps xxHash private to each unit, so kjit has no link-time
// dependency on libxxhash and users never see its symbols.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kjit::support {

struct Hash128 {
  std::uint64_t high = 0;
  std::uint64_t low = 0;
  /// 32 lowercase hex digits, high word first (the canonical big-endian form).
  std::string hex() const;
  static bool parse_hex(std::string_view text, Hash128* out);
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

Hash128 xxh3_128(std::string_view bytes) noexcept;
std::uint64_t xxh3_64(std::string_view bytes) noexcept;

}  // namespace kjit::support
