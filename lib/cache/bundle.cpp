// SPDX-License-Identifier: Apache-2.0
#include "cache/bundle.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <set>
#include <system_error>

#include "cache/bytes.hpp"
#include "cache/entry.hpp"
#include "cache/unique_fd.hpp"
#include "codegen/embedded_templates.hpp"
#include "kjit/error.hpp"
#include "kjit/version.hpp"
#include "support/hash.hpp"

namespace kjit::cache {
namespace {

constexpr std::size_t kPreambleSize = 8 + 4 + 8 + 8;
constexpr std::size_t kResourceFields = 7;

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out.append(separator);
    out.append(items[i]);
  }
  return out;
}

std::vector<std::string> split_archs(std::string_view text) {
  std::vector<std::string> archs;
  while (!text.empty()) {
    const std::size_t comma = text.find(',');
    archs.emplace_back(text.substr(0, comma));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return archs;
}

/// Sequential reader over a byte range: every read is bounds-checked, so a corrupt length
/// makes a read fail instead of running past the end.
class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool u64(std::uint64_t* value) {
    if (rest_.size() < 8) return false;
    *value = get_le(rest_, 0, 8);
    rest_.remove_prefix(8);
    return true;
  }
  bool bytes(std::uint64_t count, std::string_view* out) {
    if (count > rest_.size()) return false;
    *out = rest_.substr(0, static_cast<std::size_t>(count));
    rest_.remove_prefix(static_cast<std::size_t>(count));
    return true;
  }
  bool field(std::string_view* out) {
    std::uint64_t length = 0;
    return u64(&length) && bytes(length, out);
  }
  bool done() const noexcept { return rest_.empty(); }

 private:
  std::string_view rest_;
};

std::string encode_resources(const KernelResources& r) {
  std::string out;
  put_le(out, static_cast<std::uint64_t>(static_cast<std::int64_t>(r.registers)), 8);
  put_le(out, static_cast<std::uint64_t>(r.static_smem), 8);
  put_le(out, static_cast<std::uint64_t>(r.local_bytes), 8);
  put_le(out, static_cast<std::uint64_t>(r.spill_store_bytes), 8);
  put_le(out, static_cast<std::uint64_t>(r.spill_load_bytes), 8);
  put_le(out, static_cast<std::uint64_t>(r.const_bytes), 8);
  put_le(out, static_cast<std::uint64_t>(static_cast<std::int64_t>(r.max_threads)), 8);
  return out;
}

[[noreturn]] void corrupt(const std::string& name, const std::string& what) {
  throw CacheError(fmt::format(
      "bundle {} is corrupt or truncated: {}; rebuild it with `kjit precompile`", name, what));
}

std::string errno_text(int error) { return std::system_category().message(error); }

}  // namespace

BundleInfo BundleInfo::current(std::string compiler_id, std::vector<std::string> archs,
                               std::string manifest) {
  BundleInfo info;
  info.library_version = kVersion;
  info.template_digest = codegen::template_set_digest();
  info.compiler_id = std::move(compiler_id);
  info.archs = std::move(archs);
  info.manifest = std::move(manifest);
  return info;
}

std::string encode_bundle(const BundleInfo& info, const std::vector<CompiledKernel>& kernels) {
  std::string entries;
  std::set<std::string> seen;
  std::uint64_t count = 0;
  for (const CompiledKernel& kernel : kernels) {
    const std::string spec = kernel.spec.str();
    if (!seen.insert(spec).second) continue;
    support::Hash128 key;
    if (!support::Hash128::parse_hex(kernel.key, &key)) {
      throw InvalidArgument(fmt::format(
          "cannot bundle {}: its key '{}' is not 32 hex digits (kernels must come from the "
          "runtime, which sets the key)",
          spec, kernel.key));
    }
    // A kernel from a disk cache written before logs were made reproducible may still carry
    // ptxas's timings; the bundle must not.
    CompiledKernel normalized;
    const CompiledKernel* stored = &kernel;
    if (std::string log = reproducible_log(kernel.log); log != kernel.log) {
      normalized = kernel;
      normalized.log = std::move(log);
      stored = &normalized;
    }
    const std::string encoded = encode_entry(key, *stored);
    std::string record;
    put_field(record, spec);
    put_field(record, key.hex());
    record += encode_resources(kernel.resources);
    put_le(record, support::xxh3_64(encoded), 8);
    put_field(record, encoded);
    put_field(entries, record);
    ++count;
  }

  std::string header;
  put_field(header, info.library_version);
  put_field(header, info.template_digest);
  put_field(header, info.compiler_id);
  put_field(header, join(info.archs, ","));
  put_field(header, info.manifest);
  put_le(header, count, 8);

  std::string out(kBundleMagic, sizeof kBundleMagic);
  put_le(out, kBundleFormatVersion, 4);
  put_le(out, header.size(), 8);
  put_le(out, support::xxh3_64(header), 8);
  out += header;
  out += entries;
  return out;
}

