// SPDX-License-Identifier: Apache-2.0
// Fixed-width integer names usable both under NVRTC (no host headers) and in host code, so
// that the params.h files can be shared between the two.
#pragma once

#ifdef __CUDACC_RTC__
namespace kjit {
using i32 = int;
using u32 = unsigned int;
using i64 = long long;
using u64 = unsigned long long;
}  // namespace kjit
#else
#include <cstdint>
namespace kjit {
using i32 = std::int32_t;
using u32 = std::uint32_t;
using i64 = std::int64_t;
using u64 = std::uint64_t;
}  // namespace kjit
#endif
