# SPDX-License-Identifier: Apache-2.0
"""CPU tests of kjit.compat (issue 23): every adapter's signature equals the recorded signature
of the function it replaces (compat_signatures.json: names, order, kinds, defaults), and the
misuse the originals reject raises the originals' exception types, while what kjit cannot do
raises kjit.compat.UnsupportedFeature naming the feature. No torch and no GPU needed: NumPy
arrays stand in for tensors (every check here fires before anything touches device memory)."""

import importlib
import inspect
import json
import os

import numpy as np
import pytest

import kjit
import kjit.compat
from kjit.compat import UnsupportedFeature

with open(os.path.join(os.path.dirname(__file__), "compat_signatures.json")) as f:
    RECORDED = json.load(f)["functions"]


def resolve(dotted):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def described(fn):
    """[(name, kind, default)] of a function; default '<none>' when it has none."""
    rows = []
    for p in inspect.signature(fn).parameters.values():
        default = "<none>" if p.default is inspect.Parameter.empty else p.default
        rows.append((p.name, p.kind.name, default))
    return rows


def recorded(entry):
    return [(p["name"], p["kind"], p.get("default", "<none>")) for p in entry["params"]]


@pytest.mark.parametrize("entry", RECORDED, ids=[e["adapter"] for e in RECORDED])
def test_signature_equals_the_original(entry):
    assert described(resolve(entry["adapter"])) == recorded(entry), entry["original"]


def test_every_adapter_has_a_recorded_original():
    names = {e["adapter"] for e in RECORDED}
    for module_name in ("vllm", "sglang", "flashinfer", "fla"):
        module = getattr(kjit.compat, module_name)  # lazy attribute import
        for name, value in vars(module).items():
            if (inspect.isfunction(value) and not name.startswith("_")
                    and value.__module__ == module.__name__):
                assert f"kjit.compat.{module_name}.{name}" in names


def test_the_recorded_defaults_can_fail():
    # The comparison sees a changed default (a guard against a test that always passes).
    entry = next(e for e in RECORDED if e["adapter"].endswith("vllm.merge_attn_states"))
    changed = [dict(p) for p in entry["params"]]
    changed[-1]["default"] = 1.0
    assert described(resolve(entry["adapter"])) != recorded({"params": changed})


def test_unsupported_feature_is_a_kjit_error_of_the_usual_types():
    error = UnsupportedFeature("kjit.compat.x.f", "the feature", "a hint")
    assert isinstance(error, kjit.InvalidArgument)
    assert isinstance(error, ValueError) and isinstance(error, RuntimeError)
    assert error.feature == "the feature"
    assert str(error) == "kjit.compat.x.f: the feature is not supported by kjit; a hint"


# --- vLLM -------------------------------------------------------------------------------------

from kjit.compat import vllm  # noqa: E402


def merge_arrays(t=5, h=4, d=64, dtype=np.float16):
    rng = np.random.default_rng(t * 100 + h)
    out = rng.standard_normal((t, h, d)).astype(dtype)
    pv = rng.standard_normal((t, h, d)).astype(dtype)
    sv = rng.standard_normal((t, h, d)).astype(dtype)
    lse = rng.standard_normal((h, t)).astype(np.float32)
    return out, pv, lse, sv, lse.copy()


def test_vllm_merge_rejects_different_head_strides_like_vllm():
    out, pv, pl, sv, sl = merge_arrays()
    padded = np.zeros((5, 4, 72), np.float16)[:, :, :64]  # head stride 72, suffix's is 64
    with pytest.raises(AssertionError, match="matching head strides, got 72 and 64"):
        vllm.merge_attn_states(out, padded, pl, sv, sl)


def test_vllm_merge_fp8_output_needs_output_scale_and_then_is_unsupported():
    out, pv, pl, sv, sl = merge_arrays()
    out8 = np.zeros(out.shape, np.int8)  # a non-float output (vLLM: FP8)
    with pytest.raises(AssertionError, match="output_scale is required"):
        vllm.merge_attn_states(out8, pv, pl, sv, sl)
    with pytest.raises(UnsupportedFeature, match="output_scale") as info:
        vllm.merge_attn_states(out8, pv, pl, sv, sl, output_scale=np.ones(1, np.float32))
    assert "FP8" in info.value.feature
    with pytest.raises(UnsupportedFeature, match="output_scale"):
        vllm.merge_attn_states(out, pv, pl, sv, sl, None, None, np.ones(1, np.float32))


