# SPDX-License-Identifier: Apache-2.0
"""CPU tests of the kjit package: plans (shape names and real arrays), source, compile, settings
and errors. No GPU and no torch needed; NumPy arrays stand in for tensors (planning never
dereferences them)."""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

import kjit


def merge_args(t=4, h=8, d=64, dtype=np.float16, layout="token_major"):
    v_a = np.zeros((t, h, d), dtype)
    v_b = np.zeros((t, h, d), dtype)
    lse_shape = (t, h) if layout == "token_major" else (h, t)
    return v_a, np.zeros(lse_shape, np.float32), v_b, np.zeros(lse_shape, np.float32)


# --- plan by shape names -----------------------------------------------------------------------


def test_plan_by_shape_names_matches_the_issue_example():
    plan = kjit.plan("merge_state", dtype="bf16", tokens=64, heads=256, head_dim=128,
                     arch="sm_90")
    assert isinstance(plan, kjit.Plan)
    assert plan.op == "merge_state"
    # flat: a token's 256 heads would span 8 token_major blocks (rows out of memory order).
    assert plan.mode == "flat"
    assert plan.arch == "sm_90"
    assert len(plan.launches) == 1
    launch = plan.launches[0]
    assert launch.spec.startswith("merge_state:in=bf16,out=bf16,head_dim=128,vec=8,")
    assert launch.spec.endswith("@sm_90")
    assert launch.grid == (1024, 1, 1) and launch.block == (16, 16, 1)
    assert all(check.ok for check in launch.checks)
    text = plan.explain()
    assert text.startswith("op merge_state: mode flat")
    assert "launch 1 of 1: " + launch.spec in text
    assert str(plan) == text
    assert '"mode":"flat"' in plan.to_json().replace(" ", "")


def test_plan_explain_equals_the_kjit_tool():
    tool = os.environ.get("KJIT_TOOL") or shutil.which("kjit")
    if tool is None:
        candidate = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools", "kjit")
        tool = candidate if os.path.exists(candidate) else None
    if tool is None:
        pytest.skip("no kjit tool binary (set KJIT_TOOL) to compare against")
    # The tool binary may be older than this tree: compare on the settled merge_state planner.
    cli = subprocess.run([tool, "plan", "merge_state", "--tokens", "4096", "--heads", "128",
                          "--head-dim", "128", "--lse-base", "2", "--arch", "h200"],
                         capture_output=True, text=True, check=True).stdout
    plan = kjit.plan("merge_state", tokens=4096, heads=128, head_dim=128, lse_base=2,
                     arch="h200")
    assert plan.explain() == cli


def test_plan_accepts_ints_bools_and_dtype_objects():
    a = kjit.plan("merge_state", tokens=7, heads=128, head_dim=64, dtype=np.float16,
                  pos_inf_empty=False, lse_base=2, arch="sm_80")
    b = kjit.plan("merge_state", tokens="7", heads="128", head_dim="64", dtype="f16",
                  pos_inf_empty="0", lse_base="2", arch="sm_80")
    assert a.specs == b.specs
    assert "pos_inf_empty=0" in a.specs[0] and "base=2" in a.specs[0]
    assert "in=f16" in a.specs[0] and a.specs[0].endswith("@sm_80")


def test_plan_gdn_decode_large_grid_is_legal():
    # B * HV = 65536 * 32 rows: vLLM's (B*HV)-in-grid-y kernel cannot launch this; every
    # launch kjit plans must pass its checks.
    plan = kjit.plan("gdn_decode", batch=65536, heads=16, v_heads=32, k=128, v=128, arch="sm_90")
    assert plan.launches
    for launch in plan.launches:
        assert launch.grid[1] <= 65535 and launch.grid[2] <= 65535
        assert all(check.ok for check in launch.checks)


def test_plan_gdn_prefill():
    plan = kjit.plan("gdn_prefill", tokens=8192, seqs=4, heads=16, v_heads=32, k=128, v=128,
                     arch="h200")
    assert plan.op == "gdn_prefill"
    # Both kernels on wgmma (sm_90a) with the whole-V state tile.
    assert plan.mode == "chunked_bv128_wgmma"
    assert plan.launches and plan.specs[0].startswith("gdn_prefill_chunk:")
    assert plan.specs[0].endswith("@sm_90a")
    assert plan.specs[1].endswith("@sm_90a")


def test_plan_gdn_prefill_state_kernel_overlaps_the_chunk_kernel_from_sm_90():
    # The whole-V state tile (one block per SM) starts during the chunk kernel's last blocks
    # (programmatic dependent launch); sm_80 has no griddepcontrol, so its launches serialize.
    # (8k tokens in 4 sequences: with more chunks the H200 takes the warp-specialized kernel.)
    shape = dict(tokens=8192, seqs=4, heads=16, v_heads=32, k=128, v=128)
    hopper = kjit.plan("gdn_prefill", arch="h200", **shape)
    assert [launch.overlaps_previous for launch in hopper.launches] == [False, True]
    ampere = kjit.plan("gdn_prefill", arch="sm_80", **shape)
    assert [launch.overlaps_previous for launch in ampere.launches] == [False, False]


def test_shape_names_are_the_tool_vocabulary():
    names = {name: (size, default) for name, size, default, _ in kjit.shape_names("merge_state")}
    assert names["tokens"] == (True, "")
    assert names["head_dim"] == (True, "")
    assert names["dtype"] == (False, "bf16")
    assert "states" in {n for n, *_ in kjit.shape_names("merge_states")}


