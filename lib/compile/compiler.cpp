// SPDX-License-Identifier: Apache-2.0
#include "compile/compiler.hpp"

#include <dlfcn.h>
#include <pthread.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "compile/nvrtc_api.hpp"
#include "kjit/error.hpp"
#include "support/dynlib.hpp"
#include "support/hash.hpp"
#include "support/log.hpp"

namespace kjit::compile {
namespace {

constexpr std::string_view kDefaultCudaHome = "/usr/local/cuda";

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

// The libraries tried, in order, when none is named. The soname first (the loader path and
// ldconfig decide), then the unversioned development link, then the toolkit named by
// cuda_home, for installs whose lib directory is not on the loader path.
std::vector<std::string> library_candidates(const std::string& library,
                                            const std::string& cuda_home) {
  if (!library.empty()) return {library};
  return {"libnvrtc.so.13", "libnvrtc.so", cuda_home + "/lib64/libnvrtc.so.13",
          cuda_home + "/lib/libnvrtc.so.13"};
}

// The leading "//" lines of a PTX file: NVVM's banner, which names the compiler build.
std::string ptx_banner(std::string_view ptx) {
  std::string banner;
  std::size_t start = 0;
  while (start < ptx.size()) {
    std::size_t end = ptx.find('\n', start);
    if (end == std::string_view::npos) end = ptx.size();
    const std::string_view line = ptx.substr(start, end - start);
    if (!line.starts_with("//")) break;
    banner += line;
    banner += '\n';
    start = end + 1;
  }
  return banner;
}

// NVRTC's size queries for text include the terminating NUL; the strings kjit keeps do not.
void drop_trailing_nul(std::string* text) {
  while (!text->empty() && text->back() == '\0') text->pop_back();
}

/// Stack of the thread that runs nvrtcCompileProgram. NVRTC's front end recurses with the
/// source's nesting and dies with SIGSEGV when the stack runs out, which would take the caller's
/// process down instead of raising an error: measured with NVRTC 13.0, the warp-specialized
/// prefill kernel needs ~100-128 KiB, a 5000-deep expression more than 8 MiB, 30000-deep more
/// than 64 MiB. Threads of other runtimes often have small stacks (musl 128 KiB, many pools 1-2
/// MiB), so the compile never runs on the caller's stack. Reserved address space: the pages are
/// only committed as NVRTC touches them.
constexpr std::size_t kNvrtcStackBytes = std::size_t{256} << 20;

/// api.compile_program on a thread of its own with kNvrtcStackBytes of stack, or on this thread
/// where such a thread cannot be created (address space limits; logged).
nvrtcResult compile_on_large_stack(const NvrtcApi& api, nvrtcProgram program, int option_count,
                                   const char* const* options) {
  struct Call {
    const NvrtcApi* api;
    nvrtcProgram program;
    int option_count;
    const char* const* options;
    nvrtcResult result;
  } call{&api, program, option_count, options, NVRTC_ERROR_INTERNAL_ERROR};
  const auto run = [](void* argument) -> void* {
    auto* c = static_cast<Call*>(argument);
    c->result = c->api->compile_program(c->program, c->option_count, c->options);
    return nullptr;
  };
  pthread_attr_t attributes;
  int status = pthread_attr_init(&attributes);
  if (status == 0) {
    pthread_t thread;
    status = pthread_attr_setstacksize(&attributes, kNvrtcStackBytes);
    if (status == 0) status = pthread_create(&thread, &attributes, run, &call);
    pthread_attr_destroy(&attributes);
    if (status == 0) {
      pthread_join(thread, nullptr);  // (cannot fail: joinable, joined once, not this thread)
      return call.result;
    }
  }
  support::log(LogLevel::warn,
               "NVRTC compiles on the calling thread: no thread with {} MiB of stack could be "
               "created ({})",
               kNvrtcStackBytes >> 20, std::strerror(status));
  run(&call);
  return call.result;
}

}  // namespace

struct Compiler::Impl {
  support::DynamicLibrary library;
  std::string library_name;
  std::string cuda_home;
  NvrtcApi api;
  int major = 0;
  int minor = 0;
  std::vector<Arch> archs;
  std::vector<HeaderFile> headers;

  std::once_flag identity_once;
  CompilerIdentity identity;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // NVRTC does not survive dlclose followed by a new dlopen in one process; the mapping stays
  // (dlopen reference counts, so a later Compiler reuses it).
  ~Impl() { library.release(); }

