// SPDX-License-Identifier: Apache-2.0
// gdn_decode: argument and option checks of both gate forms -> Problem (the plan memo's key).
#include <fmt/format.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "kjit/error.hpp"
#include "ops/gdn_decode/family.hpp"
#include "ops/tensor_checks.hpp"

namespace kjit::ops::decode {
namespace {

constexpr std::int64_t kMaxBatch = std::int64_t{1} << 24;

[[noreturn]] void fail(Form form, std::string_view argument, const TensorView& view,
                       std::string_view accepted) {
  checks(form).fail(argument, view, accepted);
}

/// Non-null (also when empty) and aligned to its element size.
void require_data(Form form, std::string_view name, const TensorView& view) {
  checks(form).not_null(name, view, /*empty_may_be_null=*/false);
  checks(form).element_aligned(name, view);
}

/// [rows, width] with the last dim contiguous and rows not overlapping (any larger row
/// stride: a view into a wider tensor).
void require_rows(Form form, std::string_view name, const TensorView& view, std::int64_t rows,
                  std::int64_t width, std::string_view shape) {
  checks(form).rank(name, view, 2, shape);
  if (view.shape[0] != rows || view.shape[1] != width) {
    fail(form, name, view, fmt::format("expected shape {} = [{}, {}]", shape, rows, width));
  }
  if (width > 1 && view.strides[1] != 1) fail(form, name, view, "its last dim must be contiguous");
  if (rows > 1 && view.strides[0] < width) {
    fail(form, name, view,
         fmt::format("its row stride must be >= the row width {} (rows may not overlap)", width));
  }
}

int largest_vector(const TensorView& state, std::int64_t slot_stride, std::int64_t slots) {
  const auto address = reinterpret_cast<std::uintptr_t>(state.data);
  const std::size_t esize = size_of(state.dtype);
  for (int bytes : {16, 8, 4, 2}) {
    if (static_cast<std::size_t>(bytes) < esize) break;
    if (address % static_cast<std::uintptr_t>(bytes) != 0) continue;
    if (slots > 1 && (static_cast<std::size_t>(slot_stride) * esize) % bytes != 0) continue;
    return bytes;
  }
  return static_cast<int>(esize);
}

Problem validate(Form form, const TensorView& qkv, const TensorView& a, const TensorView& b,
                 const TensorView* a_log, const TensorView* dt_bias, const TensorView& state,
                 const TensorView& indices, const TensorView& out,
                 const GdnDecodeOptions& options) {
  const ArgChecks c = checks(form);
  Problem p;
  p.form = form;
  const bool raw = form == Form::raw;
  const std::string_view a_name = raw ? "a" : "g";
  const std::string_view b_name = raw ? "b" : "beta";

  // The pool fixes HV, V, K.
  c.rank("state", state, 4, "[slots, HV, V, K]");
  c.float_dtype("state", state);
  require_data(form, "state", state);
  p.slots = state.shape[0];
  p.value_heads = state.shape[1];
  p.v = state.shape[2];
  p.k = state.shape[3];
  if (p.slots < 1 || p.value_heads < 1) {
    fail(form, "state", state, "slots and HV must be >= 1");
  }
  for (auto [dim, name] : {std::pair{p.k, "K"}, std::pair{p.v, "V"}}) {
    if (dim < 16 || dim > 256 || dim % 16 != 0) {
      fail(
          form, "state", state,
          fmt::format("{} = {} is not supported; accepted: multiples of 16 in 16..256", name, dim));
    }
  }
  // Strides of the [HV, V, K] block: K contiguous (vk), or V contiguous (kv: the transpose of a
  // contiguous [HV, K, V] block, fla's layout). V, K >= 16, so the two cannot be confused.
  const bool heads_packed = p.value_heads == 1 || state.strides[1] == p.v * p.k;
  if (heads_packed && state.strides[3] == 1 && state.strides[2] == p.k) {
    p.state_layout = StateLayout::vk;
  } else if (heads_packed && state.strides[2] == 1 && state.strides[3] == p.v) {
    p.state_layout = StateLayout::kv;
  } else {
    fail(form, "state", state,
         fmt::format("its strides are not an accepted layout of the [HV, V, K] block; accepted: "
                     "[*, {0}, {1}, 1] (K contiguous) or [*, {0}, 1, {2}] (V contiguous: a "
                     ".transpose(-1, -2) of a contiguous [slots, HV, K, V] pool); only the slot "
                     "stride may be padded",
                     p.v * p.k, p.k, p.v));
  }
  p.slot_stride = state.strides[0];
  if (p.slots > 1 && p.slot_stride < p.value_heads * p.v * p.k) {
    fail(form, "state", state,
         fmt::format("its slot stride must be >= HV*V*K = {} (slots may not overlap)",
                     p.value_heads * p.v * p.k));
  }
  p.state = state.dtype;
  p.vec_bytes = largest_vector(state, p.slot_stride, p.slots);

  // Indices fix B.
  c.rank("state_indices", indices, 1, "[B]");
  c.index_dtype("state_indices", indices);
  p.batch = indices.shape[0];
  if (p.batch < 1 || p.batch > kMaxBatch) {
    fail(form, "state_indices", indices,
         fmt::format("B = {} is out of range; accepted: 1..{}", p.batch, kMaxBatch));
  }
  require_data(form, "state_indices", indices);
  p.index = indices.dtype;
  p.index_stride = p.batch > 1 ? indices.strides[0] : 1;
  if (p.index_stride < 1) fail(form, "state_indices", indices, "its stride must be >= 1");

  // mixed_qkv fixes H.
  c.rank("mixed_qkv", qkv, 2, "[B, 2*H*K + HV*V]");
  c.float_dtype("mixed_qkv", qkv);
  const std::int64_t width = qkv.shape[1];
  const std::int64_t qk_width = width - p.value_heads * p.v;
  if (qk_width <= 0 || qk_width % (2 * p.k) != 0) {
    fail(form, "mixed_qkv", qkv,
         fmt::format("its width must be 2*H*K + HV*V with K = {}, HV*V = {}: 2*H*K = {} is not a "
                     "positive multiple of 2*K",
                     p.k, p.value_heads * p.v, qk_width));
  }
  p.heads = qk_width / (2 * p.k);
  if (p.value_heads % p.heads != 0) {
    fail(form, "mixed_qkv", qkv,
         fmt::format("it implies H = {} q/k heads, which must divide HV = {}", p.heads,
                     p.value_heads));
  }
  require_rows(form, "mixed_qkv", qkv, p.batch, width, "[B, 2*H*K + HV*V]");
  require_data(form, "mixed_qkv", qkv);
  p.qkv = qkv.dtype;
  p.qkv_row_stride = p.batch > 1 ? qkv.strides[0] : width;

  // Gates.
  require_rows(form, a_name, a, p.batch, p.value_heads, "[B, HV]");
  require_rows(form, b_name, b, p.batch, p.value_heads, "[B, HV]");
  require_data(form, a_name, a);
  require_data(form, b_name, b);
  if (raw) {
    c.float_dtype("a", a);
    if (b.dtype != a.dtype) {
      fail(form, "b", b, fmt::format("its dtype must equal a's ({})", to_string(a.dtype)));
    }
    for (auto [view, name] : {std::pair{a_log, "a_log"}, std::pair{dt_bias, "dt_bias"}}) {
      c.rank(name, *view, 1, "[HV]");
      c.float_dtype(name, *view);
      c.shape(name, *view, {p.value_heads}, "[HV]");
      c.contiguous(name, *view);
      require_data(form, name, *view);
    }
    p.gate = a.dtype;
    p.a_log = a_log->dtype;
    p.dt_bias = dt_bias->dtype;
  } else {
    if (a.dtype != DType::f32) fail(form, "g", a, "its dtype must be f32 (log decay)");
    if (b.dtype != DType::f32) fail(form, "beta", b, "its dtype must be f32");
  }
  p.a_row_stride = p.batch > 1 ? a.strides[0] : p.value_heads;
  p.b_row_stride = p.batch > 1 ? b.strides[0] : p.value_heads;

  // Output.
  c.rank("out", out, 3, "[B, HV, V]");
  c.float_dtype("out", out);
  c.shape("out", out, {p.batch, p.value_heads, p.v}, "[B, HV, V]");
  if (out.strides[2] != 1 || (p.value_heads > 1 && out.strides[1] != p.v)) {
    fail(form, "out", out,
         "its inner [HV, V] dims must be contiguous; only the row stride may vary");
  }
  if (p.batch > 1 && out.strides[0] < p.value_heads * p.v) {
    fail(form, "out", out,
         fmt::format("its row stride must be >= HV*V = {} (rows may not overlap)",
                     p.value_heads * p.v));
  }
  require_data(form, "out", out);
  p.out = out.dtype;
  p.out_row_stride = p.batch > 1 ? out.strides[0] : p.value_heads * p.v;

  // Options.
  const float scale =
      options.scale.value_or(static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.k))));
  if (!std::isfinite(scale)) {
    c.fail(fmt::format("options.scale = {} must be finite", scale));
  }
  p.scale_bits = std::bit_cast<std::uint32_t>(scale);
  if (raw && std::isnan(options.softplus_threshold)) {
    c.fail("options.softplus_threshold is NaN; accepted: any number");
  }
  return p;
}

