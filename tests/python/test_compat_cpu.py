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


# --- vLLM causal_conv1d -----------------------------------------------------------------------
#
# The layout glue is checked without a GPU: kjit's two conv ops are replaced by NumPy versions
# of their contracts (include/kjit/ops/causal_conv1d.hpp), which read and write exactly the
# views the adapter hands them; the adapter's results in vLLM's layouts are compared with a
# loop written from vLLM's documented semantics, on fresh random inputs.


def kjit_conv_contract(x, weight, bias, state, cu, idx, has, out, act, invalid, *rest):
    """kjit.causal_conv1d's contract on host arrays: x, out [T, D] views, pool [slots, D, L]."""
    w = weight.shape[1]
    for n in range(len(cu) - 1):
        a, b, slot = int(cu[n]), int(cu[n + 1]), int(idx[n])
        if slot < 0 or (invalid == "nonpositive" and slot == 0) or slot >= state.shape[0]:
            out[a:b] = 0
            continue
        hist = state[slot][:, :w - 1] if has is None or has[n] else np.zeros((x.shape[1], w - 1))
        seq = np.concatenate([hist.astype(np.float64), x[a:b].T.astype(np.float64)], axis=1)
        out[a:b] = conv_rows(seq, weight, bias, act, b - a)
        if b > a:
            state[slot][:, :w - 1] = seq[:, -(w - 1):]


def kjit_update_contract(x, weight, bias, state, idx, accepted, out, act, invalid, *rest):
    """kjit.causal_conv1d_update's contract: x, out [B, S, D] or [B, D] views; with
    query_start_loc (the argument after arch) x, out [T, D] and row r its tokens qsl[r]:qsl[r+1]
    (causal_conv1d_update_varlen)."""
    qsl = rest[5] if len(rest) > 5 else None
    if qsl is not None:
        rows = [(x[int(qsl[r]):int(qsl[r + 1])][None], out[int(qsl[r]):int(qsl[r + 1])][None])
                for r in range(len(idx))]
    else:
        x3, o3 = (x[:, None], out[:, None]) if x.ndim == 2 else (x, out)
        rows = [(x3[r:r + 1], o3[r:r + 1]) for r in range(x3.shape[0])]
    for r, (xr, orow) in enumerate(rows):
        update_row(xr[0], orow[0], weight, bias, state, int(idx[r]),
                   None if accepted is None else int(accepted[r]), act, invalid)


def update_row(xr, orow, weight, bias, state, slot, accepted, act, invalid):
    """One row of the update contract: xr, orow [S, D] views."""
    w, s, cols = weight.shape[1], xr.shape[0], state.shape[2]
    if s == 0:
        return  # no output, slot untouched
    if slot < 0 or (invalid == "nonpositive" and slot == 0) or slot >= state.shape[0]:
        orow[:] = 0
        return
    first = 0 if accepted is None else accepted - 1
    seq = np.concatenate([state[slot][:, first:first + w - 1].astype(np.float64),
                          xr.T.astype(np.float64)], axis=1)
    orow[:] = conv_rows(seq, weight, bias, act, s)
    if accepted is None:
        state[slot][:, :w - 1] = seq[:, -(w - 1):]
    else:
        k = min(cols, w - 2 + s)
        state[slot][:, :k] = seq[:, 1:k + 1]


def conv_rows(seq, weight, bias, act, n):
    """[n, D] outputs of the last n positions of seq [D, W-1+n] (history first)."""
    w = weight.shape[1]
    y = np.stack([(seq[:, t:t + w] * weight).sum(1) for t in range(n)]) if n else \
        np.zeros((0, seq.shape[0]))
    if bias is not None:
        y = y + bias
    return y / (1 + np.exp(-y)) if act in ("silu", "swish") else y


@pytest.fixture
def conv_contract(monkeypatch):
    calls = []

    def record(fake):
        def run(*args):
            calls.append(args)
            return fake(*args)
        return run

    monkeypatch.setattr(kjit._kjit, "_causal_conv1d", record(kjit_conv_contract))
    monkeypatch.setattr(kjit._kjit, "_causal_conv1d_update", record(kjit_update_contract))
    return calls


