// SPDX-License-Identifier: Apache-2.0
// The disk-cache entry reader (decode_entry) on arbitrary bytes. It must never throw, crash
// or read out of bounds; an entry it accepts must be canonical (re-encoding it gives the same
// bytes), so that no two byte strings are ever accepted as the same kernel.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "cache/entry.hpp"
#include "fuzz_check.hpp"
#include "kjit/error.hpp"
#include "support/hash.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  // Readers know the key they look for; use the header's own key so that mutations get past
  // the key comparison and reach the payload, and also a fixed key that never matches.
  const std::optional<kjit::support::Hash128> key = kjit::cache::peek_entry_key(bytes);
  std::string why;
  const kjit::support::Hash128 other{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  if (key != other) {
    kjit::fuzz::require(!kjit::cache::decode_entry(bytes, other, &why).has_value(),
                        "an entry was accepted under a key it does not carry");
  }
  if (!key) return 0;
  why.clear();
  const std::optional<kjit::CompiledKernel> kernel = kjit::cache::decode_entry(bytes, *key, &why);
  if (!kernel) {
    kjit::fuzz::require(!why.empty(), "a refused entry without a reason");
    return 0;
  }
  std::string again;
  try {
    again = kjit::cache::encode_entry(*key, *kernel);
  } catch (const kjit::Error& error) {
    kjit::fuzz::fail(std::string("an accepted entry does not re-encode: ") + error.what());
  }
  kjit::fuzz::require(again == bytes, "an accepted entry is not canonical");
  return 0;
}
