// SPDX-License-Identifier: Apache-2.0
// The ops the tool can plan, described by named shape values ("tokens", "heads", "head_dim",
// ...), so that `kjit plan` options and manifest lines share one vocabulary. Tensors are built
// with fake, aligned, non-overlapping addresses: planning never dereferences them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"

namespace kjit::tool {

/// The values a size accepts, as far as the tool can tell without planning: `kjit plan` and
/// kjit.plan() refuse a size outside [min, max] with this rule's text, and a manifest range
/// expands only to representatives that satisfy the whole rule. The op stays the authority:
/// it checks every call again.
struct SizeRule {
  std::int64_t min = 1;
  std::int64_t max = std::int64_t{1} << 62;
  /// The value must be a multiple of this.
  std::int64_t multiple = 1;
  /// Non-empty: only these values.
  std::vector<std::int64_t> only;
  /// Non-empty: the value must divide this other size ("v_heads").
  std::string divides;

  /// Whether `value` satisfies the rule; `divided` is the value of `divides` (ignored when
  /// the rule has none, or when it is unknown: nullptr).
  bool accepts(std::int64_t value, const std::int64_t* divided) const;
  /// "a multiple of 8 in 8..1024", ">= 1, dividing v_heads", ...
  std::string text() const;
};

/// One value an op's plan depends on.
struct OpParam {
  std::string name;
  /// A problem size (tokens, batch, ...): `kjit plan` requires it; a manifest line that omits
  /// it uses `representative`.
  bool size = false;
  /// Default for `kjit plan` ("" with size: required). "=dtype" means: the value of dtype.
  std::string fallback;
  /// Values a manifest line enumerates when it omits the parameter (comma separated).
  std::string representative;
  std::string doc;
  /// For sizes: the values accepted.
  SizeRule rule;
};

/// An op the tool knows.
struct OpInfo {
  std::string name;
  std::vector<OpParam> params;
  std::string doc;
};

/// Named values of one concrete problem, e.g. {"tokens": "64", "dtype": "bf16"}.
using ShapeValues = std::map<std::string, std::string>;

/// Every op the tool knows.
const std::vector<OpInfo>& known_ops();
/// The op of that name; UsageError listing the known ops, or saying that it is not available
/// in this build.
const OpInfo& find_op(std::string_view name);

/// Fills defaults of `values` ("=dtype" references resolved) and checks that every key is a
/// parameter of the op and every size is given. UsageError otherwise.
ShapeValues complete_values(const OpInfo& op, ShapeValues values, bool require_sizes);

/// The plan of the op for the problem on a device with these limits. Throws InvalidArgument
/// (bad values) or PlanError (no legal launch) from the op.
Plan plan_op(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device);

}  // namespace kjit::tool
