// SPDX-License-Identifier: Apache-2.0
// The op catalog: every op by name, with the named shape values its plan depends on ("tokens",
// "heads", "head_dim", "dtype", ...). It is the one vocabulary that `kjit plan` options,
// manifest lines (`kjit precompile`) and kjit.plan() share: each op family registers its
// entries beside its code (lib/ops/<op>/catalog.cpp), and the front ends iterate over
// op_catalog() instead of restating it. Planning from shape values builds tensors with fake,
// aligned, non-overlapping addresses: it never dereferences them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/plan.hpp"

namespace kjit {

/// The values a size accepts, as far as the catalog can tell without planning: `kjit plan` and
/// kjit.plan() refuse a size outside [min, max] with this rule's text, and a manifest range
/// expands only to representatives that satisfy the whole rule. The op stays the authority: it
/// checks every call again.
struct SizeRule {
  std::int64_t min = 1;
  std::int64_t max = std::int64_t{1} << 62;
  /// The value must be a multiple of this.
  std::int64_t multiple = 1;
  /// Non-empty: only these values.
  std::vector<std::int64_t> only;
  /// Non-empty: the value must divide this other size ("v_heads").
  std::string divides;

  /// Whether `value` satisfies the rule; `divided` is the value of `divides` (ignored when the
  /// rule has none, or when it is unknown: nullptr).
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

/// Named values of one concrete problem, e.g. {"tokens": "64", "dtype": "bf16"}.
using ShapeValues = std::map<std::string, std::string>;

/// An op of the catalog.
struct OpInfo {
  std::string name;
  std::vector<OpParam> params;
  std::string doc;
  /// The plan of a problem given by completed shape values (complete_shape_values); called
  /// through plan_from_shape, which checks the sizes' ranges first.
  Plan (*plan)(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device) = nullptr;
};

/// Every op, in a fixed order (the order `kjit plan --help` lists them in).
const std::vector<OpInfo>& op_catalog();

/// The op of that name; InvalidArgument listing the known ops otherwise.
const OpInfo& find_op(std::string_view name);

/// Fills the defaults of `values` ("=dtype" references resolved) and checks that every key is
/// a parameter of the op and, with `require_sizes`, that every size is given. InvalidArgument
/// otherwise.
ShapeValues complete_shape_values(const OpInfo& op, ShapeValues values, bool require_sizes);

/// The plan of the op for the problem on a device with these limits: sizes outside their
/// rule's range are refused by name (InvalidArgument), then the op plans (InvalidArgument for
/// bad values, PlanError when no legal launch exists).
Plan plan_from_shape(const OpInfo& op, const ShapeValues& values, const DeviceLimits& device);

}  // namespace kjit
