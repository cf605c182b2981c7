// SPDX-License-Identifier: Apache-2.0
// Asynchronous global -> shared copies of 16 bytes (cp.async.cg, sm_80 and later), with zero
// fill for rows past the end of the data, and the group wait/commit helpers. NVRTC-clean.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace cp_async {

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// Copies 16 bytes from `src` (global, 16-byte aligned) to `dst` (shared, 16-byte aligned);
/// when `valid` is false writes 16 zero bytes instead and reads nothing (src-size 0), so `src`
/// may then be any mapped address.
__device__ __forceinline__ void copy16(void* dst, const void* src, bool valid) {
  const u32 d = static_cast<u32>(__cvta_generic_to_shared(dst));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n)
               : "memory");
}

/// Copies 16 bytes from `src` (global, 16-byte aligned) to `dst` (shared, 16-byte aligned),
/// for copies that are always whole (no zero fill, no source-size operand).
__device__ __forceinline__ void copy16(void* dst, const void* src) {
  const u32 d = static_cast<u32>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}

/// Closes the group of copies issued since the previous commit.
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

#endif

/// For templates that tests/common/cuda_warp_emulation.hpp also compiles as host C++, where a
/// block's threads run as OS threads and nothing is asynchronous: on the device copy16 (16
/// bytes, always whole), commit and wait; on the host a plain copy, and commit and wait have
/// nothing to do. A thread that reads back only its own copies needs nothing else on either.
__device__ __forceinline__ void copy16_portable(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  copy16(dst, src);
#else
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#endif
}
__device__ __forceinline__ void commit_portable() {
#if defined(__CUDA_ARCH__)
  commit();
#endif
}
template <int kPending>
__device__ __forceinline__ void wait_portable() {
#if defined(__CUDA_ARCH__)
  wait<kPending>();
#endif
}

}  // namespace cp_async
}  // namespace kjit
