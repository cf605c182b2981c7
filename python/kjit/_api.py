# SPDX-License-Identifier: Apache-2.0
"""The public functions of the kjit package.

Each op takes device tensors (torch tensors, or any object with ``__dlpack__``: CuPy, JAX),
allocates the outputs it is not given (with torch when the inputs are torch tensors), and
enqueues the kernel on ``stream``: None means torch's current stream on the tensors' device.
Every op is a row of the extension's op table (``_kjit._bound_ops()``, python/src/ops.cpp): a
METH_FASTCALL function whose arguments one generic C++ reader matches and converts from the
row (keywords, defaults, output allocation), exported here as it is. gdn_prefill,
causal_conv1d and causal_conv1d_update are Python functions here around their positional rows
(gdn_prefill copies cu_seqlens to the host to size checkpoints; kjit.compat.vllm calls the
conv rows with its own layouts).
The steady-state path is then one vectorcall plus the C++ op (a memoized plan and
cuLaunchKernelEx).
"""

from __future__ import annotations

import math
import sys

from . import _kjit

_NAMES = {  # short dtype names accepted everywhere kjit takes a dtype
    "f16": "float16", "fp16": "float16", "half": "float16", "float16": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "f32": "float32", "fp32": "float32", "float": "float32", "float32": "float32",
    "f64": "float64", "float64": "float64",
    "i32": "int32", "int32": "int32", "i64": "int64", "int64": "int64",
    "u8": "uint8", "uint8": "uint8", "bool": "bool",
}


def _torch():
    # torch is used only when the caller already imported it: importing it here would cost a
    # second of start-up for users of CuPy or JAX.
    return sys.modules.get("torch")


def _dtype_name(dtype) -> str:
    text = str(dtype)
    if text.startswith("torch."):
        text = text[6:]
    name = _NAMES.get(text)
    if name is None:
        raise _kjit.InvalidArgument(
            f"dtype {dtype!r} is not a kjit dtype; accepted: " + ", ".join(sorted(_NAMES)))
    return name


def _empty(like, shape, dtype=None):
    """An uninitialized array of `shape` on `like`'s device, `dtype` or like's dtype."""
    torch = _torch()
    if torch is not None and isinstance(like, torch.Tensor):
        if dtype is not None and not isinstance(dtype, torch.dtype):
            dtype = getattr(torch, _dtype_name(dtype))
        return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is None:
        raise _kjit.InvalidArgument(
            f"cannot allocate an output like a {type(like).__name__}; accepted: pass the output "
            "explicitly, or give torch tensors or array-API arrays (NumPy, CuPy)")
    xp = namespace()
    if dtype is not None and not isinstance(dtype, type(like.dtype)):
        dtype = getattr(xp, _dtype_name(dtype))
    return xp.empty(tuple(shape), dtype=dtype or like.dtype)


# The fast entry points allocate the outputs they are not given through _empty.
_kjit._register_allocator(_empty)


def _base(lse_base):
    # The extension takes the base as text. 2, 2.0 and math.e are what people type; anything
    # else goes on as its str() and is refused there, by name.
    if lse_base is None or lse_base.__class__ is str:
        return lse_base
    if isinstance(lse_base, float) and not isinstance(lse_base, bool):
        if lse_base == 2.0:
            return "2"
        if lse_base == math.e:
            return "e"
    return str(lse_base)


