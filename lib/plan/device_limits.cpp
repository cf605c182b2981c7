// SPDX-License-Identifier: Apache-2.0
// Built-in device limits for offline planning. The numbers are the vendor's published
// per-compute-capability limits (CUDA C Programming Guide, "Technical Specifications per
// Compute Capability") plus the SM count and L2 size of one representative product; a live
// device is always described by the driver instead (driver::query_device_limits).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/device.hpp"
#include "kjit/error.hpp"

namespace kjit {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * 1024;
constexpr std::int64_t kGBps = 1'000'000'000;  // bytes per second

/// The limits that differ between the built-in architectures; everything else (block and grid
/// dimensions, 64K registers per block and SM, 255 registers per thread, 256-register
/// allocation unit per warp, 1 KiB reserved shared memory per block) is common to all of them.
struct ArchRow {
  int sm;
  int sm_count;
  std::int64_t smem_optin;
  std::int64_t smem_per_sm;
  int max_threads_per_sm;
  int max_blocks_per_sm;
  std::int64_t l2_bytes;
  std::int64_t dram_bytes_per_second;
};

constexpr std::array<ArchRow, 6> kArchTable{{
    // A100 SXM 80GB: 108 SMs, 163 KiB opt-in per block out of 164 KiB per SM, 40 MB L2, 2.0 TB/s.
    {80, 108, 163 * kKiB, 164 * kKiB, 2048, 32, 40 * kMiB, 2'039 * kGBps},
    // GA10x (RTX 3090 / A10 class): 99 KiB opt-in, 100 KiB per SM, 1536 threads, 16 blocks,
    // 936 GB/s (RTX 3090).
    {86, 82, 99 * kKiB, 100 * kKiB, 1536, 16, 6 * kMiB, 936 * kGBps},
    // AD10x (L40S class): like GA10x but 24 blocks per SM; 864 GB/s.
    {89, 142, 99 * kKiB, 100 * kKiB, 1536, 24, 96 * kMiB, 864 * kGBps},
    // H100 SXM: 132 SMs, 227 KiB opt-in, 228 KiB per SM, 50 MB L2, 3.35 TB/s.
    {90, 132, 227 * kKiB, 228 * kKiB, 2048, 32, 50 * kMiB, 3'352 * kGBps},
    // B200: 148 SMs, same per-SM limits as Hopper, 8 TB/s.
    {100, 148, 227 * kKiB, 228 * kKiB, 2048, 32, 126 * kMiB, 8'000 * kGBps},
    // GB20x (RTX 5090 class): 99 KiB opt-in, 100 KiB per SM, 1536 threads, 32 blocks, 1.79 TB/s.
    {120, 170, 99 * kKiB, 100 * kKiB, 1536, 32, 96 * kMiB, 1'792 * kGBps},
}};

struct Product {
  std::string_view name;
  int sm;
};
constexpr Product kProducts[] = {{"h100", 90}, {"h200", 90},     {"b200", 100},   {"a100", 80},
                                 {"l40s", 89}, {"rtx5090", 120}, {"rtx3090", 86}, {"a10", 86}};

std::string known_names() {
  std::string out;
  for (const ArchRow& row : kArchTable) out += fmt::format("sm_{}, ", row.sm);
  out += "h100, h200, b200, a100, l40s, rtx5090";
  return out;
}

DeviceLimits from_row(const ArchRow& row, Arch arch) {
  DeviceLimits limits;
  limits.arch = arch;
  limits.name = arch.str();
  limits.sm_count = row.sm_count;
  limits.warp_size = 32;
  limits.max_threads_per_block = 1024;
  limits.max_block_dim = {1024, 1024, 64};
  limits.max_grid_dim = {2147483647, 65535, 65535};
  limits.max_smem_per_block = 48 * kKiB;
  limits.max_smem_per_block_optin = row.smem_optin;
  limits.max_smem_per_sm = row.smem_per_sm;
  limits.reserved_smem_per_block = 1 * kKiB;
  limits.regs_per_block = 65536;
  limits.regs_per_sm = 65536;
  limits.max_regs_per_thread = 255;
  limits.reg_alloc_unit = 256;
  limits.max_threads_per_sm = row.max_threads_per_sm;
  limits.max_blocks_per_sm = row.max_blocks_per_sm;
  limits.l2_bytes = row.l2_bytes;
  limits.dram_bytes_per_second = row.dram_bytes_per_second;
  return limits;
}

std::string lowercase(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

DeviceLimits DeviceLimits::for_arch(Arch arch) {
  // sm_90a / sm_100f compile for the same silicon as their base: same limits. The arch keeps
  // its variant, because it is also the compile target of what gets planned.
  for (const ArchRow& row : kArchTable) {
    if (row.sm == arch.sm()) return from_row(row, arch);
  }
  throw InvalidArgument(
      fmt::format("arch {} has no built-in device limits; known: {} (a live device is described "
                  "by the driver instead)",
                  arch.str(), known_names()));
}

DeviceLimits DeviceLimits::for_name(std::string_view name) {
  const std::string key = lowercase(name);
  for (const Product& product : kProducts) {
    if (product.name != key) continue;
    DeviceLimits limits = for_arch(Arch{product.sm / 10, product.sm % 10});
    limits.name = std::string(product.name);
    // H200 is the H100 die with more, faster HBM (4.8 TB/s) and a larger L2 (60 MB).
    if (product.name == "h200") {
      limits.l2_bytes = 60 * kMiB;
      limits.dram_bytes_per_second = 4'800 * kGBps;
    }
    return limits;
  }
  Arch arch;
  try {
    arch = Arch::parse(key);
  } catch (const InvalidArgument&) {
    throw InvalidArgument(
        fmt::format("device '{}' is not a known device or arch; known: {}", name, known_names()));
  }
  return for_arch(arch);
}

std::vector<DeviceLimits> DeviceLimits::products_of(Arch arch) {
  std::vector<DeviceLimits> out{for_arch(arch)};
  for (const Product& product : kProducts) {
    if (product.sm != arch.sm()) continue;
    DeviceLimits limits = for_name(product.name);
    limits.arch = arch;
    const auto same = [&](const DeviceLimits& other) {
      return other.sm_count == limits.sm_count && other.l2_bytes == limits.l2_bytes &&
             other.dram_bytes_per_second == limits.dram_bytes_per_second;
    };
    if (std::none_of(out.begin(), out.end(), same)) out.push_back(std::move(limits));
  }
  return out;
}

std::vector<Arch> DeviceLimits::known_archs() {
  std::vector<Arch> archs;
  archs.reserve(kArchTable.size());
  for (const ArchRow& row : kArchTable) archs.push_back(Arch{row.sm / 10, row.sm % 10});
  return archs;
}

}  // namespace kjit
