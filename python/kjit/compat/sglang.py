# SPDX-License-Identifier: Apache-2.0
"""SGLang's functions on kjit's kernels.

- merge_state: sgl_kernel.merge_state (sgl-kernel/csrc/attention/cascade.cu), FlashInfer's
  MergeState: LSE in **base 2**, [T, H]; fp16/bf16.
- merge_state_v2: sgl_kernel.merge_state_v2 (merge_attn_states.cu): LSE in natural log, [T, H];
  fp32/fp16/bf16; an infinite LSE of either sign is an empty state.
- merge_state_triton: sglang.srt.layers.attention.triton_ops.merge_state.merge_state (the
  Triton fallback of sglang.srt.layers.attention.merge_state): natural log, [T, H].
- fused_recurrent_gated_delta_rule_packed_decode: sglang.srt.layers.attention.fla.
  fused_recurrent: SGLang's index rule, index < 0 is padding (slot 0 is a real slot).
- fused_sigmoid_gating_delta_rule_update: sglang.srt.layers.attention.fla.
  fused_sigmoid_gating_recurrent, the one-token decode (same rule); see its docstring.

All return (v_merged, s_merged) / (out, initial_state) like the originals; outputs not given
are allocated. Differences on purpose: two empty states (both LSE -inf) merge to 0 / -inf
where SGLang returns NaN; no 1024-thread limit (merge_state) and no grid y limit (decode);
the decode keeps beta = sigmoid(b) in f32 where SGLang rounds it to b's dtype first (a
difference below bf16 tolerance).
"""

from __future__ import annotations

from .. import _kjit
from ._common import (UnsupportedFeature, device_of, dtype_name, is_contiguous, is_cuda,
                      packed_decode)


def _f32(s):
    # sgl_kernel converts the LSE to float32 before the kernel (s.to(torch.float32)): the same
    # here, a no-op for float32 input.
    return s if dtype_name(s) == "float32" else s.to(_torch_float32(s))


def _torch_float32(like):
    import torch  # an LSE that is not float32 came from torch (NumPy ones only in CPU tests)

    return torch.float32


def _check_merge_inputs(fn, v_a, s_a, v_b, s_b):
    # sgl_kernel's C++ checks (CHECK_INPUT: CUDA and contiguous, CHECK_DIM, CHECK_SHAPE,
    # CHECK_EQ), which raise RuntimeError through TORCH_CHECK. kjit.InvalidArgument is a
    # RuntimeError (and a ValueError).
    for name, x in (("v_a", v_a), ("s_a", s_a), ("v_b", v_b), ("s_b", s_b)):
        if not is_cuda(x):
            raise _kjit.InvalidArgument(f"{fn}: {name} must be a CUDA tensor")
        if not is_contiguous(x):
            raise _kjit.InvalidArgument(f"{fn}: {name} must be contiguous")
    device = device_of(v_a)
    for name, x in (("s_a", s_a), ("v_b", v_b), ("s_b", s_b)):
        if device_of(x) != device:
            raise _kjit.InvalidArgument(
                f"{fn}: {name} is on {device_of(x)}, v_a on {device}; expected the same device")
    for name, x, dims in (("v_a", v_a, 3), ("s_a", s_a, 2), ("v_b", v_b, 3), ("s_b", s_b, 2)):
        if x.ndim != dims:
            raise _kjit.InvalidArgument(f"{fn}: {name} must be a {dims}D tensor (got {x.ndim}D)")
    if tuple(v_a.shape) != tuple(v_b.shape) or tuple(s_a.shape) != tuple(s_b.shape):
        raise _kjit.InvalidArgument(
            f"{fn}: shapes differ: v_a {tuple(v_a.shape)}, v_b {tuple(v_b.shape)}, "
            f"s_a {tuple(s_a.shape)}, s_b {tuple(s_b.shape)}")
    if v_a.shape[0] != s_a.shape[0] or v_a.shape[1] != s_b.shape[1]:
        raise _kjit.InvalidArgument(
            f"{fn}: s_a/s_b must be [seq_len, num_heads] = {tuple(v_a.shape[:2])} "
            f"(got {tuple(s_a.shape)})")


def merge_state(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
    """sgl_kernel.merge_state: FlashInfer's MergeState, base-2 LSE [T, H], fp16/bf16.
    Returns (v_merged, s_merged)."""
    s_a, s_b = _f32(s_a), _f32(s_b)
    _check_merge_inputs("kjit.compat.sglang.merge_state", v_a, s_a, v_b, s_b)
    if dtype_name(v_a) not in ("float16", "bfloat16"):
        # The original dispatches fp16/bf16 only (RuntimeError "unsupported data type").
        raise _kjit.InvalidArgument(
            f"kjit.compat.sglang.merge_state: v_a has dtype {dtype_name(v_a)}; accepted: "
            "float16, bfloat16 (merge_state_v2 takes float32)")
    return _kjit.merge_state(v_a, s_a, v_b, s_b, v_merged, s_merged, lse_base="2")


def merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
    """sgl_kernel.merge_state_v2: natural-log LSE [T, H], fp32/fp16/bf16, +-inf LSE = empty.
    Returns (v_merged, s_merged)."""
    s_a, s_b = _f32(s_a), _f32(s_b)
    _check_merge_inputs("kjit.compat.sglang.merge_state_v2", v_a, s_a, v_b, s_b)
    return _kjit.merge_state(v_a, s_a, v_b, s_b, v_merged, s_merged, lse_base="e")


def merge_state_triton(prefix_output, prefix_lse, suffix_output, suffix_lse, output=None,
                       output_lse=None):
    """sglang.srt.layers.attention.triton_ops.merge_state.merge_state: natural-log LSE
    [T, H], +inf LSE = empty. Returns (output, output_lse)."""
    return _kjit.merge_state(prefix_output, prefix_lse, suffix_output, suffix_lse, output,
                             output_lse, lse_base="e")


def fused_recurrent_gated_delta_rule_packed_decode(
    mixed_qkv,
    a,
    b,
    A_log,
    dt_bias,
    scale,
    initial_state,
    out,
    ssm_state_indices,
    use_qk_l2norm_in_kernel=False,
    rand_seed=None,
    use_rs_rounding=False,
    philox_rounds=10,
):
    """SGLang's packed GDN decode step (see kjit.compat.vllm's twin for the layouts); a state
    index < 0 is padding. Returns (out, initial_state)."""
    if use_rs_rounding:
        raise UnsupportedFeature(
            "kjit.compat.sglang.fused_recurrent_gated_delta_rule_packed_decode",
            "use_rs_rounding=True (stochastic rounding of the state)",
            "kjit rounds the state to the pool's dtype to nearest; use an f32 pool or "
            "use_rs_rounding=False")
    return packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                         ssm_state_indices, use_qk_l2norm_in_kernel, "negative")