def vllm_conv_prefill(x, weight, bias, pool, cu, idx, has, silu, pad=-1):
    """vLLM's causal_conv1d_fn semantics in its own layouts: x [D, T], pool [slots, D, L]."""
    d, w = weight.shape
    out = np.full(x.shape, np.nan)
    for n in range(len(cu) - 1):
        if idx[n] == pad:
            continue
        st = pool[idx[n]]
        for t in range(cu[n], cu[n + 1]):
            acc = np.zeros(d) if bias is None else bias.astype(np.float64).copy()
            for j in range(w):  # tap j multiplies the input w-1-j steps back
                p = t - (w - 1 - j)
                col = x[:, p] if p >= cu[n] else (
                    st[:, (w - 1) + (p - cu[n])] if has[n] else np.zeros(d))
                acc += weight[:, j] * col
            out[:, t] = acc / (1 + np.exp(-acc)) if silu else acc
        both = np.concatenate([st[:, :w - 1] if has[n] else np.zeros((d, w - 1)),
                               x[:, cu[n]:cu[n + 1]]], axis=1)
        if cu[n + 1] > cu[n]:
            st[:, :w - 1] = both[:, -(w - 1):]
    return out


def same_layout(a, b):
    """Equal strides in every dimension of extent > 1 (vLLM's torch.empty_like(x) layout)."""
    return all(sa == sb for sa, sb, n in zip(a.strides, b.strides, a.shape) if n > 1)


def conv_inputs(rng, d=16, w=4, lengths=(5, 1, 2, 7), slots=9, cols=None):
    t = sum(lengths)
    x = rng.standard_normal((t, d)).astype(np.float32).T  # vLLM: mixed_qkv.transpose(0, 1)
    weight = rng.standard_normal((d, w)).astype(np.float32)
    bias = rng.standard_normal(d).astype(np.float32)
    cols = w - 1 if cols is None else cols
    pool = rng.standard_normal((slots, cols, d)).astype(np.float32).swapaxes(1, 2)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return x, weight, bias, pool, cu


def test_vllm_causal_conv1d_fn_layout_glue(conv_contract):
    rng = np.random.default_rng()
    x, weight, bias, pool, cu = conv_inputs(rng)
    idx = np.array([3, -1, 0, 6], np.int32)  # -1: padding; 0: a real slot for vLLM's conv
    has = np.array([True, True, False, True])
    x_before, expected_pool = x.copy(), pool.copy()
    expected = vllm_conv_prefill(x, weight, bias, expected_pool, cu, idx, has, True)
    got = vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx, has, metadata=object())
    assert got.shape == x.shape and same_layout(got, x) and got.dtype == x.dtype
    assert np.array_equal(x, x_before)  # a new output, x untouched
    rows = cu[1], cu[2]
    assert np.all(got[:, rows[0]:rows[1]] == 0)  # the padding row: zeros here
    keep = np.ones(x.shape[1], bool)
    keep[rows[0]:rows[1]] = False
    np.testing.assert_allclose(got[:, keep], expected[:, keep], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pool, expected_pool, rtol=1e-6, atol=1e-6)
    (args,) = conv_contract
    assert np.shares_memory(args[0], x) and np.shares_memory(args[7], got)  # views, no copies
    assert args[8] == "silu" and args[9] == "negative"


def test_vllm_causal_conv1d_fn_defaults_for_missing_indices_and_flags(conv_contract):
    rng = np.random.default_rng()
    x, weight, _, pool, cu = conv_inputs(rng, lengths=(3, 4), slots=2)
    expected_pool = pool.copy()
    expected = vllm_conv_prefill(x, weight, None, expected_pool, cu, [0, 1], [False, False],
                                 False)
    got = vllm.causal_conv1d_fn(x, weight, None, pool, cu, activation=None, pad_slot_id=0)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(pool, expected_pool, rtol=1e-6, atol=1e-6)
    # cache_indices None: slot i for sequence i, so slot 0 is no padding even for pad_slot_id 0
    assert conv_contract[0][9] == "negative"
    vllm.causal_conv1d_fn(x, weight, None, pool, cu, np.array([1, 0], np.int32),
                          np.array([True, True]), activation=True, pad_slot_id=0)
    assert conv_contract[1][8] == "silu" and conv_contract[1][9] == "nonpositive"


@pytest.mark.parametrize("seqlen,spec", [(None, False), (1, False), (3, False), (1, True),
                                         (3, True)])
