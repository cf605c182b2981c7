// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: the cache layer sits below the runtime and shares CompiledKernel with it
// through kjit/kernel.hpp, never the runtime's facade. tests/layers/CMakeLists.txt expects a
// failure.
#include "kjit/runtime.hpp"
