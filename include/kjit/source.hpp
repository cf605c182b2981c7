// SPDX-License-Identifier: Apache-2.0
// The source of a kernel as NVRTC compiles it: the stub and the embedded templates it includes.
#pragma once

#include <string>
#include <vector>

#include "kjit/spec.hpp"

namespace kjit {

/// One file of a kernel's source as NVRTC sees it.
struct SourceFile {
  /// "stub" for the generated stub; else the include name
  /// ("templates/merge_state/merge_state.cuh").
  std::string name;
  std::string text;
};

/// The source NVRTC compiles for `spec`: the stub first, then every embedded template it
/// includes (lines `#include "templates/..."`), transitively, each once, in the order first
/// reached. What `kjit source` and kjit.source(templates=True) print. Throws InvalidArgument for a
/// family that does not exist.
std::vector<SourceFile> kernel_source_files(const KernelSpec& spec);

}  // namespace kjit
