// SPDX-License-Identifier: Apache-2.0
#include "cli.hpp"

#include <fmt/format.h>

#include <cctype>
#include <charconv>

#include "kjit/types.hpp"

namespace kjit::tool {

std::string Args::get(std::string_view name, std::string_view fallback) const {
  const auto it = options.find(std::string(name));
  return it == options.end() ? std::string(fallback) : it->second.back();
}

std::vector<std::string> Args::all(std::string_view name) const {
  const auto it = options.find(std::string(name));
  return it == options.end() ? std::vector<std::string>{} : it->second;
}

std::int64_t Args::get_int(std::string_view name, std::int64_t fallback) const {
  if (!has(name)) return fallback;
  return parse_int(get(name), fmt::format("--{}", name));
}

std::int64_t parse_int(std::string_view text, std::string_view what) {
  try {
    return parse_int64(text, what);
  } catch (const InvalidArgument& error) {
    throw UsageError(error.what());  // a command line's mistake: the tool's error type
  }
}

namespace {

/// An argument that is an option rather than a value: "--x", "-o", "-h", but not "-5".
bool looks_like_option(std::string_view arg) {
  return arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]));
}

void add_value(Args& args, const ArgSpec& spec, std::string_view cmd, const std::string& name,
               std::string_view spelled, std::string value) {
  std::vector<std::string>& values = args.options[name];
  if (!values.empty() && !spec.repeatable.count(name)) {
    throw UsageError(fmt::format("{}: {} given twice ('{}', then '{}'); give it once", cmd, spelled,
                                 values.back(), value));
  }
  values.push_back(std::move(value));
}

}  // namespace

Args parse_args(const std::vector<std::string>& argv, const ArgSpec& spec, std::string_view cmd) {
  Args args;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      args.options["help"].emplace_back();
      continue;
    }
    if (arg.size() > 2 && arg.starts_with("--")) {
      std::string name = arg.substr(2);
      std::string value;
      bool inline_value = false;
      if (const auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
        inline_value = true;
      }
      if (spec.flags.count(name)) {
        if (inline_value) throw UsageError(fmt::format("{}: --{} takes no value", cmd, name));
        args.options[name].emplace_back();
        continue;
      }
      if (!spec.values.count(name) && !spec.any_value_option) {
        throw UsageError(
            fmt::format("{}: unknown option --{} (see kjit {} --help)", cmd, name, cmd));
      }
      if (!inline_value) {
        if (i + 1 >= argv.size() || looks_like_option(argv[i + 1])) {
          throw UsageError(fmt::format("{}: --{} needs a value", cmd, name));
        }
        value = argv[++i];
      }
      add_value(args, spec, cmd, name, "--" + name, std::move(value));
      continue;
    }
    if (arg == "-o" || arg == "-j") {
      if (i + 1 >= argv.size() || looks_like_option(argv[i + 1])) {
        throw UsageError(fmt::format("{}: {} needs a value", cmd, arg));
      }
      const std::string name = arg == "-o" ? "output" : "jobs";
      if (!spec.values.count(name))
        throw UsageError(fmt::format("{}: unknown option {}", cmd, arg));
      add_value(args, spec, cmd, name, arg, argv[++i]);
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-' && !std::isdigit(static_cast<unsigned char>(arg[1]))) {
      throw UsageError(fmt::format("{}: unknown option {} (see kjit {} --help)", cmd, arg, cmd));
    }
    args.positional.push_back(arg);
  }
  if (spec.max_positional >= 0 && !args.has("help") &&
      static_cast<int>(args.positional.size()) > spec.max_positional) {
    throw UsageError(fmt::format("{}: unexpected argument '{}'", cmd,
                                 args.positional[static_cast<std::size_t>(spec.max_positional)]));
  }
  return args;
}

std::vector<std::string> split_list(std::string_view text, char separator) {
  std::vector<std::string> items;
  while (!text.empty()) {
    const std::size_t at = text.find(separator);
    std::string_view item = text.substr(0, at);
    if (!item.empty()) items.emplace_back(item);
    if (at == std::string_view::npos) break;
    text.remove_prefix(at + 1);
  }
  return items;
}

std::uint64_t parse_size(std::string_view text) {
  std::string_view digits = text;
  std::uint64_t scale = 1;
  if (!digits.empty()) {
    std::size_t suffix_length = 0;
    if (digits.ends_with("iB") || digits.ends_with("ib")) suffix_length = 2;
    const char unit = static_cast<char>(
        std::toupper(static_cast<unsigned char>(digits[digits.size() - 1 - suffix_length])));
    const char* units = "KMGT";
    for (int i = 0; units[i] != '\0'; ++i) {
      if (unit == units[i]) {
        scale = std::uint64_t{1} << (10 * (i + 1));
        digits.remove_suffix(1 + suffix_length);
        break;
      }
    }
    if (scale == 1 && (digits.ends_with('B') || digits.ends_with('b'))) digits.remove_suffix(1);
  }
  std::uint64_t value = 0;
  const char* end = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (digits.empty() || ec != std::errc() || ptr != end || value > (~std::uint64_t{0}) / scale) {
    throw UsageError(
        fmt::format("'{}' is not a size; accepted: a byte count with an optional K, M, G or T "
                    "suffix (powers of 1024), e.g. 100M, 2G",
                    text));
  }
  return value * scale;
}

std::string format_size(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

}  // namespace kjit::tool
