// SPDX-License-Identifier: Apache-2.0
// The one doctest main. A suite may define kjit_suite_precheck() to skip itself (exit 77 with
// the reason printed), e.g. the GPU suite on a machine without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

// Weak default: suites without a precheck always run.
__attribute__((weak)) bool kjit_suite_precheck(std::string* /*why*/) { return true; }

int main(int argc, char** argv) {
  std::string why;
  if (!kjit_suite_precheck(&why)) {
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
