// SPDX-License-Identifier: Apache-2.0
// The tool's manifest enumeration and offline bundle verification, called directly. Built only
// when tests/cli/CMakeLists.txt links kjit_tool_core into this suite (KJIT_HAVE_TOOL_CORE).
#if KJIT_HAVE_TOOL_CORE
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "cache/bundle.hpp"
#include "cli.hpp"
#include "kjit/catalog.hpp"
#include "kjit/error.hpp"
#include "manifest.hpp"
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

TEST_CASE("complete_shape_values fills defaults and refuses unknown keys") {
  const OpInfo* merge = nullptr;
  for (const OpInfo& op : op_catalog()) {
    if (op.name == "merge_state") merge = &op;
  }
  REQUIRE(merge);
  const ShapeValues values =
      complete_shape_values(*merge, {{"tokens", "4"}, {"heads", "2"}, {"head_dim", "64"}}, true);
  CHECK(values.at("out_dtype") == values.at("dtype"));
  CHECK_THROWS_WITH_AS(complete_shape_values(*merge, {{"tokenz", "4"}}, false),
                       doctest::Contains("has no parameter 'tokenz'"), InvalidArgument);
  CHECK_THROWS_WITH_AS(complete_shape_values(*merge, {{"heads", "2"}, {"head_dim", "64"}}, true),
                       doctest::Contains("needs --tokens"), InvalidArgument);
}

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

namespace {

const OpInfo& op_named(const std::string& name) {
  for (const OpInfo& op : op_catalog()) {
    if (op.name == name) return op;
  }
  FAIL("no op " << name);
  throw;
}

/// The distinct values `key` takes over the problems of a one-line manifest.
std::vector<std::string> values_of(const std::string& line, const std::string& key) {
  const Manifest manifest = parse_manifest(line + "\n", "m.txt");
  std::vector<std::string> values;
  for (const ShapeValues& problem :
       line_problems(manifest.lines.at(0), op_named(manifest.lines[0].op))) {
    if (!has(values, problem.at(key))) values.push_back(problem.at(key));
  }
  std::sort(values.begin(), values.end(), [](const std::string& a, const std::string& b) {
    return std::stoll(a) < std::stoll(b);
  });
  return values;
}

}  // namespace

TEST_CASE("manifest ranges expand to values the op accepts (issue 20)") {
  // head_dim: multiples of 8 only; the ends and the multiples around each power of two.
  const auto head_dims = values_of("merge_state tokens=4 heads=8 head_dim=64..512", "head_dim");
  CHECK(head_dims == std::vector<std::string>{"64", "72", "120", "128", "136", "248", "256", "264",
                                              "504", "512"});
  // k: multiples of 16 in 16..256; a range reaching past the limit is clipped to it.
  const auto ks = values_of("gdn_decode batch=1 heads=16 v_heads=32 k=64..300 v=128", "k");
  CHECK(ks.front() == "64");
  CHECK(ks.back() == "256");
  for (const std::string& k : ks) CHECK(std::stoll(k) % 16 == 0);
  // gdn_prefill's K is one of 64, 128, 256.
  CHECK(values_of("gdn_prefill tokens=64 seqs=1 heads=16 v_heads=32 k=64..256 v=128", "k") ==
        std::vector<std::string>{"64", "128", "256"});
  // heads: the divisors of v_heads, per value of v_heads.
  CHECK(values_of("gdn_decode batch=1 heads=1..16 v_heads=32 k=128 v=128", "heads") ==
        std::vector<std::string>{"1", "2", "4", "8", "16"});
  const Manifest two =
      parse_manifest("gdn_decode batch=1 heads=3..6 v_heads=32,48 k=128 v=128\n", "m");
  std::vector<std::string> pairs;
  for (const ShapeValues& problem : line_problems(two.lines[0], op_named("gdn_decode"))) {
    pairs.push_back(problem.at("heads") + "/" + problem.at("v_heads"));
  }
  std::sort(pairs.begin(), pairs.end());
  CHECK(pairs == std::vector<std::string>{"3/48", "4/32", "4/48", "6/48"});
  // Unconstrained sizes keep the plain expansion; single values are left to the op.
  CHECK(values_of("merge_state tokens=1..3 heads=8 head_dim=64", "tokens") ==
        std::vector<std::string>{"1", "2", "3"});
  CHECK(values_of("merge_state tokens=4 heads=8 head_dim=65", "head_dim") ==
        std::vector<std::string>{"65"});
}

