// SPDX-License-Identifier: Apache-2.0
// The deployment paths of the Runtime (issue 20): a pre-filled disk cache, also read-only,
// serves kernels with JIT disabled and without NVRTC; each resolution is logged once, with
// where the kernel came from; KJIT_LOG is read in any case; bundles built twice from empty
// caches are the same bytes.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cache/bundle.hpp"
#include "cache/disk_cache.hpp"
#include "cache/entry.hpp"
#include "cache/key.hpp"
#include "kjit/error.hpp"
#include "kjit/runtime.hpp"
#include "stress/cache_test_support.hpp"
#include "support/log.hpp"
#include "templates/common/tensor_map.h"

namespace kjit::cache {
namespace {

using test::TempDir;

constexpr const char* kSpec = "probe:heavy=0@sm_90";
constexpr const char* kOtherSpec = "probe:heavy=1@sm_90";
constexpr uid_t kNobody = 65534;

struct LogLevelScope {
  LogLevelScope() : saved(support::log_level()) {}
  ~LogLevelScope() { support::set_log_level(saved); }
  LogLevel saved;
};

/// Makes every write probe of a DiskCache fail with EROFS while alive: a read-only mount, which
/// root (who runs these tests in CI) cannot otherwise get from file modes.
struct ReadOnlyScope {
  ReadOnlyScope() {
    testing::set_fault_hook([](testing::FsStep step, const char*) {
      return step == testing::FsStep::probe_root || step == testing::FsStep::make_dir ? EROFS : 0;
    });
  }
  ~ReadOnlyScope() { testing::set_fault_hook(nullptr); }
};

/// Compiles `spec` into the disk cache under `dir` with NVRTC, as a normal run would.
void fill_cache(const std::string& dir, const char* spec = kSpec) {
  Settings settings;
  settings.cache_dir = dir;
  settings.log_level = LogLevel::error;
  Runtime runtime(settings);
  KernelSource source = KernelSource::memory;
  REQUIRE(runtime.compiled(KernelSpec::parse(spec), &source) != nullptr);
  REQUIRE(source == KernelSource::compiled);
}

/// Deployment settings: JIT disabled and an NVRTC that cannot load (none installed), so a
/// hit proves the cache was used without compiling, and that the memo's selector (which names
/// the library setting) need not match the one of the process that filled the cache.
Settings deployment(const std::string& dir) {
  Settings settings;
  settings.cache_dir = dir;
  settings.disable_jit = true;
  settings.nvrtc_library = "/nonexistent/libnvrtc.so";
  settings.log_level = LogLevel::error;
  return settings;
}

}  // namespace

TEST_CASE("deployment: with JIT disabled a pre-filled disk cache serves its kernels") {
  const LogLevelScope restore;
  TempDir tmp;
  const std::string dir = tmp / "cache";
  fill_cache(dir);
  Runtime runtime(deployment(dir));
  KernelSource source = KernelSource::compiled;
  const auto kernel = runtime.compiled(KernelSpec::parse(kSpec), &source);
  REQUIRE(kernel != nullptr);
  CHECK(!kernel->cubin.empty());
  CHECK(source == KernelSource::disk);
  CHECK(runtime.stats().disk_hits == 1);
  CHECK_FALSE(runtime.stats().nvrtc_loaded);
  // A spec the cache lacks is KernelNotInBundle naming the cache it searched, never a compile.
  CHECK_THROWS_WITH_AS(runtime.compiled(KernelSpec::parse(kOtherSpec)),
                       doctest::Contains(("not in the disk cache " + dir).c_str()),
                       KernelNotInBundle);
  CHECK_FALSE(runtime.stats().nvrtc_loaded);
  CHECK(runtime.stats().compiles == 0);
}

// The runtime's memory tier (what lib/cache/memory_cache used to be tested for, before that
// unused class was removed): a second lookup hands back the first kernel, not a new copy.
TEST_CASE("runtime memory tier: a second lookup of a spec returns the first kernel") {
  const LogLevelScope restore;
  TempDir tmp;
  const std::string dir = tmp / "cache";
  fill_cache(dir);
  Runtime runtime(deployment(dir));
  KernelSource first_source = KernelSource::compiled;
  const auto first = runtime.compiled(KernelSpec::parse(kSpec), &first_source);
  REQUIRE(first != nullptr);
  CHECK(first_source == KernelSource::disk);
  KernelSource second_source = KernelSource::compiled;
  const auto second = runtime.compiled(KernelSpec::parse(kSpec), &second_source);
  CHECK(second_source == KernelSource::memory);
  CHECK(second == first);
  CHECK(runtime.stats().memory_hits == 1);
  CHECK(runtime.stats().disk_hits == 1);
}

TEST_CASE("deployment: with JIT disabled an empty or disabled disk cache is named in the miss") {
  const LogLevelScope restore;
  TempDir tmp;
  Settings settings = deployment(tmp / "cache");
  {
    Runtime runtime(settings);
    CHECK_THROWS_WITH_AS(runtime.compiled(KernelSpec::parse(kSpec)),
                         doctest::Contains("it remembers no compiler"), KernelNotInBundle);
  }
  settings.disable_disk_cache = true;
  Runtime runtime(settings);
  CHECK_THROWS_WITH_AS(runtime.compiled(KernelSpec::parse(kSpec)),
                       doctest::Contains("KJIT_DISABLE_DISK_CACHE=1"), KernelNotInBundle);
}

TEST_CASE("deployment: a read-only pre-filled disk cache is read, and nothing is stored") {
  const LogLevelScope restore;
  TempDir tmp;
  const std::string dir = tmp / "cache";
  fill_cache(dir);
  const std::vector<std::string> files_before = test::list_files(dir);
  SUBCASE("JIT disabled: the kernel comes from the cache") {
    const ReadOnlyScope read_only;
    Runtime runtime(deployment(dir));
    KernelSource source = KernelSource::compiled;
    REQUIRE(runtime.compiled(KernelSpec::parse(kSpec), &source) != nullptr);
    CHECK(source == KernelSource::disk);
    CHECK_FALSE(runtime.stats().disk_enabled);  // nothing can be written
    CHECK_FALSE(runtime.stats().nvrtc_loaded);
  }
  SUBCASE("JIT enabled: a hit is a hit; a miss compiles into memory only") {
    const ReadOnlyScope read_only;
    Settings settings;
    settings.cache_dir = dir;
    settings.log_level = LogLevel::error;
    Runtime runtime(settings);
    KernelSource source = KernelSource::compiled;
    REQUIRE(runtime.compiled(KernelSpec::parse(kSpec), &source) != nullptr);
    CHECK(source == KernelSource::disk);
    REQUIRE(runtime.compiled(KernelSpec::parse(kOtherSpec), &source) != nullptr);
    CHECK(source == KernelSource::compiled);
    CHECK(runtime.stats().compiles == 1);
  }
  CHECK(test::list_files(dir) == files_before);
}

TEST_CASE("deployment: a cache the process may not write (real permissions) is still read") {
  // Root ignores file modes, so a root test process gives the cache to uid 65534, makes its
  // compiler directory read-only (0500) and reads it from a child that drops to that user.
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to give the cache to uid 65534 and drop to it");
    return;
  }
  TempDir tmp;
  REQUIRE(::chmod(tmp.path().c_str(), 0755) == 0);
  const std::string root = tmp / "cache";
  const support::Hash128 key = [] {
    KeyMaterial material;
    material.add("read-only", "1");
    return material.key();
  }();
  std::mt19937_64 rng(3);
  CompiledKernel kernel = test::random_kernel(rng, 0);
  kernel.key = key.hex();
  std::string compiler_dir;
  {
    DiskCache cache(root, "nvrtc-read-only");
    REQUIRE(cache.store(key, "sm_90", kernel));
    // <root>/v1/<compiler>/<arch>/<2 hex>/<key>.kjc
    compiler_dir = std::filesystem::path(cache.entry_path(key, "sm_90"))
                       .parent_path()
                       .parent_path()
                       .parent_path()
                       .string();
  }
  for (auto it = std::filesystem::recursive_directory_iterator(root);
       it != std::filesystem::recursive_directory_iterator(); ++it) {
    REQUIRE(::lchown(it->path().c_str(), kNobody, kNobody) == 0);
  }
  REQUIRE(::chown(root.c_str(), kNobody, kNobody) == 0);
  REQUIRE(::chmod(compiler_dir.c_str(), 0500) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 0;
    support::set_log_level(LogLevel::off);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(2);
    DiskCache cache(root, "nvrtc-read-only");
    if (cache.enabled()) code = 3;                                     // it cannot be written
    if (code == 0 && !cache.load(key, "sm_90").has_value()) code = 4;  // but it is read
    if (code == 0 && cache.store(key, "sm_90", kernel)) code = 5;      // nor written
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("deployment: KJIT_LOG=debug logs each resolution once, with where it came from") {
  const LogLevelScope restore;
  TempDir tmp;
  const std::string dir = tmp / "cache";
  Settings settings;
  settings.cache_dir = dir;
  settings.log_level = LogLevel::debug;
  // The Runtime's lines about a kernel start with its spec; the compile layer adds none (it
  // once logged a second "compiled <spec> in N ms" line).
  const auto lines_naming = [](const std::string& log, const std::string& spec) {
    const std::string prefix = "] " + spec + ": ";
    std::vector<std::string> lines;
    std::size_t start = 0;
    while (start < log.size()) {
      std::size_t end = log.find('\n', start);
      if (end == std::string::npos) end = log.size();
      const std::string line = log.substr(start, end - start);
      if (line.find(prefix) != std::string::npos) lines.push_back(line);
      start = end + 1;
    }
    return lines;
  };
  std::string bundle_path = tmp / "probe.kjb";
  {
    test::StderrCapture capture;
    Runtime runtime(settings);
    const auto kernel = runtime.compiled(KernelSpec::parse(kSpec));
    runtime.compiled(KernelSpec::parse(kSpec));  // a memory hit: no second line
    write_bundle(bundle_path, BundleInfo::current("test", {"sm_90"}, "probe\n"), {*kernel});
    const std::vector<std::string> lines = lines_naming(capture.text(), kSpec);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("compiling with NVRTC") != std::string::npos);
    CHECK(capture.text().find("compiled " + std::string(kSpec) + " in ") == std::string::npos);
  }
  {
    test::StderrCapture capture;
    Runtime runtime(settings);
    runtime.compiled(KernelSpec::parse(kSpec));
    const std::vector<std::string> lines = lines_naming(capture.text(), kSpec);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].rfind("[kjit debug] ", 0) == 0);
    CHECK(lines[0].find("from the disk cache, " + dir) != std::string::npos);
    CHECK(lines[0].find(".kjc") != std::string::npos);
  }
  {
    settings.bundle_paths = {bundle_path};
    test::StderrCapture capture;
    Runtime runtime(settings);
    runtime.compiled(KernelSpec::parse(kSpec));
    const std::vector<std::string> lines = lines_naming(capture.text(), kSpec);
    REQUIRE(lines.size() == 1);
    CHECK(lines[0].find("from bundle " + bundle_path) != std::string::npos);
  }
}

