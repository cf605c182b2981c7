// SPDX-License-Identifier: Apache-2.0
// The tool's manifest enumeration and offline bundle verification, called directly. Built only
// when tests/cli/CMakeLists.txt links kjit_tool_core into this suite (KJIT_HAVE_TOOL_CORE).
#if KJIT_HAVE_TOOL_CORE
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cache/bundle.hpp"
#include "cli.hpp"
#include "kjit/error.hpp"
#include "manifest.hpp"
#include "ops.hpp"
#include "support/hash.hpp"
#include "verify.hpp"

namespace kjit::tool {
namespace {

bool has(const std::vector<std::string>& values, const std::string& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("manifest values: lists, short ranges whole, long ranges by representatives") {
  CHECK(expand_values("64,128") == std::vector<std::string>{"64", "128"});
  CHECK(expand_values("2..5") == std::vector<std::string>{"2", "3", "4", "5"});
  const auto heads = expand_values("1..256");
  for (const char* value : {"1", "2", "3", "63", "64", "65", "255", "256"}) {
    CHECK(has(heads, value));
  }
  CHECK_FALSE(has(heads, "100"));
  CHECK(expand_values("64,1..128").front() == "64");
  CHECK_THROWS_AS(expand_values("9..3"), UsageError);
  CHECK_THROWS_AS(expand_values("a..3"), UsageError);
}

TEST_CASE("manifest lines: comments, errors with line numbers") {
  const Manifest manifest =
      parse_manifest("# a comment\n\nmerge_state dtype=bf16 heads=8  # trailing\n", "m.txt");
  REQUIRE(manifest.lines.size() == 1);
  CHECK(manifest.lines[0].number == 3);
  CHECK(manifest.lines[0].op == "merge_state");
  CHECK(manifest.lines[0].values.at("heads") == std::vector<std::string>{"8"});
  CHECK_THROWS_WITH_AS(parse_manifest("merge_state heads\n", "m.txt"),
                       doctest::Contains("m.txt:1: 'heads' is not key=values"), UsageError);
  CHECK_THROWS_WITH_AS(parse_manifest("\nmerge_state heads=1 heads=2\n", "m.txt"),
                       doctest::Contains("m.txt:2: heads given twice"), UsageError);
}

TEST_CASE("complete_values fills defaults and refuses unknown keys") {
  const OpInfo* merge = nullptr;
  for (const OpInfo& op : known_ops()) {
    if (op.name == "merge_state") merge = &op;
  }
  REQUIRE(merge);
  const ShapeValues values =
      complete_values(*merge, {{"tokens", "4"}, {"heads", "2"}, {"head_dim", "64"}}, true);
  CHECK(values.at("out_dtype") == values.at("dtype"));
  CHECK_THROWS_WITH_AS(complete_values(*merge, {{"tokenz", "4"}}, false),
                       doctest::Contains("has no parameter 'tokenz'"), UsageError);
  CHECK_THROWS_WITH_AS(complete_values(*merge, {{"heads", "2"}, {"head_dim", "64"}}, true),
                       doctest::Contains("needs --tokens"), UsageError);
}

#if KJIT_TOOL_HAVE_MERGE_STATE
namespace {

// A bundle holding every spec the manifest needs on sm_90, with fabricated resources: the
// verifier reads only the recorded resources, never the cubin.
cache::Bundle fabricated_bundle(const Manifest& manifest, int registers) {
  const Enumeration enumeration =
      enumerate_specs(manifest, {DeviceLimits::for_arch(Arch::parse("sm_90"))});
  std::vector<CompiledKernel> kernels;
  for (const KernelSpec& spec : enumeration.specs) {
    CompiledKernel kernel;
    kernel.spec = spec;
    kernel.cubin = "fake";
    kernel.resources.registers = registers;
    kernel.key = support::xxh3_128(spec.str()).hex();
    kernels.push_back(kernel);
  }
  return cache::Bundle::from_bytes(
      cache::encode_bundle(cache::BundleInfo::current("test", {"sm_90"}, manifest.text), kernels),
      "fabricated.kjb");
}

}  // namespace

TEST_CASE("verify proves a bundle on real devices and catches a small fabricated one") {
  const Manifest manifest =
      parse_manifest("merge_state dtype=bf16 heads=1..256 head_dim=128,512 lse_base=e\n", "m");
  const cache::Bundle bundle = fabricated_bundle(manifest, 32);
  REQUIRE_FALSE(bundle.entries().empty());

  const VerifyReport good = verify_bundle(
      bundle, manifest, {DeviceLimits::for_name("h100"), DeviceLimits::for_name("h200")});
  CHECK(good.ok());
  CHECK(good.problems > 0);
  CHECK(good.launches > 0);

  // Too few threads per block: the planner's shapes (or its choice for this device) fail.
  const VerifyReport tiny =
      verify_bundle(bundle, manifest, {parse_device("name=tiny,threads=32,grid_y=7")});
  CHECK_FALSE(tiny.ok());
  CHECK(contains(tiny.failures.front(), "tiny"));

  // No arch for the device at all.
  const VerifyReport b200 = verify_bundle(bundle, manifest, {DeviceLimits::for_name("b200")});
  REQUIRE_FALSE(b200.ok());
  CHECK(contains(b200.failures.front(), "only for sm_90"));
}

TEST_CASE("verify uses the recorded registers") {
  const Manifest manifest =
      parse_manifest("merge_state dtype=bf16 heads=8 head_dim=512 tokens=64 lse_base=e\n", "m");
  // 255 registers x the planned block overflows a device of 32K registers per block; 16 fit.
  const cache::Bundle heavy = fabricated_bundle(manifest, 255);
  const VerifyReport report = verify_bundle(heavy, manifest, {parse_device("regs=32768")});
  REQUIRE_FALSE(report.ok());
  CHECK(contains(report.failures.front(), "255 registers"));
  CHECK(contains(report.failures.front(), "registers per block"));
  CHECK(
      verify_bundle(fabricated_bundle(manifest, 16), manifest, {parse_device("regs=32768")}).ok());
}
#endif

TEST_CASE("fabricated devices") {
  const DeviceLimits device = parse_device("name=tiny,base=h100,threads=256,grid_y=7,regs=4096");
  CHECK(device.name == "tiny");
  CHECK(device.max_threads_per_block == 256);
  CHECK(device.max_grid_dim[1] == 7);
  CHECK(device.regs_per_block == 4096);
  CHECK(device.arch.sm() == 90);
  CHECK_THROWS_WITH_AS(parse_device("warp=16"), doctest::Contains("unknown device key 'warp'"),
                       UsageError);
}

TEST_CASE("sizes") {
  CHECK(parse_size("512") == 512);
  CHECK(parse_size("100M") == 100ull << 20);
  CHECK(parse_size("2G") == 2ull << 30);
  CHECK(parse_size("1KiB") == 1024);
  CHECK_THROWS_AS(parse_size("lots"), UsageError);
}

}  // namespace kjit::tool
#endif  // KJIT_HAVE_TOOL_CORE
