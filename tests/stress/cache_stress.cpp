// SPDX-License-Identifier: Apache-2.0
// N processes race for the same keys through the protocol the Runtime uses: load, lock, load
// again, compile and store only if still missing. Each key must be compiled exactly once and
// published as exactly one whole entry.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/key.hpp"
#include "stress/cache_test_support.hpp"

namespace kjit::cache {
namespace {

constexpr int kProcesses = 8;
constexpr int kKeys = 4;
constexpr char kCompiler[] = "nvrtc-stress";
constexpr char kArch[] = "sm_90";

support::Hash128 stress_key(int k) {
  KeyMaterial material;
  material.add("stress", std::to_string(k));
  return material.key();
}

/// What "compiling" key k produces: the same bytes in every process.
CompiledKernel kernel_for(int k) {
  std::mt19937_64 rng(static_cast<std::uint64_t>(1000 + k));
  CompiledKernel kernel = test::random_kernel(rng, 1);
  kernel.key = stress_key(k).hex();
  return kernel;
}

/// The body of one racing process. Returns its exit code: 0 when every check held.
int racer(const std::string& root, const std::string& results, int index, int compile_ms) {
  try {
    DiskCache cache(root, kCompiler);
    if (!cache.enabled()) return 10;
    for (int i = 0; i < kKeys; ++i) {
      // Half the processes walk the keys backwards, so locks are taken in both orders.
      const int k = index % 2 == 0 ? i : kKeys - 1 - i;
      const support::Hash128 key = stress_key(k);
      std::string outcome;
      if (cache.load(key, kArch)) {
        outcome = "hit";
      } else {
        KeyLock lock = cache.lock(key, kArch);
        if (!lock.held()) return 11;
        if (cache.load(key, kArch)) {
          outcome = "hit-after-lock";
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(compile_ms));
          if (!cache.store(key, kArch, kernel_for(k))) return 12;
          outcome = "compiled";
        }
      }
      const auto final_entry = cache.load(key, kArch);
      if (!final_entry || !test::same_kernel(*final_entry, kernel_for(k))) return 13;
      test::write_file(fmt::format("{}/{}-{}", results, k, index), outcome);
    }
    if (cache.corrupt_entries() != 0 || cache.write_failures() != 0) return 14;
    return 0;
  } catch (...) {
    return 15;
  }
}

void run_race(int compile_ms) {
  test::TempDir tmp;
  const std::string root = tmp / "cache";
  const std::string results = tmp / "results";
  std::filesystem::create_directory(results);

  // Every child blocks on the gate until the parent closes its end, so all start together.
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
      ::_exit(racer(root, results, p, compile_ms));
    }
    children.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  for (const pid_t pid : children) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CAPTURE(pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }

  std::map<int, int> compiled;
  std::map<int, int> reports;
  for (const std::string& file : test::list_files(results)) {
    const int k = std::stoi(file.substr(0, file.find('-')));
    ++reports[k];
    if (test::read_file(results + "/" + file) == "compiled") ++compiled[k];
  }
  DiskCache cache(root, kCompiler);
  for (int k = 0; k < kKeys; ++k) {
    CAPTURE(k);
    CHECK(reports[k] == kProcesses);  // every process read a valid entry
    CHECK(compiled[k] == 1);          // and exactly one compiled it
    const auto entry = cache.load(stress_key(k), kArch);
    REQUIRE(entry.has_value());
    CHECK(test::same_kernel(*entry, kernel_for(k)));
  }
  std::size_t entries = 0;
  for (const std::string& file : test::list_files(root)) entries += file.ends_with(".kjc") ? 1 : 0;
  CHECK(entries == kKeys);
  CHECK(test::stray_files(root).empty());
  CHECK(cache.corrupt_entries() == 0);
}

}  // namespace

TEST_CASE("cache stress: 8 processes racing for 4 keys compile each exactly once") {
  // A slow compile (every racer queues on the lock) and an instant one (racers interleave
  // with the publish itself).
  for (const int compile_ms : {30, 0, 5}) {
    CAPTURE(compile_ms);
    for (int round = 0; round < 3; ++round) run_race(compile_ms);
  }
}

}  // namespace kjit::cache