TEST_CASE("deployment: KJIT_LOG is read in any case") {
  const char* saved = std::getenv("KJIT_LOG");
  const std::string saved_value = saved != nullptr ? saved : "";
  for (const auto& [text, level] :
       {std::pair{"DEBUG", LogLevel::debug}, std::pair{"Info", LogLevel::info},
        std::pair{"WARN", LogLevel::warn}, std::pair{"Off", LogLevel::off}}) {
    CAPTURE(text);
    ::setenv("KJIT_LOG", text, 1);
    CHECK(Settings::from_env().log_level == level);
  }
  ::setenv("KJIT_LOG", "loud", 1);
  CHECK_THROWS_WITH_AS(Settings::from_env(), doctest::Contains("KJIT_LOG=loud"), InvalidArgument);
  if (saved != nullptr) {
    ::setenv("KJIT_LOG", saved_value.c_str(), 1);
  } else {
    ::unsetenv("KJIT_LOG");
  }
}

TEST_CASE("settings: KJIT_TENSOR_MAPS picks the warp-specialized kernel's TMA copies") {
  const char* saved = std::getenv("KJIT_TENSOR_MAPS");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("KJIT_TENSOR_MAPS");
  CHECK(Settings::from_env().tensor_map_loads);  // on by default (timed on the H100)
  CHECK(Settings::from_env().tensor_map_stores);
  CHECK(Settings{}.tensor_map_loads);
  CHECK(Settings{}.tensor_map_stores);
  for (const auto& [text, loads, stores] :
       {std::tuple{"0", false, false}, std::tuple{"loads", true, false},
        std::tuple{"stores", false, true}, std::tuple{"1", true, true},
        std::tuple{"all", true, true}, std::tuple{"none", false, false}}) {
    CAPTURE(text);
    ::setenv("KJIT_TENSOR_MAPS", text, 1);
    const Settings s = Settings::from_env();
    CHECK(s.tensor_map_loads == loads);
    CHECK(s.tensor_map_stores == stores);
  }
  ::setenv("KJIT_TENSOR_MAPS", "load", 1);
  CHECK_THROWS_WITH_AS(Settings::from_env(), doctest::Contains("KJIT_TENSOR_MAPS=load: expected"),
                       InvalidArgument);
  if (saved != nullptr) {
    ::setenv("KJIT_TENSOR_MAPS", saved_value.c_str(), 1);
  } else {
    ::unsetenv("KJIT_TENSOR_MAPS");
  }
}

