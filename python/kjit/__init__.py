# SPDX-License-Identifier: Apache-2.0
"""kjit: run-time specialized GPU kernels (merge_state, Gated DeltaNet) on DLPack tensors.

    import torch, kjit
    v, s = kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e")
    print(kjit.plan("merge_state", tokens=64, heads=256, head_dim=128, arch="sm_90").explain())

Errors are kjit.Error subclasses carrying the library's message (InvalidArgument is also a
ValueError). With torch, the ops are also registered as torch.ops.kjit.* custom ops.
"""

from . import _kjit
from ._api import (
    cache_stats,
    compile,
    configure,
    driver_available,
    gdn_decode,
    gdn_decode_gated,
    gdn_prefill,
    merge_state,
    merge_state_in_place,
    merge_states,
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

__version__ = "0.1.0"


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
    from . import _torch_ops

    _torch_ops.register()


_register_torch()
