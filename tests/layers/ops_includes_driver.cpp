// SPDX-License-Identifier: Apache-2.0
// Must NOT compile: the ops layer does not declare the driver layer (it reaches devices,
// workspaces and launches through the runtime). tests/layers/CMakeLists.txt expects a failure.
#include "driver/context.hpp"
