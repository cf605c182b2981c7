// SPDX-License-Identifier: Apache-2.0
// kjit._kjit: the Python extension. Tensors come in as torch tensors (read through libtorch's C++
// API by kjit._kjit_torch when it was built, torch_fastpath.hpp, else through their C-level
// attributes: torch's __dlpack__ is a Python method that costs microseconds per tensor) or as
// any DLPack / buffer-protocol object (through nanobind's ndarray import). Every op entry point
// takes positional arguments only, so that nanobind's vectorcall path stays cheap; the Python
// package (python/kjit) adds keywords, defaults and output allocation.
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

#include "codegen/embedded_templates.hpp"
#include "codegen/families.hpp"
#include "kjit/catalog.hpp"
#include "kjit/kjit.hpp"
#include "kjit/ops/causal_conv1d.hpp"
#include "kjit/ops/gdn_decode.hpp"
#include "kjit/ops/gdn_prefill.hpp"
#include "kjit/ops/merge_state.hpp"
#include "torch_fastpath.hpp"

namespace nb = nanobind;

namespace kjit::python {
namespace {

// ---------------------------------------------------------------------------------------------
// Runtime and settings

/// The runtime every op of this module uses. Replaced by configure(); a replaced runtime is
/// deliberately never destroyed: captured CUDA graphs may still launch its kernels, and its
/// CUlibrary handles must outlive them (Runtime::global() is never destroyed either).
Runtime* g_runtime = nullptr;

Runtime& runtime() {
  if (g_runtime == nullptr) g_runtime = &Runtime::global();
  return *g_runtime;
}

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
// Tensors

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

/// Takes kjit._kjit_torch's capsule; the table it points to is static in that module, which is
/// kept alive by the reference held here.
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

/// Turns the fast path on or off (None: unchanged); returns whether it is in use. It cannot be
/// turned on before register_torch_fastpath.
bool torch_fastpath(std::optional<bool> enable) {
  if (enable) g_torch.use_fast = *enable && g_torch.fast != nullptr;
  return g_torch.use_fast;
}

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

[[noreturn]] void bad(const char* op, const char* name, const std::string& what) {
  throw InvalidArgument(std::string(op) + ": " + name + " " + what);
}

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

/// torch's current stream on `device` (the legacy default stream without torch).
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

// ---------------------------------------------------------------------------------------------
// Debug entry points: the tests compare the two torch paths on the same tensors, the benchmark
// times them.

/// (data pointer, dtype name, shape, strides, device, how) as an op would read `obj`.
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

/// Reads every positional argument as an op reads its tensors, and nothing else: the per-tensor
/// cost of the binding without a launch. Returns how many were read.
std::size_t read_args_for_bench(nb::args args) {
  for (nb::handle obj : args) (void)to_arg("_read_args_for_bench", "tensor", obj);
  return args.size();
}

// ---------------------------------------------------------------------------------------------
// Options

LseBase parse_base(const char* op, const std::optional<std::string>& text) {
  if (!text) {
    throw InvalidArgument(std::string(op) +
                          ": lse_base is required; accepted: '2' (FlashInfer) or 'e' "
                          "(FlashAttention, SGLang, vLLM). There is no default: merging with the "
                          "wrong base is silently wrong");
  }
  if (*text == "e") return LseBase::e;
  if (*text == "2" || *text == "two") return LseBase::two;
  throw InvalidArgument(std::string(op) + ": lse_base = '" + *text +
                        "' is not a base; accepted: 2, '2' or 2.0 (FlashInfer) and 'e' or "
                        "math.e (FlashAttention, SGLang, vLLM)");
}

MergeStateOptions merge_options(const char* op, const std::optional<std::string>& base,
                                const std::string& layout, bool pos_inf_as_empty,
                                const std::string& mode, int device) {
  MergeStateOptions o;
  o.lse_base = parse_base(op, base);
  if (layout == "token_major") {
    o.lse_layout = LseLayout::token_major;
  } else if (layout == "head_major") {
    o.lse_layout = LseLayout::head_major;
  } else {
    throw InvalidArgument(std::string(op) + ": lse_layout = '" + layout +
                          "' is not a layout; accepted: 'token_major' or 'head_major'");
  }
  o.pos_inf_as_empty = pos_inf_as_empty;
  o.force_mode = mode;
  o.device = device;
  o.runtime = &runtime();
  return o;
}

GdnInvalidIndex parse_invalid(const char* op, const std::string& text) {
  if (text == "negative") return GdnInvalidIndex::negative;
  if (text == "nonpositive") return GdnInvalidIndex::nonpositive;
  throw InvalidArgument(std::string(op) + ": invalid_index = '" + text +
                        "' is not a convention; accepted: 'negative' (index < 0 is padding) or "
                        "'nonpositive' (index <= 0 is padding)");
}

/// A plan target: arch text (offline, built-in limits) or None for the tensors' device.
DeviceLimits plan_limits(const std::optional<std::string>& arch, int device) {
  if (arch) return DeviceLimits::for_name(*arch);
  return runtime().device_limits(device >= 0 ? device : runtime().current_device());
}

// ---------------------------------------------------------------------------------------------
// Ops. Each takes (tensors..., options..., stream, plan_arch): plan_arch is "" to launch, or
// None / an arch to return the Plan without launching (None: the tensors' device).

using OptStr = std::optional<std::string>;

nb::object merge_states(nb::handle v, nb::handle s, nb::handle v_out, nb::handle s_out,
                        const OptStr& base, const std::string& layout, bool pos_inf,
                        const std::string& mode, nb::handle stream, bool plan, const OptStr& arch) {
  const char* op = "merge_states";
  Args args(op, !plan);
  const TensorView vv = args.get("v", v), ss = args.get("s", s);
  const TensorView vo = args.get("v_out", v_out), so = args.optional("s_out", s_out);
  const MergeStateOptions o = merge_options(op, base, layout, pos_inf, mode, args.device());
  if (plan) return nb::cast(plan_merge_states(vv, ss, vo, so, o, plan_limits(arch, args.device())));
  kjit::merge_states(vv, ss, vo, so, o, args.stream(stream));
  return nb::none();
}

GdnRowOrder parse_row_order(const char* op, const std::string& text) {
  if (text == "auto") return GdnRowOrder::automatic;
  if (text == "by_slot") return GdnRowOrder::by_slot;
  if (text == "as_given") return GdnRowOrder::as_given;
  throw InvalidArgument(std::string(op) + ": row_order = '" + text +
                        "' is not an order; accepted: 'auto' (slot order for steps reading >= "
                        "512 MiB of state), 'by_slot' or 'as_given'");
}

GdnDecodeOptions decode_options(const char* op, std::optional<double> scale, bool l2norm,
                                double threshold, const std::string& invalid,
                                const std::string& mode, bool debug_check,
                                const std::string& row_order, int device) {
  GdnDecodeOptions o;
  if (scale) o.scale = static_cast<float>(*scale);
  o.l2norm_qk = l2norm;
  o.softplus_threshold = static_cast<float>(threshold);
  o.invalid_index = parse_invalid(op, invalid);
  o.force_mode = mode;
  o.debug_check_indices = debug_check;
  o.row_order = parse_row_order(op, row_order);
  o.device = device;
  o.runtime = &runtime();
  return o;
}

nb::object gdn_decode_gated(nb::handle mixed_qkv, nb::handle g, nb::handle beta, nb::handle state,
                            nb::handle state_indices, nb::handle out, std::optional<double> scale,
                            bool l2norm, const std::string& invalid, const std::string& mode,
                            bool debug_check, const std::string& row_order, nb::handle stream,
                            bool plan, const OptStr& arch) {
  const char* op = "gdn_decode_gated";
  Args args(op, !plan);
  const TensorView qkv = args.get("mixed_qkv", mixed_qkv);
  const TensorView tg = args.get("g", g), tb = args.get("beta", beta);
  const TensorView st = args.get("state", state), idx = args.get("state_indices", state_indices);
  const TensorView o = args.get("out", out);
  const GdnDecodeOptions opt =
      decode_options(op, scale, l2norm, 20.0, invalid, mode, debug_check, row_order, args.device());
  if (plan) {
    return nb::cast(
        plan_gdn_decode_gated(qkv, tg, tb, st, idx, o, opt, plan_limits(arch, args.device())));
  }
  kjit::gdn_decode_gated(qkv, tg, tb, st, idx, o, opt, args.stream(stream));
  return nb::none();
}

nb::object gdn_prefill(nb::handle q, nb::handle k, nb::handle v, nb::handle a, nb::handle b,
                       nb::handle a_log, nb::handle dt_bias, nb::handle g, nb::handle beta,
                       nb::handle cu_seqlens, nb::handle state, nb::handle state_indices,
                       nb::handle has_initial_state, nb::handle out, nb::handle final_state,
                       double scale, bool l2norm, double threshold,
                       std::int64_t checkpoint_every_n_tokens, nb::handle state_checkpoints,
                       nb::handle checkpoint_cu_starts, nb::handle workspace,
                       const std::string& mode, nb::handle stream, bool plan, const OptStr& arch) {
  const char* op = "gdn_prefill";
  Args args(op, !plan);
  const TensorView tq = args.get("q", q), tk = args.get("k", k), tv = args.get("v", v);
  GdnGates gates;
  const bool raw = !a.is_none() || !b.is_none();
  const bool pre = !g.is_none() || !beta.is_none();
  if (raw == pre) {
    throw InvalidArgument(
        "gdn_prefill: give either raw gates (a, b, a_log, dt_bias) or precomputed gates (g, "
        "beta), not " +
        std::string(raw ? "both" : "neither"));
  }
  if (raw) {
    gates = GdnGates::raw(args.get("a", a), args.get("b", b), args.get("a_log", a_log),
                          args.get("dt_bias", dt_bias));
  } else {
    gates = GdnGates::precomputed(args.get("g", g), args.get("beta", beta));
  }
  const TensorView cu = args.get("cu_seqlens", cu_seqlens);
  const TensorView st = args.get("state", state), idx = args.get("state_indices", state_indices);
  const TensorView has = args.optional("has_initial_state", has_initial_state);
  const TensorView o = args.get("out", out);
  GdnPrefillOptions opt;
  opt.scale = static_cast<float>(scale);
  opt.l2norm_qk = l2norm;
  opt.softplus_threshold = static_cast<float>(threshold);
  opt.final_state = args.optional("final_state", final_state);
  opt.checkpoint_every_n_tokens = checkpoint_every_n_tokens;
  opt.state_checkpoints = args.optional("state_checkpoints", state_checkpoints);
  opt.checkpoint_cu_starts = args.optional("checkpoint_cu_starts", checkpoint_cu_starts);
  opt.workspace = args.optional("workspace", workspace);
  opt.force_mode = mode;
  opt.device = args.device();
  opt.runtime = &runtime();
  if (plan) {
    return nb::cast(plan_gdn_prefill(tq, tk, tv, gates, cu, st, idx, has, o, opt,
                                     plan_limits(arch, args.device())));
  }
  kjit::gdn_prefill(tq, tk, tv, gates, cu, st, idx, has, o, opt, args.stream(stream));
  return nb::none();
}

CausalConv1dOptions conv_options(const char* op, const OptStr& activation,
                                 const std::string& invalid, const std::string& mode,
                                 bool debug_check, int device) {
  CausalConv1dOptions o;
  if (!activation || *activation == "none") {
    o.activation = ConvActivation::none;
  } else if (*activation == "silu" || *activation == "swish") {
    o.activation = ConvActivation::silu;
  } else {
    throw InvalidArgument(std::string(op) + ": activation = '" + *activation +
                          "' is not an activation; accepted: None, 'none', 'silu' (or 'swish')");
  }
  o.invalid_index = parse_invalid(op, invalid) == GdnInvalidIndex::nonpositive
                        ? ConvInvalidIndex::nonpositive
                        : ConvInvalidIndex::negative;
  o.force_mode = mode;
  o.debug_check_indices = debug_check;
  o.device = device;
  o.runtime = &runtime();
  return o;
}

nb::object causal_conv1d(nb::handle x, nb::handle weight, nb::handle bias, nb::handle conv_state,
                         nb::handle cu_seqlens, nb::handle state_indices,
                         nb::handle has_initial_state, nb::handle out, const OptStr& activation,
                         const std::string& invalid, const std::string& mode, bool debug_check,
                         nb::handle stream, bool plan, const OptStr& arch) {
  const char* op = "causal_conv1d";
  Args args(op, !plan);
  const TensorView tx = args.get("x", x), tw = args.get("weight", weight);
  const TensorView tb = args.optional("bias", bias), st = args.get("conv_state", conv_state);
  const TensorView cu = args.get("cu_seqlens", cu_seqlens);
  const TensorView idx = args.get("state_indices", state_indices);
  const TensorView has = args.optional("has_initial_state", has_initial_state);
  const TensorView o = args.get("out", out);
  const CausalConv1dOptions opt =
      conv_options(op, activation, invalid, mode, debug_check, args.device());
  if (plan) {
    return nb::cast(
        plan_causal_conv1d(tx, tw, tb, st, cu, idx, has, o, opt, plan_limits(arch, args.device())));
  }
  kjit::causal_conv1d(tx, tw, tb, st, cu, idx, has, o, opt, args.stream(stream));
  return nb::none();
}

nb::object causal_conv1d_update(nb::handle x, nb::handle weight, nb::handle bias,
                                nb::handle conv_state, nb::handle state_indices,
                                nb::handle num_accepted_tokens, nb::handle out,
                                const OptStr& activation, const std::string& invalid,
                                const std::string& mode, bool debug_check, nb::handle stream,
                                bool plan, const OptStr& arch, nb::handle query_start_loc) {
  const char* op = "causal_conv1d_update";
  Args args(op, !plan);
  const TensorView tx = args.get("x", x), tw = args.get("weight", weight);
  const TensorView tb = args.optional("bias", bias), st = args.get("conv_state", conv_state);
  const TensorView idx = args.get("state_indices", state_indices);
  const TensorView acc = args.optional("num_accepted_tokens", num_accepted_tokens);
  const TensorView qsl = args.optional("query_start_loc", query_start_loc);
  const TensorView o = args.get("out", out);
  const CausalConv1dOptions opt =
      conv_options(op, activation, invalid, mode, debug_check, args.device());
  if (qsl.data != nullptr) {
    // Varlen rows: x and out [T, D].
    if (plan) {
      return nb::cast(plan_causal_conv1d_update_varlen(tx, tw, tb, st, qsl, idx, acc, o, opt,
                                                       plan_limits(arch, args.device())));
    }
    kjit::causal_conv1d_update_varlen(tx, tw, tb, st, qsl, idx, acc, o, opt, args.stream(stream));
    return nb::none();
  }
  if (plan) {
    return nb::cast(plan_causal_conv1d_update(tx, tw, tb, st, idx, acc, o, opt,
                                              plan_limits(arch, args.device())));
  }
  kjit::causal_conv1d_update(tx, tw, tb, st, idx, acc, o, opt, args.stream(stream));
  return nb::none();
}

// ---------------------------------------------------------------------------------------------
// The per-step ops (merge_state, merge_state_in_place, gdn_decode) are METH_FASTCALL functions
// that parse their own arguments: a serving engine calls them every decode step, and a Python
// wrapper plus nanobind's generic dispatch of 13-17 arguments cost about 1 us of the 5 us a
// call may take. Keywords are matched by pointer against interned names first (call sites
// intern their keywords), then by value.

/// A fixed parameter list: the first `positional` may be passed by position, the first
/// `required` must be given; the rest are keyword-only.
void translate(const std::exception_ptr& p, void*);

struct FastSignature {
  const char* op;
  std::vector<const char*> names;
  std::size_t positional;
  std::size_t required;
  std::vector<PyObject*> interned;  // filled at module import
};

[[noreturn]] void raise_type_error(const std::string& message) {
  PyErr_SetString(PyExc_TypeError, message.c_str());
  throw nb::python_error();
}

/// Matches a vectorcall's arguments to `sig`: slots[i] is the i-th parameter's object
/// (borrowed) or nullptr when it was not given.
void match_arguments(const FastSignature& sig, PyObject* const* args, Py_ssize_t nargsf,
                     PyObject* kwnames, PyObject** slots) {
  const std::size_t n = sig.names.size();
  const auto given = static_cast<std::size_t>(PyVectorcall_NARGS(nargsf));
  if (given > sig.positional) {
    raise_type_error(std::string(sig.op) + "() takes at most " + std::to_string(sig.positional) +
                     " positional arguments (" + std::to_string(given) +
                     " given); the options are keyword-only");
  }
  for (std::size_t i = 0; i < n; ++i) slots[i] = i < given ? args[i] : nullptr;
  const Py_ssize_t keywords = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < keywords; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    std::size_t found = n;
    for (std::size_t i = 0; i < n && found == n; ++i) {
      if (sig.interned[i] == key) found = i;
    }
    for (std::size_t i = 0; i < n && found == n; ++i) {
      if (PyUnicode_Compare(sig.interned[i], key) == 0) found = i;
    }
    if (found == n) {
      std::string accepted;
      for (const char* name : sig.names)
        accepted += (accepted.empty() ? "" : ", ") + std::string(name);
      raise_type_error(std::string(sig.op) + "() got an unexpected keyword argument '" +
                       PyUnicode_AsUTF8(key) + "'; accepted: " + accepted);
    }
    if (slots[found] != nullptr) {
      raise_type_error(std::string(sig.op) + "() got multiple values for argument '" +
                       sig.names[found] + "'");
    }
    slots[found] = args[given + static_cast<std::size_t>(k)];
  }
  for (std::size_t i = 0; i < sig.required; ++i) {
    if (slots[i] == nullptr) {
      raise_type_error(std::string(sig.op) + "() missing required argument '" + sig.names[i] + "'");
    }
  }
}

/// A parameter's object as a handle: None when it was not given.
nb::handle given_or_none(PyObject* obj) { return obj != nullptr ? obj : Py_None; }

bool absent(PyObject* obj) { return obj == nullptr || obj == Py_None; }

bool flag_arg(const char* op, const char* name, PyObject* obj, bool fallback) {
  if (obj == nullptr) return fallback;
  if (obj == Py_True) return true;
  if (obj == Py_False) return false;
  raise_type_error(std::string(op) + "(): " + name + " must be True or False, got a " +
                   Py_TYPE(obj)->tp_name);
}

std::string text_arg(const char* op, const char* name, PyObject* obj, const char* fallback) {
  if (absent(obj)) return fallback;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &size) : nullptr;
  if (text == nullptr) {
    if (!PyErr_Occurred()) {
      raise_type_error(std::string(op) + "(): " + name + " must be a str, got a " +
                       Py_TYPE(obj)->tp_name);
    }
    throw nb::python_error();
  }
  return std::string(text, static_cast<std::size_t>(size));
}