def test_vllm_causal_conv1d_update_layout_glue(conv_contract, seqlen, spec):
    # seqlen None: x [batch, dim] (decode); else [batch, dim, seqlen]; spec: num_accepted_tokens
    rng = np.random.default_rng()
    b, d, w, slots = 5, 16, 4, 8
    s = seqlen or 1
    cols = w - 2 + s if spec else w - 1
    _, weight, bias, pool, _ = conv_inputs(rng, d=d, w=w, slots=slots, cols=cols)
    if seqlen is None:
        x = rng.standard_normal((b, d)).astype(np.float32)
    else:  # vLLM's [batch, dim, seqlen] over token-major rows
        x = rng.standard_normal((b, s, d)).astype(np.float32).swapaxes(1, 2)
    idx = np.array([2, -1, 0, 7, 5], np.int32)
    accepted = rng.integers(1, s + 1, b).astype(np.int32) if spec else None
    before = pool.copy()
    got = vllm.causal_conv1d_update(x, pool, weight, bias, "silu", idx,
                                    num_accepted_tokens=accepted)
    assert got.shape == x.shape and same_layout(got, x)
    (args,) = conv_contract
    assert np.shares_memory(args[0], x) and np.shares_memory(args[6], got)  # views, no copies
    x3 = x[:, :, None] if seqlen is None else x
    g3 = got[:, :, None] if seqlen is None else got
    for r in range(b):
        if idx[r] == -1:
            assert np.all(g3[r] == 0)  # padding: zeros here (vLLM leaves the row unwritten)
            continue
        first = 0 if accepted is None else accepted[r] - 1
        hist = before[idx[r]][:, first:first + w - 1]
        seq = np.concatenate([hist, x3[r]], axis=1)  # [D, W-1+S], vLLM's channel-first rows
        for t in range(s):
            acc = (seq[:, t:t + w] * weight).sum(1) + bias
            np.testing.assert_allclose(g3[r][:, t], acc / (1 + np.exp(-acc)), rtol=1e-5,
                                       atol=1e-5)
        if spec:  # vLLM rolls the window by one column
            np.testing.assert_array_equal(pool[idx[r]][:, :w - 2 + s], seq[:, 1:w - 1 + s])
        else:
            np.testing.assert_array_equal(pool[idx[r]], seq[:, -(w - 1):])
    untouched = [i for i in range(slots) if i not in set(idx.tolist())]
    assert np.array_equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("spec", [False, True])
def test_vllm_causal_conv1d_update_varlen_layout_glue(conv_contract, spec):
    # vLLM's varlen speculative step: x [num_tokens, dim], row b = x[qsl[b]:qsl[b+1]] with
    # 0..4 tokens; rows past qsl[batch] (CUDA-graph padding) are neither read nor written.
    rng = np.random.default_rng()
    d, w, slots = 16, 4, 9
    lengths = [3, 0, 1, 4, 2, 2]
    b, max_len = len(lengths), max(lengths)
    cols = w - 2 + max_len if spec else w - 1
    _, weight, bias, pool, _ = conv_inputs(rng, d=d, w=w, slots=slots, cols=cols)
    qsl = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    t = int(qsl[-1]) + 2  # two trailing tokens that belong to no row
    x = rng.standard_normal((t, d)).astype(np.float32)
    idx = np.array([2, 5, -1, 0, 7, 3], np.int32)  # row 1: no tokens; row 2: padding
    accepted = np.array([1 + int(rng.integers(0, cols - w + 2)) for _ in range(b)], np.int32) \
        if spec else None
    before = pool.copy()
    got = vllm.causal_conv1d_update(x, pool, weight, bias, True, idx,
                                    num_accepted_tokens=accepted, query_start_loc=qsl,
                                    max_query_len=max_len)
    assert got.shape == x.shape and same_layout(got, x)
    (args,) = conv_contract
    assert np.shares_memory(args[0], x) and np.shares_memory(args[6], got)
    assert args[14] is qsl
    expected = before.copy()
    for r in range(b):
        a0, a1, slot = int(qsl[r]), int(qsl[r + 1]), int(idx[r])
        if a1 == a0:
            continue
        if slot == -1:
            assert np.all(got[a0:a1] == 0)
            continue
        first = 0 if accepted is None else int(accepted[r]) - 1
        seq = np.concatenate([before[slot][:, first:first + w - 1], x[a0:a1].T], axis=1)
        for j in range(a1 - a0):
            acc = (seq[:, j:j + w] * weight).sum(1) + bias
            np.testing.assert_allclose(got[a0 + j], acc / (1 + np.exp(-acc)), rtol=1e-5,
                                       atol=1e-5)
        if spec:  # vLLM: column k holds entry k + 1 for k < width - 2 + seqlen_b
            expected[slot][:, :w - 2 + a1 - a0] = seq[:, 1:w - 1 + a1 - a0]
        else:
            expected[slot][:, :w - 1] = seq[:, -(w - 1):]
    np.testing.assert_allclose(pool, expected, rtol=1e-6, atol=1e-6)
    assert np.array_equal(pool[5], before[5])  # the row without tokens: slot untouched


def conv_fn_args(rng=None):
    x, weight, bias, pool, cu = conv_inputs(rng or np.random.default_rng(), lengths=(3, 2),
                                            slots=4)
    return dict(x=x, weight=weight, bias=bias, conv_states=pool, query_start_loc=cu,
                cache_indices=np.array([1, 2], np.int32),
                has_initial_state=np.array([True, False]))


