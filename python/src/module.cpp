// SPDX-License-Identifier: Apache-2.0
// kjit._kjit: the Python extension. Tensors come in as torch tensors (read through libtorch's C++
// API by kjit._kjit_torch when it was built, torch_fastpath.hpp, else through their C-level
// attributes: torch's __dlpack__ is a Python method that costs microseconds per tensor) or as
// any DLPack / buffer-protocol object (through nanobind's ndarray import). Every op is a row of
// the op table (ops.cpp): a METH_FASTCALL function whose keywords, defaults and outputs one
// generic reader handles (fastcall.cpp), exported by the package as kjit.<op> as it is.
// This file: the runtime and its settings, the exception classes and the module body (ext.hpp).
#include "ext.hpp"

namespace kjit::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Runtime and settings

/// The runtime every op of this module uses. Replaced by configure(); a replaced runtime is
/// deliberately never destroyed: captured CUDA graphs may still launch its kernels, and its
/// CUlibrary handles must outlive them (Runtime::global() is never destroyed either).
Runtime* g_runtime = nullptr;

}  // namespace

Runtime& runtime() {
  if (g_runtime == nullptr) g_runtime = &Runtime::global();
  return *g_runtime;
}

namespace {

const char* log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::off:
      return "off";
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "warn";
}

nb::dict settings_dict(const Settings& s) {
  nb::dict d;
  d["cache_dir"] = s.resolved_cache_dir();
  d["bundle_paths"] = s.bundle_paths;
  d["disable_jit"] = s.disable_jit;
  d["disable_disk_cache"] = s.disable_disk_cache;
  d["dump_dir"] = s.dump_dir;
  d["log"] = std::string(log_level_name(s.log_level));
  d["cuda_home"] = s.resolved_cuda_home();
  d["nvrtc_library"] = s.nvrtc_library;
  d["cuda_driver_library"] = s.cuda_driver_library;
  d["allow_compile_in_capture"] = s.allow_compile_in_capture;
  d["debug_checks"] = s.debug_checks;
  return d;
}

/// Settings from the environment, then every non-None keyword of configure() on top.
void configure(nb::dict overrides) {
  Settings s = Settings::from_env();
  for (auto [key_obj, value] : overrides) {
    const std::string key = nb::cast<std::string>(key_obj);
    if (value.is_none()) continue;
    auto flag = [&] { return nb::cast<bool>(value); };
    if (key == "cache_dir") {
      s.cache_dir = nb::cast<std::string>(value);
    } else if (key == "bundle_paths") {
      s.bundle_paths = nb::isinstance<nb::str>(value)
                           ? std::vector<std::string>{nb::cast<std::string>(value)}
                           : nb::cast<std::vector<std::string>>(value);
    } else if (key == "disable_jit") {
      s.disable_jit = flag();
    } else if (key == "disable_disk_cache") {
      s.disable_disk_cache = flag();
    } else if (key == "dump_dir") {
      s.dump_dir = nb::cast<std::string>(value);
    } else if (key == "log") {
      std::string level = nb::cast<std::string>(value);
      // Any case, as KJIT_LOG.
      for (char& c : level) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const LogLevel levels[] = {LogLevel::off, LogLevel::error, LogLevel::warn, LogLevel::info,
                                 LogLevel::debug};
      bool found = false;
      for (LogLevel l : levels) {
        if (level == log_level_name(l)) {
          s.log_level = l;
          found = true;
        }
      }
      if (!found) {
        throw InvalidArgument("configure: log = '" + level +
                              "' is not a level; accepted: off, error, warn, info, debug");
      }
    } else if (key == "cuda_home") {
      s.cuda_home = nb::cast<std::string>(value);
    } else if (key == "nvrtc_library") {
      s.nvrtc_library = nb::cast<std::string>(value);
    } else if (key == "cuda_driver_library") {
      s.cuda_driver_library = nb::cast<std::string>(value);
    } else if (key == "allow_compile_in_capture") {
      s.allow_compile_in_capture = flag();
    } else if (key == "debug_checks") {
      s.debug_checks = flag();
    } else {
      throw InvalidArgument("configure: unknown setting '" + key +
                            "'; accepted: cache_dir, bundle_paths, disable_jit, "
                            "disable_disk_cache, dump_dir, log, cuda_home, nvrtc_library, "
                            "cuda_driver_library, allow_compile_in_capture, debug_checks");
    }
  }
  g_runtime = new Runtime(std::move(s));  // the previous one is kept alive: see g_runtime
}

