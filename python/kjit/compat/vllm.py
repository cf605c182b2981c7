# SPDX-License-Identifier: Apache-2.0
"""vLLM's functions on kjit's kernels.

- merge_attn_states: vllm.v1.attention.ops.merge_attn_states.merge_attn_states. LSE in natural
  log, layout [NUM_HEADS, NUM_TOKENS] (head-major); outputs [NUM_TOKENS, NUM_HEADS, HEAD_SIZE]
  with any token/head stride (kjit reads strides, as vLLM's padded-head-stride kernels do).
- fused_recurrent_gated_delta_rule_packed_decode:
  vllm.model_executor.layers.fla.ops (vllm/third_party/flash_linear_attention/ops/
  fused_recurrent.py). vLLM's null-block rule: a state index <= 0 is padding (slot 0 is
  NULL_BLOCK_ID, -1 is PAD_SLOT_ID): its output row is zeros and the pool is not touched.

Behaviour that differs from vLLM, on purpose:
- merge: both LSEs -inf (no keys on either side) gives output 0 and LSE -inf. vLLM's Triton
  kernel returns NaN there; its CUDA kernel copies prefix_output.
- decode: no grid limit (vLLM's split grid still stops at B = 65535).
"""

from __future__ import annotations

from .. import _kjit
from ._common import UnsupportedFeature, dtype_name, is_contiguous, strides

_FLOAT_OUT = ("float32", "float16", "bfloat16")


def merge_attn_states(
    output,
    prefix_output,
    prefix_lse,
    suffix_output,
    suffix_lse,
    output_lse=None,
    prefill_tokens_with_context=None,
    output_scale=None,
) -> None:
    """output[t, h] = LSE-weighted merge of prefix_output and suffix_output (natural-log LSE,
    [H, T]); output_lse [H, T] receives the merged LSE when given. Tokens at index >=
    prefill_tokens_with_context take suffix_output and suffix_lse unchanged. Returns None."""
    # vLLM's own checks, with its exception type (AssertionError). Its kernels derive the suffix
    # head stride from prefix_output; kjit would not need that, but a call vLLM rejects is
    # rejected here too so that code written against this adapter runs on vLLM unchanged.
    assert strides(prefix_output)[1] == strides(suffix_output)[1], (
        "merge_attn_states requires prefix_output and suffix_output to have "
        f"matching head strides, got {strides(prefix_output)[1]} and "
        f"{strides(suffix_output)[1]}")
    if dtype_name(output) not in _FLOAT_OUT:
        assert output_scale is not None, (
            f"output_scale is required when output is {output.dtype}")
    if output_scale is not None:
        raise UnsupportedFeature(
            "kjit.compat.vllm.merge_attn_states", "output_scale (FP8 output quantization)",
            "pass output_scale=None with a float32/float16/bfloat16 output")
    tokens = output.shape[0]
    with_context = tokens if prefill_tokens_with_context is None else max(
        0, min(int(prefill_tokens_with_context), tokens))
    if with_context == tokens:
        _kjit.merge_state(prefix_output, prefix_lse, suffix_output, suffix_lse, output,
                          output_lse, lse_base="e", lse_layout="head_major",
                          return_lse=output_lse is not None)
        return None
    # Tokens past prefill_tokens_with_context have no prefix (decode tokens after the prefills
    # in vLLM's batch order): vLLM copies the suffix there. kjit merges the leading tokens on
    # views (the LSE views [:, :n] keep their token stride) and copies the rest.
    if with_context > 0:
        _kjit.merge_state(prefix_output[:with_context], prefix_lse[:, :with_context],
                          suffix_output[:with_context], suffix_lse[:, :with_context],
                          output[:with_context],
                          None if output_lse is None else output_lse[:, :with_context],
                          lse_base="e", lse_layout="head_major",
                          return_lse=output_lse is not None)
    output[with_context:].copy_(suffix_output[with_context:])
    if output_lse is not None:
        output_lse[:, with_context:].copy_(suffix_lse[:, with_context:])
    return None


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
):
    """One GDN decode step for B requests: mixed_qkv [B, 2*H*K + HV*V] (rows [q | k | v]),
    a, b [B, HV] (raw gates), A_log, dt_bias [HV], initial_state [slots, HV, V, K] updated in
    place at ssm_state_indices [B] (index <= 0: padding), out [B, 1, HV, V] written. Returns
    (out, initial_state)."""
    # The checks vLLM makes in Python and kjit cannot make itself (it sees out as [B, HV, V]).
    # Everything else (dims, strides, dtypes, head counts) kjit validates, raising
    # kjit.InvalidArgument, which is a ValueError like vLLM's own errors.
    if ssm_state_indices.ndim != 1:
        raise ValueError(
            "`ssm_state_indices` must be 1D for packed decode "
            f"(got ndim={ssm_state_indices.ndim}).")
    if not is_contiguous(out):
        raise ValueError("`out` must be contiguous.")
    if initial_state.ndim != 4:
        raise ValueError(f"`initial_state` must be a 4D tensor (got ndim={initial_state.ndim}).")
    batch = mixed_qkv.shape[0]
    heads_v, dim_v = initial_state.shape[1], initial_state.shape[2]
    if tuple(out.shape) != (batch, 1, heads_v, dim_v):
        raise ValueError(f"`out` must have shape {(batch, 1, heads_v, dim_v)} "
                         f"(got out.shape={tuple(out.shape)}).")
    _kjit.gdn_decode(mixed_qkv, a, b, A_log, dt_bias, initial_state, ssm_state_indices,
                     out.reshape(batch, heads_v, dim_v), scale=scale,
                     l2norm_qk=use_qk_l2norm_in_kernel, invalid_index="nonpositive")
    return out, initial_state