# --- plan errors --------------------------------------------------------------------------------


def test_plan_missing_size_names_it():
    with pytest.raises(kjit.InvalidArgument, match=r"heads .*missing; required: tokens, heads"):
        kjit.plan("merge_state", tokens=4, head_dim=128, arch="sm_90")


def test_plan_unknown_name_lists_the_accepted():
    with pytest.raises(kjit.InvalidArgument, match=r"no parameter 'head_size'; accepted: .*head_dim"):
        kjit.plan("merge_state", tokens=4, heads=8, head_dim=128, head_size=1, arch="sm_90")


def test_plan_unknown_op_lists_the_ops():
    with pytest.raises(kjit.InvalidArgument, match=r"op = 'merge' is not an op; accepted: merge_state"):
        kjit.plan("merge", arch="sm_90")


def test_plan_bad_value_names_argument_value_and_accepted():
    with pytest.raises(kjit.InvalidArgument) as info:
        kjit.plan("merge_state", tokens=4, heads=8, head_dim=100, arch="sm_90")
    message = str(info.value)
    assert "head_dim" in message and "100" in message and "multiple of 8" in message
    assert isinstance(info.value, ValueError)


def test_plan_bad_arch():
    with pytest.raises(kjit.InvalidArgument, match="sm_75"):
        kjit.plan("merge_state", tokens=4, heads=8, head_dim=64, arch="sm_75")


def test_plan_error_is_a_plan_error_not_a_value_error():
    with pytest.raises(kjit.PlanError) as info:
        kjit.plan("merge_state", tokens=2**31, heads=8, head_dim=64, mode="token_major",
                  arch="sm_90")
    assert isinstance(info.value, kjit.Error) and isinstance(info.value, RuntimeError)
    assert not isinstance(info.value, ValueError)
    assert "grid x limit" in str(info.value)


def test_plan_arch_and_device_together_is_refused():
    with pytest.raises(kjit.InvalidArgument, match="not both"):
        kjit.plan("merge_state", tokens=4, heads=8, head_dim=64, arch="sm_90", device=0)


# --- plan_call: the plan of a concrete call ------------------------------------------------------


def test_plan_call_matches_the_shape_plan():
    args = merge_args(t=64, h=256, d=128, dtype=np.float32)
    plan = kjit.plan_call("merge_state", *args, lse_base="e", arch="sm_90")
    by_names = kjit.plan("merge_state", tokens=64, heads=256, head_dim=128, dtype="f32",
                         arch="sm_90")
    assert plan.specs == by_names.specs
    assert plan.launches[0].grid == by_names.launches[0].grid


def test_plan_call_sees_misalignment():
    # A view starting 2 bytes into the buffer allows only 2-byte vectors: vec = 1 for f16.
    t, h, d = 4, 8, 64
    raw = np.zeros(t * h * d + 1, np.float16)
    v_a = raw[1:].reshape(t, h, d)
    _, s_a, v_b, s_b = merge_args(t, h, d)
    plan = kjit.plan_call(kjit.merge_state, v_a, s_a, v_b, s_b, lse_base=2, arch="sm_90")
    assert ",vec=1," in plan.specs[0]


def test_plan_call_head_major_layout():
    args = merge_args(t=5, h=16, d=64, layout="head_major")
    plan = kjit.plan_call("merge_state_in_place", *args, lse_base="e", lse_layout="head_major",
                          arch="sm_90")
    assert plan.op == "merge_state_in_place"
    with pytest.raises(kjit.InvalidArgument, match=r"s has shape \[16, 5\]; expected \[T, H\]"):
        kjit.plan_call("merge_state_in_place", *args, lse_base="e", arch="sm_90")


def test_plan_call_merge_states():
    t, s, h, d = 3, 4, 8, 64
    v = np.zeros((t, s, h, d), np.float16)
    lse = np.zeros((t, s, h), np.float32)
    plan = kjit.plan_call("merge_states", v, lse, lse_base="e", arch="sm_90")
    assert plan.op == "merge_states" and ",op=many," in plan.specs[0]


def test_plan_call_gdn_decode_and_its_errors():
    b, h, hv, k, v = 8, 2, 4, 64, 64
    qkv = np.zeros((b, 2 * h * k + hv * v), np.float16)
    gate = np.zeros((b, hv), np.float16)
    params = np.zeros(hv, np.float32)
    state = np.zeros((b + 1, hv, v, k), np.float32)
    idx = np.arange(b, dtype=np.int32)
    plan = kjit.plan_call("gdn_decode", qkv, gate, gate, params, params, state, idx,
                          arch="sm_90")
    assert plan.op.startswith("gdn_decode")
    with pytest.raises(kjit.InvalidArgument, match="gdn_decode.*state_indices"):
        kjit.plan_call("gdn_decode", qkv, gate, gate, params, params, state,
                       idx.astype(np.float32), arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="invalid_index = 'zero'.*'negative'"):
        kjit.plan_call("gdn_decode", qkv, gate, gate, params, params, state, idx,
                       invalid_index="zero", arch="sm_90")


def test_plan_call_gdn_prefill_gates_must_be_one_form():
    t, n, h, hv, k, v = 64, 2, 2, 4, 64, 64
    q = np.zeros((t, h, k), np.float16)
    vv = np.zeros((t, hv, v), np.float16)
    cu = np.array([0, 10, t], np.int32)
    state = np.zeros((n, hv, v, k), np.float32)
    idx = np.arange(n, dtype=np.int32)
    g = np.zeros((t, hv), np.float32)
    plan = kjit.plan_call("gdn_prefill", q, q, vv, cu, state, idx, g=g, beta=g, arch="sm_90")
    assert plan.op == "gdn_prefill"
    with pytest.raises(kjit.InvalidArgument, match="not neither"):
        kjit.plan_call("gdn_prefill", q, q, vv, cu, state, idx, arch="sm_90")


