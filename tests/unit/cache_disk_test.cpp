// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/key.hpp"
#include "kjit/error.hpp"
#include "stress/cache_test_support.hpp"
#include "support/log.hpp"

namespace kjit::cache {
namespace {

using test::list_files;
using test::mode_of;
using test::random_kernel;
using test::same_kernel;
using test::stray_files;
using test::TempDir;

constexpr char kCompiler[] = "nvrtc-13.0.88-test";
constexpr char kArch[] = "sm_90";

support::Hash128 key_of(int i) {
  KeyMaterial material;
  material.add("test", std::to_string(i));
  return material.key();
}

/// Keeps the log quiet for tests that provoke warnings on purpose, and restores it.
struct LogLevelScope {
  explicit LogLevelScope(LogLevel level) : saved(support::log_level()) {
    support::set_log_level(level);
  }
  ~LogLevelScope() { support::set_log_level(saved); }
  LogLevel saved;
};

}  // namespace

TEST_CASE("cache disk: store then load round trip, layout and modes") {
  TempDir tmp;
  const std::string root = tmp / "a/b/cache";
  DiskCache cache(root, kCompiler);
  REQUIRE(cache.enabled());
  CHECK(cache.disabled_reason().empty());
  // mkdir -p with 0700 for every directory it created.
  CHECK(mode_of(tmp / "a") == 0700);
  CHECK(mode_of(tmp / "a/b") == 0700);
  CHECK(mode_of(root) == 0700);

  std::mt19937_64 rng(11);
  const support::Hash128 key = key_of(1);
  CompiledKernel kernel = random_kernel(rng, 1);
  kernel.key = key.hex();

  CHECK_FALSE(cache.load(key, kArch).has_value());  // a plain miss
  CHECK(cache.corrupt_entries() == 0);
  REQUIRE(cache.store(key, kArch, kernel));

  const std::string hex = key.hex();
  const std::string path = cache.entry_path(key, kArch);
  CHECK(path == root + "/v1/" + kCompiler + "/sm_90/" + hex.substr(0, 2) + "/" + hex + ".kjc");
  CHECK(std::filesystem::is_regular_file(path));
  CHECK(mode_of(path) == 0600);

  const auto loaded = cache.load(key, kArch);
  REQUIRE(loaded.has_value());
  CHECK(same_kernel(*loaded, kernel));
  // Another arch or compiler is another entry.
  CHECK_FALSE(cache.load(key, "sm_80").has_value());
  DiskCache other_compiler(root, "nvrtc-12.8");
  CHECK_FALSE(other_compiler.load(key, kArch).has_value());

  // A second store (a recompile) replaces the entry in place.
  CompiledKernel newer = random_kernel(rng, 0);
  REQUIRE(cache.store(key, kArch, newer));
  newer.key = hex;
  CHECK(same_kernel(*cache.load(key, kArch), newer));

  CHECK(stray_files(root).empty());
  CHECK(cache.corrupt_entries() == 0);
  CHECK(cache.write_failures() == 0);
}

TEST_CASE("cache disk: compiler id and arch cannot escape the root") {
  TempDir tmp;
  DiskCache cache(tmp / "c", "../../evil/x");
  REQUIRE(cache.enabled());
  const std::string path = cache.entry_path(key_of(1), "../../../etc");
  REQUIRE(path.rfind(tmp / "c/v1/", 0) == 0);
  // Exactly <compiler>/<arch>/<2 hex>/<file> below v1, none of them "." or "..".
  const std::filesystem::path below = std::filesystem::path(path).lexically_relative(tmp / "c/v1");
  CHECK(std::distance(below.begin(), below.end()) == 4);
  for (const auto& component : below) {
    CHECK(component != "..");
    CHECK(component != ".");
  }
  CHECK(std::filesystem::path(path).lexically_normal() == std::filesystem::path(path));
}

TEST_CASE("cache disk: a bad entry is a counted miss and the next store replaces it") {
  LogLevelScope quiet(LogLevel::error);
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  REQUIRE(cache.enabled());
  std::mt19937_64 rng(12);
  const support::Hash128 key = key_of(2);
  const CompiledKernel kernel = random_kernel(rng, 0);
  REQUIRE(cache.store(key, kArch, kernel));
  const std::string path = cache.entry_path(key, kArch);
  const std::string good = test::read_file(path);

  struct Case {
    const char* name;
    std::string bytes;
  };
  std::string flipped = good;
  flipped[good.size() / 2] = static_cast<char>(flipped[good.size() / 2] ^ 0x10);
  // A valid entry of another key, copied to this key's path.
  const std::string foreign = encode_entry(key_of(3), kernel);
  const std::vector<Case> cases = {{"flipped byte", flipped},
                                   {"truncated", good.substr(0, good.size() - 7)},
                                   {"empty", ""},
                                   {"garbage", test::random_bytes(rng, 4096)},
                                   {"foreign key", foreign}};
  std::uint64_t expected_corrupt = 0;
  for (const Case& c : cases) {
    CAPTURE(c.name);
    test::write_file(path, c.bytes);
    CHECK_FALSE(cache.load(key, kArch).has_value());
    CHECK(cache.corrupt_entries() == ++expected_corrupt);
    // The caller recompiles and stores: the bad file is replaced.
    REQUIRE(cache.store(key, kArch, kernel));
    CHECK(cache.load(key, kArch).has_value());
    CHECK(cache.corrupt_entries() == expected_corrupt);
  }

  SUBCASE("a directory or symlink in place of the entry is not followed") {
    std::filesystem::remove(path);
    std::filesystem::create_symlink(tmp / "elsewhere.kjc", path);
    test::write_file(tmp / "elsewhere.kjc", good);
    CHECK_FALSE(cache.load(key, kArch).has_value());
    CHECK(cache.corrupt_entries() == expected_corrupt + 1);
  }
  CHECK(stray_files(tmp / "cache").empty());
}

TEST_CASE("cache disk: no temp files are left after many stores") {
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  std::mt19937_64 rng(13);
  for (int i = 0; i < 40; ++i) {
    REQUIRE(cache.store(key_of(i % 10), i % 3 == 0 ? "sm_80" : kArch, random_kernel(rng, 0)));
  }
  const auto files = list_files(tmp / "cache");
  CHECK(stray_files(tmp / "cache").empty());
  std::size_t entries = 0;
  for (const auto& file : files) entries += file.ends_with(".kjc") ? 1 : 0;
  CHECK(entries == 20);  // 10 keys, each on sm_80 and sm_90
}

TEST_CASE("cache disk: a root other users can write is refused") {
  TempDir tmp;
  const std::string root = tmp / "shared";
  for (const unsigned mode : {0777u, 0770u, 0702u, 01777u}) {
    CAPTURE(mode);
    REQUIRE(std::filesystem::create_directories(root));
    REQUIRE(::chmod(root.c_str(), mode) == 0);
    try {
      DiskCache cache(root, kCompiler);
      FAIL("DiskCache accepted a root with mode " << mode);
    } catch (const CacheError& error) {
      const std::string message = error.what();
      CHECK(message.find(root) != std::string::npos);
      CHECK(message.find(fmt::format("{:04o}", mode)) != std::string::npos);
      CHECK(message.find("chmod") != std::string::npos);
    }
    std::filesystem::remove_all(root);
  }

  SUBCASE("a symlink to such a directory too") {
    REQUIRE(std::filesystem::create_directories(root));
    REQUIRE(::chmod(root.c_str(), 0777) == 0);
    std::filesystem::create_symlink(root, tmp / "link");
    CHECK_THROWS_AS(DiskCache(tmp / "link", kCompiler), CacheError);
  }
  SUBCASE("a symlink to a private directory is fine") {
    REQUIRE(std::filesystem::create_directories(root));
    REQUIRE(::chmod(root.c_str(), 0700) == 0);
    std::filesystem::create_symlink(root, tmp / "link");
    DiskCache cache(tmp / "link", kCompiler);
    CHECK(cache.enabled());
  }
  SUBCASE("a root owned by another user") {
    if (::geteuid() != 0) {
      MESSAGE("skipped: needs root to chown a directory to another user");
      return;
    }
    REQUIRE(std::filesystem::create_directories(root));
    REQUIRE(::chmod(root.c_str(), 0700) == 0);
    REQUIRE(::chown(root.c_str(), 65534, 65534) == 0);
    try {
      DiskCache cache(root, kCompiler);
      FAIL("DiskCache accepted a root owned by uid 65534");
    } catch (const CacheError& error) {
      CHECK(std::string(error.what()).find("65534") != std::string::npos);
    }
    // A symlink to it is refused the same way.
    std::filesystem::create_symlink(root, tmp / "link2");
    CHECK_THROWS_AS(DiskCache(tmp / "link2", kCompiler), CacheError);
  }
}

TEST_CASE("cache disk: an unusable root turns the cache memory-only without throwing") {
  TempDir tmp;
  test::write_file(tmp / "file", "not a directory");
  // Both of these stop root too (permission bits would not): a path under a regular file
  // (ENOTDIR), a path under /proc (no directories can be made there), and the file itself.
  for (const std::string& root :
       {tmp / "file/cache", tmp / "file", std::string("/proc/self/kjit-cache-test/x")}) {
    CAPTURE(root);
    test::StderrCapture stderr_capture;
    const LogLevelScope warn(LogLevel::warn);
    std::optional<DiskCache> cache;
    REQUIRE_NOTHROW(cache.emplace(root, kCompiler));
    const std::string log = stderr_capture.text();
    CHECK_FALSE(cache->enabled());
    CHECK(cache->disabled_reason().find(root) != std::string::npos);
    // One warning, naming the path.
    CHECK(log.find("[kjit warning]") != std::string::npos);
    CHECK(log.find(root) != std::string::npos);
    CHECK(log.find("[kjit warning]") == log.rfind("[kjit warning]"));

    std::mt19937_64 rng(14);
    CHECK_FALSE(cache->store(key_of(1), kArch, random_kernel(rng, 0)));
    CHECK_FALSE(cache->load(key_of(1), kArch).has_value());
    CHECK_FALSE(cache->lock(key_of(1), kArch).held());
  }
  const LogLevelScope quiet(LogLevel::error);
  CHECK_NOTHROW(DiskCache("", kCompiler));
  CHECK_FALSE(DiskCache("", kCompiler).enabled());
}

TEST_CASE("cache disk: a failed write turns memory-only once and leaves nothing behind") {
  TempDir tmp;
  const std::string root = tmp / "cache";
  DiskCache cache(root, kCompiler);
  REQUIRE(cache.enabled());
  std::mt19937_64 rng(15);
  const support::Hash128 stored = key_of(1);
  REQUIRE(cache.store(stored, kArch, random_kernel(rng, 0)));

  // Block the fan-out directory of another key with a regular file: creating it fails with
  // ENOTDIR whatever our privileges, exactly like a read-only or full disk would fail.
  const support::Hash128 key = key_of(7);
  const std::string fan_out = std::filesystem::path(cache.entry_path(key, kArch)).parent_path();
  REQUIRE(fan_out != std::filesystem::path(cache.entry_path(stored, kArch)).parent_path());
  std::filesystem::create_directories(std::filesystem::path(fan_out).parent_path());
  test::write_file(fan_out, "blocker");

  test::StderrCapture stderr_capture;
  const LogLevelScope warn(LogLevel::warn);
  CHECK_FALSE(cache.store(key, kArch, random_kernel(rng, 0)));
  CHECK(cache.write_failures() == 1);
  CHECK_FALSE(cache.enabled());
  CHECK(cache.disabled_reason().find(fan_out) != std::string::npos);
  // Memory-only from now on: later stores are not attempted, and warn no more.
  CHECK_FALSE(cache.store(key_of(8), kArch, random_kernel(rng, 0)));
  CHECK_FALSE(cache.store(key, kArch, random_kernel(rng, 0)));
  const std::string log = stderr_capture.text();
  CHECK(log.find("[kjit warning]") != std::string::npos);
  CHECK(log.find("[kjit warning]") == log.rfind("[kjit warning]"));
  CHECK(cache.write_failures() == 1);
  // Entries already on disk are still read.
  CHECK(cache.load(stored, kArch).has_value());

  std::filesystem::remove(fan_out);
  CHECK(stray_files(root).empty());
}

TEST_CASE("cache disk: the key lock excludes a second thread until released") {
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  REQUIRE(cache.enabled());
  const support::Hash128 key = key_of(1);

  KeyLock first = cache.lock(key, kArch);
  REQUIRE(first.held());
  CHECK(std::filesystem::exists(cache.entry_path(key, kArch) + ".lock"));
  CHECK(mode_of(cache.entry_path(key, kArch) + ".lock") == 0600);

  std::atomic<bool> acquired{false};
  std::thread waiter([&] {
    KeyLock second = cache.lock(key, kArch);
    acquired.store(second.held());
  });
  // Another key is not blocked meanwhile.
  {
    KeyLock other = cache.lock(key_of(2), kArch);
    CHECK(other.held());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(acquired.load());
  KeyLock moved = std::move(first);  // moving keeps the lock held
  CHECK_FALSE(first.held());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(acquired.load());
  moved.unlock();
  waiter.join();
  CHECK(acquired.load());
  // The lock file stays (deleting it would let two lockers hold different inodes).
  CHECK(std::filesystem::exists(cache.entry_path(key, kArch) + ".lock"));
}

TEST_CASE("cache disk: concurrent threads storing and loading one key see only whole entries") {
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  const support::Hash128 key = key_of(1);
  std::mt19937_64 rng(16);
  std::vector<CompiledKernel> versions;
  for (int i = 0; i < 4; ++i) {
    versions.push_back(random_kernel(rng, 0));
    versions.back().key = key.hex();
  }
  std::atomic<int> bad{0};
  std::atomic<int> hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        if (!cache.store(key, kArch, versions[static_cast<std::size_t>((t + i) % 4)])) ++bad;
        const auto loaded = cache.load(key, kArch);
        if (!loaded) {
          ++bad;
          continue;
        }
        bool known = false;
        for (const auto& v : versions) known = known || same_kernel(*loaded, v);
        if (!known) ++bad;
        ++hits;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(bad.load() == 0);
  CHECK(hits.load() == 8 * 30);
  CHECK(cache.corrupt_entries() == 0);
  CHECK(stray_files(tmp / "cache").empty());
}

}  // namespace kjit::cache
