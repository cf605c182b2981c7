// SPDX-License-Identifier: Apache-2.0
// kjit._kjit's private declarations, shared by the parts of the extension (not installed):
//   tensors.cpp  the torch registration (the attribute path and kjit._kjit_torch's fast path),
//                the torch / DLPack argument readers, torch's current stream, the debug readers;
//   fastcall.cpp the op table's generic path: argument matching and conversion by a row's
//                parameters, output allocation, registration of one function per row;
//   ops.cpp      the op table: one row per op (parameters, documentation, the library call);
//   tools.cpp    plans by shape names (the `kjit plan` vocabulary), prewarm, source, compile;
//   module.cpp   the runtime and its settings, the Python exception classes and their
//                translator, and the NB_MODULE body that registers all of the above.
// What only one part uses stays in an anonymous namespace there.
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cctype>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kjit/catalog.hpp"
#include "kjit/kjit.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"
#include "kjit/ops/qk_l2norm.hpp"
#include "torch_fastpath.hpp"

namespace nb = nanobind;

namespace kjit::python {

using OptStr = std::optional<std::string>;

// ---------------------------------------------------------------------------------------------
// Runtime (module.cpp)

/// The runtime every op of this module uses (replaced by configure()).
Runtime& runtime();

// ---------------------------------------------------------------------------------------------
// Tensors (tensors.cpp)

/// What torch.Tensor looks like, registered by the Python package when torch is importable.
struct TorchInfo {
  PyTypeObject* tensor_type = nullptr;
  /// torch dtype objects and the DType each maps to.
  std::vector<std::pair<PyObject*, DType>> dtypes;
  /// torch._C._cuda_getCurrentRawStream(device) -> int, or nullptr.
  PyObject* current_stream = nullptr;
  /// kjit._kjit_torch's C++ reader (torch_fastpath.hpp), or nullptr: then every tensor goes
  /// through the attribute path.
  const TorchFastPath* fast = nullptr;
  /// Whether `fast` is used (the package can turn it off to compare the two paths).
  bool use_fast = false;
};
extern TorchInfo g_torch;

extern PyObject* g_name_data_ptr;
extern PyObject* g_name_stride;
extern PyObject* g_name_get_device;
extern PyObject* g_name_shape;
extern PyObject* g_name_dtype;
extern PyObject* g_name_is_cuda;

void register_torch(nb::handle tensor_type, std::vector<std::pair<nb::handle, std::string>> dtypes,
                    nb::handle current_stream);
/// Takes kjit._kjit_torch's capsule; the table it points to is static in that module, which is
/// kept alive by the reference held here.
void register_torch_fastpath(nb::handle capsule);
/// Turns the fast path on or off (None: unchanged); returns whether it is in use. It cannot be
/// turned on before register_torch_fastpath.
bool torch_fastpath(std::optional<bool> enable);

/// One tensor argument after conversion.
struct Arg {
  TensorView view;
  /// CUDA device ordinal; -1 when the tensor is not in CUDA device memory.
  int device = -1;
  bool torch = false;
  /// How it was read: "fast" (kjit._kjit_torch), "attributes" (torch's Python attributes) or
  /// "dlpack"; the tests check that the fast path really handled what they compare.
  const char* via = "dlpack";
};

[[noreturn]] void bad(const char* op, const char* name, const std::string& what);
Arg to_arg(const char* op, const char* name, nb::handle obj);
/// torch's current stream on `device` (the legacy default stream without torch).
Stream torch_current_stream(int device);

/// The tensors of one call: converted, and on one CUDA device unless only planning.
class Args {
 public:
  Args(const char* op, bool require_cuda) : op_(op), require_cuda_(require_cuda) {}

  TensorView get(const char* name, nb::handle obj) {
    Arg arg = to_arg(op_, name, obj);
    if (!require_cuda_) {
      // Planning: the first CUDA tensor names the device to plan for (when no arch is given).
      if (device_ < 0) device_ = arg.device;
    } else {
      if (arg.device < 0) {
        bad(op_, name,
            "is not in CUDA device memory; accepted: a tensor on a CUDA device (planning with "
            "kjit.plan_call accepts host arrays)");
      }
      if (device_ < 0) {
        device_ = arg.device;
        first_ = name;
      } else if (arg.device != device_) {
        bad(op_, name,
            "is on CUDA device " + std::to_string(arg.device) + " but " + first_ +
                " is on device " + std::to_string(device_) + "; accepted: all on one device");
      }
    }
    torch_ = torch_ || arg.torch;
    return arg.view;
  }
  /// None -> a view without memory (an optional argument left out).
  TensorView optional(const char* name, nb::handle obj) {
    if (obj.is_none()) return TensorView{};
    return get(name, obj);
  }
  int device() const { return device_; }

