// SPDX-License-Identifier: Apache-2.0
// What an op family's catalog entries (lib/ops/<op>/catalog.cpp) are written with: the
// parameter and rule builders, typed reads of shape values, fake tensors to plan with, and the
// one function per family that op_catalog() (catalog.cpp) lists.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/types.hpp"

namespace kjit::catalog_detail {

/// Hands out distinct, 4 KiB-aligned, non-overlapping fake device addresses: the planners
/// inspect alignment (which picks vector widths) and may check overlap, never the memory.
class FakeMemory {
 public:
  TensorView tensor(DType dtype, std::initializer_list<std::int64_t> shape);
  /// A view with data == nullptr (an optional output left out).
  static TensorView none(DType dtype, std::initializer_list<std::int64_t> shape) {
    return TensorView::contiguous(nullptr, dtype, shape);
  }

 private:
  static constexpr std::uint64_t kAlign = 4096;
  std::uint64_t next_ = std::uint64_t{1} << 32;
};

/// A problem size (required by `kjit plan`, `representative` values in manifests).
OpParam size(std::string name, std::string representative, std::string doc, SizeRule rule = {});
/// A value with a default (manifests use the default unless they name it).
OpParam option(std::string name, std::string fallback, std::string doc);

// Problem sizes that a running engine meets as 0 (an empty batch) plan as "nothing launched";
// model dimensions (heads, head dims) of 0 are mistakes and are refused by name.
SizeRule at_least(std::int64_t min);
SizeRule multiple_in(std::int64_t multiple, std::int64_t min, std::int64_t max);
SizeRule one_of(std::vector<std::int64_t> values);
SizeRule dividing(std::string other);

/// Typed reads of completed shape values; InvalidArgument naming the value otherwise.
std::int64_t get_int(const ShapeValues& values, const std::string& name);
DType get_dtype(const ShapeValues& values, const std::string& name);
bool get_bool(const ShapeValues& values, const std::string& name);

/// Adds a family's entries to op_catalog() from a namespace-scope object in the family's own
/// catalog.cpp, so that a new family edits no shared list: registered families follow the
/// listed ones below, ordered by their first op's name. It runs while libkjit loads, before
/// anything can call op_catalog(); registering later is a logic error and aborts.
class CatalogRegistration {
 public:
  explicit CatalogRegistration(std::vector<OpInfo> (*entries)());
};

/// The entries of each family listed by hand (the families written before registration), in
/// catalog order.
std::vector<OpInfo> merge_state_entries();
std::vector<OpInfo> gdn_decode_entries();
std::vector<OpInfo> gdn_prefill_entries();

}  // namespace kjit::catalog_detail