OptStr optional_text_arg(const char* op, const char* name, PyObject* obj) {
  if (absent(obj)) return std::nullopt;
  return text_arg(op, name, obj, "");
}

/// lse_base: '2', 'e', or a number: 2 or 2.0 (base 2) and math.e (base e), what people type.
/// Anything else is passed on as its str() and refused by parse_base, naming it.
OptStr base_arg(PyObject* obj) {
  if (absent(obj)) return std::nullopt;
  if (PyFloat_Check(obj)) {
    const double value = PyFloat_AS_DOUBLE(obj);
    if (value == 2.0) return std::string("2");
    if (value == 2.718281828459045) return std::string("e");  // math.e, exactly
  }
  nb::str text = nb::steal<nb::str>(PyObject_Str(obj));
  if (!text.is_valid()) throw nb::python_error();
  return std::string(text.c_str());
}

double number_arg(const char* op, const char* name, PyObject* obj, double fallback) {
  if (absent(obj)) return fallback;
  const double value = PyFloat_AsDouble(obj);
  if (value == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    raise_type_error(std::string(op) + "(): " + name + " must be a number, got a " +
                     Py_TYPE(obj)->tp_name);
  }
  return value;
}

/// kjit._api._empty(like, shape, dtype): the allocator of outputs not given, where the torch
/// fast path cannot make them (other array libraries, dtypes given by name).
PyObject* g_allocate = nullptr;

