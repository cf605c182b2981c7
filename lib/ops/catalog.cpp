// SPDX-License-Identifier: Apache-2.0
#include "kjit/catalog.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kjit/error.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit {
namespace catalog_detail {

TensorView FakeMemory::tensor(DType dtype, std::initializer_list<std::int64_t> shape) {
  std::uint64_t bytes = size_of(dtype);
  for (std::int64_t dim : shape) bytes *= static_cast<std::uint64_t>(dim < 1 ? 1 : dim);
  void* data = reinterpret_cast<void*>(next_);
  next_ += (bytes + 2 * kAlign - 1) / kAlign * kAlign;
  return TensorView::contiguous(data, dtype, shape);
}

OpParam size(std::string name, std::string representative, std::string doc, SizeRule rule) {
  return OpParam{std::move(name),           true,           "",
                 std::move(representative), std::move(doc), std::move(rule)};
}

OpParam option(std::string name, std::string fallback, std::string doc) {
  std::string representative = fallback;
  return OpParam{std::move(name),           false,          std::move(fallback),
                 std::move(representative), std::move(doc), {}};
}

SizeRule at_least(std::int64_t min) { return SizeRule{.min = min}; }
SizeRule multiple_in(std::int64_t multiple, std::int64_t min, std::int64_t max) {
  return SizeRule{.min = min, .max = max, .multiple = multiple};
}
SizeRule one_of(std::vector<std::int64_t> values) {
  return SizeRule{.min = values.front(), .max = values.back(), .only = std::move(values)};
}
SizeRule dividing(std::string other) { return SizeRule{.divides = std::move(other)}; }

namespace {

struct Registry {
  std::vector<std::vector<OpInfo> (*)()> entries;
  bool sealed = false;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

CatalogRegistration::CatalogRegistration(std::vector<OpInfo> (*entries)()) {
  Registry& r = registry();
  if (r.sealed) {
    std::fputs("kjit: op catalog entries were registered after op_catalog() was first called\n",
               stderr);
    std::abort();
  }
  r.entries.push_back(entries);
}

namespace {

// Sizes up to 2^62, so that n + 1 stays inside int64; products of sizes are checked where an
// entry forms them, and TensorView::contiguous checks element counts.
constexpr std::int64_t kMaxSize = std::int64_t{1} << 62;

}  // namespace

std::int64_t get_int(const ShapeValues& values, const std::string& name) {
  const std::int64_t value = parse_int64(values.at(name), name);
  if (value < 0 || value > kMaxSize) {
    throw InvalidArgument(
        fmt::format("{} = {} is out of range; accepted: 0 to 2^62 ({})", name, value, kMaxSize));
  }
  return value;
}

DType get_dtype(const ShapeValues& values, const std::string& name) {
  return parse_dtype(values.at(name), name);
}

bool get_bool(const ShapeValues& values, const std::string& name) {
  const std::string& text = values.at(name);
  if (text == "1" || text == "true") return true;
  if (text == "0" || text == "false") return false;
  throw InvalidArgument(fmt::format("{} must be 0 or 1, got '{}'", name, text));
}

}  // namespace catalog_detail

bool SizeRule::accepts(std::int64_t value, const std::int64_t* divided) const {
  if (value < min || value > max || value % multiple != 0) return false;
  if (!only.empty() && std::find(only.begin(), only.end(), value) == only.end()) return false;
  if (!divides.empty() && divided != nullptr && (value == 0 || *divided % value != 0)) {
    return false;
  }
  return true;
}

std::string SizeRule::text() const {
  if (!only.empty()) return fmt::format("one of {}", fmt::join(only, ", "));
  std::string out;
  if (multiple > 1) {
    out = fmt::format("a multiple of {} in {}..{}", multiple, min, max);
  } else if (max < (std::int64_t{1} << 62)) {
    out = fmt::format("in {}..{}", min, max);
  } else {
    out = fmt::format(">= {}", min);
  }
  if (!divides.empty()) out += fmt::format(", dividing {}", divides);
  return out;
}

const std::vector<OpInfo>& op_catalog() {
  static const std::vector<OpInfo> ops = [] {
    std::vector<OpInfo> all;
    for (auto* entries : {&catalog_detail::merge_state_entries, &catalog_detail::gdn_decode_entries,
                          &catalog_detail::gdn_prefill_entries}) {
      for (OpInfo& op : entries()) all.push_back(std::move(op));
    }
    // Registered families by their first op's name: static initialization order across files
    // is not something `kjit plan --help` should depend on.
    std::vector<std::vector<OpInfo>> registered;
    catalog_detail::registry().sealed = true;
    for (auto* entries : catalog_detail::registry().entries) registered.push_back(entries());
    std::sort(registered.begin(), registered.end(), [](const auto& a, const auto& b) {
      return (a.empty() ? std::string() : a.front().name) <
             (b.empty() ? std::string() : b.front().name);
    });
    for (std::vector<OpInfo>& family : registered) {
      for (OpInfo& op : family) all.push_back(std::move(op));
    }
    return all;
  }();
  return ops;
}

const OpInfo& find_op(std::string_view name) {
  std::string names;
  for (const OpInfo& op : op_catalog()) {
    if (op.name == name) return op;
    names += names.empty() ? op.name : ", " + op.name;
  }
  throw InvalidArgument(fmt::format("unknown op '{}'; known: {}", name, names));
}

ShapeValues complete_shape_values(const OpInfo& op, ShapeValues values, bool require_sizes) {
  const auto is_param = [&](std::string_view name) {
    return std::any_of(op.params.begin(), op.params.end(),
                       [&](const OpParam& param) { return param.name == name; });
  };
  for (const auto& [key, value] : values) {
    if (!is_param(key)) {
      std::string accepted;
      for (const OpParam& param : op.params) {
        accepted += (accepted.empty() ? "" : ", ") + param.name;
      }
      throw InvalidArgument(
          fmt::format("{} has no parameter '{}'; accepted: {}", op.name, key, accepted));
    }
  }
  for (const OpParam& param : op.params) {
    if (values.count(param.name)) continue;
    if (param.size) {
      if (require_sizes) {
        std::string flag = param.name;
        for (char& c : flag) c = c == '_' ? '-' : c;
        throw InvalidArgument(fmt::format("{} needs --{} ({})", op.name, flag, param.doc));
      }
      continue;
    }
    values[param.name] = param.fallback;
  }
  // A default (or manifest representative) of "=other" takes the value of parameter `other`
  // ("--out-dtype [=dtype]"). A value naming no parameter is literal ("--dtype ==x",
  // "v_heads==128") and fails later as a clear error about its own argument.
  for (auto& [key, value] : values) {
    if (!value.starts_with('=')) continue;
    const std::string other = value.substr(1);
    if (!is_param(other)) continue;
    auto referred = values.find(other);
    if (referred != values.end() && !referred->second.starts_with('=')) {
      value = referred->second;
    }
  }
  return values;
}

Plan plan_from_shape(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device) {
  // Sizes out of their range are named here: the op, seeing tensors built from them, could
  // only report a consequence (heads = 0 makes zero-stride outputs that "overlap").
  for (const OpParam& param : op.params) {
    const auto it = values.find(param.name);
    if (!param.size || it == values.end()) continue;
    const std::int64_t value = parse_int64(it->second, param.name);
    if (value < param.rule.min || value > param.rule.max) {
      throw InvalidArgument(fmt::format("{}: {} = {} is out of range; {} must be {}", op.name,
                                        param.name, value, param.name, param.rule.text()));
    }
  }
  if (op.plan == nullptr) {
    throw InvalidArgument(fmt::format("op '{}' has no planner in the catalog", op.name));
  }
  return op.plan(op, values, device);
}

}  // namespace kjit
