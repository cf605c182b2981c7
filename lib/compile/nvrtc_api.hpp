// SPDX-License-Identifier: Apache-2.0
// The NVRTC entry points kjit uses, resolved from a dlopen()ed libnvrtc. nvrtc.h supplies only
// types and prototypes; kjit never links libnvrtc, so that planning, codegen and bundles work
// on machines without it.
#pragma once

#include <nvrtc.h>

#include <string>

#include "support/dynlib.hpp"

namespace kjit::compile {

/// Function pointers into one loaded libnvrtc. Immutable after load(), so any number of
/// threads may call through it.
struct NvrtcApi {
  decltype(&::nvrtcVersion) version = nullptr;
  decltype(&::nvrtcGetNumSupportedArchs) get_num_supported_archs = nullptr;
  decltype(&::nvrtcGetSupportedArchs) get_supported_archs = nullptr;
  decltype(&::nvrtcCreateProgram) create_program = nullptr;
  decltype(&::nvrtcDestroyProgram) destroy_program = nullptr;
  decltype(&::nvrtcAddNameExpression) add_name_expression = nullptr;
  decltype(&::nvrtcCompileProgram) compile_program = nullptr;
  decltype(&::nvrtcGetLoweredName) get_lowered_name = nullptr;
  decltype(&::nvrtcGetProgramLogSize) get_program_log_size = nullptr;
  decltype(&::nvrtcGetProgramLog) get_program_log = nullptr;
  decltype(&::nvrtcGetCUBINSize) get_cubin_size = nullptr;
  decltype(&::nvrtcGetCUBIN) get_cubin = nullptr;
  decltype(&::nvrtcGetPTXSize) get_ptx_size = nullptr;
  decltype(&::nvrtcGetPTX) get_ptx = nullptr;
  decltype(&::nvrtcGetErrorString) get_error_string = nullptr;

  /// Resolves every entry point from `library`; throws CompileError naming the first missing
  /// symbol and `library_name`.
  static NvrtcApi load(const support::DynamicLibrary& library, const std::string& library_name);

  /// "NVRTC_ERROR_COMPILATION (6)".
  std::string describe(nvrtcResult result) const;
};

/// An nvrtcProgram owned by RAII. Move-only; the destructor never throws.
class Program {
 public:
  /// Creates a program; throws CompileError when NVRTC refuses.
  Program(const NvrtcApi& api, const char* source, const char* name, int num_headers,
          const char* const* headers, const char* const* include_names);
  ~Program();
  Program(Program&& other) noexcept;
  Program& operator=(Program&& other) noexcept;
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcProgram get() const noexcept { return program_; }

 private:
  void reset() noexcept;

  const NvrtcApi* api_ = nullptr;
  nvrtcProgram program_ = nullptr;
};

}  // namespace kjit::compile