TEST_CASE("the issue's manifest ranges plan on sm_90 and sm_100a") {
  const Manifest manifest = parse_manifest(
      "merge_state dtype=bf16 head_dim=64..512 heads=1..16 tokens=64 lse_base=e\n"
      "gdn_decode batch=8 heads=1..16 v_heads=32 k=64..256 v=128\n"
      "gdn_prefill tokens=1000 seqs=4 heads=1..16 v_heads=32 k=64..256 v=64..256\n",
      "issue20.txt");
  Enumeration enumeration;
  REQUIRE_NOTHROW(enumeration =
                      enumerate_specs(manifest, {DeviceLimits::for_arch(Arch::parse("sm_90")),
                                                 DeviceLimits::for_arch(Arch::parse("sm_100a"))}));
  CHECK(enumeration.problems > 0);
  CHECK_FALSE(enumeration.specs.empty());
}

// kjit precompile plans each line on every product of an arch: causal_conv1d's prefill takes spans
// of 32 tokens on an H100 and 64 on an H200 (its span follows the DRAM bandwidth per SM), and a
// bundle for sm_90 must serve both. (gdn_prefill's ws kernel once differed between them too, at
// HV = 2H; both take it now.)
TEST_CASE("an sm_90 bundle holds the kernels the H100 and the H200 plan") {
  const Manifest manifest = parse_manifest(
      "causal_conv1d tokens=131072 seqs=16 dim=8192 dtype=bf16 width=4\n"
      "gdn_prefill tokens=131072 seqs=16 heads=16 v_heads=32 k=128 v=128 dtype=bf16\n",
      "span.txt");
  const auto specs = [&](const std::vector<DeviceLimits>& devices) {
    std::set<std::string> out;
    for (const KernelSpec& spec : enumerate_specs(manifest, devices).specs) {
      out.insert(spec.family == "causal_conv1d" ? spec.str() : spec.family);
    }
    return out;
  };
  const std::vector<DeviceLimits> products = DeviceLimits::products_of(Arch::parse("sm_90"));
  const auto h100 = specs({products[0]}), h200 = specs({products[1]}), both = specs(products);
  const auto span_of = [](const std::set<std::string>& set) {
    std::string spans;
    for (const std::string& s : set) {
      if (s.find("causal_conv1d") == 0)
        spans += s.substr(s.find("span="), s.find(",mode") - s.find("span=")) + ";";
    }
    return spans;
  };
  CHECK(span_of(h100) == "span=32;");
  CHECK(span_of(h200) == "span=64;");
  CHECK(span_of(both) == "span=32;span=64;");
  CHECK(h100.count("gdn_prefill_ws") == 1);
  CHECK(h200.count("gdn_prefill_ws") == 1);
  CHECK(both.size() == 3);
}

TEST_CASE("a manifest range with no accepted value is an error naming the line") {
  CHECK_THROWS_WITH_AS(
      enumerate_specs(
          parse_manifest("# sizes\nmerge_state tokens=4 heads=8 head_dim=65..71\n", "m.txt"),
          {DeviceLimits::for_arch(Arch::parse("sm_90"))}),
      doctest::Contains("m.txt:2: head_dim=65..71: range 65..71 holds no value the op accepts; "
                        "head_dim must be a multiple of 8 in 8..1024"),
      UsageError);
  CHECK_THROWS_WITH_AS(
      enumerate_specs(
          parse_manifest("gdn_decode batch=1 heads=5..7 v_heads=32 k=128 v=128\n", "m.txt"),
          {DeviceLimits::for_arch(Arch::parse("sm_90"))}),
      doctest::Contains("m.txt:1: heads=5..7: range 5..7 holds no value the op accepts; heads "
                        "must be >= 1, dividing v_heads (here v_heads = 32)"),
      UsageError);
}

