// SPDX-License-Identifier: Apache-2.0
// kjit._kjit, the op table's generic path (ext.hpp): every row of op_bindings() is one
// METH_FASTCALL function whose arguments are matched and converted here from the row's
// parameter list, then handed to the row's run. A serving engine calls the per-step ops every
// decode step: a Python wrapper plus nanobind's generic dispatch of 13-17 arguments cost about
// 1 us of the 5 us a call may take, so nothing here allocates a Python object or parses text
// per call beyond what the arguments need. Keywords are matched by pointer against interned
// names first (call sites intern their keywords), then by value.

#include <cstdlib>

#include "ext.hpp"

namespace kjit::python {
namespace {

[[noreturn]] void raise_type_error(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

/// The name errors give: a row that a Python function of the package wraps ("_gdn_prefill")
/// speaks as that function ("gdn_prefill").
const char* error_name(const OpBinding& op) { return op.name[0] == '_' ? op.name + 1 : op.name; }

/// Matches a vectorcall's arguments to `op`'s parameters: slots[i] is the i-th parameter's
/// object (borrowed) or nullptr when it was not given.
void match_arguments(const OpBinding& op, PyObject* const* args, Py_ssize_t nargsf,
                     PyObject* kwnames, PyObject** slots) {
  const std::size_t n = op.params.size();
  const auto given = static_cast<std::size_t>(PyVectorcall_NARGS(nargsf));
  if (given > op.positional) {
    raise_type_error(std::string(error_name(op)) + "() takes at most " +
                     std::to_string(op.positional) + " positional arguments (" +
                     std::to_string(given) + " given); the options are keyword-only");
  }
  for (std::size_t i = 0; i < n; ++i) slots[i] = i < given ? args[i] : nullptr;
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < keywords; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    std::size_t found = n;
    for (std::size_t i = 0; i < n && found == n; ++i) {
      if (op.interned[i] == key) found = i;
    }
    for (std::size_t i = 0; i < n && found == n; ++i) {
      if (PyUnicode_Compare(op.interned[i], key) == 0) found = i;
    }
    if (found == n) {
      std::string accepted;
      for (const Param& param : op.params)
        accepted += (accepted.empty() ? "" : ", ") + std::string(param.name);
      raise_type_error(std::string(error_name(op)) + "() got an unexpected keyword argument '" +
                       PyUnicode_AsUTF8(key) + "'; accepted: " + accepted);
    }
    if (slots[found] != nullptr) {
      raise_type_error(std::string(error_name(op)) + "() got multiple values for argument '" +
                       op.params[found].name + "'");
    }
    slots[found] = args[given + static_cast<std::size_t>(k)];
  }
  for (std::size_t i = 0; i < op.required; ++i) {
    if (slots[i] == nullptr) {
      raise_type_error(std::string(error_name(op)) + "() missing required argument '" +
                       op.params[i].name + "'");
    }
  }
}

bool absent(PyObject* obj) { return obj == nullptr || obj == Py_None; }

bool read_flag(const char* op, const char* name, PyObject* obj, bool fallback) {
  if (obj == nullptr) return fallback;
  if (obj == Py_True) return true;
  if (obj == Py_False) return false;
  raise_type_error(std::string(op) + "(): " + name + " must be True or False, got a " +
                   Py_TYPE(obj)->tp_name);
}

std::string_view read_text(const char* op, const char* name, PyObject* obj) {
  Py_ssize_t size = 0;
  const char* text = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &size) : nullptr;
  if (text == nullptr) {
    if (!PyErr_Occurred()) {
      raise_type_error(std::string(op) + "(): " + name + " must be a str, got a " +
                       Py_TYPE(obj)->tp_name);
    }
    throw nb::python_error();
  }
  return std::string_view(text, static_cast<std::size_t>(size));
}

double read_number(const char* op, const char* name, PyObject* obj) {
  const double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_type_error(std::string(op) + "(): " + name + " must be a number, got a " +
                     Py_TYPE(obj)->tp_name);
  }
  return value;
}

