// SPDX-License-Identifier: Apache-2.0
// The serialized form of one cache entry (.kjc file, also a bundle record). Layout, all
// integers little-endian except the key (see cache/README.md for the full description):
//
//   offset size
//        0    8  magic "KJITC\0\0\1"
//        8    4  format version (kEntryFormatVersion)
//       12   16  key: Hash128 high word then low word, each big-endian (= hex() order)
//       28    8  payload length in bytes
//       36    8  XXH3-64 of the payload
//       44    …  payload: fields of CompiledKernel, each "u64 length + bytes"
//
// The header is not checksummed by itself, but every header byte is checked: the magic and
// version exactly, the key against the expected key, the length against the exact size read,
// the checksum against the payload. So any single flipped byte of an entry is detected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/kernel.hpp"
#include "support/hash.hpp"

namespace kjit::cache {

/// The first 8 bytes of every entry.
inline constexpr char kEntryMagic[8] = {'K', 'J', 'I', 'T', 'C', '\0', '\0', '\1'};
/// Bumped whenever the payload layout changes; an entry of another version is a miss.
inline constexpr std::uint32_t kEntryFormatVersion = 1;
/// Bytes before the payload.
inline constexpr std::size_t kEntryHeaderSize = 8 + 4 + 16 + 8 + 8;
/// Offsets of the header fields.
inline constexpr std::size_t kEntryVersionOffset = 8;
inline constexpr std::size_t kEntryKeyOffset = 12;
inline constexpr std::size_t kEntryLengthOffset = 28;
inline constexpr std::size_t kEntryChecksumOffset = 36;
/// Entries larger than this are refused on both sides: a corrupt length must not make a
/// reader allocate gigabytes, and no real cubin + PTX comes near it.
inline constexpr std::uint64_t kMaxEntryBytes = std::uint64_t{1} << 30;

/// Serializes `kernel` under `key`. The stored key field is key.hex(); throws InvalidArgument
/// when kernel.key is set and differs (a caller bug that would make the entry never load).
std::string encode_entry(const support::Hash128& key, const CompiledKernel& kernel);

/// Verifies and parses an entry: magic, version, key == expected_key, exact length, checksum,
/// every field's length, the stored key hex, and that the spec text re-parses with
/// KernelSpec::parse. nullopt (with `why`, if given, saying what is wrong) for any problem.
/// Never throws and never reads out of bounds, whatever `bytes` holds.
std::optional<CompiledKernel> decode_entry(std::string_view bytes,
                                           const support::Hash128& expected_key, std::string* why);

/// `log` without the lines that differ between two compiles of the same kernel (ptxas's
/// "Compile time = ... ms"), so that entries and bundles built twice are the same bytes
/// (cache/BUNDLES.md, "Reproducibility"). Every other line is kept as it was.
std::string reproducible_log(std::string_view log);

/// The key in an entry's header when the magic and version are right (for tools that inspect
/// a file whose key they do not know); nothing else is verified.
std::optional<support::Hash128> peek_entry_key(std::string_view bytes);

}  // namespace kjit::cache
