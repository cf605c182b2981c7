# SPDX-License-Identifier: Apache-2.0
"""vLLM's functions on kjit's kernels.

- merge_attn_states: vllm.v1.attention.ops.merge_attn_states.merge_attn_states. LSE in natural
  log, layout [NUM_HEADS, NUM_TOKENS] (head-major); outputs [NUM_TOKENS, NUM_HEADS, HEAD_SIZE]
  with any token/head stride (kjit reads strides, as vLLM's padded-head-stride kernels do).
- fused_recurrent_gated_delta_rule_packed_decode:
  vllm.model_executor.layers.fla.ops (vllm/third_party/flash_linear_attention/ops/
  fused_recurrent.py). vLLM's null-block rule: a state index <= 0 is padding (slot 0 is
  NULL_BLOCK_ID, -1 is PAD_SLOT_ID): its output row is zeros and the pool is not touched.

- causal_conv1d_fn / causal_conv1d_update: vllm.model_executor.layers.mamba.ops.causal_conv1d
  (the Triton versions). Prefill x is [dim, total_tokens] (vLLM passes mixed_qkv.transpose(0,
  1), channel-contiguous memory), decode x [batch, dim] or [batch, dim, seqlen]; the pool
  conv_states [slots, dim, L >= width-1] is the transpose of vLLM's [slots, L, dim] buffer. kjit
  reads all of them through strides (no copy) and returns a new output of x's shape, layout and
  dtype, as vLLM does (x itself is not written). An index equal to pad_slot_id (-1) is padding.

Behaviour that differs from vLLM, on purpose:
- merge: both LSEs -inf (no keys on either side) gives output 0 and LSE -inf. vLLM's Triton
  kernel returns NaN there; its CUDA kernel copies prefix_output.
- decode: no grid limit (vLLM's split grid still stops at B = 65535).
- causal_conv1d: padding rows of the output are zeros (vLLM leaves them uninitialized); x is
  not rounded to the pool's dtype before the convolution when the two differ (vLLM converts x
  first); no host synchronization without `metadata` (vLLM copies query_start_loc to the host).
- causal_conv1d_update with query_start_loc and without num_accepted_tokens: a row shorter than
  max_query_len ends with its last width-1 inputs in columns 0..width-2, as every other row;
  vLLM's kernel then shifts only the first width-1-(max_query_len-seqlen_b) columns (its
  per-row state length), leaving the others stale. With num_accepted_tokens (how vLLM calls
  it) both write the same columns.
"""

from __future__ import annotations

from .. import _kjit
from ._common import UnsupportedFeature, dtype_name, packed_decode, strides, torch_module

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
    return packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
                         ssm_state_indices, use_qk_l2norm_in_kernel, "nonpositive")


# ---------------------------------------------------------------------------------------------
# causal_conv1d (vllm/model_executor/layers/mamba/ops/causal_conv1d.py)

PAD_SLOT_ID = -1  # vLLM's PAD_SLOT_ID (vllm.attention.backends.utils / v1.attention.backends)


def _conv_activation(adapter, activation):
    """vLLM's causal_conv1d_fn reading of activation: True and 'silu'/'swish' mean SiLU; None
    and False none. Any other value vLLM silently treats as no activation: refused here."""
    if activation is True or activation in ("silu", "swish"):
        return "silu"
    if activation is None or activation is False:
        return None
    raise UnsupportedFeature(
        adapter, f"activation={activation!r}",
        "vLLM's kernel applies no activation for it (only 'silu'/'swish' or True select one); "
        "pass None for none")


def _invalid_rule(adapter, pad_slot_id):
    """kjit's padding rule for vLLM's pad_slot_id. vLLM skips an index equal to pad_slot_id;
    kjit skips every negative index ('negative', so also -1) or every index <= 0
    ('nonpositive', for pad_slot_id 0). Other negative indices are out of vLLM's pool anyway."""
    if pad_slot_id is None or int(pad_slot_id) < 0:
        return "negative"
    if int(pad_slot_id) == 0:
        return "nonpositive"
    raise UnsupportedFeature(
        adapter, f"pad_slot_id={pad_slot_id}",
        "kjit treats the negative indices (or, for pad_slot_id=0, the indices <= 0) as padding; "
        "vLLM pads with -1 (PAD_SLOT_ID)")


def _like(x, fill, n):
    """A 1-D array on x's device: arange(n) int32 (fill None) or n copies of `fill` (bool)."""
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if fill is None:
            return torch.arange(n, dtype=torch.int32, device=x.device)
        return torch.full((n,), fill, dtype=torch.bool, device=x.device)
    import numpy as np  # host arrays: the CPU tests

    return np.arange(n, dtype=np.int32) if fill is None else np.full(n, fill, dtype=bool)


