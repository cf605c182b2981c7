// SPDX-License-Identifier: Apache-2.0
#include "codegen/family_decls.hpp"

namespace kjit::codegen {

// Placeholder until the gdn_decode template lands; its owner replaces this declaration.
FamilyDecl gdn_decode_family() {
  return FamilyDecl{.name = "gdn_decode", .include = "kjit/gdn_decode.cuh", .kernel = "kjit::gdn_decode_kernel"};
}

}  // namespace kjit::codegen