def test_plan_causal_conv1d_legal_at_the_issue_limits():
    plan = kjit.plan("causal_conv1d", tokens=131072, seqs=16, dim=8192, arch="h200")
    assert plan.op == "causal_conv1d" and plan.mode == "chunked"
    assert "width=4" in plan.explain()
    plan = kjit.plan("causal_conv1d_update", batch=70000, steps=1, dim=1 << 20, arch="h200")
    assert plan.mode == "rows"
    plan = kjit.plan("causal_conv1d", tokens=1000, seqs=4, dim=64, in_place=1, arch="sm_80")
    assert plan.mode == "sequential"


def test_plan_call_causal_conv1d_transposed_views_and_errors():
    t, d, w, n = 50, 64, 4, 3
    x = np.zeros((d, t), np.float16).T  # token-contiguous
    weight = np.zeros((d, w), np.float32)
    pool = np.zeros((n + 1, w - 1, d), np.float16).transpose(0, 2, 1)
    cu = np.array([0, 10, 11, t], np.int64)
    idx = np.arange(n, dtype=np.int32)
    out = np.zeros((t, d), np.float16)
    plan = kjit.plan_call("causal_conv1d", x, weight, pool, cu, idx, out=out, activation="silu",
                          arch="sm_90")
    assert plan.op == "causal_conv1d" and "vec=1" in plan.explain()
    with pytest.raises(kjit.InvalidArgument, match="activation = 'gelu'"):
        kjit.plan_call("causal_conv1d", x, weight, pool, cu, idx, out=out, activation="gelu",
                       arch="sm_90")
    xd = np.zeros((5, 2, d), np.float32)
    spool = np.zeros((6, d, w), np.float32)
    acc = np.ones(5, np.int32)
    plan = kjit.plan_call("causal_conv1d_update", xd, weight, spool, np.arange(5, dtype=np.int32),
                          num_accepted_tokens=acc, out=np.zeros_like(xd), arch="sm_90")
    assert plan.mode == "rows"
    with pytest.raises(kjit.InvalidArgument, match="conv_state has shape"):
        kjit.plan_call("causal_conv1d_update", xd, weight, np.zeros((6, d, 2), np.float32),
                       np.arange(5, dtype=np.int32), out=np.zeros_like(xd), arch="sm_90")


# --- argument errors (same messages as the C++ library) -----------------------------------------


def test_shape_mismatch_names_argument_and_expected_shape():
    v_a, s_a, _, s_b = merge_args(4, 8, 64)
    v_b = np.zeros((4, 8, 32), np.float16)
    with pytest.raises(kjit.InvalidArgument,
                       match=r"merge_state: v_b has shape \[4, 8, 32\]; expected the shape of "
                             r"v_a = \[4, 8, 64\]"):
        kjit.plan_call("merge_state", v_a, s_a, v_b, s_b, lse_base="e", arch="sm_90")


def test_wrong_lse_dtype():
    v_a, _, v_b, s_b = merge_args()
    s_a = np.zeros((4, 8), np.float64)
    with pytest.raises(kjit.InvalidArgument, match="s_a has dtype f64; accepted: f32"):
        kjit.plan_call("merge_state", v_a, s_a, v_b, s_b, lse_base="e", arch="sm_90")


def test_missing_lse_base_explains_why_there_is_no_default():
    with pytest.raises(kjit.InvalidArgument, match=r"lse_base is required; accepted: '2'.*'e'"):
        kjit.plan_call("merge_state", *merge_args(), arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="lse_base = '10' is not a base"):
        kjit.plan_call("merge_state", *merge_args(), lse_base=10, arch="sm_90")


def test_unsupported_dtype_rank_and_object():
    v_a, s_a, v_b, s_b = merge_args()
    with pytest.raises(kjit.InvalidArgument, match=r"v_a has DLPack dtype \(code 5"):
        kjit.plan_call("merge_state", v_a.astype(np.complex64), s_a, v_b, s_b, lse_base="e",
                       v_out=v_a, arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="v_a has rank 5; accepted: at most 4"):
        kjit.plan_call("merge_state", np.zeros((1, 1, 1, 1, 8), np.float16), s_a, v_b, s_b,
                       lse_base="e", v_out=v_a, arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="v_b is a int; accepted: a torch tensor"):
        kjit.plan_call("merge_state", v_a, s_a, 3, s_b, lse_base="e", arch="sm_90")


def test_launching_host_arrays_is_refused():
    with pytest.raises(kjit.InvalidArgument,
                       match="merge_state: v_a is not in CUDA device memory; accepted: a tensor "
                             "on a CUDA device"):
        kjit.merge_state(*merge_args(), lse_base="e")


def test_outputs_are_allocated_like_the_inputs():
    # plan_call allocates the outputs it is not given the same way a launch does.
    t, s, h, d = 3, 4, 8, 64
    v = np.zeros((t, s, h, d), np.float16)
    lse = np.zeros((h, t, s), np.float32)
    plan = kjit.plan_call("merge_states", v, lse, lse_base="e", lse_layout="head_major",
                          out_dtype="f32", arch="sm_90")
    assert ",in=f16,out=f32," in "," + plan.specs[0].split(":", 1)[1]


