// SPDX-License-Identifier: Apache-2.0
// What a fuzz target reports when an invariant fails: a message and abort(), which both
// libFuzzer and the replay driver treat as a crash and save or print the input of.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kjit::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "kjit fuzz invariant failed: %s\n", what.c_str());
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

}  // namespace kjit::fuzz
