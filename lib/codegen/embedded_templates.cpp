// SPDX-License-Identifier: Apache-2.0
#include "codegen/embedded_templates.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "support/hash.hpp"

namespace kjit::codegen {

std::span<const EmbeddedTemplate> embedded_templates() noexcept {
  return {kEmbeddedTemplates, kEmbeddedTemplateCount};
}

const EmbeddedTemplate* find_template(std::string_view include_name) noexcept {
  for (const EmbeddedTemplate& t : embedded_templates()) {
    if (include_name == t.include_name) return &t;
  }
  return nullptr;
}

const std::string& template_set_digest() {
  static const std::string digest = [] {
    std::string material;
    for (const EmbeddedTemplate& t : embedded_templates()) {
      // Length prefixes keep ("ab","c") and ("a","bc") apart.
      for (const char* field : {t.include_name, t.contents}) {
        material += std::to_string(std::strlen(field));
        material += ':';
        material += field;
      }
    }
    return support::xxh3_128(material).hex();
  }();
  return digest;
}

}  // namespace kjit::codegen