def test_per_step_ops_parse_their_own_arguments():
    # merge_state, merge_state_in_place and gdn_decode are METH_FASTCALL functions of the
    # extension: their keywords must behave like a Python function's.
    import inspect

    sig = inspect.signature(kjit.merge_state)
    assert list(sig.parameters)[:6] == ["v_a", "s_a", "v_b", "s_b", "v_out", "s_out"]
    assert sig.parameters["lse_base"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "Merges two partial attention states" in kjit.merge_state.__doc__
    assert "mask" in inspect.signature(kjit.merge_state_in_place).parameters
    assert inspect.signature(kjit.gdn_decode).parameters["softplus_threshold"].default == 20.0
    args = merge_args()
    with pytest.raises(TypeError, match=r"merge_state\(\) got an unexpected keyword argument "
                                        r"'lse'; accepted: v_a, s_a, .*lse_base"):
        kjit.merge_state(*args, lse="e")
    with pytest.raises(TypeError, match=r"got multiple values for argument 'v_a'"):
        kjit.merge_state(*args, v_a=args[0], lse_base="e")
    with pytest.raises(TypeError, match=r"takes at most 6 positional arguments \(7 given\)"):
        kjit.merge_state(*args, args[0], args[1], "e")
    with pytest.raises(TypeError, match=r"merge_state\(\) missing required argument 's_b'"):
        kjit.merge_state(*args[:3], lse_base="e")
    # A wrongly typed option is a TypeError before any tensor is looked at.
    with pytest.raises(TypeError, match=r"pos_inf_as_empty must be True or False, got a int"):
        kjit.merge_state(*args, lse_base="e", pos_inf_as_empty=1)
    with pytest.raises(TypeError, match=r"lse_layout must be a str, got a int"):
        kjit.merge_state_in_place(*args, lse_base="e", lse_layout=0)
    with pytest.raises(TypeError, match=r"gdn_decode\(\) missing required argument 'state'"):
        kjit.gdn_decode(*decode_args()[:5])
    with pytest.raises(TypeError, match=r"scale must be a number, got a str"):
        kjit.gdn_decode(*decode_args(), scale="0.1")
    # Keywords built at run time (not interned by a call site) match by value.
    kwargs = {"".join(["lse_", "base"]): 2, "_arch": "sm_90", "_plan": True}
    assert kjit.merge_state(*args, **kwargs).op == "merge_state"
    assert kjit.merge_state_in_place(*args, **kwargs).op == "merge_state_in_place"


def decode_args(b=2, h=16, hv=32, k=128):
    return (np.zeros((b, 2 * h * k + hv * k), np.float16), np.zeros((b, hv), np.float16),
            np.zeros((b, hv), np.float16), np.zeros(hv, np.float32), np.zeros(hv, np.float32),
            np.zeros((3, hv, k, k), np.float32), np.zeros(b, np.int32))


def test_gdn_decode_allocates_out_and_plans_with_options():
    plan = kjit.plan_call("gdn_decode", *decode_args(b=5), arch="sm_90", scale=0.25,
                          l2norm_qk=False, invalid_index="nonpositive")
    assert plan.op == "gdn_decode" and all(c.ok for c in plan.launches[0].checks)
    with pytest.raises(kjit.InvalidArgument, match="invalid_index = 'zero' is not a convention"):
        kjit.plan_call("gdn_decode", *decode_args(), arch="sm_90", invalid_index="zero")


def test_gdn_decode_fused_conv_plans_its_own_kernel():
    # conv_weight and conv_state make gdn_decode the fused decode step (issue 22): mixed_qkv
    # before the convolution, one gdn_decode_conv launch.
    args = decode_args(b=3)
    d = args[0].shape[1]
    weight, pool = np.zeros((d, 4), np.float16), np.zeros((3, d, 3), np.float16)
    plan = kjit.plan_call("gdn_decode", *args, arch="h200", conv_weight=weight, conv_state=pool)
    assert len(plan.launches) == 1 and plan.mode == "fused_conv"
    spec = plan.launches[0].spec
    assert spec.startswith("gdn_decode_conv:") and "silu=1" in spec
    plan = kjit.plan_call("gdn_decode", *args, arch="h200", conv_weight=weight,
                          conv_bias=np.zeros(d, np.float16), conv_state=pool,
                          conv_activation="none")
    assert "silu=0" in plan.launches[0].spec
    with pytest.raises(kjit.InvalidArgument, match="conv_weight and conv_state go together"):
        kjit.plan_call("gdn_decode", *args, arch="h200", conv_weight=weight)
    with pytest.raises(kjit.InvalidArgument, match="conv_activation = 'relu'"):
        kjit.plan_call("gdn_decode", *args, arch="h200", conv_weight=weight, conv_state=pool,
                       conv_activation="relu")
    with pytest.raises(kjit.InvalidArgument, match="options.conv->conv_state"):
        kjit.plan_call("gdn_decode", *args, arch="h200", conv_weight=weight,
                       conv_state=np.zeros((4, d, 3), np.float16))
    by_shape = kjit.plan("gdn_decode_conv", batch=1, heads=16, v_heads=32, k=128, v=128,
                         arch="h200")
    assert by_shape.launches[0].spec.startswith("gdn_decode_conv:")


def test_gdn_prefill_checkpoint_starts():
    assert kjit.gdn_prefill_checkpoint_starts([0, 0, 70, 270, 400], 64) == [0, 0, 1, 4, 6]
    assert kjit.gdn_prefill_checkpoint_starts([0, 127, 383], 128) == [0, 0, 2]
    with pytest.raises(kjit.InvalidArgument, match="every = 65; accepted: a positive multiple"):
        kjit.gdn_prefill_checkpoint_starts([0, 64], 65)
    with pytest.raises(kjit.InvalidArgument, match="non-decreasing offsets"):
        kjit.gdn_prefill_checkpoint_starts([0, 64, 10], 64)


def test_gdn_prefill_workspace_bytes():
    small, large = kjit.gdn_prefill_workspace_bytes(64, 1), kjit.gdn_prefill_workspace_bytes(
        131072, 32)
    assert 0 < small < large and large >= 131072 * 32 * 64
    with pytest.raises(kjit.InvalidArgument, match="tokens = -1"):
        kjit.gdn_prefill_workspace_bytes(-1, 4)


def test_plan_call_unknown_op():
    with pytest.raises(kjit.InvalidArgument, match="plan_call: op = 'merge' is not a kjit op"):
        kjit.plan_call("merge", arch="sm_90")


# --- issue 20: messages, number forms, gdn_decode's options ------------------------------------


def test_plan_sizes_must_be_ints_and_are_named():
    for value in (64.0, None, True, "many"):
        with pytest.raises(kjit.InvalidArgument,
                           match=rf"plan: tokens = {re.escape(repr(value))} \(\w+\) is not a "
                                 r"size of merge_state; accepted: an int"):
            kjit.plan("merge_state", tokens=value, heads=8, head_dim=64, arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match=r"batch = True \(bool\)"):
        kjit.plan("gdn_decode", batch=True, heads=16, v_heads=32, k=128, v=128, arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match=r"batch = None \(NoneType\)"):
        kjit.plan("gdn_decode", batch=None, heads=16, v_heads=32, k=128, v=128, arch="sm_90")


def test_plan_zero_heads_is_named():
    with pytest.raises(kjit.InvalidArgument,
                       match="heads = 0 is out of range; heads must be >= 1"):
        kjit.plan("merge_state", tokens=4, heads=0, head_dim=64, arch="sm_90")


def test_wrong_argument_types_are_kjit_errors_not_binding_signatures():
    for call in (lambda: kjit.plan("merge_state", tokens=4, heads=8, head_dim=64, arch=90),
                 lambda: kjit.plan_call("merge_state", *merge_args(), lse_base="e", arch=90)):
        with pytest.raises(kjit.InvalidArgument,
                           match=r"arch = 90 is a int; accepted: a str naming an arch"):
            call()
    for fn in (kjit.source, kjit.compile):
        with pytest.raises(kjit.InvalidArgument,
                           match=r"spec = None is a NoneType; accepted: a spec string"):
            fn(None)
    with pytest.raises(kjit.InvalidArgument, match=r"device = 'cuda' is a str"):
        kjit.plan("merge_state", tokens=4, heads=8, head_dim=64, device="cuda")


def test_lse_base_as_people_type_it():
    import math

    for base, text in ((2, ",base=2,"), (2.0, ",base=2,"), (math.e, ",base=e,"),
                       (np.float64(math.e), ",base=e,"), ("e", ",base=e,")):
        assert text in kjit.plan_call("merge_state", *merge_args(), lse_base=base,
                                      arch="sm_90").specs[0]
        assert text in kjit.plan_call("merge_state_in_place", *merge_args(), lse_base=base,
                                      arch="sm_90").specs[0]
        v, s = np.zeros((3, 2, 8, 64), np.float16), np.zeros((3, 2, 8), np.float32)
        assert text in kjit.plan_call("merge_states", v, s, lse_base=base, arch="sm_90").specs[0]
        assert text in kjit.plan("merge_state", tokens=4, heads=8, head_dim=64, lse_base=base,
                                 arch="sm_90").specs[0]
    with pytest.raises(kjit.InvalidArgument, match="lse_base = '2.5' is not a base"):
        kjit.plan_call("merge_state", *merge_args(), lse_base=2.5, arch="sm_90")


def test_an_index_dtype_kjit_has_no_name_for_lists_the_index_dtypes():
    args = list(decode_args())
    args[6] = np.zeros(2, np.int16)
    with pytest.raises(kjit.InvalidArgument) as info:
        kjit.plan_call("gdn_decode", *args, arch="sm_90")
    assert "state_indices has DLPack dtype (code 0, bits 16" in str(info.value)
    assert str(info.value).endswith("accepted: int32, int64")


def test_a_torch_int16_index_tensor_lists_the_index_dtypes():
    torch = pytest.importorskip("torch")
    args = list(decode_args())
    args[6] = torch.zeros(2, dtype=torch.int16)
    with pytest.raises(kjit.InvalidArgument) as info:
        kjit.plan_call("gdn_decode", *args, arch="sm_90")
    assert str(info.value).endswith("state_indices has dtype torch.int16; accepted: int32, int64")


def test_gdn_decode_row_order():
    # 256 rows x 32 heads x 128 x 128 f32: 512 MiB of state, where the planner visits the pool
    # in slot order (a ranking kernel first); row_order overrides it either way.
    args = decode_args(b=256)
    assert len(kjit.plan_call("gdn_decode", *args, arch="h200").launches) == 2
    assert len(kjit.plan_call("gdn_decode", *args, arch="h200", row_order="as_given").launches) == 1
    small = decode_args(b=3)
    assert len(kjit.plan_call("gdn_decode", *small, arch="h200").launches) == 1
    assert len(kjit.plan_call("gdn_decode", *small, arch="h200", row_order="by_slot").launches) == 2
    gated = (small[0], np.zeros((3, 32), np.float32), np.zeros((3, 32), np.float32), small[5],
             small[6])
    assert len(kjit.plan_call("gdn_decode_gated", *gated, arch="h200",
                              row_order="by_slot").launches) == 2
    with pytest.raises(kjit.InvalidArgument, match="row_order = 'sorted' is not an order"):
        kjit.plan_call("gdn_decode", *small, arch="h200", row_order="sorted")
    import inspect

    assert inspect.signature(kjit.gdn_decode).parameters["row_order"].default == "auto"


def test_gdn_decode_documents_its_index_rule_first():
    # The default rule is SGLang's; a vLLM pool (slot 0 a null block) needs "nonpositive".
    doc = kjit.gdn_decode.__doc__
    rule = doc.index("invalid_index defaults to 'negative'")
    assert rule < doc.index("mixed_qkv [B,")
    assert "invalid_index='nonpositive'" in doc and "vLLM" in doc and "The default stays" in doc
    assert "'nonpositive'" in kjit.gdn_decode_gated.__doc__


def test_disable_jit_uses_a_prefilled_disk_cache(tmp_path):
    kjit.configure(cache_dir=str(tmp_path / "cache"))
    try:
        try:
            kjit.compile(SPEC)
        except kjit.CompileError as error:
            pytest.skip(f"NVRTC not usable here: {error}")
        # A deployment: no compiler, JIT off, the cache filled by another process.
        kjit.configure(cache_dir=str(tmp_path / "cache"), disable_jit=True,
                       nvrtc_library="/nonexistent/libnvrtc.so", log="ERROR")
        assert kjit.settings()["log"] == "error"
        assert kjit.compile(SPEC)["origin"] == "disk"
        assert not kjit.cache_stats()["nvrtc_loaded"]
        with pytest.raises(kjit.KernelNotInBundle, match="not in the disk cache"):
            kjit.compile(SPEC.replace("head_dim=64", "head_dim=128"))
    finally:
        kjit.configure()


# --- source, compile, settings ------------------------------------------------------------------

SPEC = ("merge_state:in=f16,out=f16,head_dim=64,vec=8,chunks=1,mode=flat,op=pair,base=e,"
        "pos_inf_empty=1@sm_90")


def test_source_is_the_stub_and_its_templates():
    stub = kjit.source(SPEC)
    assert '#include "templates/merge_state/merge_state.cuh"' in stub
    full = kjit.source(SPEC, templates=True)
    assert full.startswith(stub)
    assert "// ===== templates/merge_state/merge_state.cuh =====" in full
    assert "__global__" in full


def test_bad_spec_names_the_parameter():
    with pytest.raises(kjit.InvalidArgument, match="head_dim"):
        kjit.source(SPEC.replace("head_dim=64", "head_dim=63"))
    with pytest.raises(kjit.InvalidArgument, match="nosuchop"):
        kjit.source("nosuchop:x=1@sm_90")


def test_compile_through_the_cache(tmp_path):
    kjit.configure(cache_dir=str(tmp_path / "cache"))
    try:
        assert kjit.settings()["cache_dir"] == str(tmp_path / "cache")
        try:
            first = kjit.compile(SPEC)
        except kjit.CompileError as error:
            if "load" in str(error).lower() or "nvrtc" in str(error).lower():
                pytest.skip(f"NVRTC not usable here: {error}")
            raise
        assert first["origin"] == "compiled"
        assert first["spec"] == SPEC
        assert len(first["key"]) == 32
        assert first["cubin"][:4] == b"\x7fELF"
        assert first["resources"]["registers"] > 0
        assert ".entry" in first["ptx"]
        assert kjit.compile(SPEC)["origin"] == "memory"
        # A fresh runtime on the same root finds the entry on disk.
        kjit.configure(cache_dir=str(tmp_path / "cache"))
        assert kjit.compile(SPEC)["origin"] == "disk"
        assert kjit.cache_stats()["disk_hits"] == 1
    finally:
        kjit.configure()


def test_configure_rejects_bad_values():
    with pytest.raises(kjit.InvalidArgument, match="log = 'loud'.*off, error, warn, info, debug"):
        kjit.configure(log="loud")
    with pytest.raises(TypeError):
        kjit.configure(cache_dirs="/tmp")


def test_disable_jit_without_bundle_is_kernel_not_in_bundle(tmp_path):
    kjit.configure(cache_dir=str(tmp_path), disable_jit=True)
    try:
        assert kjit.settings()["disable_jit"] is True
        with pytest.raises(kjit.KernelNotInBundle) as info:
            kjit.compile(SPEC)
        assert isinstance(info.value, kjit.Error)
        assert "merge_state" in str(info.value)
    finally:
        kjit.configure()


def test_prewarm_without_a_gpu_says_why():
    ok, why = kjit.driver_available()
    if ok:
        pytest.skip("a CUDA device is present: prewarm is covered by the GPU tests")
    assert why
    with pytest.raises(kjit.Error):
        kjit.prewarm("merge_state", tokens=4, heads=8, head_dim=64)
    with pytest.raises(kjit.InvalidArgument, match="only accepted with an op name"):
        kjit.prewarm(SPEC, device=0, tokens=4)


def test_exception_hierarchy():
    assert issubclass(kjit.InvalidArgument, kjit.Error)
    assert issubclass(kjit.InvalidArgument, ValueError)
    for cls in (kjit.PlanError, kjit.CompileError, kjit.CacheError, kjit.DriverError,
                kjit.KernelNotInBundle):
        assert issubclass(cls, kjit.Error) and issubclass(cls, RuntimeError)
    assert kjit.Error.__module__ == "kjit"


# --- reading torch tensors: the C++ fast path against the attribute path --------------------


def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: the torch tensor readers are not tested")
    return torch


def _fast_torch():
    torch = _torch()
    previous = kjit._kjit._torch_fastpath()
    if not kjit._kjit._torch_fastpath(True):
        pytest.skip(f"the torch fast path is not in use: {kjit.torch_fastpath_error}")
    kjit._kjit._torch_fastpath(previous)
    return torch


def _read(obj, fast):
    """What an op reads from obj through one path: the view, or the error it raises."""
    previous = kjit._kjit._torch_fastpath()
    kjit._kjit._torch_fastpath(fast)
    try:
        return kjit._kjit._read_tensor(obj)
    except Exception as error:  # noqa: BLE001 - the error is the result compared
        return (type(error), str(error))
    finally:
        kjit._kjit._torch_fastpath(previous)


def _tensor_cases(torch):
    """Named CPU tensors of every kjit dtype in every layout the ops may be given."""
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
              torch.int64, torch.uint8, torch.bool]
    if hasattr(torch, "float8_e4m3fn"):
        dtypes.append(torch.float8_e4m3fn)
    for dtype in dtypes:
        base = torch.zeros(6, 8, 10, dtype=torch.float32).to(dtype)
        yield dtype, "contiguous", base
        yield dtype, "strided", base[:, ::2, ::3]
        yield dtype, "sliced", base[1:4, 2:, 5:]
        yield dtype, "transposed", base.transpose(0, 2)
        yield dtype, "permuted", base.permute(1, 2, 0)
        yield dtype, "expanded", base[:1].expand(4, 8, 10)
        yield dtype, "0-d", base[2, 3, 4]
        yield dtype, "1-d", base[:, 1, 2]
        yield dtype, "4-d", base.reshape(2, 3, 8, 10)
        yield dtype, "empty", base[:0]


