// SPDX-License-Identifier: Apache-2.0
// Launching through the driver, and what the driver says of functions and streams. Includes
// the context and library helpers, so the runtime needs only this header.
#pragma once

#include <cuda.h>

#include "driver/context.hpp"
#include "driver/driver_api.hpp"
#include "driver/library.hpp"
#include "kjit/plan.hpp"

namespace kjit::driver {

/// Shared memory any function may use without opting in (the driver's default ceiling).
inline constexpr std::uint32_t kDefaultDynamicSmemLimit = 48 * 1024;

/// What the driver says of a loaded function (cuFuncGetAttribute): max threads per block,
/// registers, static shared memory, local bytes and its current dynamic shared-memory maximum.
FunctionLimits function_limits(CUfunction function);

/// Launches `function` with cuLaunchKernelEx on `stream` with the kernel parameter pointers
/// `args`. `static_smem`: the function's static shared memory (FunctionLimits::static_smem);
/// when it and the dynamic shared memory together pass 48 KiB, MAX_DYNAMIC_SHARED_SIZE_BYTES is
/// raised first (once per function and size, then cached). Does not check the shape: the
/// planner's require_legal() does that before. Throws DriverError naming the call, the result
/// and the shape; is_sticky(error.result()) tells whether the context is lost.
void launch(CUfunction function, const LaunchShape& shape, std::uint32_t static_smem,
            CUstream stream, void** args);

/// Whether `result` is a device fault that leaves the context unusable: every later call in the
/// process fails with it (illegal address, launch failed, illegal instruction, misaligned
/// address, hardware stack error, assert, ...). Such errors need a process restart.
bool is_sticky(CUresult result) noexcept;

/// Whether `stream` is capturing a graph (an invalidated capture counts: work enqueued now
/// would still belong to it). Throws DriverError when the query itself fails.
bool stream_is_capturing(CUstream stream);

/// Drops launch()'s opt-in record of functions whose library is unloaded. Called by
/// LoadedLibrary; never throws.
void forget_functions(const CUfunction* functions, std::size_t count) noexcept;

}  // namespace kjit::driver