def test_vllm_causal_conv1d_fn_checks_and_unsupported_features():
    f = vllm.causal_conv1d_fn
    args = conv_fn_args()
    for name in ("block_idx_first_scheduled_token", "block_idx_last_scheduled_token",
                 "initial_state_idx", "num_computed_tokens"):
        with pytest.raises(UnsupportedFeature, match=f"prefix caching \\({name}\\)"):
            f(**args, **{name: np.zeros(2, np.int32)})
    with pytest.raises(UnsupportedFeature, match="activation='gelu'"):
        f(**dict(args, activation="gelu"))
    with pytest.raises(UnsupportedFeature, match="pad_slot_id=7"):
        f(**args, pad_slot_id=7)
    with pytest.raises(AssertionError, match="channel stride 1"):
        f(**dict(args, conv_states=np.ascontiguousarray(args["conv_states"])))
    with pytest.raises(AssertionError, match="conv_states must be"):
        f(**dict(args, conv_states=args["conv_states"][:, :8]))
    with pytest.raises(ValueError, match="x must be"):
        f(**dict(args, x=args["x"][None]))
    with pytest.raises(ValueError, match="conv_states is None"):
        f(**dict(args, conv_states=None))
    # validate_data=True adds vLLM's optional checks (AssertionError): x channel-last, ...
    with pytest.raises(AssertionError, match="channel-last"):
        f(**dict(args, x=np.ascontiguousarray(args["x"])), validate_data=True)
    with pytest.raises(AssertionError):
        f(**dict(args, bias=args["bias"][:8]), validate_data=True)
    with pytest.raises(AssertionError):
        f(**dict(args, cache_indices=args["cache_indices"][:1]), validate_data=True)
    with pytest.raises(AssertionError, match="divisible by the BLOCK_M"):
        f(**args, block_size_to_align=12, validate_data=True)


def test_vllm_causal_conv1d_fn_reaches_kjit_after_its_checks():
    # With valid arguments the adapter hands NumPy arrays to kjit, which asks for device memory.
    with pytest.raises(kjit.InvalidArgument, match="CUDA device memory"):
        vllm.causal_conv1d_fn(**conv_fn_args(), validate_data=True, block_size_to_align=16)


def test_vllm_causal_conv1d_update_checks_and_unsupported_features():
    f = vllm.causal_conv1d_update
    rng = np.random.default_rng()
    _, weight, bias, pool, _ = conv_inputs(rng, slots=6)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    idx = np.array([1, 2, 3], np.int32)
    args = dict(x=x, conv_state=pool, weight=weight, bias=bias, conv_state_indices=idx)
    # query_start_loc (varlen rows) needs conv_state_indices, as in vLLM, and x [num_tokens, dim]
    with pytest.raises(AssertionError):
        f(**dict(args, conv_state_indices=None), query_start_loc=np.array([0, 1, 2, 3], np.int32),
          max_query_len=1)
    with pytest.raises(ValueError, match="num_tokens, dim"):
        f(**dict(args, x=x[:, :, None]), query_start_loc=np.array([0, 1, 2, 3], np.int32))
    with pytest.raises(UnsupportedFeature, match="retrieve_parent_token"):
        f(**args, retrieve_parent_token=np.zeros((3, 2), np.int32))
    with pytest.raises(UnsupportedFeature, match="prefix caching"):
        f(**args, block_idx_last_scheduled_token=np.zeros(3, np.int32),
          initial_state_idx=np.zeros(3, np.int32))
    with pytest.raises(UnsupportedFeature, match="pad_slot_id=3"):
        f(**args, pad_slot_id=3)
    with pytest.raises(AssertionError):
        f(**args, activation="gelu")
    with pytest.raises(ValueError, match="conv_state must be"):
        f(**dict(args, conv_state=pool[0]))
    with pytest.raises(ValueError, match="x must be"):
        f(**dict(args, x=x[None, None]))
    with pytest.raises(AssertionError):
        f(**args, pad_slot_id=None, validate_data=True)
    with pytest.raises(AssertionError):  # x's channel stride must be 1
        f(**dict(args, x=rng.standard_normal((16, 3)).astype(np.float32).T),
          validate_data=True)
    with pytest.raises(AssertionError, match="contiguous along feat-dim"):
        f(**dict(args, conv_state=np.ascontiguousarray(pool)), validate_data=True)
    with pytest.raises(AssertionError):
        f(**dict(args, conv_state_indices=idx[:2]), validate_data=True)
    with pytest.raises(kjit.InvalidArgument, match="CUDA device memory"):
        f(**args, activation=True, validate_data=True)