def test_fast_path_reads_the_same_views_as_the_attribute_path():
    torch = _fast_torch()
    count = 0
    for dtype, layout, tensor in _tensor_cases(torch):
        fast, slow = _read(tensor, True), _read(tensor, False)
        assert fast[-1] == "fast", (dtype, layout, fast)
        assert slow[-1] == "attributes", (dtype, layout, slow)
        assert fast[:-1] == slow[:-1], (dtype, layout)
        # ... and both are the tensor's own attributes.
        assert fast[0] == tensor.data_ptr() and fast[2] == tuple(tensor.shape)
        assert fast[3] == tensor.stride() and fast[4] == -1
        count += 1
    assert count >= 80


def test_fast_path_reads_parameters_and_grad_tensors():
    torch = _fast_torch()
    param = torch.nn.Parameter(torch.zeros(3, 4))
    leaf = torch.zeros(3, 4, requires_grad=True)
    for tensor in (param, leaf, leaf * 2):
        fast, slow = _read(tensor, True), _read(tensor, False)
        assert fast[-1] == "fast" and fast[:-1] == slow[:-1]


def test_fast_path_declines_subclasses_and_unusual_tensors():
    torch = _fast_torch()

    class Sub(torch.Tensor):
        pass

    sub = torch.zeros(3, 4).as_subclass(Sub)
    fast, slow = _read(sub, True), _read(sub, False)
    assert fast[-1] == "attributes" and fast == slow  # declined, then read the same way
    sparse = torch.zeros(3, 4).to_sparse()
    assert _read(sparse, True) == _read(sparse, False)
    meta = torch.empty(3, 4, device="meta")
    assert _read(meta, True)[:-1] == _read(meta, False)[:-1]