/// An output the caller did not give: on `like`'s device and from its library, of `shape`,
/// of dtype `forced` when given, else `dtype` (None: like's; a torch dtype; a name).
nb::object allocate_like(nb::handle like, const TensorView& shape_of, nb::handle dtype,
                         std::optional<DType> forced = std::nullopt) {
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

/// A shape as a TensorView (only rank and shape are used).
TensorView shape_view(std::initializer_list<std::int64_t> dims) {
  TensorView view;
  view.rank = static_cast<int>(dims.size());
  int i = 0;
  for (std::int64_t d : dims) view.shape[i++] = d;
  return view;
}

void register_allocator(nb::handle allocate) {
  Py_XDECREF(g_allocate);
  g_allocate = allocate.inc_ref().ptr();
}

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

FastSignature g_merge_state_sig{
    "merge_state",
    {"v_a", "s_a", "v_b", "s_b", "v_out", "s_out", "lse_base", "lse_layout", "pos_inf_as_empty",
     "return_lse", "out_dtype", "mode", "stream", "_plan", "_arch"},
    6,
    4,
    {}};

PyObject* merge_state(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                      PyObject* kwnames) noexcept {
  return guarded([&]() -> nb::object {
    const FastSignature& sig = g_merge_state_sig;
    const char* op = sig.op;
    PyObject* a[15];
    match_arguments(sig, call_args, nargsf, kwnames, a);
    const bool plan = flag_arg(op, "_plan", a[13], false);
    const bool return_lse = flag_arg(op, "return_lse", a[9], true);
    // Options first: a wrongly typed option is a TypeError before any tensor is read.
    const OptStr base = base_arg(a[6]);
    const std::string layout = text_arg(op, "lse_layout", a[7], "token_major");
    const bool pos_inf = flag_arg(op, "pos_inf_as_empty", a[8], true);
    const std::string mode = text_arg(op, "mode", a[11], "");
    Args args(op, !plan);
    const TensorView va = args.get("v_a", a[0]), sa = args.get("s_a", a[1]);
    const TensorView vb = args.get("v_b", a[2]), sb = args.get("s_b", a[3]);
    nb::object v_out = nb::borrow(given_or_none(a[4])), s_out = nb::borrow(given_or_none(a[5]));
    if (v_out.is_none()) v_out = allocate_like(a[0], va, given_or_none(a[10]));
    if (s_out.is_none() && return_lse) s_out = allocate_like(a[1], sa, Py_None, DType::f32);
    const TensorView vo = args.get("v_out", v_out), so = args.optional("s_out", s_out);
    const MergeStateOptions o = merge_options(op, base, layout, pos_inf, mode, args.device());
    if (plan) {
      const OptStr arch = optional_text_arg(op, "_arch", a[14]);
      return nb::cast(
          plan_merge_state(va, sa, vb, sb, vo, so, o, plan_limits(arch, args.device())));
    }
    kjit::merge_state(va, sa, vb, sb, vo, so, o, args.stream(given_or_none(a[12])));
    return nb::make_tuple(v_out, s_out);
  });
}

FastSignature g_merge_state_in_place_sig{
    "merge_state_in_place",
    {"v", "s", "v_other", "s_other", "mask", "lse_base", "lse_layout", "pos_inf_as_empty", "mode",
     "stream", "_plan", "_arch"},
    5,
    4,
    {}};

PyObject* merge_state_in_place(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                               PyObject* kwnames) noexcept {
  return guarded([&]() -> nb::object {
    const FastSignature& sig = g_merge_state_in_place_sig;
    const char* op = sig.op;
    PyObject* a[12];
    match_arguments(sig, call_args, nargsf, kwnames, a);
    const bool plan = flag_arg(op, "_plan", a[10], false);
    const OptStr base = base_arg(a[5]);
    const std::string layout = text_arg(op, "lse_layout", a[6], "token_major");
    const bool pos_inf = flag_arg(op, "pos_inf_as_empty", a[7], true);
    const std::string mode = text_arg(op, "mode", a[8], "");
    Args args(op, !plan);
    const TensorView vv = args.get("v", a[0]), ss = args.get("s", a[1]);
    const TensorView vo = args.get("v_other", a[2]), so = args.get("s_other", a[3]);
    const TensorView m = args.optional("mask", given_or_none(a[4]));
    const MergeStateOptions o = merge_options(op, base, layout, pos_inf, mode, args.device());
    if (plan) {
      const OptStr arch = optional_text_arg(op, "_arch", a[11]);
      return nb::cast(
          plan_merge_state_in_place(vv, ss, vo, so, m, o, plan_limits(arch, args.device())));
    }
    kjit::merge_state_in_place(vv, ss, vo, so, m, o, args.stream(given_or_none(a[9])));
    return nb::make_tuple(nb::handle(a[0]), nb::handle(a[1]));
  });
}

FastSignature g_gdn_decode_sig{
    "gdn_decode",
    {"mixed_qkv", "a", "b", "a_log", "dt_bias", "state", "state_indices", "out", "scale",
     "l2norm_qk", "softplus_threshold", "invalid_index", "mode", "debug_check_indices", "row_order",
     "stream", "_plan", "_arch"},
    8,
    7,
    {}};

PyObject* gdn_decode(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                     PyObject* kwnames) noexcept {
  return guarded([&]() -> nb::object {
    const FastSignature& sig = g_gdn_decode_sig;
    const char* op = sig.op;
    PyObject* a[18];
    match_arguments(sig, call_args, nargsf, kwnames, a);
    const bool plan = flag_arg(op, "_plan", a[16], false);
    std::optional<double> scale;
    if (!absent(a[8])) scale = number_arg(op, "scale", a[8], 0.0);
    const bool l2norm = flag_arg(op, "l2norm_qk", a[9], true);
    const double threshold = number_arg(op, "softplus_threshold", a[10], 20.0);
    const std::string invalid = text_arg(op, "invalid_index", a[11], "negative");
    const std::string mode = text_arg(op, "mode", a[12], "");
    const bool debug_check = flag_arg(op, "debug_check_indices", a[13], false);
    const std::string row_order = text_arg(op, "row_order", a[14], "auto");
    Args args(op, !plan);
    const TensorView qkv = args.get("mixed_qkv", a[0]);
    const TensorView ta = args.get("a", a[1]), tb = args.get("b", a[2]);
    const TensorView al = args.get("a_log", a[3]), dt = args.get("dt_bias", a[4]);
    const TensorView st = args.get("state", a[5]), idx = args.get("state_indices", a[6]);
    nb::object out = nb::borrow(given_or_none(a[7]));
    if (out.is_none()) {
      // [B, HV, V] in mixed_qkv's dtype; shapes the op would refuse are refused by it.
      if (qkv.rank < 1 || st.rank < 3) {
        throw InvalidArgument(std::string(op) + ": cannot allocate out for mixed_qkv " + qkv.str() +
                              " and state " + st.str() +
                              "; expected [B, 2*H*K + HV*V] and [slots, HV, V, K]");
      }
      out = allocate_like(a[0], shape_view({qkv.shape[0], st.shape[1], st.shape[2]}), Py_None);
    }
    const TensorView o = args.get("out", out);
    const GdnDecodeOptions opt = decode_options(op, scale, l2norm, threshold, invalid, mode,
                                                debug_check, row_order, args.device());
    if (plan) {
      const OptStr arch = optional_text_arg(op, "_arch", a[17]);
      return nb::cast(
          plan_gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, plan_limits(arch, args.device())));
    }
    kjit::gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, args.stream(given_or_none(a[15])));
    return out;
  });
}

