// SPDX-License-Identifier: Apache-2.0
// kjit._kjit, tensors: how op arguments are read (ext.hpp).

#include "ext.hpp"

namespace kjit::python {

// ---------------------------------------------------------------------------------------------
// Tensors
TorchInfo g_torch;

PyObject* g_name_data_ptr = nullptr;
PyObject* g_name_stride = nullptr;
PyObject* g_name_get_device = nullptr;
PyObject* g_name_shape = nullptr;
PyObject* g_name_dtype = nullptr;
PyObject* g_name_is_cuda = nullptr;

void register_torch(nb::handle tensor_type, std::vector<std::pair<nb::handle, std::string>> dtypes,
                    nb::handle current_stream) {
  g_torch.tensor_type = reinterpret_cast<PyTypeObject*>(tensor_type.inc_ref().ptr());
  g_torch.dtypes.clear();
  for (auto& [obj, name] : dtypes) {
    g_torch.dtypes.emplace_back(obj.inc_ref().ptr(), parse_dtype(name));
  }
  g_torch.current_stream = current_stream.is_none() ? nullptr : current_stream.inc_ref().ptr();
}

void register_torch_fastpath(nb::handle capsule) {
  auto* table =
      static_cast<const TorchFastPath*>(PyCapsule_GetPointer(capsule.ptr(), kTorchFastPathCapsule));
  if (table == nullptr) throw nb::python_error();
  if (table->abi != kTorchFastPathAbi) {
    throw InvalidArgument("kjit._kjit_torch was built for fast-path ABI " +
                          std::to_string(table->abi) + ", this extension expects " +
                          std::to_string(kTorchFastPathAbi) + "; reinstall kjit");
  }
  capsule.inc_ref();
  g_torch.fast = table;
  g_torch.use_fast = true;
}

bool torch_fastpath(std::optional<bool> enable) {
  if (enable) g_torch.use_fast = *enable && g_torch.fast != nullptr;
  return g_torch.use_fast;
}

[[noreturn]] void bad(const char* op, const char* name, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + name + " " + what);
}

namespace {

/// The dtypes an argument of this name takes, for the message about a dtype kjit has no name
/// for (int16, complex, ...): listing every dtype kjit knows would suggest that floats fit an
/// index argument. Only reached on that error path.
const char* accepted_dtypes(std::string_view name) {
  for (std::string_view index : {"state_indices", "cu_seqlens", "checkpoint_cu_starts"}) {
    if (name == index) return "int32, int64";
  }
  for (std::string_view mask : {"mask", "has_initial_state"}) {
    if (name == mask) return "bool, uint8";
  }
  if (name == "workspace") return "uint8";
  for (std::string_view lse : {"s_a", "s_b", "s", "s_other", "s_out", "g", "beta"}) {
    if (name == lse) return "float32";
  }
  if (name == "tensor") {  // the debug readers, which take any dtype kjit knows
    return "float16, bfloat16, float32, float64, int32, int64, uint8, bool, float8_e4m3fn";
  }
  return "float16, bfloat16, float32";
}

/// Owned reference that is released at scope exit.
struct Ref {
  PyObject* p;
  explicit Ref(PyObject* obj) : p(obj) {
    if (p == nullptr) throw nb::python_error();
  }
  ~Ref() { Py_XDECREF(p); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
};

void read_dims(const char* op, const char* name, PyObject* tuple, std::int64_t* out, int* rank,
               const char* what) {
  if (!PyTuple_Check(tuple)) bad(op, name, std::string("has a non-tuple ") + what);
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (n > kMaxRank) {
    bad(op, name,
        "has rank " + std::to_string(n) + "; accepted: at most " + std::to_string(kMaxRank) +
            " dimensions");
  }
  *rank = static_cast<int>(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (out[i] == -1 && PyErr_Occurred()) throw nb::python_error();
  }
}

Arg torch_arg(const char* op, const char* name, PyObject* obj) {
  Arg arg;
  arg.torch = true;
  arg.via = "attributes";
  {
    Ref dtype(PyObject_GetAttr(obj, g_name_dtype));
    bool found = false;
    for (const auto& [object, dt] : g_torch.dtypes) {
      if (object == dtype.p) {
        arg.view.dtype = dt;
        found = true;
        break;
      }
    }
    if (!found) {
      Ref text(PyObject_Str(dtype.p));
      bad(op, name,
          std::string("has dtype ") + PyUnicode_AsUTF8(text.p) +
              "; accepted: " + accepted_dtypes(name));
    }
  }
  {
    Ref shape(PyObject_GetAttr(obj, g_name_shape));
    read_dims(op, name, shape.p, arg.view.shape, &arg.view.rank, "shape");
  }
  {
    Ref strides(PyObject_CallMethodNoArgs(obj, g_name_stride));
    int rank = 0;
    read_dims(op, name, strides.p, arg.view.strides, &rank, "stride");
  }
  {
    Ref ptr(PyObject_CallMethodNoArgs(obj, g_name_data_ptr));
    arg.view.data = PyLong_AsVoidPtr(ptr.p);
    if (arg.view.data == nullptr && PyErr_Occurred()) throw nb::python_error();
  }
  {
    // get_device() is -1 for host tensors (the common "not on the GPU" case), which then need
    // no is_cuda; an index >= 0 may still belong to another accelerator (XPU, MPS), hence the
    // is_cuda check only then.
    Ref device(PyObject_CallMethodNoArgs(obj, g_name_get_device));
    const long index = PyLong_AsLong(device.p);
    if (index == -1 && PyErr_Occurred()) throw nb::python_error();
    if (index >= 0) {
      Ref is_cuda(PyObject_GetAttr(obj, g_name_is_cuda));
      if (is_cuda.p == Py_True) arg.device = static_cast<int>(index);
    }
  }
  return arg;
}

DType dlpack_dtype(const char* op, const char* name, nb::dlpack::dtype dt) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(dt.code);
  if (dt.lanes == 1) {
    if (code == Code::Float && dt.bits == 16) return DType::f16;
    if (code == Code::Bfloat && dt.bits == 16) return DType::bf16;
    if (code == Code::Float && dt.bits == 32) return DType::f32;
    if (code == Code::Float && dt.bits == 64) return DType::f64;
    if (code == Code::Int && dt.bits == 32) return DType::i32;
    if (code == Code::Int && dt.bits == 64) return DType::i64;
    if (code == Code::UInt && dt.bits == 8) return DType::u8;
    if (code == Code::Bool && dt.bits == 8) return DType::u8;
  }
  bad(op, name,
      "has DLPack dtype (code " + std::to_string(dt.code) + ", bits " + std::to_string(dt.bits) +
          ", lanes " + std::to_string(dt.lanes) + "); accepted: " + accepted_dtypes(name));
}

Arg dlpack_arg(const char* op, const char* name, nb::handle obj) {
  nb::ndarray<> array;
  if (!nb::try_cast(obj, array)) {
    nb::str type_name = nb::inst_name(obj);
    bad(op, name,
        std::string("is a ") + type_name.c_str() +
            "; accepted: a torch tensor or any object with __dlpack__ (CuPy, JAX, NumPy)");
  }
  Arg arg;
  arg.view.data = array.data();
  arg.view.dtype = dlpack_dtype(op, name, array.dtype());
  if (array.ndim() > static_cast<size_t>(kMaxRank)) {
    bad(op, name,
        "has rank " + std::to_string(array.ndim()) + "; accepted: at most " +
            std::to_string(kMaxRank) + " dimensions");
  }
  arg.view.rank = static_cast<int>(array.ndim());
  for (int i = 0; i < arg.view.rank; ++i) {
    arg.view.shape[i] = static_cast<std::int64_t>(array.shape(static_cast<size_t>(i)));
    arg.view.strides[i] = array.stride(static_cast<size_t>(i));
  }
  if (array.device_type() == nb::device::cuda::value) {
    arg.device = static_cast<int>(array.device_id());
  }
  return arg;
}

}  // namespace