def test_fast_path_errors_are_the_attribute_path_errors():
    torch = _fast_torch()
    bad = [torch.zeros(2, 3, dtype=torch.complex64), torch.zeros(2, 3, dtype=torch.int16),
           torch.zeros(1, 1, 1, 1, 1), torch.zeros(2, 1, 1, 1, 1, 2)[0]]
    if hasattr(torch, "float8_e5m2"):
        bad.append(torch.zeros(2, dtype=torch.float8_e5m2))
    for tensor in bad:
        fast, slow = _read(tensor, True), _read(tensor, False)
        assert fast == slow and fast[0] is kjit.InvalidArgument, (tensor.dtype, fast)
    assert "has dtype torch.complex64; accepted: float16, bfloat16" in _read(bad[0], True)[1]
    assert "has rank 5; accepted: at most 4 dimensions" in _read(bad[2], True)[1]


def test_host_torch_tensors_are_refused_the_same_way_by_both_paths():
    torch = _fast_torch()
    v = torch.zeros(4, 8, 64, dtype=torch.float16)
    s = torch.zeros(4, 8)
    messages = []
    for fast in (True, False):
        previous = kjit._kjit._torch_fastpath()
        kjit._kjit._torch_fastpath(fast)
        try:
            with pytest.raises(kjit.InvalidArgument) as error:
                kjit.merge_state(v, s, v, s, v.clone(), s.clone(), lse_base="e")
            messages.append(str(error.value))
        finally:
            kjit._kjit._torch_fastpath(previous)
    assert messages[0] == messages[1]
    assert "merge_state: v_a is not in CUDA device memory" in messages[0]


