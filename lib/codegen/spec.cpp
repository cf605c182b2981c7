// SPDX-License-Identifier: Apache-2.0
#include <fmt/format.h>

#include <algorithm>
#include <charconv>

#include "codegen/families.hpp"
#include "kjit/error.hpp"
#include "kjit/spec.hpp"
#include "support/hash.hpp"

namespace kjit {
namespace {

std::string join_choices(const std::vector<std::string_view>& items) {
  std::string out;
  for (std::string_view item : items) out += fmt::format("{}{}", out.empty() ? "" : ", ", item);
  return out;
}

// Checks one value against its declaration and returns it in canonical spelling.
std::string canonical_value(const codegen::FamilyDecl& family, const codegen::ParamDecl& decl,
                            const std::string& value) {
  using codegen::ParamKind;
  switch (decl.kind) {
    case ParamKind::dtype: {
      const DType dtype =
          parse_dtype(value, fmt::format("{} parameter '{}'", family.name, decl.name));
      const std::string name(to_string(dtype));
      if (!decl.choices.empty() &&
          std::find(decl.choices.begin(), decl.choices.end(), name) == decl.choices.end()) {
        throw InvalidArgument(fmt::format("{} parameter '{}' = {} is not supported; accepted: {}",
                                          family.name, decl.name, value,
                                          join_choices(decl.choices)));
      }
      return name;
    }
    case ParamKind::integer: {
      std::int64_t number = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
      if (ec != std::errc() || ptr != value.data() + value.size()) {
        throw InvalidArgument(fmt::format("{} parameter '{}' = '{}' is not an integer", family.name,
                                          decl.name, value));
      }
      if (number < decl.min || number > decl.max || number % decl.multiple_of != 0) {
        throw InvalidArgument(fmt::format(
            "{} parameter '{}' = {} is out of range; accepted: {}..{}{}", family.name, decl.name,
            number, decl.min, decl.max,
            decl.multiple_of > 1 ? fmt::format(", a multiple of {}", decl.multiple_of) : ""));
      }
      return std::to_string(number);
    }
    case ParamKind::boolean:
      if (value == "1" || value == "true") return "1";
      if (value == "0" || value == "false") return "0";
      throw InvalidArgument(fmt::format("{} parameter '{}' = '{}' is not a boolean; accepted: 0, 1",
                                        family.name, decl.name, value));
    case ParamKind::choice:
      if (std::find(decl.choices.begin(), decl.choices.end(), value) == decl.choices.end()) {
        throw InvalidArgument(fmt::format("{} parameter '{}' = '{}' is not accepted; accepted: {}",
                                          family.name, decl.name, value,
                                          join_choices(decl.choices)));
      }
      return value;
  }
  return value;
}

}  // namespace

KernelSpec KernelSpec::make(std::string_view family_name,
                            std::vector<std::pair<std::string, std::string>> params, Arch arch) {
  const codegen::FamilyDecl& family = codegen::find_family(family_name);
  if (arch.sm() < family.min_sm) {
    throw InvalidArgument(fmt::format("{} needs sm_{} or newer; the target is {}", family.name,
                                      family.min_sm, arch.str()));
  }
  KernelSpec spec;
  spec.family = std::string(family.name);
  spec.arch = arch;
  for (const auto& param : params) {
    // Not a structured binding: clang before 16 cannot capture one in a lambda.
    const std::string& key = param.first;
    const bool declared = std::any_of(family.params.begin(), family.params.end(),
                                      [&](const codegen::ParamDecl& d) { return d.name == key; });
    if (!declared) {
      std::vector<std::string_view> names;
      for (const codegen::ParamDecl& d : family.params) names.push_back(d.name);
      throw InvalidArgument(fmt::format("{} has no parameter '{}'; its parameters are: {}",
                                        family.name, key, join_choices(names)));
    }
  }
  for (const codegen::ParamDecl& decl : family.params) {
    const auto found = std::find_if(params.begin(), params.end(),
                                    [&](const auto& kv) { return kv.first == decl.name; });
    if (found == params.end()) {
      if (!decl.omitted_default.empty()) continue;
      throw InvalidArgument(
          fmt::format("{} spec is missing parameter '{}' ({})", family.name, decl.name, decl.doc));
    }
    if (std::count_if(params.begin(), params.end(),
                      [&](const auto& kv) { return kv.first == decl.name; }) > 1) {
      throw InvalidArgument(
          fmt::format("{} spec gives parameter '{}' more than once", family.name, decl.name));
    }
    std::string value = canonical_value(family, decl, found->second);
    if (!decl.omitted_default.empty() && value == decl.omitted_default) continue;
    spec.params.emplace_back(std::string(decl.name), std::move(value));
  }
  // Joint constraints, so that a spec the template would reject by static_assert fails here,
  // naming the parameters, rather than as an NVRTC compile error.
  if (family.check != nullptr) {
    if (const std::string why = family.check(spec); !why.empty()) {
      throw InvalidArgument(fmt::format("{}: {}", spec.str(), why));
    }
  }
  return spec;
}

KernelSpec KernelSpec::parse(std::string_view text) {
  const std::string original(text);
  const std::size_t colon = text.find(':');
  const std::size_t at = text.rfind('@');
  if (colon == std::string_view::npos || at == std::string_view::npos || at < colon) {
    throw InvalidArgument(
        fmt::format("spec '{}' is malformed; expected <family>:<key>=<value>,...@<arch>, e.g. "
                    "probe:heavy=0@sm_90 (an op's specs are listed by `kjit plan <op> ...` and "
                    "kjit.plan(...).specs)",
                    original));
  }
  const std::string_view family = text.substr(0, colon);
  const std::string_view body = text.substr(colon + 1, at - colon - 1);
  const Arch arch = Arch::parse(text.substr(at + 1));
  std::vector<std::pair<std::string, std::string>> params;
  std::size_t start = 0;
  while (start < body.size()) {
    std::size_t end = body.find(',', start);
    if (end == std::string_view::npos) end = body.size();
    const std::string_view item = body.substr(start, end - start);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      throw InvalidArgument(
          fmt::format("spec '{}': parameter '{}' is not key=value", original, item));
    }
    params.emplace_back(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    start = end + 1;
  }
  return make(family, std::move(params), arch);
}

std::string KernelSpec::str() const {
  // Plain appends, not fmt: this text is the in-memory cache key, built on every lookup.
  std::size_t size = family.size() + 16;
  for (const auto& [key, value] : params) size += key.size() + value.size() + 2;
  std::string out;
  out.reserve(size);
  out += family;
  out += ':';
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (i > 0) out += ',';
    out += params[i].first;
    out += '=';
    out += params[i].second;
  }
  out += '@';
  out += arch.str();
  return out;
}

const std::string& KernelSpec::get(std::string_view key) const {
  for (const auto& [name, value] : params) {
    if (name == key) return value;
  }
  throw InvalidArgument(fmt::format("spec {} has no parameter '{}'", str(), key));
}

bool KernelSpec::has(std::string_view key) const {
  return std::any_of(params.begin(), params.end(), [&](const auto& kv) { return kv.first == key; });
}

std::string KernelSpec::get_or(std::string_view key, std::string_view fallback) const {
  for (const auto& [name, value] : params) {
    if (name == key) return value;
  }
  return std::string(fallback);
}

std::int64_t KernelSpec::get_int(std::string_view key) const {
  const std::string& value = get(key);
  std::int64_t number = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (ec != std::errc() || ptr != value.data() + value.size()) {
    throw InvalidArgument(
        fmt::format("spec {}: parameter '{}' = '{}' is not an integer", str(), key, value));
  }
  return number;
}

std::size_t KernelSpecHash::operator()(const KernelSpec& spec) const noexcept {
  return static_cast<std::size_t>(support::xxh3_64(spec.str()));
}

}  // namespace kjit