// ---------------------------------------------------------------------------------------------
// Plans by shape names (the `kjit plan` vocabulary), prewarm, source, compile

const OpInfo& find_catalog_op(const std::string& name) {
  for (const OpInfo& op : op_catalog()) {
    if (op.name == name) return op;
  }
  std::string names;
  for (const OpInfo& op : op_catalog()) names += (names.empty() ? "" : ", ") + op.name;
  throw InvalidArgument("op = '" + name + "' is not an op; accepted: " + names);
}

/// Shape values completed with the catalog's defaults; a missing size is named the Python way.
ShapeValues complete(const OpInfo& op, const std::map<std::string, std::string>& in) {
  for (const OpParam& param : op.params) {
    if (param.size && in.count(param.name) == 0) {
      std::string sizes;
      for (const OpParam& p : op.params) {
        if (p.size) sizes += (sizes.empty() ? "" : ", ") + p.name;
      }
      throw InvalidArgument(op.name + ": shape value " + param.name + " (" + param.doc +
                            ") is missing; required: " + sizes);
    }
  }
  return complete_shape_values(op, ShapeValues(in.begin(), in.end()), true);
}

Plan plan_shape(const std::string& op_name, const std::map<std::string, std::string>& values,
                const OptStr& arch, std::optional<int> device) {
  const OpInfo& op = find_catalog_op(op_name);
  const ShapeValues complete_values = complete(op, values);
  if (arch && device) {
    throw InvalidArgument("plan: give arch or device, not both (arch = '" + *arch +
                          "', device = " + std::to_string(*device) + ")");
  }
  DeviceLimits limits;
  if (arch) {
    limits = DeviceLimits::for_name(*arch);
  } else {
    std::string why;
    if (!runtime().driver_available(&why)) {
      throw InvalidArgument("plan: no CUDA device to plan for (" + why +
                            "); accepted: arch='sm_90' (or h100, h200, b200, a100, l40s, "
                            "rtx5090, sm_80 ... sm_120) plans offline");
    }
    limits = runtime().device_limits(device ? *device : runtime().current_device());
  }
  return plan_from_shape(op, complete_values, limits);
}