def test_planning_host_torch_tensors_is_identical_on_both_paths():
    torch = _fast_torch()
    v = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    s = torch.zeros(4, 8)
    plans = []
    for fast in (True, False):
        previous = kjit._kjit._torch_fastpath()
        kjit._kjit._torch_fastpath(fast)
        try:
            plans.append(kjit.plan_call("merge_state", v, s, v, s, v, s, lse_base="e",
                                        arch="sm_90").explain())
        finally:
            kjit._kjit._torch_fastpath(previous)
    assert plans[0] == plans[1]


def test_outputs_allocated_for_torch_inputs_on_both_paths():
    # Outputs kjit allocates for torch tensors: at::empty through the fast path, torch.empty
    # through Python otherwise; the plan shows the dtype they got.
    torch = _fast_torch()
    v = torch.zeros(4, 8, 64, dtype=torch.bfloat16)[:, :, :]
    s = torch.zeros(4, 8)
    qkv = torch.zeros(3, 2 * 16 * 128 + 32 * 128, dtype=torch.float16)
    decode = (qkv, torch.zeros(3, 32, dtype=torch.float16), torch.zeros(3, 32, dtype=torch.float16),
              torch.zeros(32), torch.zeros(32), torch.zeros(4, 32, 128, 128),
              torch.zeros(3, dtype=torch.int32))
    for fast in (True, False):
        previous = kjit._kjit._torch_fastpath()
        kjit._kjit._torch_fastpath(fast)
        try:
            for out_dtype, name in ((None, "bf16"), (torch.float32, "f32"), ("f32", "f32")):
                plan = kjit.plan_call("merge_state", v, s, v, s, lse_base="e", arch="sm_90",
                                      out_dtype=out_dtype)
                assert f",out={name}," in plan.specs[0], (fast, out_dtype, plan.specs[0])
            plan = kjit.plan_call("gdn_decode", *decode, arch="sm_90")
            assert plan.op == "gdn_decode"
        finally:
            kjit._kjit._torch_fastpath(previous)


