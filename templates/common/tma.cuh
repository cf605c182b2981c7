// SPDX-License-Identifier: Apache-2.0
// Tensor-map copies of sm_90 (cp.async.bulk.tensor, PTX ISA 8.0): a box of a tensor in global
// memory into shared memory by the copy engine, completing its bytes on an mbarrier, and a box
// of shared memory out to global memory in a bulk group, with the swizzle the map names. The map is
// the generic address of a __grid_constant__ kernel parameter. Defined for sm_90 and later only
// (templates call them under the same guard); NVRTC-clean.
#pragma once

#include "templates/common/mbarrier.cuh"
#include "templates/common/tensor_map.h"
#include "templates/common/types.h"

namespace kjit {
namespace tma {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(KJIT_EMULATED_PTX)
/// Fetches the map's 128 bytes into the SM's descriptor cache ahead of its first copy.
__device__ __forceinline__ void prefetch_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<u64>(map)) : "memory");
}
/// The box of a 3-dimensional map at coordinates (c0, c1, c2) (c0 the innermost, in elements)
/// into shared memory at `dst` (aligned as the map's swizzle needs: 1024 bytes for 128-byte
/// swizzle), completing its bytes on `bar`. Elements outside the tensor land as zeros.
__device__ __forceinline__ void load_3d(void* dst, const TensorMap* map, int c0, int c1, int c2,
                                        u64* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];" ::"r"(mbarrier::smem_address(dst)),
      "l"(reinterpret_cast<u64>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(mbarrier::smem_address(bar))
      : "memory");
}
/// The box of a 3-dimensional map at (c0, c1, c2) from shared memory at `src` (laid out and
/// aligned as the map's swizzle says) to global memory, in this thread's open bulk group;
/// elements outside the tensor are not written. The writes into `src` before it must be made
/// visible to the async proxy first (fence.proxy.async: wgmma::fence_shared_writes).
__device__ __forceinline__ void store_3d(const TensorMap* map, int c0, int c1, int c2,
                                         const void* src) {
  asm volatile(
      "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
          reinterpret_cast<u64>(map)),
      "r"(mbarrier::smem_address(src)), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
/// Closes this thread's open bulk group (the stores issued since the last commit).
__device__ __forceinline__ void commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
/// Waits until at most kPending of this thread's bulk groups are still reading shared memory:
/// their source tiles may be rewritten.
template <int kPending>
__device__ __forceinline__ void wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
/// Waits until at most kPending of this thread's bulk groups are incomplete (their global writes
/// done).
template <int kPending>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
}
#endif

}  // namespace tma
}  // namespace kjit
