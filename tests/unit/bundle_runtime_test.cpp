// SPDX-License-Identifier: Apache-2.0
// The Runtime's use of KJIT_BUNDLE_PATH bundles: searched before the disk cache, usable without
// NVRTC, and with KJIT_DISABLE_JIT=1 a miss is KernelNotInBundle naming the nearest specs.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cache/bundle.hpp"
#include "kjit/error.hpp"
#include "kjit/runtime.hpp"
#include "support/hash.hpp"

namespace kjit::cache {
namespace {

CompiledKernel bundled(const std::string& spec_text) {
  CompiledKernel kernel;
  kernel.spec = KernelSpec::parse(spec_text);
  kernel.cubin = "fake cubin";
  kernel.lowered_name = "_Z5probev";
  kernel.resources.registers = 20;
  kernel.key = support::xxh3_128(spec_text).hex();
  return kernel;
}

struct BundleFixture {
  std::filesystem::path dir;
  std::string path;
  BundleFixture() {
    char pattern[] = "/tmp/kjit-bundle-runtime-XXXXXX";
    dir = ::mkdtemp(pattern);
    path = (dir / "probe.kjb").string();
    write_bundle(path, BundleInfo::current("nvrtc-test", {"sm_90"}, "probe\n"),
                 {bundled("probe:heavy=0@sm_90")});
  }
  ~BundleFixture() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  Settings settings() const {
    Settings settings;
    settings.cache_dir = (dir / "cache").string();
    settings.bundle_paths = {path};
    settings.disable_jit = true;
    settings.nvrtc_library = "/nonexistent/libnvrtc.so";
    return settings;
  }
};

}  // namespace

TEST_CASE("the runtime serves a bundled kernel without NVRTC") {
  BundleFixture fixture;
  Runtime runtime(fixture.settings());
  KernelSource source = KernelSource::compiled;
  const auto kernel = runtime.compiled(KernelSpec::parse("probe:heavy=0@sm_90"), &source);
  REQUIRE(kernel);
  CHECK(kernel->cubin == "fake cubin");
  CHECK(source == KernelSource::bundle);
  CHECK(runtime.stats().bundle_hits == 1);
}

TEST_CASE("with JIT disabled a bundle miss names the nearest bundled specs") {
  BundleFixture fixture;
  Runtime runtime(fixture.settings());
  CHECK_THROWS_WITH_AS(runtime.compiled(KernelSpec::parse("probe:heavy=1@sm_90")),
                       doctest::Contains("probe:heavy=0@sm_90 (differs in heavy)"),
                       KernelNotInBundle);
}

}  // namespace kjit::cache
