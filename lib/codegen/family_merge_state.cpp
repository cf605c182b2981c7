// SPDX-License-Identifier: Apache-2.0
#include "codegen/family_decls.hpp"

namespace kjit::codegen {

// Placeholder until the merge_state template lands; its owner replaces this declaration.
FamilyDecl merge_state_family() {
  return FamilyDecl{.name = "merge_state", .include = "kjit/merge_state.cuh", .kernel = "kjit::merge_state_kernel"};
}

}  // namespace kjit::codegen
