// SPDX-License-Identifier: Apache-2.0
// Command-line parsing shared by the kjit subcommands: `--name value`, `--name=value` and flags,
// with every mistake reported as one UsageError line (exit code 2).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/error.hpp"

namespace kjit::tool {

/// A bad command line: printed as one line on stderr, exit code 2.
class UsageError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// Exit codes of the tool.
inline constexpr int kExitOk = 0;
/// A check failed (cache verify found corrupt entries, precompile had failures).
inline constexpr int kExitFailed = 1;
/// Bad arguments, or a problem that cannot be planned / verified.
inline constexpr int kExitUsage = 2;

/// A parsed command line of one subcommand.
struct Args {
  std::vector<std::string> positional;
  /// Option name without dashes -> values in order (flags have one empty value).
  std::map<std::string, std::vector<std::string>> options;

  bool has(std::string_view name) const { return options.count(std::string(name)) > 0; }
  /// The value of an option, or `fallback` when absent.
  std::string get(std::string_view name, std::string_view fallback = {}) const;
  /// Every value of a repeatable option.
  std::vector<std::string> all(std::string_view name) const;
  /// An integer option; UsageError naming the option for a non-integer.
  std::int64_t get_int(std::string_view name, std::int64_t fallback) const;
};

/// What a subcommand accepts. `any_value_option` lets unknown `--x v` options through (for
/// `kjit plan`, whose shape options depend on the op and are checked by it).
struct ArgSpec {
  std::set<std::string, std::less<>> flags;
  std::set<std::string, std::less<>> values;
  bool any_value_option = false;
  /// Most positional arguments accepted (-1: any).
  int max_positional = -1;
  /// Value options that may be given more than once (every value is used, through all()).
  /// Any other option given twice is a UsageError: silently taking the last value hides a
  /// typo in a long command line.
  std::set<std::string, std::less<>> repeatable;
};

/// Parses argv of a subcommand (without the subcommand itself). "--help"/"-h" is always a flag.
Args parse_args(const std::vector<std::string>& argv, const ArgSpec& spec, std::string_view cmd);

/// Splits "a,b,c" into its non-empty items.
std::vector<std::string> split_list(std::string_view text, char separator = ',');

/// Parses a size with an optional K/M/G/T suffix (powers of 1024), e.g. "100M", "2G", "512".
std::uint64_t parse_size(std::string_view text);
/// "1.5 MiB"-style text of a byte count.
std::string format_size(std::uint64_t bytes);
/// Parses a whole decimal integer; UsageError naming `what` otherwise.
std::int64_t parse_int(std::string_view text, std::string_view what);

}  // namespace kjit::tool
