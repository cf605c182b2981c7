// SPDX-License-Identifier: Apache-2.0
// Offline proof that a bundle serves its manifest: on each declared device, every problem of
// the manifest plans to kernels the bundle holds, and every launch passes check_launch with
// the registers / static shared memory ptxas recorded for the kernel.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cache/bundle.hpp"
#include "kjit/device.hpp"
#include "manifest.hpp"

namespace kjit::tool {

struct VerifyReport {
  std::size_t problems = 0;
  std::size_t launches = 0;
  /// One line per distinct failure; empty when the bundle is proven.
  std::vector<std::string> failures;
  /// Lines skipped (ops missing from this build).
  std::vector<std::string> notes;
  bool ok() const noexcept { return failures.empty(); }
};

/// Parses a fabricated device: "key=value,..." over DeviceLimits, starting from `base=NAME`
/// (default sm_90). Keys: name, base, arch, sms, threads (max threads per block), block_x,
/// block_y, block_z, grid_x, grid_y, grid_z, smem (without opt-in), smem_optin, smem_per_sm,
/// regs (per block), regs_per_sm, max_regs (per thread), threads_per_sm, blocks_per_sm.
/// UsageError naming the key otherwise.
DeviceLimits parse_device(std::string_view text);

/// The limits a launch of `entry` is checked against: the function as ptxas described it.
FunctionLimits function_limits_of(const KernelResources& resources);

/// Verifies `bundle` against `manifest` on each device. A device whose sm the bundle has no
/// arch for is a failure; a device is planned as each bundle arch of its sm (sm_100 and
/// sm_100a alike for a b200).
VerifyReport verify_bundle(const cache::Bundle& bundle, const Manifest& manifest,
                           const std::vector<DeviceLimits>& devices);

}  // namespace kjit::tool
