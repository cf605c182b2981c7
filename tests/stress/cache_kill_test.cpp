// SPDX-License-Identifier: Apache-2.0
// A process killed while publishing an entry must never leave a visible partial entry:
// readers see the previous entry or none, never a torn one.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "cache/disk_cache.hpp"
#include "cache/key.hpp"
#include "stress/cache_test_support.hpp"

namespace kjit::cache {
namespace {

constexpr char kCompiler[] = "nvrtc-kill";
constexpr char kArch[] = "sm_90";

support::Hash128 kill_key() {
  KeyMaterial material;
  material.add("kill", "1");
  return material.key();
}

CompiledKernel big_kernel(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  CompiledKernel kernel = test::random_kernel(rng, 24);  // ~15 MB: many write chunks
  kernel.key = kill_key().hex();
  return kernel;
}

void kill_self_halfway(std::size_t written, std::size_t total) {
  if (written * 2 >= total) ::raise(SIGKILL);
}

/// Forks a child that stores `kernel` and is killed by the store hook halfway through.
void store_and_die_halfway(const std::string& root, const CompiledKernel& kernel) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    DiskCache cache(root, kCompiler);
    testing::set_store_hook(&kill_self_halfway);
    cache.store(kill_key(), kArch, kernel);
    ::_exit(0);  // not reached: the hook kills the process first
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
}

std::size_t count_temp_files(const std::string& root) {
  std::size_t count = 0;
  for (const std::string& file : test::list_files(root)) {
    count += file.find(".kjc.tmp.") != std::string::npos ? 1 : 0;
  }
  return count;
}

}  // namespace

TEST_CASE("cache stress: a writer killed mid-write leaves no visible partial entry") {
  test::TempDir tmp;
  const std::string root = tmp / "cache";
  const CompiledKernel a = big_kernel(1);
  const CompiledKernel b = big_kernel(2);
  const std::string path = DiskCache(root, kCompiler).entry_path(kill_key(), kArch);

  SUBCASE("no entry before: still none after") {
    store_and_die_halfway(root, a);
    DiskCache cache(root, kCompiler);
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK_FALSE(cache.load(kill_key(), kArch).has_value());
    CHECK(cache.corrupt_entries() == 0);
    // The killed writer's temp file is all that remains; it is never mistaken for an entry.
    CHECK(count_temp_files(root) == 1);
    // The next writer publishes normally next to it.
    REQUIRE(cache.store(kill_key(), kArch, a));
    REQUIRE(cache.load(kill_key(), kArch).has_value());
    CHECK(test::same_kernel(*cache.load(kill_key(), kArch), a));
  }

  SUBCASE("an entry before: the old entry survives intact") {
    DiskCache cache(root, kCompiler);
    REQUIRE(cache.store(kill_key(), kArch, a));
    store_and_die_halfway(root, b);
    const auto loaded = cache.load(kill_key(), kArch);
    REQUIRE(loaded.has_value());
    CHECK(test::same_kernel(*loaded, a));
    CHECK(cache.corrupt_entries() == 0);
  }

  SUBCASE("killed at random moments while rewriting the entry") {
    DiskCache cache(root, kCompiler);
    REQUIRE(cache.store(kill_key(), kArch, a));
    // Kills are spread over about two stores' time, so they land in every phase: writing,
    // fsync, rename, between stores.
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(cache.store(kill_key(), kArch, a));
    const auto store_us =
        std::max<std::int64_t>(1, std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::steady_clock::now() - start)
                                      .count());
    std::mt19937_64 rng(99);
    int saw_a = 0;
    int saw_b = 0;
    for (int iteration = 0; iteration < 30; ++iteration) {
      int progress[2];
      REQUIRE(::pipe(progress) == 0);
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        ::close(progress[0]);
        DiskCache writer(root, kCompiler);
        for (int i = 0;; ++i) {
          writer.store(kill_key(), kArch, i % 2 == 0 ? b : a);
          const char done = 1;
          if (::write(progress[1], &done, 1) < 0) ::_exit(1);
        }
      }
      ::close(progress[1]);
      // Wait until the child has published once, so it is mid-flight when killed.
      char byte;
      REQUIRE(::read(progress[0], &byte, 1) == 1);
      std::this_thread::sleep_for(
          std::chrono::microseconds(static_cast<std::int64_t>(rng() % (2 * store_us))));
      ::kill(pid, SIGKILL);
      int status = 0;
      REQUIRE(::waitpid(pid, &status, 0) == pid);
      ::close(progress[0]);

      const auto loaded = cache.load(kill_key(), kArch);
      REQUIRE(loaded.has_value());  // a complete entry existed before, so one always does
      const bool is_a = test::same_kernel(*loaded, a);
      const bool is_b = test::same_kernel(*loaded, b);
      CHECK((is_a || is_b));
      saw_a += is_a ? 1 : 0;
      saw_b += is_b ? 1 : 0;
    }
    CHECK(cache.corrupt_entries() == 0);
    MESSAGE("after 30 kills the entry was A " << saw_a << " times, B " << saw_b << " times, "
                                              << count_temp_files(root) << " orphaned temp files");
    // Only temp files of killed writers are left besides the one entry and its lock.
    std::size_t entries = 0;
    for (const std::string& file : test::list_files(root)) {
      entries += file.ends_with(".kjc") ? 1 : 0;
      CHECK((file.ends_with(".kjc") || file.find(".kjc.tmp.") != std::string::npos));
    }
    CHECK(entries == 1);
  }
}

}  // namespace kjit::cache