void write_bundle(const std::string& path, const BundleInfo& info,
                  const std::vector<CompiledKernel>& kernels) {
  const std::string bytes = encode_bundle(info, kernels);
  // The temp file lives next to the target so that rename() is atomic (same filesystem).
  static std::atomic<unsigned> counter{0};
  const std::string temp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter.fetch_add(1));
  auto fail = [&](const char* step, int error) {
    ::unlink(temp.c_str());
    throw CacheError(
        fmt::format("cannot write bundle {}: {} failed: {}", path, step, errno_text(error)));
  };
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd) {
    throw CacheError(
        fmt::format("cannot write bundle {}: cannot create {}: {}", path, temp, errno_text(errno)));
  }
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd.get(), bytes.data() + written, bytes.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd.get()) != 0) fail("fsync", errno);
  if (const int error = fd.close(); error != 0) fail("close", error);
  if (::rename(temp.c_str(), path.c_str()) != 0) fail("rename", errno);
}

Bundle Bundle::open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    throw CacheError(fmt::format("cannot open bundle {}: {}", path, errno_text(errno)));
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) {
    throw CacheError(fmt::format("cannot stat bundle {}: {}", path, errno_text(errno)));
  }
  if (!S_ISREG(info.st_mode)) throw CacheError(fmt::format("bundle {} is not a file", path));
  if (static_cast<std::uint64_t>(info.st_size) > kMaxBundleBytes) {
    throw CacheError(fmt::format("bundle {} is {} bytes, more than the {} a bundle may have", path,
                                 info.st_size, kMaxBundleBytes));
  }
  std::string bytes(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CacheError(fmt::format("cannot read bundle {}: {}", path, errno_text(errno)));
    }
    if (n == 0) break;  // shrank while reading: from_bytes reports the truncation
    done += static_cast<std::size_t>(n);
  }
  bytes.resize(done);
  return from_bytes(bytes, path);
}

