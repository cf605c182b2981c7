// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/spec.hpp"

namespace kjit {

struct Dim3 {
  std::uint32_t x = 1;
  std::uint32_t y = 1;
  std::uint32_t z = 1;
  std::uint64_t count() const noexcept { return std::uint64_t{x} * y * z; }
  friend bool operator==(const Dim3&, const Dim3&) = default;
};

/// Grid, block and dynamic shared memory of one kernel launch.
struct LaunchShape {
  Dim3 grid;
  Dim3 block;
  std::uint32_t dynamic_smem = 0;
  /// Programmatic dependent launch (sm_90 and later): the kernel may start once every block of
  /// the kernel before it in the stream has started, and waits in the kernel (griddepcontrol.wait)
  /// before it reads that kernel's results. Set only on a plan's later launches whose kernels
  /// read nothing before that wait that the previous launch of the plan writes.
  bool overlaps_previous = false;
  /// Thread-block cluster (sm_90 and later): groups of cluster.x x cluster.y x cluster.z
  /// consecutive blocks that the hardware runs at the same time on one GPC, so they can meet at
  /// a cluster barrier and read each other's shared memory. (1, 1, 1): no cluster. The grid must
  /// be a whole number of clusters.
  Dim3 cluster;
  friend bool operator==(const LaunchShape&, const LaunchShape&) = default;
};

/// What is known of a compiled function when checking a launch: from ptxas before loading,
/// from the driver's function attributes after.
struct FunctionLimits {
  /// 0: unknown (only device limits apply).
  int max_threads_per_block = 0;
  int registers = 0;
  std::int64_t static_smem = 0;
  std::int64_t local_bytes = 0;
  /// Dynamic shared memory the function may use as currently configured; -1: unknown.
  std::int64_t max_dynamic_smem = -1;
};

/// One limit compared against a launch: `requested <= allowed` must hold.
struct LimitCheck {
  std::string limit;
  std::int64_t requested = 0;
  std::int64_t allowed = 0;
  bool ok() const noexcept { return requested <= allowed; }
};

/// One kernel launch of a plan: which specialization, with which shape, and the checks it
/// passed against the device it was planned for.
struct PlannedLaunch {
  KernelSpec spec;
  LaunchShape shape;
  std::vector<LimitCheck> checks;
};

/// Everything decided for one call of an op, before anything is compiled or launched. A pure
/// value: printable, comparable and explainable.
struct Plan {
  std::string op;
  /// The grid mode chosen, e.g. "token_major", "head_tiled", "flat".
  std::string mode;
  /// Why this mode: the alternatives considered and the limit or cost that ruled each out.
  std::vector<std::string> reasons;
  std::vector<PlannedLaunch> launches;
  DeviceLimits device;

  /// Multi-line human-readable account: mode, shape of every launch, every limit with its
  /// margin, and the reasons.
  std::string explain() const;
  /// One JSON object: {"op","mode","arch","reasons":[...],"launches":[{"spec","grid","block",
  /// "dynamic_smem","overlaps_previous","checks":[...]}]}.
  std::string to_json() const;
};

/// Every limit a launch shape must respect on a device (and, when known, for a function).
std::vector<LimitCheck> check_launch(const LaunchShape& shape, const DeviceLimits& device,
                                     const FunctionLimits& function = {});
/// Throws PlanError for the first failed check: "<what>: <limit> is <allowed>, the launch
/// needs <requested>".
void require_legal(const std::vector<LimitCheck>& checks, std::string_view what);
/// Resident blocks per SM for the shape, 0 when it cannot run at all.
int occupancy_blocks_per_sm(const LaunchShape& shape, const DeviceLimits& device,
                            const FunctionLimits& function);
/// Whether a launch on `arch` may overlap the one before it (LaunchShape::overlaps_previous):
/// programmatic dependent launch and the kernels' griddepcontrol waits exist from sm_90 on.
bool supports_programmatic_launch(Arch arch) noexcept;

}  // namespace kjit
