// SPDX-License-Identifier: Apache-2.0
#include "manifest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_set>

#include "cli.hpp"
#include "kjit/error.hpp"

namespace kjit::tool {
namespace {

// The same whitespace the word splitting below (operator>>) skips: a line of only a form feed is
// blank, not a line with an empty op.
constexpr std::string_view kBlank = " \t\r\f\v";

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(kBlank);
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(kBlank);
  return std::string(text.substr(first, last - first + 1));
}

/// Powers of two in [low, high].
std::vector<std::int64_t> powers_of_two(std::int64_t low, std::int64_t high) {
  std::vector<std::int64_t> out;
  for (std::int64_t p = 1; p > 0 && p <= high; p *= 2) {
    if (p >= low) out.push_back(p);
    if (p > high / 2) break;
  }
  return out;
}

/// The accepted values of [low, high] given as a sorted list: all of them when at most 16, else
/// the ends and the neighbours of each power of two.
std::vector<std::int64_t> pick_listed(const std::vector<std::int64_t>& legal) {
  if (legal.size() <= 16) return legal;
  std::set<std::int64_t> picked = {legal.front(), legal.back()};
  for (const std::int64_t p : powers_of_two(legal.front(), legal.back())) {
    const auto at = std::lower_bound(legal.begin(), legal.end(), p);
    if (at != legal.begin()) picked.insert(*(at - 1));
    if (at != legal.end()) {
      picked.insert(*at);  // p itself when accepted, else the next value above it
      if (*at == p && at + 1 != legal.end()) picked.insert(*(at + 1));
    }
  }
  return {picked.begin(), picked.end()};
}

/// The divisors of `n` (> 0) in [low, high], ascending.
std::vector<std::int64_t> divisors_in(std::int64_t n, std::int64_t low, std::int64_t high) {
  std::vector<std::int64_t> out;
  for (std::int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    for (const std::int64_t value : {d, n / d}) {
      if (value >= low && value <= high) out.push_back(value);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// The representatives of the range [low, high] under `rule`; empty when it accepts none.
std::vector<std::int64_t> rule_range(std::int64_t low, std::int64_t high, const SizeRule& rule,
                                     const std::int64_t* divided) {
  low = std::max(low, rule.min);
  high = std::min(high, rule.max);
  if (low > high) return {};
  // Divisors are listed by trial division up to sqrt(divided); beyond 2^40 (no real model has
  // such a size, and the op refuses it) the range is expanded as if unconstrained.
  const bool listed_divisors = !rule.divides.empty() && divided != nullptr && *divided > 0 &&
                               *divided <= (std::int64_t{1} << 40);
  if (!rule.only.empty() || listed_divisors) {
    std::vector<std::int64_t> candidates =
        rule.only.empty() ? divisors_in(*divided, low, high) : rule.only;
    std::vector<std::int64_t> legal;
    for (const std::int64_t value : candidates) {
      if (value >= low && value <= high && rule.accepts(value, divided)) legal.push_back(value);
    }
    std::sort(legal.begin(), legal.end());
    return pick_listed(legal);
  }
  // Multiples of m in [low, high]: arithmetic, since such a range may hold 2^62 values.
  const std::int64_t m = rule.multiple;
  const std::int64_t first = (low + m - 1) / m * m;
  const std::int64_t last = high / m * m;
  if (first > last) return {};
  std::set<std::int64_t> picked = {first, last};
  // Unsigned: the span of an unconstrained range may exceed INT64_MAX.
  const std::uint64_t span = static_cast<std::uint64_t>(last) - static_cast<std::uint64_t>(first);
  if (span / static_cast<std::uint64_t>(m) < 16) {
    for (std::int64_t value = first; value <= last; value += m) picked.insert(value);
  } else {
    for (const std::int64_t p : powers_of_two(first, last)) {
      const std::int64_t below = (p - 1) / m * m;
      const std::int64_t above = p / m * m + m;
      if (below >= first) picked.insert(below);
      if (p % m == 0) picked.insert(p);
      if (above <= last) picked.insert(above);
    }
  }
  return {picked.begin(), picked.end()};
}

/// Splits "a..b" into its ends; false for a single item.
bool parse_range(const std::string& item, std::int64_t* low, std::int64_t* high) {
  const auto dots = item.find("..");
  if (dots == std::string::npos) return false;
  *low = parse_int(item.substr(0, dots), "a range's start");
  *high = parse_int(item.substr(dots + 2), "a range's end");
  if (*high < *low) throw UsageError(fmt::format("range {} is empty", item));
  return true;
}

std::vector<std::string> first_occurrences(std::vector<std::string> values) {
  // Keep the first occurrence only: "64,1..128" must not plan 64 twice.
  std::vector<std::string> unique;
  std::unordered_set<std::string> seen;
  for (std::string& value : values) {
    if (seen.insert(value).second) unique.push_back(std::move(value));
  }
  return unique;
}

}  // namespace

std::vector<std::string> expand_values(std::string_view text, std::string_view name,
                                       const SizeRule& rule, const std::int64_t* divided) {
  std::vector<std::string> out;
  for (const std::string& item : split_list(text)) {
    std::int64_t low = 0, high = 0;
    if (!parse_range(item, &low, &high)) {
      out.push_back(item);
      continue;
    }
    const std::vector<std::int64_t> values = rule_range(low, high, rule, divided);
    if (values.empty()) {
      throw UsageError(fmt::format("{}={}: range {} holds no value the op accepts; {} must be {}{}",
                                   name, text, item, name, rule.text(),
                                   !rule.divides.empty() && divided != nullptr
                                       ? fmt::format(" (here {} = {})", rule.divides, *divided)
                                       : std::string()));
    }
    for (const std::int64_t value : values) out.push_back(std::to_string(value));
  }
  return first_occurrences(std::move(out));
}

std::vector<std::string> expand_values(std::string_view text) {
  // Without a rule every integer is accepted: the same expansion as an unconstrained size.
  return expand_values(text, "",
                       SizeRule{.min = std::numeric_limits<std::int64_t>::min(),
                                .max = std::numeric_limits<std::int64_t>::max()},
                       nullptr);
}

Manifest parse_manifest(std::string text, std::string name) {
  Manifest manifest;
  manifest.name = std::move(name);
  std::istringstream stream(text);
  std::string raw;
  int number = 0;
  while (std::getline(stream, raw)) {
    ++number;
    const std::string line = trim(std::string_view(raw).substr(0, raw.find('#')));
    if (line.empty()) continue;
    try {
      ManifestLine parsed;
      parsed.number = number;
      parsed.text = line;
      std::istringstream words(line);
      words >> parsed.op;
      std::string word;
      while (words >> word) {
        const auto eq = word.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == word.size()) {
          throw UsageError(fmt::format("'{}' is not key=values", word));
        }
        const std::string key = word.substr(0, eq);
        if (parsed.values.count(key)) throw UsageError(fmt::format("{} given twice", key));
        parsed.texts[key] = word.substr(eq + 1);
        parsed.values[key] = expand_values(parsed.texts[key]);
        if (parsed.values[key].empty()) throw UsageError(fmt::format("{} has no values", key));
      }
      manifest.lines.push_back(std::move(parsed));
    } catch (const UsageError& error) {
      throw UsageError(fmt::format("{}:{}: {}", manifest.name, number, error.what()));
    }
  }
  manifest.text = std::move(text);
  return manifest;
}

Manifest read_manifest(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw UsageError(fmt::format("cannot read manifest {}", path));
  std::ostringstream text;
  text << file.rdbuf();
  return parse_manifest(text.str(), path);
}

std::vector<ShapeValues> line_problems(const ManifestLine& line, const OpInfo& op) {
  const auto param_of = [&](const std::string& name) -> const OpParam* {
    for (const OpParam& param : op.params) {
      if (param.name == name) return &param;
    }
    return nullptr;
  };
  // Unknown keys are refused by complete_values; here every parameter gets its value list. A
  // size whose rule divides another size is expanded last, once per value of that other size.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  std::vector<const OpParam*> dependent;
  ShapeValues fixed;
  for (const auto& [key, values] : line.values) {
    const OpParam* param = param_of(key);
    const auto text = line.texts.find(key);
    std::vector<std::string> expanded = values;
    if (param != nullptr && param->size && text != line.texts.end()) {
      if (!param->rule.divides.empty() && line.values.count(param->rule.divides) != 0) {
        dependent.push_back(param);
        continue;
      }
      expanded = expand_values(text->second, key, param->rule, nullptr);
    }
    if (expanded.size() == 1) {
      fixed[key] = expanded.front();
    } else {
      axes.emplace_back(key, std::move(expanded));
    }
  }
  for (const OpParam& param : op.params) {
    if (line.values.count(param.name) || param.representative.empty()) continue;
    std::vector<std::string> values = split_list(param.representative);
    if (values.size() == 1) {
      fixed[param.name] = values.front();
    } else {
      axes.emplace_back(param.name, std::move(values));
    }
  }
  complete_shape_values(op, fixed, false);  // refuses unknown keys before any planning
  std::vector<ShapeValues> problems = {fixed};
  const auto extend = [&](const std::string& key, const auto& values_of) {
    std::vector<ShapeValues> next;
    for (const ShapeValues& problem : problems) {
      for (const std::string& value : values_of(problem)) {
        ShapeValues extended = problem;
        extended[key] = value;
        next.push_back(std::move(extended));
      }
    }
    problems = std::move(next);
  };
  // (An element, not a structured binding: clang before 16 cannot capture a binding.)
  for (const auto& axis : axes) {
    const std::vector<std::string>& values = axis.second;
    extend(axis.first,
           [&](const ShapeValues&) -> const std::vector<std::string>& { return values; });
  }
  for (const OpParam* param : dependent) {
    const std::string& text = line.texts.at(param->name);
    extend(param->name, [&](const ShapeValues& problem) {
      // The divided size as this problem has it; a value that is not an integer is left for
      // the op to refuse, and constrains nothing here.
      std::int64_t divided = 0;
      const std::string& other = problem.at(param->rule.divides);
      const auto [end, error] = std::from_chars(other.data(), other.data() + other.size(), divided);
      const bool known = error == std::errc() && end == other.data() + other.size();
      return expand_values(text, param->name, param->rule, known ? &divided : nullptr);
    });
  }
  for (ShapeValues& problem : problems)
    problem = complete_shape_values(op, std::move(problem), true);
  return problems;
}

std::string problem_text(const ShapeValues& values) {
  std::string out;
  for (const auto& [key, value] : values) {
    if (value.empty()) continue;
    out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, value);
  }
  return out;
}

Enumeration enumerate_specs(const Manifest& manifest, const std::vector<DeviceLimits>& devices) {
  Enumeration result;
  std::unordered_set<std::string> seen;
  for (const ManifestLine& line : manifest.lines) {
    const OpInfo* op = nullptr;
    for (const OpInfo& known : op_catalog()) {
      if (known.name == line.op) op = &known;
    }
    const std::string where = fmt::format("{}:{}", manifest.name, line.number);
    if (op == nullptr) {
      try {
        find_op(line.op);
      } catch (const InvalidArgument& error) {
        throw UsageError(fmt::format("{}: {}", where, error.what()));
      }
    }
    std::vector<ShapeValues> problems;
    try {
      problems = line_problems(line, *op);
    } catch (const InvalidArgument& error) {  // the manifest's own errors and the catalog's
      throw UsageError(fmt::format("{}: {}", where, error.what()));
    }
    for (const DeviceLimits& device : devices) {
      for (const ShapeValues& problem : problems) {
        Plan plan;
        const auto context = [&] {
          return fmt::format("{}: {} {} on {}", where, line.op, problem_text(problem),
                             device.arch.str());
        };
        try {
          plan = plan_from_shape(*op, problem, device);
        } catch (const UsageError& error) {
          throw UsageError(fmt::format("{}: {}", context(), error.what()));
        } catch (const PlanError& error) {
          throw PlanError(fmt::format("{}: {}", context(), error.what()));
        } catch (const InvalidArgument& error) {
          throw InvalidArgument(fmt::format("{}: {}", context(), error.what()));
        }
        ++result.problems;
        for (const PlannedLaunch& launch : plan.launches) {
          if (seen.insert(launch.spec.str()).second) result.specs.push_back(launch.spec);
        }
      }
    }
  }
  return result;
}

}  // namespace kjit::tool
