// SPDX-License-Identifier: Apache-2.0
// The real compile path under a process race: 8 processes ask a fresh Runtime for the same 4
// specs at once, sharing one cache directory. NVRTC must run once per spec in total, and every
// process must end up with the same verified kernel. Needs libnvrtc (no GPU); skipped without.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kjit/error.hpp"
#include "kjit/runtime.hpp"
#include "stress/cache_test_support.hpp"
#include "support/hash.hpp"

namespace kjit {
namespace test = cache::test;

namespace {

constexpr int kProcesses = 8;
constexpr int kNoCompiler = 77;
const char* const kSpecs[] = {"probe:heavy=0@sm_90", "probe:heavy=1@sm_90", "probe:heavy=0@sm_80",
                              "probe:heavy=1@sm_80"};

/// One racing process: compiles every spec, writes "<compiles> <disk hits>" and a line of
/// cubin hashes.
int racer(const std::string& root, const std::string& report, int index) {
  try {
    Settings settings;
    settings.cache_dir = root;
    settings.log_level = LogLevel::error;
    Runtime runtime(settings);
    std::string hashes[4];
    for (int i = 0; i < 4; ++i) {
      const int s = index % 2 == 0 ? i : 3 - i;
      KernelSource source{};
      const auto kernel = runtime.compiled(KernelSpec::parse(kSpecs[s]), &source);
      if (kernel == nullptr || kernel->cubin.empty()) return 10;
      if (source != KernelSource::compiled && source != KernelSource::disk) return 11;
      hashes[s] = fmt::format("{:016x}", support::xxh3_64(kernel->cubin));
    }
    const CacheStats stats = runtime.stats();
    if (!stats.disk_enabled || stats.corrupt_entries != 0 || stats.write_failures != 0) return 12;
    // Hashes in spec order, whatever order this process asked in.
    test::write_file(report, fmt::format("{} {}\n{} {} {} {}\n", stats.compiles, stats.disk_hits,
                                         hashes[0], hashes[1], hashes[2], hashes[3]));
    return 0;
  } catch (const CompileError& error) {
    const std::string what = error.what();
    // Only "NVRTC is not installed" skips; a real compile error fails the test.
    if (what.find("libnvrtc") != std::string::npos && error.log().empty()) {
      test::write_file(report, what);
      return kNoCompiler;
    }
    test::write_file(report, what);
    return 13;
  } catch (const std::exception& error) {
    test::write_file(report, error.what());
    return 14;
  }
}

}  // namespace

TEST_CASE("runtime stress: 8 processes compile 4 real specs once in total") {
  test::TempDir tmp;
  const std::string root = tmp / "cache";
  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      char byte;
      while (::read(gate[0], &byte, 1) < 0) {
      }
      ::_exit(racer(root, tmp / fmt::format("report-{}", p), p));
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  std::vector<int> codes;
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    codes.push_back(WEXITSTATUS(status));
  }
  if (codes[0] == kNoCompiler) {
    MESSAGE("skipped: " << test::read_file(tmp / "report-0"));
    return;
  }

  std::uint64_t compiles = 0;
  std::string hashes;
  for (int p = 0; p < kProcesses; ++p) {
    const std::string report = test::read_file(tmp / fmt::format("report-{}", p));
    CAPTURE(p);
    CAPTURE(report);
    REQUIRE(codes[static_cast<std::size_t>(p)] == 0);
    std::uint64_t process_compiles = 0;
    std::uint64_t disk_hits = 0;
    REQUIRE(std::sscanf(report.c_str(), "%lu %lu", &process_compiles, &disk_hits) == 2);
    CHECK(process_compiles + disk_hits == 4);  // every spec came from NVRTC or the disk
    compiles += process_compiles;
    // Every process saw the same cubin for each spec.
    const std::string mine = report.substr(report.find('\n') + 1);
    if (hashes.empty()) hashes = mine;
    CHECK(mine == hashes);
  }
  CHECK(compiles == 4);
  const std::vector<std::string> strays = test::stray_files(root);
  CAPTURE(strays.size());
  CAPTURE(strays.empty() ? std::string() : strays.front());
  CHECK(strays.empty());
  std::size_t entries = 0;
  for (const std::string& file : test::list_files(root)) entries += file.ends_with(".kjc") ? 1 : 0;
  CHECK(entries == 4);
}

}  // namespace kjit