TEST_CASE("plan refuses a size out of range by name (issue 20: heads = 0)") {
  const DeviceLimits sm90 = DeviceLimits::for_arch(Arch::parse("sm_90"));
  const OpInfo merge = op_named("merge_state");
  CHECK_THROWS_WITH_AS(
      plan_from_shape(
          merge,
          complete_shape_values(merge, {{"tokens", "4"}, {"heads", "0"}, {"head_dim", "64"}}, true),
          sm90),
      doctest::Contains("heads = 0 is out of range; heads must be >= 1"), InvalidArgument);
  // An empty batch is a real call: it plans (nothing is launched).
  CHECK(plan_from_shape(merge,
                        complete_shape_values(
                            merge, {{"tokens", "0"}, {"heads", "8"}, {"head_dim", "64"}}, true),
                        sm90)
            .mode == "empty");
  const OpInfo decode = op_named("gdn_decode");
  CHECK_THROWS_WITH_AS(
      plan_from_shape(
          decode,
          complete_shape_values(
              decode,
              {{"batch", "1"}, {"heads", "16"}, {"v_heads", "32"}, {"k", "512"}, {"v", "128"}},
              true),
          sm90),
      doctest::Contains("k = 512 is out of range; k must be a multiple of 16 in 16..256"),
      InvalidArgument);
}

TEST_CASE("command lines: a missing value and a repeated option are refused") {
  const ArgSpec spec{
      .values = {"arch", "verify"}, .any_value_option = true, .repeatable = {"verify"}};
  CHECK_THROWS_WITH_AS(parse_args({"merge_state", "--tokens", "--heads", "8"}, spec, "plan"),
                       doctest::Contains("plan: --tokens needs a value"), UsageError);
  CHECK_THROWS_WITH_AS(
      parse_args({"merge_state", "--heads", "8", "--heads=16"}, spec, "plan"),
      doctest::Contains("plan: --heads given twice ('8', then '16'); give it once"), UsageError);
  CHECK_THROWS_WITH_AS(parse_args({"-o", "a", "-o", "b"}, {.values = {"output"}}, "precompile"),
                       doctest::Contains("-o given twice"), UsageError);
  CHECK_THROWS_WITH_AS(parse_args({"-o", "--arch"}, {.values = {"output", "arch"}}, "precompile"),
                       doctest::Contains("-o needs a value"), UsageError);
  // Negative numbers are values; repeatable options keep every value.
  const Args args =
      parse_args({"--tokens", "-5", "--verify", "h100", "--verify", "h200"}, spec, "plan");
  CHECK(args.get("tokens") == "-5");
  CHECK(args.all("verify") == std::vector<std::string>{"h100", "h200"});
}

TEST_CASE("fabricated devices") {
  const DeviceLimits device = parse_device("name=tiny,base=h100,threads=256,grid_y=7,regs=4096");
  CHECK(device.name == "tiny");
  CHECK(device.max_threads_per_block == 256);
  CHECK(device.max_grid_dim[1] == 7);
  CHECK(device.regs_per_block == 4096);
  CHECK(device.arch.sm() == 90);
  CHECK_THROWS_WITH_AS(parse_device("warp=16"), doctest::Contains("unknown device key 'warp'"),
                       UsageError);
  // DRAM bandwidth in GB/s (the H100's table value otherwise), positive.
  CHECK(device.dram_bytes_per_second == 3'352'000'000'000);
  CHECK(parse_device("base=h100,dram_gbps=4000").dram_bytes_per_second == 4'000'000'000'000);
  CHECK(parse_device("base=h200").dram_bytes_per_second == 4'800'000'000'000);
  CHECK_THROWS_WITH_AS(parse_device("dram_gbps=0"),
                       doctest::Contains("device dram_gbps = 0: must be in 1..1000000 (GB/s)"),
                       UsageError);
  CHECK_THROWS_WITH_AS(parse_device("dram_gbps=99999999999"),
                       doctest::Contains("device dram_gbps = 99999999999: must be in 1..1000000"),
                       UsageError);
  CHECK(parse_device("dram_gbps=1000000").dram_bytes_per_second == 1'000'000'000'000'000);
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
