// SPDX-License-Identifier: Apache-2.0
#include "support/log.hpp"

#include <atomic>
#include <cstdio>

namespace kjit::support {
namespace {
std::atomic<LogLevel> g_level{LogLevel::warn};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warning";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
    case LogLevel::off:
      break;
  }
  return "";
}
}  // namespace

void set_log_level(LogLevel level) noexcept { g_level.store(level, std::memory_order_relaxed); }
LogLevel log_level() noexcept { return g_level.load(std::memory_order_relaxed); }

void log_line(LogLevel level, std::string_view message) noexcept {
  if (level > log_level() || level == LogLevel::off) return;
  // One fprintf per line so lines from several threads do not interleave.
  std::fprintf(stderr, "[kjit %s] %.*s\n", level_name(level), static_cast<int>(message.size()),
               message.data());
}

}  // namespace kjit::support