std::vector<std::string> prewarm_specs(const std::vector<std::string>& specs, int device) {
  std::vector<KernelSpec> parsed;
  std::vector<std::string> names;
  for (const std::string& text : specs) {
    parsed.push_back(KernelSpec::parse(text));
    names.push_back(parsed.back().str());
  }
  nb::gil_scoped_release release;  // compiling may take seconds; other Python threads run
  runtime().prewarm(parsed, device);
  return names;
}

int current_device() { return runtime().current_device(); }

std::string source(const std::string& spec_text, bool templates) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  std::string out = codegen::stub_source(spec);
  if (!templates) return out;
  // The embedded kjit/... headers the stub includes, transitively, each once.
  std::vector<std::string> pending;
  std::set<std::string> shown;
  auto scan = [&](std::string_view text) {
    const std::string_view marker = "#include \"kjit/";
    for (std::size_t at = text.find(marker); at != std::string_view::npos;
         at = text.find(marker, at + 1)) {
      const std::size_t begin = at + marker.size() - 5;
      const std::size_t end = text.find('"', begin);
      if (end != std::string_view::npos) pending.emplace_back(text.substr(begin, end - begin));
    }
  };
  scan(out);
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const std::string name = pending[i];
    if (!shown.insert(name).second) continue;
    const codegen::EmbeddedTemplate* file = codegen::find_template(name);
    if (file == nullptr) continue;
    out += "\n// ===== " + name + " =====\n" + file->contents;
    scan(file->contents);
  }
  return out;
}

