// SPDX-License-Identifier: Apache-2.0
// mbarrier and bulk-copy primitives of sm_90 (PTX ISA 8.0): shared-memory transaction barriers
// and global -> shared copies by the bulk copy engine (cp.async.bulk) that complete on one. The
// one set of them for every template (gdn_decode's bulk mode uses them); defined for sm_90 and
// later only, so a template calls them under the same __CUDA_ARCH__ guard. NVRTC-clean.
#pragma once

#include "templates/common/types.h"

namespace kjit {
namespace mbarrier {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(KJIT_EMULATED_PTX)
__device__ __forceinline__ u32 smem_address(const void* ptr) {
  return static_cast<u32>(__cvta_generic_to_shared(ptr));
}
/// Initializes the barrier at `bar` (shared, 8-byte aligned) to expect `count` arrivals.
__device__ __forceinline__ void init(u64* bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count)
               : "memory");
}
/// Makes initialized barriers visible to the async proxy (the bulk copies complete on them).
__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}
/// Arrives and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void arrive_expect_tx(u64* bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)),
               "r"(bytes)
               : "memory");
}
/// Arrives on `bar` once every cp.async this thread issued before has completed (the barrier's
/// expected count includes this arrival: .noinc).
__device__ __forceinline__ void cp_async_arrive_noinc(u64* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" ::"r"(smem_address(bar))
               : "memory");
}
/// Spins until the phase of parity `parity` has completed.
__device__ __forceinline__ void wait(u64* bar, u32 parity) {
  u32 done = 0;
  do {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(smem_address(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
/// L2 policy for data read once: evicted first, so q/k/v and gates stay resident.
__device__ __forceinline__ u64 evict_first_policy() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
/// Global -> shared bulk copy of `bytes` (multiple of 16, both addresses 16-byte aligned),
/// completing `bytes` transactions on `bar`.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, u32 bytes, u64* bar,
                                          u64 policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(smem_address(dst)),
      "l"(src), "r"(bytes), "r"(smem_address(bar)), "l"(policy)
      : "memory");
}
#endif

}  // namespace mbarrier
}  // namespace kjit
