// SPDX-License-Identifier: Apache-2.0
// kjit._kjit, the op table (ext.hpp): one row per op that Python calls, with its parameters, its
// documentation and the run that reads its tensors and calls the library. fastcall.cpp matches
// and converts the arguments from a row's parameters, makes the signature line of its docstring
// and registers it as kjit._kjit.<name>. A row's run reads the tensors in the order their
// errors should be reported, allocates the outputs not given, and calls the library; the
// parameter indices in a run are the row's parameter positions.

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

/// A shape as a TensorView (only rank and shape are used).
TensorView shape_view(std::initializer_list<std::int64_t> dims) {
  TensorView view;
  view.rank = static_cast<int>(dims.size());
  int i = 0;
  for (std::int64_t d : dims) view.shape[i++] = d;
  return view;
}

MergeStateOptions merge_call_options(Call& c, std::size_t base, std::size_t layout,
                                     std::size_t pos_inf, std::size_t mode) {
  return merge_options(c.op(), c.opt_text(base), c.text(layout), c.flag(pos_inf), c.text(mode),
                       c.args().device());
}

nb::object run_merge_state(Call& c) {
  // v_a s_a v_b s_b v_out s_out | lse_base lse_layout pos_inf_as_empty return_lse out_dtype mode
  // stream _plan _arch
  Args& args = c.args();
  const TensorView va = args.get("v_a", c.obj(0)), sa = args.get("s_a", c.obj(1));
  const TensorView vb = args.get("v_b", c.obj(2)), sb = args.get("s_b", c.obj(3));
  nb::object v_out = nb::borrow(c.obj(4)), s_out = nb::borrow(c.obj(5));
  if (v_out.is_none()) v_out = allocate_like(c.obj(0), va, c.obj(10));
  if (s_out.is_none() && c.flag(9)) s_out = allocate_like(c.obj(1), sa, Py_None, DType::f32);
  const TensorView vo = args.get("v_out", v_out), so = args.optional("s_out", s_out);
  const MergeStateOptions o = merge_call_options(c, 6, 7, 8, 11);
  if (c.plan()) return nb::cast(plan_merge_state(va, sa, vb, sb, vo, so, o, c.limits()));
  kjit::merge_state(va, sa, vb, sb, vo, so, o, c.stream());
  return nb::make_tuple(v_out, s_out);
}

nb::object run_merge_state_in_place(Call& c) {
  // v s v_other s_other mask | lse_base lse_layout pos_inf_as_empty mode stream _plan _arch
  Args& args = c.args();
  const TensorView vv = args.get("v", c.obj(0)), ss = args.get("s", c.obj(1));
  const TensorView vo = args.get("v_other", c.obj(2)), so = args.get("s_other", c.obj(3));
  const TensorView m = args.optional("mask", c.obj(4));
  const MergeStateOptions o = merge_call_options(c, 5, 6, 7, 8);
  if (c.plan()) return nb::cast(plan_merge_state_in_place(vv, ss, vo, so, m, o, c.limits()));
  kjit::merge_state_in_place(vv, ss, vo, so, m, o, c.stream());
  return nb::make_tuple(c.obj(0), c.obj(1));
}

