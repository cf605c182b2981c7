// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kjit/types.hpp"

namespace kjit {

/// What a device allows a launch to use. A plain value: filled from the driver for a live
/// device (Runtime::device_limits), or from the built-in table for offline planning.
struct DeviceLimits {
  Arch arch{9, 0};
  std::string name = "sm_90";
  int sm_count = 132;
  int warp_size = 32;
  int max_threads_per_block = 1024;
  std::array<std::int64_t, 3> max_block_dim{1024, 1024, 64};
  std::array<std::int64_t, 3> max_grid_dim{2147483647, 65535, 65535};
  /// Shared memory a block may use without opting in (static + dynamic).
  std::int64_t max_smem_per_block = 48 * 1024;
  /// Shared memory a block may use after cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES).
  std::int64_t max_smem_per_block_optin = 227 * 1024;
  std::int64_t max_smem_per_sm = 228 * 1024;
  /// Shared memory the driver reserves per block (counted against the SM, not the block).
  std::int64_t reserved_smem_per_block = 1024;
  std::int64_t regs_per_block = 65536;
  std::int64_t regs_per_sm = 65536;
  int max_regs_per_thread = 255;
  /// Registers are allocated per warp in units of this many.
  int reg_alloc_unit = 256;
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
  std::int64_t l2_bytes = 50 * 1024 * 1024;
  /// Peak DRAM bandwidth in bytes per second (a live device: memory clock x bus width x 2, as the
  /// driver reports them; built-in: the product's published figure). Plans that trade workspace
  /// traffic against on-chip work weigh it per SM (gdn_prefill's warp-specialized kernel).
  std::int64_t dram_bytes_per_second = 3'352'000'000'000;
  /// dram_bytes_per_second shared by the SMs (what one SM's traffic can draw), bytes per second.
  std::int64_t dram_bytes_per_sm_second() const {
    return dram_bytes_per_second / (sm_count > 0 ? sm_count : 1);
  }

  /// The built-in limits of a known architecture (sm_80, sm_86, sm_89, sm_90, sm_100,
  /// sm_120; the a/f variants share their base's limits). Throws InvalidArgument naming the
  /// known archs otherwise.
  static DeviceLimits for_arch(Arch arch);
  /// Built-in limits by product or arch name: "h100", "h200", "b200", "a100", "l40s",
  /// "rtx5090", or any Arch::parse text.
  static DeviceLimits for_name(std::string_view name);
  /// The archs of the built-in table.
  static std::vector<Arch> known_archs();
  /// Every built-in product of `arch` (its variant kept), the arch's own row first: sm_90 is the
  /// H100 and the H200, whose DRAM bandwidth differs and with it some plans (gdn_prefill's
  /// warp-specialized kernel), so what is precompiled for an arch covers all of them.
  static std::vector<DeviceLimits> products_of(Arch arch);
};

}  // namespace kjit