def _empty_states(pool, rows):
    """[rows, HV, V, K] like the pool, in its layout: a V-contiguous (K-major) pool gets the
    transpose of a contiguous [rows, HV, K, V] array, which the kernels require of its
    checkpoints."""
    hv, dim_v, dim_k = pool.shape[1], pool.shape[2], pool.shape[3]
    if callable(getattr(pool, "stride", None)):
        strides = tuple(pool.stride())  # torch: elements
    else:
        itemsize = getattr(pool, "itemsize", None) or pool.dtype.itemsize
        strides = tuple(s // itemsize for s in pool.strides)  # array API: bytes
    if dim_v > 1 and strides[2] == 1 and strides[3] == dim_v:
        return _empty(pool, (rows, hv, dim_k, dim_v)).swapaxes(-1, -2)
    return _empty(pool, (rows, hv, dim_v, dim_k))


# ---------------------------------------------------------------------------------------------
# The ops


# Every op of the extension's op table (python/src/ops.cpp) is its own METH_FASTCALL function
# (keywords, defaults and output allocation are handled in C++: a Python wrapper would cost
# ~0.5 us of a call's ~5 us); help() shows its signature and documentation. Exported as they
# are: an op added to the table needs nothing here. A row named with a leading '_' is wrapped
# by the Python function below of the name without it (gdn_prefill: checkpoints made from a
# host copy of cu_seqlens; causal_conv1d and causal_conv1d_update: kjit.compat.vllm calls their
# positional rows too).
for _name in _kjit._bound_ops():
    if not _name.startswith("_"):
        globals()[_name] = getattr(_kjit, _name)
del _name


def gdn_prefill(q, k, v, cu_seqlens, state, state_indices, *, a=None, b=None, a_log=None,
                dt_bias=None, g=None, beta=None, has_initial_state=None, out=None,
                final_state=None, scale=0.0, l2norm_qk=True, softplus_threshold=20.0,
                checkpoint_every_n_tokens=0, state_checkpoints=None, checkpoint_cu_starts=None,
                workspace=None, mode="", stream=None, _plan=False, _arch=None):
    """Chunked varlen GDN prefill. q, k [T, H, K], v [T, HV, V] (bf16/f16); gates either raw
    (a, b [T, HV], a_log, dt_bias [HV]) or precomputed (g, beta [T, HV] f32); cu_seqlens [N+1];
    state [slots, HV, V, K] (f32/bf16) read from and written back to state[state_indices[n]]
    (index < 0: padding, the pool is not touched); its [HV, V, K] block contiguous, or V
    contiguous: a [slots, HV, K, V] pool passed as pool.transpose(-1, -2) (fla's layout; the
    kernels take it as it is, no copy). has_initial_state [N] bool or None (all); final_state
    [N, HV, V, K], in the pool's layout, to write final states there instead of into the pool.
    out defaults to [T, HV, V] of q's dtype. scale 0 means K^-0.5. Returns out.

    Checkpoints: checkpoint_every_n_tokens = n (a multiple of 64) also writes the state after
    every n tokens of each sequence: sequence i's j-th checkpoint goes to
    state_checkpoints[checkpoint_cu_starts[i] + j] ([total, HV, V, K], the pool's dtype and
    layout;
    checkpoint_cu_starts [N + 1] int64 on the device, from gdn_prefill_checkpoint_starts).
    Left as None, both are made here from cu_seqlens, which copies cu_seqlens to the host (a
    synchronization: pass both for CUDA graph capture). Returns (out, state_checkpoints) then.

    workspace: scratch memory of the chunked path, a 1-D uint8 device array of at least
    gdn_prefill_workspace_bytes(T, HV) bytes, 256-byte aligned, not used by other work on the
    stream meanwhile. None: kjit allocates it stream-ordered on the call's stream (from the
    device's current memory pool; captured as memory nodes under CUDA graph capture).
    """
    if out is None:
        out = _empty(q, (q.shape[0], v.shape[1], v.shape[2]))
    if checkpoint_every_n_tokens and not _plan and (checkpoint_cu_starts is None
                                                     or state_checkpoints is None):
        offsets = _host_ints(cu_seqlens)
        try:
            starts = gdn_prefill_checkpoint_starts(offsets, checkpoint_every_n_tokens)
        except _kjit.InvalidArgument:
            starts = None  # a bad interval: the op below raises, naming its argument
        if starts is not None:
            if checkpoint_cu_starts is None:
                checkpoint_cu_starts = _like_ints(cu_seqlens, starts)
            if state_checkpoints is None:
                state_checkpoints = _empty_states(state, starts[-1])
    result = _kjit._gdn_prefill(q, k, v, a, b, a_log, dt_bias, g, beta, cu_seqlens, state,
                                state_indices, has_initial_state, out, final_state, scale,
                                l2norm_qk, softplus_threshold, checkpoint_every_n_tokens,
                                state_checkpoints, checkpoint_cu_starts, workspace, mode, stream,
                                _plan, _arch)
    if _plan:
        return result
    return (out, state_checkpoints) if checkpoint_every_n_tokens else out


# ---------------------------------------------------------------------------------------------
# causal_conv1d


def causal_conv1d(x, weight, conv_state, cu_seqlens, state_indices, *, bias=None,
                  has_initial_state=None, out=None, activation=None, invalid_index="negative",
                  mode="", debug_check_indices=False, stream=None, _plan=False, _arch=None):
    """Varlen causal depthwise conv1d over a conv-state pool (kjit/ops/causal_conv1d.hpp).

    x [T, D] (any strides: a [D, T] buffer is x.T); weight [D, W] (W 2..8); bias [D];
    conv_state [slots, D, L >= W-1] (any strides: a [slots, L, D] buffer is .transpose(1, 2));
    cu_seqlens [N+1] and state_indices [N] int32/int64; has_initial_state [N] bool/uint8.
    Columns 0..W-2 of each sequence's slot are its history before and its last W-1 inputs
    after the call. activation None or 'silu'. out defaults to a new [T, D] tensor of x's dtype;
    out=x runs in place. invalid_index: 'negative' (index < 0 is padding) or 'nonpositive'
    (vLLM: slot 0 is a null block). Returns out."""
    _check_arch("causal_conv1d", _arch)
    if out is None:
        out = _empty(x, tuple(x.shape))
    result = _kjit._causal_conv1d(x, weight, bias, conv_state, cu_seqlens, state_indices,
                                  has_initial_state, out, activation, invalid_index, mode,
                                  debug_check_indices, stream, _plan, _arch)
    return result if _plan else out


def causal_conv1d_update(x, weight, conv_state, state_indices, *, bias=None,
                         num_accepted_tokens=None, query_start_loc=None, out=None,
                         activation=None, invalid_index="negative", mode="",
                         debug_check_indices=False, stream=None, _plan=False, _arch=None):
    """Decode (S = 1) or speculative (S > 1) causal conv1d step: x [B, S, D] or [B, D].

    Without num_accepted_tokens the history is columns 0..W-2 and afterwards holds the last
    W-1 inputs. With it (vLLM's speculative convention, pool L = W-2+S): the history of a row is
    columns a-1..a+W-3 for a = num_accepted_tokens[b] of the previous verification step, and
    column k then holds entry k+1 of history ++ x. With query_start_loc [B+1] (int32/int64),
    x is [T, D] and row b is tokens query_start_loc[b]..query_start_loc[b+1]-1 (varlen rows,
    S_b in place of S; a row of 0 tokens leaves its slot untouched; out rows outside every row
    are not written). Returns out (default: new, x's shape)."""
    _check_arch("causal_conv1d_update", _arch)
    if out is None:
        out = _empty(x, tuple(x.shape))
    result = _kjit._causal_conv1d_update(x, weight, bias, conv_state, state_indices,
                                         num_accepted_tokens, out, activation, invalid_index,
                                         mode, debug_check_indices, stream, _plan, _arch,
                                         query_start_loc)
    return result if _plan else out


def gdn_prefill_workspace_bytes(tokens, value_heads):
    """Bytes of the workspace a gdn_prefill call over `tokens` tokens and `value_heads` value
    heads needs on its chunked path (what its workspace argument must hold at least)."""
    return _kjit._gdn_prefill_workspace_bytes(int(tokens), int(value_heads))


def gdn_prefill_checkpoint_starts(cu_seqlens, every):
    """The first checkpoint row of each sequence (the exclusive prefix sum of
    floor(length / every)) from host offsets cu_seqlens [N + 1]: a list of N + 1 ints whose
    last one is the number of checkpoint rows a gdn_prefill call writes."""
    return _kjit._gdn_prefill_checkpoint_starts([int(x) for x in cu_seqlens], int(every))


def _host_ints(array):
    tolist = getattr(array, "tolist", None)
    if tolist is None:
        raise _kjit.InvalidArgument(
            f"gdn_prefill: cu_seqlens is a {type(array).__name__} without tolist(); pass "
            "checkpoint_cu_starts and state_checkpoints to checkpoint without a host copy")
    return [int(x) for x in tolist()]


def _like_ints(like, values):
    """An int64 device array holding `values`, on `like`'s device and library."""
    torch = _torch()
    if torch is not None and isinstance(like, torch.Tensor):
        return torch.tensor(values, dtype=torch.int64, device=like.device)
    namespace = getattr(like, "__array_namespace__", None)
    if namespace is None:
        raise _kjit.InvalidArgument(
            f"gdn_prefill: cannot make checkpoint_cu_starts like a {type(like).__name__}; pass "
            "it explicitly")
    xp = namespace()
    return xp.asarray(values, dtype=xp.int64)


# Every op by name, in the op table's order (plan_call accepts these).
_OPS = {name.lstrip("_"): globals()[name.lstrip("_")] for name in _kjit._bound_ops()}


# ---------------------------------------------------------------------------------------------
# Plans, prewarm, inspection


def _shape_text(op, name, value, size) -> str:
    """The text of one plan() shape value. A size must be an int: 64.0, True or None would
    otherwise read as 64, 1 or a bad dtype."""
    if size:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return value.strip()
        raise _kjit.InvalidArgument(
            f"plan: {name} = {value!r} ({type(value).__name__}) is not a size of {op}; "
            f"accepted: an int")
    if value is None:
        raise _kjit.InvalidArgument(
            f"plan: {name} = None; accepted: leave {name} out for its default, or give a str, "
            "an int, a bool or a dtype")
    if isinstance(value, bool):
        return "1" if value else "0"
    if name == "lse_base":
        return _base(value)
    if isinstance(value, (str, int)):
        return str(value)
    if isinstance(value, float):
        raise _kjit.InvalidArgument(
            f"plan: {name} = {value!r} is a float; accepted: a str, an int, a bool or a dtype")
    # A dtype object: torch.bfloat16, numpy.float16 (a class) or numpy.dtype("float16").
    return _dtype_name(getattr(value, "__name__", None) or value)


def _check_arch(fn, arch):
    if arch is not None and not isinstance(arch, str):
        raise _kjit.InvalidArgument(
            f"{fn}: arch = {arch!r} is a {type(arch).__name__}; accepted: a str naming an arch "
            "or a device, e.g. 'sm_90', 'sm_100a', 'h100', 'h200'")


def _spec_text(fn, spec):
    if not isinstance(spec, str):
        raise _kjit.InvalidArgument(
            f"{fn}: spec = {spec!r} is a {type(spec).__name__}; accepted: a spec string "
            "family:key=value,...@arch, e.g. 'probe:heavy=0@sm_90' (Plan.specs lists an op's)")
    return spec


def plan(op, arch=None, device=None, **shape):
    """The Plan of `op` for a problem given by the `kjit plan` shape names, e.g.
    ``kjit.plan("merge_state", dtype="bf16", tokens=64, heads=256, head_dim=128,
    arch="sm_90")``. arch plans offline from the built-in limits (no GPU needed); device (or
    neither, with a GPU present) plans for a live device. ``kjit.shape_names(op)`` lists the
    names. Raises InvalidArgument for bad values, PlanError when no legal launch exists.
    """
    if not isinstance(op, str):
        raise _kjit.InvalidArgument(
            f"plan: op = {op!r} is a {type(op).__name__}; accepted: an op name, one of "
            + ", ".join(_kjit._ops()))
    _check_arch("plan", arch)
    if device is not None and (not isinstance(device, int) or isinstance(device, bool)):
        raise _kjit.InvalidArgument(
            f"plan: device = {device!r} is a {type(device).__name__}; accepted: a CUDA device "
            "ordinal (int)")
    sizes = {name for name, size, _, _ in _kjit._op_params(op) if size}
    values = {name: _shape_text(op, name, value, name in sizes) for name, value in shape.items()}
    return _kjit._plan_shape(op, values, arch, device)


def plan_call(op, *args, arch=None, **kwargs):
    """The Plan that calling `op` (a kjit op function or its name) with these arguments would
    launch, without launching: the exact tensors' shapes, strides and alignment. The tensors
    may be host arrays (NumPy); arch None plans for the tensors' CUDA device."""
    fn = _OPS.get(op) if isinstance(op, str) else op
    if fn is None or fn not in _OPS.values():
        raise _kjit.InvalidArgument(
            f"plan_call: op = {op!r} is not a kjit op; accepted: " + ", ".join(_OPS))
    _check_arch("plan_call", arch)
    return fn(*args, _plan=True, _arch=arch, **kwargs)


def shape_names(op):
    """[(name, is_size, default, doc)] of the shape values plan() takes for `op`."""
    return _kjit._op_params(op)


def _device(device):
    if device is not None:
        return int(getattr(device, "index", device) or 0)
    torch = _torch()
    if torch is not None and torch.cuda.is_available():
        return torch.cuda.current_device()
    return _kjit._current_device()


def prewarm(what, device=None, **shape):
    """Compiles (or loads from the cache/bundles) and loads on `device` every kernel `what`
    needs, so that later calls do no compile or load: required before CUDA graph capture.

    what: an op name with its shape values (as for plan()), a Plan, a spec string, or a list
    of Plans / spec strings. Returns the canonical spec strings loaded.
    """
    dev = _device(device)
    if isinstance(what, str) and what in _kjit._ops():
        what = plan(what, device=dev, **shape)
    elif shape:
        raise _kjit.InvalidArgument(
            f"prewarm: shape values {sorted(shape)} are only accepted with an op name; got "
            f"{what!r}")
    items = what if isinstance(what, (list, tuple)) else [what]
    specs = []
    for item in items:
        if isinstance(item, _kjit.Plan):
            specs.extend(item.specs)
        elif isinstance(item, str):
            specs.append(_spec_text("prewarm", item))
        else:
            raise _kjit.InvalidArgument(
                f"prewarm: {item!r} is not a Plan or a spec string; accepted: an op name with "
                "shape values, a Plan, a spec string, or a list of Plans / spec strings")
    return _kjit._prewarm_specs(specs, dev)


def source(spec, templates=False):
    """The exact stub source NVRTC compiles for a spec (`kjit source`); templates=True appends
    every embedded template it includes."""
    return _kjit._source(_spec_text("source", spec), bool(templates))


def compile(spec):  # noqa: A001 - the kjit verb
    """Compiles a spec through the runtime's caches (needs NVRTC, not a GPU) and returns a dict:
    spec, origin (memory/bundle/disk/compiled), key, key_material, source, options, log, ptx,
    lowered_name, cubin (bytes), resources (registers, static_smem, spills, ...)."""
    return _kjit._compile(_spec_text("compile", spec))


# ---------------------------------------------------------------------------------------------
# Settings


def configure(*, cache_dir=None, bundle_paths=None, disable_jit=None, disable_disk_cache=None,
              dump_dir=None, log=None, cuda_home=None, nvrtc_library=None,
              cuda_driver_library=None, allow_compile_in_capture=None, debug_checks=None):
    """Replaces the runtime kjit uses with one built from the KJIT_* environment plus these
    settings (None: keep the environment's). Kernels loaded by the previous runtime stay
    loaded (captured graphs may use them); the new one starts with empty memory caches."""
    _kjit._configure({
        "cache_dir": cache_dir, "bundle_paths": bundle_paths, "disable_jit": disable_jit,
        "disable_disk_cache": disable_disk_cache, "dump_dir": dump_dir, "log": log,
        "cuda_home": cuda_home, "nvrtc_library": nvrtc_library,
        "cuda_driver_library": cuda_driver_library,
        "allow_compile_in_capture": allow_compile_in_capture, "debug_checks": debug_checks,
    })


def settings():
    """The settings of the runtime in use (cache_dir resolved)."""
    return _kjit._settings()


def cache_stats():
    """Counters of the runtime's kernel cache: memory/bundle/disk hits, compiles, ..."""
    return _kjit._cache_stats()


def driver_available():
    """(True, "") when libcuda loads and a device exists, else (False, why)."""
    return _kjit._driver_available()
