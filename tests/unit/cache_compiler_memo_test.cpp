// SPDX-License-Identifier: Apache-2.0
// The compiler memo: a fresh runtime finds disk-cached kernels without loading NVRTC when the
// identity of the compiler that keyed them is remembered, and never trusts a memo whose
// library file changed, that was written for other settings, or that does not parse.

#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cache/compiler_memo.hpp"
#include "kjit/runtime.hpp"

namespace kjit::cache {
namespace {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char pattern[] = "/tmp/kjit-memo-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

constexpr const char* kSpec = "probe:heavy=0@sm_90";

struct Run {
  KernelSource source;
  CacheStats stats;
};

/// One fresh runtime over `dir` compiling (or finding) kSpec.
Run compile_once(const std::string& dir, const std::string& nvrtc_library = "") {
  Settings settings;
  settings.cache_dir = dir;
  settings.nvrtc_library = nvrtc_library;
  Runtime runtime(settings);
  KernelSource source = KernelSource::memory;
  const auto kernel = runtime.compiled(KernelSpec::parse(kSpec), &source);
  REQUIRE(kernel != nullptr);
  CHECK(!kernel->cubin.empty());
  return {source, runtime.stats()};
}

TEST_CASE("cache memo: a warm runtime finds disk-cached kernels without loading NVRTC") {
  TempDir dir;
  const Run cold = compile_once(dir.path.string());
  CHECK(cold.source == KernelSource::compiled);
  CHECK(cold.stats.nvrtc_loaded);
  // The memo sits beside the cache, under v1/compilers/.
  int memos = 0;
  std::string memo_path;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path / "v1" / "compilers")) {
    ++memos;
    memo_path = entry.path().string();
  }
  REQUIRE(memos == 1);
  const std::string memo_text = read_text(memo_path);
  CHECK(memo_text.rfind("kjit compiler memo 1\nselector nvrtc_library=;", 0) == 0);

  const Run warm = compile_once(dir.path.string());
  CHECK(warm.source == KernelSource::disk);
  CHECK(warm.stats.disk_hits == 1);
  CHECK_FALSE(warm.stats.nvrtc_loaded);

  SUBCASE("a changed library stamp: NVRTC is loaded and the memo rewritten") {
    std::string stale = memo_text;
    const std::size_t at = stale.find("\nstamp ");
    REQUIRE(at != std::string::npos);
    // A different size. (Concatenation: string::insert of a literal trips GCC 12's -Wrestrict
    // false positive at -O3.)
    stale = stale.substr(0, at + 7) + "1" + stale.substr(at + 7);
    write_text(memo_path, stale);
    const Run run = compile_once(dir.path.string());
    CHECK(run.source == KernelSource::disk);
    CHECK(run.stats.nvrtc_loaded);
    CHECK(read_text(memo_path) == memo_text);
    CHECK_FALSE(compile_once(dir.path.string()).stats.nvrtc_loaded);
  }
  SUBCASE("a corrupt or truncated memo is ignored and replaced") {
    for (const std::string& bad :
         {std::string("garbage"), memo_text.substr(0, memo_text.size() - 3), memo_text + "trailing",
          std::string()}) {
      write_text(memo_path, bad);
      const Run run = compile_once(dir.path.string());
      CHECK(run.source == KernelSource::disk);
      CHECK(run.stats.nvrtc_loaded);
      CHECK(read_text(memo_path) == memo_text);
    }
  }
  SUBCASE("another library setting has its own memo") {
    const Run other = compile_once(dir.path.string(), "libnvrtc.so.13");
    CHECK(other.stats.nvrtc_loaded);
    CHECK(other.source == KernelSource::disk);  // same compiler, same key
    int count = 0;
    for ([[maybe_unused]] const auto& entry :
         std::filesystem::directory_iterator(dir.path / "v1" / "compilers")) {
      ++count;
    }
    CHECK(count == 2);
  }
  SUBCASE("a memo naming another compiler id finds nothing, then NVRTC finds the entry") {
    std::string other = memo_text;
    const std::size_t at = other.find("\nid ");
    REQUIRE(at != std::string::npos);
    other = other.substr(0, at + 4) + "x" + other.substr(at + 4);
    write_text(memo_path, other);
    const Run run = compile_once(dir.path.string());
    CHECK(run.source == KernelSource::disk);
    CHECK(run.stats.nvrtc_loaded);
  }
}

TEST_CASE("cache memo: a memo is valid only while its library file is unchanged") {
  TempDir dir;
  std::filesystem::create_directories(dir.path / "v1");
  const std::string library = (dir.path / "libfake.so").string();
  write_text(library, "one");
  const CompilerMemo memo{"nvrtc-13.0-test", "nvrtc 13.0\nbanner\n"};
  REQUIRE(write_compiler_memo(dir.path.string(), "sel", library, memo));
  const auto read = read_compiler_memo(dir.path.string(), "sel");
  REQUIRE(read.has_value());
  CHECK(read->id == memo.id);
  CHECK(read->material == memo.material);
  CHECK_FALSE(read_compiler_memo(dir.path.string(), "other selector").has_value());
  write_text(library, "two!");  // new size and mtime
  CHECK_FALSE(read_compiler_memo(dir.path.string(), "sel").has_value());
  std::filesystem::remove(library);
  CHECK_FALSE(read_compiler_memo(dir.path.string(), "sel").has_value());
  // Nothing to describe: no memo is written, and nothing is thrown.
  CHECK_FALSE(write_compiler_memo(dir.path.string(), "sel", library, memo));
  CHECK_FALSE(write_compiler_memo(dir.path.string(), "line\nbreak", library, memo));
}

}  // namespace
}  // namespace kjit::cache
