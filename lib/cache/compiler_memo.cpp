// SPDX-License-Identifier: Apache-2.0
#include "cache/compiler_memo.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include "cache/unique_fd.hpp"

#include "support/hash.hpp"
#include "support/log.hpp"

namespace kjit::cache {
namespace {

constexpr const char* kMagic = "kjit compiler memo 1";

/// What identifies a library file's contents without reading them.
std::optional<std::string> file_stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return fmt::format(
      "{} {} {} {} {}", static_cast<unsigned long long>(st.st_size),
      static_cast<long long>(st.st_mtim.tv_sec), static_cast<long long>(st.st_mtim.tv_nsec),
      static_cast<unsigned long long>(st.st_ino), static_cast<unsigned long long>(st.st_dev));
}

/// A whole small file, or nullopt. POSIX I/O rather than iostreams: libkjit may carry its own
/// static libstdc++ (the Python package's build), whose stream locale facets crashed inside a
/// process that had loaded torch.
std::optional<std::string> read_small_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string bytes;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::nullopt;
    if (got == 0) return bytes;
    bytes.append(buffer, static_cast<std::size_t>(got));
    if (bytes.size() > (2u << 20)) return std::nullopt;  // not a memo
  }
}

/// Takes one "key value" line off the front of `text`; false when it is missing or has
/// another key.
bool read_field(std::string_view* text, std::string_view key, std::string* value) {
  const std::size_t end = text->find('\n');
  if (end == std::string_view::npos) return false;
  const std::string_view line = text->substr(0, end);
  if (line.size() < key.size() + 1 || line.substr(0, key.size()) != key ||
      line[key.size()] != ' ') {
    return false;
  }
  *value = std::string(line.substr(key.size() + 1));
  text->remove_prefix(end + 1);
  return true;
}

bool has_newline(const std::string& text) { return text.find('\n') != std::string::npos; }

/// The fields of a memo file.
struct MemoFile {
  std::string selector;
  std::string library;
  std::string stamp;
  CompilerMemo memo;
};

std::optional<MemoFile> parse_memo(const std::string& path) {
  const std::optional<std::string> file = read_small_file(path);
  if (!file) return std::nullopt;
  std::string_view text = *file;
  const std::string_view magic = kMagic;
  if (!text.starts_with(magic) || text.size() <= magic.size() || text[magic.size()] != '\n') {
    return std::nullopt;
  }
  text.remove_prefix(magic.size() + 1);
  MemoFile memo;
  std::string size_text;
  if (!read_field(&text, "selector", &memo.selector) ||
      !read_field(&text, "library", &memo.library) || !read_field(&text, "stamp", &memo.stamp) ||
      !read_field(&text, "id", &memo.memo.id) || !read_field(&text, "material-bytes", &size_text)) {
    return std::nullopt;
  }
  std::size_t size = 0;
  const auto [end, error] =
      std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
  if (error != std::errc() || end != size_text.data() + size_text.size() || text.size() != size ||
      memo.memo.id.empty()) {
    return std::nullopt;
  }
  memo.memo.material = std::string(text);
  return memo;
}

}  // namespace

std::string compiler_memo_path(const std::string& root, const std::string& selector) {
  return fmt::format("{}/v1/compilers/{:016x}.memo", root, support::xxh3_64(selector));
}

std::optional<CompilerMemo> read_compiler_memo(const std::string& root,
                                               const std::string& selector) {
  std::optional<MemoFile> file = parse_memo(compiler_memo_path(root, selector));
  if (!file || file->selector != selector) return std::nullopt;
  const std::optional<std::string> now = file_stamp(file->library);
  if (!now || *now != file->stamp) {
    support::log(LogLevel::debug, "compiler memo for '{}' is stale: {} changed", selector,
                 file->library);
    return std::nullopt;
  }
  return std::move(file->memo);
}

std::vector<CompilerMemo> read_all_compiler_memos(const std::string& root) {
  std::vector<std::string> paths;
  const std::string dir = fmt::format("{}/v1/compilers", root);
  if (DIR* stream = ::opendir(dir.c_str())) {
    while (const dirent* entry = ::readdir(stream)) {
      const std::string_view name = entry->d_name;
      if (name.size() > 5 && name.ends_with(".memo")) paths.push_back(dir + "/" + entry->d_name);
    }
    ::closedir(stream);
  }
  std::sort(paths.begin(), paths.end());
  std::vector<CompilerMemo> memos;
  for (const std::string& path : paths) {
    if (std::optional<MemoFile> file = parse_memo(path)) memos.push_back(std::move(file->memo));
  }
  return memos;
}

bool write_compiler_memo(const std::string& root, const std::string& selector,
                         const std::string& library_file, const CompilerMemo& memo) {
  const std::optional<std::string> stamp = file_stamp(library_file);
  if (!stamp || has_newline(selector) || has_newline(library_file) || has_newline(memo.id)) {
    support::log(LogLevel::debug, "compiler memo not written: cannot describe '{}'", library_file);
    return false;
  }
  const std::string dir = fmt::format("{}/v1/compilers", root);
  // The root and v1/ exist: the disk cache made them (and checked their owner) first.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    support::log(LogLevel::debug, "compiler memo not written: mkdir {}: {}", dir,
                 std::strerror(errno));
    return false;
  }
  const std::string path = compiler_memo_path(root, selector);
  // Unique per process and call: two runtimes of one process may write at once.
  static std::atomic<unsigned> serial{0};
  const std::string temp =
      fmt::format("{}.{}.{}.tmp", path, static_cast<long>(::getpid()), serial.fetch_add(1));
  const std::string bytes =
      fmt::format("{}\nselector {}\nlibrary {}\nstamp {}\nid {}\nmaterial-bytes {}\n{}", kMagic,
                  selector, library_file, *stamp, memo.id, memo.material.size(), memo.material);
  bool ok = false;
  {
    UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    std::size_t written = 0;
    while (fd && written < bytes.size()) {
      const ssize_t put = ::write(fd.get(), bytes.data() + written, bytes.size() - written);
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) break;
      written += static_cast<std::size_t>(put);
    }
    ok = fd && written == bytes.size();
  }
  if (ok && ::rename(temp.c_str(), path.c_str()) == 0) return true;
  support::log(LogLevel::debug, "compiler memo not written: {}: {}", path, std::strerror(errno));
  ::unlink(temp.c_str());
  return false;
}

}  // namespace kjit::cache
