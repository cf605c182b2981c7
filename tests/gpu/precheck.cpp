// SPDX-License-Identifier: Apache-2.0
// The GPU suite runs only where a CUDA driver and a device exist; elsewhere it exits 77 (ctest:
// skipped) after printing why.
#include <string>

#include "common/gpu.hpp"

bool kjit_suite_precheck(std::string* why) {
  std::string reason;
  if (!kjit::driver::driver_loadable(std::getenv("KJIT_CUDA_DRIVER_LIBRARY") != nullptr
                                         ? std::getenv("KJIT_CUDA_DRIVER_LIBRARY")
                                         : "",
                                     &reason)) {
    *why = "GPU suite skipped: " + reason;
    return false;
  }
  int count = 0;
  if (kjit::test::cu().cuDeviceGetCount(&count) != CUDA_SUCCESS || count <= kjit::test::device()) {
    *why = fmt::format("GPU suite skipped: {} CUDA device(s), the suite needs device {}", count,
                       kjit::test::device());
    return false;
  }
  return true;
}
