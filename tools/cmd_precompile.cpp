// SPDX-License-Identifier: Apache-2.0
// kjit precompile / kjit bundle: build a deployment bundle from a manifest, show it, prove it.
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cache/bundle.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "compile/compiler.hpp"
#include "kjit/error.hpp"
#include "kjit/settings.hpp"
#include "manifest.hpp"
#include "pool.hpp"
#include "verify.hpp"

namespace kjit::tool {
namespace {

constexpr const char* kPrecompileUsage =
    R"(usage: kjit precompile <manifest> --arch sm_90[,sm_100a] -o out.kjb [-j N]
                       [--verify h100,h200,b200] [--verify-device key=value,...]

Enumerates the specializations a deployment needs (every manifest line planned over its shape
ranges for each arch), compiles them in N worker processes (default: the CPU count), and writes
one bundle. Manifest lines look like
  merge_state dtype=bf16 head_dim=64,128,256,512 heads=1..256
  gdn_decode heads=16 v_heads=32 k=128 v=128 dtype=bf16 state_dtype=f32
(values: comma lists and inclusive ranges a..b; sizes a line omits take representative values;
see cache/BUNDLES.md). --verify proves offline, from the built-in limits of the named devices
and the registers / static shared memory recorded in the bundle, that every declared shape
launches legally; --verify-device adds a fabricated device (see `kjit bundle --help`).
Exit codes: 1 when a spec failed to compile, 2 for bad arguments or a failed verification.
)";

constexpr const char* kBundleUsage = R"(usage: kjit bundle info <file.kjb>
       kjit bundle verify <file.kjb> (--verify h100,... | --verify-device key=value,...)

info: the bundle's header (library version, template digest, compiler, archs, manifest) and its
entries (spec, key, registers, static smem, spills, size).
verify: re-plans every shape of the bundle's own manifest on each device and checks every launch
against the device limits and the kernel's recorded resources (exit 2 on failure).
A fabricated device starts from base=NAME (default sm_90) and overrides limits: name, arch, sms,
threads, block_x/y/z, grid_x/y/z, smem, smem_optin, smem_per_sm, regs, regs_per_sm, max_regs,
threads_per_sm, blocks_per_sm, dram_gbps (DRAM bandwidth, GB/s). Example: --verify-device
name=tiny,threads=256,grid_y=7
)";

std::vector<DeviceLimits> verify_devices(const Args& args) {
  std::vector<DeviceLimits> devices;
  for (const std::string& list : args.all("verify")) {
    for (const std::string& name : split_list(list))
      devices.push_back(DeviceLimits::for_name(name));
  }
  for (const std::string& text : args.all("verify-device")) devices.push_back(parse_device(text));
  return devices;
}

int report_verification(const cache::Bundle& bundle, const Manifest& manifest,
                        const std::vector<DeviceLimits>& devices) {
  const VerifyReport report = verify_bundle(bundle, manifest, devices);
  for (const std::string& note : report.notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  std::string names;
  for (const DeviceLimits& device : devices) names += (names.empty() ? "" : ", ") + device.name;
  if (report.ok()) {
    std::printf("verified: %zu problems, %zu launches legal on %s\n", report.problems,
                report.launches, names.c_str());
    return kExitOk;
  }
  constexpr std::size_t kShown = 20;
  for (std::size_t i = 0; i < std::min(kShown, report.failures.size()); ++i) {
    std::fprintf(stderr, "verify: %s\n", report.failures[i].c_str());
  }
  if (report.failures.size() > kShown) {
    std::fprintf(stderr, "verify: ... and %zu more\n", report.failures.size() - kShown);
  }
  std::fprintf(stderr, "kjit: verification failed: %zu problem(s) on %s\n", report.failures.size(),
               names.c_str());
  return kExitUsage;
}

/// Refuses, before any compile, an output the bundle could not (or must not) be written to.
void check_output_path(const std::string& output, const std::string& manifest) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (output.empty()) throw UsageError("precompile: -o names no file");
  if (fs::is_directory(output, error)) {
    throw UsageError(fmt::format(
        "precompile: -o {} is a directory; give the bundle's file name, e.g. -o {}/model.kjb",
        output, output));
  }
  if (fs::exists(output, error) && fs::equivalent(output, manifest, error)) {
    throw UsageError(fmt::format(
        "precompile: -o {} is the manifest itself; writing the bundle would overwrite it. Give "
        "another file, e.g. -o model.kjb",
        output));
  }
  const fs::path parent =
      fs::path(output).has_parent_path() ? fs::path(output).parent_path() : fs::path(".");
  if (!fs::is_directory(parent, error)) {
    throw UsageError(fmt::format("precompile: -o {}: directory {} does not exist; create it first",
                                 output, parent.string()));
  }
  if (::access(parent.c_str(), W_OK | X_OK) != 0) {
    throw UsageError(fmt::format("precompile: -o {}: directory {} is not writable: {}", output,
                                 parent.string(), std::strerror(errno)));
  }
}

}  // namespace