def decode_arrays(b=3, h=2, hv=4, k=16, v=16, slots=5):
    rng = np.random.default_rng(b * 10 + hv)
    f16 = np.float16
    return dict(mixed_qkv=rng.standard_normal((b, 2 * h * k + hv * v)).astype(f16),
                a=rng.standard_normal((b, hv)).astype(f16),
                b=rng.standard_normal((b, hv)).astype(f16),
                A_log=rng.standard_normal(hv).astype(np.float32),
                dt_bias=rng.standard_normal(hv).astype(np.float32), scale=k ** -0.5,
                initial_state=rng.standard_normal((slots, hv, v, k)).astype(np.float32),
                out=np.zeros((b, 1, hv, v), f16),
                ssm_state_indices=np.array([1, 0, 3], np.int32)[:b])


@pytest.mark.parametrize("module", ["vllm", "sglang"])
def test_packed_decode_python_checks_raise_value_error(module):
    fn = getattr(kjit.compat, module).fused_recurrent_gated_delta_rule_packed_decode
    args = decode_arrays()
    bad = dict(args, ssm_state_indices=args["ssm_state_indices"][:, None])
    with pytest.raises(ValueError, match="must be 1D for packed decode"):
        fn(**bad)
    bad = dict(args, out=np.zeros((3, 1, 4, 32), np.float16)[..., :16])
    with pytest.raises(ValueError, match="`out` must be contiguous"):
        fn(**bad)
    bad = dict(args, out=np.zeros((3, 4, 16), np.float16))
    with pytest.raises(ValueError, match=r"`out` must have shape \(3, 1, 4, 16\)"):
        fn(**bad)
    bad = dict(args, initial_state=args["initial_state"][0])
    with pytest.raises(ValueError, match="must be a 4D tensor"):
        fn(**bad)


def test_sglang_packed_decode_stochastic_rounding_is_unsupported():
    fn = kjit.compat.sglang.fused_recurrent_gated_delta_rule_packed_decode
    with pytest.raises(UnsupportedFeature, match="use_rs_rounding=True") as info:
        fn(**decode_arrays(), use_rs_rounding=True)
    assert "stochastic rounding" in info.value.feature


# --- SGLang / FlashInfer merges ---------------------------------------------------------------


@pytest.mark.parametrize("fn", [
    kjit.compat.sglang.merge_state, kjit.compat.sglang.merge_state_v2,
    lambda *a: kjit.compat.flashinfer.merge_state(*a[:4])])
def test_merges_require_cuda_tensors_with_runtime_error(fn):
    t, h, d = 4, 2, 64
    v = np.zeros((t, h, d), np.float16)
    s = np.zeros((t, h), np.float32)
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        fn(v, s, v, s)


def test_flashinfer_in_place_refuses_a_non_float32_lse():
    v = np.zeros((4, 2, 64), np.float16)
    s16 = np.zeros((4, 2), np.float16)
    with pytest.raises(RuntimeError, match="s has dtype float16; accepted: float32"):
        kjit.compat.flashinfer.merge_state_in_place(v, s16, v, np.zeros((4, 2), np.float32))


# --- fla --------------------------------------------------------------------------------------

from kjit.compat import fla  # noqa: E402


def fla_arrays(b=1, t=6, h=2, hv=4, k=64, v=64, dtype=np.float16):
    rng = np.random.default_rng(b * 7 + t)
    return dict(q=rng.standard_normal((b, t, h, k)).astype(dtype),
                k=rng.standard_normal((b, t, h, k)).astype(dtype),
                v=rng.standard_normal((b, t, hv, v)).astype(dtype),
                g=-rng.random((b, t, hv)).astype(np.float32),
                beta=rng.random((b, t, hv)).astype(np.float32))


def test_fla_chunk_checks_match_fla():
    f = fla.chunk_gated_delta_rule
    args = fla_arrays()
    with pytest.raises(ValueError, match="same number of heads"):
        f(**dict(args, k=args["k"][:, :, :1]))
    with pytest.raises(ValueError, match="must be evenly divisible"):
        f(**dict(args, v=args["v"][:, :, :3]))
    with pytest.raises(DeprecationWarning, match="head_first has been removed"):
        f(**args, head_first=False)
    with pytest.raises(ValueError, match="`chunk_size` must be 16, 32, or 64"):
        f(**args, chunk_size=48)
    with pytest.raises(ValueError, match="batch size is expected to be 1 rather than 2"):
        f(**fla_arrays(b=2), cu_seqlens=np.array([0, 3, 6]))
    with pytest.raises(ValueError, match="i.e., 2 rather than 3"):
        f(**args, cu_seqlens=np.array([0, 3, 6]),
          initial_state=np.zeros((3, 4, 64, 64), np.float32))
    with pytest.raises(AssertionError, match="A_log must be provided"):
        f(**args, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="requires `use_beta_sigmoid_in_kernel=True`"):
        f(**args, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="Cannot pass both"):
        f(**args, state_v_first=True, transpose_state_layout=True)