  void check(nvrtcResult result, const char* call, const std::string& what) const {
    if (result != NVRTC_SUCCESS) {
      throw CompileError(fmt::format("{} failed for {}: {}", call, what, api.describe(result)), {},
                         {}, what);
    }
  }
};

Compiler::Compiler(const std::string& library, std::string cuda_home)
    : impl_(std::make_unique<Impl>()) {
  impl_->cuda_home = cuda_home.empty() ? std::string(kDefaultCudaHome) : std::move(cuda_home);
  std::vector<std::string> failures;
  for (const std::string& candidate : library_candidates(library, impl_->cuda_home)) {
    std::string error;
    support::DynamicLibrary loaded = support::DynamicLibrary::open(candidate, &error);
    if (loaded) {
      impl_->library = std::move(loaded);
      impl_->library_name = candidate;
      break;
    }
    failures.push_back(fmt::format("{} ({})", candidate, error));
  }
  if (!impl_->library) {
    throw CompileError(fmt::format(
        "could not load NVRTC, which kjit needs to compile kernels; tried: {}. Install the CUDA "
        "13 NVRTC runtime (libnvrtc.so.13), or set KJIT_NVRTC_LIBRARY to the path of "
        "libnvrtc.so.13, or use a bundle of precompiled kernels (KJIT_BUNDLE_PATH)",
        join(failures, "; ")));
  }
  impl_->api = NvrtcApi::load(impl_->library, impl_->library_name);
  const NvrtcApi& api = impl_->api;
  impl_->check(api.version(&impl_->major, &impl_->minor), "nvrtcVersion", impl_->library_name);

  int count = 0;
  impl_->check(api.get_num_supported_archs(&count), "nvrtcGetNumSupportedArchs",
               impl_->library_name);
  std::vector<int> sms(static_cast<std::size_t>(std::max(count, 0)));
  if (count > 0) {
    impl_->check(api.get_supported_archs(sms.data()), "nvrtcGetSupportedArchs",
                 impl_->library_name);
  }
  for (const int sm : sms) {
    const Arch base{sm / 10, sm % 10, '\0'};
    impl_->archs.push_back(base);
    // By NVIDIA's rule: architecture-specific targets exist from sm_90, family-specific ones
    // from sm_100. The compile tests check sm_90a, sm_100a and sm_100f against NVRTC.
    if (sm >= 90) impl_->archs.push_back(Arch{base.major, base.minor, 'a'});
    if (sm >= 100) impl_->archs.push_back(Arch{base.major, base.minor, 'f'});
  }
  std::sort(impl_->archs.begin(), impl_->archs.end());
  impl_->headers = embedded_headers();
}

Compiler::~Compiler() = default;
Compiler::Compiler(Compiler&&) noexcept = default;
Compiler& Compiler::operator=(Compiler&&) noexcept = default;

const CompilerIdentity& Compiler::identity() const {
  Impl& impl = *impl_;
  std::call_once(impl.identity_once, [&] {
    // A virtual target needs no ptxas, so this costs only the front end. The banner does not
    // depend on the target; the lowest one is used because every NVRTC supports it.
    const std::string target = impl.archs.empty()
                                   ? std::string("compute_75")
                                   : fmt::format("compute_{}", impl.archs.front().sm());
    SourceProgram program;
    program.name = "kjit_identity.cu";
    program.options = {"--gpu-architecture=" + target};
    program.what = "the compiler identity probe (an empty program)";
    const CompileOutput output = compile_source(program);
    CompilerIdentity id;
    id.major = impl.major;
    id.minor = impl.minor;
    id.material = fmt::format("nvrtc {}.{}\n{}", impl.major, impl.minor, ptx_banner(output.ptx));
    const std::string hash = fmt::format("{:016x}", support::xxh3_64(id.material));
    id.id = fmt::format("nvrtc-{}.{}-{}", impl.major, impl.minor, hash.substr(0, 8));
    impl.identity = std::move(id);
  });
  return impl.identity;
}

std::vector<Arch> Compiler::supported_archs() const { return impl_->archs; }

const std::string& Compiler::library() const noexcept { return impl_->library_name; }

std::string Compiler::preloaded_library_file(const std::string& library,
                                             const std::string& cuda_home) {
  for (const std::string& candidate : library_candidates(library, cuda_home)) {
    void* handle = ::dlopen(candidate.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) continue;
    // Any symbol of it names its file; the reference RTLD_NOLOAD took is dropped again.
    Dl_info info{};
    void* symbol = ::dlsym(handle, "nvrtcVersion");
    std::string file;
    if (symbol != nullptr && ::dladdr(symbol, &info) != 0 && info.dli_fname != nullptr) {
      file = info.dli_fname;
    }
    ::dlclose(handle);
    if (!file.empty()) return file;
  }
  return {};
}

std::string Compiler::library_file() const {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(impl_->api.version), &info) == 0 ||
      info.dli_fname == nullptr) {
    return {};
  }
  return info.dli_fname;
}

