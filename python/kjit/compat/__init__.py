# SPDX-License-Identifier: Apache-2.0
"""Drop-in adapters: kjit's ops behind the exact signatures serving engines call today.

    from kjit.compat.vllm import merge_attn_states                  # was vllm.v1.attention.ops...
    from kjit.compat.sglang import merge_state_v2                   # was sgl_kernel
    from kjit.compat.flashinfer import merge_state, merge_states    # was flashinfer (base-2 LSE)
    from kjit.compat.fla import chunk_gated_delta_rule              # was fla.ops.gated_delta_rule
    from kjit.compat.vllm import causal_conv1d_fn                   # was vllm's mamba.ops

Each function has the original's parameter names, order and defaults, its argument layouts,
in-place behaviour and return value, and raises the original's exception type for the misuse
the original rejects. What the original accepts and kjit cannot do raises
kjit.compat.UnsupportedFeature (a kjit.InvalidArgument) naming the feature: never a silent
fallback. Limits of the originals' implementations that kjit does not share (FlashInfer's
1024-thread merge, vLLM's grid y/z limit) are lifted. docs/engines.md says where each engine
calls these functions and how to ship a precompiled bundle with it.

The submodules import without torch (the CPU tests check signatures and validation on NumPy
arrays); the ops themselves need device tensors.
"""

from ._common import UnsupportedFeature

__all__ = ["UnsupportedFeature", "fla", "flashinfer", "sglang", "vllm"]


def __getattr__(name):
    # The engine modules are imported on first use: `import kjit.compat` stays cheap.
    if name in ("fla", "flashinfer", "sglang", "vllm"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
