// SPDX-License-Identifier: Apache-2.0
// gdn_prefill in the op catalog (kjit/catalog.hpp).
#include "kjit/ops/gdn_prefill.hpp"
#include "ops/catalog_entries.hpp"

namespace kjit::catalog_detail {
namespace {

std::vector<OpParam> gdn_prefill_params() {
  return {
      size("tokens", "1,64,1000,8192,65536", "tokens T over all sequences", at_least(0)),
      size("seqs", "1,4,64", "sequences N", at_least(0)),
      size("heads", "", "q/k heads H", dividing("v_heads")),
      size("v_heads", "", "value heads HV (a multiple of H)"),
      size("k", "", "key head dim K (64, 128, 256)", one_of({64, 128, 256})),
      size("v", "", "value head dim V (64, 128, 256)", one_of({64, 128, 256})),
      option("dtype", "bf16", "dtype of q, k, v (bf16, f16)"),
      option("gate_dtype", "=dtype", "dtype of a and b (raw gates)"),
      option("param_dtype", "f32", "dtype of A_log and dt_bias"),
      option("state_dtype", "f32", "dtype of the state pool (f32, bf16)"),
      option("out_dtype", "=dtype", "dtype of out"),
      option("cu_dtype", "i32", "dtype of cu_seqlens (i32, i64)"),
      option("index_dtype", "i32", "dtype of state_indices (i32, i64)"),
      option("gated", "0", "1: precomputed f32 g and beta"),
      option("l2norm", "1", "1: L2-normalize q and k"),
      option("mode", "",
             "force a path and value tile (bv64, bv32, bv16: fused; chunked, chunked_bv128 .. "
             "_bv16; a chunked mode + _wgmma: sm_90a warpgroup MMA; chunked_cp or chunked_cp<L>: "
             "context-parallel, segments of L chunks, optionally + _s2/_s3 input stages)"),
      option("checkpoint", "0",
             "state checkpoints every this many tokens (a multiple of 64; 0: none)"),
  };
}

Plan plan_prefill(const OpInfo&, const ShapeValues& values, const DeviceLimits& device) {
  const std::int64_t t = get_int(values, "tokens");
  const std::int64_t n = get_int(values, "seqs");
  const std::int64_t h = get_int(values, "heads");
  const std::int64_t hv = get_int(values, "v_heads");
  const std::int64_t k = get_int(values, "k");
  const std::int64_t v = get_int(values, "v");
  const DType dtype = get_dtype(values, "dtype");
  GdnPrefillOptions options;
  options.l2norm_qk = get_bool(values, "l2norm");
  options.force_mode = values.at("mode");
  FakeMemory memory;
  const TensorView q = memory.tensor(dtype, {t, h, k});
  const TensorView kk = memory.tensor(dtype, {t, h, k});
  const TensorView vv = memory.tensor(dtype, {t, hv, v});
  GdnGates gates;
  if (get_bool(values, "gated")) {
    gates = GdnGates::precomputed(memory.tensor(DType::f32, {t, hv}),
                                  memory.tensor(DType::f32, {t, hv}));
  } else {
    const DType gate = get_dtype(values, "gate_dtype");
    const DType param = get_dtype(values, "param_dtype");
    gates = GdnGates::raw(memory.tensor(gate, {t, hv}), memory.tensor(gate, {t, hv}),
                          memory.tensor(param, {hv}), memory.tensor(param, {hv}));
  }
  const TensorView cu = memory.tensor(get_dtype(values, "cu_dtype"), {n + 1});
  const TensorView state = memory.tensor(get_dtype(values, "state_dtype"), {n + 1, hv, v, k});
  const TensorView indices = memory.tensor(get_dtype(values, "index_dtype"), {n});
  const TensorView has_initial = FakeMemory::none(DType::u8, {n});
  const TensorView out = memory.tensor(get_dtype(values, "out_dtype"), {t, hv, v});
  options.checkpoint_every_n_tokens = get_int(values, "checkpoint");
  if (options.checkpoint_every_n_tokens > 0) {
    // The most rows the call could write: every token of one sequence checkpointed.
    const std::int64_t rows = t / options.checkpoint_every_n_tokens + 1;
    options.state_checkpoints = memory.tensor(state.dtype, {rows, hv, v, k});
    options.checkpoint_cu_starts = memory.tensor(DType::i64, {n + 1});
  }
  return plan_gdn_prefill(q, kk, vv, gates, cu, state, indices, has_initial, out, options, device);
}

}  // namespace

std::vector<OpInfo> gdn_prefill_entries() {
  return {
      {"gdn_prefill", gdn_prefill_params(), "Gated DeltaNet chunked varlen prefill", plan_prefill}};
}

}  // namespace kjit::catalog_detail
