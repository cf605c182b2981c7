# SPDX-License-Identifier: Apache-2.0
"""flash-linear-attention's Gated DeltaNet ops (fla.ops.gated_delta_rule) on kjit's chunked
prefill kernel, for inference: the forward pass only. A call that autograd would record raises
kjit.compat.UnsupportedFeature (call under torch.no_grad() / torch.inference_mode()).

Layouts: q, k [B, T, H, K], v [B, T, HV, V], g, beta [B, T, HV]; with cu_seqlens, B == 1 and
the N sequences are packed along T. fla's recurrent state is [N, HV, K, V] (K-major) by default,
[N, HV, V, K] with state_v_first=True. kjit's prefill takes both: its state is logically
[slots, HV, V, K], either K contiguous or V contiguous (the kernels' state_layout=kv
specialization), so fla's K-major states are passed as their .transpose(-1, -2) views and the
final states are written straight into a [N, HV, K, V] tensor: nothing is transposed or copied
per call. A float32 initial state whose [HV, K, V] (or [HV, V, K]) block is contiguous is read in
place; any other (bfloat16/float16, or other strides) is first converted to a float32 tensor of
the same layout, since fla computes and returns float32 final states and kjit writes final
states in the pool's dtype.

Returned final states are float32, as fla's. Gates: g is taken as float32 (fla reads it in
float32 too); use_gate_in_kernel (g raw: -exp(A_log) * softplus(g + dt_bias), threshold 20)
and use_beta_sigmoid_in_kernel (beta raw: sigmoid, times 2 with allow_neg_eigval) are applied
with torch element-wise ops before the kernel. Not supported (UnsupportedFeature): float32
q/k/v (kjit's prefill takes bfloat16/float16), head dims other than 64, 128, 256 (kjit
InvalidArgument), per-key/per-value decays gk/gv, head-wise beta [B, T, HV, V], cp_context.
chunk_size (16, 32 or 64 in fla) is a tiling choice: kjit always uses 64.
"""

from __future__ import annotations

import warnings

from .. import _api
from ._common import UnsupportedFeature, check_no_autograd, dtype_name, strides


def _deprecated_layout_kwarg(kwargs, state_v_first):
    # fla's own handling of the renamed keyword, kept so that old callers behave the same.
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError(
                "Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return state_v_first


def _check_varlen(q, initial_state, cu_seqlens):
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {q.shape[0]} when using "
                "`cu_seqlens`.Please flatten variable-length inputs before processing.")
        if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(
                "The number of initial states is expected to be equal to the number of input "
                f"sequences, i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")


def chunk_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    cu_seqlens_cpu=None,
    chunk_indices=None,
    cp_context=None,
    **kwargs,
):
    """fla.ops.gated_delta_rule.chunk_gated_delta_rule, forward only. Returns (o [B, T, HV, V],
    final_state [N, HV, K, V] float32 or None)."""
    fn = "kjit.compat.fla.chunk_gated_delta_rule"
    state_v_first = _deprecated_layout_kwarg(kwargs, state_v_first)
    # fla's checks, in its order and with its exception types.
    if q.shape[2] != k.shape[2]:
        raise ValueError(
            "q and k must have the same number of heads, "
            f"but got q.shape[2]={q.shape[2]} and k.shape[2]={k.shape[2]}")
    heads, heads_v = q.shape[2], v.shape[2]
    if heads_v % heads != 0:
        raise ValueError(
            f"For GVA, num_v_heads (HV={heads_v}) must be evenly divisible by "
            f"num_heads (H={heads}), but got HV % H = {heads_v % heads}")
    if "head_first" in kwargs:
        raise DeprecationWarning(
            "head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(
            f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got {chunk_size}.")
    if cp_context is not None:
        raise UnsupportedFeature(fn, "cp_context (context parallelism across devices)",
                                 "pass cp_context=None")
    _check_varlen(q, initial_state, cu_seqlens)
    use_gate_in_kernel = kwargs.get("use_gate_in_kernel", False)
    a_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    if use_gate_in_kernel:
        assert a_log is not None, "A_log must be provided when use_gate_in_kernel=True."
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    check_no_autograd(fn, q, k, v, g, beta, initial_state, a_log, dt_bias)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    return _forward(fn, q, k, v, g, beta, scale, initial_state, output_final_state,
                    use_qk_l2norm_in_kernel, use_gate_in_kernel, a_log, dt_bias,
                    use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens)


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g=None,
    gk=None,
    gv=None,
    beta=None,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    use_gate_in_kernel=False,
    A_log=None,  # noqa: N803 - fla's name
    dt_bias=None,
    use_beta_sigmoid_in_kernel=False,
    allow_neg_eigval=False,
    state_v_first=False,
    cu_seqlens=None,
    **kwargs,
):
    """fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule, forward only (computed by
    kjit's chunked kernel, which is exact up to rounding). Returns (o [B, T, HV, V],
    final_state [N, HV, K, V] float32 or None)."""
    fn = "kjit.compat.fla.fused_recurrent_gated_delta_rule"
    state_v_first = _deprecated_layout_kwarg(kwargs, state_v_first)
    _check_varlen(q, initial_state, cu_seqlens)
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("`A_log` must be provided when `use_gate_in_kernel=True`.")
        if g is None:
            raise ValueError(
                "`g` (raw pre-activation) must be provided when `use_gate_in_kernel=True`.")
    else:
        A_log = dt_bias = None  # noqa: N806 - fla ignores them without use_gate_in_kernel
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    for name, value in (("gk", gk), ("gv", gv)):
        if value is not None:
            raise UnsupportedFeature(fn, f"{name} (per-{name[1]} decay, GLA/KDA style)",
                                     "kjit's GDN kernels take one scalar decay g per head")
    check_no_autograd(fn, q, k, v, g, beta, initial_state, A_log, dt_bias)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    return _forward(fn, q, k, v, g, beta, scale, initial_state, output_final_state,
                    use_qk_l2norm_in_kernel, use_gate_in_kernel, A_log, dt_bias,
                    use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens)