nb::dict cache_stats() {
  const CacheStats st = runtime().stats();
  nb::dict d;
  d["memory_hits"] = st.memory_hits;
  d["bundle_hits"] = st.bundle_hits;
  d["disk_hits"] = st.disk_hits;
  d["compiles"] = st.compiles;
  d["corrupt_entries"] = st.corrupt_entries;
  d["write_failures"] = st.write_failures;
  d["disk_enabled"] = st.disk_enabled;
  d["nvrtc_loaded"] = st.nvrtc_loaded;
  return d;
}

// ---------------------------------------------------------------------------------------------
// Exceptions: one Python class per kjit error class, raised with the same message.

struct Exceptions {
  PyObject* error = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* plan_error = nullptr;
  PyObject* compile_error = nullptr;
  PyObject* cache_error = nullptr;
  PyObject* driver_error = nullptr;
  PyObject* kernel_not_in_bundle = nullptr;
};
Exceptions g_exc;

PyObject* new_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("kjit.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

/// Raises `type(message)` with extra attributes set on the instance.
void raise(PyObject* type, const char* message,
           std::initializer_list<std::pair<const char*, nb::object>> attrs = {}) {
  nb::object instance = nb::steal(PyObject_CallOneArg(type, nb::str(message).ptr()));
  if (!instance.is_valid()) return;  // the constructor raised: that error stands
  for (const auto& [name, value] : attrs) nb::setattr(instance, name, value);
  PyErr_SetObject(type, instance.ptr());
}

}  // namespace

void translate(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const CompileError& e) {
    raise(g_exc.compile_error, e.what(),
          {{"log", nb::str(e.log().c_str())},
           {"options", nb::str(e.options().c_str())},
           {"spec", nb::str(e.spec().c_str())}});
  } catch (const DriverError& e) {
    raise(g_exc.driver_error, e.what(),
          {{"result", nb::int_(e.result())}, {"call", nb::str(e.call().c_str())}});
  } catch (const InvalidArgument& e) {
    raise(g_exc.invalid_argument, e.what());
  } catch (const PlanError& e) {
    raise(g_exc.plan_error, e.what());
  } catch (const CacheError& e) {
    raise(g_exc.cache_error, e.what());
  } catch (const KernelNotInBundle& e) {
    raise(g_exc.kernel_not_in_bundle, e.what());
  } catch (const Error& e) {
    raise(g_exc.error, e.what());
  }
}

