// SPDX-License-Identifier: Apache-2.0
#include "codegen/family_decls.hpp"

namespace kjit::codegen {

FamilyDecl probe_family() {
  return FamilyDecl{
      .name = "probe",
      .include = "templates/probe/probe.cuh",
      .kernel = "kjit::probe_kernel",
      .params = {ParamDecl{.name = "heavy",
                           .kind = ParamKind::boolean,
                           .doc = "1: needs many registers per thread (no launch bounds)"}},
      .min_sm = 70,
      .doc = "test kernel for the planner and the driver: one float per thread",
  };
}

}  // namespace kjit::codegen