def _empty_like(x):
    # torch.empty_like / numpy.empty_like keep a dense input's memory layout, as vLLM's
    # torch.empty_like(x) does: the [dim, T] transpose of a [T, dim] buffer stays token-major.
    torch = torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    import numpy as np

    return np.empty_like(x)


def causal_conv1d_fn(
    x,
    weight,
    bias,
    conv_states,
    query_start_loc,
    cache_indices=None,
    has_initial_state=None,
    activation="silu",
    pad_slot_id=PAD_SLOT_ID,
    block_idx_first_scheduled_token=None,
    block_idx_last_scheduled_token=None,
    initial_state_idx=None,
    num_computed_tokens=None,
    block_size_to_align=0,
    metadata=None,
    validate_data=False,
):
    """Varlen causal depthwise conv1d of vLLM's prefill: x [dim, total_tokens] (sequences
    concatenated along tokens, query_start_loc [batch + 1]), weight [dim, width], bias [dim] or
    None, conv_states [slots, dim, L >= width-1] (channel stride 1) read as each sequence's
    history where has_initial_state [batch] is true and updated in place at cache_indices
    [batch] (index == pad_slot_id: padding, zero output, slot untouched). Returns a new
    [dim, total_tokens] tensor of x's dtype and layout.

    cache_indices None means sequence i uses slot i; has_initial_state None means no sequence
    has one (zero history; vLLM's Triton kernel cannot run without it). metadata (vLLM's
    precomputed Triton program lists) and block_size_to_align (used only with prefix caching)
    do not change the result and are ignored. Prefix caching (block_idx_first_scheduled_token,
    block_idx_last_scheduled_token, initial_state_idx, num_computed_tokens) raises
    UnsupportedFeature: kjit reads and writes one slot per sequence."""
    fn = "kjit.compat.vllm.causal_conv1d_fn"
    apc = [name for name, value in (
        ("block_idx_first_scheduled_token", block_idx_first_scheduled_token),
        ("block_idx_last_scheduled_token", block_idx_last_scheduled_token),
        ("initial_state_idx", initial_state_idx),
        ("num_computed_tokens", num_computed_tokens)) if value is not None]
    if apc:
        raise UnsupportedFeature(
            fn, "prefix caching (" + ", ".join(apc) + ")",
            "kjit's causal_conv1d reads and writes one pool slot per sequence; run without "
            "vLLM's automatic prefix caching for mamba layers")
    silu = _conv_activation(fn, activation)
    if conv_states is None:
        raise _kjit.InvalidArgument(
            f"{fn}: conv_states is None; vLLM's causal_conv1d_fn needs the conv-state pool "
            "[slots, dim, width - 1]")
    if x.ndim != 2:
        raise ValueError(f"{fn}: x must be [dim, total_tokens] (got shape {tuple(x.shape)})")
    if weight.ndim != 2:
        raise ValueError(f"{fn}: weight must be [dim, width] (got shape {tuple(weight.shape)})")
    dim, width = x.shape[0], weight.shape[1]
    batch = query_start_loc.shape[0] - 1
    # vLLM's own checks, always made (AssertionError): the pool's dim and width, channel stride 1.
    assert conv_states.ndim == 3 and conv_states.shape[1] == dim and \
        width - 1 <= conv_states.shape[2], (
            f"conv_states must be [slots, dim={dim}, >= width-1={width - 1}] "
            f"(got {tuple(conv_states.shape)})")
    assert strides(conv_states)[1] == 1, (
        f"conv_states must have channel stride 1 (got strides {strides(conv_states)})")
    if validate_data:
        xs = strides(x)
        assert query_start_loc.ndim == 1
        assert xs[0] == 1 or xs[1] == 1
        if bias is not None:
            assert bias.ndim == 1 and bias.shape[0] == dim
        if cache_indices is not None:
            assert cache_indices.ndim == 1 and cache_indices.shape[0] == batch
        if has_initial_state is not None:
            assert tuple(has_initial_state.shape) == (batch,)
        assert strides(weight)[1] == 1
        assert tuple(weight.shape) == (dim, width)
        assert xs[0] == 1 and xs[1] > 1, "Need to run in channel-last layout"
        if block_size_to_align is not None and block_size_to_align > 0:
            assert block_size_to_align % 8 == 0, (
                "The mamba block size needs to be divisible by the BLOCK_M")
    invalid = _invalid_rule(fn, pad_slot_id)
    if cache_indices is None:
        indices, invalid = _like(x, None, batch), "negative"
    else:
        # Without prefix caching vLLM reads column 0 of a [batch, blocks] index table.
        indices = cache_indices if cache_indices.ndim == 1 else cache_indices[:, 0]
    if has_initial_state is None:
        has_initial_state = _like(x, False, batch)
    out = _empty_like(x)
    _kjit._causal_conv1d(x.swapaxes(0, 1), weight, bias, conv_states, query_start_loc, indices,
                         has_initial_state, out.swapaxes(0, 1), silu, invalid, "", False, None,
                         False, None)
    return out


