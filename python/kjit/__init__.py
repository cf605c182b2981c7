# SPDX-License-Identifier: Apache-2.0
"""kjit: run-time specialized GPU kernels (merge_state, Gated DeltaNet) on DLPack tensors.

    import torch, kjit
    v, s = kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e")
    print(kjit.plan("merge_state", tokens=64, heads=256, head_dim=128, arch="sm_90").explain())

Errors are kjit.Error subclasses carrying the library's message (InvalidArgument is also a
ValueError). With torch, the ops are also registered as torch.ops.kjit.* custom ops.
"""

import os

from . import _kjit
from ._api import (
    cache_stats,
    causal_conv1d,
    causal_conv1d_update,
    compile,
    configure,
    driver_available,
    gdn_prefill,
    gdn_prefill_checkpoint_starts,
    gdn_prefill_workspace_bytes,
    plan,
    plan_call,
    prewarm,
    settings,
    shape_names,
    source,
)
from ._kjit import (
    CacheError,
    CompileError,
    DriverError,
    Error,
    InvalidArgument,
    KernelNotInBundle,
    LimitCheck,
    Plan,
    PlanError,
    PlannedLaunch,
)

# Every op of the extension's op table (merge_state, merge_state_in_place, gdn_decode,
# qk_l2norm, ...): kjit.<name> is the extension's function itself, so an op added to the table
# (python/src/ops.cpp) is callable here with no line in this package.
globals().update({_name: getattr(_kjit, _name) for _name in _kjit._bound_ops()
                  if not _name.startswith("_")})

__version__ = "0.1.0"


def _load_torch_fastpath():
    # kjit._kjit_torch reads tensors through libtorch's C++ API (built only where torch was
    # importable at build time, against that torch). Without it, or with
    # KJIT_PY_TORCH_FASTPATH=0, tensors are read through their Python attributes: same views,
    # same errors, ~0.5 us more per tensor.
    global torch_fastpath_error
    if os.environ.get("KJIT_PY_TORCH_FASTPATH", "1") == "0":
        torch_fastpath_error = "disabled by KJIT_PY_TORCH_FASTPATH=0"
        return
    try:
        from . import _kjit_torch
    except ImportError as error:  # not built, or built against another torch
        torch_fastpath_error = f"kjit._kjit_torch not importable: {error}"
        return
    try:
        _kjit._register_torch_fastpath(_kjit_torch.fastpath)
    except _kjit.Error as error:  # a _kjit_torch from another build: import kjit all the same
        torch_fastpath_error = str(error)
        return
    torch_fastpath_error = None


def torch_fastpath():
    """Whether torch tensors are read through the C++ fast path (kjit._kjit_torch); when not,
    ``kjit.torch_fastpath_error`` says why."""
    return _kjit._torch_fastpath()


# Why the torch fast path is not in use (None when it is, or before torch was looked for).
torch_fastpath_error = "torch not importable"


def _register_torch():
    # torch is optional. When it is importable, tensors are read through a C-level fast path
    # and torch's current stream is the default; the custom ops are registered too.
    try:
        import torch
    except ImportError:
        return
    dtypes = [(getattr(torch, name), kjit_name) for name, kjit_name in (
        ("float16", "f16"), ("bfloat16", "bf16"), ("float32", "f32"), ("float64", "f64"),
        ("int32", "i32"), ("int64", "i64"), ("uint8", "u8"), ("bool", "u8"),
        ("float8_e4m3fn", "e4m3")) if hasattr(torch, name)]
    # The raw-stream getter is what torch's own generated code uses: one C call, no Stream
    # object. Older torch: None, and the extension falls back to the default stream.
    getter = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    _kjit._register_torch(torch.Tensor, dtypes, getter)
    _load_torch_fastpath()
    from . import _torch_ops

    _torch_ops.register()


_register_torch()
