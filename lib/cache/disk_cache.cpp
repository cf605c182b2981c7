// SPDX-License-Identifier: Apache-2.0
#include "cache/disk_cache.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <random>
#include <system_error>
#include <utility>

#include "cache/unique_fd.hpp"
#include "kjit/error.hpp"
#include "support/log.hpp"

namespace kjit::cache {
namespace {

/// Temp files are written in chunks so that a writer killed mid-write is a realistic case
/// (and the test hook can fire in the middle).
constexpr std::size_t kWriteChunk = std::size_t{1} << 20;

std::atomic<testing::StoreHook> g_store_hook{nullptr};
std::atomic<testing::FaultHook> g_fault_hook{nullptr};

/// The errno a test injects at this step, or 0 to run it. One relaxed load when no hook is set.
int injected(testing::FsStep step, const std::string& path) {
  const auto hook = g_fault_hook.load(std::memory_order_relaxed);
  return hook != nullptr ? hook(step, path.c_str()) : 0;
}

std::string error_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

/// A path component made of [A-Za-z0-9._+-] only and not starting with '.', so that a
/// compiler id or arch string can never escape its directory ("..", "/").
std::string path_component(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '+' || c == '-';
    if (!ok) c = '_';
  }
  if (out.empty() || out[0] == '.') out.insert(out.begin(), '_');
  return out;
}

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

/// mkdir -p with mode 0700 for every directory it creates. Returns 0 or an errno.
int make_dirs(const std::string& path) {
  if (is_directory(path)) return 0;
  if (const int error = injected(testing::FsStep::make_dir, path)) return error;
  if (::mkdir(path.c_str(), 0700) == 0) {
    // The umask may have removed bits we rely on (e.g. umask 0777); set exactly 0700.
    ::chmod(path.c_str(), 0700);
    return 0;
  }
  int error = errno;
  if (error == EEXIST) return is_directory(path) ? 0 : ENOTDIR;
  if (error != ENOENT) return error;
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos || slash == 0) return error;
  if (const int parent_error = make_dirs(strip_trailing_slashes(path.substr(0, slash)))) {
    return parent_error;
  }
  if (::mkdir(path.c_str(), 0700) == 0) {
    ::chmod(path.c_str(), 0700);
    return 0;
  }
  error = errno;
  if (error == EEXIST) return is_directory(path) ? 0 : ENOTDIR;
  return error;
}

/// Writes all of `bytes`, calling the test hook after each chunk. Returns 0 or an errno.
int write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t written = 0;
  while (written < bytes.size()) {
    const std::size_t chunk = std::min(kWriteChunk, bytes.size() - written);
    if (const int error = injected(testing::FsStep::write, path)) return error;
    const ssize_t n = ::write(fd, bytes.data() + written, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    // A zero-byte write of a non-empty buffer means the device accepts nothing more.
    if (n == 0) return ENOSPC;
    written += static_cast<std::size_t>(n);
    if (const auto hook = g_store_hook.load(std::memory_order_relaxed)) hook(written, bytes.size());
  }
  return 0;
}

