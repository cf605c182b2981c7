// SPDX-License-Identifier: Apache-2.0
// The deployment-manifest parser (tools/manifest.cpp) on arbitrary text: a malformed manifest
// must be a kjit::Error naming the line; an accepted one is expanded into problems and, when
// there are few, planned for sm_90 — exactly what `kjit precompile` does with it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "manifest.hpp"

namespace {

/// Bounds the work per input: a line's problems are the cartesian product of its value
/// lists, so a short line can stand for millions of plans (legal, but not a fuzzing bug).
constexpr std::size_t kMaxProblemsPerLine = 32;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kjit;
  using namespace kjit::tool;
  Manifest manifest;
  try {
    manifest = parse_manifest(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const kjit::Error& error) {
    // Every parse error names where it is.
    kjit::fuzz::require(std::string(error.what()).rfind("fuzz:", 0) == 0,
                        std::string("manifest error without its line: ") + error.what());
    return 0;
  }
  static const kjit::DeviceLimits device = kjit::DeviceLimits::for_name("sm_90");
  for (const ManifestLine& line : manifest.lines) {
    kjit::fuzz::require(line.number >= 1, "line without a number");
    // Found by this target and fixed: a line of only "\f" or "\v" was kept with an empty op.
    kjit::fuzz::require(!line.op.empty(), "a manifest line without an op: " + line.text);
    std::size_t product = 1;
    bool reference = false;
    for (const auto& [key, values] : line.values) {
      kjit::fuzz::require(!values.empty(), "key without values: " + key);
      for (const std::string& value : values) reference = reference || value.starts_with('=');
      product *= values.size();
      if (product > kMaxProblemsPerLine) break;
    }
    if (product > kMaxProblemsPerLine) continue;
    // Found by this target and fixed: a value "=<name>" was taken as the tool's internal
    // "same as parameter <name>" default (std::out_of_range for "v_heads==128"); such values
    // are now literal and must fail as clear errors like any other.
    (void)reference;
    const OpInfo* op = nullptr;
    for (const OpInfo& known : op_catalog()) {
      if (known.name == line.op) op = &known;
    }
    if (op == nullptr) continue;
    try {
      std::size_t planned = 0;
      for (const ShapeValues& problem : line_problems(line, *op)) {
        if (++planned > kMaxProblemsPerLine) break;
        try {
          plan_from_shape(*op, problem, device);
        } catch (const kjit::Error&) {
          // An illegal or invalid problem is a clear error, which is all that is required.
        }
      }
    } catch (const kjit::Error&) {
    }
  }
  return 0;
}
