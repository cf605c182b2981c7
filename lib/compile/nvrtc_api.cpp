// SPDX-License-Identifier: Apache-2.0
#include "compile/nvrtc_api.hpp"

#include <fmt/format.h>

#include <utility>

#include "kjit/error.hpp"

namespace kjit::compile {
namespace {

template <typename Fn>
void resolve(const support::DynamicLibrary& library, const std::string& library_name,
             const char* symbol, Fn* out) {
  void* address = library.symbol(symbol);
  if (address == nullptr) {
    throw CompileError(fmt::format(
        "{} was loaded as NVRTC but has no symbol {}; it is too old or not libnvrtc (set "
        "KJIT_NVRTC_LIBRARY to the path of libnvrtc.so.13)",
        library_name, symbol));
  }
  // dlsym returns data pointers; POSIX guarantees the conversion to a function pointer.
  *out = reinterpret_cast<Fn>(address);
}

}  // namespace

NvrtcApi NvrtcApi::load(const support::DynamicLibrary& library, const std::string& library_name) {
  NvrtcApi api;
  resolve(library, library_name, "nvrtcVersion", &api.version);
  resolve(library, library_name, "nvrtcGetNumSupportedArchs", &api.get_num_supported_archs);
  resolve(library, library_name, "nvrtcGetSupportedArchs", &api.get_supported_archs);
  resolve(library, library_name, "nvrtcCreateProgram", &api.create_program);
  resolve(library, library_name, "nvrtcDestroyProgram", &api.destroy_program);
  resolve(library, library_name, "nvrtcAddNameExpression", &api.add_name_expression);
  resolve(library, library_name, "nvrtcCompileProgram", &api.compile_program);
  resolve(library, library_name, "nvrtcGetLoweredName", &api.get_lowered_name);
  resolve(library, library_name, "nvrtcGetProgramLogSize", &api.get_program_log_size);
  resolve(library, library_name, "nvrtcGetProgramLog", &api.get_program_log);
  resolve(library, library_name, "nvrtcGetCUBINSize", &api.get_cubin_size);
  resolve(library, library_name, "nvrtcGetCUBIN", &api.get_cubin);
  resolve(library, library_name, "nvrtcGetPTXSize", &api.get_ptx_size);
  resolve(library, library_name, "nvrtcGetPTX", &api.get_ptx);
  resolve(library, library_name, "nvrtcGetErrorString", &api.get_error_string);
  return api;
}

std::string NvrtcApi::describe(nvrtcResult result) const {
  const char* name = get_error_string != nullptr ? get_error_string(result) : nullptr;
  return fmt::format("{} ({})", name != nullptr ? name : "unknown NVRTC error",
                     static_cast<int>(result));
}

Program::Program(const NvrtcApi& api, const char* source, const char* name, int num_headers,
                 const char* const* headers, const char* const* include_names)
    : api_(&api) {
  const nvrtcResult result =
      api.create_program(&program_, source, name, num_headers, headers, include_names);
  if (result != NVRTC_SUCCESS) {
    program_ = nullptr;
    throw CompileError(
        fmt::format("nvrtcCreateProgram failed for {}: {}", name, api.describe(result)));
  }
}

Program::~Program() { reset(); }

Program::Program(Program&& other) noexcept
    : api_(other.api_), program_(std::exchange(other.program_, nullptr)) {}

Program& Program::operator=(Program&& other) noexcept {
  if (this != &other) {
    reset();
    api_ = other.api_;
    program_ = std::exchange(other.program_, nullptr);
  }
  return *this;
}

void Program::reset() noexcept {
  // nvrtcDestroyProgram can only fail for an invalid handle, which RAII rules out; a
  // destructor has nowhere to report it anyway.
  if (program_ != nullptr) api_->destroy_program(&program_);
  program_ = nullptr;
}

}  // namespace kjit::compile
