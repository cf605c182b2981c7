// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace kjit::codegen {

/// One file of templates/, embedded at build time.
struct EmbeddedTemplate {
  /// "templates/<path under templates/>": the file's path in the source tree, the name a stub
  /// #includes.
  const char* include_name;
  const char* contents;
};

extern const EmbeddedTemplate kEmbeddedTemplates[];
extern const std::size_t kEmbeddedTemplateCount;

/// Every embedded template file, sorted by include name.
std::span<const EmbeddedTemplate> embedded_templates() noexcept;
/// The file of that include name, nullptr if none.
const EmbeddedTemplate* find_template(std::string_view include_name) noexcept;
/// XXH3-128 hex over every (include name, contents) pair, length-prefixed: changes whenever
/// any template changes, so it is part of every cache key.
const std::string& template_set_digest();

}  // namespace kjit::codegen
