// SPDX-License-Identifier: Apache-2.0
// A TMA tensor map (CUtensorMap) as the parameter blocks hold it: 128 opaque bytes, 128-byte
// aligned, encoded on the host (Runtime::encode_tensor_map) and read by the copy engine from the
// kernel's __grid_constant__ parameters. Shared by host code and NVRTC (no cuda.h).
#pragma once

#include "templates/common/types.h"

namespace kjit {

struct alignas(128) TensorMap {
  u64 words[16];
};
static_assert(sizeof(TensorMap) == 128, "CUtensorMap is 128 bytes");

}  // namespace kjit