def causal_conv1d_update(
    x,
    conv_state,
    weight,
    bias=None,
    activation=None,
    conv_state_indices=None,
    num_accepted_tokens=None,
    query_start_loc=None,
    max_query_len=-1,
    pad_slot_id=PAD_SLOT_ID,
    block_idx_last_scheduled_token=None,
    initial_state_idx=None,
    retrieve_parent_token=None,
    validate_data=False,
):
    """vLLM's decode / speculative step: x [batch, dim] (one token) or [batch, dim, seqlen],
    conv_state [slots, dim, L] updated in place at conv_state_indices [batch] (None: row b uses
    slot b; == pad_slot_id: padding, zero output, slot untouched). Without num_accepted_tokens
    the history is columns 0..width-2; with it (speculative decoding, L >= width-2+seqlen) the
    history of row b starts at column num_accepted_tokens[b]-1 and the pool rolls by one
    column. Returns a new tensor of x's shape, layout and dtype.

    Varlen rows (vLLM's speculative decoding of rows with different draft lengths):
    query_start_loc [batch + 1] with x [num_tokens, dim]; row b is
    x[query_start_loc[b]:query_start_loc[b + 1]] (seqlen_b tokens, 0 allowed: no output, slot
    untouched) and conv_state_indices is required, as in vLLM. max_query_len (vLLM's block size
    for the rows, which must be at least every seqlen_b there) is not needed: kjit reads each
    row's length from query_start_loc. Output rows outside every row are left unwritten, as in
    vLLM.

    Raises UnsupportedFeature for prefix caching (block_idx_last_scheduled_token,
    initial_state_idx) and EAGLE trees (retrieve_parent_token)."""
    fn = "kjit.compat.vllm.causal_conv1d_update"
    if validate_data:
        assert pad_slot_id is not None
        assert strides(x)[1] == 1
    if isinstance(activation, bool):
        activation = "silu" if activation else None
    elif activation is not None:
        assert activation in ["silu", "swish"]
    if block_idx_last_scheduled_token is not None or initial_state_idx is not None:
        raise UnsupportedFeature(
            fn, "prefix caching (block_idx_last_scheduled_token, initial_state_idx)",
            "kjit's causal_conv1d_update reads and writes one pool slot per row")
    if retrieve_parent_token is not None:
        raise UnsupportedFeature(
            fn, "retrieve_parent_token (EAGLE tree drafts)",
            "kjit's update convolves each row's tokens in order")
    varlen = query_start_loc is not None
    if varlen:
        # vLLM's own requirement (AssertionError): the rows' slots give the batch size.
        assert conv_state_indices is not None
        if x.ndim != 2:
            raise ValueError(f"{fn}: with query_start_loc, x must be [num_tokens, dim] "
                             f"(got shape {tuple(x.shape)})")
    if x.ndim not in (2, 3):
        raise ValueError(f"{fn}: x must be [batch, dim] or [batch, dim, seqlen] "
                         f"(got shape {tuple(x.shape)})")
    if weight.ndim != 2:
        raise ValueError(f"{fn}: weight must be [dim, width] (got shape {tuple(weight.shape)})")
    if conv_state.ndim != 3:
        raise ValueError(f"{fn}: conv_state must be [slots, dim, state_len] "
                         f"(got shape {tuple(conv_state.shape)})")
    batch = conv_state_indices.shape[0] if varlen else x.shape[0]
    dim = x.shape[1]
    width = weight.shape[1]
    slots, state_len = conv_state.shape[0], conv_state.shape[2]
    if validate_data:
        assert dim == weight.shape[0]
        assert strides(conv_state)[-2] == 1, (
            "ERROR: expect contiguous along feat-dim of conv_state (currently "
            f"stride={strides(conv_state)})")
        assert state_len >= width - 1
        assert dim == conv_state.shape[1]
        if conv_state_indices is None:
            assert slots >= batch
        else:
            assert (batch,) == tuple(conv_state_indices.shape)
        assert slots >= batch
        assert strides(weight)[1] == 1
    invalid = _invalid_rule(fn, pad_slot_id)
    if conv_state_indices is None:
        conv_state_indices, invalid = _like(x, None, batch), "negative"
    out = _empty_like(x)
    rows = (x, out) if x.ndim == 2 else (x.swapaxes(1, 2), out.swapaxes(1, 2))
    _kjit._causal_conv1d_update(rows[0], weight, bias, conv_state, conv_state_indices,
                                num_accepted_tokens, rows[1], activation, invalid, "", False,
                                None, False, None, query_start_loc)
    return out
