// SPDX-License-Identifier: Apache-2.0
// The planner on random problems x random device limits. The input bytes choose an op, a
// value for each of its parameters (sizes biased to boundaries: 0, 1, powers of two +-1, huge)
// and perturbations of a built-in device's limits (threads per block, block and grid dims,
// shared memory, registers). Required: no crash; a refused problem is a kjit::Error; and every
// accepted plan is legal on that device — each launch re-checked here against the limits
// directly, not only through check_launch().
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "kjit/plan.hpp"
#include "manifest.hpp"

namespace {

/// Reads the input a byte at a time; zeros once it is used up.
class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint32_t u8() { return at_ < size_ ? data_[at_++] : 0u; }
  std::uint32_t u16() { return u8() | (u8() << 8); }
  std::uint32_t u32() { return u16() | (u16() << 16); }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

std::string pick(Bytes& in, const std::vector<std::string>& choices) {
  return choices[in.u8() % choices.size()];
}

std::string number(Bytes& in) {
  switch (in.u8() % 5) {
    case 0:
      return std::to_string(in.u8() % 17);
    case 1: {
      const std::int64_t p = std::int64_t{1} << (in.u8() % 25);
      return std::to_string(p + static_cast<std::int64_t>(in.u8() % 3) - 1);
    }
    case 2:
      return std::to_string(8 * (1 + in.u16() % 160));
    case 3:
      return std::to_string(in.u32() % (1u << 24));
    default:
      // Sizes near 2^32 and 2^62 overflowed tools/ops.cpp's int64 products (2*heads*k +
      // v_heads*v) before the planner saw them (found by this target); the tool now checks
      // that product and refuses sizes above 2^62.
      return pick(in, {"-1", "16777217", "65536", "65537", "1000000", "1073741824", "1073741825",
                       "4294967297", "4611686018427387905"});
  }
}

/// A value for one parameter; "" leaves it to the op's default.
std::string value_for(Bytes& in, const kjit::OpParam& param) {
  const std::string& name = param.name;
  if (!param.size && in.u8() % 2 == 0) return "";  // the default, half of the time
  if (name.find("dtype") != std::string::npos) {
    return pick(in, {"bf16", "f16", "f32", "i32", "i64", "u8"});
  }
  if (name == "lse_base") return pick(in, {"e", "2", "10"});
  if (name == "layout") return pick(in, {"token_major", "head_major", "diagonal"});
  if (name == "invalid") return pick(in, {"negative", "nonpositive"});
  if (name == "pos_inf_empty" || name == "gated" || name == "l2norm") {
    return pick(in, {"0", "1", "2"});
  }
  if (name == "mode") {
    return pick(in, {"token_major", "flat", "split", "folded", "bv64", "bv32", "bv16", "nope"});
  }
  return number(in);
}

kjit::DeviceLimits device_for(Bytes& in) {
  const std::vector<kjit::Arch> archs = kjit::DeviceLimits::known_archs();
  kjit::DeviceLimits d = kjit::DeviceLimits::for_arch(archs[in.u8() % archs.size()]);
  const std::uint32_t which = in.u16();  // one bit per limit to perturb
  if (which & 1) d.max_threads_per_block = static_cast<int>(32 * (1 + in.u8() % 32));
  if (which & 2) d.max_block_dim[0] = 32 * (1 + in.u8() % 32);
  if (which & 4) d.max_block_dim[1] = 1 + in.u16() % 1024;
  if (which & 8) d.max_block_dim[2] = 1 + in.u8() % 64;
  if (which & 16) d.max_grid_dim[0] = 1 + in.u32() % 2147483647u;
  if (which & 32) d.max_grid_dim[1] = 1 + in.u16() % 65535;
  if (which & 64) d.max_grid_dim[2] = 1 + in.u16() % 65535;
  if (which & 128) {
    d.max_smem_per_block_optin = 1024 * (16 + in.u8() % 212);
    d.max_smem_per_block = std::min<std::int64_t>(48 * 1024, d.max_smem_per_block_optin);
  }
  if (which & 256) d.regs_per_block = std::int64_t{16384} << (in.u8() % 3);
  if (which & 512) d.sm_count = static_cast<int>(1 + in.u8() % 200);
  if (which & 1024) d.max_blocks_per_sm = static_cast<int>(1 + in.u8() % 32);
  return d;
}

void require_legal_launch(const kjit::PlannedLaunch& launch, const kjit::DeviceLimits& d,
                          const std::string& where) {
  using kjit::fuzz::require;
  const kjit::LaunchShape& s = launch.shape;
  const std::int64_t block[3] = {s.block.x, s.block.y, s.block.z};
  const std::int64_t grid[3] = {s.grid.x, s.grid.y, s.grid.z};
  for (int i = 0; i < 3; ++i) {
    require(block[i] >= 1 && block[i] <= d.max_block_dim[i], where + ": block dim out of range");
    require(grid[i] >= 1 && grid[i] <= d.max_grid_dim[i], where + ": grid dim out of range");
  }
  require(static_cast<std::int64_t>(s.block.count()) <= d.max_threads_per_block,
          where + ": more threads per block than the device allows");
  require(s.dynamic_smem <= d.max_smem_per_block_optin,
          where + ": more dynamic shared memory than the opt-in limit");
  for (const kjit::LimitCheck& check : kjit::check_launch(s, d)) {
    require(check.ok(), where + ": check_launch refuses " + check.limit);
  }
  kjit::fuzz::require(kjit::KernelSpec::parse(launch.spec.str()) == launch.spec,
                      where + ": spec does not round-trip: " + launch.spec.str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace kjit;
  using namespace kjit::tool;
  Bytes in(data, size);
  std::vector<const OpInfo*> ops;
  for (const OpInfo& op : op_catalog()) ops.push_back(&op);
  if (ops.empty()) return 0;
  const OpInfo& op = *ops[in.u8() % ops.size()];
  ShapeValues values;
  for (const OpParam& param : op.params) {
    std::string value = value_for(in, param);
    if (!value.empty()) values[param.name] = std::move(value);
  }
  const kjit::DeviceLimits device = device_for(in);
  kjit::Plan plan;
  try {
    plan = plan_from_shape(op, complete_shape_values(op, values, true), device);
  } catch (const kjit::Error&) {
    return 0;  // refused with a clear error: allowed for any input
  }
  const std::string where = op.name + " " + problem_text(values) + " on " + device.name;
  // An empty plan is legal (T = 0 launches nothing); every launch it has must be legal.
  for (const kjit::PlannedLaunch& launch : plan.launches) {
    require_legal_launch(launch, device, where);
  }
  plan.explain();
  plan.to_json();
  return 0;
}
