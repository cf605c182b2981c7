# SPDX-License-Identifier: Apache-2.0
"""Helpers shared by the kjit.compat adapters: array-library-neutral reads of shapes, strides
and dtypes (torch tensors on the device; NumPy arrays in the CPU tests, which exercise the
validation without torch or a GPU), and the error for what kjit cannot do."""

from __future__ import annotations

import sys

from .. import _kjit
from .._api import _dtype_name


class UnsupportedFeature(_kjit.InvalidArgument):
    """An argument value the original function accepts but kjit does not implement. Raised
    before anything is launched; ``feature`` names it. A kjit.InvalidArgument (so also a
    ValueError and a RuntimeError)."""

    def __init__(self, adapter: str, feature: str, hint: str = ""):
        self.adapter = adapter
        self.feature = feature
        text = f"{adapter}: {feature} is not supported by kjit"
        super().__init__(text + (f"; {hint}" if hint else ""))


def torch_module():
    # torch is used only when the caller already imported it (see kjit._api._torch).
    return sys.modules.get("torch")


def strides(x) -> tuple:
    """Strides in elements: torch's stride(), or NumPy's byte strides divided by the item
    size."""
    stride = getattr(x, "stride", None)
    if callable(stride):
        return tuple(stride())
    item = x.itemsize
    return tuple(s // item for s in x.strides)


def is_contiguous(x) -> bool:
    method = getattr(x, "is_contiguous", None)
    if callable(method):
        return bool(method())
    flags = getattr(x, "flags", None)
    return bool(flags is not None and flags["C_CONTIGUOUS"])


def dtype_name(x) -> str:
    """'float16', 'bfloat16', 'float32', ... of a tensor or array; its own text for dtypes
    kjit has no name for (float8, int16, ...)."""
    try:
        return _dtype_name(x.dtype)
    except _kjit.InvalidArgument:
        text = str(x.dtype)
        return text[6:] if text.startswith("torch.") else text


def device_of(x):
    """A comparable device identity: torch's device, or 'cpu' for host arrays."""
    return getattr(x, "device", "cpu")


def is_cuda(x) -> bool:
    flag = getattr(x, "is_cuda", None)
    return bool(flag) if flag is not None else False


def check_no_autograd(adapter: str, *tensors) -> None:
    """kjit's ops are forward only. A call that autograd would record (grad mode on and an
    input requiring grad) would return outputs without a grad_fn, and a later backward() would
    silently skip these inputs: refuse it instead."""
    torch = torch_module()
    if torch is None or not torch.is_grad_enabled():
        return
    for t in tensors:
        if t is not None and getattr(t, "requires_grad", False):
            raise UnsupportedFeature(
                adapter, "autograd (an input requires grad while grad mode is on)",
                "kjit implements the forward pass only: call it under torch.no_grad() or "
                "torch.inference_mode(), or detach the inputs")


def packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,  # noqa: N803
                  ssm_state_indices, use_qk_l2norm_in_kernel, invalid_index):
    """The packed GDN decode step behind vLLM's and SGLang's entry points (they differ only in
    the padding rule, `invalid_index`): the checks both make in Python and kjit cannot make
    itself (it sees out as [B, HV, V]), then kjit's gdn_decode. Everything else (dims, strides,
    dtypes, head counts) kjit validates, raising kjit.InvalidArgument, a ValueError like the
    originals' own errors. Returns (out, initial_state)."""
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
                     l2norm_qk=use_qk_l2norm_in_kernel, invalid_index=invalid_index)
    return out, initial_state
