# SPDX-License-Identifier: Apache-2.0
"""FlashInfer's cascade merges (flashinfer.cascade / flashinfer.merge_state ...) on kjit's
kernels: LSE in **base 2** (what FlashInfer's attention returns), layout [T, H]
([T, S, H] for merge_states), v fp16/bf16, inputs CUDA and contiguous.

Without FlashInfer's launch limit: its MergeState kernels put every head of a token in one
thread block (head_dim / vec x num_heads threads), which fails for more than 1024 threads
(bf16 head_dim 128 at > 64 heads, head_dim 512 at > 32: DeepSeek-V3 MLA with 128 heads on a
rank). kjit plans a legal grid for any head count, and any head_dim that is a multiple of 8
up to 1024 (FlashInfer: 64, 128, 256, 512).
"""

from __future__ import annotations

from .. import _kjit
from .._api import merge_states as _merge_states
from ._common import device_of, dtype_name, is_contiguous, is_cuda


def _float32(s):
    # FlashInfer converts the LSE with s.to(torch.float32) before the kernel.
    if dtype_name(s) == "float32":
        return s
    import torch  # a non-float32 LSE came from torch

    return s.to(torch.float32)


def _check(fn, named, dims):
    # FlashInfer's C++ checks (csrc/cascade.cu: CHECK_INPUT = CUDA + contiguous, CHECK_DEVICE,
    # CHECK_DIM), which raise a RuntimeError-derived error; kjit.InvalidArgument is a
    # RuntimeError (and a ValueError).
    first_name, first = named[0]
    for (name, x), d in zip(named, dims):
        if not is_cuda(x):
            raise _kjit.InvalidArgument(f"{fn}: {name} must be a CUDA tensor")
        if not is_contiguous(x):
            raise _kjit.InvalidArgument(f"{fn}: {name} must be contiguous")
        if device_of(x) != device_of(first):
            raise _kjit.InvalidArgument(
                f"{fn}: {name} is on {device_of(x)}, {first_name} on {device_of(first)}")
        if x.ndim != d:
            raise _kjit.InvalidArgument(f"{fn}: {name} must be a {d}D tensor (got {x.ndim}D)")
    if dtype_name(first) not in ("float16", "bfloat16"):
        raise _kjit.InvalidArgument(
            f"{fn}: {first_name} has dtype {dtype_name(first)}; accepted: float16, bfloat16 "
            "(FlashInfer's dispatch)")


def _check_pair(fn, v_a, s_a, v_b, s_b, names):
    if tuple(v_a.shape) != tuple(v_b.shape) or tuple(s_a.shape) != tuple(s_b.shape):
        raise _kjit.InvalidArgument(
            f"{fn}: shapes differ: {names[0]} {tuple(v_a.shape)}, {names[2]} {tuple(v_b.shape)}"
            f", {names[1]} {tuple(s_a.shape)}, {names[3]} {tuple(s_b.shape)}")
    if tuple(v_a.shape[:2]) != tuple(s_a.shape):
        raise _kjit.InvalidArgument(
            f"{fn}: {names[1]} must be [seq_len, num_heads] = {tuple(v_a.shape[:2])} "
            f"(got {tuple(s_a.shape)})")


def merge_state(v_a, s_a, v_b, s_b):
    """Merges (v_a, s_a) and (v_b, s_b): v [T, H, D] fp16/bf16, s [T, H] base-2 LSE. Returns
    new (v_merged, s_merged)."""
    fn = "kjit.compat.flashinfer.merge_state"
    s_a, s_b = _float32(s_a), _float32(s_b)
    names = ("v_a", "s_a", "v_b", "s_b")
    _check(fn, list(zip(names, (v_a, s_a, v_b, s_b))), (3, 2, 3, 2))
    _check_pair(fn, v_a, s_a, v_b, s_b, names)
    return _kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="2")


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) <- merge((v, s), (v_other, s_other)) in place, for the tokens whose mask (bool or
    uint8 [T], on v's device) is nonzero; all tokens when mask is None. Returns None."""
    fn = "kjit.compat.flashinfer.merge_state_in_place"
    names = ("v", "s", "v_other", "s_other")
    if dtype_name(s) != "float32":
        # FlashInfer converts s with s.to(float32) and merges into that temporary, so the LSE
        # update of a non-float32 s is lost without an error; refuse it here.
        raise _kjit.InvalidArgument(
            f"{fn}: s has dtype {dtype_name(s)}; accepted: float32 (s is updated in place; "
            "FlashInfer would update a float32 copy and drop it)")
    s_other = _float32(s_other)
    _check(fn, list(zip(names, (v, s, v_other, s_other))), (3, 2, 3, 2))
    _check_pair(fn, v, s, v_other, s_other, names)
    if mask is not None:
        if mask.ndim != 1 or mask.shape[0] != v.shape[0]:
            raise _kjit.InvalidArgument(
                f"{fn}: mask must be 1D of length seq_len = {v.shape[0]} "
                f"(got shape {tuple(mask.shape)})")
        if device_of(mask) != device_of(v):
            raise _kjit.InvalidArgument(f"{fn}: mask is on {device_of(mask)}, v on {device_of(v)}")
    _kjit.merge_state_in_place(v, s, v_other, s_other, mask, lse_base="2")
    return None


def merge_states(v, s):
    """Merges the S states of each (token, head): v [T, S, H, D] fp16/bf16, s [T, S, H]
    base-2 LSE. Returns new (v_merged [T, H, D], s_merged [T, H] float32); S == 0 gives
    zeros and -inf."""
    fn = "kjit.compat.flashinfer.merge_states"
    s = _float32(s)
    _check(fn, [("v", v), ("s", s)], (4, 3))
    if tuple(v.shape[:3]) != tuple(s.shape):
        raise _kjit.InvalidArgument(
            f"{fn}: s must be [seq_len, num_states, num_heads] = {tuple(v.shape[:3])} "
            f"(got {tuple(s.shape)})")
    return _merge_states(v, s, lse_base="2")
