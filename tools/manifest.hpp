// SPDX-License-Identifier: Apache-2.0
// Deployment manifests: one op-level line per shape range, e.g.
//   merge_state dtype=bf16 head_dim=64,128 heads=1..256
// enumerated into concrete problems, planned for each target, and reduced to the distinct
// KernelSpecs of all launches: what a bundle must hold.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/spec.hpp"

namespace kjit::tool {

/// One non-comment line of a manifest.
struct ManifestLine {
  /// 1-based line number in the manifest text.
  int number = 0;
  std::string text;
  std::string op;
  /// Parameter -> the values it takes (ranges expanded without the op's rules).
  std::map<std::string, std::vector<std::string>> values;
  /// Parameter -> its value text as written ("64..512,1024"): line_problems() expands ranges
  /// again with the op's rule for that parameter.
  std::map<std::string, std::string> texts;
};

struct Manifest {
  std::string name;
  std::string text;
  std::vector<ManifestLine> lines;
};

/// Parses a manifest: `#` starts a comment; each line is an op name and `key=values` items,
/// values being comma separated items, each a word, an integer or an inclusive range `a..b`.
/// UsageError "<name>:<line>: ..." for a malformed line. Ops are not checked here.
Manifest parse_manifest(std::string text, std::string name);
/// Reads and parses a manifest file; UsageError if it cannot be read.
Manifest read_manifest(const std::string& path);

/// The values an item list stands for. A range `a..b` of at most 16 values is taken whole;
/// a longer one by representatives: both ends, every power of two inside and its neighbours
/// (the values where grid shapes and tile counts change).
std::vector<std::string> expand_values(std::string_view text);
/// As above, with a range standing only for the values `rule` accepts (`divided`: the value of
/// the size the rule's `divides` names, or nullptr): at most 16 of them whole, else the first
/// and last, and around every power of two inside, the nearest accepted values below and above
/// it and the power itself when accepted. Single items are kept as written (the op judges
/// them). UsageError "<name>=<text>: range a..b holds no value ... accepts" for a range with
/// no accepted value.
std::vector<std::string> expand_values(std::string_view text, std::string_view name,
                                       const SizeRule& rule, const std::int64_t* divided);

/// Every concrete problem of a line: the cartesian product of its values (ranges of sizes
/// expanded by each size's rule, those of a size that divides another once per value of that
/// other), with the op's representative values for sizes the line omits and defaults for the
/// rest.
std::vector<ShapeValues> line_problems(const ManifestLine& line, const OpInfo& op);

/// Distinct specs of a manifest for some targets, in first-seen order.
struct Enumeration {
  std::vector<KernelSpec> specs;
  /// Problems planned (over all lines and targets).
  std::size_t problems = 0;
  /// Lines skipped, with why (an op missing from this build).
  std::vector<std::string> notes;
};

/// Plans every problem of every line on every device and collects the specs of all launches.
/// A problem that cannot be planned throws InvalidArgument/PlanError prefixed with the line
/// and the problem.
Enumeration enumerate_specs(const Manifest& manifest, const std::vector<DeviceLimits>& devices);

/// "tokens=64 heads=8 ..." text of a problem, for messages.
std::string problem_text(const ShapeValues& values);

}  // namespace kjit::tool
