// SPDX-License-Identifier: Apache-2.0
// The experiments' one error check (they are standalone nvcc programs on the CUDA runtime, not
// part of the build): CK(call) prints the failing call and its error, then exits 1.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                             \
  do {                                                    \
    cudaError_t e = (x);                                  \
    if (e != cudaSuccess) {                               \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                       \
    }                                                     \
  } while (0)