  /// The stream argument: None -> torch's current stream on the tensors' device (the legacy
  /// default stream when torch is not loaded); an int; or an object with .cuda_stream (torch)
  /// or .ptr (CuPy).
  Stream stream(nb::handle obj) const {
    if (obj.is_none()) return torch_current_stream(device_);
    if (PyLong_Check(obj.ptr())) return static_cast<Stream>(PyLong_AsVoidPtr(obj.ptr()));
    for (const char* attr : {"cuda_stream", "ptr"}) {
      if (nb::hasattr(obj, attr)) {
        return static_cast<Stream>(PyLong_AsVoidPtr(nb::getattr(obj, attr).ptr()));
      }
    }
    nb::str type_name = nb::inst_name(obj);
    throw InvalidArgument(std::string(op_) + ": stream is a " + type_name.c_str() +
                          "; accepted: None (the current torch stream), an int (cudaStream_t), "
                          "a torch.cuda.Stream or a cupy Stream");
  }

 private:
  const char* op_;
  bool require_cuda_;
  int device_ = -1;
  const char* first_ = "";
  bool torch_ = false;
};

/// (data pointer, dtype name, shape, strides, device, how) as an op would read `obj`.
nb::tuple read_tensor(nb::handle obj);
/// Reads every positional argument as an op reads its tensors, and nothing else: the per-tensor
/// cost of the binding without a launch. Returns how many were read.
std::size_t read_args_for_bench(nb::args args);

// ---------------------------------------------------------------------------------------------
// The op table (fastcall.cpp reads arguments, ops.cpp holds the rows): every op a row binds is a
// METH_FASTCALL function kjit.<name> whose arguments one generic reader matches and converts
// from the row's parameter list; the row's `run` reads the tensors and calls the library.

/// How the generic reader takes one parameter.
enum class ParamKind {
  /// A tensor, the stream or an output: passed on as it is (None when not given); the row's
  /// run reads it (tensors through Args, in the order their errors should be reported).
  object,
  /// True or False; a TypeError names anything else.
  flag,
  /// A str (None: the default); a TypeError names anything else.
  text,
  /// A str or None.
  opt_text,
  /// An int or float (None: the default); a TypeError names anything else.
  number,
  /// A number or None.
  opt_number,
  /// An int (None: the default); a TypeError names anything else.
  integer,
  /// A real number that is not a bool (numbers.Real): an InvalidArgument names anything else
  /// ("<op>: <name> = <repr> is a <type>; accepted: a finite number >= 0").
  real,
  /// lse_base: '2', 'e' or a number (2, 2.0, math.e); anything else goes on as its str().
  lse_base,
  /// _plan: return the Plan without launching (True or False).
  plan,
  /// _arch: a str or None, read only when planning (a TypeError names anything else).
  arch,
  /// _arch, checked on every call as kjit.plan checks its arch (an InvalidArgument).
  checked_arch,
};

/// One parameter of an op binding.
struct Param {
  const char* name;
  ParamKind kind;
  /// The default as Python spells it in the signature ("None", "'token_major'", "True", "20.0");
  /// nullptr: required. The reader's typed default is parsed from it once, at import.
  const char* fallback = nullptr;
};

/// One argument after the generic reader: the object (borrowed; Py_None when not given) and,
/// for the option kinds, its converted value.
struct Value {
  PyObject* obj = nullptr;
  bool flag = false;
  double number = 0.0;
  std::int64_t integer = 0;
  bool none = true;       // opt_text / opt_number / lse_base / arch: None
  std::string_view text;  // text kinds: a view of the str's UTF-8 (or of the default)
};

struct OpBinding;

/// The arguments of one call of an op binding.
class Call {
 public:
  static constexpr std::size_t kMaxParams = 32;
  Call(const OpBinding& op, bool plan) : op_(op), plan_(plan), args_(op_name(op), !plan) {}

