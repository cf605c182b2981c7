// SPDX-License-Identifier: Apache-2.0
// kjit plan / source / inspect: what would run, from which source, with which resources.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "cache/bundle.hpp"
#include "cli.hpp"
#include "commands.hpp"
#include "compile/compiler.hpp"
#include "kjit/catalog.hpp"
#include "kjit/error.hpp"
#include "kjit/runtime.hpp"
#include "kjit/settings.hpp"
#include "kjit/source.hpp"
#include "verify.hpp"

namespace kjit::tool {
namespace {

constexpr const char* kPlanUsage =
    R"(usage: kjit plan <op> [shape options] (--arch sm_XY | --device N) [--json]

Prints the Plan of an op for a concrete problem: the grid mode, every launch with its
specialization, grid, block and dynamic shared memory, and every limit it was checked against.
--arch plans offline from the built-in table (sm_80, sm_86, sm_89, sm_90, sm_100, sm_120, or a
product name: h100, h200, b200, a100, l40s, rtx5090), or for a fabricated device given as
key=value items over a base (the keys of `kjit bundle --help`), e.g. --arch base=h100,dram_gbps=4000
for an H100 with faster memory; --device plans for a live device.
Exit code 2 when the problem cannot be planned.

ops and their shape options (sizes are required, the rest have defaults):
)";

std::string op_usage() {
  std::string out;
  for (const OpInfo& op : op_catalog()) {
    out += fmt::format("  {}: {}\n", op.name, op.doc);
    for (const OpParam& param : op.params) {
      std::string flag = param.name;
      for (char& c : flag) c = c == '_' ? '-' : c;
      out +=
          fmt::format("      --{:<16} {}{}\n", flag, param.doc,
                      param.size ? ""
                                 : fmt::format(" [{}]", param.fallback.empty() ? std::string("auto")
                                                                               : param.fallback));
    }
  }
  return out;
}

DeviceLimits target_limits(const Args& args, const char* cmd) {
  if (args.has("arch") == args.has("device")) {
    throw UsageError(fmt::format("{}: give exactly one of --arch sm_XY or --device N", cmd));
  }
  if (args.has("arch")) {
    const std::string arch = args.get("arch");
    return arch.find('=') != std::string::npos ? parse_device(arch) : DeviceLimits::for_name(arch);
  }
  Runtime runtime(Settings::from_env());
  return runtime.device_limits(static_cast<int>(args.get_int("device", 0)));
}

std::string numbered(std::string_view text) {
  std::string out;
  int line = 1;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    out += fmt::format("{:5}  {}\n", line++, text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

int cmd_plan(const Argv& argv) {
  const Args args = parse_args(argv, {.flags = {"json"}, .any_value_option = true}, "plan");
  if (args.has("help")) {
    std::fputs(kPlanUsage, stdout);
    std::fputs(op_usage().c_str(), stdout);
    return kExitOk;
  }
  if (args.positional.size() != 1) {
    throw UsageError(
        "plan: give one op, e.g. kjit plan merge_state --tokens 64 --heads 8 "
        "--head-dim 128 --arch sm_90");
  }
  const OpInfo& op = find_op(args.positional[0]);
  ShapeValues values;
  for (const auto& [name, given] : args.options) {
    if (name == "arch" || name == "device" || name == "json") continue;
    std::string key = name;
    for (char& c : key) c = c == '-' ? '_' : c;
    // --head-dim and --head_dim name one value: both given is the same mistake as one twice.
    if (!values.emplace(key, given.back()).second) {
      std::string dashed = key;
      for (char& c : dashed) c = c == '_' ? '-' : c;
      throw UsageError(
          fmt::format("plan: --{} and --{} name the same value; give it once", dashed, key));
    }
  }
  values = complete_shape_values(op, std::move(values), true);
  const DeviceLimits device = target_limits(args, "plan");
  const Plan plan = plan_from_shape(op, values, device);
  std::fputs(args.has("json") ? (plan.to_json() + "\n").c_str() : plan.explain().c_str(), stdout);
  return kExitOk;
}

int cmd_source(const Argv& argv) {
  const Args args = parse_args(argv, {.max_positional = 1}, "source");
  if (!args.has("help") && args.positional.empty()) {
    throw UsageError("source: give a spec, e.g. kjit source 'probe:heavy=0@sm_90'");
  }
  if (args.has("help")) {
    std::fputs(
        "usage: kjit source <spec>\n\nPrints the exact stub source NVRTC compiles for a spec, "
        "with line numbers, then\nevery embedded template it includes (transitively), with "
        "line numbers.\nexample: kjit source 'probe:heavy=0@sm_90'\n",
        stdout);
    return kExitOk;
  }
  const KernelSpec spec = KernelSpec::parse(args.positional[0]);
  const std::vector<SourceFile> files = kernel_source_files(spec);
  std::string out =
      fmt::format("// ===== stub ({}) =====\n{}", spec.str(), numbered(files[0].text));
  for (std::size_t i = 1; i < files.size(); ++i) {
    out += fmt::format("\n// ===== {} =====\n{}", files[i].name, numbered(files[i].text));
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

namespace {

constexpr const char* kInspectUsage =
    R"(usage: kjit inspect <spec> [--ptx] [--sass] [--resources] [--key]

Compiles a spec (through the disk cache) or finds it in a KJIT_BUNDLE_PATH bundle, and shows
where it came from, its resources (registers, shared/local memory, spills) and its cache key.
  --resources  only the resources
  --key        the key material the cache key was computed from
  --ptx        the PTX
  --sass       the SASS of the cubin (cuobjdump -sass or nvdisasm from PATH or $CUDA_HOME/bin)
  --via-runtime  look the spec up only through the Runtime (memory, bundles, disk, NVRTC), not
               through the tool's own reading of KJIT_BUNDLE_PATH
)";

std::string find_tool(const std::string& name, const std::string& cuda_home) {
  if (const char* path = std::getenv("PATH")) {
    for (const std::string& dir : split_list(path, ':')) {
      const std::filesystem::path candidate = std::filesystem::path(dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    }
  }
  const std::filesystem::path candidate = std::filesystem::path(cuda_home) / "bin" / name;
  if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  return {};
}

std::string run_capture(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  std::size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  *status = ::pclose(pipe);
  return out;
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string sass_of(const CompiledKernel& kernel, const std::string& cuda_home) {
  std::string tool = find_tool("cuobjdump", cuda_home);
  std::string flags = "-sass";
  if (tool.empty()) {
    tool = find_tool("nvdisasm", cuda_home);
    flags = "-c";
  }
  if (tool.empty()) {
    return fmt::format(
        "(no SASS: neither cuobjdump nor nvdisasm was found on PATH or under {}/bin; install "
        "the CUDA toolkit's binary utilities or set CUDA_HOME)\n",
        cuda_home);
  }
  char temp[] = "/tmp/kjit-inspect-XXXXXX.cubin";
  const int fd = ::mkstemps(temp, 6);
  if (fd < 0) return "(no SASS: cannot create a temporary file)\n";
  const bool written = ::write(fd, kernel.cubin.data(), kernel.cubin.size()) ==
                       static_cast<ssize_t>(kernel.cubin.size());
  ::close(fd);
  int status = 0;
  std::string out =
      written
          ? run_capture(fmt::format("{} {} {} 2>&1", shell_quote(tool), flags, shell_quote(temp)),
                        &status)
          : std::string("(cannot write the cubin to a temporary file)\n");
  ::unlink(temp);
  if (status != 0) out += fmt::format("({} exited with status {})\n", tool, status);
  return out;
}

std::string resources_text(const KernelResources& r) {
  return fmt::format(
      "registers        {}\nstatic smem      {} bytes\nlocal (stack)    {} bytes\nspill stores     "
      "{} bytes\nspill loads      {} bytes\nconstant         {} bytes\nlaunch bounds    {}\n",
      r.registers, r.static_smem, r.local_bytes, r.spill_store_bytes, r.spill_load_bytes,
      r.const_bytes, r.max_threads == 0 ? std::string("none") : std::to_string(r.max_threads));
}

/// What became of a kernel the Runtime just compiled: stored, or why not.
std::string storage_outcome(const Settings& settings, const CacheStats& stats) {
  const std::string root = settings.resolved_cache_dir();
  if (settings.disable_disk_cache) {
    return "not stored: the disk cache is turned off (KJIT_DISABLE_DISK_CACHE=1)";
  }
  if (stats.disk_enabled && stats.write_failures == 0) {
    return fmt::format("stored in the disk cache {}", root);
  }
  // The cache said why in its one warning; repeat the gist here, where the user looks.
  struct stat info {};
  std::string why = "a write to it failed (the warning above says which)";
  if (::stat(root.c_str(), &info) != 0) {
    why = fmt::format("it does not exist and cannot be created ({})", std::strerror(errno));
  } else if (!S_ISDIR(info.st_mode)) {
    why = "it is not a directory";
  } else if (::access(root.c_str(), W_OK | X_OK) != 0 || stats.write_failures == 0) {
    why = "it is read-only";
  }
  return fmt::format("kept in memory only, not stored in the disk cache {}: {}", root, why);
}

}  // namespace

int cmd_inspect(const Argv& argv) {
  const Args args = parse_args(
      argv, {.flags = {"ptx", "sass", "resources", "key", "via-runtime"}, .max_positional = 1},
      "inspect");
  if (args.has("help")) {
    std::fputs(kInspectUsage, stdout);
    return kExitOk;
  }
  if (args.positional.empty()) throw UsageError("inspect: give a spec (see kjit inspect --help)");
  const KernelSpec spec = KernelSpec::parse(args.positional[0]);
  const Settings settings = Settings::from_env();
  std::shared_ptr<const CompiledKernel> kernel;
  std::string origin;
  // Bundles first, read here as well as by the Runtime, so that inspecting a deployment
  // bundle works on a machine without NVRTC whatever the Runtime is configured to do.
  if (!settings.bundle_paths.empty() && !args.has("via-runtime")) {
    const cache::BundleSet bundles(settings.bundle_paths);
    for (const cache::Bundle& bundle : bundles.bundles()) {
      if ((kernel = bundle.find(spec))) {
        origin = fmt::format("bundle {}", bundle.path());
        break;
      }
    }
    // With JIT disabled the Runtime still searches the disk cache (a pre-filled one serves
    // deployments too), and its KernelNotInBundle names both.
  }
  if (!kernel) {
    Runtime runtime(settings);
    KernelSource source = KernelSource::compiled;
    kernel = runtime.compiled(spec, &source);
    switch (source) {
      case KernelSource::memory:
        origin = "memory";
        break;
      case KernelSource::bundle:
        origin = "bundle";
        break;
      case KernelSource::disk:
        origin = fmt::format("disk cache {}", settings.resolved_cache_dir());
        break;
      case KernelSource::compiled:
        origin = "compiled now (NVRTC), " + storage_outcome(settings, runtime.stats());
        break;
    }
  }
  std::string out;
  const bool only_resources =
      args.has("resources") && !args.has("key") && !args.has("ptx") && !args.has("sass");
  if (!only_resources) {
    out += fmt::format(
        "spec          {}\nfrom          {}\nkey           {}\nentry point   {}\n"
        "options       {}\ncubin         {} bytes\nptx           {} bytes\n",
        kernel->spec.str(), origin, kernel->key, kernel->lowered_name, kernel->options,
        kernel->cubin.size(), kernel->ptx.size());
    out += "\n";
  }
  out += resources_text(kernel->resources);
  if (const auto why = compile::wgmma_serialization(kernel->log, kernel->lowered_name)) {
    out += fmt::format("wgmma            serialized by ptxas (C7512: {})\n", *why);
  }
  if (args.has("key")) out += "\n== key material ==\n" + kernel->key_material;
  if (args.has("ptx")) out += "\n== PTX ==\n" + kernel->ptx;
  if (args.has("sass")) out += "\n== SASS ==\n" + sass_of(*kernel, settings.resolved_cuda_home());
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

}  // namespace kjit::tool