namespace {

std::string dim3_text(const Dim3& d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace
}  // namespace kjit::python

NB_MODULE(_kjit, m) {
  using namespace kjit;
  using namespace kjit::python;
  using namespace nb::literals;
  m.doc() = "kjit: run-time specialized GPU kernels (C++ extension; use the kjit package)";

  g_name_data_ptr = PyUnicode_InternFromString("data_ptr");
  g_name_stride = PyUnicode_InternFromString("stride");
  g_name_get_device = PyUnicode_InternFromString("get_device");
  g_name_shape = PyUnicode_InternFromString("shape");
  g_name_dtype = PyUnicode_InternFromString("dtype");
  g_name_is_cuda = PyUnicode_InternFromString("is_cuda");

  g_exc.error = new_exception(m, "Error", PyExc_RuntimeError,
                              "Base of every kjit error; the message names the argument, its "
                              "value and what is accepted.");
  {
    nb::object bases = nb::make_tuple(nb::handle(g_exc.error), nb::handle(PyExc_ValueError));
    g_exc.invalid_argument = new_exception(m, "InvalidArgument", bases.ptr(),
                                           "An argument (shape, dtype, stride, option) is not "
                                           "acceptable. Also a ValueError.");
  }
  g_exc.plan_error =
      new_exception(m, "PlanError", g_exc.error, "No legal launch exists on this device.");
  g_exc.compile_error = new_exception(m, "CompileError", g_exc.error,
                                      "NVRTC rejected a specialization; .log, .options, .spec.");
  g_exc.cache_error = new_exception(m, "CacheError", g_exc.error,
                                    "The kernel cache or a bundle could not be used.");
  g_exc.driver_error = new_exception(m, "DriverError", g_exc.error,
                                     "A CUDA driver call failed; .result (CUresult), .call.");
  g_exc.kernel_not_in_bundle = new_exception(m, "KernelNotInBundle", g_exc.error,
                                             "JIT is disabled and neither a bundle nor the disk "
                                             "cache has the kernel.");
  nb::register_exception_translator(translate);

  nb::class_<LimitCheck>(m, "LimitCheck", "One limit a launch was checked against.")
      .def_ro("limit", &LimitCheck::limit)
      .def_ro("requested", &LimitCheck::requested)
      .def_ro("allowed", &LimitCheck::allowed)
      .def_prop_ro("ok", &LimitCheck::ok)
      .def("__repr__", [](const LimitCheck& c) {
        return "LimitCheck(" + c.limit + ": " + std::to_string(c.requested) + " / " +
               std::to_string(c.allowed) + ")";
      });
  nb::class_<PlannedLaunch>(m, "PlannedLaunch", "One kernel launch of a plan.")
      .def_prop_ro("spec", [](const PlannedLaunch& l) { return l.spec.str(); })
      .def_prop_ro("grid",
                   [](const PlannedLaunch& l) {
                     return nb::make_tuple(l.shape.grid.x, l.shape.grid.y, l.shape.grid.z);
                   })
      .def_prop_ro("block",
                   [](const PlannedLaunch& l) {
                     return nb::make_tuple(l.shape.block.x, l.shape.block.y, l.shape.block.z);
                   })
      .def_prop_ro("dynamic_smem", [](const PlannedLaunch& l) { return l.shape.dynamic_smem; })
      .def_prop_ro("overlaps_previous",
                   [](const PlannedLaunch& l) { return l.shape.overlaps_previous; })
      .def_ro("checks", &PlannedLaunch::checks)
      .def("__repr__", [](const PlannedLaunch& l) {
        return "PlannedLaunch(" + l.spec.str() + ", grid " + dim3_text(l.shape.grid) + ", block " +
               dim3_text(l.shape.block) + ")";
      });
  nb::class_<Plan>(m, "Plan",
                   "What one op call launches: grid mode, launches, checked limits, reasons.")
      .def_ro("op", &Plan::op)
      .def_ro("mode", &Plan::mode)
      .def_ro("reasons", &Plan::reasons)
      .def_ro("launches", &Plan::launches)
      .def_prop_ro("arch", [](const Plan& p) { return p.device.arch.str(); })
      .def_prop_ro("device_name", [](const Plan& p) { return p.device.name; })
      .def_prop_ro("specs",
                   [](const Plan& p) {
                     std::vector<std::string> specs;
                     for (const PlannedLaunch& l : p.launches) specs.push_back(l.spec.str());
                     return specs;
                   })
      .def("explain", &Plan::explain, "Multi-line account of the plan (as `kjit plan` prints).")
      .def("to_json", &Plan::to_json)
      .def("__str__", &Plan::explain)
      .def("__repr__", [](const Plan& p) {
        return "<kjit.Plan " + p.op + " mode=" + p.mode + " arch=" + p.device.arch.str() + " " +
               std::to_string(p.launches.size()) + " launch(es)>";
      });

  m.def("_register_torch", &register_torch);
  m.def("_register_torch_fastpath", &register_torch_fastpath);
  m.def("_torch_fastpath", &torch_fastpath, "enable"_a.none() = nb::none(),
        "Whether tensors are read through kjit._kjit_torch; enable=True/False switches it (on "
        "only once registered).");
  m.def("_read_tensor", &read_tensor);
  m.def("_read_args_for_bench", &read_args_for_bench);
  m.def("_current_stream",
        [](int device) { return reinterpret_cast<std::uintptr_t>(torch_current_stream(device)); });
  m.def("_configure", &kjit::python::configure);
  m.def("_settings", [] { return settings_dict(runtime().settings()); });
  m.def("_cache_stats", &cache_stats);
  m.def("_current_device", &current_device);
  m.def("_driver_available", [] {
    std::string why;
    const bool ok = runtime().driver_available(&why);
    return nb::make_tuple(ok, why);
  });
  // The op table (ops.cpp): one METH_FASTCALL function per row, its signature line made from
  // the row's parameters (inspect.signature() and help() show the keywords).
  register_ops(m);
  m.def("_register_allocator", &register_allocator);
  m.def("_gdn_prefill_workspace_bytes", &gdn_prefill_workspace_bytes);
  m.def("_gdn_prefill_checkpoint_starts",
        [](const std::vector<std::int64_t>& cu_seqlens, std::int64_t every) {
          return gdn_prefill_checkpoint_starts(cu_seqlens, every);
        });
  m.def("_plan_shape", &plan_shape);
  m.def("_op_params", [](const std::string& name) {
    std::vector<nb::tuple> out;
    for (const OpParam& p : find_catalog_op(name).params) {
      out.push_back(nb::make_tuple(p.name, p.size, p.fallback, p.doc));
    }
    return out;
  });
  m.def("_ops", [] {
    std::vector<std::string> names;
    for (const OpInfo& op : op_catalog()) names.push_back(op.name);
    return names;
  });
  m.def("_prewarm_specs", &prewarm_specs);
  m.def("_source", &kjit::python::source);
  m.def("_compile", &kjit::python::compile);
  m.def("_known_archs", [] {
    std::vector<std::string> names;
    for (const Arch& a : DeviceLimits::known_archs()) names.push_back(a.str());
    return names;
  });
}
