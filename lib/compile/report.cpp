// SPDX-License-Identifier: Apache-2.0
// Text parsing around NVRTC: the ptxas resource report, PTX launch bounds, and log locations.
// Pure functions of their input, so they are tested on synthetic text as well as real logs.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "compile/compiler.hpp"

namespace kjit::compile {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    start = end + 1;
  }
  return lines;
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) {
    text.remove_prefix(1);
  }
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  return text;
}

// The integer written just before `suffix` in `line` ("169" in "Used 169 registers"), when the
// suffix occurs preceded by digits. ptxas's wording varies between versions (fields appear,
// vanish and move), so each field is looked up by its own unit rather than by position.
bool number_before(std::string_view line, std::string_view suffix, std::int64_t* out) {
  std::size_t from = 0;
  while (true) {
    const std::size_t at = line.find(suffix, from);
    if (at == std::string_view::npos) return false;
    std::size_t begin = at;
    while (begin > 0 && is_digit(line[begin - 1])) --begin;
    if (begin < at) {
      std::int64_t value = 0;
      for (std::size_t i = begin; i < at; ++i) value = value * 10 + (line[i] - '0');
      *out = value;
      return true;
    }
    from = at + 1;
  }
}

struct FrameInfo {
  std::int64_t stack = 0;
  std::int64_t spill_stores = 0;
  std::int64_t spill_loads = 0;
};

// A template's include name is its path in the source tree ("templates/probe/probe.cuh", see
// cmake/EmbedTemplates.cmake), so NVRTC's locations already name the file; only the line
// number's form changes.

// "NAME(LINE): rest" -> "NAME:LINE: rest"; other lines unchanged.
std::string map_leading_location(std::string_view line) {
  const std::size_t open = line.find('(');
  if (open == std::string_view::npos || open == 0) return std::string(line);
  const std::string_view name = line.substr(0, open);
  if (name.find_first_of(" \t") != std::string_view::npos) return std::string(line);
  std::size_t close = open + 1;
  while (close < line.size() && is_digit(line[close])) ++close;
  if (close == open + 1 || line.substr(close, 2) != "):") {
    return std::string(line);
  }
  return std::string(name) + ":" + std::string(line.substr(open + 1, close - open - 1)) +
         std::string(line.substr(close + 1));
}

// "... at line 12 of templates/x/x.cuh ..." -> "... at templates/x/x.cuh:12 ..." (instantiation
// context lines name their location this way).
std::string map_at_line(std::string line) {
  constexpr std::string_view kAt = "at line ";
  std::size_t from = 0;
  while (true) {
    const std::size_t at = line.find(kAt, from);
    if (at == std::string::npos) return line;
    std::size_t digits_end = at + kAt.size();
    while (digits_end < line.size() && is_digit(line[digits_end])) ++digits_end;
    constexpr std::string_view kOf = " of ";
    if (digits_end == at + kAt.size() || line.compare(digits_end, kOf.size(), kOf) != 0) {
      from = at + 1;
      continue;
    }
    const std::size_t name_begin = digits_end + kOf.size();
    std::size_t name_end = name_begin;
    while (name_end < line.size() && !std::isspace(static_cast<unsigned char>(line[name_end]))) {
      ++name_end;
    }
    if (name_end == name_begin) {
      from = at + 1;
      continue;
    }
    const std::string number = line.substr(at + kAt.size(), digits_end - at - kAt.size());
    const std::string replacement =
        "at " + line.substr(name_begin, name_end - name_begin) + ":" + number;
    line.replace(at, name_end - at, replacement);
    from = at + replacement.size();
  }
}

bool is_error_line(std::string_view line) {
  return line.find(": error") != std::string_view::npos ||
         line.find("catastrophic error") != std::string_view::npos ||
         line.find("Command-line error") != std::string_view::npos ||
         line.find("ptxas fatal") != std::string_view::npos || line.starts_with("error") ||
         line.find(": fatal") != std::string_view::npos;
}

}  // namespace

