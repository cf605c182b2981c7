// SPDX-License-Identifier: Apache-2.0
// On-disk kernel cache: <root>/v1/<compiler-id>/<arch>/<2 hex>/<key>.kjc. Publish is atomic
// (temp file, fsync, rename); readers take no lock; a per-key flock makes N processes compile
// a key once. A bad entry is a miss: never handed to the driver.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "cache/entry.hpp"
#include "kjit/kernel.hpp"
#include "support/hash.hpp"

namespace kjit::cache {

/// Held while one process (or thread) compiles a key; released on destruction. Move-only.
/// An empty lock (held() == false) is returned where locking is impossible; the caller then
/// compiles without coordination, which is safe because publishing is atomic.
class KeyLock {
 public:
  KeyLock() = default;
  /// Takes ownership of a descriptor that holds an flock.
  explicit KeyLock(int fd) : fd_(fd) {}
  ~KeyLock();
  KeyLock(KeyLock&& other) noexcept;
  KeyLock& operator=(KeyLock&& other) noexcept;
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  bool held() const noexcept { return fd_ >= 0; }
  /// Releases the lock now (also done by the destructor).
  void unlock() noexcept;

 private:
  int fd_ = -1;
};

/// The disk cache of one compiler identity. All methods are thread-safe; several processes may
/// share one root.
class DiskCache {
 public:
  /// Opens (creating with mode 0700, parents too, if needed) `root`. A root that cannot be
  /// created or written makes the cache disabled (nothing is stored) with one warning; when
  /// its compiler directory exists and can be read (a pre-filled cache on a read-only mount),
  /// its entries are still loaded. A root that
  /// other users could write (mode & 022, another owner, or a symlink to such a directory) is
  /// refused with CacheError. `compiler_id` names a subdirectory; characters outside
  /// [A-Za-z0-9._+-] are replaced by '_'.
  DiskCache(std::string root, std::string compiler_id);
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  /// True while entries are written. Turns false at construction (unusable or read-only root)
  /// or after the first failed write; entries already on disk are still read after a failed
  /// write, and from a read-only root.
  bool enabled() const noexcept { return writable_.load(std::memory_order_acquire); }
  /// Why the cache is disabled, empty when enabled.
  std::string disabled_reason() const;
  const std::string& root() const noexcept { return root_; }
  /// The compiler id as used in paths.
  const std::string& compiler_id() const noexcept { return compiler_id_; }
  /// Path of the entry for `key` compiled for `arch` ("sm_90a").
  std::string entry_path(const support::Hash128& key, const std::string& arch) const;

  /// The verified entry, or nullopt on a miss. Takes no lock. A corrupt, truncated or foreign
  /// entry counts in corrupt_entries(), is logged at info level and is a miss; the file is
  /// left for store() to replace (deleting it could delete a good entry published meanwhile).
  std::optional<CompiledKernel> load(const support::Hash128& key, const std::string& arch);
  /// Publishes atomically: exclusive temp file in the entry's directory, write, fsync, close,
  /// size check, rename over the entry, fsync of the directory. On any I/O error (ENOSPC,
  /// EACCES, EROFS, EDQUOT, ...) removes the temp file, counts a write failure, turns the
  /// cache memory-only with one warning and returns false. Never throws for I/O errors (only
  /// InvalidArgument from encode_entry for a kernel.key that contradicts `key`).
  bool store(const support::Hash128& key, const std::string& arch, const CompiledKernel& kernel);
  /// Blocks until the caller holds the per-key lock (flock LOCK_EX on "<entry>.lock", created
  /// 0600 and never deleted: deleting would let two processes lock different inodes; a killed
  /// holder's lock is released by the kernel). Excludes other threads of this process too,
  /// since each call opens its own file description. An empty lock when the cache is
  /// disabled or the lock file cannot be opened.
  KeyLock lock(const support::Hash128& key, const std::string& arch);

  std::uint64_t corrupt_entries() const noexcept {
    return corrupt_entries_.load(std::memory_order_relaxed);
  }
  std::uint64_t write_failures() const noexcept {
    return write_failures_.load(std::memory_order_relaxed);
  }

 private:
  void disable(std::string reason, bool reads_too);
  bool write_failed(const std::string& path, const char* step, int error);
  void count_corrupt(const std::string& path, const std::string& why);

  std::string root_;
  std::string compiler_id_;
  std::atomic<bool> writable_{false};
  std::atomic<bool> readable_{false};
  mutable std::mutex mutex_;
  std::string disabled_reason_;  // guarded by mutex_
  std::atomic<std::uint64_t> corrupt_entries_{0};
  std::atomic<std::uint64_t> write_failures_{0};
};

namespace testing {
/// Called by DiskCache::store() after each chunk written to the temp file, with the bytes
/// written so far and the total. Lets tests kill a process in the middle of a write.
using StoreHook = void (*)(std::size_t written, std::size_t total);
/// Installs a hook (nullptr removes it). Process-wide; for tests only.
void set_store_hook(StoreHook hook) noexcept;

/// The file-system steps of DiskCache at which a fault can be injected.
enum class FsStep {
  make_dir,     // mkdir of the root, the compiler directory or a fan-out directory
  probe_root,   // access(W_OK) of the compiler directory at construction
  create_temp,  // open(O_CREAT | O_EXCL) of the temp file of a store
  write,        // each write() of a temp file chunk
  fsync,        // fsync of the temp file
  close,        // close of the temp file
  rename,       // rename of the temp file onto the entry
  open_entry,   // open of an entry by load
  read_entry,   // read of an entry by load
  open_lock,    // open of a key's lock file
  flock,        // flock of a key's lock file
};
/// Called before each step with the path it acts on. Returning an errno makes the step fail
/// with it instead of running (ENOSPC, EACCES, EROFS, EDQUOT, EIO: faults that root, or a
/// test machine, cannot always produce for real); 0 runs the step. It may also kill the
/// process, to stop a store at a chosen step.
using FaultHook = int (*)(FsStep step, const char* path);
/// Installs a fault hook (nullptr removes it). Process-wide; for tests only.
void set_fault_hook(FaultHook hook) noexcept;
}  // namespace testing

}  // namespace kjit::cache
