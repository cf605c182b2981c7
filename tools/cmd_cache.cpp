// SPDX-License-Identifier: Apache-2.0
// kjit cache: list, count, verify, prune, clear and explain the disk cache
// (<root>/v1/<compiler-id>/<arch>/<2 hex>/<key>.kjc, see cache/README.md).
#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <system_error>

#include "cache/entry.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "kjit/error.hpp"
#include "kjit/settings.hpp"

namespace kjit::tool {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCacheUsage = R"(usage: kjit cache <action> [options]

Works on the disk cache root (KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else ~/.cache/kjit):
  ls                    every entry: key, spec, arch, size, date (oldest first)
  stats                 entry count and bytes, per compiler and arch
  verify                decode every entry; exit 1 if any is corrupt
  prune --max-size SIZE delete the oldest entries (by mtime) until the total is <= SIZE
                        (bytes, or with a K/M/G/T suffix: 100M, 2G)
  clear                 delete every entry (lock files stay: a process may hold one)
  explain <key>         the key material, spec, options and resources stored in an entry
prune and clear name every file they cannot delete (or directory they cannot list) on stderr
and then exit 1.
)";

/// One .kjc file under the root.
struct EntryFile {
  fs::path path;
  std::string compiler;
  std::string arch;
  std::string key;  // file name without .kjc
  std::uint64_t size = 0;
  std::time_t mtime = 0;
};

std::string cache_root() { return Settings::from_env().resolved_cache_dir(); }

/// Every entry under `root`. A directory that cannot be listed is skipped; `unlisted`, when
/// given, counts them (a prune must not claim a total that ignores them).
std::vector<EntryFile> list_entries(const std::string& root, std::size_t* unlisted = nullptr) {
  std::vector<EntryFile> entries;
  const fs::path tree = fs::path(root) / "v1";
  std::error_code error;
  if (!fs::is_directory(tree, error)) return entries;
  const auto options = unlisted != nullptr ? fs::directory_options::none
                                           : fs::directory_options::skip_permission_denied;
  auto it = fs::recursive_directory_iterator(tree, options, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (!it->is_regular_file(error) || it->path().extension() != ".kjc") continue;
    const fs::path relative = fs::relative(it->path(), tree, error);
    std::vector<std::string> parts;
    for (const fs::path& part : relative) parts.push_back(part.string());
    if (parts.size() != 4) continue;  // <compiler>/<arch>/<2 hex>/<key>.kjc
    struct stat info {};
    if (::stat(it->path().c_str(), &info) != 0) continue;
    entries.push_back(EntryFile{it->path(), parts[0], parts[1], it->path().stem().string(),
                                static_cast<std::uint64_t>(info.st_size), info.st_mtime});
  }
  if (error && unlisted != nullptr) {
    std::fprintf(stderr, "kjit: cannot list every directory under %s: %s\n", tree.c_str(),
                 error.message().c_str());
    ++*unlisted;
  }
  std::sort(entries.begin(), entries.end(), [](const EntryFile& a, const EntryFile& b) {
    return a.mtime != b.mtime ? a.mtime < b.mtime : a.path < b.path;
  });
  return entries;
}

std::optional<CompiledKernel> decode_file(const EntryFile& entry, std::string* why) {
  std::ifstream file(entry.path, std::ios::binary);
  if (!file) {
    *why = "cannot be read";
    return std::nullopt;
  }
  std::ostringstream bytes;
  bytes << file.rdbuf();
  const std::string data = bytes.str();
  support::Hash128 key;
  if (!support::Hash128::parse_hex(entry.key, &key)) {
    *why = "its file name is not a key";
    return std::nullopt;
  }
  return cache::decode_entry(data, key, why);
}

