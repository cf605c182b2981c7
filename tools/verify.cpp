// SPDX-License-Identifier: Apache-2.0
#include "verify.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "cli.hpp"
#include "kjit/error.hpp"

namespace kjit::tool {

DeviceLimits parse_device(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> items;
  std::string base = "sm_90";
  for (const std::string& item : split_list(text)) {
    const auto eq = item.find('=');
    if (eq == std::string::npos) {
      throw UsageError(fmt::format("device item '{}' is not key=value", item));
    }
    if (item.substr(0, eq) == "base") {
      base = item.substr(eq + 1);
    } else {
      items.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  }
  DeviceLimits device = DeviceLimits::for_name(base);
  device.name = fmt::format("custom({})", text);
  for (const auto& [key, value] : items) {
    if (key == "name") {
      device.name = value;
    } else if (key == "arch") {
      device.arch = Arch::parse(value);
    } else {
      const std::int64_t number = parse_int(value, fmt::format("device {}", key));
      const int small = static_cast<int>(number);
      if (key == "sms") {
        device.sm_count = small;
      } else if (key == "threads") {
        device.max_threads_per_block = small;
      } else if (key == "block_x" || key == "block_y" || key == "block_z") {
        device.max_block_dim[static_cast<std::size_t>(key.back() - 'x')] = number;
      } else if (key == "grid_x" || key == "grid_y" || key == "grid_z") {
        device.max_grid_dim[static_cast<std::size_t>(key.back() - 'x')] = number;
      } else if (key == "smem") {
        device.max_smem_per_block = number;
      } else if (key == "smem_optin") {
        device.max_smem_per_block_optin = number;
      } else if (key == "smem_per_sm") {
        device.max_smem_per_sm = number;
      } else if (key == "regs") {
        device.regs_per_block = number;
      } else if (key == "regs_per_sm") {
        device.regs_per_sm = number;
      } else if (key == "max_regs") {
        device.max_regs_per_thread = small;
      } else if (key == "threads_per_sm") {
        device.max_threads_per_sm = small;
      } else if (key == "blocks_per_sm") {
        device.max_blocks_per_sm = small;
      } else if (key == "dram_gbps") {
        // DRAM bandwidth in GB/s: plans that weigh workspace traffic read it per SM.
        constexpr std::int64_t kMaxGbps = 1'000'000;  // 1 PB/s: past any device, no overflow
        if (number <= 0 || number > kMaxGbps) {
          throw UsageError(
              fmt::format("device dram_gbps = {}: must be in 1..{} (GB/s)", number, kMaxGbps));
        }
        device.dram_bytes_per_second = number * 1'000'000'000;
      } else {
        throw UsageError(fmt::format(
            "unknown device key '{}'; accepted: name, base, arch, sms, threads, block_x, "
            "block_y, block_z, grid_x, grid_y, grid_z, smem, smem_optin, smem_per_sm, regs, "
            "regs_per_sm, max_regs, threads_per_sm, blocks_per_sm, dram_gbps",
            key));
      }
    }
  }
  return device;
}

FunctionLimits function_limits_of(const KernelResources& resources) {
  FunctionLimits limits;
  limits.max_threads_per_block = resources.max_threads;
  limits.registers = resources.registers;
  limits.static_smem = resources.static_smem;
  limits.local_bytes = resources.local_bytes;
  return limits;
}

VerifyReport verify_bundle(const cache::Bundle& bundle, const Manifest& manifest,
                           const std::vector<DeviceLimits>& devices) {
  VerifyReport report;
  std::set<std::string> reported;
  auto fail = [&](std::string line) {
    if (reported.insert(line).second) report.failures.push_back(std::move(line));
  };
  for (const DeviceLimits& device : devices) {
    std::vector<DeviceLimits> targets;
    for (const std::string& arch_text : bundle.info().archs) {
      const Arch arch = Arch::parse(arch_text);
      if (arch.sm() != device.arch.sm()) continue;
      DeviceLimits target = device;
      target.arch = arch;
      targets.push_back(target);
    }
    if (targets.empty()) {
      fail(fmt::format("{} is {}, but the bundle has kernels only for {}", device.name,
                       device.arch.str(), fmt::join(bundle.info().archs, ", ")));
      continue;
    }
    for (const DeviceLimits& target : targets) {
      for (const ManifestLine& line : manifest.lines) {
        const OpInfo* op = nullptr;
        for (const OpInfo& known : op_catalog()) {
          if (known.name == line.op) op = &known;
        }
        if (op == nullptr) {
          report.notes.push_back(fmt::format("{}:{}: skipped: op {} is not available in this build",
                                             manifest.name, line.number, line.op));
          continue;
        }
        for (const ShapeValues& problem : line_problems(line, *op)) {
          ++report.problems;
          const std::string what = fmt::format("{} {}: {} {}", target.name, target.arch.str(),
                                               line.op, problem_text(problem));
          Plan plan;
          try {
            plan = plan_from_shape(*op, problem, target);
          } catch (const Error& error) {
            fail(fmt::format("{}: cannot be planned: {}", what, error.what()));
            continue;
          }
          for (const PlannedLaunch& launch : plan.launches) {
            ++report.launches;
            const auto kernel = bundle.find(launch.spec);
            if (!kernel) {
              fail(fmt::format("{}: {} is not in the bundle", what, launch.spec.str()));
              continue;
            }
            for (const LimitCheck& check :
                 check_launch(launch.shape, target, function_limits_of(kernel->resources))) {
              if (check.ok()) continue;
              fail(fmt::format(
                  "{}: {} ({} registers, {} bytes static smem): {} is {}, the launch "
                  "needs {}",
                  what, launch.spec.str(), kernel->resources.registers,
                  kernel->resources.static_smem, check.limit, check.allowed, check.requested));
            }
          }
        }
      }
    }
  }
  std::sort(report.notes.begin(), report.notes.end());
  report.notes.erase(std::unique(report.notes.begin(), report.notes.end()), report.notes.end());
  return report;
}

}  // namespace kjit::tool
