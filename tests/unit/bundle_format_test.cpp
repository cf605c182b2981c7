// SPDX-License-Identifier: Apache-2.0
// Bundles: round trip, lookups, nearest specs, and refusal of every corrupt, truncated or
// foreign bundle. Kernels are fabricated (the format never looks inside a cubin), so no NVRTC
// is needed.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/bundle.hpp"
#include "codegen/embedded_templates.hpp"
#include "kjit/error.hpp"
#include "kjit/version.hpp"
#include "support/hash.hpp"

namespace kjit::cache {
namespace {

CompiledKernel fake_kernel(const std::string& spec_text, int registers) {
  CompiledKernel kernel;
  kernel.spec = KernelSpec::parse(spec_text);
  kernel.cubin = "fake cubin of " + spec_text;
  kernel.ptx = "// fake ptx\n";
  kernel.lowered_name = "_Z5probev";
  kernel.source = "#include \"templates/probe/probe.cuh\"\n";
  kernel.options = "-arch=sm_90";
  kernel.resources.registers = registers;
  kernel.resources.static_smem = 1024;
  kernel.key = support::xxh3_128(spec_text).hex();
  kernel.key_material = "spec: " + spec_text + "\n";
  return kernel;
}

std::vector<CompiledKernel> fake_kernels() {
  return {fake_kernel("probe:heavy=0@sm_90", 16), fake_kernel("probe:heavy=1@sm_90", 255),
          fake_kernel("probe:heavy=0@sm_100a", 18)};
}

BundleInfo info() { return BundleInfo::current("nvrtc-test", {"sm_90", "sm_100a"}, "probe\n"); }

std::string error_of(std::string_view bytes) {
  try {
    (void)Bundle::from_bytes(bytes, "test.kjb");
  } catch (const CacheError& error) {
    return error.what();
  }
  return {};
}

bool contains(const std::string& text, std::string_view part) {
  return text.find(part) != std::string::npos;
}

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char pattern[] = "/tmp/kjit-bundle-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace

TEST_CASE("a bundle round-trips its header and every kernel") {
  const Bundle bundle = Bundle::from_bytes(encode_bundle(info(), fake_kernels()), "mem.kjb");
  CHECK(bundle.info().library_version == kVersion);
  CHECK(bundle.info().template_digest == codegen::template_set_digest());
  CHECK(bundle.info().compiler_id == "nvrtc-test");
  CHECK(bundle.info().archs == std::vector<std::string>{"sm_90", "sm_100a"});
  CHECK(bundle.info().manifest == "probe\n");
  REQUIRE(bundle.entries().size() == 3);
  for (const CompiledKernel& kernel : fake_kernels()) {
    CAPTURE(kernel.spec.str());
    const auto found = bundle.find(kernel.spec);
    REQUIRE(found);
    CHECK(found->cubin == kernel.cubin);
    CHECK(found->key == kernel.key);
    CHECK(found->key_material == kernel.key_material);
    CHECK(found->resources.registers == kernel.resources.registers);
  }
  CHECK(bundle.entries()[1].resources.registers == 255);
  CHECK_FALSE(bundle.find(KernelSpec::parse("probe:heavy=1@sm_100a")));
  CHECK_FALSE(bundle.find(KernelSpec::parse("probe:heavy=0@sm_80")));
}

TEST_CASE("encoding is deterministic and stores a spec once") {
  std::vector<CompiledKernel> twice = fake_kernels();
  twice.push_back(fake_kernels()[0]);
  CHECK(encode_bundle(info(), twice) == encode_bundle(info(), fake_kernels()));
}

TEST_CASE("a kernel without a key cannot be bundled") {
  std::vector<CompiledKernel> kernels = fake_kernels();
  kernels[1].key = "not-a-key";
  CHECK_THROWS_AS(encode_bundle(info(), kernels), InvalidArgument);
}

TEST_CASE("write_bundle and open go through the file system") {
  TempDir dir;
  const std::string path = (dir.path / "test.kjb").string();
  write_bundle(path, info(), fake_kernels());
  const Bundle bundle = Bundle::open(path);
  CHECK(bundle.path() == path);
  CHECK(bundle.entries().size() == 3);
  // Only the bundle is left: the temp file was renamed.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path),
                      std::filesystem::directory_iterator()) == 1);
  CHECK_THROWS_WITH_AS(Bundle::open((dir.path / "missing.kjb").string()),
                       doctest::Contains("cannot open bundle"), CacheError);
}