std::string date_of(std::time_t time) {
  std::tm local{};
  ::localtime_r(&time, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M", &local);
  return text;
}

int cache_ls(const std::string& root) {
  const auto entries = list_entries(root);
  std::printf("%-32s  %-8s %10s  %-16s  %s\n", "key", "arch", "size", "date", "spec");
  for (const EntryFile& entry : entries) {
    std::string why;
    const auto kernel = decode_file(entry, &why);
    std::printf("%-32s  %-8s %10s  %-16s  %s\n", entry.key.c_str(), entry.arch.c_str(),
                format_size(entry.size).c_str(), date_of(entry.mtime).c_str(),
                kernel ? kernel->spec.str().c_str() : ("CORRUPT: " + why).c_str());
  }
  std::printf("%zu entries under %s\n", entries.size(), root.c_str());
  return kExitOk;
}

int cache_stats(const std::string& root) {
  const auto entries = list_entries(root);
  std::map<std::pair<std::string, std::string>, std::pair<std::size_t, std::uint64_t>> groups;
  std::uint64_t total = 0;
  for (const EntryFile& entry : entries) {
    auto& group = groups[{entry.compiler, entry.arch}];
    ++group.first;
    group.second += entry.size;
    total += entry.size;
  }
  std::printf("root     %s\nentries  %zu\nsize     %s (%llu bytes)\n", root.c_str(), entries.size(),
              format_size(total).c_str(), static_cast<unsigned long long>(total));
  for (const auto& [where, count] : groups) {
    std::printf("  %s %s: %zu entries, %s\n", where.first.c_str(), where.second.c_str(),
                count.first, format_size(count.second).c_str());
  }
  return kExitOk;
}

int cache_verify(const std::string& root) {
  const auto entries = list_entries(root);
  std::size_t corrupt = 0;
  for (const EntryFile& entry : entries) {
    std::string why;
    if (!decode_file(entry, &why)) {
      ++corrupt;
      std::printf("CORRUPT %s: %s\n", entry.path.c_str(), why.c_str());
    }
  }
  std::printf("%zu entries checked, %zu corrupt\n", entries.size(), corrupt);
  return corrupt == 0 ? kExitOk : kExitFailed;
}

/// Prints why `path` could not be deleted, on stderr, and counts it.
void report_failure(const fs::path& path, const std::error_code& error, std::size_t* failures) {
  std::fprintf(stderr, "kjit: cannot remove %s: %s\n", path.c_str(), error.message().c_str());
  ++*failures;
}

int cache_prune(const std::string& root, std::uint64_t max_size) {
  std::size_t failures = 0;
  const auto entries = list_entries(root, &failures);  // oldest first
  std::uint64_t total = 0;
  for (const EntryFile& entry : entries) total += entry.size;
  std::size_t removed = 0;
  std::uint64_t freed = 0;
  for (const EntryFile& entry : entries) {
    if (total <= max_size) break;
    // Readers open by path and keep their descriptor: unlinking under them is safe.
    std::error_code error;
    if (fs::remove(entry.path, error)) {
      total -= entry.size;
      freed += entry.size;
      ++removed;
    } else if (error) {
      report_failure(entry.path, error, &failures);
    }
    // Else it was gone already (another prune): neither removed here nor a failure.
  }
  std::printf("removed %zu entries (%s); %s left (limit %s)\n", removed, format_size(freed).c_str(),
              format_size(total).c_str(), format_size(max_size).c_str());
  if (failures == 0) return kExitOk;
  std::fprintf(stderr,
               "kjit: cache prune: %zu entries or directories could not be removed or listed; "
               "the cache may still be over the %s limit\n",
               failures, format_size(max_size).c_str());
  return kExitFailed;
}

int cache_clear(const std::string& root) {
  const fs::path tree = fs::path(root) / "v1";
  std::error_code error;
  std::size_t removed = 0;
  std::size_t failures = 0;
  if (fs::is_directory(tree, error)) {
    std::vector<fs::path> directories;
    auto it = fs::recursive_directory_iterator(tree, error);
    for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
      std::error_code file_error;
      if (it->is_directory(file_error)) {
        directories.push_back(it->path());
      } else if (it->path().extension() != ".lock") {
        // Lock files are never deleted: a process holding one would otherwise lock an inode
        // another process can no longer find, and both would compile the key.
        if (fs::remove(it->path(), file_error)) {
          ++removed;
        } else if (file_error) {
          report_failure(it->path(), file_error, &failures);
        }
      }
    }
    if (error) {
      // A directory that cannot be listed hides entries that stay behind.
      std::fprintf(stderr, "kjit: cannot list every directory under %s: %s\n", tree.c_str(),
                   error.message().c_str());
      ++failures;
    }
    // Deepest first; directories still holding lock files (or undeletable entries) stay.
    std::sort(directories.rbegin(), directories.rend());
    for (const fs::path& directory : directories) fs::remove(directory, error);
  } else if (error) {
    std::fprintf(stderr, "kjit: cannot read %s: %s\n", tree.c_str(), error.message().c_str());
    ++failures;
  }
  std::printf("removed %zu files under %s\n", removed, tree.c_str());
  if (failures == 0) return kExitOk;
  std::fprintf(stderr, "kjit: cache clear: %zu file(s) or directories could not be removed\n",
               failures);
  return kExitFailed;
}

