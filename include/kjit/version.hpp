// SPDX-License-Identifier: Apache-2.0
#pragma once

namespace kjit {

/// Library version; bundles record it and refuse to load under another.
inline constexpr const char* kVersion = "0.1.0";

}  // namespace kjit
