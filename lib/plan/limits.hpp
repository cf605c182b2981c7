// SPDX-License-Identifier: Apache-2.0
// Names and arithmetic shared by the launch checks, require_legal and explain(); internal.
#pragma once

#include <cstdint>
#include <string_view>

#include "kjit/plan.hpp"

namespace kjit::plan {

/// Suffix of the "dimension is at least 1" checks (requested 1, allowed = the dimension).
inline constexpr std::string_view kAtLeastOne = ">= 1";
inline constexpr std::string_view kThreadsPerBlock = "threads per block";
inline constexpr std::string_view kDynamicSmem = "dynamic shared memory";
inline constexpr std::string_view kRegistersPerBlock = "registers per block";
/// Requested 1 block per SM, allowed = occupancy_blocks_per_sm().
inline constexpr std::string_view kOccupancy = "blocks per SM (occupancy)";
/// Blocks of a cluster (LaunchShape::cluster), against the portable cluster size of the arch.
inline constexpr std::string_view kClusterBlocks = "blocks per cluster (portable size)";
/// The cluster size the driver schedules without the non-portable opt-in (sm_90 and later).
inline constexpr std::int64_t kMaxPortableClusterBlocks = 8;

/// min(device max threads per block, function max threads per block when known).
std::int64_t thread_limit(const DeviceLimits& device, const FunctionLimits& function);
/// Registers a block of `threads` threads occupies (per-warp allocation granularity); 0 when
/// the function's register count is unknown.
std::int64_t registers_per_block(std::int64_t threads, const DeviceLimits& device,
                                 const FunctionLimits& function);

}  // namespace kjit::plan
