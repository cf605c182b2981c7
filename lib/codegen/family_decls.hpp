// SPDX-License-Identifier: Apache-2.0
// One function per kernel family written before families could register themselves, each
// defined in family_<name>.cpp next to this file and listed in families.cpp. A new family
// registers from its op folder instead (codegen::FamilyRegistration, lib/ops/<op>/catalog.cpp)
// and touches neither file.
#pragma once

#include "codegen/families.hpp"

namespace kjit::codegen {

FamilyDecl probe_family();
FamilyDecl merge_state_family();
FamilyDecl gdn_decode_family();
FamilyDecl gdn_decode_order_family();
FamilyDecl gdn_decode_conv_family();
FamilyDecl bench_family();
FamilyDecl bench_slot_rmw_family();

}  // namespace kjit::codegen