const std::string& Compiler::cuda_home() const noexcept { return impl_->cuda_home; }

std::vector<std::string> Compiler::canonical_options(const KernelSpec& spec) {
  // CUBIN for the exact target (sm_, not compute_): the driver then loads it without a JIT
  // step. No --use_fast_math (templates choose their intrinsics explicitly, accuracy matters)
  // and no -lineinfo (it changes the binary without changing what runs).
  std::vector<std::string> options = {
      "--gpu-architecture=" + spec.arch.str(),
      // Unannotated namespace-scope constants in templates become device entities instead of
      // host variables, which NVRTC rejects.
      "-default-device",
      "-std=c++20",
  };
  std::sort(options.begin(), options.end());
  return options;
}

std::vector<std::string> Compiler::compile_options_for(const KernelSpec& spec) const {
  std::vector<std::string> options = options_for(spec);
  // NVRTC 13 has no built-in cuda_fp16.h / cuda_bf16.h / cuda_fp8.h; they come from the
  // toolkit. The path is host-specific, hence not part of options_for() (the cache key).
  options.push_back("-I" + impl_->cuda_home + "/include");
  // The resource report only adds to the log; the binary is the same with or without it.
  options.push_back("-Xptxas=-v");
  return options;
}

CompileOutput Compiler::compile_source(const SourceProgram& program) const {
  const Impl& impl = *impl_;
  const NvrtcApi& api = impl.api;
  std::vector<const char*> header_names;
  std::vector<const char*> header_contents;
  header_names.reserve(program.headers.size());
  header_contents.reserve(program.headers.size());
  for (const HeaderFile& header : program.headers) {
    header_names.push_back(header.name.c_str());
    header_contents.push_back(header.contents.c_str());
  }
  Program nvrtc_program(api, program.source.c_str(), program.name.c_str(),
                        static_cast<int>(header_names.size()), header_contents.data(),
                        header_names.data());
  if (!program.name_expression.empty()) {
    impl.check(api.add_name_expression(nvrtc_program.get(), program.name_expression.c_str()),
               "nvrtcAddNameExpression", program.what);
  }
  std::vector<const char*> options;
  options.reserve(program.options.size());
  for (const std::string& option : program.options) options.push_back(option.c_str());
  const nvrtcResult result = compile_on_large_stack(
      api, nvrtc_program.get(), static_cast<int>(options.size()), options.data());

  CompileOutput output;
  std::size_t size = 0;
  if (api.get_program_log_size(nvrtc_program.get(), &size) == NVRTC_SUCCESS && size > 0) {
    output.log.resize(size);
    if (api.get_program_log(nvrtc_program.get(), output.log.data()) != NVRTC_SUCCESS) {
      output.log.clear();
    }
    drop_trailing_nul(&output.log);
  }

  const std::string joined_options = join(program.options, " ");
  if (result != NVRTC_SUCCESS) {
    const std::string mapped = map_log_locations(output.log);
    std::string message =
        fmt::format("NVRTC could not compile {}: {}", program.what, api.describe(result));
    for (const std::string& line : error_lines(mapped)) message += "\n  " + line;
    if (output.log.find("could not open source file \"cuda_") != std::string::npos) {
      message += fmt::format(
          "\nCUDA toolkit headers were looked up in {}/include; set KJIT_CUDA_HOME (or "
          "CUDA_HOME) to the toolkit root",
          impl.cuda_home);
    }
    message += "\noptions: " + joined_options;
    throw CompileError(message, mapped, joined_options, program.what);
  }

  if (!program.name_expression.empty()) {
    const char* lowered = nullptr;
    impl.check(api.get_lowered_name(nvrtc_program.get(), program.name_expression.c_str(), &lowered),
               "nvrtcGetLoweredName", program.what);
    // The string belongs to the program, which is destroyed on return.
    output.lowered_name = lowered != nullptr ? lowered : "";
  }
  // A virtual target (compute_XY) has no CUBIN: NVRTC then reports size 0.
  if (api.get_cubin_size(nvrtc_program.get(), &size) == NVRTC_SUCCESS && size > 0) {
    output.cubin.resize(size);
    impl.check(api.get_cubin(nvrtc_program.get(), output.cubin.data()), "nvrtcGetCUBIN",
               program.what);
  }
  impl.check(api.get_ptx_size(nvrtc_program.get(), &size), "nvrtcGetPTXSize", program.what);
  output.ptx.resize(size);
  if (size > 0) {
    impl.check(api.get_ptx(nvrtc_program.get(), output.ptx.data()), "nvrtcGetPTX", program.what);
  }
  drop_trailing_nul(&output.ptx);
  return output;
}

