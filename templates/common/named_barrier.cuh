// SPDX-License-Identifier: Apache-2.0
// Named barriers (bar.sync / bar.arrive on barrier `id` of the 16, for `threads` threads, a
// multiple of 32) as functions, so that their inline PTX sits in one place, which the CPU
// emulation of the warp-specialized kernel replaces (tests/common/sm90_emulation.hpp). Each
// form keeps the immediate / register operands its callers had. NVRTC-clean, sm_70 and later.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace named_barrier {

#if !defined(KJIT_EMULATED_PTX)
/// Waits until `kThreads` threads have arrived at barrier `id` (this one included).
template <int kThreads>
__device__ __forceinline__ void sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(kThreads) : "memory");
}
/// sync with both operands immediate.
template <int kId, int kThreads>
__device__ __forceinline__ void sync() {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kThreads) : "memory");
}
/// sync with the thread count in a register.
template <int kId>
__device__ __forceinline__ void sync_count(u32 threads) {
  asm volatile("bar.sync %0, %1;" ::"n"(kId), "r"(threads) : "memory");
}
/// Counts this thread's arrival at barrier `id` of `kThreads` without waiting.
template <int kThreads>
__device__ __forceinline__ void arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"(kThreads) : "memory");
}
#endif

}  // namespace named_barrier
}  // namespace kjit