std::int64_t read_integer(const char* op, const char* name, PyObject* obj) {
  // An int or an object with __index__ (a NumPy integer); not a float.
  if (!PyLong_Check(obj) && !PyIndex_Check(obj)) {
    raise_type_error(std::string(op) + "(): " + name + " must be an int, got a " +
                     Py_TYPE(obj)->tp_name);
  }
  nb::object index = nb::steal(PyNumber_Index(obj));
  if (!index.is_valid()) throw nb::python_error();
  const long long value = PyLong_AsLongLong(index.ptr());
  if (value == -1 && PyErr_Occurred()) throw nb::python_error();
  return static_cast<std::int64_t>(value);
}

/// numbers.Real, looked up at import (the `real` kind's check of objects that are not a float
/// or an int: numpy scalars, fractions).
PyObject* g_numbers_real = nullptr;

/// A real number that is not a bool, as float() reads it; InvalidArgument otherwise.
double read_real(const char* op, const char* name, PyObject* obj) {
  bool real = !PyBool_Check(obj) && (PyFloat_Check(obj) || PyLong_Check(obj));
  if (!real && !PyBool_Check(obj)) {
    const int is = PyObject_IsInstance(obj, g_numbers_real);
    if (is < 0) throw nb::python_error();
    real = is == 1;
  }
  if (!real) {
    nb::str repr = nb::steal<nb::str>(PyObject_Repr(obj));
    if (!repr.is_valid()) throw nb::python_error();
    nb::str type_name = nb::steal<nb::str>(
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(obj)), "__name__"));
    if (!type_name.is_valid()) throw nb::python_error();
    throw InvalidArgument(std::string(op) + ": " + name + " = " + repr.c_str() + " is a " +
                          type_name.c_str() + "; accepted: a finite number >= 0");
  }
  const double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) throw nb::python_error();
  return value;
}

/// _arch checked as kjit.plan checks its arch.
void check_arch(const char* op, PyObject* obj) {
  if (absent(obj) || PyUnicode_Check(obj)) return;
  nb::str repr = nb::steal<nb::str>(PyObject_Repr(obj));
  if (!repr.is_valid()) throw nb::python_error();
  nb::str type_name = nb::steal<nb::str>(
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(obj)), "__name__"));
  if (!type_name.is_valid()) throw nb::python_error();
  throw InvalidArgument(std::string(op) + ": arch = " + repr.c_str() + " is a " +
                        type_name.c_str() +
                        "; accepted: a str naming an arch or a device, e.g. 'sm_90', 'sm_100a', "
                        "'h100', 'h200'");
}

/// kjit._api._empty(like, shape, dtype): the allocator of outputs not given, where the torch
/// fast path cannot make them (other array libraries, dtypes given by name).
PyObject* g_allocate = nullptr;

/// Runs an entry point body: C++ exceptions become the Python exceptions nanobind would raise.
template <typename Body>
PyObject* guarded(Body&& body) noexcept {
  try {
    return body().release().ptr();
  } catch (nb::python_error& error) {
    error.restore();
  } catch (const Error&) {
    translate(std::current_exception(), nullptr);
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
  return nullptr;
}

PyObject* entry(PyObject* self, PyObject* const* args, Py_ssize_t nargsf,
                PyObject* kwnames) noexcept {
  // self: the capsule register_ops made for the row.
  const auto* op = static_cast<const OpBinding*>(PyCapsule_GetPointer(self, nullptr));
  if (op == nullptr) return nullptr;
  return call_op(*op, args, nargsf, kwnames);
}

/// The typed default of a parameter, from its Python spelling.
Value default_value(const Param& param) {
  Value v;
  v.obj = Py_None;
  const std::string_view text = param.fallback == nullptr ? "None" : param.fallback;
  if (text == "None") return v;
  v.none = false;
  if (text == "True" || text == "False") {
    v.flag = text == "True";
  } else if (text.size() >= 2 && text.front() == '\'' && text.back() == '\'') {
    v.text = text.substr(1, text.size() - 2);
  } else {
    v.number = std::strtod(param.fallback, nullptr);
    v.integer = std::strtoll(param.fallback, nullptr, 10);
  }
  return v;
}

}  // namespace

