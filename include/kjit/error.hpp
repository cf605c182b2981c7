// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <stdexcept>
#include <string>

namespace kjit {

/// Base of every exception kjit throws. Messages name the argument, its value and what is
/// accepted, so they can be shown to a user unchanged.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A caller-supplied argument (shape, dtype, stride, pointer, option) is not acceptable.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// No legal launch exists for the problem on this device; names the limit, the requested and
/// the allowed value.
class PlanError : public Error {
 public:
  using Error::Error;
};

/// NVRTC rejected a specialization, or NVRTC itself could not be loaded.
class CompileError : public Error {
 public:
  CompileError(const std::string& message, std::string log = {}, std::string options = {},
               std::string spec = {})
      : Error(message),
        log_(std::move(log)),
        options_(std::move(options)),
        spec_(std::move(spec)) {}
  /// The NVRTC log with locations mapped back to template file:line.
  const std::string& log() const noexcept { return log_; }
  /// The compile options, space separated.
  const std::string& options() const noexcept { return options_; }
  /// The canonical text of the spec that failed.
  const std::string& spec() const noexcept { return spec_; }

 private:
  std::string log_;
  std::string options_;
  std::string spec_;
};

/// The kernel cache or a bundle could not be used as asked (bad root, corrupt bundle).
class CacheError : public Error {
 public:
  using Error::Error;
};

/// A CUDA driver call failed, or the driver could not be loaded.
class DriverError : public Error {
 public:
  DriverError(const std::string& message, int result = 0, std::string call = {})
      : Error(message), result_(result), call_(std::move(call)) {}
  /// The CUresult value (0 when the driver could not be loaded at all).
  int result() const noexcept { return result_; }
  /// The driver call that failed, e.g. "cuLaunchKernelEx".
  const std::string& call() const noexcept { return call_; }

 private:
  int result_;
  std::string call_;
};

/// JIT is disabled (KJIT_DISABLE_JIT=1) and neither a bundle nor the disk cache holds the
/// requested kernel.
class KernelNotInBundle : public Error {
 public:
  using Error::Error;
};

}  // namespace kjit
