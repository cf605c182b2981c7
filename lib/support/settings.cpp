// SPDX-License-Identifier: Apache-2.0
// The only place kjit reads the environment.
#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "kjit/error.hpp"
#include "kjit/settings.hpp"

namespace kjit {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

/// A boolean's spellings: 1/0, true/false, on/off, yes/no; none for another text.
std::optional<bool> parse_flag(const std::string& value) {
  if (value == "0" || value == "false" || value == "off" || value == "no") return false;
  if (value == "1" || value == "true" || value == "on" || value == "yes") return true;
  return std::nullopt;
}

bool env_flag(const char* name) {
  const std::string value = env(name);
  if (value.empty()) return false;
  if (const std::optional<bool> flag = parse_flag(value)) return *flag;
  throw InvalidArgument(
      fmt::format("{}={}: expected 0/1, true/false, on/off or yes/no", name, value));
}

LogLevel parse_log_level(const std::string& text) {
  // Case-insensitive: KJIT_LOG=DEBUG is what people type after reading "debug" in a table.
  std::string value = text;
  for (char& c : value) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (value.empty() || value == "warn" || value == "warning") return LogLevel::warn;
  if (value == "off" || value == "0" || value == "none") return LogLevel::off;
  if (value == "error") return LogLevel::error;
  if (value == "info" || value == "1") return LogLevel::info;
  if (value == "debug" || value == "2") return LogLevel::debug;
  throw InvalidArgument(
      fmt::format("KJIT_LOG={}: expected one of off, error, warn, info, debug (any case)", text));
}

}  // namespace

Settings Settings::from_env() {
  Settings s;
  s.cache_dir = env("KJIT_CACHE_DIR");
  const std::string bundles = env("KJIT_BUNDLE_PATH");
  std::size_t start = 0;
  while (start <= bundles.size() && !bundles.empty()) {
    const std::size_t end = bundles.find(':', start);
    const std::string item =
        bundles.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!item.empty()) s.bundle_paths.push_back(item);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  s.disable_jit = env_flag("KJIT_DISABLE_JIT");
  s.disable_disk_cache = env_flag("KJIT_DISABLE_DISK_CACHE");
  s.dump_dir = env("KJIT_DUMP_DIR");
  s.log_level = parse_log_level(env("KJIT_LOG"));
  s.cuda_home = env("KJIT_CUDA_HOME");
  if (s.cuda_home.empty()) s.cuda_home = env("CUDA_HOME");
  s.nvrtc_library = env("KJIT_NVRTC_LIBRARY");
  s.cuda_driver_library = env("KJIT_CUDA_DRIVER_LIBRARY");
  s.allow_compile_in_capture = env_flag("KJIT_ALLOW_COMPILE_IN_CAPTURE");
  s.debug_checks = env_flag("KJIT_DEBUG_CHECKS");
  s.disable_programmatic_launch = env_flag("KJIT_DISABLE_PROGRAMMATIC_LAUNCH");
  // Unset: the defaults (both); else loads, stores, all / none, or a boolean's spelling for both.
  const std::string maps = env("KJIT_TENSOR_MAPS");
  if (maps == "loads" || maps == "stores") {
    s.tensor_map_loads = maps == "loads";
    s.tensor_map_stores = maps == "stores";
  } else if (!maps.empty()) {
    const std::optional<bool> both = maps == "all"    ? true
                                     : maps == "none" ? false
                                                      : parse_flag(maps);
    if (!both) {
      throw InvalidArgument(fmt::format(
          "KJIT_TENSOR_MAPS={}: expected 0 (none), loads, stores or 1 (both); also off/on, "
          "false/true, no/yes, none/all",
          maps));
    }
    s.tensor_map_loads = s.tensor_map_stores = *both;
  }
  return s;
}

std::string Settings::resolved_cache_dir() const {
  if (!cache_dir.empty()) return cache_dir;
  // Read here rather than stored, so that a Settings built by hand still resolves.
  if (const std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/kjit";
  if (const std::string home = env("HOME"); !home.empty()) return home + "/.cache/kjit";
  return "/tmp/kjit-cache";
}

std::string Settings::resolved_cuda_home() const {
  return cuda_home.empty() ? std::string("/usr/local/cuda") : cuda_home;
}

}  // namespace kjit
