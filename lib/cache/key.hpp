// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/hash.hpp"

namespace kjit::cache {

/// Bumped whenever the meaning of a key field changes: every old entry then misses.
inline constexpr int kKeySchemaVersion = 1;

/// The tagged fields a cache key is computed from. Order matters and is fixed by the caller
/// (Runtime): schema, templates, source, options, arch, compiler, spec.
struct KeyMaterial {
  std::vector<std::pair<std::string, std::string>> fields;

  void add(std::string tag, std::string value) { fields.emplace_back(std::move(tag), std::move(value)); }
  /// XXH3-128 over the length-prefixed encoding of every (tag, value).
  support::Hash128 key() const;
  /// "tag: value" lines, stored in the entry so that a miss can be explained.
  std::string text() const;
};

}  // namespace kjit::cache