  const char* op() const { return op_name(op_); }
  /// The object of parameter i: Py_None when it was not given.
  nb::handle obj(std::size_t i) const { return values_[i].obj; }
  bool given(std::size_t i) const { return values_[i].obj != Py_None; }
  bool flag(std::size_t i) const { return values_[i].flag; }
  double number(std::size_t i) const { return values_[i].number; }
  std::int64_t integer(std::size_t i) const { return values_[i].integer; }
  std::optional<double> opt_number(std::size_t i) const {
    if (values_[i].none) return std::nullopt;
    return values_[i].number;
  }
  std::string text(std::size_t i) const { return std::string(values_[i].text); }
  OptStr opt_text(std::size_t i) const {
    if (values_[i].none) return std::nullopt;
    return text(i);
  }
  /// Parameter i (an `object` parameter) read as a str now, `fallback` when None or not given:
  /// for an option that only matters with others (a TypeError names anything but a str).
  std::string text_or(std::size_t i, const char* fallback) const;
  bool plan() const { return plan_; }
  /// The tensors of the call (on one CUDA device unless planning).
  Args& args() { return args_; }
  /// The device limits a plan is made for: _arch, else the tensors' device.
  DeviceLimits limits();
  /// The stream argument (stream), as Args::stream reads it.
  Stream stream();

 private:
  friend PyObject* call_op(const OpBinding&, PyObject* const*, Py_ssize_t, PyObject*) noexcept;
  static const char* op_name(const OpBinding& op);
  const OpBinding& op_;
  bool plan_;
  Value values_[kMaxParams];
  /// str() of an lse_base given as another object, alive for the call.
  nb::object keep_;
  Args args_;
};

/// An op as Python calls it: kjit.<name>(...).
struct OpBinding {
  const char* name;
  std::vector<Param> params;
  /// The first `positional` parameters may be passed by position; the first `required` must be
  /// given; the rest are keyword-only.
  std::size_t positional;
  std::size_t required;
  /// The documentation after the signature (which is made from `params`).
  const char* doc;
  /// Reads the tensors and calls the library: the Plan when planning, else the outputs.
  nb::object (*run)(Call& call);

  // Filled at import (register_ops).
  std::size_t plan_at = 0, arch_at = 0, stream_at = 0;
  std::vector<PyObject*> interned;
  std::vector<Value> defaults;
  std::string docstring;
  PyMethodDef method{};
};

/// Every op binding. A row whose name starts with '_' is the extension's own (a Python function
/// of the package wraps it); the others are kjit.<name> as they are.
std::vector<OpBinding>& op_bindings();
/// Matches and converts the arguments of one call by `op`'s parameters and runs it.
PyObject* call_op(const OpBinding& op, PyObject* const* args, Py_ssize_t nargsf,
                  PyObject* kwnames) noexcept;
/// Adds one METH_FASTCALL function per row to the module, and _bound_ops() listing the rows'
/// names in the table's order.
void register_ops(nb::module_& m);

/// An output the caller did not give: on `like`'s device and from its library, of `shape_of`'s
/// shape, of dtype `forced` when given, else `dtype` (None: like's; a torch dtype; a name).
nb::object allocate_like(nb::handle like, const TensorView& shape_of, nb::handle dtype,
                         std::optional<DType> forced = std::nullopt);
void register_allocator(nb::handle allocate);
/// A plan target: arch text (offline, built-in limits) or None for the tensors' device.
DeviceLimits plan_limits(const std::optional<std::string>& arch, int device);

// ---------------------------------------------------------------------------------------------
// Plans by shape names, prewarm, source, compile (tools.cpp)

const OpInfo& find_catalog_op(const std::string& name);
Plan plan_shape(const std::string& op_name, const std::map<std::string, std::string>& values,
                const OptStr& arch, std::optional<int> device);
std::vector<std::string> prewarm_specs(const std::vector<std::string>& specs, int device);
int current_device();
std::string source(const std::string& spec_text, bool templates);
nb::dict compile(const std::string& spec_text);

// ---------------------------------------------------------------------------------------------
// Exceptions (module.cpp)

/// The exception translator: a kjit error becomes the Python class of its kind.
void translate(const std::exception_ptr& p, void*);

}  // namespace kjit::python
