// SPDX-License-Identifier: Apache-2.0
// Programmatic dependent launch (sm_90 and later): a kernel launched with the driver's
// PROGRAMMATIC_STREAM_SERIALIZATION attribute may start while the kernel before it in the
// stream is still running, once every block of that kernel has started (or called
// allow_dependent_launch). Work that reads only what was written before that kernel began
// (the caller's inputs) can then overlap its tail; anything it wrote is read only after
// wait_for_previous_grid. On older targets, and when the launch did not ask for the overlap,
// both calls do nothing. NVRTC-clean.
#pragma once

namespace kjit {
namespace grid_dependency {

#if !defined(KJIT_EMULATED_PTX)  // tests/common/sm90_emulation.hpp defines these on the CPU
/// Lets the next kernel in the stream start once every block of this one has called this or
/// exited. Its results are still only visible to that kernel after its wait_for_previous_grid.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/// Blocks until the kernels this one was launched after have completed and their memory
/// operations are visible. Returns at once when there are none.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

#endif
}  // namespace grid_dependency
}  // namespace kjit
