// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kjit/types.hpp"

namespace kjit {

/// One specialization of one kernel template for one compile target.
///
/// Canonical text: `<family>:<key>=<value>,...@<arch>`, e.g.
/// `merge_state:dtype=bf16,head_dim=128,vec=8,mode=tiled@sm_90`. Parameters are stored in the
/// order the family declares them, so equal specs have equal text and equal cache keys. A
/// parameter declared with an omitted default is left out when it has that value.
struct KernelSpec {
  std::string family;
  std::vector<std::pair<std::string, std::string>> params;
  Arch arch;

  /// Builds a spec from parameters in any order; checks every parameter against the family's
  /// declaration and puts them in canonical order. Throws InvalidArgument naming the parameter,
  /// its value and what is accepted.
  static KernelSpec make(std::string_view family,
                         std::vector<std::pair<std::string, std::string>> params, Arch arch);
  /// Parses the canonical text (parameters in any order); make()'s checks apply.
  static KernelSpec parse(std::string_view text);

  /// The canonical text.
  std::string str() const;
  /// The value of a parameter; throws InvalidArgument if the spec has none of that name.
  const std::string& get(std::string_view key) const;
  std::int64_t get_int(std::string_view key) const;
  /// Whether the spec has a parameter of that name (a parameter at its omitted default has
  /// none).
  bool has(std::string_view key) const;
  /// The value of a parameter, or `fallback` when the spec has none of that name (a parameter
  /// the family leaves out at its default).
  std::string get_or(std::string_view key, std::string_view fallback) const;

  friend bool operator==(const KernelSpec&, const KernelSpec&) = default;
};

/// Hash of a KernelSpec for unordered containers.
struct KernelSpecHash {
  std::size_t operator()(const KernelSpec& spec) const noexcept;
};

/// What ptxas reported for one compiled kernel.
struct KernelResources {
  int registers = 0;
  std::int64_t static_smem = 0;
  /// Stack frame (local memory) bytes per thread.
  std::int64_t local_bytes = 0;
  std::int64_t spill_store_bytes = 0;
  std::int64_t spill_load_bytes = 0;
  std::int64_t const_bytes = 0;
  /// The kernel's __launch_bounds__ maximum, 0 if it declares none.
  int max_threads = 0;
};

}  // namespace kjit