nb::object run_gdn_decode(Call& c) {
  // mixed_qkv a b a_log dt_bias state state_indices out | scale l2norm_qk softplus_threshold
  // invalid_index mode debug_check_indices row_order stream _plan _arch conv_weight conv_bias
  // conv_state conv_activation
  const char* op = c.op();
  Args& args = c.args();
  const TensorView qkv = args.get("mixed_qkv", c.obj(0));
  const TensorView ta = args.get("a", c.obj(1)), tb = args.get("b", c.obj(2));
  const TensorView al = args.get("a_log", c.obj(3)), dt = args.get("dt_bias", c.obj(4));
  const TensorView st = args.get("state", c.obj(5)), idx = args.get("state_indices", c.obj(6));
  nb::object out = nb::borrow(c.obj(7));
  if (out.is_none()) {
    // [B, HV, V] in mixed_qkv's dtype; shapes the op would refuse are refused by it.
    if (qkv.rank < 1 || st.rank < 3) {
      throw InvalidArgument(std::string(op) + ": cannot allocate out for mixed_qkv " + qkv.str() +
                            " and state " + st.str() +
                            "; expected [B, 2*H*K + HV*V] and [slots, HV, V, K]");
    }
    out = allocate_like(c.obj(0), shape_view({qkv.shape[0], st.shape[1], st.shape[2]}), Py_None);
  }
  const TensorView o = args.get("out", out);
  GdnDecodeOptions opt = decode_options(op, c.opt_number(8), c.flag(9), c.number(10), c.text(11),
                                        c.text(12), c.flag(13), c.text(14), args.device());
  if (c.given(18) || c.given(20)) {
    // The fused decode step (GdnDecodeOptions::conv): mixed_qkv before the convolution.
    if (!c.given(18) || !c.given(20)) {
      throw InvalidArgument(std::string(op) +
                            ": conv_weight and conv_state go together (the fused decode step "
                            "needs both; conv_bias may be None)");
    }
    const std::string act = c.text_or(21, "silu");
    ConvActivation activation = ConvActivation::silu;
    if (act == "none") {
      activation = ConvActivation::none;
    } else if (act != "silu" && act != "swish") {
      throw InvalidArgument(std::string(op) + ": conv_activation = '" + act +
                            "' is not an activation; accepted: 'silu' (or 'swish'), 'none'");
    }
    opt.conv =
        GdnDecodeConv{args.get("conv_weight", c.obj(18)), args.optional("conv_bias", c.obj(19)),
                      args.get("conv_state", c.obj(20)), activation};
  }
  if (c.plan()) {
    return nb::cast(plan_gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, c.limits()));
  }
  kjit::gdn_decode(qkv, ta, tb, al, dt, st, idx, o, opt, c.stream());
  return out;
}

nb::object run_qk_l2norm(Call& c) {
  // q k | q_out k_out eps stream _plan _arch
  Args& args = c.args();
  const TensorView tq = args.get("q", c.obj(0));
  const TensorView tk = args.optional("k", c.obj(1));
  nb::object q_out = nb::borrow(c.obj(2)), k_out = nb::borrow(c.obj(3));
  if (q_out.is_none()) q_out = allocate_like(c.obj(0), tq, Py_None);
  if (k_out.is_none() && c.given(1)) k_out = allocate_like(c.obj(1), tk, Py_None);
  const TensorView tq_out = args.get("q_out", q_out), tk_out = args.optional("k_out", k_out);
  QkL2NormOptions opt;
  // The op checks eps (finite, >= 0); a double that does not survive the narrowing is refused
  // by that same check (inf).
  opt.eps = static_cast<float>(c.number(4));
  opt.device = args.device();
  opt.runtime = &runtime();
  if (c.plan()) return nb::cast(plan_qk_l2norm(tq, tk, tq_out, tk_out, opt, c.limits()));
  kjit::qk_l2norm(tq, tk, tq_out, tk_out, opt, c.stream());
  if (!c.given(1)) return q_out;
  return nb::make_tuple(q_out, k_out);
}

nb::object run_merge_states(Call& c) {
  // v s v_out s_out | lse_base lse_layout pos_inf_as_empty return_lse out_dtype mode stream
  // _plan _arch
  const char* op = c.op();
  Args& args = c.args();
  const TensorView vv = args.get("v", c.obj(0)), ss = args.get("s", c.obj(1));
  nb::object v_out = nb::borrow(c.obj(2)), s_out = nb::borrow(c.obj(3));
  if (v_out.is_none()) {
    // [T, H, D] of v [T, S, H, D]; shapes the op would refuse are refused by it.
    if (vv.rank < 4) {
      throw InvalidArgument(std::string(op) + ": cannot allocate v_out for v " + vv.str() +
                            "; expected [T, S, H, D]");
    }
    v_out = allocate_like(c.obj(0), shape_view({vv.shape[0], vv.shape[2], vv.shape[3]}), c.obj(8));
  }
  if (s_out.is_none() && c.flag(7)) {
    // f32 [T, H] of s [T, S, H] (token_major), else [H, T] of s [H, T, S].
    if (ss.rank < 3) {
      throw InvalidArgument(std::string(op) + ": cannot allocate s_out for s " + ss.str() +
                            "; expected [T, S, H] (token_major) or [H, T, S] (head_major)");
    }
    const bool token_major = c.text(5) == "token_major";
    s_out = allocate_like(c.obj(1),
                          token_major ? shape_view({ss.shape[0], ss.shape[2]})
                                      : shape_view({ss.shape[0], ss.shape[1]}),
                          Py_None, DType::f32);
  }
  const TensorView vo = args.get("v_out", v_out), so = args.optional("s_out", s_out);
  const MergeStateOptions o = merge_call_options(c, 4, 5, 6, 9);
  if (c.plan()) return nb::cast(plan_merge_states(vv, ss, vo, so, o, c.limits()));
  kjit::merge_states(vv, ss, vo, so, o, c.stream());
  return nb::make_tuple(v_out, s_out);
}

