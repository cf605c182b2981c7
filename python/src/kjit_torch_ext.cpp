// SPDX-License-Identifier: Apache-2.0
// kjit._kjit_torch: reads torch tensors through libtorch's C++ API (tens of nanoseconds per
// tensor, against ~0.6 us for the six Python attribute calls of _kjit's attribute path) and
// hands the reader to _kjit as plain function pointers in a PyCapsule (torch_fastpath.hpp).
// Built only when torch is importable at build time, linked against torch's libraries, which
// are already loaded when this module is imported (kjit imports torch first).
//
// Anything this reader does not recognize it declines (returns 1), and _kjit falls back to the
// attribute path: that path defines the behaviour and the error messages, this one only
// reproduces its results faster for the plain cases.
#include <Python.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/python_variable.h>

// at::empty: included on its own, since torch 2.11's python_variable.h does not bring it in.
#include <ATen/ops/empty.h>

#include <cstdint>

#include "kjit/types.hpp"
#include "torch_fastpath.hpp"

namespace kjit::python {
namespace {

/// The same mapping as kjit/__init__.py gives the attribute path; anything else is declined,
/// so that the attribute path raises its "has dtype ..." error.
bool to_dtype(c10::ScalarType type, DType* out) {
  switch (type) {
    case c10::ScalarType::Half:
      *out = DType::f16;
      return true;
    case c10::ScalarType::BFloat16:
      *out = DType::bf16;
      return true;
    case c10::ScalarType::Float:
      *out = DType::f32;
      return true;
    case c10::ScalarType::Double:
      *out = DType::f64;
      return true;
    case c10::ScalarType::Int:
      *out = DType::i32;
      return true;
    case c10::ScalarType::Long:
      *out = DType::i64;
      return true;
    case c10::ScalarType::Byte:
    case c10::ScalarType::Bool:
      *out = DType::u8;
      return true;
    case c10::ScalarType::Float8_e4m3fn:
      *out = DType::e4m3;
      return true;
    default:
      return false;
  }
}

/// Tensors whose Python attributes may differ from what their TensorImpl says directly: these
/// go through the attribute path (torch function/dispatch overrides, functorch and
/// functionalization wrappers, whose data_ptr() raises or means something else).
bool is_wrapped(const at::Tensor& t) {
  const c10::DispatchKeySet keys = t.key_set();
  return keys.has_any(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                           c10::DispatchKey::Functionalize, c10::DispatchKey::FuncTorchBatched,
                           c10::DispatchKey::FuncTorchGradWrapper}));
}

int read_tensor(PyObject* obj, TensorView* view, int* device) noexcept {
  // Exactly torch.Tensor or torch.nn.Parameter: a subclass may override the attributes.
  if (!THPVariable_CheckExact(obj)) return 1;
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined() || t.layout() != c10::kStrided || t.is_nested() || !t.has_storage() ||
        is_wrapped(t)) {
      return 1;
    }
    TensorView v;
    if (!to_dtype(t.scalar_type(), &v.dtype)) return 1;
    const c10::IntArrayRef sizes = t.sizes();
    const c10::IntArrayRef strides = t.strides();
    if (sizes.size() > static_cast<size_t>(kMaxRank) || strides.size() != sizes.size()) return 1;
    v.rank = static_cast<int>(sizes.size());
    for (int i = 0; i < v.rank; ++i) {
      v.shape[i] = sizes[static_cast<size_t>(i)];
      v.strides[i] = strides[static_cast<size_t>(i)];
    }
    // data_ptr(), not const_data_ptr(): what Tensor.data_ptr() returns (it materializes a
    // lazily copied tensor, which matters since kjit writes through outputs).
    v.data = t.data_ptr();
    const c10::Device where = t.device();
    *device = where.is_cuda() ? static_cast<int>(where.index()) : -1;
    *view = v;
    return 0;
  } catch (...) {
    return 1;  // c10::Error and friends: the attribute path raises the Python-level error
  }
}

int current_stream(int device, void** stream) noexcept {
  // c10's device-guard registry instead of c10::cuda::getCurrentCUDAStream: the same stream
  // (CUDAGuardImpl::getStream is getCurrentCUDAStream) without the CUDA toolkit headers that
  // c10/cuda needs, which torch's wheel does not ship.
  try {
    if (device < 0) return 1;
    const c10::impl::DeviceGuardImplInterface* impl =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    const c10::Stream s =
        impl->getStream(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    *stream = impl->getStreamNativeHandle(s);
    return 0;
  } catch (...) {
    return 1;
  }
}

/// kjit's dtypes as torch scalar types; false for those torch has no type for here.
bool to_scalar_type(int dtype, c10::ScalarType* out) {
  switch (static_cast<DType>(dtype)) {
    case DType::f16:
      *out = c10::ScalarType::Half;
      return true;
    case DType::bf16:
      *out = c10::ScalarType::BFloat16;
      return true;
    case DType::f32:
      *out = c10::ScalarType::Float;
      return true;
    case DType::f64:
      *out = c10::ScalarType::Double;
      return true;
    case DType::i32:
      *out = c10::ScalarType::Int;
      return true;
    case DType::i64:
      *out = c10::ScalarType::Long;
      return true;
    default:
      return false;
  }
}

int new_empty(PyObject* like, const std::int64_t* shape, int rank, int dtype,
              PyObject** out) noexcept {
  if (!THPVariable_CheckExact(like)) return 1;
  try {
    const at::Tensor& t = THPVariable_Unpack(like);
    if (!t.defined() || t.layout() != c10::kStrided || is_wrapped(t)) return 1;
    c10::TensorOptions options = t.options();
    if (dtype >= 0) {
      c10::ScalarType type{};
      if (!to_scalar_type(dtype, &type)) return 1;
      options = options.dtype(type);
    }
    // torch.empty(shape, dtype=..., device=like.device): no autograd history, contiguous.
    options = options.requires_grad(false).memory_format(c10::MemoryFormat::Contiguous);
    at::Tensor made = at::empty(c10::IntArrayRef(shape, static_cast<size_t>(rank)), options);
    *out = THPVariable_Wrap(std::move(made));
    return *out == nullptr ? -1 : 0;
  } catch (...) {
    return 1;  // the Python allocator raises the error, if there is one
  }
}

const TorchFastPath g_table = {kTorchFastPathAbi, &read_tensor, &current_stream, &new_empty};

PyModuleDef g_module = {
    PyModuleDef_HEAD_INIT,
    "_kjit_torch",
    "kjit: torch tensor reader for the kjit extension (exports a PyCapsule 'fastpath')",
    -1,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
    nullptr,
};

}  // namespace
}  // namespace kjit::python

PyMODINIT_FUNC PyInit__kjit_torch() {
  using namespace kjit::python;
  PyObject* module = PyModule_Create(&g_module);
  if (module == nullptr) return nullptr;
  // The capsule holds a pointer to a static table: no destructor needed.
  PyObject* capsule =
      PyCapsule_New(const_cast<TorchFastPath*>(&g_table), kTorchFastPathCapsule, nullptr);
  if (capsule == nullptr || PyModule_AddObject(module, "fastpath", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
