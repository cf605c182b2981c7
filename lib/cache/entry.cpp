// SPDX-License-Identifier: Apache-2.0
#include "cache/entry.hpp"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <exception>
#include <limits>

#include "cache/bytes.hpp"
#include "kjit/error.hpp"

namespace kjit::cache {
namespace {

constexpr std::size_t kResourceCount = 7;

/// Reads length-prefixed fields from a payload, refusing any length that runs past the end.
class FieldReader {
 public:
  explicit FieldReader(std::string_view payload) : rest_(payload) {}

  bool next(std::string_view* field) {
    if (rest_.size() < 8) return false;
    const std::uint64_t length = get_le(rest_, 0, 8);
    rest_.remove_prefix(8);
    if (length > rest_.size()) return false;
    *field = rest_.substr(0, static_cast<std::size_t>(length));
    rest_.remove_prefix(static_cast<std::size_t>(length));
    return true;
  }
  bool at_end() const noexcept { return rest_.empty(); }

 private:
  std::string_view rest_;
};

std::optional<CompiledKernel> fail(std::string* why, std::string message) {
  if (why != nullptr) *why = std::move(message);
  return std::nullopt;
}

}  // namespace

std::string encode_entry(const support::Hash128& key, const CompiledKernel& kernel) {
  const std::string key_hex = key.hex();
  if (!kernel.key.empty() && kernel.key != key_hex) {
    throw InvalidArgument(
        fmt::format("encode_entry: kernel.key is '{}' but the entry is stored under key {}; set "
                    "CompiledKernel::key to the key it is stored under (or leave it empty)",
                    kernel.key, key_hex));
  }
  const KernelResources& r = kernel.resources;
  std::string resources;
  for (const std::int64_t value :
       {std::int64_t{r.registers}, r.static_smem, r.local_bytes, r.spill_store_bytes,
        r.spill_load_bytes, r.const_bytes, std::int64_t{r.max_threads}}) {
    put_le(resources, static_cast<std::uint64_t>(value), 8);
  }

  std::string payload;
  const std::string spec_text = kernel.spec.str();
  payload.reserve(spec_text.size() + kernel.cubin.size() + kernel.ptx.size() +
                  kernel.lowered_name.size() + kernel.source.size() + kernel.options.size() +
                  kernel.log.size() + key_hex.size() + kernel.key_material.size() +
                  resources.size() + 10 * 8);
  // The order here is the format; decode_entry reads the same order.
  put_field(payload, spec_text);
  put_field(payload, kernel.cubin);
  put_field(payload, kernel.ptx);
  put_field(payload, kernel.lowered_name);
  put_field(payload, kernel.source);
  put_field(payload, kernel.options);
  put_field(payload, kernel.log);
  put_field(payload, key_hex);
  put_field(payload, kernel.key_material);
  put_field(payload, resources);

  std::string out;
  out.reserve(kEntryHeaderSize + payload.size());
  out.append(kEntryMagic, sizeof(kEntryMagic));
  put_le(out, kEntryFormatVersion, 4);
  put_be64(out, key.high);
  put_be64(out, key.low);
  put_le(out, payload.size(), 8);
  put_le(out, support::xxh3_64(payload), 8);
  out += payload;
  return out;
}

std::optional<support::Hash128> peek_entry_key(std::string_view bytes) {
  if (bytes.size() < kEntryHeaderSize) return std::nullopt;
  if (std::memcmp(bytes.data(), kEntryMagic, sizeof(kEntryMagic)) != 0) return std::nullopt;
  if (get_le(bytes, kEntryVersionOffset, 4) != kEntryFormatVersion) return std::nullopt;
  return support::Hash128{get_be64(bytes, kEntryKeyOffset), get_be64(bytes, kEntryKeyOffset + 8)};
}

std::optional<CompiledKernel> decode_entry(std::string_view bytes,
                                           const support::Hash128& expected_key, std::string* why) {
  if (bytes.size() < kEntryHeaderSize) {
    return fail(why, fmt::format("truncated: {} bytes, shorter than the {}-byte header",
                                 bytes.size(), kEntryHeaderSize));
  }
  if (std::memcmp(bytes.data(), kEntryMagic, sizeof(kEntryMagic)) != 0) {
    return fail(why, "not a kjit cache entry (bad magic)");
  }
  const std::uint64_t version = get_le(bytes, kEntryVersionOffset, 4);
  if (version != kEntryFormatVersion) {
    return fail(why, fmt::format("entry format version {}, this kjit reads version {}", version,
                                 kEntryFormatVersion));
  }
  const support::Hash128 stored_key{get_be64(bytes, kEntryKeyOffset),
                                    get_be64(bytes, kEntryKeyOffset + 8)};
  if (stored_key != expected_key) {
    return fail(why, fmt::format("entry is for key {}, expected key {}", stored_key.hex(),
                                 expected_key.hex()));
  }
  const std::uint64_t length = get_le(bytes, kEntryLengthOffset, 8);
  const std::uint64_t actual = bytes.size() - kEntryHeaderSize;
  if (length != actual) {
    return fail(why, fmt::format("payload length {} in the header, {} bytes present{}", length,
                                 actual, actual < length ? " (truncated)" : ""));
  }
  const std::string_view payload = bytes.substr(kEntryHeaderSize);
  const std::uint64_t checksum = get_le(bytes, kEntryChecksumOffset, 8);
  if (support::xxh3_64(payload) != checksum) {
    return fail(why, "payload checksum mismatch (corrupt entry)");
  }

  // The checksum matched, so what follows only fails for an entry written by a buggy or
  // hostile writer; it is still checked, because the bytes come from a file anyone with
  // write access to the cache could have crafted.
  FieldReader reader(payload);
  std::string_view spec_text, cubin, ptx, lowered_name, source, options, log, key_hex, key_material,
      resources;
  for (std::string_view* field : {&spec_text, &cubin, &ptx, &lowered_name, &source, &options, &log,
                                  &key_hex, &key_material, &resources}) {
    if (!reader.next(field)) return fail(why, "payload field runs past the end of the payload");
  }
  if (!reader.at_end()) return fail(why, "trailing bytes after the last payload field");
  if (key_hex != expected_key.hex()) {
    return fail(why, fmt::format("payload names key '{}', expected {}",
                                 std::string(key_hex.substr(0, 64)), expected_key.hex()));
  }
  if (resources.size() != kResourceCount * 8) {
    return fail(why, fmt::format("resources field has {} bytes, expected {}", resources.size(),
                                 kResourceCount * 8));
  }
  std::int64_t values[kResourceCount];
  for (std::size_t i = 0; i < kResourceCount; ++i) {
    values[i] = static_cast<std::int64_t>(get_le(resources, 8 * i, 8));
  }
  const auto fits_int = [](std::int64_t v) { return v >= INT_MIN && v <= INT_MAX; };
  if (!fits_int(values[0]) || !fits_int(values[6])) {
    return fail(why, "resources: registers or max_threads out of range");
  }

  CompiledKernel kernel;
  try {
    kernel.spec = KernelSpec::parse(spec_text);
  } catch (const std::exception& error) {
    return fail(why, fmt::format("spec text '{}' does not parse: {}",
                                 std::string(spec_text.substr(0, 200)), error.what()));
  }
  kernel.cubin.assign(cubin);
  kernel.ptx.assign(ptx);
  kernel.lowered_name.assign(lowered_name);
  kernel.source.assign(source);
  kernel.options.assign(options);
  kernel.log.assign(log);
  kernel.key.assign(key_hex);
  kernel.key_material.assign(key_material);
  kernel.resources.registers = static_cast<int>(values[0]);
  kernel.resources.static_smem = values[1];
  kernel.resources.local_bytes = values[2];
  kernel.resources.spill_store_bytes = values[3];
  kernel.resources.spill_load_bytes = values[4];
  kernel.resources.const_bytes = values[5];
  kernel.resources.max_threads = static_cast<int>(values[6]);
  return kernel;
}

std::string reproducible_log(std::string_view log) {
  std::string out;
  out.reserve(log.size());
  while (!log.empty()) {
    const std::size_t end = log.find('\n');
    const std::size_t length = end == std::string_view::npos ? log.size() : end + 1;
    const std::string_view line = log.substr(0, length);
    // ptxas -v reports its own wall time per function; everything else it prints is a
    // function of the input.
    const bool timing =
        line.starts_with("ptxas") && line.find(": Compile time = ") != std::string_view::npos;
    if (!timing) out.append(line);
    log.remove_prefix(length);
  }
  return out;
}

}  // namespace kjit::cache