Bundle Bundle::from_bytes(std::string_view bytes, std::string name) {
  if (bytes.size() < kPreambleSize || std::memcmp(bytes.data(), kBundleMagic, 8) != 0) {
    throw CacheError(fmt::format("{} is not a kjit bundle (no KJITBNDL magic)", name));
  }
  std::uint32_t version = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    version |= std::uint32_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
  }
  if (version != kBundleFormatVersion) {
    throw CacheError(fmt::format(
        "bundle {} has format version {}, this kjit {} reads format version {}; rebuild it "
        "with `kjit precompile`",
        name, version, kVersion, kBundleFormatVersion));
  }
  const std::uint64_t header_size = get_le(bytes, 12, 8);
  const std::uint64_t header_sum = get_le(bytes, 20, 8);
  if (header_size > bytes.size() - kPreambleSize) {
    corrupt(name, fmt::format("header length {} runs past the end of the {} byte file", header_size,
                              bytes.size()));
  }
  const std::string_view header = bytes.substr(kPreambleSize, header_size);
  if (support::xxh3_64(header) != header_sum) corrupt(name, "header checksum mismatch");

  Bundle bundle;
  bundle.path_ = std::move(name);
  Reader reader(header);
  std::string_view fields[5];
  std::uint64_t count = 0;
  for (std::string_view& field : fields) {
    if (!reader.field(&field)) corrupt(bundle.path_, "header fields truncated");
  }
  if (!reader.u64(&count) || !reader.done()) corrupt(bundle.path_, "header has a bad length");
  bundle.info_.library_version = std::string(fields[0]);
  bundle.info_.template_digest = std::string(fields[1]);
  bundle.info_.compiler_id = std::string(fields[2]);
  bundle.info_.archs = split_archs(fields[3]);
  bundle.info_.manifest = std::string(fields[4]);

  // Refuse before decoding entries: their cubins were built from other templates (or another
  // library's argument layouts), and would launch with the wrong parameter block.
  if (bundle.info_.library_version != kVersion ||
      bundle.info_.template_digest != codegen::template_set_digest()) {
    throw CacheError(fmt::format(
        "bundle {} was built by kjit {} (templates {}), but this is kjit {} (templates {}); "
        "rebuild it with this version's `kjit precompile`",
        bundle.path_, bundle.info_.library_version, bundle.info_.template_digest, kVersion,
        codegen::template_set_digest()));
  }

  Reader body(bytes.substr(kPreambleSize + static_cast<std::size_t>(header_size)));
  // Each record is at least its fixed fields, so a corrupt count cannot reserve without bound.
  bundle.entries_.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(count, 1u << 16)));
  for (std::uint64_t i = 0; i < count; ++i) {
    std::string_view record;
    if (!body.field(&record)) {
      corrupt(bundle.path_, fmt::format("entry {} of {} is truncated", i + 1, count));
    }
    Reader r(record);
    std::string_view spec_text, key_text, resources, encoded;
    std::uint64_t checksum = 0;
    if (!r.field(&spec_text) || !r.field(&key_text) || !r.bytes(8 * kResourceFields, &resources) ||
        !r.u64(&checksum) || !r.field(&encoded) || !r.done()) {
      corrupt(bundle.path_, fmt::format("entry {} of {} has bad field lengths", i + 1, count));
    }
    const std::string label = fmt::format("entry {} ({})", i + 1, spec_text);
    if (support::xxh3_64(encoded) != checksum) {
      corrupt(bundle.path_, fmt::format("{}: checksum mismatch", label));
    }
    support::Hash128 key;
    if (!support::Hash128::parse_hex(key_text, &key)) {
      corrupt(bundle.path_, fmt::format("{}: key is not 32 hex digits", label));
    }
    std::string why;
    std::optional<CompiledKernel> kernel = decode_entry(encoded, key, &why);
    if (!kernel) corrupt(bundle.path_, fmt::format("{}: {}", label, why));
    // The record's index fields must agree with the verified entry: that covers their bytes.
    if (kernel->spec.str() != spec_text) {
      corrupt(bundle.path_, fmt::format("{}: the entry holds {}", label, kernel->spec.str()));
    }
    if (encode_resources(kernel->resources) != resources) {
      corrupt(bundle.path_, fmt::format("{}: resources disagree with the entry", label));
    }
    BundleEntry entry;
    entry.spec = kernel->spec;
    entry.key = key.hex();
    entry.resources = kernel->resources;
    entry.checksum = checksum;
    entry.encoded_bytes = encoded.size();
    entry.kernel = std::make_shared<const CompiledKernel>(std::move(*kernel));
    if (!bundle.by_spec_.emplace(std::string(spec_text), bundle.entries_.size()).second) {
      corrupt(bundle.path_, fmt::format("{}: the spec appears twice", label));
    }
    bundle.entries_.push_back(std::move(entry));
  }
  if (!body.done()) corrupt(bundle.path_, "trailing bytes after the last entry");
  return bundle;
}

std::shared_ptr<const CompiledKernel> Bundle::find(const KernelSpec& spec) const {
  const auto it = by_spec_.find(spec.str());
  return it == by_spec_.end() ? nullptr : entries_[it->second].kernel;
}