TEST_CASE("Runtime::encode_tensor_map refuses a null or misaligned map before the driver") {
  Runtime runtime(Settings{});
  TensorMapRequest request;
  request.rank = 1;
  request.dims[0] = 64;
  request.box[0] = 64;
  CHECK_THROWS_WITH_AS(runtime.encode_tensor_map(request, nullptr),
                       doctest::Contains("128-byte aligned CUtensorMap of 128 bytes"),
                       InvalidArgument);
  alignas(128) unsigned char storage[256];
  CHECK_THROWS_WITH_AS(runtime.encode_tensor_map(request, storage + 8),
                       doctest::Contains("encode_tensor_map: map 0x"), InvalidArgument);
}

TEST_CASE("Runtime::encode_tensor_map names what TMA cannot take, before the driver") {
  // (No GPU here: each refusal must come before the driver is loaded.)
  Runtime runtime(Settings{});
  alignas(16) static unsigned char tensor[1 << 12];
  TensorMapRequest good;  // [T = 16, 128] bf16 in boxes of 64 columns x 16 rows, 128-byte swizzle
  good.element = DType::bf16;
  good.rank = 2;
  good.base = tensor;
  good.dims[0] = 128;
  good.dims[1] = 16;
  good.strides[0] = 256;
  good.box[0] = 64;
  good.box[1] = 16;
  good.swizzle_bytes = 128;
  TensorMap map{};
  const auto refusal = [&](const TensorMapRequest& r) {
    std::string why;
    map.words[0] = ~0ull;
    CHECK_FALSE(runtime.encode_tensor_map(r, &map, &why));
    CHECK(map.words[0] == 0);  // a refused map is zeroed, never half written
    return why;
  };
  TensorMapRequest r = good;
  r.base = tensor + 8;
  CHECK(refusal(r).find("base 0x") != std::string::npos);
  CHECK(refusal(r).find("not 16-byte aligned") != std::string::npos);
  r = good;
  r.strides[0] = 264;
  CHECK(refusal(r) == "strides[0] = 264 bytes (a positive multiple of 16 below 2^40)");
  r = good;
  r.box[0] = 128;
  CHECK(refusal(r) ==
        "box[0] = 128 elements of 2 bytes: 256-byte rows under a 128-byte swizzle (at most the "
        "swizzle's span)");
  r = good;
  r.box[1] = 257;
  CHECK(refusal(r) == "box[1] = 257 (1 to 256)");
  r = good;
  r.dims[1] = 0;
  CHECK(refusal(r) == "dims[1] = 0 (1 to 2^32)");
  r = good;
  r.box[0] = 4;
  r.swizzle_bytes = 0;
  CHECK(refusal(r) == "box[0] = 4 elements of 2 bytes: 8 bytes, not a multiple of 16");
  r = good;
  r.rank = 6;
  CHECK(refusal(r) == "rank 6 (1 to 5)");
  r = good;
  r.swizzle_bytes = 48;
  CHECK(refusal(r) == "swizzle of 48 bytes (0, 32, 64 or 128)");
}

