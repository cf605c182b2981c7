// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>

#include "cache/entry.hpp"
#include "kjit/error.hpp"
#include "stress/cache_test_support.hpp"

namespace kjit::cache {
namespace {

using test::random_bytes;
using test::random_kernel;
using test::same_kernel;

constexpr support::Hash128 kKey{0x0123456789abcdefULL, 0x1122334455667788ULL};

void put_le64(std::string& bytes, std::size_t offset, std::uint64_t value) {
  for (std::size_t i = 0; i < 8; ++i) {
    bytes[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

/// Rewrites the header's length and checksum to match the payload, so that a mutated
/// payload gets past the checksum and exercises the field parser.
void fix_header(std::string& entry) {
  const std::string_view payload = std::string_view(entry).substr(kEntryHeaderSize);
  put_le64(entry, kEntryLengthOffset, payload.size());
  put_le64(entry, kEntryChecksumOffset, support::xxh3_64(payload));
}

bool rejected(std::string_view bytes, const support::Hash128& key = kKey) {
  std::string why;
  const auto kernel = decode_entry(bytes, key, &why);
  return !kernel.has_value() && !why.empty();
}

}  // namespace

TEST_CASE("cache entry: round trip of a realistic kernel") {
  std::mt19937_64 rng(1);
  CompiledKernel kernel = random_kernel(rng, 1);
  const std::string entry = encode_entry(kKey, kernel);
  CHECK(entry.size() > kernel.cubin.size() + kernel.ptx.size());
  CHECK(std::memcmp(entry.data(), "KJITC\0\0\1", 8) == 0);

  std::string why;
  const auto decoded = decode_entry(entry, kKey, &why);
  REQUIRE_MESSAGE(decoded.has_value(), why);
  kernel.key = kKey.hex();  // encode_entry stores the key it is given
  CHECK(same_kernel(*decoded, kernel));
  CHECK(decoded->spec.str() == "probe:heavy=0@sm_90");
  CHECK(decoded->resources.spill_store_bytes == std::int64_t{1} << 40);
  CHECK(decoded->resources.local_bytes == -1);

  // Decoding does not depend on `why` being given.
  CHECK(decode_entry(entry, kKey, nullptr).has_value());
  REQUIRE(peek_entry_key(entry).has_value());
  CHECK(*peek_entry_key(entry) == kKey);
}

TEST_CASE("cache entry: key is stored big-endian, as hex() prints it") {
  std::mt19937_64 rng(2);
  const std::string entry = encode_entry(kKey, random_kernel(rng, 0));
  const std::string expected("\x01\x23\x45\x67\x89\xab\xcd\xef\x11\x22\x33\x44\x55\x66\x77\x88",
                             16);
  CHECK(entry.substr(kEntryKeyOffset, 16) == expected);
  CHECK(entry.substr(kEntryVersionOffset, 4) == std::string("\x01\x00\x00\x00", 4));
}

TEST_CASE("cache entry: a kernel.key that contradicts the key is a caller bug") {
  std::mt19937_64 rng(3);
  CompiledKernel kernel = random_kernel(rng, 0);
  kernel.key = "ffffffffffffffffffffffffffffffff";
  CHECK_THROWS_AS(encode_entry(kKey, kernel), InvalidArgument);
  kernel.key = kKey.hex();
  CHECK_NOTHROW(encode_entry(kKey, kernel));
}

TEST_CASE("cache entry: every single-byte change of a small entry is detected") {
  std::mt19937_64 rng(4);
  const std::string entry = encode_entry(kKey, random_kernel(rng, 0));
  REQUIRE(decode_entry(entry, kKey, nullptr).has_value());
  std::size_t detected = 0;
  std::size_t tried = 0;
  for (std::size_t pos = 0; pos < entry.size(); ++pos) {
    for (const unsigned mask : {0x01u, 0x80u, 0xffu, 0x5au}) {
      std::string bad = entry;
      bad[pos] = static_cast<char>(static_cast<unsigned char>(bad[pos]) ^ mask);
      ++tried;
      if (rejected(bad)) {
        ++detected;
      } else {
        FAIL_CHECK("undetected change at byte " << pos << " mask " << mask);
      }
    }
  }
  CHECK(detected == tried);
  MESSAGE(tried << " single-byte changes of a " << entry.size() << "-byte entry, all detected");
}

TEST_CASE("cache entry: sampled single-byte changes of a large entry are detected") {
  std::mt19937_64 rng(5);
  const std::string entry = encode_entry(kKey, random_kernel(rng, 2));
  REQUIRE(entry.size() > 1000000);
  for (int i = 0; i < 400; ++i) {
    // Half in the header and the first fields, where the structure is; half anywhere.
    const std::size_t pos = i % 2 == 0 ? rng() % 512 : rng() % entry.size();
    const auto mask = static_cast<unsigned>(1 + rng() % 255);
    std::string bad = entry;
    bad[pos] = static_cast<char>(static_cast<unsigned char>(bad[pos]) ^ mask);
    CAPTURE(pos);
    CHECK(rejected(bad));
  }
}

TEST_CASE("cache entry: every truncation and any extension is detected") {
  std::mt19937_64 rng(6);
  const std::string entry = encode_entry(kKey, random_kernel(rng, 0));
  for (std::size_t length = 0; length < entry.size(); ++length) {
    CAPTURE(length);
    CHECK(rejected(std::string_view(entry).substr(0, length)));
  }
  CHECK(rejected(entry + '\0'));
  CHECK(rejected(entry + entry));

  const std::string large = encode_entry(kKey, random_kernel(rng, 1));
  for (int i = 0; i < 200; ++i) {
    CHECK(rejected(std::string_view(large).substr(0, rng() % large.size())));
  }
}

TEST_CASE("cache entry: an entry for another key, version or spec is refused") {
  std::mt19937_64 rng(7);
  const std::string entry = encode_entry(kKey, random_kernel(rng, 0));
  std::string why;

  SUBCASE("another key") {
    for (const support::Hash128 other :
         {support::Hash128{kKey.high, kKey.low ^ 1},
          support::Hash128{kKey.high ^ (1ULL << 63), kKey.low}, support::Hash128{}}) {
      CHECK_FALSE(decode_entry(entry, other, &why).has_value());
      CHECK(why.find("key") != std::string::npos);
    }
  }
  SUBCASE("another format version") {
    std::string bad = entry;
    bad[kEntryVersionOffset] = 2;
    CHECK_FALSE(decode_entry(bad, kKey, &why).has_value());
    CHECK(why.find("version") != std::string::npos);
    CHECK_FALSE(peek_entry_key(bad).has_value());
  }
  SUBCASE("a spec text that does not parse") {
    CompiledKernel kernel = random_kernel(rng, 0);
    kernel.spec.family = "no_such_family";
    const std::string foreign = encode_entry(kKey, kernel);
    CHECK_FALSE(decode_entry(foreign, kKey, &why).has_value());
    CHECK(why.find("spec") != std::string::npos);
  }
  SUBCASE("a payload naming another key") {
    // Same header key, consistent checksum, but the key field inside says otherwise.
    std::string bad = entry;
    const std::string hex = kKey.hex();
    const auto at = bad.find(hex, kEntryHeaderSize);
    REQUIRE(at != std::string::npos);
    bad[at] = bad[at] == '0' ? '1' : '0';
    fix_header(bad);
    CHECK_FALSE(decode_entry(bad, kKey, &why).has_value());
    CHECK(why.find("key") != std::string::npos);
  }
}

TEST_CASE("cache entry: random garbage and mutated payloads never crash") {
  std::mt19937_64 rng(8);
  const std::string valid = encode_entry(kKey, random_kernel(rng, 0));
  std::string header_only = valid.substr(0, kEntryHeaderSize);

  for (int i = 0; i < 20000; ++i) {
    std::string bytes;
    switch (i % 4) {
      case 0:  // pure noise
        bytes = random_bytes(rng, rng() % 300);
        break;
      case 1:  // a valid header followed by noise
        bytes = header_only + random_bytes(rng, rng() % 300);
        break;
      case 2:  // noise with a consistent length and checksum: reaches the field parser
        bytes = header_only + random_bytes(rng, rng() % 300);
        fix_header(bytes);
        break;
      case 3: {  // a valid entry with a few payload bytes changed, header fixed up
        bytes = valid;
        const int changes = 1 + static_cast<int>(rng() % 4);
        for (int c = 0; c < changes; ++c) {
          const std::size_t pos = kEntryHeaderSize + rng() % (bytes.size() - kEntryHeaderSize);
          bytes[pos] = static_cast<char>(rng() & 0xff);
        }
        if (rng() % 3 == 0)
          bytes.resize(kEntryHeaderSize + rng() % (bytes.size() - kEntryHeaderSize));
        fix_header(bytes);
        break;
      }
    }
    std::string why;
    const auto kernel = decode_entry(bytes, kKey, &why);
    // Cases 0-2 cannot hold ten well-formed fields ending in a parseable spec and the key hex.
    if (i % 4 != 3) CHECK_FALSE(kernel.has_value());
    if (!kernel) CHECK_FALSE(why.empty());
  }

  SUBCASE("a field length that points past the end") {
    std::string bad = valid;
    put_le64(bad, kEntryHeaderSize, ~std::uint64_t{0});
    fix_header(bad);
    std::string why;
    CHECK_FALSE(decode_entry(bad, kKey, &why).has_value());
    CHECK(why.find("past the end") != std::string::npos);
  }
  SUBCASE("a header length near 2^64") {
    std::string bad = valid;
    put_le64(bad, kEntryLengthOffset, ~std::uint64_t{0} - 3);
    CHECK(rejected(bad));
  }
}

}  // namespace kjit::cache
