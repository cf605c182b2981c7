// SPDX-License-Identifier: Apache-2.0
// Fault injection for the disk cache (issue 9). Two mechanisms:
//  - the FsStep fault hook of lib/cache (an injectable file-system seam): every step of a
//    store, load and lock fails with ENOSPC, EACCES, EROFS, EDQUOT and EIO in turn, or kills
//    the process at that step. It works the same as root and on any file system, where a full
//    disk or a read-only mount cannot be made for real;
//  - real faults where the kernel can make them for any user: RLIMIT_FSIZE (EFBIG, a full
//    disk as the writer sees it), a child that drops root to uid 65534 (EACCES: root ignores
//    file modes, so the child gives them up), SIGKILL of lock holders, and symlinked roots
//    owned by another user (as root: chown to 65534; skipped with the reason otherwise).
// Every case also checks that its fault was actually hit, so that a test cannot pass because
// the step it targets is no longer reached.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cache/disk_cache.hpp"
#include "cache/key.hpp"
#include "kjit/error.hpp"
#include "stress/cache_test_support.hpp"
#include "support/log.hpp"

namespace kjit::cache {
namespace {

using test::TempDir;
using testing::FsStep;

constexpr char kCompiler[] = "nvrtc-fault";
constexpr char kArch[] = "sm_90";
constexpr uid_t kNobody = 65534;

support::Hash128 key_of(int i) {
  KeyMaterial material;
  material.add("fault", std::to_string(i));
  return material.key();
}

CompiledKernel kernel_for(const support::Hash128& key, std::uint64_t seed, std::size_t scale) {
  std::mt19937_64 rng(seed);
  CompiledKernel kernel = test::random_kernel(rng, scale);
  kernel.key = key.hex();
  return kernel;
}

/// The fault the hook injects: at `step` (at its `nth` call, counting from 1), fail with
/// `error`, or raise SIGKILL when `error` is -1. Counts the hits. Globals, because the hook is
/// a plain function pointer (as the library's seam is: no allocation, no std::function).
std::atomic<FsStep> g_step{FsStep::write};
std::atomic<int> g_error{0};
std::atomic<int> g_nth{1};
std::atomic<int> g_calls{0};
std::atomic<int> g_hits{0};

int inject(FsStep step, const char* /*path*/) {
  if (step != g_step.load()) return 0;
  if (g_calls.fetch_add(1) + 1 < g_nth.load()) return 0;
  g_hits.fetch_add(1);
  const int error = g_error.load();
  if (error == -1) ::raise(SIGKILL);
  return error;
}

/// Installs the hook for one scope and removes it again, also when a check throws.
struct FaultScope {
  FaultScope(FsStep step, int error, int nth = 1) {
    g_step = step;
    g_error = error;
    g_nth = nth;
    g_calls = 0;
    g_hits = 0;
    testing::set_fault_hook(&inject);
  }
  ~FaultScope() { testing::set_fault_hook(nullptr); }
  FaultScope(const FaultScope&) = delete;
  FaultScope& operator=(const FaultScope&) = delete;
};

struct LogLevelScope {
  explicit LogLevelScope(LogLevel level) : saved(support::log_level()) {
    support::set_log_level(level);
  }
  ~LogLevelScope() { support::set_log_level(saved); }
  LogLevel saved;
};

const char* step_name(FsStep step) {
  switch (step) {
    case FsStep::make_dir:
      return "make_dir";
    case FsStep::probe_root:
      return "probe_root";
    case FsStep::create_temp:
      return "create_temp";
    case FsStep::write:
      return "write";
    case FsStep::fsync:
      return "fsync";
    case FsStep::close:
      return "close";
    case FsStep::rename:
      return "rename";
    case FsStep::open_entry:
      return "open_entry";
    case FsStep::read_entry:
      return "read_entry";
    case FsStep::open_lock:
      return "open_lock";
    case FsStep::flock:
      return "flock";
  }
  return "?";
}

std::string error_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

constexpr int kErrors[] = {ENOSPC, EACCES, EROFS, EDQUOT, EIO};
constexpr FsStep kStoreSteps[] = {FsStep::make_dir, FsStep::create_temp, FsStep::write,
                                  FsStep::fsync,    FsStep::close,       FsStep::rename};

/// Runs `body` in a forked child and returns its exit status (a failed check in the child
/// is reported by exiting with the number of the check, 1-based; 0 is success).
template <typename Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("cache fault: every store step failing with every errno turns memory-only cleanly") {
  const LogLevelScope quiet(LogLevel::error);
  int cases = 0;
  for (const FsStep step : kStoreSteps) {
    for (const int error : kErrors) {
      CAPTURE(step_name(step));
      CAPTURE(error_text(error));
      TempDir tmp;
      const std::string root = tmp / "cache";
      DiskCache cache(root, kCompiler);
      REQUIRE(cache.enabled());
      // An entry stored before the fault must stay readable after it. Key 3 lives in another
      // fan-out directory than key 1, so make_dir is reached for the faulty store.
      const support::Hash128 good = key_of(1);
      const CompiledKernel good_kernel = kernel_for(good, 1, 0);
      REQUIRE(cache.store(good, kArch, good_kernel));
      const support::Hash128 key = key_of(3);
      REQUIRE(cache.entry_path(key, kArch).substr(0, cache.entry_path(key, kArch).rfind('/')) !=
              cache.entry_path(good, kArch).substr(0, cache.entry_path(good, kArch).rfind('/')));
      {
        const FaultScope fault(step, error);
        CHECK_FALSE(cache.store(key, kArch, kernel_for(key, 2, 1)));
        CHECK(g_hits.load() == 1);  // the fault was hit, once
      }
      CHECK(cache.write_failures() == 1);
      CHECK_FALSE(cache.enabled());
      // The reason names the failed step's errno text and a path under the root.
      const std::string reason = cache.disabled_reason();
      CHECK(reason.find(error_text(error)) != std::string::npos);
      CHECK(reason.find(root) != std::string::npos);
      // Nothing partial is visible, no temp file is left, the old entry is still served.
      CHECK_FALSE(cache.load(key, kArch).has_value());
      CHECK(test::stray_files(root).empty());
      const auto loaded = cache.load(good, kArch);
      REQUIRE(loaded.has_value());
      CHECK(test::same_kernel(*loaded, good_kernel));
      CHECK(cache.corrupt_entries() == 0);
      // A later store is not attempted (memory-only), so the hook is not called again.
      const FaultScope again(step, error);
      CHECK_FALSE(cache.store(key, kArch, kernel_for(key, 2, 0)));
      CHECK(g_hits.load() == 0);
      ++cases;
    }
  }
  MESSAGE(cases << " store faults injected (6 steps x 5 errnos)");
}

TEST_CASE("cache fault: a write failing after some chunks leaves no temp file") {
  // The fault hits the third 1 MiB chunk of a ~15 MB entry: a partly written temp file exists
  // when the write fails, and must be removed.
  const LogLevelScope quiet(LogLevel::error);
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  const support::Hash128 key = key_of(1);
  const FaultScope fault(FsStep::write, ENOSPC, 3);
  CHECK_FALSE(cache.store(key, kArch, kernel_for(key, 5, 24)));
  CHECK(g_hits.load() == 1);
  CHECK(g_calls.load() == 3);
  CHECK(test::stray_files(tmp / "cache").empty());
  CHECK_FALSE(cache.load(key, kArch).has_value());
}

TEST_CASE("cache fault: an unusable root at construction is memory-only, never an exception") {
  const LogLevelScope quiet(LogLevel::error);
  for (const FsStep step : {FsStep::make_dir, FsStep::probe_root}) {
    for (const int error : kErrors) {
      CAPTURE(step_name(step));
      CAPTURE(error_text(error));
      TempDir tmp;
      const FaultScope fault(step, error);
      std::optional<DiskCache> cache;
      REQUIRE_NOTHROW(cache.emplace(tmp / "cache", kCompiler));
      CHECK(g_hits.load() == 1);
      CHECK_FALSE(cache->enabled());
      CHECK(cache->disabled_reason().find(error_text(error)) != std::string::npos);
      CHECK_FALSE(cache->store(key_of(1), kArch, kernel_for(key_of(1), 1, 0)));
      CHECK_FALSE(cache->load(key_of(1), kArch).has_value());
      CHECK_FALSE(cache->lock(key_of(1), kArch).held());
    }
  }
}

TEST_CASE("cache fault: read faults are misses; lock faults give an empty lock, not a hang") {
  const LogLevelScope quiet(LogLevel::error);
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  const support::Hash128 key = key_of(1);
  REQUIRE(cache.store(key, kArch, kernel_for(key, 1, 0)));
  for (const int error : kErrors) {
    CAPTURE(error_text(error));
    const std::uint64_t corrupt_before = cache.corrupt_entries();
    {
      // Cannot open: a miss, but not a corrupt entry (the file may be fine for others).
      const FaultScope fault(FsStep::open_entry, error);
      CHECK_FALSE(cache.load(key, kArch).has_value());
      CHECK(g_hits.load() == 1);
    }
    CHECK(cache.corrupt_entries() == corrupt_before);
    {
      // Opened but unreadable: counted, so that it is replaced by the next store.
      const FaultScope fault(FsStep::read_entry, error);
      CHECK_FALSE(cache.load(key, kArch).has_value());
      CHECK(g_hits.load() == 1);
    }
    CHECK(cache.corrupt_entries() == corrupt_before + 1);
    for (const FsStep step : {FsStep::open_lock, FsStep::flock}) {
      const FaultScope fault(step, error);
      CHECK_FALSE(cache.lock(key, kArch).held());
      CHECK(g_hits.load() == 1);
    }
  }
  CHECK(cache.corrupt_entries() == std::size(kErrors));
  CHECK(cache.enabled());  // read and lock faults never disable writing
  CHECK(cache.load(key, kArch).has_value());
}

TEST_CASE("cache fault: a process killed at any step of a store never publishes a partial entry") {
  TempDir tmp;
  const std::string root = tmp / "cache";
  const support::Hash128 key = key_of(1);
  const CompiledKernel old_kernel = kernel_for(key, 1, 1);
  const CompiledKernel new_kernel = kernel_for(key, 2, 1);
  for (const bool had_entry : {false, true}) {
    for (const FsStep step : kStoreSteps) {
      // With an entry, its fan-out directory exists and no directory is made.
      if (had_entry && step == FsStep::make_dir) continue;
      CAPTURE(had_entry);
      CAPTURE(step_name(step));
      std::filesystem::remove_all(root);
      DiskCache cache(root, kCompiler);
      if (had_entry) REQUIRE(cache.store(key, kArch, old_kernel));
      const int status = in_child([&] {
        DiskCache writer(root, kCompiler);
        const FaultScope fault(step, -1);  // -1: SIGKILL at this step
        writer.store(key, kArch, new_kernel);
        return 1;  // reached only if the step was not hit
      });
      // Killed by the hook: proves that the step was reached.
      REQUIRE(WIFSIGNALED(status));
      CHECK(WTERMSIG(status) == SIGKILL);
      const auto loaded = cache.load(key, kArch);
      CHECK(loaded.has_value() == had_entry);
      if (loaded) CHECK(test::same_kernel(*loaded, old_kernel));
      CHECK(cache.corrupt_entries() == 0);
      // The killed writer's leftovers (a temp file) never block the next store.
      REQUIRE(cache.store(key, kArch, new_kernel));
      CHECK(test::same_kernel(*cache.load(key, kArch), new_kernel));
    }
  }
}

TEST_CASE("cache fault: a real file size limit (EFBIG) fails the store cleanly") {
  // RLIMIT_FSIZE binds root too: the kernel refuses the write past 64 KiB, as a full disk
  // would. SIGXFSZ is ignored so that the write returns EFBIG instead of killing the child.
  TempDir tmp;
  const std::string root = tmp / "cache";
  const support::Hash128 key = key_of(1);
  const int status = in_child([&] {
    const LogLevelScope quiet(LogLevel::error);
    DiskCache cache(root, kCompiler);
    if (!cache.enabled()) return 2;
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 * 1024, 64 * 1024};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 3;
    if (cache.store(key, kArch, kernel_for(key, 1, 1))) return 4;  // ~600 KiB entry
    if (cache.write_failures() != 1) return 5;
    if (cache.disabled_reason().find(error_text(EFBIG)) == std::string::npos) return 6;
    if (!test::stray_files(root).empty()) return 7;
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  DiskCache cache(root, kCompiler);
  CHECK_FALSE(cache.load(key, kArch).has_value());
}

TEST_CASE("cache fault: real permission denied, in a child that is not root") {
  // Root ignores file modes, so a root test process forks a child that drops to uid 65534:
  // its root directory is its own, but the compiler directory inside belongs to root (0700),
  // or a fan-out directory does (0755): creating files there fails with a real EACCES.
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to give directories to uid 65534 and drop to it");
    return;
  }
  TempDir tmp;
  REQUIRE(::chmod(tmp.path().c_str(), 0755) == 0);  // uid 65534 must reach the root below
  const std::string root = tmp / "cache";
  const support::Hash128 key = key_of(1);
  const support::Hash128 stored = key_of(2);
  {
    DiskCache as_root(root, kCompiler);
    REQUIRE(as_root.store(stored, kArch, kernel_for(stored, 1, 0)));
  }
  const std::string arch_dir = root + "/v1/" + kCompiler + "/" + kArch;
  // The cache root and compiler dir belong to the child's user; the arch dir and the fan-out
  // dirs in it stay root's, readable (0755) but not writable by the child.
  for (const std::string& dir : {root, root + "/v1", root + "/v1/" + kCompiler}) {
    REQUIRE(::chown(dir.c_str(), kNobody, kNobody) == 0);
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(arch_dir)) {
    if (entry.is_directory()) REQUIRE(::chmod(entry.path().c_str(), 0755) == 0);
    if (entry.is_regular_file()) REQUIRE(::chmod(entry.path().c_str(), 0644) == 0);
  }
  REQUIRE(::chmod(arch_dir.c_str(), 0755) == 0);

  const int status = in_child([&] {
    const LogLevelScope quiet(LogLevel::error);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 2;
    DiskCache cache(root, kCompiler);
    if (!cache.enabled()) return 3;  // the compiler dir is the child's: writable
    if (!cache.load(stored, kArch).has_value()) return 4;  // reading root's entry works
    if (cache.lock(stored, kArch).held()) return 5;        // no lock file can be created
    if (cache.store(key, kArch, kernel_for(key, 3, 0))) return 6;
    if (cache.disabled_reason().find(error_text(EACCES)) == std::string::npos) return 7;
    if (!cache.load(stored, kArch).has_value()) return 8;  // still read after the failure
    return 0;
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(test::stray_files(root).empty());

  SUBCASE("a compiler directory the child cannot enter disables the cache at construction") {
    REQUIRE(::chown((root + "/v1").c_str(), 0, 0) == 0);
    REQUIRE(::chmod((root + "/v1").c_str(), 0700) == 0);
    const int denied = in_child([&] {
      const LogLevelScope quiet(LogLevel::error);
      if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) return 2;
      DiskCache cache(root, kCompiler);
      if (cache.enabled()) return 3;
      if (cache.disabled_reason().find(error_text(EACCES)) == std::string::npos) return 4;
      return 0;
    });
    REQUIRE(WIFEXITED(denied));
    CHECK(WEXITSTATUS(denied) == 0);
  }
}

TEST_CASE("cache fault: lock files left by killed processes never make others hang") {
  TempDir tmp;
  DiskCache cache(tmp / "cache", kCompiler);
  REQUIRE(cache.enabled());
  const support::Hash128 key = key_of(1);
  const std::string lock_path = cache.entry_path(key, kArch) + ".lock";

  SUBCASE("a holder killed while holding the lock releases it") {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(ready[0]);
      DiskCache child(tmp / "cache", kCompiler);
      KeyLock held = child.lock(key, kArch);
      const char byte = held.held() ? 1 : 0;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
      ::pause();  // holds the lock until killed
      ::_exit(0);
    }
    ::close(ready[1]);
    char byte = 0;
    REQUIRE(::read(ready[0], &byte, 1) == 1);
    ::close(ready[0]);
    REQUIRE(byte == 1);
    // The lock is really held: a non-blocking attempt on the same file fails.
    const int probe = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(probe >= 0);
    CHECK(::flock(probe, LOCK_EX | LOCK_NB) != 0);
    ::close(probe);
    // A waiter blocks until the holder dies, then gets the lock.
    auto waiter = std::async(std::launch::async, [&] { return cache.lock(key, kArch).held(); });
    CHECK(waiter.wait_for(std::chrono::milliseconds(200)) == std::future_status::timeout);
    REQUIRE(::kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(waiter.wait_for(std::chrono::seconds(20)) == std::future_status::ready);
    CHECK(waiter.get());
  }
  SUBCASE("a lock file without a holder is taken at once") {
    std::filesystem::create_directories(std::filesystem::path(lock_path).parent_path());
    test::write_file(lock_path, "left by a killed process");
    const auto start = std::chrono::steady_clock::now();
    CHECK(cache.lock(key, kArch).held());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
  SUBCASE("a lock path that is a symlink or a directory gives an empty lock, at once") {
    const LogLevelScope quiet(LogLevel::error);
    std::filesystem::create_directories(std::filesystem::path(lock_path).parent_path());
    std::filesystem::create_symlink(tmp / "elsewhere", lock_path);
    CHECK_FALSE(cache.lock(key, kArch).held());
    CHECK_FALSE(std::filesystem::exists(tmp / "elsewhere"));  // O_NOFOLLOW: nothing created
    std::filesystem::remove(lock_path);
    std::filesystem::create_directory(lock_path);
    CHECK_FALSE(cache.lock(key, kArch).held());
    // Compiling without the lock is still safe: publishing is atomic.
    CHECK(cache.store(key, kArch, kernel_for(key, 1, 0)));
  }
}

TEST_CASE("cache fault: a cache dir replaced by a symlink to another user's directory") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to chown a directory to uid 65534");
    return;
  }
  TempDir tmp;
  const std::string root = tmp / "cache";
  {
    DiskCache cache(root, kCompiler);
    REQUIRE(cache.store(key_of(1), kArch, kernel_for(key_of(1), 1, 0)));
  }
  // The directory is swapped for a symlink to a directory of uid 65534, which could plant
  // kernels there: refused, naming the link, its target and the owner.
  const std::string planted = tmp / "other-user";
  REQUIRE(std::filesystem::create_directory(planted));
  REQUIRE(::chmod(planted.c_str(), 0700) == 0);
  REQUIRE(::chown(planted.c_str(), kNobody, kNobody) == 0);
  std::filesystem::remove_all(root);
  std::filesystem::create_symlink(planted, root);
  try {
    DiskCache cache(root, kCompiler);
    FAIL("DiskCache accepted a symlink to a directory of uid 65534");
  } catch (const CacheError& error) {
    const std::string message = error.what();
    CHECK(message.find(root) != std::string::npos);
    CHECK(message.find(planted) != std::string::npos);
    CHECK(message.find("65534") != std::string::npos);
    CHECK(message.find("KJIT_CACHE_DIR") != std::string::npos);
  }
  // A symlink owned by another user, even to our own private directory, is refused too: its
  // owner could point it elsewhere at any time.
  const std::string mine = tmp / "mine";
  REQUIRE(std::filesystem::create_directory(mine));
  REQUIRE(::chmod(mine.c_str(), 0700) == 0);
  const std::string link = tmp / "their-link";
  std::filesystem::create_symlink(mine, link);
  REQUIRE(::lchown(link.c_str(), kNobody, kNobody) == 0);
  CHECK_THROWS_AS(DiskCache(link, kCompiler), CacheError);
}

}  // namespace kjit::cache