def test_fast_path_state_is_reported():
    _torch()
    if os.environ.get("KJIT_PY_TORCH_FASTPATH") == "0":
        assert not kjit.torch_fastpath()
        assert "KJIT_PY_TORCH_FASTPATH=0" in kjit.torch_fastpath_error
    elif kjit.torch_fastpath():
        assert kjit.torch_fastpath_error is None
    else:
        assert kjit.torch_fastpath_error  # says why (not built, not importable)
    # Off and on again round-trips; on is refused where the module never registered.
    previous = kjit._kjit._torch_fastpath()
    assert kjit._kjit._torch_fastpath(False) is False
    kjit._kjit._torch_fastpath(previous)
    assert kjit._kjit._torch_fastpath() == previous


def test_torch_custom_ops_gdn_prefill_reach_kjit_with_defaults_left_out():
    # torch 2.11 failed on an optional mutated argument left at its default (IndexError before
    # the op ran); both prefill ops must reach kjit, which refuses these host tensors.
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not hasattr(torch.ops, "kjit") or not hasattr(torch.ops.kjit, "gdn_prefill"):
        pytest.skip("torch.library.custom_op unavailable (torch < 2.4)")
    schema = str(torch.ops.kjit.gdn_prefill_with_checkpoints.default._schema)
    for name in ("state_checkpoints", "checkpoint_cu_starts", "checkpoint_every_n_tokens",
                 "softplus_threshold"):
        assert name in schema
    t, n, h, k = 64, 1, 1, 64
    q = torch.randn(t, h, k, dtype=torch.bfloat16)
    state = torch.zeros(2, h, k, k)
    cu = torch.tensor([0, t], dtype=torch.int32)
    idx = torch.zeros(n, dtype=torch.int32)
    g, beta = torch.zeros(t, h), torch.ones(t, h)
    with pytest.raises(kjit.InvalidArgument, match="CUDA device memory"):
        torch.ops.kjit.gdn_prefill(q, q, q, cu, state, idx, g=g, beta=beta)
    with pytest.raises(kjit.InvalidArgument, match="CUDA device memory"):
        torch.ops.kjit.gdn_prefill_with_checkpoints(
            q, q, q, cu, state, idx, torch.zeros(1, h, k, k), torch.tensor([0, 1]), 64,
            g=g, beta=beta)


def test_plan_call_qk_l2norm_and_its_errors():
    q = np.zeros((64, 16, 128), np.float16)
    k = np.zeros((64, 4, 128), np.float16)
    plan = kjit.plan_call("qk_l2norm", q, k, arch="sm_90")
    assert plan.op == "qk_l2norm" and len(plan.launches) == 1
    assert plan.launches[0].spec.startswith("qk_l2norm:dtype=f16,head_dim=128,")
    alone = kjit.plan_call(kjit.qk_l2norm, q, arch="sm_90")
    assert alone.launches[0].grid[0] < plan.launches[0].grid[0]  # 1024 rows instead of 1280
    assert kjit.plan("qk_l2norm", tokens=64, heads=16, head_dim=128, arch="sm_90").op == "qk_l2norm"
    with pytest.raises(kjit.InvalidArgument, match="D = 100 is not supported"):
        kjit.plan_call("qk_l2norm", np.zeros((4, 2, 100), np.float32), arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="eps"):
        kjit.plan_call("qk_l2norm", q, eps=-1.0, arch="sm_90")
    with pytest.raises(kjit.InvalidArgument, match="eps = 'x' is a str"):
        kjit.plan_call("qk_l2norm", q, eps="x", arch="sm_90")