TEST_CASE("nearest ranks same-family specs by differing parameters") {
  const Bundle bundle = Bundle::from_bytes(encode_bundle(info(), fake_kernels()), "mem.kjb");
  const auto near = bundle.nearest(KernelSpec::parse("probe:heavy=1@sm_100a"), 2);
  // Two specs differ in one parameter (heavy, or arch); ties go in text order.
  CHECK(near == std::vector<std::string>{"probe:heavy=0@sm_100a", "probe:heavy=1@sm_90"});
  CHECK(bundle.nearest(KernelSpec::parse("probe:heavy=1@sm_100a"), 10).size() == 3);
  CHECK(spec_differences(KernelSpec::parse("probe:heavy=1@sm_100a"),
                         KernelSpec::parse("probe:heavy=0@sm_90")) ==
        std::vector<std::string>{"heavy", "arch"});
}

TEST_CASE("a bundle set searches in order and explains a miss") {
  BundleSet set;
  CHECK(set.empty());
  CHECK(contains(set.miss_message(KernelSpec::parse("probe:heavy=0@sm_90")),
                 "KJIT_BUNDLE_PATH is empty"));
  set.add(
      Bundle::from_bytes(encode_bundle(info(), {fake_kernel("probe:heavy=0@sm_90", 16)}), "a.kjb"));
  set.add(Bundle::from_bytes(encode_bundle(info(), fake_kernels()), "b.kjb"));
  CHECK(set.find(KernelSpec::parse("probe:heavy=1@sm_90"))->resources.registers == 255);
  CHECK(set.paths() == std::vector<std::string>{"a.kjb", "b.kjb"});
  const std::string message = set.miss_message(KernelSpec::parse("probe:heavy=1@sm_100a"));
  CHECK(contains(message, "probe:heavy=1@sm_100a is in no bundle"));
  CHECK(contains(message, "a.kjb:b.kjb"));
  CHECK(contains(message, "probe:heavy=0@sm_100a (differs in heavy)"));
  CHECK(contains(message, "probe:heavy=1@sm_90 (differs in arch)"));
  CHECK(set.nearest(KernelSpec::parse("probe:heavy=1@sm_100a"), 5).size() == 3);
}

TEST_CASE("every flipped byte of a bundle is detected") {
  const std::string bytes = encode_bundle(info(), fake_kernels());
  REQUIRE(error_of(bytes).empty());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::string corrupt = bytes;
    corrupt[i] = static_cast<char>(corrupt[i] ^ 0x20);
    const std::string message = error_of(corrupt);
    CAPTURE(i);
    CHECK_FALSE(message.empty());
  }
}

TEST_CASE("every truncation and trailing garbage is detected") {
  const std::string bytes = encode_bundle(info(), fake_kernels());
  for (std::size_t size = 0; size < bytes.size(); ++size) {
    CAPTURE(size);
    CHECK_FALSE(error_of(std::string_view(bytes).substr(0, size)).empty());
  }
  CHECK(contains(error_of(bytes + "x"), "trailing bytes"));
}

TEST_CASE("a flipped cubin byte is reported with the entry") {
  std::string bytes = encode_bundle(info(), fake_kernels());
  const auto at = bytes.find("fake cubin of probe:heavy=1@sm_90");
  REQUIRE(at != std::string::npos);
  bytes[at + 3] ^= 1;
  const std::string message = error_of(bytes);
  CHECK(contains(message, "test.kjb is corrupt"));
  CHECK(contains(message, "entry 2 (probe:heavy=1@sm_90): checksum mismatch"));
}

TEST_CASE("a bundle of another library version or other templates is refused") {
  BundleInfo old = info();
  old.library_version = "0.0.9";
  const std::string message = error_of(encode_bundle(old, fake_kernels()));
  CHECK(contains(message, "built by kjit 0.0.9"));
  CHECK(contains(message, std::string("this is kjit ") + kVersion));

  BundleInfo other = info();
  other.template_digest = "0123456789abcdef0123456789abcdef";
  const std::string refused = error_of(encode_bundle(other, fake_kernels()));
  CHECK(contains(refused, "templates 0123456789abcdef0123456789abcdef"));
  CHECK(contains(refused, codegen::template_set_digest()));
}

TEST_CASE("not a bundle, or another format version") {
  CHECK(contains(error_of("hello"), "not a kjit bundle"));
  std::string bytes = encode_bundle(info(), fake_kernels());
  bytes[8] = 2;
  CHECK(contains(error_of(bytes), "format version 2"));
}

}  // namespace kjit::cache
