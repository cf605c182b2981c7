// SPDX-License-Identifier: Apache-2.0
// The declaration of every kernel family: which template, which parameters, which values are
// accepted. KernelSpec::make checks specs against these; the stub and the NVRTC name
// expression are derived from them, so no kernel body is ever assembled from strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kjit/spec.hpp"

namespace kjit::codegen {

enum class ParamKind {
  /// A DType name; rendered as the device type (__nv_bfloat16, __half, float, ...).
  dtype,
  /// An integer in [min, max] that is a multiple of `multiple_of`; rendered as a literal.
  integer,
  /// One of `choices`; rendered as the `rendered` text at the same position.
  choice,
  /// "0" or "1"; rendered as false / true.
  boolean,
};

struct ParamDecl {
  std::string_view name;
  ParamKind kind = ParamKind::integer;
  std::vector<std::string_view> choices;
  std::vector<std::string_view> rendered;
  std::int64_t min = 0;
  std::int64_t max = 0;
  std::int64_t multiple_of = 1;
  std::string_view doc;
  /// Non-empty: the parameter may be left out of a spec and is left out when it has this value,
  /// so that the specs (and cache keys) of kernels made before it existed stay what they were.
  /// Only trailing parameters: the template declares this value as its default argument, and
  /// the name expression leaves trailing parameters at their default out.
  std::string_view omitted_default = {};
};

struct FamilyDecl {
  /// "merge_state": the text before ':' in a spec.
  std::string_view name;
  /// The template file a stub includes, "templates/merge_state/merge_state.cuh".
  std::string_view include;
  /// The qualified __global__ template, "kjit::merge_state_kernel".
  std::string_view kernel;
  /// Template arguments, in order.
  std::vector<ParamDecl> params;
  /// Lowest compute capability the template supports.
  int min_sm = 80;
  std::string_view doc;
  /// Values of a working specialization for parameters the template constrains jointly, where
  /// picking each parameter on its own (the largest power of two up to 128, say) can combine
  /// into one the template's static_asserts reject: gdn_decode's stages belong to mode=bulk
  /// alone, and its tile rows must be a multiple of its warps' rows. Tests and tools that
  /// build representative specs start from these.
  std::vector<std::pair<std::string_view, std::string_view>> typical = {};
  /// The typical value of parameter `param`, when the family declares one.
  std::optional<std::string_view> typical_value(std::string_view param) const {
    for (const auto& [key, value] : typical) {
      if (key == param) return value;
    }
    return std::nullopt;
  }
  /// Checks that span parameters (the template's static_asserts, in host code), run by
  /// KernelSpec::make after every parameter passed its own check: "" when the spec is one the
  /// template compiles, else why not. Null: no such constraints.
  std::string (*check)(const KernelSpec& spec) = nullptr;
};

/// Every declared family: the built-in table (families.cpp), then the registered ones in name
/// order.
const std::vector<FamilyDecl>& families();

/// Declares a family from outside this layer: a namespace-scope object in an op family's own
/// folder (lib/ops/<op>/), so that a new family edits no shared list. It runs while libkjit
/// loads, before anything can call families(); registering later is a logic error (the table
/// is built once) and aborts with a message.
class FamilyRegistration {
 public:
  explicit FamilyRegistration(FamilyDecl (*make)());
};
/// The family of that name; throws InvalidArgument listing the known families.
const FamilyDecl& find_family(std::string_view name);

/// "&kjit::merge_state_kernel<__nv_bfloat16, 128, 8>": what NVRTC is asked to instantiate and
/// lower (nvrtcAddNameExpression).
std::string name_expression(const KernelSpec& spec);
/// The whole source handed to NVRTC: a comment naming the spec and one #include.
std::string stub_source(const KernelSpec& spec);
/// The C++ spelling of a DType inside templates.
std::string_view device_type_name(DType dtype);

}  // namespace kjit::codegen
