// SPDX-License-Identifier: Apache-2.0
// Deployment bundles (.kjb): the kernels of a deployment in one file, written by
// `kjit precompile` and searched before the disk cache (KJIT_BUNDLE_PATH), so that production
// loads cubins with no compiler installed. Layout (all integers little-endian; full
// description in cache/BUNDLES.md):
//
//   offset size
//        0    8  magic "KJITBNDL"
//        8    4  format version (kBundleFormatVersion)
//       12    8  header length H
//       20    8  XXH3-64 of the H header bytes
//       28    H  header: library version, template digest, compiler id, archs, manifest (each
//                "u64 length + bytes"), then u64 entry count
//   28 + H    …  entries, each "u64 record length + record"; a record is spec text, key hex
//                (fields), 7 x i64 resources, u64 XXH3-64 of the encoded entry, then the
//                encoded entry (cache::encode_entry) as a field
//
// The file ends exactly after the last entry. Every byte is covered: the header by its
// checksum, the encoded entries by theirs (and by decode_entry's own checks), and each
// record's spec, key and resources by comparison with the verified decoded entry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kjit/kernel.hpp"
#include "kjit/spec.hpp"

namespace kjit::cache {

/// The first 8 bytes of every bundle.
inline constexpr char kBundleMagic[8] = {'K', 'J', 'I', 'T', 'B', 'N', 'D', 'L'};
/// Bumped whenever the layout changes; a bundle of another format version is refused.
inline constexpr std::uint32_t kBundleFormatVersion = 1;
/// Bundles larger than this are refused: a corrupt length must not make a reader allocate
/// without bound, and no deployment comes near it.
inline constexpr std::uint64_t kMaxBundleBytes = std::uint64_t{16} << 30;

/// What a bundle says about itself: what built it, for which targets, from which manifest.
struct BundleInfo {
  /// kjit::kVersion of the writer; a reader of another version refuses the bundle.
  std::string library_version;
  /// codegen::template_set_digest() of the writer; a reader with other templates refuses it.
  std::string template_digest;
  /// The NVRTC identity the kernels were compiled with (informational: cubins load whatever
  /// compiler the reader has, or none).
  std::string compiler_id;
  /// The compile targets, e.g. {"sm_90", "sm_100a"}.
  std::vector<std::string> archs;
  /// The manifest text the bundle was precompiled from.
  std::string manifest;

  /// Info for a bundle written by this build: its library version and template digest.
  static BundleInfo current(std::string compiler_id, std::vector<std::string> archs,
                            std::string manifest);
};

/// One kernel of a bundle, as indexed by its record.
struct BundleEntry {
  KernelSpec spec;
  /// Cache key, 32 lowercase hex digits.
  std::string key;
  KernelResources resources;
  /// XXH3-64 of the encoded entry.
  std::uint64_t checksum = 0;
  /// Size of the encoded entry in bytes.
  std::size_t encoded_bytes = 0;
  /// The decoded, verified kernel.
  std::shared_ptr<const CompiledKernel> kernel;
};

/// Serializes a bundle. Every kernel needs its key (32 hex digits) and spec; a spec given
/// twice is stored once. Throws InvalidArgument for a kernel without a valid key.
std::string encode_bundle(const BundleInfo& info, const std::vector<CompiledKernel>& kernels);

/// Writes encode_bundle() to `path` atomically (temp file in the same directory, fsync,
/// rename), so that a reader never sees half a bundle. Throws CacheError naming the path and
/// the failed step.
void write_bundle(const std::string& path, const BundleInfo& info,
                  const std::vector<CompiledKernel>& kernels);

/// A bundle read into memory and verified completely on open: every checksum, every entry
/// decoded. Immutable afterwards, so every const member is safe to call from many threads.
class Bundle {
 public:
  /// Reads and verifies the file. Throws CacheError naming the path and what is wrong: not a
  /// bundle, another format version, another library version or template digest (naming
  /// both), a checksum mismatch (naming the entry), truncation or trailing bytes.
  static Bundle open(const std::string& path);
  /// As open(), from bytes already in memory; `name` is used in messages.
  static Bundle from_bytes(std::string_view bytes, std::string name);

  /// The path (or name) it was opened from.
  const std::string& path() const noexcept { return path_; }
  const BundleInfo& info() const noexcept { return info_; }
  /// Entries in file order.
  const std::vector<BundleEntry>& entries() const noexcept { return entries_; }

  /// The kernel compiled for exactly this spec (family, parameters and arch), or nullptr.
  std::shared_ptr<const CompiledKernel> find(const KernelSpec& spec) const;
  /// Up to `n` spec texts of the same family closest to `spec`: fewest differing parameters
  /// (a different arch counts as one), ties in text order.
  std::vector<std::string> nearest(const KernelSpec& spec, int n) const;

 private:
  std::string path_;
  BundleInfo info_;
  std::vector<BundleEntry> entries_;
  std::unordered_map<std::string, std::size_t> by_spec_;
};

/// The bundles of KJIT_BUNDLE_PATH, searched in order (the first bundle holding a spec wins).
/// Immutable after construction; thread-safe.
class BundleSet {
 public:
  BundleSet() = default;
  /// Opens every path; throws CacheError for the first one that cannot be used (a configured
  /// bundle that silently did nothing would turn into compiles, or KernelNotInBundle, later).
  explicit BundleSet(const std::vector<std::string>& paths);
  /// Adds an opened bundle after the others.
  void add(Bundle bundle);

  bool empty() const noexcept { return bundles_.empty(); }
  const std::vector<Bundle>& bundles() const noexcept { return bundles_; }
  /// The paths of the bundles, in search order.
  std::vector<std::string> paths() const;

  /// The kernel for this exact spec from the first bundle holding it, or nullptr; `path`, when
  /// given, is set to that bundle's path on a hit.
  std::shared_ptr<const CompiledKernel> find(const KernelSpec& spec,
                                             std::string* path = nullptr) const;
  /// Up to `n` nearest spec texts over all bundles (see Bundle::nearest), without duplicates.
  std::vector<std::string> nearest(const KernelSpec& spec, int n) const;
  /// The text of a KernelNotInBundle for `spec`: the spec, the bundles searched, and the
  /// nearest specs they hold with the parameters that differ. `elsewhere`, when given, says
  /// what else was searched ("not in the disk cache /x (...)").
  std::string miss_message(const KernelSpec& spec, std::string_view elsewhere = {}) const;

 private:
  std::vector<Bundle> bundles_;
};

/// The parameters (and "arch") in which two specs of one family differ; empty when equal.
/// Specs of different families differ in "family".
std::vector<std::string> spec_differences(const KernelSpec& a, const KernelSpec& b);

}  // namespace kjit::cache