def _forward(fn, q, k, v, g, beta, scale, initial_state, output_final_state, l2norm,
             gate_in_kernel, a_log, dt_bias, beta_sigmoid, neg_eigval, v_first, cu_seqlens):
    if dtype_name(q) not in ("float16", "bfloat16"):
        raise UnsupportedFeature(fn, f"{dtype_name(q)} q/k/v",
                                 "kjit's GDN prefill kernels take bfloat16 or float16 q, k, v")
    if beta is not None and beta.ndim == v.ndim:
        raise UnsupportedFeature(fn, "head-wise beta [B, T, HV, V]",
                                 "kjit takes one beta per token and value head: [B, T, HV]")
    import torch  # after the checks above, which the CPU tests run without torch
    batch, seq, heads, dim_k = q.shape
    heads_v, dim_v = v.shape[2], v.shape[3]
    tokens = batch * seq
    device = q.device
    f32 = torch.float32
    if cu_seqlens is None:
        count = batch
        # Equal-length sequences are varlen sequences at offsets 0, T, 2T, ...
        cu_seqlens = torch.arange(0, tokens + 1, max(seq, 1), dtype=torch.int32, device=device)
        if seq == 0:
            cu_seqlens = torch.zeros(batch + 1, dtype=torch.int32, device=device)
    else:
        count = cu_seqlens.shape[0] - 1
    if initial_state is not None and initial_state.shape[0] != count:
        raise ValueError(
            "The number of initial states is expected to be equal to the number of input "
            f"sequences, i.e., {count} rather than {initial_state.shape[0]}.")

    # Gates, float32 [tokens, HV] (kjit's precomputed form).
    if g is None:
        g32 = torch.zeros(tokens, heads_v, dtype=f32, device=device)
    else:
        g32 = g.reshape(tokens, heads_v).to(f32)
        if gate_in_kernel:
            x = g32 + (dt_bias.to(f32) if dt_bias is not None else 0.0)
            g32 = -torch.exp(a_log.to(f32)) * torch.where(x > 20.0, x, torch.log1p(torch.exp(x)))
    if beta is None:
        b32 = torch.ones(tokens, heads_v, dtype=f32, device=device)
    else:
        b32 = beta.reshape(tokens, heads_v).to(f32)
        if beta_sigmoid:
            b32 = torch.sigmoid(b32) * (2.0 if neg_eigval else 1.0)

    # States, all in fla's layout: [N, HV, K, V] (K-major) or, v_first, [N, HV, V, K]. kjit reads
    # slot state_indices[n] of a pool whose [HV, V, K] block has K or V contiguous, and writes
    # final states back there, or to final_state (same layout) when given, the pool then only
    # read. K-major tensors go to kjit as their transposed views. fla never writes into
    # initial_state.
    fla_shape = (count, heads_v, dim_v, dim_k) if v_first else (count, heads_v, dim_k, dim_v)

    def as_kjit(state):  # [.., HV, V, K] view of a tensor in fla's layout (no copy)
        return state if v_first else state.transpose(-1, -2)

    own_pool = False
    if initial_state is not None:
        st = strides(initial_state)
        if (dtype_name(initial_state) == "float32" and st[-1] == 1
                and st[-2] == fla_shape[-1] and st[-3] == fla_shape[-1] * fla_shape[-2]):
            pool = initial_state  # read in place, in either layout
        else:
            # A dtype (or stride) conversion in fla's own layout: final states are float32,
            # and kjit writes them in the pool's dtype.
            pool = torch.empty(fla_shape, dtype=f32, device=device)
            pool.copy_(initial_state)
            own_pool = True
        indices = torch.arange(count, dtype=torch.int32, device=device)
    else:
        # No initial state: every sequence is "padding" (index -1), which starts from zeros
        # and never touches the pool, so a one-slot pool is never read.
        pool = torch.empty((1,) + fla_shape[1:], dtype=f32, device=device)
        indices = torch.full((count,), -1, dtype=torch.int32, device=device)
    final = None
    if not own_pool and (output_final_state or initial_state is not None):
        # Final states must not land in the caller's initial_state (or be lost for padding).
        final = torch.empty(fla_shape, dtype=f32, device=device)

    out = _api.gdn_prefill(q.reshape(tokens, heads, dim_k), k.reshape(tokens, heads, dim_k),
                           v.reshape(tokens, heads_v, dim_v), cu_seqlens, as_kjit(pool), indices,
                           g=g32, beta=b32, final_state=None if final is None else as_kjit(final),
                           scale=float(scale), l2norm_qk=bool(l2norm))
    o = out.reshape(batch, seq, heads_v, dim_v)
    if not output_final_state:
        return o, None
    return o, (pool if final is None else final)  # fla's layout already
