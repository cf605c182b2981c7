// SPDX-License-Identifier: Apache-2.0
#include "cache/compiler_memo.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

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

/// One "key value" line; false when the line is missing or has another key.
bool read_field(std::istream& in, const char* key, std::string* value) {
  std::string line;
  if (!std::getline(in, line)) return false;
  const std::size_t n = std::strlen(key);
  if (line.size() < n + 1 || line.compare(0, n, key) != 0 || line[n] != ' ') return false;
  *value = line.substr(n + 1);
  return true;
}

bool has_newline(const std::string& text) { return text.find('\n') != std::string::npos; }

}  // namespace

std::string compiler_memo_path(const std::string& root, const std::string& selector) {
  return fmt::format("{}/v1/compilers/{:016x}.memo", root, support::xxh3_64(selector));
}

std::optional<CompilerMemo> read_compiler_memo(const std::string& root,
                                               const std::string& selector) {
  std::ifstream in(compiler_memo_path(root, selector), std::ios::binary);
  if (!in) return std::nullopt;
  std::string magic, memo_selector, library, stamp, id, size_text;
  if (!std::getline(in, magic) || magic != kMagic) return std::nullopt;
  if (!read_field(in, "selector", &memo_selector) || memo_selector != selector) {
    return std::nullopt;
  }
  if (!read_field(in, "library", &library) || !read_field(in, "stamp", &stamp) ||
      !read_field(in, "id", &id) || !read_field(in, "material-bytes", &size_text)) {
    return std::nullopt;
  }
  std::size_t size = 0;
  try {
    std::size_t used = 0;
    size = std::stoul(size_text, &used);
    if (used != size_text.size() || size > (1u << 20)) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  CompilerMemo memo;
  memo.id = id;
  memo.material.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (memo.material.size() != size || memo.id.empty()) return std::nullopt;
  const std::optional<std::string> now = file_stamp(library);
  if (!now || *now != stamp) {
    support::log(LogLevel::debug, "compiler memo for '{}' is stale: {} changed", selector, library);
    return std::nullopt;
  }
  return memo;
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
  std::ostringstream text;
  text << kMagic << "\nselector " << selector << "\nlibrary " << library_file << "\nstamp "
       << *stamp << "\nid " << memo.id << "\nmaterial-bytes " << memo.material.size() << "\n"
       << memo.material;
  const std::string bytes = text.str();
  bool ok = false;
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ok = static_cast<bool>(out.flush());
  }
  if (ok && ::rename(temp.c_str(), path.c_str()) == 0) return true;
  support::log(LogLevel::debug, "compiler memo not written: {}: {}", path, std::strerror(errno));
  ::unlink(temp.c_str());
  return false;
}

}  // namespace kjit::cache