const char* Call::op_name(const OpBinding& op) { return error_name(op); }

std::string Call::text_or(std::size_t i, const char* fallback) const {
  PyObject* obj = values_[i].obj;
  if (absent(obj)) return fallback;
  return std::string(read_text(op(), op_.params[i].name, obj));
}

DeviceLimits Call::limits() {
  const Value& arch = values_[op_.arch_at];
  return plan_limits(arch.none ? OptStr() : OptStr(std::string(arch.text)), args_.device());
}

Stream Call::stream() { return args_.stream(values_[op_.stream_at].obj); }

DeviceLimits plan_limits(const std::optional<std::string>& arch, int device) {
  if (arch) return DeviceLimits::for_name(*arch);
  return runtime().device_limits(device >= 0 ? device : runtime().current_device());
}

PyObject* call_op(const OpBinding& op, PyObject* const* call_args, Py_ssize_t nargsf,
                  PyObject* kwnames) noexcept {
  return guarded([&]() -> nb::object {
    PyObject* slots[Call::kMaxParams];
    match_arguments(op, call_args, nargsf, kwnames, slots);
    const char* name = error_name(op);
    const bool plan = read_flag(name, "_plan", slots[op.plan_at], false);
    Call call(op, plan);
    if (op.params[op.arch_at].kind == ParamKind::checked_arch) check_arch(name, slots[op.arch_at]);
    // Options first: a wrongly typed option is an error before any tensor is read.
    for (std::size_t i = 0; i < op.params.size(); ++i) {
      const Param& param = op.params[i];
      PyObject* obj = slots[i];
      Value& v = call.values_[i];
      v = op.defaults[i];
      if (obj != nullptr) v.obj = obj;
      switch (param.kind) {
        case ParamKind::object:
        case ParamKind::plan:
          break;
        case ParamKind::flag:
          v.flag = read_flag(name, param.name, obj, v.flag);
          break;
        case ParamKind::text:
          if (!absent(obj)) v.text = read_text(name, param.name, obj);
          break;
        case ParamKind::opt_text:
          v.none = absent(obj);
          if (!v.none) v.text = read_text(name, param.name, obj);
          break;
        case ParamKind::number:
          if (!absent(obj)) v.number = read_number(name, param.name, obj);
          break;
        case ParamKind::opt_number:
          v.none = absent(obj);
          if (!v.none) v.number = read_number(name, param.name, obj);
          break;
        case ParamKind::integer:
          if (!absent(obj)) v.integer = read_integer(name, param.name, obj);
          break;
        case ParamKind::real:
          if (obj != nullptr) v.number = read_real(name, param.name, obj);
          break;
        case ParamKind::lse_base:
          // '2', 'e', or a number: 2 or 2.0 (base 2) and math.e (base e), what people type.
          // Anything else is passed on as its str() and refused by the op's parser, naming it.
          v.none = absent(obj);
          if (v.none) break;
          if (PyFloat_Check(obj) && PyFloat_AS_DOUBLE(obj) == 2.0) {
            v.text = "2";
          } else if (PyFloat_Check(obj) && PyFloat_AS_DOUBLE(obj) == 2.718281828459045) {
            v.text = "e";  // math.e, exactly
          } else {
            call.keep_ = nb::steal(PyObject_Str(obj));
            if (!call.keep_.is_valid()) throw nb::python_error();
            v.text = read_text(name, param.name, call.keep_.ptr());
          }
          break;
        case ParamKind::arch:
          // Read only when planning: a launch ignores it.
          v.none = !plan || absent(obj);
          if (!v.none) v.text = read_text(name, param.name, obj);
          break;
        case ParamKind::checked_arch:  // checked above, before the other options
          v.none = absent(obj);
          if (!v.none) v.text = read_text(name, param.name, obj);
          break;
      }
    }
    return op.run(call);
  });
}