/// options.force_cache_hints ("<load>/<store>") into the Problem's hints.
void parse_cache_hints(const GdnDecodeOptions& options, Problem& p) {
  const std::string& forced = options.force_cache_hints;
  if (forced.empty()) return;
  const std::size_t slash = forced.find('/');
  const std::string load = forced.substr(0, slash);
  const std::string store = slash == std::string::npos ? "" : forced.substr(slash + 1);
  int load_index = -1;
  int store_index = -1;
  for (int i = 0; i < static_cast<int>(std::size(kLoadHintNames)); ++i) {
    if (load == kLoadHintNames[i]) load_index = i;
  }
  for (int i = 0; i < static_cast<int>(std::size(kStoreHintNames)); ++i) {
    if (store == kStoreHintNames[i]) store_index = i;
  }
  if (load_index < 0 || store_index < 0) {
    throw InvalidArgument(fmt::format(
        "{}: options.force_cache_hints = '{}' is not accepted; expected '<load>/<store>' with "
        "load in stream, plain, l2_256, staged and store in stream, plain",
        op_name(p.form), forced));
  }
  p.hints_forced = true;
  p.load_hint = static_cast<LoadHint>(load_index);
  p.store_hint = static_cast<StoreHint>(store_index);
}

/// options.force_mode into the Problem's mode.
void parse_mode(const GdnDecodeOptions& options, Problem& p) {
  if (options.force_mode.empty()) return;
  for (int i = 1; i < static_cast<int>(std::size(kModeNames)); ++i) {
    if (options.force_mode == kModeNames[i]) {
      p.forced_mode = static_cast<Mode>(i);
      return;
    }
  }
  throw InvalidArgument(fmt::format(
      "{}: options.force_mode = '{}' is not a grid mode; accepted: '' (planner), flat, split, "
      "folded, persistent, bulk",
      op_name(p.form), options.force_mode));
}

}  // namespace

Problem Family::check(const Args& args) {
  const GdnDecodeOptions& options = *args.options;
  Problem p = validate(args.form, *args.qkv, *args.a, *args.b, args.a_log, args.dt_bias,
                       *args.state, *args.indices, *args.out, options);
  p.force_bv = options.force_bv;
  p.force_stages = options.force_stages;
  p.force_blocks_per_sm = options.force_blocks_per_sm;
  p.row_order = options.row_order;
  p.invalid_index = options.invalid_index;
  p.l2norm = options.l2norm_qk;
  // The planner read these strings first; parsed here, in the same order, they are values.
  parse_cache_hints(options, p);
  parse_mode(options, p);
  return p;
}

}  // namespace kjit::ops::decode