/// out [B, HV, V] of a decode step, in mixed_qkv's dtype, when not given.
nb::object decode_out(Call& c, std::size_t at, const TensorView& qkv, const TensorView& st) {
  nb::object out = nb::borrow(c.obj(at));
  if (!out.is_none()) return out;
  // Shapes the op would refuse are refused by it.
  if (qkv.rank < 1 || st.rank < 3) {
    throw InvalidArgument(std::string(c.op()) + ": cannot allocate out for mixed_qkv " + qkv.str() +
                          " and state " + st.str() +
                          "; expected [B, 2*H*K + HV*V] and [slots, HV, V, K]");
  }
  return allocate_like(c.obj(0), shape_view({qkv.shape[0], st.shape[1], st.shape[2]}), Py_None);
}

nb::object run_gdn_decode_gated(Call& c) {
  // mixed_qkv g beta state state_indices out | scale l2norm_qk invalid_index mode
  // debug_check_indices row_order stream _plan _arch
  Args& args = c.args();
  const TensorView qkv = args.get("mixed_qkv", c.obj(0));
  const TensorView tg = args.get("g", c.obj(1)), tb = args.get("beta", c.obj(2));
  const TensorView st = args.get("state", c.obj(3)), idx = args.get("state_indices", c.obj(4));
  nb::object out = decode_out(c, 5, qkv, st);
  const TensorView o = args.get("out", out);
  const GdnDecodeOptions opt = decode_options(c.op(), c.opt_number(6), c.flag(7), 20.0, c.text(8),
                                              c.text(9), c.flag(10), c.text(11), args.device());
  if (c.plan()) return nb::cast(plan_gdn_decode_gated(qkv, tg, tb, st, idx, o, opt, c.limits()));
  kjit::gdn_decode_gated(qkv, tg, tb, st, idx, o, opt, c.stream());
  return out;
}

nb::object run_gdn_prefill(Call& c) {
  // q k v a b a_log dt_bias g beta cu_seqlens state state_indices has_initial_state out
  // final_state scale l2norm_qk softplus_threshold checkpoint_every_n_tokens state_checkpoints
  // checkpoint_cu_starts workspace mode stream _plan _arch: all positional, from kjit.gdn_prefill
  // (python/kjit/_api.py), which allocates out and the checkpoints.
  Args& args = c.args();
  const TensorView tq = args.get("q", c.obj(0)), tk = args.get("k", c.obj(1));
  const TensorView tv = args.get("v", c.obj(2));
  GdnGates gates;
  const bool raw = c.given(3) || c.given(4);
  const bool pre = c.given(7) || c.given(8);
  if (raw == pre) {
    throw InvalidArgument(
        "gdn_prefill: give either raw gates (a, b, a_log, dt_bias) or precomputed gates (g, "
        "beta), not " +
        std::string(raw ? "both" : "neither"));
  }
  if (raw) {
    gates = GdnGates::raw(args.get("a", c.obj(3)), args.get("b", c.obj(4)),
                          args.get("a_log", c.obj(5)), args.get("dt_bias", c.obj(6)));
  } else {
    gates = GdnGates::precomputed(args.get("g", c.obj(7)), args.get("beta", c.obj(8)));
  }
  const TensorView cu = args.get("cu_seqlens", c.obj(9));
  const TensorView st = args.get("state", c.obj(10));
  const TensorView idx = args.get("state_indices", c.obj(11));
  const TensorView has = args.optional("has_initial_state", c.obj(12));
  const TensorView o = args.get("out", c.obj(13));
  GdnPrefillOptions opt;
  opt.scale = static_cast<float>(c.number(15));
  opt.l2norm_qk = c.flag(16);
  opt.softplus_threshold = static_cast<float>(c.number(17));
  opt.final_state = args.optional("final_state", c.obj(14));
  opt.checkpoint_every_n_tokens = c.integer(18);
  opt.state_checkpoints = args.optional("state_checkpoints", c.obj(19));
  opt.checkpoint_cu_starts = args.optional("checkpoint_cu_starts", c.obj(20));
  opt.workspace = args.optional("workspace", c.obj(21));
  opt.force_mode = c.text(22);
  opt.device = args.device();
  opt.runtime = &runtime();
  if (c.plan()) {
    return nb::cast(plan_gdn_prefill(tq, tk, tv, gates, cu, st, idx, has, o, opt, c.limits()));
  }
  kjit::gdn_prefill(tq, tk, tv, gates, cu, st, idx, has, o, opt, c.stream());
  return nb::none();
}