/// Reads exactly `size` bytes. Returns 0, an errno, or EIO for a short file.
int read_exact(int fd, std::string* out, std::size_t size, const std::string& path) {
  out->resize(size);
  std::size_t done = 0;
  if (const int error = injected(testing::FsStep::read_entry, path)) return error;
  while (done < size) {
    const ssize_t n = ::read(fd, out->data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

/// Removes a temp file on scope exit unless it was renamed into place.
class TempFileGuard {
 public:
  TempFileGuard() = default;
  ~TempFileGuard() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;
  void arm(std::string path) { path_ = std::move(path); }
  void disarm() { path_.clear(); }

 private:
  std::string path_;
};

std::string random_suffix() {
  // random_device per call: a store is rare (once per compile), and a per-thread engine
  // would be duplicated by fork() into children that then pick the same names.
  std::random_device device;
  const std::uint64_t value = (std::uint64_t{device()} << 32) | device();
  return fmt::format("{}.{:016x}", ::getpid(), value);
}

}  // namespace

namespace testing {
void set_store_hook(StoreHook hook) noexcept { g_store_hook.store(hook); }
void set_fault_hook(FaultHook hook) noexcept { g_fault_hook.store(hook); }
}  // namespace testing

// --- KeyLock ---------------------------------------------------------------------------------

KeyLock::~KeyLock() { unlock(); }

KeyLock::KeyLock(KeyLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

KeyLock& KeyLock::operator=(KeyLock&& other) noexcept {
  if (this != &other) {
    unlock();
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

void KeyLock::unlock() noexcept {
  if (fd_ < 0) return;
  // Explicit LOCK_UN: a child forked while we hold the lock shares the file description, and
  // close() alone would leave the lock held until the child exits.
  ::flock(fd_, LOCK_UN);
  ::close(std::exchange(fd_, -1));
}

// --- DiskCache -------------------------------------------------------------------------------

DiskCache::DiskCache(std::string root, std::string compiler_id)
    : root_(strip_trailing_slashes(std::move(root))), compiler_id_(path_component(compiler_id)) {
  if (root_.empty()) {
    disable("no cache directory was configured", true);
    return;
  }
  if (const int error = make_dirs(root_)) {
    disable(fmt::format("cannot create cache directory '{}': {}", root_, error_text(error)), true);
    return;
  }

  // The cache holds code this process will run on the GPU: a root other users can write
  // would let them plant kernels. Refuse loudly instead of silently running memory-only,
  // because the user asked for this directory and should fix it.
  struct stat st {};
  if (::stat(root_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    disable(fmt::format("cache directory '{}' is not a directory", root_), true);
    return;
  }
  std::string via;
  struct stat link {};
  if (::lstat(root_.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    char resolved[PATH_MAX];
    via = fmt::format(" (a symlink to '{}')",
                      ::realpath(root_.c_str(), resolved) != nullptr ? resolved : "?");
    if (link.st_uid != ::geteuid() && link.st_uid != 0) {
      throw CacheError(fmt::format(
          "kjit cache directory '{}' is a symlink owned by uid {}, not by this user (uid {}); "
          "another user could redirect it. Use a directory you own (KJIT_CACHE_DIR or "
          "Settings::cache_dir), or set KJIT_DISABLE_DISK_CACHE=1",
          root_, link.st_uid, ::geteuid()));
    }
  }
  const unsigned mode = st.st_mode & 07777;
  if (st.st_uid != ::geteuid()) {
    throw CacheError(fmt::format(
        "kjit cache directory '{}'{} is owned by uid {}, not by this user (uid {}), mode {:04o}; "
        "kernels from it would run in this process. Use a directory you own (set KJIT_CACHE_DIR "
        "or Settings::cache_dir, e.g. to a path under your home), or set "
        "KJIT_DISABLE_DISK_CACHE=1",
        root_, via, st.st_uid, ::geteuid(), mode));
  }
  if ((st.st_mode & 022) != 0) {
    throw CacheError(fmt::format(
        "kjit cache directory '{}'{} is writable by {} (mode {:04o}, owner uid {}); other users "
        "could plant kernels that this process would run. Fix it with `chmod go-w '{}'` (kjit "
        "creates it 0700), choose another KJIT_CACHE_DIR, or set KJIT_DISABLE_DISK_CACHE=1",
        root_, via,
        (st.st_mode & 020) != 0 && (st.st_mode & 002) != 0 ? "group and others"
        : (st.st_mode & 020) != 0                          ? "its group"
                                                           : "others",
        mode, st.st_uid, root_));
  }

  // A root we may not write (read-only mount, full disk, no permission) is not an error:
  // nothing new is stored. Creating the compiler directory is the probe.
  const std::string base = fmt::format("{}/v1/{}", root_, compiler_id_);
  int error = make_dirs(base);
  if (error == 0) error = injected(testing::FsStep::probe_root, base);
  if (error == 0 && ::access(base.c_str(), W_OK | X_OK) != 0) error = errno;
  if (error == 0) {
    readable_.store(true, std::memory_order_release);
    writable_.store(true, std::memory_order_release);
    return;
  }
  // A pre-filled cache shipped read-only (an image layer, a read-only mount, a directory the
  // serving user may not write) still serves its entries: they are verified on every load
  // like any other. Only a compiler directory that cannot be entered is useless for reads.
  if (is_directory(base) && ::access(base.c_str(), R_OK | X_OK) == 0) {
    readable_.store(true, std::memory_order_release);
    disable(fmt::format("cannot write '{}': {}", base, error_text(error)), false);
    return;
  }
  disable(fmt::format("cannot {} '{}': {}", is_directory(base) ? "write" : "create", base,
                      error_text(error)),
          true);
}

std::string DiskCache::disabled_reason() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return disabled_reason_;
}

void DiskCache::disable(std::string reason, bool reads_too) {
  bool first = false;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (reads_too) readable_.store(false, std::memory_order_release);
    // Only the first reason is kept and warned about: later failures are consequences.
    if (disabled_reason_.empty()) {
      disabled_reason_ = std::move(reason);
      first = true;
    }
    writable_.store(false, std::memory_order_release);
  }
  if (first && reads_too) {
    support::log(LogLevel::warn,
                 "disk cache disabled, compiled kernels are kept in memory only: {}",
                 disabled_reason());
  } else if (first) {
    support::log(LogLevel::warn,
                 "disk cache not written, compiled kernels are kept in memory only (its entries "
                 "are still read): {}",
                 disabled_reason());
  }
}

bool DiskCache::write_failed(const std::string& path, const char* step, int error) {
  write_failures_.fetch_add(1, std::memory_order_relaxed);
  disable(fmt::format("{} '{}' failed: {}", step, path, error_text(error)), false);
  return false;
}

void DiskCache::count_corrupt(const std::string& path, const std::string& why) {
  corrupt_entries_.fetch_add(1, std::memory_order_relaxed);
  support::log(LogLevel::info, "ignoring cache entry {}: {}; it will be recompiled and replaced",
               path, why);
}

std::string DiskCache::entry_path(const support::Hash128& key, const std::string& arch) const {
  const std::string hex = key.hex();
  return fmt::format("{}/v1/{}/{}/{}/{}.kjc", root_, compiler_id_, path_component(arch),
                     hex.substr(0, 2), hex);
}

std::optional<CompiledKernel> DiskCache::load(const support::Hash128& key,
                                              const std::string& arch) {
  if (!readable_.load(std::memory_order_acquire)) return std::nullopt;
  const std::string path = entry_path(key, arch);
  const int open_fault = injected(testing::FsStep::open_entry, path);
  UniqueFd fd(open_fault != 0 ? -1 : ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    const int error = open_fault != 0 ? open_fault : errno;
    if (error == ENOENT) return std::nullopt;
    if (error == ELOOP) {
      count_corrupt(path, "is a symlink");
    } else {
      support::log(LogLevel::info, "cannot read cache entry {}: {}", path, error_text(error));
    }
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    support::log(LogLevel::info, "cannot stat cache entry {}: {}", path, error_text(errno));
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    count_corrupt(path, "not a regular file");
    return std::nullopt;
  }
  if (static_cast<std::uint64_t>(st.st_size) > kMaxEntryBytes) {
    count_corrupt(path, fmt::format("{} bytes, larger than any entry kjit writes", st.st_size));
    return std::nullopt;
  }
  // The file is never modified in place (writers rename a new inode over it), so what this
  // descriptor reads is one complete entry or a corrupt one, never a half-written one.
  std::string bytes;
  if (const int error = read_exact(fd.get(), &bytes, static_cast<std::size_t>(st.st_size), path)) {
    count_corrupt(path, fmt::format("read failed: {}", error_text(error)));
    return std::nullopt;
  }
  std::string why;
  std::optional<CompiledKernel> kernel = decode_entry(bytes, key, &why);
  if (!kernel) count_corrupt(path, why);
  return kernel;
}

bool DiskCache::store(const support::Hash128& key, const std::string& arch,
                      const CompiledKernel& kernel) {
  if (!enabled()) return false;
  const std::string bytes = encode_entry(key, kernel);
  const std::string path = entry_path(key, arch);
  if (bytes.size() > kMaxEntryBytes) {
    // Not an I/O problem: keep the cache on for other kernels.
    write_failures_.fetch_add(1, std::memory_order_relaxed);
    support::log(LogLevel::warn, "not caching {}: entry of {} bytes exceeds the {}-byte limit",
                 path, bytes.size(), kMaxEntryBytes);
    return false;
  }
  const std::string dir = parent_of(path);
  if (const int error = make_dirs(dir)) return write_failed(dir, "creating directory", error);

  // Same directory as the entry, so rename() is atomic (same filesystem) and a reader sees
  // either the old entry, or the new one, never a partial file.
  TempFileGuard guard;
  UniqueFd fd;
  std::string temp;
  for (int attempt = 0; !fd; ++attempt) {
    temp = fmt::format("{}.tmp.{}", path, random_suffix());
    const int fault = injected(testing::FsStep::create_temp, temp);
    fd = UniqueFd(fault != 0 ? -1
                             : ::open(temp.c_str(),
                                      O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) {
      const int error = fault != 0 ? fault : errno;
      if ((error == EEXIST || error == EINTR) && attempt < 16) continue;
      return write_failed(temp, "creating temp file", error);
    }
  }
  guard.arm(temp);
  if (const int error = write_all(fd.get(), bytes, temp)) {
    return write_failed(temp, "writing", error);
  }
  // fsync before rename: otherwise a crash after the rename can leave a named but empty or
  // partial file (the classic ext4 zero-length-file failure).
  if (const int error = injected(testing::FsStep::fsync, temp)) {
    return write_failed(temp, "fsync of", error);
  }
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) return write_failed(temp, "fsync of", errno);
  }
  if (const int error = injected(testing::FsStep::close, temp)) {
    return write_failed(temp, "closing", error);
  }
  if (const int error = fd.close()) return write_failed(temp, "closing", error);
  struct stat st {};
  if (::stat(temp.c_str(), &st) != 0) return write_failed(temp, "checking", errno);
  if (static_cast<std::uint64_t>(st.st_size) != bytes.size()) {
    return write_failed(temp, "checking the size of", EIO);
  }
  if (const int error = injected(testing::FsStep::rename, path)) {
    return write_failed(path, "renaming onto", error);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) return write_failed(path, "renaming onto", errno);
  guard.disarm();
  // Make the rename itself durable. Best effort: some filesystems refuse fsync on a directory.
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir_fd) ::fsync(dir_fd.get());
  return true;
}

KeyLock DiskCache::lock(const support::Hash128& key, const std::string& arch) {
  if (!enabled()) return {};
  const std::string path = entry_path(key, arch) + ".lock";
  if (const int error = make_dirs(parent_of(path))) {
    support::log(LogLevel::info, "cannot create the directory of lock {}: {}", path,
                 error_text(error));
    return {};
  }
  const int open_fault = injected(testing::FsStep::open_lock, path);
  UniqueFd fd(
      open_fault != 0 ? -1 : ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd) {
    support::log(LogLevel::info, "cannot open lock {}: {}", path,
                 error_text(open_fault != 0 ? open_fault : errno));
    return {};
  }
  if (const int error = injected(testing::FsStep::flock, path)) {
    support::log(LogLevel::info, "cannot lock {}: {}", path, error_text(error));
    return {};
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      support::log(LogLevel::info, "cannot lock {}: {}", path, error_text(errno));
      return {};
    }
    support::log(LogLevel::debug, "waiting for another compile of the same kernel ({})", path);
    while (::flock(fd.get(), LOCK_EX) != 0) {
      if (errno != EINTR) {
        support::log(LogLevel::info, "cannot lock {}: {}", path, error_text(errno));
        return {};
      }
    }
  }
  return KeyLock(fd.release());
}

}  // namespace kjit::cache