std::map<std::string, KernelResources> parse_ptxas_report(std::string_view log) {
  std::map<std::string, KernelResources> kernels;
  std::map<std::string, FrameInfo> frames;
  // The entry function ptxas is compiling; "Used N registers" lines belong to it. Frame lines
  // belong to the last "Function properties for" name, which may be a non-inlined callee.
  std::string entry;
  std::string properties_of;
  for (std::string_view line : split_lines(log)) {
    constexpr std::string_view kEntry = "Compiling entry function '";
    constexpr std::string_view kProperties = "Function properties for ";
    if (const std::size_t at = line.find(kEntry); at != std::string_view::npos) {
      const std::size_t begin = at + kEntry.size();
      const std::size_t end = line.find('\'', begin);
      if (end == std::string_view::npos) continue;
      entry = std::string(line.substr(begin, end - begin));
      kernels.try_emplace(entry);
      continue;
    }
    if (const std::size_t at = line.find(kProperties); at != std::string_view::npos) {
      properties_of = std::string(trim(line.substr(at + kProperties.size())));
      continue;
    }
    if (line.find("bytes stack frame") != std::string_view::npos) {
      if (properties_of.empty()) continue;
      FrameInfo& frame = frames[properties_of];
      number_before(line, " bytes stack frame", &frame.stack);
      number_before(line, " bytes spill stores", &frame.spill_stores);
      number_before(line, " bytes spill loads", &frame.spill_loads);
      continue;
    }
    std::int64_t registers = 0;
    if (line.find("Used ") != std::string_view::npos &&
        number_before(line, " registers", &registers)) {
      // Old reports name no entry function; the properties line is then the only name.
      const std::string& owner = entry.empty() ? properties_of : entry;
      if (owner.empty()) continue;
      KernelResources& resources = kernels[owner];
      resources.registers = static_cast<int>(registers);
      number_before(line, " bytes smem", &resources.static_smem);
      number_before(line, " bytes cmem[0]", &resources.const_bytes);
      std::int64_t lmem = 0;
      if (number_before(line, " bytes lmem", &lmem)) {
        resources.local_bytes = std::max(resources.local_bytes, lmem);
      }
    }
  }
  for (auto& [name, resources] : kernels) {
    const auto frame = frames.find(name);
    if (frame == frames.end()) continue;
    resources.local_bytes = std::max(resources.local_bytes, frame->second.stack);
    resources.spill_store_bytes = frame->second.spill_stores;
    resources.spill_load_bytes = frame->second.spill_loads;
  }
  return kernels;
}

std::optional<std::string> wgmma_serialization(std::string_view log, std::string_view kernel) {
  // "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are
  // serialized due to <reason> for the function '<mangled name>'"
  constexpr std::string_view kCode = "(C7512)";
  constexpr std::string_view kDueTo = " due to ";
  constexpr std::string_view kFor = " for the function '";
  for (std::string_view line : split_lines(log)) {
    if (line.find(kCode) == std::string_view::npos) continue;
    const std::size_t function = line.find(kFor);
    if (function == std::string_view::npos) continue;
    const std::size_t name_begin = function + kFor.size();
    const std::size_t name_end = line.find('\'', name_begin);
    if (name_end == std::string_view::npos ||
        line.substr(name_begin, name_end - name_begin) != kernel) {
      continue;
    }
    const std::size_t due = line.find(kDueTo);
    if (due == std::string_view::npos || due > function) return std::string("(no reason given)");
    return std::string(line.substr(due + kDueTo.size(), function - due - kDueTo.size()));
  }
  return std::nullopt;
}

