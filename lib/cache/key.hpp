// SPDX-License-Identifier: Apache-2.0
// Cache keys: XXH3-128 over tagged, length-prefixed fields. The fields are exactly what makes
// two compiles differ (schema, templates, source, options, arch, compiler, spec) and nothing
// about where or by whom they ran, so one cache can be shared, shipped and precomputed.
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
/// (Runtime): schema, templates, source, options, arch, compiler, spec. Never add paths, user
/// or host names: they would make equal compiles miss each other's entries.
struct KeyMaterial {
  std::vector<std::pair<std::string, std::string>> fields;

  /// Appends one field; the same tag may appear more than once (each occurrence counts).
  void add(std::string tag, std::string value) {
    fields.emplace_back(std::move(tag), std::move(value));
  }
  /// The exact bytes that are hashed: "<len>:<tag><len>:<value>" for every field in order,
  /// lengths in decimal bytes. The prefixes make the encoding injective: ("ab", "c") and
  /// ("a", "bc") never collide.
  std::string encoding() const;
  /// XXH3-128 of encoding().
  support::Hash128 key() const;
  /// One "tag: value" line per field, stored in the entry so that a miss can be explained.
  /// A value's continuation lines are indented by two spaces; a tag has '\\', ':', control
  /// characters and a leading space escaped as \xNN, so the text maps back to one material.
  std::string text() const;
};

}  // namespace kjit::cache