def fused_sigmoid_gating_delta_rule_update(
    A_log,  # noqa: N803 - SGLang's name
    a,
    dt_bias,
    softplus_beta,
    softplus_threshold,
    q,
    k,
    v,
    b,
    initial_state_source,
    initial_state_indices,
    scale=None,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    is_kda=False,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
):
    """SGLang's non-packed GDN decode (TritonGDNKernel.decode): one token per sequence, q, k
    [1, N, H, K] (or [N, 1, H, K]), v [.., HV, V], a, b [N, HV] raw gates, the pool
    initial_state_source [slots, HV, V, K] updated in place at initial_state_indices (index
    < 0: padding). Returns o shaped like v.

    q, k and v are normally the three parts of one projection row (torch.split of mixed_qkv):
    then kjit reads that row in place, as its packed decode does. Otherwise they are
    concatenated into a packed row first (one copy of q, k, v). Padding rows get a zero output
    (SGLang's kernel computes the step from a zero state there; both leave the pool alone).
    cu_seqlens must be [0, 1, ..., N] (SGLang's decode): only its length is checked, since
    reading it would synchronize. Speculative verification (several tokens per sequence,
    disable_state_update, intermediate states, tree masks), KDA gates, softplus_beta != 1 and
    a missing initial_state_source raise UnsupportedFeature."""
    fn = "kjit.compat.sglang.fused_sigmoid_gating_delta_rule_update"
    if is_kda:
        raise UnsupportedFeature(fn, "is_kda=True (per-key KDA gates)",
                                 "kjit's GDN decode takes one gate per value head")
    if (disable_state_update or intermediate_states_buffer is not None
            or intermediate_state_indices is not None or retrieve_parent_token is not None):
        raise UnsupportedFeature(
            fn, "speculative target verification (disable_state_update, intermediate state "
            "caching, retrieve_parent_token)", "kjit runs the one-token decode step only")
    if float(softplus_beta) != 1.0:
        raise UnsupportedFeature(fn, f"softplus_beta={softplus_beta}",
                                 "kjit's gates use softplus with beta 1 (SGLang passes 1.0)")
    if initial_state_source is None:
        raise UnsupportedFeature(fn, "initial_state_source=None",
                                 "kjit's decode updates a state pool in place")
    if scale is not None:
        assert scale > 0, "scale must be positive"  # SGLang's own check
    batch, steps, heads, dim_k = k.shape
    heads_v, dim_v = v.shape[2], v.shape[3]
    rows = batch * steps
    sequences = batch if cu_seqlens is None else len(cu_seqlens) - 1
    if sequences != rows:
        raise UnsupportedFeature(
            fn, f"{rows} tokens for {sequences} sequences (more than one token per sequence)",
            "kjit's decode step takes one token per sequence; prefill goes through "
            "kjit.gdn_prefill / kjit.compat.fla")
    qr = q.reshape(rows, heads * dim_k)
    kr = k.reshape(rows, heads * dim_k)
    vr = v.reshape(rows, heads_v * dim_v)
    width = 2 * heads * dim_k + heads_v * dim_v
    mixed = _packed_view(qr, kr, vr, width)
    if mixed is None:
        import torch

        mixed = torch.cat([qr, kr, vr], dim=-1)  # the documented copy: q, k, v not one row
    out = _kjit.gdn_decode(mixed, a.reshape(rows, heads_v), b.reshape(rows, heads_v), A_log,
                           dt_bias, initial_state_source, initial_state_indices, scale=scale,
                           l2norm_qk=use_qk_l2norm_in_kernel,
                           softplus_threshold=float(softplus_threshold),
                           invalid_index="negative")
    return out.reshape(v.shape)


def _packed_view(qr, kr, vr, width):
    """mixed_qkv [rows, width] over the memory q, k and v already occupy, when they are the
    consecutive parts of one row buffer (same dtype, same row stride, k right after q and v
    right after k); else None."""
    if not (dtype_name(qr) == dtype_name(kr) == dtype_name(vr)):
        return None
    sq, sk, sv = qr.stride(), kr.stride(), vr.stride()
    if sq[1] != 1 or sk[1] != 1 or sv[1] != 1:
        return None
    if qr.shape[0] > 1 and not (sq[0] == sk[0] == sv[0] and sq[0] >= width):
        return None
    item = qr.element_size()
    base = qr.data_ptr()
    if kr.data_ptr() != base + qr.shape[1] * item or \
            vr.data_ptr() != base + (qr.shape[1] + kr.shape[1]) * item:
        return None
    return qr.as_strided((qr.shape[0], width), (max(sq[0], width), 1))