std::optional<KernelResources> cubin_resources(std::string_view cubin, std::string_view kernel) {
  // Little-endian ELF64 read with bounds checks: a malformed cubin gives nullopt, never a read
  // past the end.
  const auto read = [&](std::uint64_t at, auto value) -> std::optional<decltype(value)> {
    if (at > cubin.size() || cubin.size() - at < sizeof value) return std::nullopt;
    std::memcpy(&value, cubin.data() + at, sizeof value);
    return value;
  };
  if (cubin.size() < 64 ||
      cubin.substr(0, 4) !=
          "\x7f"
          "ELF" ||
      cubin[4] != 2 || cubin[5] != 1) {
    return std::nullopt;
  }
  // e_shoff at 40, e_shentsize / e_shnum / e_shstrndx at 58 / 60 / 62.
  const auto shoff = read(40, std::uint64_t{});
  const auto shentsize = read(58, std::uint16_t{});
  const auto shnum = read(60, std::uint16_t{});
  const auto shstrndx = read(62, std::uint16_t{});
  if (!shoff || !shentsize || !shnum || !shstrndx || *shentsize < 64 || *shstrndx >= *shnum) {
    return std::nullopt;
  }
  struct Section {
    std::uint32_t name = 0, type = 0, link = 0;
    std::uint64_t offset = 0, size = 0;
  };
  std::vector<Section> sections(*shnum);
  for (std::size_t i = 0; i < sections.size(); ++i) {
    const std::uint64_t at = *shoff + i * *shentsize;
    const auto name = read(at, std::uint32_t{});
    const auto type = read(at + 4, std::uint32_t{});
    const auto offset = read(at + 24, std::uint64_t{});
    const auto size = read(at + 32, std::uint64_t{});
    const auto link = read(at + 40, std::uint32_t{});
    if (!name || !type || !offset || !size || !link) return std::nullopt;
    sections[i] = {*name, *type, *link, *offset, *size};
  }
  const auto contents = [&](const Section& section) -> std::optional<std::string_view> {
    constexpr std::uint32_t kNoBits = 8;  // SHT_NOBITS: occupies no bytes of the file
    if (section.type == kNoBits || section.offset > cubin.size() ||
        cubin.size() - section.offset < section.size) {
      return std::nullopt;
    }
    return cubin.substr(section.offset, section.size);
  };
  const auto c_string = [](std::string_view table, std::uint64_t at) -> std::string_view {
    if (at >= table.size()) return {};
    const std::string_view rest = table.substr(at);
    return rest.substr(0, rest.find('\0'));
  };
  const auto names = contents(sections[*shstrndx]);
  if (!names) return std::nullopt;
  // The kernel's index in .symtab (SHT_SYMTAB = 2; names in the string table it links to).
  std::optional<std::uint32_t> symbol;
  std::optional<std::string_view> info;
  for (const Section& section : sections) {
    const std::string_view name = c_string(*names, section.name);
    if (section.type == 2 && section.link < sections.size()) {
      const auto symbols = contents(section);
      const auto strings = contents(sections[section.link]);
      if (!symbols || !strings) return std::nullopt;
      for (std::uint64_t i = 0; i * 24 + 24 <= symbols->size(); ++i) {
        std::uint32_t symbol_name = 0;
        std::memcpy(&symbol_name, symbols->data() + i * 24, 4);
        if (c_string(*strings, symbol_name) == kernel) symbol = static_cast<std::uint32_t>(i);
      }
    } else if (name == ".nv.info") {
      info = contents(section);
    }
  }
  if (!symbol || !info) return std::nullopt;
  // .nv.info holds attribute records: format byte, attribute byte, then for format 4 a 16-bit
  // size and that many bytes (formats 2 and 3 carry a 16-bit value, format 1 none). Records of
  // attribute 0x2f (register count) and 0x11 (stack frame size) are (symbol index, value).
  std::optional<KernelResources> found;
  std::int64_t frame = 0;
  for (std::size_t at = 0; at + 2 <= info->size();) {
    const auto format = static_cast<unsigned char>((*info)[at]);
    const auto attribute = static_cast<unsigned char>((*info)[at + 1]);
    if (format == 1) {
      at += 2;
      continue;
    }
    if (at + 4 > info->size()) return std::nullopt;
    if (format != 4) {
      at += 4;
      continue;
    }
    std::uint16_t size = 0;
    std::memcpy(&size, info->data() + at + 2, 2);
    if (at + 4 + size > info->size()) return std::nullopt;
    if (size == 8 && (attribute == 0x2f || attribute == 0x11)) {
      std::uint32_t index = 0, value = 0;
      std::memcpy(&index, info->data() + at + 4, 4);
      std::memcpy(&value, info->data() + at + 8, 4);
      if (index == *symbol && attribute == 0x2f) {
        found = KernelResources{};
        found->registers = static_cast<int>(value);
      } else if (index == *symbol) {
        frame = value;
      }
    }
    at += 4 + size;
  }
  if (found) found->local_bytes = frame;
  return found;
}

int ptx_max_threads(std::string_view ptx, std::string_view entry) {
  if (entry.empty()) return 0;
  const std::string needle = ".entry " + std::string(entry);
  std::size_t at = 0;
  while (true) {
    at = ptx.find(needle, at);
    if (at == std::string_view::npos) return 0;
    const std::size_t after = at + needle.size();
    // Reject a longer name that merely starts with `entry`.
    if (after < ptx.size() &&
        (ptx[after] == '(' || std::isspace(static_cast<unsigned char>(ptx[after])))) {
      break;
    }
    at = after;
  }
  const std::size_t body = ptx.find('{', at);
  const std::string_view header =
      ptx.substr(at, body == std::string_view::npos ? ptx.npos : body - at);
  constexpr std::string_view kMaxntid = ".maxntid";
  const std::size_t directive = header.find(kMaxntid);
  if (directive == std::string_view::npos) return 0;
  std::int64_t product = 1;
  int dims = 0;
  std::size_t i = directive + kMaxntid.size();
  while (i < header.size() && dims < 3) {
    while (i < header.size() && (header[i] == ' ' || header[i] == '\t' || header[i] == ',')) ++i;
    if (i >= header.size() || !is_digit(header[i])) break;
    std::int64_t value = 0;
    while (i < header.size() && is_digit(header[i])) value = value * 10 + (header[i++] - '0');
    product *= value;
    ++dims;
  }
  return dims == 0 ? 0 : static_cast<int>(product);
}

std::string map_log_locations(std::string_view log) {
  std::string out;
  out.reserve(log.size() + 64);
  std::size_t start = 0;
  while (start < log.size()) {
    std::size_t end = log.find('\n', start);
    const bool has_newline = end != std::string_view::npos;
    if (!has_newline) end = log.size();
    out += map_at_line(map_leading_location(log.substr(start, end - start)));
    if (has_newline) out += '\n';
    start = end + 1;
  }
  return out;
}

std::vector<std::string> error_lines(std::string_view log, std::size_t max_lines) {
  std::vector<std::string> found;
  const std::vector<std::string_view> lines = split_lines(log);
  for (std::string_view line : lines) {
    if (found.size() >= max_lines) break;
    if (is_error_line(line)) found.emplace_back(trim(line));
  }
  if (!found.empty()) return found;
  for (std::string_view line : lines) {
    if (found.size() >= max_lines) break;
    if (!trim(line).empty()) found.emplace_back(trim(line));
  }
  return found;
}

}  // namespace kjit::compile