nb::object run_causal_conv1d(Call& c) {
  // x weight bias conv_state cu_seqlens state_indices has_initial_state out activation
  // invalid_index mode debug_check_indices stream _plan _arch: all positional, from
  // kjit.causal_conv1d (python/kjit/_api.py, which allocates out) and kjit.compat.vllm.
  Args& args = c.args();
  const TensorView tx = args.get("x", c.obj(0)), tw = args.get("weight", c.obj(1));
  const TensorView tb = args.optional("bias", c.obj(2)), st = args.get("conv_state", c.obj(3));
  const TensorView cu = args.get("cu_seqlens", c.obj(4));
  const TensorView idx = args.get("state_indices", c.obj(5));
  const TensorView has = args.optional("has_initial_state", c.obj(6));
  const TensorView o = args.get("out", c.obj(7));
  const CausalConv1dOptions opt =
      conv_options(c.op(), c.opt_text(8), c.text(9), c.text(10), c.flag(11), args.device());
  if (c.plan()) {
    return nb::cast(plan_causal_conv1d(tx, tw, tb, st, cu, idx, has, o, opt, c.limits()));
  }
  kjit::causal_conv1d(tx, tw, tb, st, cu, idx, has, o, opt, c.stream());
  return nb::none();
}

nb::object run_causal_conv1d_update(Call& c) {
  // x weight bias conv_state state_indices num_accepted_tokens out activation invalid_index mode
  // debug_check_indices stream _plan _arch query_start_loc: positional, from
  // kjit.causal_conv1d_update (python/kjit/_api.py, which allocates out) and kjit.compat.vllm.
  Args& args = c.args();
  const TensorView tx = args.get("x", c.obj(0)), tw = args.get("weight", c.obj(1));
  const TensorView tb = args.optional("bias", c.obj(2)), st = args.get("conv_state", c.obj(3));
  const TensorView idx = args.get("state_indices", c.obj(4));
  const TensorView acc = args.optional("num_accepted_tokens", c.obj(5));
  const TensorView qsl = args.optional("query_start_loc", c.obj(14));
  const TensorView o = args.get("out", c.obj(6));
  const CausalConv1dOptions opt =
      conv_options(c.op(), c.opt_text(7), c.text(8), c.text(9), c.flag(10), args.device());
  if (qsl.data != nullptr) {
    // Varlen rows: x and out [T, D].
    if (c.plan()) {
      return nb::cast(
          plan_causal_conv1d_update_varlen(tx, tw, tb, st, qsl, idx, acc, o, opt, c.limits()));
    }
    kjit::causal_conv1d_update_varlen(tx, tw, tb, st, qsl, idx, acc, o, opt, c.stream());
    return nb::none();
  }
  if (c.plan()) {
    return nb::cast(plan_causal_conv1d_update(tx, tw, tb, st, idx, acc, o, opt, c.limits()));
  }
  kjit::causal_conv1d_update(tx, tw, tb, st, idx, acc, o, opt, c.stream());
  return nb::none();
}

}  // namespace