nb::object allocate_like(nb::handle like, const TensorView& shape_of, nb::handle dtype,
                         std::optional<DType> forced) {
  if (g_torch.use_fast && g_torch.fast->new_empty != nullptr) {
    int code = forced ? static_cast<int>(*forced) : -1;
    bool known = forced.has_value() || dtype.is_none();
    for (const auto& [object, dt] : g_torch.dtypes) {
      if (!known && object == dtype.ptr()) {
        code = static_cast<int>(dt);
        known = true;
      }
    }
    if (known) {
      PyObject* made = nullptr;
      const int read =
          g_torch.fast->new_empty(like.ptr(), shape_of.shape, shape_of.rank, code, &made);
      if (read == 0) return nb::steal(made);
      if (read < 0) throw nb::python_error();
    }
  }
  if (g_allocate == nullptr) throw InvalidArgument("kjit: the output allocator is not registered");
  nb::list dims;
  for (int i = 0; i < shape_of.rank; ++i) dims.append(shape_of.shape[i]);
  nb::object dtype_arg =
      forced ? nb::object(nb::str(std::string(to_string(*forced)).c_str())) : nb::borrow(dtype);
  nb::object shape = nb::tuple(dims);
  PyObject* call_args[] = {like.ptr(), shape.ptr(), dtype_arg.ptr()};
  nb::object out = nb::steal(PyObject_Vectorcall(g_allocate, call_args, 3, nullptr));
  if (!out.is_valid()) throw nb::python_error();
  return out;
}

void register_allocator(nb::handle allocate) {
  Py_XDECREF(g_allocate);
  g_allocate = allocate.inc_ref().ptr();
}

void register_ops(nb::module_& m) {
  nb::object numbers = nb::module_::import_("numbers");
  g_numbers_real = numbers.attr("Real").inc_ref().ptr();
  std::vector<std::string> names;
  for (OpBinding& op : op_bindings()) {
    if (op.params.size() > Call::kMaxParams) {
      throw std::logic_error(std::string(op.name) + ": more parameters than Call::kMaxParams");
    }
    // The signature line (inspect.signature and help() read it), from the parameters.
    op.docstring = std::string(op.name) + "($module";
    for (std::size_t i = 0; i < op.params.size(); ++i) {
      const Param& param = op.params[i];
      if (i == op.positional) op.docstring += ", *";
      op.docstring += std::string(", ") + param.name;
      if (param.fallback != nullptr) op.docstring += std::string("=") + param.fallback;
      op.interned.push_back(PyUnicode_InternFromString(param.name));
      op.defaults.push_back(default_value(param));
      const std::string_view name = param.name;
      if (param.kind == ParamKind::plan) op.plan_at = i;
      if (param.kind == ParamKind::arch || param.kind == ParamKind::checked_arch) op.arch_at = i;
      if (name == "stream") op.stream_at = i;
    }
    // The generic path reads these three by position (plan_at, arch_at, stream_at): a row
    // without one would read another parameter in its place.
    bool has_plan = false, has_arch = false, has_stream = false;
    for (const Param& param : op.params) {
      has_plan = has_plan || param.kind == ParamKind::plan;
      has_arch = has_arch || param.kind == ParamKind::arch || param.kind == ParamKind::checked_arch;
      has_stream = has_stream || std::string_view(param.name) == "stream";
    }
    if (!has_plan || !has_arch || !has_stream) {
      throw std::logic_error(std::string(op.name) +
                             ": an op-table row needs a _plan, an _arch and a stream parameter");
    }
    op.docstring += std::string(")\n--\n\n") + op.doc;
    op.method =
        PyMethodDef{op.name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&entry)),
                    METH_FASTCALL | METH_KEYWORDS, op.docstring.c_str()};
    nb::object self = nb::steal(PyCapsule_New(&op, nullptr, nullptr));
    if (!self.is_valid()) throw nb::python_error();
    nb::object fn = nb::steal(PyCFunction_NewEx(&op.method, self.ptr(), m.attr("__name__").ptr()));
    if (!fn.is_valid()) throw nb::python_error();
    m.attr(op.name) = fn;
    names.emplace_back(op.name);
  }
  m.def(
      "_bound_ops", [names] { return names; },
      "The ops of the extension's op table, each a function of this module; a name with a "
      "leading '_' is wrapped by the package's Python function of the name without it.");
}

}  // namespace kjit::python