int cache_explain(const std::string& root, const std::string& key) {
  support::Hash128 parsed;
  if (!support::Hash128::parse_hex(key, &parsed)) {
    throw UsageError(fmt::format("cache explain: '{}' is not a key (32 hex digits)", key));
  }
  for (const EntryFile& entry : list_entries(root)) {
    if (entry.key != parsed.hex()) continue;
    std::string why;
    const auto kernel = decode_file(entry, &why);
    if (!kernel) {
      std::fprintf(stderr, "kjit: entry %s is corrupt: %s\n", entry.path.c_str(), why.c_str());
      return kExitFailed;
    }
    std::printf(
        "entry        %s\nspec         %s\narch         %s\nentry point  %s\noptions      %s\n"
        "registers    %d, static smem %lld bytes, local %lld bytes, spills %lld/%lld bytes\n"
        "\n== key material ==\n%s",
        entry.path.c_str(), kernel->spec.str().c_str(), entry.arch.c_str(),
        kernel->lowered_name.c_str(), kernel->options.c_str(), kernel->resources.registers,
        static_cast<long long>(kernel->resources.static_smem),
        static_cast<long long>(kernel->resources.local_bytes),
        static_cast<long long>(kernel->resources.spill_store_bytes),
        static_cast<long long>(kernel->resources.spill_load_bytes), kernel->key_material.c_str());
    return kExitOk;
  }
  std::fprintf(stderr, "kjit: no entry with key %s under %s\n", parsed.hex().c_str(), root.c_str());
  return kExitFailed;
}

}  // namespace

int cmd_cache(const Argv& argv) {
  const Args args = parse_args(argv, {.values = {"max-size"}, .max_positional = 2}, "cache");
  if (args.has("help")) {
    std::fputs(kCacheUsage, stdout);
    return kExitOk;
  }
  if (args.positional.empty()) {
    throw UsageError("cache: give an action: ls, stats, verify, prune, clear, explain");
  }
  const std::string& action = args.positional[0];
  const bool needs_key = action == "explain";
  if (needs_key != (args.positional.size() == 2)) {
    throw UsageError(needs_key ? "cache explain: give a key"
                               : fmt::format("cache {}: unexpected argument '{}'", action,
                                             args.positional.back()));
  }
  if (args.has("max-size") != (action == "prune")) {
    throw UsageError(action == "prune" ? "cache prune: give --max-size SIZE (e.g. 100M)"
                                       : "cache: --max-size belongs to prune");
  }
  const std::string root = cache_root();
  if (action == "ls") return cache_ls(root);
  if (action == "stats") return cache_stats(root);
  if (action == "verify") return cache_verify(root);
  if (action == "prune") return cache_prune(root, parse_size(args.get("max-size")));
  if (action == "clear") return cache_clear(root);
  if (action == "explain") return cache_explain(root, args.positional[1]);
  throw UsageError(fmt::format(
      "cache: unknown action '{}'; accepted: ls, stats, verify, prune, clear, explain", action));
}

}  // namespace kjit::tool