std::vector<std::string> spec_differences(const KernelSpec& a, const KernelSpec& b) {
  if (a.family != b.family) return {"family"};
  std::vector<std::string> differ;
  // Plain pairs, not structured bindings: clang before 16 cannot capture a binding in a
  // lambda, and the libFuzzer build uses clang.
  for (const auto& param_a : a.params) {
    const auto it = std::find_if(b.params.begin(), b.params.end(),
                                 [&](const auto& param) { return param.first == param_a.first; });
    if (it == b.params.end() || it->second != param_a.second) differ.push_back(param_a.first);
  }
  for (const auto& param_b : b.params) {
    const bool in_a = std::any_of(a.params.begin(), a.params.end(),
                                  [&](const auto& param) { return param.first == param_b.first; });
    if (!in_a) differ.push_back(param_b.first);
  }
  if (a.arch != b.arch) differ.emplace_back("arch");
  return differ;
}

namespace {

// Candidates of one family ranked by how many parameters differ, then by text.
void rank_nearest(const KernelSpec& spec, const std::vector<BundleEntry>& entries,
                  std::vector<std::pair<std::size_t, std::string>>* ranked) {
  for (const BundleEntry& entry : entries) {
    if (entry.spec.family != spec.family) continue;
    ranked->emplace_back(spec_differences(spec, entry.spec).size(), entry.spec.str());
  }
}

std::vector<std::string> take_nearest(std::vector<std::pair<std::size_t, std::string>> ranked,
                                      int n) {
  std::sort(ranked.begin(), ranked.end());
  ranked.erase(std::unique(ranked.begin(), ranked.end()), ranked.end());
  std::vector<std::string> out;
  for (auto& [distance, text] : ranked) {
    if (static_cast<int>(out.size()) >= n) break;
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace

std::vector<std::string> Bundle::nearest(const KernelSpec& spec, int n) const {
  std::vector<std::pair<std::size_t, std::string>> ranked;
  rank_nearest(spec, entries_, &ranked);
  return take_nearest(std::move(ranked), n);
}

BundleSet::BundleSet(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) {
    if (!path.empty()) bundles_.push_back(Bundle::open(path));
  }
}

void BundleSet::add(Bundle bundle) { bundles_.push_back(std::move(bundle)); }

std::vector<std::string> BundleSet::paths() const {
  std::vector<std::string> out;
  for (const Bundle& bundle : bundles_) out.push_back(bundle.path());
  return out;
}

std::shared_ptr<const CompiledKernel> BundleSet::find(const KernelSpec& spec,
                                                      std::string* path) const {
  for (const Bundle& bundle : bundles_) {
    if (auto kernel = bundle.find(spec)) {
      if (path != nullptr) *path = bundle.path();
      return kernel;
    }
  }
  return nullptr;
}

std::vector<std::string> BundleSet::nearest(const KernelSpec& spec, int n) const {
  std::vector<std::pair<std::size_t, std::string>> ranked;
  for (const Bundle& bundle : bundles_) rank_nearest(spec, bundle.entries(), &ranked);
  return take_nearest(std::move(ranked), n);
}

std::string BundleSet::miss_message(const KernelSpec& spec, std::string_view elsewhere) const {
  std::string message =
      elsewhere.empty()
          ? fmt::format("{} is in no bundle and JIT is disabled (KJIT_DISABLE_JIT=1)", spec.str())
          : fmt::format("{} is in no bundle, {}, and JIT is disabled (KJIT_DISABLE_JIT=1)",
                        spec.str(), elsewhere);
  if (bundles_.empty()) return message + "; no bundle is configured (KJIT_BUNDLE_PATH is empty)";
  message += fmt::format("; bundles searched: {}", join(paths(), ":"));
  const std::vector<std::string> near = nearest(spec, 3);
  if (near.empty()) {
    return message + fmt::format("; they hold no {} kernel", spec.family);
  }
  message += "; nearest:";
  for (const std::string& text : near) {
    const std::vector<std::string> differ = spec_differences(spec, KernelSpec::parse(text));
    message += fmt::format(" {} (differs in {});", text, join(differ, ", "));
  }
  message.pop_back();
  return message + ". Add the shape to the deployment manifest and rerun `kjit precompile`";
}

}  // namespace kjit::cache