int cmd_precompile(const Argv& argv) {
  const Args args = parse_args(argv,
                               {.values = {"arch", "output", "jobs", "verify", "verify-device"},
                                .max_positional = 1,
                                .repeatable = {"verify", "verify-device"}},
                               "precompile");
  if (args.has("help")) {
    std::fputs(kPrecompileUsage, stdout);
    return kExitOk;
  }
  if (args.positional.empty()) throw UsageError("precompile: give a manifest file");
  if (!args.has("arch")) throw UsageError("precompile: give --arch, e.g. --arch sm_90,sm_100a");
  if (!args.has("output")) throw UsageError("precompile: give -o <bundle.kjb>");
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  const std::int64_t jobs = args.get_int("jobs", cpus > 0 ? cpus : 1);
  if (jobs < 1 || jobs > 1024) {
    throw UsageError(fmt::format("precompile: -j must be in 1..1024, got {}", jobs));
  }
  const std::string output = args.get("output");
  check_output_path(output, args.positional[0]);
  const Manifest manifest = read_manifest(args.positional[0]);
  if (manifest.lines.empty()) {
    throw UsageError(fmt::format(
        "precompile: manifest {} has no op lines (only blank lines and comments); a bundle of "
        "0 kernels would serve nothing. Add lines like 'merge_state dtype=bf16 head_dim=128 "
        "heads=1..64' (see kjit precompile --help)",
        manifest.name));
  }
  std::vector<std::string> archs;
  std::vector<DeviceLimits> targets;
  for (const std::string& text : split_list(args.get("arch"))) {
    const Arch arch = Arch::parse(text);
    archs.push_back(arch.str());
    // Every product of the arch: plans can differ between them (gdn_prefill on an H100 and an
    // H200), and a bundle must hold the kernels of each.
    for (DeviceLimits& product : DeviceLimits::products_of(arch))
      targets.push_back(std::move(product));
  }
  if (archs.empty()) throw UsageError("precompile: --arch names no arch");
  const std::vector<DeviceLimits> devices = verify_devices(args);  // bad names fail before work

  const Enumeration enumeration = enumerate_specs(manifest, targets);
  for (const std::string& note : enumeration.notes) std::printf("note: %s\n", note.c_str());
  if (enumeration.specs.empty()) {
    throw UsageError(fmt::format(
        "precompile: manifest {} yields no kernel in this build (every line was skipped); no "
        "bundle written",
        manifest.name));
  }
  std::printf("%s: %zu lines, %zu problems planned, %zu distinct specs for %s\n",
              manifest.name.c_str(), manifest.lines.size(), enumeration.problems,
              enumeration.specs.size(), fmt::format("{}", fmt::join(archs, ",")).c_str());
  std::fflush(stdout);

  const PoolResult result =
      compile_in_pool(enumeration.specs, static_cast<int>(jobs), ::isatty(STDERR_FILENO) == 1);
  const double rate =
      result.seconds > 0 ? static_cast<double>(enumeration.specs.size()) / result.seconds : 0.0;
  std::printf("compiled %zu specs in %.2f s with %lld worker(s): %.2f specs/s, %zu failed\n",
              enumeration.specs.size(), result.seconds, static_cast<long long>(jobs), rate,
              result.failures.size());
  const auto most_registers = std::max_element(
      result.kernels.begin(), result.kernels.end(),
      [](const auto& a, const auto& b) { return a.resources.registers < b.resources.registers; });
  if (most_registers != result.kernels.end()) {
    std::printf("largest register use: %d registers (%s)\n", most_registers->resources.registers,
                most_registers->spec.str().c_str());
  }
  const auto spills =
      std::count_if(result.kernels.begin(), result.kernels.end(), [](const auto& k) {
        return k.resources.spill_store_bytes > 0 || k.resources.spill_load_bytes > 0;
      });
  if (spills > 0)
    std::printf("kernels with register spills: %lld\n", static_cast<long long>(spills));
  if (!result.failures.empty()) {
    for (const std::string& failure : result.failures) {
      std::fprintf(stderr, "failed: %s\n", failure.c_str());
    }
    std::fprintf(stderr, "kjit: %zu spec(s) failed to compile; no bundle written\n",
                 result.failures.size());
    return kExitFailed;
  }

  const Settings settings = Settings::from_env();
  std::string compiler_id = "none";
  if (!result.kernels.empty()) {
    compiler_id =
        compile::compiler(settings.nvrtc_library, settings.resolved_cuda_home()).identity().id;
  }
  cache::write_bundle(output, cache::BundleInfo::current(compiler_id, archs, manifest.text),
                      result.kernels);
  // Read it back: the file on disk, not the kernels in memory, is what gets deployed.
  const cache::Bundle bundle = cache::Bundle::open(output);
  std::uint64_t bytes = 0;
  for (const cache::BundleEntry& entry : bundle.entries()) bytes += entry.encoded_bytes;
  std::printf("wrote %s: %zu kernels, %s\n", output.c_str(), bundle.entries().size(),
              format_size(bytes).c_str());
  if (devices.empty()) return kExitOk;
  std::fflush(stdout);
  return report_verification(bundle, manifest, devices);
}