nb::dict compile(const std::string& spec_text) {
  const KernelSpec spec = KernelSpec::parse(spec_text);
  KernelSource from = KernelSource::memory;
  std::shared_ptr<const CompiledKernel> kernel;
  {
    nb::gil_scoped_release release;
    kernel = runtime().compiled(spec, &from);
  }
  const char* origins[] = {"memory", "bundle", "disk", "compiled"};
  nb::dict d;
  d["spec"] = kernel->spec.str();
  d["origin"] = origins[static_cast<int>(from)];
  d["key"] = kernel->key;
  d["key_material"] = kernel->key_material;
  d["source"] = kernel->source;
  d["options"] = kernel->options;
  d["log"] = kernel->log;
  d["ptx"] = kernel->ptx;
  d["lowered_name"] = kernel->lowered_name;
  d["cubin"] = nb::bytes(kernel->cubin.data(), kernel->cubin.size());
  nb::dict r;
  r["registers"] = kernel->resources.registers;
  r["static_smem"] = kernel->resources.static_smem;
  r["local_bytes"] = kernel->resources.local_bytes;
  r["spill_store_bytes"] = kernel->resources.spill_store_bytes;
  r["spill_load_bytes"] = kernel->resources.spill_load_bytes;
  r["max_threads"] = kernel->resources.max_threads;
  d["resources"] = r;
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
  // Every argument accepts None (an optional tensor or option left out): nanobind refuses None
  // for an argument unless it is annotated so.
  // The per-step ops: METH_FASTCALL entry points (see FastSignature). Their docstrings carry
  // the signature, so inspect.signature() and help() show the keywords.
  static PyMethodDef fast_methods[] = {
      {"merge_state",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&kjit::python::merge_state)),
       METH_FASTCALL | METH_KEYWORDS,
       "merge_state($module, v_a, s_a, v_b, s_b, v_out=None, s_out=None, *, lse_base=None, "
       "lse_layout='token_major', pos_inf_as_empty=True, return_lse=True, out_dtype=None, "
       "mode='', stream=None, _plan=False, _arch=None)\n--\n\n"
       "Merges two partial attention states: (v_a, s_a) + (v_b, s_b) -> (v_out, s_out).\n\n"
       "v_*: [T, H, D] f16/bf16/f32, last dim contiguous. s_*: f32 LSE [T, H] (lse_layout\n"
       "'token_major') or [H, T] ('head_major'). lse_base is required: 2 (FlashInfer) or 'e'\n"
       "(FlashAttention, SGLang, vLLM). v_out defaults to a new tensor of v_a's shape in\n"
       "out_dtype (default v_a's dtype), s_out to a new f32 tensor of s_a's shape;\n"
       "return_lse=False skips writing the merged LSE. stream: None (torch's current stream on\n"
       "the tensors' device), an int (cudaStream_t), a torch or CuPy stream. Returns\n"
       "(v_out, s_out) (s_out None when not written)."},
      {"merge_state_in_place",
       reinterpret_cast<PyCFunction>(
           reinterpret_cast<void (*)()>(&kjit::python::merge_state_in_place)),
       METH_FASTCALL | METH_KEYWORDS,
       "merge_state_in_place($module, v, s, v_other, s_other, mask=None, *, lse_base=None, "
       "lse_layout='token_major', pos_inf_as_empty=True, mode='', stream=None, _plan=False, "
       "_arch=None)\n--\n\n"
       "(v, s) <- merge((v, s), (v_other, s_other)) for the tokens whose mask[t] is nonzero.\n\n"
       "mask: [T] bool/uint8, or None for every token. Returns (v, s)."},
      {"gdn_decode",
       reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&kjit::python::gdn_decode)),
       METH_FASTCALL | METH_KEYWORDS,
       "gdn_decode($module, mixed_qkv, a, b, a_log, dt_bias, state, state_indices, out=None, *, "
       "scale=None, l2norm_qk=True, softplus_threshold=20.0, invalid_index='negative', mode='', "
       "debug_check_indices=False, row_order='auto', stream=None, _plan=False, _arch=None)\n"
       "--\n\n"
       "One packed GDN decode step (raw gates), state updated in place in its pool slots.\n\n"
       "Padding rows: invalid_index defaults to 'negative': index < 0 is padding and slot 0\n"
       "is a real slot (SGLang's pools). vLLM's pools reserve slot 0 as a null block: pass\n"
       "invalid_index='nonpositive' (index <= 0 is padding) there, or rows padded with 0 read\n"
       "and update slot 0 as if it were a sequence's state. The default stays because it is\n"
       "kjit's one pool convention: gdn_prefill (which has no option) and the C++\n"
       "GdnDecodeOptions treat index 0 as a real slot too, so a vLLM integration maps its\n"
       "indices (or passes 'nonpositive' here) in any case, and the same call means the same\n"
       "in C++ and Python.\n\n"
       "mixed_qkv [B, 2*H*K + HV*V]; a, b [B, HV]; a_log, dt_bias [HV]; state [slots, HV, V, K]\n"
       "with K contiguous, or V contiguous (a [slots, HV, K, V] pool as .transpose(-1, -2), fla's\n"
       "layout, updated in place); state_indices [B] int32/int64. out defaults to [B, HV, V] of\n"
       "mixed_qkv's dtype.\n"
       "row_order: 'auto' (slot order for steps reading >= 512 MiB of state), 'by_slot' or\n"
       "'as_given' (GdnDecodeOptions::row_order; results are the same). Returns out."},
      {nullptr, nullptr, 0, nullptr}};
  for (FastSignature* sig : {&g_merge_state_sig, &g_merge_state_in_place_sig, &g_gdn_decode_sig}) {
    for (const char* name : sig->names) sig->interned.push_back(PyUnicode_InternFromString(name));
  }
  if (PyModule_AddFunctions(m.ptr(), fast_methods) != 0) throw nb::python_error();
  m.def("_register_allocator", &register_allocator);
  m.def("_merge_states", &kjit::python::merge_states, "v"_a.none(), "s"_a.none(), "v_out"_a.none(),
        "s_out"_a.none(), "lse_base"_a.none(), "lse_layout"_a.none(), "pos_inf_as_empty"_a.none(),
        "mode"_a.none(), "stream"_a.none(), "plan"_a.none(), "arch"_a.none());
  m.def("_gdn_decode_gated", &kjit::python::gdn_decode_gated, "mixed_qkv"_a.none(), "g"_a.none(),
        "beta"_a.none(), "state"_a.none(), "state_indices"_a.none(), "out"_a.none(),
        "scale"_a.none(), "l2norm_qk"_a.none(), "invalid_index"_a.none(), "mode"_a.none(),
        "debug_check_indices"_a.none(), "row_order"_a.none(), "stream"_a.none(), "plan"_a.none(),
        "arch"_a.none());
  m.def("_gdn_prefill", &kjit::python::gdn_prefill, "q"_a.none(), "k"_a.none(), "v"_a.none(),
        "a"_a.none(), "b"_a.none(), "a_log"_a.none(), "dt_bias"_a.none(), "g"_a.none(),
        "beta"_a.none(), "cu_seqlens"_a.none(), "state"_a.none(), "state_indices"_a.none(),
        "has_initial_state"_a.none(), "out"_a.none(), "final_state"_a.none(), "scale"_a.none(),
        "l2norm_qk"_a.none(), "softplus_threshold"_a.none(), "checkpoint_every_n_tokens"_a,
        "state_checkpoints"_a.none(), "checkpoint_cu_starts"_a.none(), "workspace"_a.none(),
        "mode"_a.none(), "stream"_a.none(), "plan"_a.none(), "arch"_a.none());
  m.def("_causal_conv1d", &kjit::python::causal_conv1d, "x"_a.none(), "weight"_a.none(),
        "bias"_a.none(), "conv_state"_a.none(), "cu_seqlens"_a.none(), "state_indices"_a.none(),
        "has_initial_state"_a.none(), "out"_a.none(), "activation"_a.none(),
        "invalid_index"_a.none(), "mode"_a.none(), "debug_check_indices"_a.none(),
        "stream"_a.none(), "plan"_a.none(), "arch"_a.none());
  m.def("_causal_conv1d_update", &kjit::python::causal_conv1d_update, "x"_a.none(),
        "weight"_a.none(), "bias"_a.none(), "conv_state"_a.none(), "state_indices"_a.none(),
        "num_accepted_tokens"_a.none(), "out"_a.none(), "activation"_a.none(),
        "invalid_index"_a.none(), "mode"_a.none(), "debug_check_indices"_a.none(),
        "stream"_a.none(), "plan"_a.none(), "arch"_a.none(),
        "query_start_loc"_a.none() = nb::none());
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
