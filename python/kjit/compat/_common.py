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