Arg to_arg(const char* op, const char* name, nb::handle obj) {
  if (g_torch.tensor_type != nullptr && PyObject_TypeCheck(obj.ptr(), g_torch.tensor_type)) {
    if (g_torch.use_fast) {
      Arg arg;
      arg.torch = true;
      arg.via = "fast";
      const int read = g_torch.fast->read_tensor(obj.ptr(), &arg.view, &arg.device);
      if (read == 0) return arg;
      if (read < 0) throw nb::python_error();
      // 1: declined; the attribute path reads it or raises the error.
    }
    return torch_arg(op, name, obj.ptr());
  }
  return dlpack_arg(op, name, obj);
}

Stream torch_current_stream(int device) {
  if (device < 0) return nullptr;
  void* handle = nullptr;
  if (g_torch.use_fast && g_torch.fast->current_stream(device, &handle) == 0) {
    return static_cast<Stream>(handle);
  }
  if (g_torch.current_stream == nullptr) return nullptr;
  Ref index(PyLong_FromLong(device));
  Ref raw(PyObject_CallOneArg(g_torch.current_stream, index.p));
  void* stream = PyLong_AsVoidPtr(raw.p);
  if (stream == nullptr && PyErr_Occurred()) throw nb::python_error();
  return static_cast<Stream>(stream);
}

// ---------------------------------------------------------------------------------------------
// Debug entry points: the tests compare the two torch paths on the same tensors, the benchmark
// times them.

nb::tuple read_tensor(nb::handle obj) {
  const Arg arg = to_arg("_read_tensor", "tensor", obj);
  nb::list shape, strides;
  for (int i = 0; i < arg.view.rank; ++i) {
    shape.append(arg.view.shape[i]);
    strides.append(arg.view.strides[i]);
  }
  return nb::make_tuple(reinterpret_cast<std::uintptr_t>(arg.view.data),
                        std::string(to_string(arg.view.dtype)), nb::tuple(shape),
                        nb::tuple(strides), arg.device, arg.via);
}

std::size_t read_args_for_bench(nb::args args) {
  for (nb::handle obj : args) (void)to_arg("_read_args_for_bench", "tensor", obj);
  return args.size();
}

}  // namespace kjit::python