std::vector<OpBinding>& op_bindings() {
  using K = ParamKind;
  static std::vector<OpBinding> rows = {
      {"merge_state",
       {{"v_a", K::object},
        {"s_a", K::object},
        {"v_b", K::object},
        {"s_b", K::object},
        {"v_out", K::object, "None"},
        {"s_out", K::object, "None"},
        {"lse_base", K::lse_base, "None"},
        {"lse_layout", K::text, "'token_major'"},
        {"pos_inf_as_empty", K::flag, "True"},
        {"return_lse", K::flag, "True"},
        {"out_dtype", K::object, "None"},
        {"mode", K::text, "''"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"}},
       6,
       4,
       "Merges two partial attention states: (v_a, s_a) + (v_b, s_b) -> (v_out, s_out).\n\n"
       "v_*: [T, H, D] f16/bf16/f32, last dim contiguous. s_*: f32 LSE [T, H] (lse_layout\n"
       "'token_major') or [H, T] ('head_major'). lse_base is required: 2 (FlashInfer) or 'e'\n"
       "(FlashAttention, SGLang, vLLM). v_out defaults to a new tensor of v_a's shape in\n"
       "out_dtype (default v_a's dtype), s_out to a new f32 tensor of s_a's shape;\n"
       "return_lse=False skips writing the merged LSE. stream: None (torch's current stream on\n"
       "the tensors' device), an int (cudaStream_t), a torch or CuPy stream. Returns\n"
       "(v_out, s_out) (s_out None when not written).",
       &run_merge_state},
      {"merge_state_in_place",
       {{"v", K::object},
        {"s", K::object},
        {"v_other", K::object},
        {"s_other", K::object},
        {"mask", K::object, "None"},
        {"lse_base", K::lse_base, "None"},
        {"lse_layout", K::text, "'token_major'"},
        {"pos_inf_as_empty", K::flag, "True"},
        {"mode", K::text, "''"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"}},
       5,
       4,
       "(v, s) <- merge((v, s), (v_other, s_other)) for the tokens whose mask[t] is nonzero.\n\n"
       "mask: [T] bool/uint8, or None for every token. Returns (v, s).",
       &run_merge_state_in_place},
      {"merge_states",
       {{"v", K::object},
        {"s", K::object},
        {"v_out", K::object, "None"},
        {"s_out", K::object, "None"},
        {"lse_base", K::lse_base, "None"},
        {"lse_layout", K::text, "'token_major'"},
        {"pos_inf_as_empty", K::flag, "True"},
        {"return_lse", K::flag, "True"},
        {"out_dtype", K::object, "None"},
        {"mode", K::text, "''"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"}},
       4,
       2,
       "Merges S states per (token, head): v [T, S, H, D], s f32 [T, S, H] (token_major) or\n"
       "[H, T, S] (head_major) -> (v_out [T, H, D], s_out [T, H] / [H, T]).",
       &run_merge_states},
      {"gdn_decode",
       {{"mixed_qkv", K::object},
        {"a", K::object},
        {"b", K::object},
        {"a_log", K::object},
        {"dt_bias", K::object},
        {"state", K::object},
        {"state_indices", K::object},
        {"out", K::object, "None"},
        {"scale", K::opt_number, "None"},
        {"l2norm_qk", K::flag, "True"},
        {"softplus_threshold", K::number, "20.0"},
        {"invalid_index", K::text, "'negative'"},
        {"mode", K::text, "''"},
        {"debug_check_indices", K::flag, "False"},
        {"row_order", K::text, "'auto'"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"},
        {"conv_weight", K::object, "None"},
        {"conv_bias", K::object, "None"},
        {"conv_state", K::object, "None"},
        {"conv_activation", K::object, "'silu'"}},
       8,
       7,
       "One packed GDN decode step (raw gates), state updated in place in its pool slots.\n\n"
       "With conv_weight [D, W] and conv_state [slots, D, L] (conv_bias [D] or None): the fused\n"
       "decode step (GdnDecodeOptions::conv): mixed_qkv is taken before the causal conv update,\n"
       "which runs in the same kernel (conv_activation 'silu' or 'none'); both pools are\n"
       "indexed by state_indices and updated in place.\n\n"
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
       "'as_given' (GdnDecodeOptions::row_order; results are the same). Returns out.",
       &run_gdn_decode},
      {"gdn_decode_gated",
       {{"mixed_qkv", K::object},
        {"g", K::object},
        {"beta", K::object},
        {"state", K::object},
        {"state_indices", K::object},
        {"out", K::object, "None"},
        {"scale", K::opt_number, "None"},
        {"l2norm_qk", K::flag, "True"},
        {"invalid_index", K::text, "'negative'"},
        {"mode", K::text, "''"},
        {"debug_check_indices", K::flag, "False"},
        {"row_order", K::text, "'auto'"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::checked_arch, "None"}},
       6,
       5,
       "gdn_decode with precomputed f32 gates: g [B, HV] (log decay) and beta [B, HV].\n"
       "\n"
       "invalid_index defaults to 'negative' (index < 0 is padding, slot 0 is real: SGLang's\n"
       "pools); with vLLM's pools, whose slot 0 is a null block, pass 'nonpositive' (see\n"
       "gdn_decode).",
       &run_gdn_decode_gated},
      // kjit.gdn_prefill (python/kjit/_api.py) wraps this row: it makes the checkpoint buffers
      // from a host copy of cu_seqlens when they are not given. Every argument positional.
      {"_gdn_prefill",
       {{"q", K::object},
        {"k", K::object},
        {"v", K::object},
        {"a", K::object},
        {"b", K::object},
        {"a_log", K::object},
        {"dt_bias", K::object},
        {"g", K::object},
        {"beta", K::object},
        {"cu_seqlens", K::object},
        {"state", K::object},
        {"state_indices", K::object},
        {"has_initial_state", K::object},
        {"out", K::object},
        {"final_state", K::object},
        {"scale", K::number},
        {"l2norm_qk", K::flag},
        {"softplus_threshold", K::number},
        {"checkpoint_every_n_tokens", K::integer},
        {"state_checkpoints", K::object},
        {"checkpoint_cu_starts", K::object},
        {"workspace", K::object},
        {"mode", K::text},
        {"stream", K::object},
        {"_plan", K::plan},
        {"_arch", K::arch}},
       26,
       26,
       "gdn_prefill's binding; call kjit.gdn_prefill.",
       &run_gdn_prefill},
      // kjit.causal_conv1d and kjit.causal_conv1d_update (python/kjit/_api.py) wrap these
      // rows, and kjit.compat.vllm calls them with its own layouts: positional, out given.
      {"_causal_conv1d",
       {{"x", K::object},
        {"weight", K::object},
        {"bias", K::object},
        {"conv_state", K::object},
        {"cu_seqlens", K::object},
        {"state_indices", K::object},
        {"has_initial_state", K::object},
        {"out", K::object},
        {"activation", K::opt_text, "None"},
        {"invalid_index", K::text, "'negative'"},
        {"mode", K::text, "''"},
        {"debug_check_indices", K::flag, "False"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"}},
       15,
       8,
       "causal_conv1d's binding; call kjit.causal_conv1d.",
       &run_causal_conv1d},
      {"_causal_conv1d_update",
       {{"x", K::object},
        {"weight", K::object},
        {"bias", K::object},
        {"conv_state", K::object},
        {"state_indices", K::object},
        {"num_accepted_tokens", K::object},
        {"out", K::object},
        {"activation", K::opt_text, "None"},
        {"invalid_index", K::text, "'negative'"},
        {"mode", K::text, "''"},
        {"debug_check_indices", K::flag, "False"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::arch, "None"},
        {"query_start_loc", K::object, "None"}},
       15,
       7,
       "causal_conv1d_update's binding; call kjit.causal_conv1d_update.",
       &run_causal_conv1d_update},
      {"qk_l2norm",
       {{"q", K::object},
        {"k", K::object, "None"},
        {"q_out", K::object, "None"},
        {"k_out", K::object, "None"},
        {"eps", K::real, "1e-6"},
        {"stream", K::object, "None"},
        {"_plan", K::plan, "False"},
        {"_arch", K::checked_arch, "None"}},
       2,
       1,
       "L2-normalizes the rows of q [T, Hq, D] and k [T, Hk, D] (or q alone) in one launch\n"
       "(kjit/ops/qk_l2norm.hpp): x / sqrt(sum x^2 + eps) in f32, eps inside the root as in fla's\n"
       "l2norm_fwd. f16/bf16/f32; D a multiple of 8 up to 512; any token and head strides (last\n"
       "dimension contiguous). q_out / k_out default to new tensors; pass q_out=q (k_out=k) to\n"
       "normalize in place. Returns (q_out, k_out), or q_out when k is None.",
       &run_qk_l2norm},
  };
  return rows;
}

}  // namespace kjit::python
