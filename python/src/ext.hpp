// SPDX-License-Identifier: Apache-2.0
// kjit._kjit's private declarations, shared by the parts of the extension (not installed):
//   tensors.cpp  the torch registration (the attribute path and kjit._kjit_torch's fast path),
//                the torch / DLPack argument readers, torch's current stream, the debug readers;
//   ops.cpp      option parsing, the op bindings and the METH_FASTCALL per-step op path;
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
// Ops (ops.cpp): the op bindings registered by nanobind, positional arguments only; each
// returns the Plan without launching when `plan` is true.

nb::object merge_states(nb::handle v, nb::handle s, nb::handle v_out, nb::handle s_out,
                        const OptStr& base, const std::string& layout, bool pos_inf,
                        const std::string& mode, nb::handle stream, bool plan, const OptStr& arch);
nb::object gdn_decode_gated(nb::handle mixed_qkv, nb::handle g, nb::handle beta, nb::handle state,
                            nb::handle state_indices, nb::handle out, std::optional<double> scale,
                            bool l2norm, const std::string& invalid, const std::string& mode,
                            bool debug_check, const std::string& row_order, nb::handle stream,
                            bool plan, const OptStr& arch);
nb::object gdn_prefill(nb::handle q, nb::handle k, nb::handle v, nb::handle a, nb::handle b,
                       nb::handle a_log, nb::handle dt_bias, nb::handle g, nb::handle beta,
                       nb::handle cu_seqlens, nb::handle state, nb::handle state_indices,
                       nb::handle has_initial_state, nb::handle out, nb::handle final_state,
                       double scale, bool l2norm, double threshold,
                       std::int64_t checkpoint_every_n_tokens, nb::handle state_checkpoints,
                       nb::handle checkpoint_cu_starts, nb::handle workspace,
                       const std::string& mode, nb::handle stream, bool plan, const OptStr& arch);
nb::object causal_conv1d(nb::handle x, nb::handle weight, nb::handle bias, nb::handle conv_state,
                         nb::handle cu_seqlens, nb::handle state_indices,
                         nb::handle has_initial_state, nb::handle out, const OptStr& activation,
                         const std::string& invalid, const std::string& mode, bool debug_check,
                         nb::handle stream, bool plan, const OptStr& arch);
nb::object causal_conv1d_update(nb::handle x, nb::handle weight, nb::handle bias,
                                nb::handle conv_state, nb::handle state_indices,
                                nb::handle num_accepted_tokens, nb::handle out,
                                const OptStr& activation, const std::string& invalid,
                                const std::string& mode, bool debug_check, nb::handle stream,
                                bool plan, const OptStr& arch, nb::handle query_start_loc);
nb::object qk_l2norm(nb::handle q, nb::handle k, nb::handle q_out, nb::handle k_out, double eps,
                     nb::handle stream, bool plan, const OptStr& arch);

// The METH_FASTCALL per-step ops (ops.cpp)

/// A fixed parameter list: the first `positional` may be passed by position, the first
/// `required` must be given; the rest are keyword-only.
struct FastSignature {
  const char* op;
  std::vector<const char*> names;
  std::size_t positional;
  std::size_t required;
  std::vector<PyObject*> interned;  // filled at module import
};
extern FastSignature g_merge_state_sig;
extern FastSignature g_merge_state_in_place_sig;
extern FastSignature g_gdn_decode_sig;

PyObject* merge_state(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                      PyObject* kwnames) noexcept;
PyObject* merge_state_in_place(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                               PyObject* kwnames) noexcept;
PyObject* gdn_decode(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                     PyObject* kwnames) noexcept;
void register_allocator(nb::handle allocate);

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