int cmd_bundle(const Argv& argv) {
  const Args args = parse_args(argv,
                               {.values = {"verify", "verify-device"},
                                .max_positional = 2,
                                .repeatable = {"verify", "verify-device"}},
                               "bundle");
  if (args.has("help")) {
    std::fputs(kBundleUsage, stdout);
    return kExitOk;
  }
  if (args.positional.size() != 2) {
    throw UsageError("bundle: give an action and a bundle: kjit bundle info|verify <file.kjb>");
  }
  const std::string& action = args.positional[0];
  if (action != "info" && action != "verify") {
    throw UsageError(fmt::format("bundle: unknown action '{}'; accepted: info, verify", action));
  }
  const cache::Bundle bundle = cache::Bundle::open(args.positional[1]);
  if (action == "verify") {
    const std::vector<DeviceLimits> devices = verify_devices(args);
    if (devices.empty()) throw UsageError("bundle verify: give --verify or --verify-device");
    return report_verification(bundle, parse_manifest(bundle.info().manifest, bundle.path()),
                               devices);
  }
  const cache::BundleInfo& info = bundle.info();
  std::string out = fmt::format(
      "bundle           {}\nlibrary version  {}\ntemplates        {}\ncompiler         {}\n"
      "archs            {}\nentries          {}\n",
      bundle.path(), info.library_version, info.template_digest, info.compiler_id,
      fmt::join(info.archs, ","), bundle.entries().size());
  out += "\n== manifest ==\n" + info.manifest;
  if (!info.manifest.empty() && info.manifest.back() != '\n') out += "\n";
  out += fmt::format("\n== entries ==\n{:>4} {:>6} {:>7} {:>6} {:>9}  {:<32}  {}\n", "regs", "smem",
                     "local", "spill", "size", "key", "spec");
  for (const cache::BundleEntry& entry : bundle.entries()) {
    out += fmt::format("{:>4} {:>6} {:>7} {:>6} {:>9}  {:<32}  {}\n", entry.resources.registers,
                       entry.resources.static_smem, entry.resources.local_bytes,
                       entry.resources.spill_store_bytes, entry.encoded_bytes, entry.key,
                       entry.spec.str());
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

}  // namespace kjit::tool
