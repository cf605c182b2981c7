// SPDX-License-Identifier: Apache-2.0
// kjit._kjit, ops: option parsing, the op bindings and the METH_FASTCALL per-step ops (ext.hpp).

#include "ext.hpp"

namespace kjit::python {
namespace {

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

}  // namespace

// ---------------------------------------------------------------------------------------------
// Ops. Each takes (tensors..., options..., stream, plan_arch): plan_arch is "" to launch, or
// None / an arch to return the Plan without launching (None: the tensors' device).

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

nb::object qk_l2norm(nb::handle q, nb::handle k, nb::handle q_out, nb::handle k_out, double eps,
                     nb::handle stream, bool plan, const OptStr& arch) {
  Args args("qk_l2norm", !plan);
  const TensorView tq = args.get("q", q), tq_out = args.get("q_out", q_out);
  const TensorView tk = args.optional("k", k), tk_out = args.optional("k_out", k_out);
  QkL2NormOptions opt;
  // The op checks eps (finite, >= 0); a double that does not survive the narrowing is refused
  // by that same check (inf).
  opt.eps = static_cast<float>(eps);
  opt.device = args.device();
  opt.runtime = &runtime();
  if (plan) {
    return nb::cast(plan_qk_l2norm(tq, tk, tq_out, tk_out, opt, plan_limits(arch, args.device())));
  }
  kjit::qk_l2norm(tq, tk, tq_out, tk_out, opt, args.stream(stream));
  return nb::none();
}
// ---------------------------------------------------------------------------------------------
// The per-step ops (merge_state, merge_state_in_place, gdn_decode) are METH_FASTCALL functions
// that parse their own arguments: a serving engine calls them every decode step, and a Python
// wrapper plus nanobind's generic dispatch of 13-17 arguments cost about 1 us of the 5 us a
// call may take. Keywords are matched by pointer against interned names first (call sites
// intern their keywords), then by value.

namespace {

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

}  // namespace

void register_allocator(nb::handle allocate) {
  Py_XDECREF(g_allocate);
  g_allocate = allocate.inc_ref().ptr();
}

namespace {

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

}  // namespace

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

FastSignature g_gdn_decode_sig{"gdn_decode",
                               {"mixed_qkv",
                                "a",
                                "b",
                                "a_log",
                                "dt_bias",
                                "state",
                                "state_indices",
                                "out",
                                "scale",
                                "l2norm_qk",
                                "softplus_threshold",
                                "invalid_index",
                                "mode",
                                "debug_check_indices",
                                "row_order",
                                "stream",
                                "_plan",
                                "_arch",
                                "conv_weight",
                                "conv_bias",
                                "conv_state",
                                "conv_activation"},
                               8,
                               7,
                               {}};

PyObject* gdn_decode(PyObject*, PyObject* const* call_args, Py_ssize_t nargsf,
                     PyObject* kwnames) noexcept {
  return guarded([&]() -> nb::object {
    const FastSignature& sig = g_gdn_decode_sig;
    const char* op = sig.op;
    PyObject* a[22];
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
    GdnDecodeOptions opt = decode_options(op, scale, l2norm, threshold, invalid, mode, debug_check,
                                          row_order, args.device());
    if (!absent(a[18]) || !absent(a[20])) {
      // The fused decode step (GdnDecodeOptions::conv): mixed_qkv before the convolution.
      if (absent(a[18]) || absent(a[20])) {
        throw InvalidArgument(std::string(op) +
                              ": conv_weight and conv_state go together (the fused decode step "
                              "needs both; conv_bias may be None)");
      }
      const std::string act = text_arg(op, "conv_activation", a[21], "silu");
      ConvActivation activation = ConvActivation::silu;
      if (act == "none") {
        activation = ConvActivation::none;
      } else if (act != "silu" && act != "swish") {
        throw InvalidArgument(std::string(op) + ": conv_activation = '" + act +
                              "' is not an activation; accepted: 'silu' (or 'swish'), 'none'");
      }
      opt.conv = GdnDecodeConv{args.get("conv_weight", a[18]),
                               args.optional("conv_bias", given_or_none(a[19])),
                               args.get("conv_state", a[20]), activation};
    }
    if (plan) {
      const OptStr arch = optional_text_arg(op, "_arch", a[17]);
      return nb::cast(
          plan_gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, plan_limits(arch, args.device())));
    }
    kjit::gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, args.stream(given_or_none(a[15])));
    return out;
  });
}

}  // namespace kjit::python
