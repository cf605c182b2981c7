// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/key.hpp"
#include "support/hash.hpp"

namespace kjit::cache {
namespace {

KeyMaterial realistic_material() {
  KeyMaterial material;
  material.add("schema", std::to_string(kKeySchemaVersion));
  material.add("templates", "3f1c0d9e6a2b4c5d8e7f6a5b4c3d2e1f");
  material.add(
      "source",
      "#include \"templates/probe/probe.cuh\"\ntemplate __global__ void kjit::probe_kernel<false>("
      "float*);\n");
  material.add("options", "--gpu-architecture=sm_90\n-std=c++17\n");
  material.add("arch", "sm_90");
  material.add("compiler", "nvrtc 13.0\n// Cuda compilation tools, release 13.0, V13.0.88\n");
  material.add("spec", "probe:heavy=0@sm_90");
  return material;
}

}  // namespace

TEST_CASE("cache key: the hashed bytes are the documented length-prefixed encoding") {
  KeyMaterial material;
  material.add("schema", "1");
  material.add("spec", "probe:heavy=0@sm_90");
  CHECK(material.encoding() == "6:schema1:14:spec19:probe:heavy=0@sm_90");
  CHECK(material.key() == support::xxh3_128(material.encoding()));
  CHECK(KeyMaterial{}.encoding().empty());
}

TEST_CASE("cache key: changes when any tag or value changes") {
  const KeyMaterial base = realistic_material();
  const std::string base_hex = base.key().hex();
  std::set<std::string> seen{base_hex};
  std::size_t variants = 0;
  for (std::size_t i = 0; i < base.fields.size(); ++i) {
    for (int which = 0; which < 6; ++which) {
      KeyMaterial changed = base;
      auto& [tag, value] = changed.fields[i];
      switch (which) {
        case 0:
          value += " ";
          break;
        case 1:
          value.back() = static_cast<char>(value.back() ^ 1);
          break;
        case 2:
          value.clear();
          break;
        case 3:
          tag += "x";
          break;
        case 4:
          tag[0] = static_cast<char>(tag[0] ^ 0x20);
          break;
        case 5:
          value.insert(value.begin(), '\n');
          break;
      }
      CAPTURE(i);
      CAPTURE(which);
      CHECK(changed.key().hex() != base_hex);
      seen.insert(changed.key().hex());
      ++variants;
    }
  }
  // Every variant differs from every other too (none of them collide).
  CHECK(seen.size() == variants + 1);

  SUBCASE("adding, dropping or reordering a field changes it") {
    KeyMaterial more = base;
    more.add("spec", "probe:heavy=0@sm_90");
    CHECK(more.key() != base.key());
    KeyMaterial fewer = base;
    fewer.fields.pop_back();
    CHECK(fewer.key() != base.key());
    KeyMaterial swapped = base;
    std::swap(swapped.fields[1], swapped.fields[2]);
    CHECK(swapped.key() != base.key());
  }
}

TEST_CASE("cache key: length prefixes keep field boundaries apart") {
  const auto key_of = [](std::vector<std::pair<std::string, std::string>> fields) {
    KeyMaterial material;
    material.fields = std::move(fields);
    return material.key();
  };
  CHECK(key_of({{"ab", "c"}}) != key_of({{"a", "bc"}}));
  CHECK(key_of({{"x", "ab"}, {"y", "c"}}) != key_of({{"x", "a"}, {"y", "bc"}}));
  CHECK(key_of({{"a", "b"}, {"c", "d"}}) != key_of({{"a", "b1:c1:d"}}));
  CHECK(key_of({{"", ""}}) != key_of({}));

  // Exhaustively over small materials built from tricky pieces: the encoding is injective.
  const std::vector<std::string> pieces = {"", "a", "b", "ab", ":", "1:", "0:", "1:a"};
  std::set<std::string> encodings;
  std::size_t count = 0;
  for (const auto& t1 : pieces) {
    for (const auto& v1 : pieces) {
      KeyMaterial one;
      one.add(t1, v1);
      encodings.insert(one.encoding());
      ++count;
      for (const auto& t2 : pieces) {
        for (const auto& v2 : pieces) {
          KeyMaterial two = one;
          two.add(t2, v2);
          encodings.insert(two.encoding());
          ++count;
        }
      }
    }
  }
  CHECK(encodings.size() == count);
}

TEST_CASE("cache key: depends on nothing but the fields") {
  const support::Hash128 before = realistic_material().key();
  const KeyMaterial copy = realistic_material();
  CHECK(copy.key() == before);

  // Paths, user and host never enter the key: change all of them and the key stays.
  const char* home = std::getenv("HOME");
  const std::string saved_home = home != nullptr ? home : "";
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof(cwd)) != nullptr);
  ::setenv("HOME", "/nonexistent/other-user", 1);
  ::setenv("USER", "someone-else", 1);
  ::setenv("KJIT_CACHE_DIR", "/elsewhere", 1);
  REQUIRE(::chdir("/") == 0);
  const support::Hash128 after = realistic_material().key();
  REQUIRE(::chdir(cwd) == 0);
  ::setenv("HOME", saved_home.c_str(), 1);
  ::unsetenv("KJIT_CACHE_DIR");
  CHECK(after == before);
}

