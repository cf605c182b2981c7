// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <fmt/format.h>

#include <string_view>

#include "kjit/settings.hpp"

namespace kjit::support {

/// The process-wide log threshold; set from Settings::log_level by the Runtime.
void set_log_level(LogLevel level) noexcept;
LogLevel log_level() noexcept;
/// Writes "[kjit <level>] message" to stderr when `level` passes the threshold.
void log_line(LogLevel level, std::string_view message) noexcept;

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level > log_level() || level == LogLevel::off) return;
  log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kjit::support
