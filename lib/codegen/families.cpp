// SPDX-License-Identifier: Apache-2.0
#include "codegen/families.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "codegen/embedded_templates.hpp"
#include "codegen/family_decls.hpp"
#include "kjit/error.hpp"
#include "kjit/source.hpp"

namespace kjit::codegen {
namespace {

struct Registry {
  std::vector<FamilyDecl (*)()> makers;
  bool sealed = false;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

FamilyRegistration::FamilyRegistration(FamilyDecl (*make)()) {
  Registry& r = registry();
  if (r.sealed) {
    std::fputs("kjit: a kernel family was registered after families() was first called\n", stderr);
    std::abort();
  }
  r.makers.push_back(make);
}

const std::vector<FamilyDecl>& families() {
  static const std::vector<FamilyDecl> table = [] {
    std::vector<FamilyDecl> all = {
        probe_family(),           merge_state_family(),
        gdn_decode_family(),      gdn_decode_order_family(),
        gdn_decode_conv_family(), bench_family(),
        bench_slot_rmw_family(),
    };
    // Registered families in name order: static initialization order across files is not
    // something a listing should depend on.
    std::vector<FamilyDecl> registered;
    registry().sealed = true;
    for (auto* make : registry().makers) registered.push_back(make());
    std::sort(registered.begin(), registered.end(),
              [](const FamilyDecl& a, const FamilyDecl& b) { return a.name < b.name; });
    for (FamilyDecl& family : registered) all.push_back(std::move(family));
    return all;
  }();
  return table;
}

const FamilyDecl& find_family(std::string_view name) {
  for (const FamilyDecl& family : families()) {
    if (family.name == name) return family;
  }
  // The list of known names only on failure: every plan looks its families up.
  std::string known;
  for (const FamilyDecl& family : families()) {
    known += fmt::format("{}{}", known.empty() ? "" : ", ", family.name);
  }
  throw InvalidArgument(
      fmt::format("kernel family '{}' does not exist; known families: {}", name, known));
}

std::string_view device_type_name(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return "__half";
    case DType::bf16:
      return "__nv_bfloat16";
    case DType::f32:
      return "float";
    case DType::f64:
      return "double";
    case DType::i32:
      return "int";
    case DType::i64:
      return "long long";
    case DType::u8:
      return "unsigned char";
    case DType::e4m3:
      return "__nv_fp8_e4m3";
  }
  return "void";
}

std::string name_expression(const KernelSpec& spec) {
  const FamilyDecl& family = find_family(spec.family);
  std::string out = fmt::format("&{}<", family.kernel);
  // Trailing parameters a spec leaves out are left at the template's default: the name
  // expression (and so the stub and the cache key) of such a spec is what it was before they
  // were declared.
  std::size_t count = family.params.size();
  while (count > 0 && !family.params[count - 1].omitted_default.empty() &&
         !spec.has(family.params[count - 1].name)) {
    --count;
  }
  for (std::size_t i = 0; i < count; ++i) {
    const ParamDecl& decl = family.params[i];
    const std::string value = spec.get_or(decl.name, decl.omitted_default);
    if (i > 0) out += ", ";
    switch (decl.kind) {
      case ParamKind::dtype:
        out += device_type_name(parse_dtype(value, decl.name));
        break;
      case ParamKind::integer:
        out += value;
        break;
      case ParamKind::boolean:
        out += value == "1" ? "true" : "false";
        break;
      case ParamKind::choice:
        for (std::size_t c = 0; c < decl.choices.size(); ++c) {
          if (decl.choices[c] == value) out += decl.rendered.at(c);
        }
        break;
    }
  }
  out += ">";
  return out;
}

std::string stub_source(const KernelSpec& spec) {
  const FamilyDecl& family = find_family(spec.family);
  // The entry point is instantiated through its NVRTC name expression, so the stub is only the
  // include: every kernel body lives in a real .cuh file under templates/.
  return fmt::format(
      "// kjit specialization {}\n"
      "// entry point: {}\n"
      "#include \"{}\"\n",
      spec.str(), name_expression(spec), family.include);
}

}  // namespace kjit::codegen

namespace kjit {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/// The "templates/..." names of the lines `<space>#<space>include<space>"templates/<name>"` of
/// `text` (the include name of a template is its path in the source tree).
std::vector<std::string> template_includes(std::string_view text) {
  std::vector<std::string> names;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find('\n', at);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    const auto skip_space = [&] {
      while (!line.empty() && is_space(line.front())) line.remove_prefix(1);
    };
    skip_space();
    if (!line.starts_with('#')) continue;
    line.remove_prefix(1);
    skip_space();
    if (!line.starts_with("include")) continue;
    line.remove_prefix(7);
    skip_space();
    constexpr std::string_view kPrefix = "templates/";
    if (!line.starts_with('"') || !line.substr(1).starts_with(kPrefix)) continue;
    line.remove_prefix(1);
    const std::size_t quote = line.find('"');
    // "templates/" and at least one character
    if (quote == std::string_view::npos || quote <= kPrefix.size()) continue;
    names.emplace_back(line.substr(0, quote));
  }
  return names;
}

}  // namespace

std::vector<SourceFile> kernel_source_files(const KernelSpec& spec) {
  std::vector<SourceFile> files;
  files.push_back({"stub", codegen::stub_source(spec)});
  std::vector<std::string> pending = template_includes(files.front().text);
  std::set<std::string> shown;
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const std::string name = pending[i];
    if (!shown.insert(name).second) continue;
    const codegen::EmbeddedTemplate* file = codegen::find_template(name);
    if (file == nullptr) continue;  // not embedded (none is; a toolkit header would not be)
    files.push_back({name, std::string(file->contents)});
    for (std::string& nested : template_includes(file->contents))
      pending.push_back(std::move(nested));
  }
  return files;
}

}  // namespace kjit
