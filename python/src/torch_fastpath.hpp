// SPDX-License-Identifier: Apache-2.0
// The interface between kjit._kjit and kjit._kjit_torch: plain function pointers with kjit and
// CPython types only, handed over in a PyCapsule. _kjit must build and import where torch is
// absent, so it never includes torch headers; _kjit_torch (built only when torch is found at
// build time) reads at::Tensor directly and exports these functions.
#pragma once

#include <Python.h>

#include <cstdint>

#include "kjit/types.hpp"

namespace kjit::python {

/// Reads a torch tensor's pointer, dtype, shape and strides into *view and its CUDA device
/// ordinal (-1 when not a CUDA tensor) into *device, exactly as the attribute path of _kjit
/// would. Returns 0 when read; 1 when this tensor is not handled here (a subclass, a wrapper
/// without storage, an unsupported dtype or rank, anything unusual): the caller then uses the
/// attribute path, which is also what raises the error messages, so that they stay identical;
/// -1 with a Python error set. Never throws.
using ReadTorchTensorFn = int (*)(PyObject* obj, TensorView* view, int* device);

/// torch's current CUDA stream on `device` into *stream (cudaStream_t as void*). Returns 0
/// when read; 1 when not available here (the caller asks torch through Python). Never throws.
using CurrentStreamFn = int (*)(int device, void** stream);

/// A new contiguous tensor of `shape` (rank dims) on `like`'s device, of dtype `dtype` (a
/// kjit::DType value) or like's dtype when dtype < 0, into *out (a new reference). Returns 0
/// when made; 1 when not handled here (the caller allocates through Python); -1 with a Python
/// error set. Never throws.
using NewEmptyFn = int (*)(PyObject* like, const std::int64_t* shape, int rank, int dtype,
                           PyObject** out);

/// What the capsule points to; the structure lives as long as the _kjit_torch module (which
/// is never unloaded once imported).
struct TorchFastPath {
  /// kTorchFastPathAbi of the side that built it: _kjit refuses a mismatching table (an
  /// installed _kjit_torch from another build).
  int abi;
  ReadTorchTensorFn read_tensor;
  CurrentStreamFn current_stream;
  NewEmptyFn new_empty;
};

/// Bumped whenever TorchFastPath, TensorView or DType change layout or meaning.
inline constexpr int kTorchFastPathAbi = 2;

/// The capsule's name (PyCapsule_GetPointer checks it).
inline constexpr const char* kTorchFastPathCapsule = "kjit._kjit_torch.fastpath";

}  // namespace kjit::python
