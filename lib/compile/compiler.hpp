// SPDX-License-Identifier: Apache-2.0
// NVRTC, loaded with dlopen on first use: KernelSpec -> cubin + PTX + lowered name + resources.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/kernel.hpp"
#include "kjit/spec.hpp"

namespace kjit::compile {

/// What identifies the compiler for cache keys: NVRTC's version and the banner lines of the
/// PTX it emits for an empty program (which carry the build id).
struct CompilerIdentity {
  int major = 0;
  int minor = 0;
  /// "nvrtc-13.0-<8 hex of the banner hash>": a path component of the disk cache.
  std::string id;
  /// The full text that went into `id`, for key material.
  std::string material;
};

/// One header handed to NVRTC under the name an #include spells.
struct HeaderFile {
  std::string name;
  std::string contents;
};

/// One NVRTC program, described completely: what compile_source() compiles.
struct SourceProgram {
  /// The program name NVRTC uses in diagnostics, e.g. "kjit_stub_probe.cu".
  std::string name;
  std::string source;
  /// The entry point to instantiate and lower; empty: none (no lowered name is returned).
  std::string name_expression;
  std::vector<HeaderFile> headers;
  /// Every option, exactly as passed to nvrtcCompileProgram.
  std::vector<std::string> options;
  /// What is being compiled, for error messages (the spec text).
  std::string what;
};

/// What NVRTC produced for one SourceProgram.
struct CompileOutput {
  std::string lowered_name;
  /// Empty when the target was a virtual architecture (compute_XY).
  std::string cubin;
  std::string ptx;
  /// The raw NVRTC + ptxas log.
  std::string log;
};

/// NVRTC as loaded from a library path. Move-only; one per process is usual (compiler()).
/// Every const member may be called concurrently from several threads; a moved-from Compiler
/// may only be destroyed or assigned to.
class Compiler {
 public:
  /// Loads `library` (empty: "libnvrtc.so.13", then "libnvrtc.so", then the copies under
  /// `cuda_home`). `cuda_home` (empty: /usr/local/cuda) is where toolkit headers such as
  /// cuda_fp16.h are found. Throws CompileError saying which libraries could not be loaded,
  /// why, and that KJIT_NVRTC_LIBRARY can point kjit at one.
  explicit Compiler(const std::string& library, std::string cuda_home);
  ~Compiler();
  Compiler(Compiler&&) noexcept;
  Compiler& operator=(Compiler&&) noexcept;

  /// Version and PTX banner, computed on first call (one empty-program compile) and cached.
  const CompilerIdentity& identity() const;
  /// Archs this NVRTC can target (nvrtcGetSupportedArchs), plus their a/f variants where
  /// NVRTC accepts them (a: sm_90 and newer, f: sm_100 and newer). Sorted.
  std::vector<Arch> supported_archs() const;
  /// The library that was loaded, as it was named to dlopen.
  const std::string& library() const noexcept;
  /// The file the dynamic loader mapped for it (a path even when library() is a soname);
  /// empty when the loader does not say.
  std::string library_file() const;
  /// The file of an NVRTC this process has already loaded (torch loads its own) that a
  /// Compiler(library, cuda_home) would pick up instead of searching, without loading one;
  /// empty when none is loaded.
  static std::string preloaded_library_file(const std::string& library,
                                            const std::string& cuda_home);
  /// The toolkit root in use.
  const std::string& cuda_home() const noexcept;

  /// The canonical option list for a spec (sorted, without -Xptxas=-v which never changes the
  /// binary, and without host paths): goes into the cache key.
  std::vector<std::string> options_for(const KernelSpec& spec) const {
    return canonical_options(spec);
  }
  /// options_for() without a loaded compiler: the options depend on the spec alone.
  static std::vector<std::string> canonical_options(const KernelSpec& spec);
  /// options_for() plus what compile() adds that never changes the binary: the toolkit
  /// include path and -Xptxas=-v. Exactly what compile() passes to NVRTC.
  std::vector<std::string> compile_options_for(const KernelSpec& spec) const;

  /// Compiles one spec: stub source from codegen, every embedded template as a header,
  /// cuda_fp16.h etc. from <cuda_home>/include. Fills every field of CompiledKernel except
  /// `key` and `key_material`. Throws CompileError with the log mapped to template file:line,
  /// the options and the spec text; also when the spec's arch is not supported.
  CompiledKernel compile(const KernelSpec& spec) const;

  /// Compiles an arbitrary program (compile() is this plus codegen). Throws CompileError as
  /// compile() does, with `program.what` as the spec text. For tests and tools.
  CompileOutput compile_source(const SourceProgram& program) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The process-wide Compiler for (library, cuda_home), created on first use and never
/// destroyed (NVRTC must stay loaded while any thread may compile). Thread-safe. A load
/// failure throws CompileError and is retried on the next call.
const Compiler& compiler(const std::string& library, const std::string& cuda_home);

/// The NVRTC program name of a spec's stub, "kjit_stub_<family>.cu": how the stub appears in
/// diagnostics.
std::string program_name(const KernelSpec& spec);

/// Every embedded template as a header, under its include name ("templates/probe/probe.cuh").
std::vector<HeaderFile> embedded_headers();

/// Parses the `-Xptxas=-v` part of an NVRTC log: resources per mangled kernel name (entry
/// functions only; `max_threads` is not in the report, see ptx_max_threads()).
std::map<std::string, KernelResources> parse_ptxas_report(std::string_view log);

/// Why ptxas serialized the wgmma of entry point `kernel` ("insufficient register resources",
/// ...), from its C7512 line in an NVRTC log with the `-Xptxas=-v` report; nullopt when it did
/// not. A serialized kernel is correct but each warpgroup product waits for itself, k-step by
/// k-step: the warp-specialized prefill kernel ran ~1.6x slower per step that way and nothing
/// else said so (docs/performance.md, "The warp-specialized kernel's wgmma were serialized").
std::optional<std::string> wgmma_serialization(std::string_view log, std::string_view kernel);

/// Registers and stack frame of entry point `kernel` read from the cubin itself, for when
/// NVRTC returns no ptxas report: on the H200 machine, with torch's NVRTC loaded in the
/// process, the program log came back empty. The global ".nv.info" section of a CUDA ELF holds
/// per-kernel attribute records (register count 0x2f, frame size 0x11) keyed by the kernel's
/// .symtab index. nullopt for anything that is not a well-formed 64-bit ELF with such a record.
/// Static shared memory and spills are not read (0): the runtime reads the loaded function's
/// real attributes before every launch check anyway.
std::optional<KernelResources> cubin_resources(std::string_view cubin, std::string_view kernel);

/// The __launch_bounds__ maximum of an entry point, from the `.maxntid` directive of its PTX
/// (product of the dimensions); 0 when it declares none or is not found.
int ptx_max_threads(std::string_view ptx, std::string_view entry);

/// Rewrites NVRTC locations into file:line form: "templates/probe/probe.cuh(12): error" becomes
/// "templates/probe/probe.cuh:12: error", "at line 5 of templates/x/x.cuh" becomes "at
/// templates/x/x.cuh:5", and "kjit_stub_probe.cu(2):" becomes "kjit_stub_probe.cu:2:". A
/// template's include name is its path in the source tree, so the file names stay as they are.
std::string map_log_locations(std::string_view log);

/// The diagnostic lines of a log ("error", "catastrophic error", "Command-line error"), at
/// most `max_lines` of them; the first non-empty lines when none is marked as an error.
std::vector<std::string> error_lines(std::string_view log, std::size_t max_lines = 8);

}  // namespace kjit::compile
