// SPDX-License-Identifier: Apache-2.0
// Umbrella header: the whole public API of kjit.
#pragma once

#include "kjit/catalog.hpp"
#include "kjit/device.hpp"
#include "kjit/error.hpp"
#include "kjit/plan.hpp"
#include "kjit/runtime.hpp"
#include "kjit/settings.hpp"
#include "kjit/source.hpp"
#include "kjit/spec.hpp"
#include "kjit/types.hpp"
#include "kjit/version.hpp"
