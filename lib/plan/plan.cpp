// SPDX-License-Identifier: Apache-2.0
// Printing a Plan: explain() for people, to_json() for tools (`kjit plan --json`, logs).
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "kjit/plan.hpp"
#include "plan/limits.hpp"

namespace kjit {
namespace {

/// A JSON string literal. Control characters are escaped as \uXXXX so that a spec or a reason
/// with odd bytes still yields valid JSON; other bytes (UTF-8) pass through.
std::string json_string(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string dim3_text(const Dim3& d) { return fmt::format("({}, {}, {})", d.x, d.y, d.z); }

std::string dim3_json(const Dim3& d) { return fmt::format("[{},{},{}]", d.x, d.y, d.z); }

}  // namespace

std::string Plan::explain() const {
  std::string out = fmt::format("op {}: mode {}\n", op, mode.empty() ? "(none)" : mode);
  out += fmt::format("device {} ({}, {} SMs, {} threads/block, {} bytes smem/block opt-in)\n",
                     device.name, device.arch.str(), device.sm_count, device.max_threads_per_block,
                     device.max_smem_per_block_optin);
  if (!reasons.empty()) {
    out += "reasons:\n";
    for (const std::string& reason : reasons) out += fmt::format("  - {}\n", reason);
  }
  for (std::size_t i = 0; i < launches.size(); ++i) {
    const PlannedLaunch& launch = launches[i];
    out += fmt::format("launch {} of {}: {}\n", i + 1, launches.size(), launch.spec.str());
    out += fmt::format(
        "  grid {} block {} dynamic smem {} bytes{}{}\n", dim3_text(launch.shape.grid),
        dim3_text(launch.shape.block), launch.shape.dynamic_smem,
        launch.shape.cluster.count() > 1 ? ", cluster " + dim3_text(launch.shape.cluster)
                                         : std::string(),
        launch.shape.overlaps_previous
            ? ", starts during launch " + std::to_string(i) + " (programmatic dependent launch)"
            : std::string());
    for (const LimitCheck& check : launch.checks) {
      out +=
          fmt::format("  {} {}: {} / {} (margin {})\n", check.ok() ? "ok  " : "FAIL", check.limit,
                      check.requested, check.allowed, check.allowed - check.requested);
    }
  }
  return out;
}

std::string Plan::to_json() const {
  std::string out = "{";
  out +=
      fmt::format("\"op\":{},\"mode\":{},\"arch\":{},\"device\":{},\"reasons\":[", json_string(op),
                  json_string(mode), json_string(device.arch.str()), json_string(device.name));
  for (std::size_t i = 0; i < reasons.size(); ++i) {
    if (i > 0) out += ',';
    out += json_string(reasons[i]);
  }
  out += "],\"launches\":[";
  for (std::size_t i = 0; i < launches.size(); ++i) {
    const PlannedLaunch& launch = launches[i];
    if (i > 0) out += ',';
    out += fmt::format(
        "{{\"spec\":{},\"grid\":{},\"block\":{},\"dynamic_smem\":{},\"overlaps_previous\":{},"
        "{}\"checks\":[",
        json_string(launch.spec.str()), dim3_json(launch.shape.grid), dim3_json(launch.shape.block),
        launch.shape.dynamic_smem, launch.shape.overlaps_previous ? "true" : "false",
        // Only clustered launches name their cluster: every other plan's JSON stays as it was.
        launch.shape.cluster.count() > 1
            ? fmt::format("\"cluster\":{},", dim3_json(launch.shape.cluster))
            : std::string());
    for (std::size_t j = 0; j < launch.checks.size(); ++j) {
      const LimitCheck& check = launch.checks[j];
      if (j > 0) out += ',';
      out += fmt::format("{{\"limit\":{},\"requested\":{},\"allowed\":{}}}",
                         json_string(check.limit), check.requested, check.allowed);
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace kjit
