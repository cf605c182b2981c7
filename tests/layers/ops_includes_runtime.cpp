// SPDX-License-Identifier: Apache-2.0
// Must compile: the control of the two probes that must not. The ops layer declares the runtime
// and the plan layer, so this include set builds with the ops layer's flags.
#include "kjit/runtime.hpp"
#include "ops/op.hpp"
#include "plan/limits.hpp"
