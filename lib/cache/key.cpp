// SPDX-License-Identifier: Apache-2.0
#include "cache/key.hpp"

#include <fmt/format.h>

#include <iterator>

namespace kjit::cache {
namespace {

void append_escaped_tag(std::string& out, std::string_view tag) {
  for (std::size_t i = 0; i < tag.size(); ++i) {
    const auto c = static_cast<unsigned char>(tag[i]);
    // ':' would let "a: b" + "c" read as "a" + "b: c"; a leading space would read as a
    // continuation line; control characters would split or hide the line.
    const bool escape = c == '\\' || c == ':' || c < 0x20 || c == 0x7f || (i == 0 && c == ' ');
    if (escape) {
      fmt::format_to(std::back_inserter(out), "\\x{:02x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
}

}  // namespace

std::string KeyMaterial::encoding() const {
  std::string out;
  std::size_t total = 0;
  for (const auto& [tag, value] : fields) total += tag.size() + value.size() + 16;
  out.reserve(total);
  for (const auto& [tag, value] : fields) {
    fmt::format_to(std::back_inserter(out), "{}:", tag.size());
    out += tag;
    fmt::format_to(std::back_inserter(out), "{}:", value.size());
    out += value;
  }
  return out;
}

support::Hash128 KeyMaterial::key() const { return support::xxh3_128(encoding()); }

std::string KeyMaterial::text() const {
  std::string out;
  for (const auto& [tag, value] : fields) {
    append_escaped_tag(out, tag);
    out += ": ";
    for (const char c : value) {
      out.push_back(c);
      // Every line of a multi-line value after the first starts with two spaces, which no
      // tag line can (a tag's leading space is escaped).
      if (c == '\n') out += "  ";
    }
    out.push_back('\n');
  }
  return out;
}

}  // namespace kjit::cache