TEST_CASE("cache key: hex round trip") {
  std::mt19937_64 rng(42);
  for (int i = 0; i < 1000; ++i) {
    const support::Hash128 key{rng(), i % 7 == 0 ? 0 : rng()};
    const std::string hex = key.hex();
    REQUIRE(hex.size() == 32);
    CHECK(hex.find_first_not_of("0123456789abcdef") == std::string::npos);
    support::Hash128 parsed;
    REQUIRE(support::Hash128::parse_hex(hex, &parsed));
    CHECK(parsed == key);
  }
  const support::Hash128 key = realistic_material().key();
  support::Hash128 parsed;
  REQUIRE(support::Hash128::parse_hex(key.hex(), &parsed));
  CHECK(parsed == key);
  CHECK(support::Hash128{0x0123456789abcdefULL, 0xfedcba9876543210ULL}.hex() ==
        "0123456789abcdeffedcba9876543210");

  CHECK_FALSE(support::Hash128::parse_hex(key.hex().substr(1), &parsed));
  CHECK_FALSE(support::Hash128::parse_hex(key.hex() + "0", &parsed));
  CHECK_FALSE(support::Hash128::parse_hex("0123456789ABCDEF0123456789abcdef", &parsed));
  CHECK_FALSE(support::Hash128::parse_hex("0123456789abcdeg0123456789abcdef", &parsed));
}

TEST_CASE("cache key: text has one line per field and maps back to one material") {
  const KeyMaterial material = realistic_material();
  const std::string text = material.text();
  CHECK(text.find("spec: probe:heavy=0@sm_90\n") != std::string::npos);
  CHECK(text.find("arch: sm_90\n") != std::string::npos);
  // Continuation lines of the multi-line source are indented.
  CHECK(text.find("source: #include \"templates/probe/probe.cuh\"\n  template") !=
        std::string::npos);

  const auto text_of = [](std::vector<std::pair<std::string, std::string>> fields) {
    KeyMaterial m;
    m.fields = std::move(fields);
    return m.text();
  };
  // A value that looks like another field is not another field.
  CHECK(text_of({{"a", "x\nb: y"}}) != text_of({{"a", "x"}, {"b", "y"}}));
  // A tag holding ": " is not a shorter tag with a longer value.
  CHECK(text_of({{"a: b", "c"}}) != text_of({{"a", "b: c"}}));
  // A tag with a leading space is not a continuation line.
  CHECK(text_of({{"a", "x"}, {" b", "y"}}) != text_of({{"a", "x\n b: y"}}));
  CHECK(text_of({{"a", "x\n"}}) != text_of({{"a", "x"}}));
  CHECK(text_of({{"a\nb", "c"}}) != text_of({{"a", ""}, {"b", "c"}}));
}

}  // namespace kjit::cache