CompiledKernel Compiler::compile(const KernelSpec& spec) const {
  const std::string spec_text = spec.str();
  const std::vector<std::string> options = compile_options_for(spec);
  const std::vector<Arch>& archs = impl_->archs;
  if (std::find(archs.begin(), archs.end(), spec.arch) == archs.end()) {
    std::vector<std::string> names;
    for (const Arch& arch : archs) names.push_back(arch.str());
    throw CompileError(fmt::format("NVRTC {}.{} ({}) cannot target {} (spec {}); it supports: {}",
                                   impl_->major, impl_->minor, impl_->library_name, spec.arch.str(),
                                   spec_text, join(names, ", ")),
                       {}, join(options, " "), spec_text);
  }

  SourceProgram program;
  program.name = program_name(spec);
  program.source = codegen::stub_source(spec);
  program.name_expression = codegen::name_expression(spec);
  program.headers = impl_->headers;
  program.options = options;
  program.what = spec_text;

  CompileOutput output = compile_source(program);

  CompiledKernel kernel;
  kernel.spec = spec;
  kernel.lowered_name = std::move(output.lowered_name);
  const std::map<std::string, KernelResources> report = parse_ptxas_report(output.log);
  if (const auto found = report.find(kernel.lowered_name); found != report.end()) {
    kernel.resources = found->second;
  } else if (const auto from_cubin = cubin_resources(output.cubin, kernel.lowered_name)) {
    // No ptxas report in the log (seen with another copy of NVRTC loaded by torch): registers
    // and stack frame from the cubin; static shared memory and spills stay unknown (zero).
    kernel.resources = *from_cubin;
    support::log(LogLevel::debug, "no ptxas report for {}; resources read from the cubin",
                 spec_text);
  } else {
    support::log(LogLevel::warn, "ptxas reported no resources for {} ({}); they read as zero",
                 spec_text, kernel.lowered_name);
  }
  if (const auto why = wgmma_serialization(output.log, kernel.lowered_name)) {
    support::log(LogLevel::warn,
                 "ptxas serialized the wgmma of {} ({}; C7512): it is correct, but every "
                 "warpgroup product waits for itself, far below the kernel's speed",
                 spec_text, *why);
  }
  kernel.resources.max_threads = ptx_max_threads(output.ptx, kernel.lowered_name);
  kernel.cubin = std::move(output.cubin);
  kernel.ptx = std::move(output.ptx);
  kernel.source = std::move(program.source);
  kernel.options = join(options, " ");
  kernel.log = std::move(output.log);
  // No log line here: the runtime logs each resolution once ("compiling with NVRTC" before the
  // compile); the compiled kernel carries its resources (kjit inspect shows them).
  return kernel;
}

const Compiler& compiler(const std::string& library, const std::string& cuda_home) {
  // Never destroyed: a thread may still compile while static destructors run at exit, and
  // NVRTC must not be unloaded under it.
  static auto* mutex = new std::mutex;
  static auto* instances =
      new std::map<std::pair<std::string, std::string>, std::unique_ptr<Compiler>>;
  std::lock_guard<std::mutex> lock(*mutex);
  std::unique_ptr<Compiler>& slot = (*instances)[{library, cuda_home}];
  if (!slot) {
    // Constructed before being stored, so a failed load leaves the slot empty for a retry.
    auto created = std::make_unique<Compiler>(library, cuda_home);
    slot = std::move(created);
  }
  return *slot;
}

std::string program_name(const KernelSpec& spec) { return "kjit_stub_" + spec.family + ".cu"; }

std::vector<HeaderFile> embedded_headers() {
  std::vector<HeaderFile> headers;
  for (const codegen::EmbeddedTemplate& file : codegen::embedded_templates()) {
    headers.push_back(HeaderFile{file.include_name, file.contents});
  }
  return headers;
}

}  // namespace kjit::compile
