// SPDX-License-Identifier: Apache-2.0
// On-disk kernel cache: <root>/v1/<compiler-id>/<arch>/<2 hex>/<key>.kjc. Publish is atomic
// (temp file, fsync, rename); readers take no lock; a per-key flock makes N processes compile
// a key once. A bad entry is a miss: never handed to the driver.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "kjit/runtime.hpp"
#include "support/hash.hpp"

namespace kjit::cache {

/// Serialized entry: magic, format version, key, payload length, XXH3-64 of the payload,
/// payload (all of CompiledKernel).
std::string encode_entry(const support::Hash128& key, const CompiledKernel& kernel);
/// nullopt (with `why` set) for a truncated, corrupt, foreign-version or other-key entry.
std::optional<CompiledKernel> decode_entry(std::string_view bytes,
                                           const support::Hash128& expected_key, std::string* why);

/// Held while one process compiles a key; released on destruction. Move-only.
class KeyLock {
 public:
  KeyLock() = default;
  explicit KeyLock(int fd) : fd_(fd) {}
  ~KeyLock();
  KeyLock(KeyLock&& other) noexcept;
  KeyLock& operator=(KeyLock&& other) noexcept;
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  bool held() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class DiskCache {
 public:
  /// Opens (creating 0700 if needed) `root`. A root that cannot be created or written makes
  /// the cache disabled (memory-only) with one warning; a root writable by other users is
  /// refused with CacheError.
  DiskCache(std::string root, std::string compiler_id);

  bool enabled() const noexcept { return enabled_; }
  /// Why the cache is disabled, empty when enabled.
  const std::string& disabled_reason() const noexcept { return disabled_reason_; }
  const std::string& root() const noexcept { return root_; }
  /// Path of the entry for `key` compiled for `arch` ("sm_90a").
  std::string entry_path(const support::Hash128& key, const std::string& arch) const;

  /// The verified entry, or nullopt on a miss. A corrupt entry counts in corrupt_entries()
  /// and is a miss.
  std::optional<CompiledKernel> load(const support::Hash128& key, const std::string& arch);
  /// Publishes atomically. On ENOSPC/EACCES/EROFS the cache turns memory-only with one
  /// warning and the call returns false; never throws for I/O errors.
  bool store(const support::Hash128& key, const std::string& arch, const CompiledKernel& kernel);
  /// Blocks until this process holds the per-key lock (flock on <entry>.lock, never
  /// deleted). An empty lock when the cache is disabled.
  KeyLock lock(const support::Hash128& key, const std::string& arch);

  std::uint64_t corrupt_entries() const noexcept { return corrupt_entries_; }
  std::uint64_t write_failures() const noexcept { return write_failures_; }

 private:
  std::string root_;
  std::string compiler_id_;
  bool enabled_ = false;
  std::string disabled_reason_;
  std::uint64_t corrupt_entries_ = 0;
  std::uint64_t write_failures_ = 0;
};

}  // namespace kjit::cache
