// SPDX-License-Identifier: Apache-2.0
#include "manifest.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
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

void add_range(std::int64_t low, std::int64_t high, std::vector<std::int64_t>* out) {
  if (high - low < 16) {
    for (std::int64_t value = low; value <= high; ++value) out->push_back(value);
    return;
  }
  std::set<std::int64_t> picked = {low, high};
  for (std::int64_t p = 1; p > 0 && p <= high; p *= 2) {
    for (std::int64_t value : {p - 1, p, p + 1}) {
      if (value >= low && value <= high) picked.insert(value);
    }
  }
  out->insert(out->end(), picked.begin(), picked.end());
}

}  // namespace

std::vector<std::string> expand_values(std::string_view text) {
  std::vector<std::string> out;
  for (const std::string& item : split_list(text)) {
    const auto dots = item.find("..");
    if (dots == std::string::npos) {
      out.push_back(item);
      continue;
    }
    const std::int64_t low = parse_int(item.substr(0, dots), "a range's start");
    const std::int64_t high = parse_int(item.substr(dots + 2), "a range's end");
    if (high < low) throw UsageError(fmt::format("range {} is empty", item));
    std::vector<std::int64_t> values;
    add_range(low, high, &values);
    for (std::int64_t value : values) out.push_back(std::to_string(value));
  }
  // Keep the first occurrence only: "64,1..128" must not plan 64 twice.
  std::vector<std::string> unique;
  std::unordered_set<std::string> seen;
  for (std::string& value : out) {
    if (seen.insert(value).second) unique.push_back(std::move(value));
  }
  return unique;
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
        parsed.values[key] = expand_values(word.substr(eq + 1));
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
  // Unknown keys are refused by complete_values; here every parameter gets its value list.
  std::vector<std::pair<std::string, std::vector<std::string>>> axes;
  ShapeValues fixed;
  for (const auto& [key, values] : line.values) {
    if (values.size() == 1) {
      fixed[key] = values.front();
    } else {
      axes.emplace_back(key, values);
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
  complete_values(op, fixed, false);  // refuses unknown keys before any planning
  std::vector<ShapeValues> problems = {fixed};
  for (const auto& [key, values] : axes) {
    std::vector<ShapeValues> next;
    next.reserve(problems.size() * values.size());
    for (const ShapeValues& problem : problems) {
      for (const std::string& value : values) {
        ShapeValues extended = problem;
        extended[key] = value;
        next.push_back(std::move(extended));
      }
    }
    problems = std::move(next);
  }
  for (ShapeValues& problem : problems) problem = complete_values(op, std::move(problem), true);
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
    for (const OpInfo& known : known_ops()) {
      if (known.name == line.op) op = &known;
    }
    const std::string where = fmt::format("{}:{}", manifest.name, line.number);
    if (op == nullptr) {
      try {
        find_op(line.op);
      } catch (const UsageError& error) {
        throw UsageError(fmt::format("{}: {}", where, error.what()));
      }
    }
    if (!op->available) {
      result.notes.push_back(
          fmt::format("{}: skipped: op {} is not available in this build", where, line.op));
      continue;
    }
    std::vector<ShapeValues> problems;
    try {
      problems = line_problems(line, *op);
    } catch (const UsageError& error) {
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
          plan = plan_op(*op, problem, device);
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