def test_fla_chunk_unsupported_features_are_named():
    f = fla.chunk_gated_delta_rule
    with pytest.raises(UnsupportedFeature, match="cp_context"):
        f(**fla_arrays(), cp_context=object())
    with pytest.raises(UnsupportedFeature, match="float32 q/k/v") as info:
        f(**fla_arrays(dtype=np.float32))
    assert info.value.feature == "float32 q/k/v"
    args = fla_arrays()
    with pytest.raises(UnsupportedFeature, match="head-wise beta"):
        f(**dict(args, beta=np.ones(args["v"].shape, np.float32)))


def test_fla_fused_recurrent_checks_match_fla():
    f = fla.fused_recurrent_gated_delta_rule
    args = fla_arrays()
    with pytest.raises(ValueError, match="`A_log` must be provided"):
        f(**args, use_gate_in_kernel=True)
    with pytest.raises(ValueError, match="`g` \\(raw pre-activation\\) must be provided"):
        f(**dict(args, g=None), use_gate_in_kernel=True, A_log=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="requires `use_beta_sigmoid_in_kernel=True`"):
        f(**args, allow_neg_eigval=True)
    with pytest.raises(ValueError, match="batch size is expected to be 1 rather than 2"):
        f(**fla_arrays(b=2), cu_seqlens=np.array([0, 3, 6]))
    for name in ("gk", "gv"):
        with pytest.raises(UnsupportedFeature, match=f"{name} \\(per-"):
            f(**args, **{name: np.zeros((1, 6, 4, 64), np.float32)})


def test_fla_autograd_use_is_refused():
    torch = pytest.importorskip("torch", reason="torch is not installed: the autograd check "
                                "needs torch tensors (the GPU suite repeats it)")
    q = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    v = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16)
    g, beta = -torch.rand(1, 4, 2), torch.rand(1, 4, 2)
    for f in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        with pytest.raises(UnsupportedFeature, match="autograd"):
            f(q, k, v, g=g, beta=beta)


def test_fla_adapter_layouts_against_fla_recurrence_with_a_kernel_stand_in():
    # A subprocess: the script installs a NumPy stand-in as `torch`, which must not leak into
    # this process (other tests ask whether torch is importable).
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "compat_fla_glue.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "fla glue ok: 48 cases" in run.stdout and "raw gates ok" in run.stdout
    assert "autograd refused" in run.stdout


def sigmoid_gating_arrays(n=3, tokens_per_seq=1, h=2, hv=4, kd=16):
    rng = np.random.default_rng(n + tokens_per_seq)
    f16 = np.float16
    t = n * tokens_per_seq
    return dict(A_log=rng.standard_normal(hv).astype(np.float32),
                a=rng.standard_normal((t, hv)).astype(f16),
                dt_bias=rng.standard_normal(hv).astype(np.float32),
                softplus_beta=1.0, softplus_threshold=20.0,
                q=rng.standard_normal((1, t, h, kd)).astype(f16),
                k=rng.standard_normal((1, t, h, kd)).astype(f16),
                v=rng.standard_normal((1, t, hv, kd)).astype(f16),
                b=rng.standard_normal((t, hv)).astype(f16),
                initial_state_source=np.zeros((5, hv, kd, kd), np.float32),
                initial_state_indices=np.arange(n, dtype=np.int32),
                cu_seqlens=np.arange(0, t + 1, tokens_per_seq, dtype=np.int32))


def test_sglang_sigmoid_gating_decode_names_what_kjit_cannot_do():
    f = kjit.compat.sglang.fused_sigmoid_gating_delta_rule_update
    args = sigmoid_gating_arrays()
    cases = [
        (dict(is_kda=True), "is_kda=True"),
        (dict(disable_state_update=True), "speculative target verification"),
        (dict(intermediate_states_buffer=np.zeros(1)), "speculative target verification"),
        (dict(retrieve_parent_token=np.zeros(1)), "speculative target verification"),
        (dict(softplus_beta=2.0), "softplus_beta=2.0"),
        (dict(initial_state_source=None), "initial_state_source=None"),
    ]
    for change, feature in cases:
        with pytest.raises(UnsupportedFeature, match=feature):
            f(**dict(args, **change))
    with pytest.raises(UnsupportedFeature, match="more than one token per sequence"):
        f(**sigmoid_gating_arrays(n=2, tokens_per_seq=3))
    with pytest.raises(AssertionError, match="scale must be positive"):
        f(**args, scale=-1.0)


def test_sglang_sigmoid_gating_reads_split_views_in_place_with_a_kernel_stand_in():
    # A subprocess, like the fla check above: q, k, v split from one row buffer must reach
    # kjit as that buffer (no copy), separate buffers as their concatenation, with the output
    # and the pool of a step computed from the caller's own q, k, v.
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "compat_decode_glue.py")
    run = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "sigmoid gating glue ok" in run.stdout and "vllm merge glue ok" in run.stdout