TEST_CASE("deployment: entries and bundles compiled twice from empty caches are the same bytes") {
  const LogLevelScope restore;
  CHECK(reproducible_log("ptxas info    : Used 8 registers\n"
                         "ptxas info    : Compile time = 1.234 ms\n"
                         "ptxas info    : 0 bytes gmem") ==
        "ptxas info    : Used 8 registers\nptxas info    : 0 bytes gmem");
  TempDir tmp;
  std::vector<std::string> bundles;
  std::vector<std::string> entries;
  for (const char* name : {"first", "second"}) {
    Settings settings;
    settings.cache_dir = tmp / name;
    settings.log_level = LogLevel::error;
    Runtime runtime(settings);
    std::vector<CompiledKernel> kernels;
    for (const char* spec : {kSpec, kOtherSpec}) {
      kernels.push_back(*runtime.compiled(KernelSpec::parse(spec)));
      CHECK(kernels.back().log.find("Compile time") == std::string::npos);
    }
    bundles.push_back(encode_bundle(BundleInfo::current("id", {"sm_90"}, "m\n"), kernels));
    std::string bytes;
    for (const std::string& file : test::list_files(tmp / name)) {
      if (file.ends_with(".kjc")) bytes += test::read_file(tmp / name + "/" + file);
    }
    entries.push_back(bytes);
  }
  CHECK(bundles[0] == bundles[1]);
  CHECK(!entries[0].empty());
  CHECK(entries[0] == entries[1]);
}

}  // namespace kjit::cache
