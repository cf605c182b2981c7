# SPDX-License-Identifier: Apache-2.0
"""GPU tests of kjit.compat (issue 23): each adapter against the float64 references of
reference.py on fresh random inputs (poisoned outputs, untouched pool slots and masked rows
compared bytewise, shapes where the originals fail), against the original on the same inputs
where its source is importable (KJIT_ANCHORS_DIR: vLLM's / SGLang's / FlashInfer's Triton
kernels and fla-core; see docs/engines.md), and under CUDA graph capture after a first call.
Skipped, with the reason, without torch or a CUDA device; each comparison with an original is
skipped with its reason when that original cannot be imported."""

import importlib
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: GPU tests need it")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import kjit  # noqa: E402
from kjit.compat import UnsupportedFeature, fla, flashinfer, sglang, vllm  # noqa: E402

import reference  # noqa: E402
from test_gpu import TOL, close, close_state, conv_reference, poison, random_lse  # noqa: E402

DEV = "cuda"
ANCHORS = os.environ.get("KJIT_ANCHORS_DIR")
if ANCHORS:
    for path in (ANCHORS, os.path.join(ANCHORS, "compat_site")):
        if path not in sys.path:
            sys.path.insert(0, path)


def original(dotted):
    """The original function `module:name` from the anchors, or a skip saying why not."""
    if not ANCHORS:
        pytest.skip("KJIT_ANCHORS_DIR is not set: no original to compare with")
    module, name = dotted.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as error:  # noqa: BLE001 - any import failure means: cannot compare
        pytest.skip(f"{module} not importable from {ANCHORS}: {error!r}")


def finite_lse(shape):
    return torch.randn(shape, device=DEV) * 4


# --- vLLM merge_attn_states -----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("t,h,d,pad", [(7, 8, 128, 0), (33, 128, 512, 0), (5, 16, 72, 16),
                                       (64, 96, 128, 0)])
def test_vllm_merge_attn_states_against_reference(dtype, t, h, d, pad):
    torch.manual_seed(t * 7 + h + d)
    # prefix/suffix may come with a padded head stride (vLLM's attention backends do that).
    pv = torch.randn(t, h, d + pad, device=DEV).to(dtype)[:, :, :d]
    sv = torch.randn(t, h, d + pad, device=DEV).to(dtype)[:, :, :d]
    pl, sl = random_lse((h, t)), random_lse((h, t))
    out, out_lse = poison((t, h, d), dtype), poison((h, t), torch.float32)
    assert vllm.merge_attn_states(out, pv, pl, sv, sl, out_lse) is None
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([pv, sv], [pl.T, sl.T], math.e)
    close(out, ref_v, TOL[dtype], TOL[dtype])
    close(out_lse.T, ref_s, 1e-5, 1e-5)
    out2 = poison((t, h, d), dtype)
    vllm.merge_attn_states(out2, pv, pl, sv, sl)  # output_lse None: not written
    torch.cuda.synchronize()
    close(out2, ref_v, TOL[dtype], TOL[dtype])


def test_vllm_merge_prefill_tokens_with_context_copies_the_suffix():
    t, h, d, n = 12, 8, 64, 5
    pv, sv = torch.randn(2, t, h, d, device=DEV, dtype=torch.bfloat16)
    pl, sl = finite_lse((h, t)), finite_lse((h, t))
    out, out_lse = poison((t, h, d), torch.bfloat16), poison((h, t), torch.float32)
    vllm.merge_attn_states(out, pv, pl, sv, sl, out_lse, prefill_tokens_with_context=n)
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([pv[:n], sv[:n]], [pl[:, :n].T, sl[:, :n].T], math.e)
    close(out[:n], ref_v, TOL[torch.bfloat16], TOL[torch.bfloat16])
    close(out_lse[:, :n].T, ref_s, 1e-5, 1e-5)
    assert torch.equal(out[n:], sv[n:]) and torch.equal(out_lse[:, n:], sl[:, n:])


def test_vllm_merge_attn_states_against_vllm_triton():
    fn = original("vllm_anchor.merge_attn_states:merge_attn_states")
    for t, h, d, dtype in [(9, 16, 128, torch.bfloat16), (40, 32, 64, torch.float16)]:
        pv, sv = torch.randn(2, t, h, d, device=DEV).to(dtype)
        pl, sl = finite_lse((h, t)), finite_lse((h, t))
        mine, theirs = poison((t, h, d), dtype), poison((t, h, d), dtype)
        mine_lse, theirs_lse = poison((h, t), torch.float32), poison((h, t), torch.float32)
        vllm.merge_attn_states(mine, pv, pl, sv, sl, mine_lse, 6)
        fn(theirs, pv, pl, sv, sl, theirs_lse, 6)
        torch.cuda.synchronize()
        close(mine, theirs, TOL[dtype], TOL[dtype])
        close(mine_lse, theirs_lse, 1e-5, 1e-5)


# --- packed GDN decode (vLLM and SGLang) ----------------------------------------------------


def decode_case(b, h, hv, k, v, slots, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    return dict(mixed_qkv=torch.randn(b, 2 * h * k + hv * v, device=DEV).to(dtype),
                a=torch.randn(b, hv, device=DEV).to(dtype),
                b=torch.randn(b, hv, device=DEV).to(dtype),
                A_log=torch.randn(hv, device=DEV) * 0.5,
                dt_bias=torch.randn(hv, device=DEV).to(dtype),
                scale=k ** -0.5,
                initial_state=torch.randn(slots, hv, v, k, device=DEV) * 0.1,
                out=poison((b, 1, hv, v), dtype))


def decode_reference(args, idx, heads, nonpositive):
    g = -torch.exp(args["A_log"].double()) * reference.softplus(
        args["a"].double() + args["dt_bias"].double(), 20.0)
    beta = torch.sigmoid(args["b"].double())
    return reference.gdn_decode(args["mixed_qkv"], g, beta, args["initial_state"], idx, heads,
                                scale=args["scale"], nonpositive=nonpositive)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("b,h,hv,k,v", [(5, 2, 4, 64, 64), (8, 16, 32, 128, 128),
                                        (2100, 1, 32, 16, 16)])
def test_packed_decode_against_reference(engine, b, h, hv, k, v):
    # (2100, 32): B*HV = 67200 > 65535, the grid vLLM's fix splits and SGLang's copy cannot
    # launch; kjit plans it like any other.
    fn = getattr(kjit.compat, engine).fused_recurrent_gated_delta_rule_packed_decode
    slots = b + 4
    args = decode_case(b, h, hv, k, v, slots, seed=b + k)
    idx = (torch.randperm(slots - 1, device=DEV)[:b] + 1).to(torch.int32)  # valid: 1..slots-1
    idx[0] = 0  # vLLM: the null block (padding); SGLang: a real slot
    if b > 2:
        idx[2] = -1  # padding in both
    pool = args["initial_state"].clone()
    ref_out, ref_pool = decode_reference(dict(args, initial_state=pool), idx.cpu(), h,
                                         nonpositive=engine == "vllm")
    out, state = fn(**args, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    assert out is args["out"] and state is args["initial_state"]
    torch.cuda.synchronize()
    scale = ref_out.abs().max().item() + 1e-6
    close(out[:, 0], ref_out, TOL[torch.bfloat16], TOL[torch.bfloat16] * scale)
    close(state, ref_pool, 1e-4, 1e-4)
    touched = set(idx.tolist()) - ({0, -1} if engine == "vllm" else {-1})
    for slot in range(slots):
        if slot not in touched:  # bytewise: padding rows and unnamed slots untouched
            assert torch.equal(state[slot], pool[slot]), f"slot {slot} changed"
    if engine == "vllm":
        assert torch.count_nonzero(out[0]) == 0  # the null-block row is zeros


@pytest.mark.parametrize("engine,anchor", [
    ("vllm", "vllm_anchor.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode"),
    ("sglang", "sglang_anchor.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode")])
def test_packed_decode_against_the_original(engine, anchor):
    theirs_fn = original(anchor)
    mine_fn = getattr(kjit.compat, engine).fused_recurrent_gated_delta_rule_packed_decode
    b, h, hv, k, v, slots = 16, 4, 8, 128, 128, 24
    args = decode_case(b, h, hv, k, v, slots, seed=3)
    idx = (torch.randperm(slots - 1, device=DEV)[:b] + 1).to(torch.int64)
    idx[1], idx[5] = 0, -1  # 0: vLLM's null block, a real slot for SGLang; -1: padding
    theirs_args = dict(args, initial_state=args["initial_state"].clone(),
                       out=poison((b, 1, hv, v), torch.bfloat16))
    mine_fn(**args, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    theirs_fn(**theirs_args, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    scale = theirs_args["out"].abs().max().item() + 1e-6
    # vLLM's decode test tolerances (bf16 atol 2e-2, rtol 1e-2), the atol relative to |out|.
    close(args["out"], theirs_args["out"], 1e-2, 2e-2 * scale)
    # SGLang rounds beta to b's dtype (bf16) before the update, kjit keeps it in f32: the
    # states differ by that rounding (~2^-9 of the update), vLLM's by f32 rounding only.
    tol = 1e-3 if engine == "vllm" else 1e-2
    state_scale = theirs_args["initial_state"].abs().max().item()
    close(args["initial_state"], theirs_args["initial_state"], tol, tol * state_scale)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_packed_decode_errors_past_the_adapter_are_value_errors(engine):
    # The adapters check only what kjit cannot see; kjit validates the rest and raises
    # kjit.InvalidArgument, a ValueError like the originals' errors, naming the argument.
    fn = getattr(kjit.compat, engine).fused_recurrent_gated_delta_rule_packed_decode
    args = decode_case(3, 2, 4, 64, 64, 6, seed=1)
    idx = torch.tensor([1, 2, 3], device=DEV, dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        fn(**dict(args, a=args["a"][:, :3]), ssm_state_indices=idx)
    assert isinstance(info.value, kjit.InvalidArgument) and " a " in f" {info.value} "
    # vLLM's own large-grid test uses K = V = 1, which kjit's kernels do not take.
    tiny = decode_case(3, 1, 2, 1, 1, 6, seed=1)
    with pytest.raises(kjit.InvalidArgument):
        fn(**tiny, ssm_state_indices=idx)


def sigmoid_gating_args(n, h, hv, kd, slots, packed, seed):
    args = decode_case(n, h, hv, kd, kd, slots, seed=seed)
    parts = torch.split(args["mixed_qkv"], [h * kd, h * kd, hv * kd], dim=-1)
    if not packed:
        parts = [x.clone() for x in parts]  # three separate buffers: the adapter's copy path
    q, k, v = (x.view(1, n, -1, kd) for x in parts)
    call = dict(A_log=args["A_log"], a=args["a"], dt_bias=args["dt_bias"], softplus_beta=1.0,
                softplus_threshold=20.0, q=q, k=k, v=v, b=args["b"],
                initial_state_source=args["initial_state"],
                cu_seqlens=torch.arange(n + 1, device=DEV, dtype=torch.int32),
                use_qk_l2norm_in_kernel=True)
    return args, call


@pytest.mark.parametrize("packed", [True, False])
def test_sglang_sigmoid_gating_decode_against_reference(packed):
    # SGLang's default decode: q, k, v are torch.split views of one projection row, which
    # kjit reads in place (packed=True); separate buffers are concatenated first.
    n, h, hv, kd, slots = 6, 2, 4, 128, 10
    args, call = sigmoid_gating_args(n, h, hv, kd, slots, packed, seed=17)
    idx = torch.randperm(slots, device=DEV)[:n].to(torch.int32)
    idx[2] = -1  # padding: zero output here (SGLang computes a step from zeros), pool untouched
    pool = args["initial_state"].clone()
    ref_out, ref_pool = decode_reference(dict(args, initial_state=pool), idx.cpu(), h,
                                         nonpositive=False)
    o = sglang.fused_sigmoid_gating_delta_rule_update(**call, initial_state_indices=idx)
    torch.cuda.synchronize()
    assert o.shape == (1, n, hv, kd) and o.dtype == torch.bfloat16
    scale = ref_out.abs().max().item() + 1e-6
    close(o[0], ref_out, TOL[torch.bfloat16], TOL[torch.bfloat16] * scale)
    close(args["initial_state"], ref_pool, 1e-4, 1e-4)
    for slot in set(range(slots)) - set(idx.tolist()):
        assert torch.equal(args["initial_state"][slot], pool[slot]), f"slot {slot} changed"


def test_sglang_sigmoid_gating_decode_against_the_original():
    theirs_fn = original("sglang_anchor.fused_sigmoid_gating_recurrent:"
                         "fused_sigmoid_gating_delta_rule_update")
    n, h, hv, kd, slots = 12, 4, 8, 128, 16
    args, call = sigmoid_gating_args(n, h, hv, kd, slots, True, seed=23)
    idx = torch.randperm(slots, device=DEV)[:n].to(torch.int32)
    idx[4] = -1
    theirs_pool = args["initial_state"].clone()
    mine = sglang.fused_sigmoid_gating_delta_rule_update(**call, initial_state_indices=idx)
    theirs = theirs_fn(**dict(call, initial_state_source=theirs_pool),
                       initial_state_indices=idx)
    torch.cuda.synchronize()
    valid = idx.cpu() >= 0  # padding rows differ on purpose: zeros here, a zero-state step there
    scale = theirs.abs().max().item() + 1e-6
    close(mine[0][valid], theirs[0][valid], 1e-2, 2e-2 * scale)
    close(args["initial_state"], theirs_pool, 1e-3, 1e-3)


def test_packed_decode_graph_capture_after_first_call():
    args = decode_case(4, 2, 4, 64, 64, 8, seed=9)
    idx = torch.tensor([3, 0, 5, 1], device=DEV, dtype=torch.int32)
    vllm.fused_recurrent_gated_delta_rule_packed_decode(**args, ssm_state_indices=idx)
    pool = args["initial_state"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        # use_qk_l2norm_in_kernel left at its default (False): the reference below without it.
        vllm.fused_recurrent_gated_delta_rule_packed_decode(**args, ssm_state_indices=idx)
    args["initial_state"].copy_(pool)
    args["out"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    g = -torch.exp(args["A_log"].double()) * reference.softplus(
        args["a"].double() + args["dt_bias"].double(), 20.0)
    ref_out, ref_pool = reference.gdn_decode(args["mixed_qkv"], g,
                                             torch.sigmoid(args["b"].double()), pool,
                                             idx.cpu(), 2, scale=args["scale"], l2norm=False,
                                             nonpositive=True)
    scale = ref_out.abs().max().item() + 1e-6
    close(args["out"][:, 0], ref_out, TOL[torch.bfloat16], TOL[torch.bfloat16] * scale)
    close(args["initial_state"], ref_pool, 1e-4, 1e-4)


# --- SGLang merges --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,h,d", [(6, 8, 128), (17, 128, 128), (3, 128, 512)])
def test_sglang_merges_against_reference(dtype, t, h, d):
    torch.manual_seed(t + h + d)
    va, vb = torch.randn(2, t, h, d, device=DEV).to(dtype)
    sa, sb = random_lse((t, h)), random_lse((t, h))
    # merge_state: FlashInfer's kernel in sgl_kernel, base 2; merge_state_v2: base e.
    for fn, base in ((sglang.merge_state, 2.0), (sglang.merge_state_v2, math.e),
                     (sglang.merge_state_triton, math.e)):
        v_out, s_out = poison((t, h, d), dtype), poison((t, h), torch.float32)
        got = fn(va, sa, vb, sb, v_out, s_out)
        assert got[0] is v_out and got[1] is s_out
        torch.cuda.synchronize()
        ref_v, ref_s = reference.merge([va, vb], [sa, sb], base)
        close(v_out, ref_v, TOL[dtype], TOL[dtype])
        close(s_out, ref_s, 1e-5, 1e-5)
    v, s = sglang.merge_state_v2(va, sa.half(), vb, sb.half())  # LSE converted like sgl_kernel
    assert v.shape == va.shape and s.dtype == torch.float32


def test_sglang_merge_state_triton_against_sglang_triton():
    fn = original("sglang_anchor.merge_state:merge_state")
    t, h, d = 11, 16, 96
    va, vb = torch.randn(2, t, h, d, device=DEV, dtype=torch.bfloat16)
    sa, sb = finite_lse((t, h)), finite_lse((t, h))
    mine = sglang.merge_state_triton(va, sa, vb, sb)
    theirs = fn(va, sa, vb, sb)
    torch.cuda.synchronize()
    close(mine[0], theirs[0], TOL[torch.bfloat16], TOL[torch.bfloat16])
    close(mine[1], theirs[1], 1e-5, 1e-5)


# --- FlashInfer merges ----------------------------------------------------------------------


@pytest.mark.parametrize("t,h,d", [(5, 8, 64), (9, 128, 128), (4, 128, 512), (3, 200, 256)])
def test_flashinfer_merges_against_reference(t, h, d):
    # 128 heads x head_dim 128 in bf16 is 2048 threads per block in FlashInfer's kernel.
    torch.manual_seed(t * h + d)
    dtype = torch.bfloat16
    va, vb = torch.randn(2, t, h, d, device=DEV).to(dtype)
    sa, sb = random_lse((t, h)), random_lse((t, h))
    v, s = flashinfer.merge_state(va, sa, vb, sb)
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([va, vb], [sa, sb], 2.0)
    close(v, ref_v, TOL[dtype], TOL[dtype])
    close(s, ref_s, 1e-5, 1e-5)

    mask = torch.rand(t, device=DEV) < 0.5
    mask[0], mask[-1] = True, False
    v_in, s_in = va.clone(), sa.clone()
    assert flashinfer.merge_state_in_place(v_in, s_in, vb, sb, mask) is None
    torch.cuda.synchronize()
    keep = ~mask
    assert torch.equal(v_in[keep], va[keep]) and torch.equal(s_in[keep], sa[keep])
    close(v_in[mask], ref_v[mask], TOL[dtype], TOL[dtype])
    close(s_in[mask], ref_s[mask], 1e-5, 1e-5)

    states = 3
    vs = torch.randn(t, states, h, d, device=DEV).to(dtype)
    ss = random_lse((t, states, h))
    v3, s3 = flashinfer.merge_states(vs, ss)
    torch.cuda.synchronize()
    ref_v3, ref_s3 = reference.merge(list(vs.unbind(1)), list(ss.unbind(1)), 2.0)
    close(v3, ref_v3, TOL[dtype], TOL[dtype])
    close(s3, ref_s3, 1e-5, 1e-5)


def test_flashinfer_merges_against_flashinfer_triton():
    fi_merge = original("flashinfer_anchor.cascade:merge_state")
    fi_states = original("flashinfer_anchor.cascade:merge_states")
    t, h, d = 6, 8, 128
    va, vb = torch.randn(2, t, h, d, device=DEV, dtype=torch.float16)
    sa, sb = finite_lse((t, h)), finite_lse((t, h))
    mine, theirs = flashinfer.merge_state(va, sa, vb, sb), fi_merge(va, sa, vb, sb)
    vs = torch.randn(t, 4, h, d, device=DEV, dtype=torch.float16)
    ss = finite_lse((t, 4, h))
    mine3, theirs3 = flashinfer.merge_states(vs, ss), fi_states(vs, ss)
    torch.cuda.synchronize()
    for a, b in ((mine, theirs), (mine3, theirs3)):
        close(a[0], b[0], TOL[torch.float16], TOL[torch.float16])
        close(a[1], b[1], 1e-5, 1e-5)


def test_merge_adapters_under_graph_capture():
    t, h, d = 8, 128, 128
    va, vb = torch.randn(2, t, h, d, device=DEV, dtype=torch.bfloat16)
    sa, sb = finite_lse((t, h)), finite_lse((t, h))
    out = torch.empty_like(va)
    out_lse = torch.empty(h, t, device=DEV)
    v2, s2 = torch.empty_like(va), torch.empty(t, h, device=DEV)
    v_ip, s_ip = va.clone(), sa.clone()
    calls = [lambda: vllm.merge_attn_states(out, va, sa.T.contiguous(), vb, sb.T.contiguous(),
                                            out_lse),
             lambda: sglang.merge_state_v2(va, sa, vb, sb, v2, s2),
             lambda: flashinfer.merge_state_in_place(v_ip, s_ip, vb, sb)]
    for call in calls:
        call()  # first call: plans and loads the kernel (capture must not compile)
    v_ip.copy_(va)
    s_ip.copy_(sa)
    lse_t, lse_s = sa.T.contiguous(), sb.T.contiguous()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        vllm.merge_attn_states(out, va, lse_t, vb, lse_s, out_lse)
        sglang.merge_state_v2(va, sa, vb, sb, v2, s2)
        flashinfer.merge_state_in_place(v_ip, s_ip, vb, sb)
    for x in (out, out_lse, v2, s2):
        x.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref_e = reference.merge([va, vb], [sa, sb], math.e)
    ref_2 = reference.merge([va, vb], [sa, sb], 2.0)
    tol = TOL[torch.bfloat16]
    close(out, ref_e[0], tol, tol)
    close(out_lse.T, ref_e[1], 1e-5, 1e-5)
    close(v2, ref_e[0], tol, tol)
    close(v_ip, ref_2[0], tol, tol)
    close(s_ip, ref_2[1], 1e-5, 1e-5)


# --- fla ------------------------------------------------------------------------------------


def fla_case(b, t, h, hv, kv, seed, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    return dict(q=torch.randn(b, t, h, kv, device=DEV, dtype=dtype),
                k=torch.randn(b, t, h, kv, device=DEV, dtype=dtype),
                v=torch.randn(b, t, hv, kv, device=DEV, dtype=dtype),
                g=-torch.rand(b, t, hv, device=DEV) * 0.3,
                beta=torch.rand(b, t, hv, device=DEV))


def fla_reference(case, cu, h0_kmajor, l2norm=True, scale=None):
    """(o [T_all, HV, V], final [N, HV, K, V]) in float64, K-major like fla."""
    q, k, v = (case[n].flatten(0, 1) for n in ("q", "k", "v"))
    g, beta = case["g"].flatten(0, 1), case["beta"].flatten(0, 1)
    n, hv, kv = len(cu) - 1, v.shape[1], v.shape[2]
    pool = (h0_kmajor.transpose(-1, -2).double() if h0_kmajor is not None
            else torch.zeros(n, hv, kv, kv, dtype=torch.float64, device=DEV))
    out, _, finals = reference.gdn_prefill(q, k, v, g, beta, cu, pool, list(range(n)),
                                           scale=0.0 if scale is None else scale,
                                           l2norm=l2norm)
    return out, finals.transpose(-1, -2)


@pytest.mark.parametrize("fn", [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize("state_dtype", [None, torch.float32, torch.bfloat16])
def test_fla_equal_length_batches_against_reference(fn, state_dtype):
    b, t, h, hv, kv = 2, 70, 2, 4, 64
    case = fla_case(b, t, h, hv, kv, seed=11)
    h0 = None if state_dtype is None else (
        torch.randn(b, hv, kv, kv, device=DEV) * 0.1).to(state_dtype)
    before = None if h0 is None else h0.clone()
    with torch.no_grad():
        o, ht = fn(**case, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert o.shape == (b, t, hv, kv) and ht.shape == (b, hv, kv, kv)
    assert ht.dtype == torch.float32 and ht.is_contiguous()
    if h0 is not None:
        assert torch.equal(h0, before)  # fla never writes into initial_state
    cu = [i * t for i in range(b + 1)]
    ref_o, ref_ht = fla_reference(case, cu, h0)
    scale = ref_o.abs().max().item() + 1e-6
    close(o.flatten(0, 1), ref_o, 2e-2, 2e-2 * scale)
    close_state(ht, ref_ht)


@pytest.mark.parametrize("v_first", [False, True])
def test_fla_chunk_varlen_against_reference(v_first):
    lens, h, hv, kv = [5, 64, 130], 2, 4, 128
    case = fla_case(1, sum(lens), h, hv, kv, seed=4)
    cu_list = [0, 5, 69, 199]
    cu = torch.tensor(cu_list, device=DEV, dtype=torch.int64)
    h0 = torch.randn(3, hv, kv, kv, device=DEV) * 0.1  # K-major [N, HV, K, V]
    given = h0.transpose(-1, -2).contiguous() if v_first else h0
    before = given.clone()
    with torch.inference_mode():
        o, ht = fla.chunk_gated_delta_rule(**case, initial_state=given, output_final_state=True,
                                           cu_seqlens=cu, state_v_first=v_first,
                                           use_qk_l2norm_in_kernel=True, scale=0.1)
    torch.cuda.synchronize()
    assert torch.equal(given, before)
    ref_o, ref_ht = fla_reference(case, cu_list, h0, scale=0.1)
    scale = ref_o.abs().max().item() + 1e-6
    close(o[0], ref_o, 2e-2, 2e-2 * scale)
    close_state(ht.transpose(-1, -2) if v_first else ht, ref_ht)


@pytest.mark.parametrize("fn", [fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule])
def test_fla_k_major_states_reach_the_kernel_without_a_copy(fn, monkeypatch):
    """fla's [N, HV, K, V] float32 states go to kjit as transposed views (state_layout=kv
    kernels): the pool kjit reads is the caller's initial_state, and the tensor returned is the
    one kjit wrote the final states into."""
    b, t, h, hv, kv = 3, 70, 2, 4, 64
    case = fla_case(b, t, h, hv, kv, seed=13)
    h0 = torch.randn(b, hv, kv, kv, device=DEV) * 0.1  # K-major, contiguous
    before = h0.clone()
    calls = []
    real = fla._api.gdn_prefill

    def spy(q, k, v, cu_seqlens, state, state_indices, **options):
        calls.append((state, options.get("final_state")))
        return real(q, k, v, cu_seqlens, state, state_indices, **options)

    monkeypatch.setattr(fla._api, "gdn_prefill", spy)
    with torch.no_grad():
        o, ht = fn(**case, initial_state=h0, output_final_state=True,
                   use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    (pool, final), = calls
    assert pool.data_ptr() == h0.data_ptr()  # read in place
    assert pool.stride() == (hv * kv * kv, kv * kv, 1, kv)  # [N, HV, V, K] view, V contiguous
    assert final.data_ptr() == ht.data_ptr() and final.stride() == pool.stride()
    assert ht.shape == (b, hv, kv, kv) and ht.is_contiguous() and ht.dtype == torch.float32
    assert torch.equal(h0, before)
    ref_o, ref_ht = fla_reference(case, [i * t for i in range(b + 1)], h0)
    scale = ref_o.abs().max().item() + 1e-6
    close(o.flatten(0, 1), ref_o, 2e-2, 2e-2 * scale)
    close_state(ht, ref_ht)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_gdn_prefill_writes_a_k_major_pool_in_place(state_dtype):
    """kjit.gdn_prefill on a [slots, HV, K, V] pool passed as its transpose: the final states
    land in the caller's tensor (K-major), untouched slots stay bit-identical, checkpoints come
    back in the pool's layout."""
    lens, h, hv, kd, vd = [5, 130, 64], 2, 4, 128, 64
    tokens, n = sum(lens), len(lens)
    torch.manual_seed(17)
    q = torch.randn(tokens, h, kd, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(tokens, h, kd, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(tokens, hv, vd, device=DEV, dtype=torch.bfloat16)
    g = -torch.rand(tokens, hv, device=DEV) * 0.3
    beta = torch.rand(tokens, hv, device=DEV)
    cu_list = [0, 5, 135, 199]
    cu = torch.tensor(cu_list, device=DEV, dtype=torch.int32)
    buffer = (torch.randn(n + 3, hv, kd, vd, device=DEV) * 0.1).to(state_dtype)  # [.., K, V]
    pool = buffer.transpose(-1, -2)  # [slots, HV, V, K], V contiguous
    indices = torch.tensor([4, -1, 1], device=DEV, dtype=torch.int32)  # padding in the middle
    before = buffer.clone()
    out, checkpoints = kjit.gdn_prefill(q, k, v, cu, pool, indices, g=g, beta=beta,
                                        checkpoint_every_n_tokens=64)
    torch.cuda.synchronize()
    assert checkpoints.stride()[2] == 1 and checkpoints.stride()[3] == vd
    ckpts = []
    ref_out, ref_pool, _ = reference.gdn_prefill(q, k, v, g, beta, cu_list,
                                                 before.transpose(-1, -2), indices.tolist(),
                                                 checkpoints=(64, ckpts))
    scale = ref_out.abs().max().item() + 1e-6
    close(out, ref_out, 2e-2, 2e-2 * scale)
    for slot in (4, 1):
        close_state(pool[slot], ref_pool[slot])
    for slot in (0, 2, 3, 5):
        assert torch.equal(buffer[slot], before[slot])  # bytewise: untouched
    assert checkpoints.shape[0] == len(ckpts)
    for row, want in enumerate(ckpts):
        close_state(checkpoints[row], want)


def test_gdn_decode_updates_a_k_major_pool_in_place():
    """kjit.gdn_decode on fla's layout ([slots, HV, K, V] passed as its transpose): the step
    reads and writes the caller's tensor; padding rows leave their slots bit-identical."""
    b, h, hv, kd, vd = 6, 2, 4, 128, 128
    torch.manual_seed(5)
    qkv = torch.randn(b, 2 * h * kd + hv * vd, device=DEV, dtype=torch.bfloat16)
    a = torch.randn(b, hv, device=DEV, dtype=torch.bfloat16)
    bb = torch.randn(b, hv, device=DEV, dtype=torch.bfloat16)
    a_log = torch.randn(hv, device=DEV) * 0.5
    dt_bias = torch.randn(hv, device=DEV) * 0.5
    buffer = torch.randn(b + 2, hv, kd, vd, device=DEV) * 0.1
    pool = buffer.transpose(-1, -2)
    indices = torch.tensor([3, -1, 0, 7, -1, 5], device=DEV, dtype=torch.int32)
    before = buffer.clone()
    out = kjit.gdn_decode(qkv, a, bb, a_log, dt_bias, pool, indices)
    torch.cuda.synchronize()
    g = -torch.exp(a_log.double()) * reference.softplus(a.double() + dt_bias.double(), 20.0)
    ref_out, ref_pool = reference.gdn_decode(qkv, g, torch.sigmoid(bb.double()),
                                             before.transpose(-1, -2), indices.tolist(), h)
    scale = ref_out.abs().max().item() + 1e-6
    close(out, ref_out, TOL[torch.bfloat16], TOL[torch.bfloat16] * scale)
    for slot in (3, 0, 7, 5):
        close(pool[slot], ref_pool[slot], 1e-4, 1e-4)
    for slot in (1, 2, 4, 6):
        assert torch.equal(buffer[slot], before[slot])


def test_fla_gate_and_beta_in_kernel_and_no_final_state():
    b, t, h, hv, kv = 1, 40, 1, 2, 64
    case = fla_case(b, t, h, hv, kv, seed=8)
    raw_g, raw_beta = torch.randn(b, t, hv, device=DEV), torch.randn(b, t, hv, device=DEV)
    a_log, dt_bias = torch.randn(hv, device=DEV) * 0.5, torch.randn(hv, device=DEV)
    with torch.no_grad():
        o, ht = fla.fused_recurrent_gated_delta_rule(
            case["q"], case["k"], case["v"], g=raw_g, beta=raw_beta, use_gate_in_kernel=True,
            A_log=a_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
            use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    assert ht is None
    g = -torch.exp(a_log.double()) * reference.softplus(raw_g.double() + dt_bias.double(), 20.0)
    ref_o, _ = fla_reference(dict(case, g=g, beta=torch.sigmoid(raw_beta.double())), [0, t],
                             None)
    scale = ref_o.abs().max().item() + 1e-6
    close(o.flatten(0, 1), ref_o, 2e-2, 2e-2 * scale)


def test_fla_refuses_autograd_and_runs_under_no_grad():
    case = fla_case(1, 8, 1, 1, 64, seed=2)
    q = case.pop("q").requires_grad_()
    for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        with pytest.raises(UnsupportedFeature, match="autograd"):
            fn(q, **case)
        with torch.no_grad():
            o, _ = fn(q, **case)
        assert o.shape == (1, 8, 1, 64) and not o.requires_grad


@pytest.mark.parametrize("name", ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"])
def test_fla_against_fla(name):
    theirs = original(f"fla.ops.gated_delta_rule:{name}")
    mine = getattr(fla, name)
    lens, h, hv, kv = [33, 100], 2, 4, 128
    case = fla_case(1, sum(lens), h, hv, kv, seed=21)
    cu = torch.tensor([0, 33, 133], device=DEV, dtype=torch.int64)
    h0 = torch.randn(2, hv, kv, kv, device=DEV) * 0.1
    with torch.no_grad():
        o1, s1 = mine(**case, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                      use_qk_l2norm_in_kernel=True)
        o2, s2 = theirs(**case, initial_state=h0.clone(), output_final_state=True,
                        cu_seqlens=cu, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    scale = o2.abs().max().item() + 1e-6
    close(o1, o2, 2e-2, 2e-2 * scale)
    close_state(s1, s2.float())


def test_fla_chunk_under_graph_capture():
    case = fla_case(1, 64, 2, 2, 64, seed=6)
    h0 = torch.randn(1, 2, 64, 64, device=DEV) * 0.1
    # (L2-normalized q/k: with raw random k the delta rule's state grows by ~|k|^2 per token.)
    kw = dict(initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    with torch.no_grad():
        fla.chunk_gated_delta_rule(**case, **kw)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, ht = fla.chunk_gated_delta_rule(**case, **kw)
        graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_ht = fla_reference(case, [0, 64], h0)
    scale = ref_o.abs().max().item() + 1e-6
    close(o.flatten(0, 1), ref_o, 2e-2, 2e-2 * scale)
    close_state(ht, ref_ht)


# --- vLLM causal_conv1d_fn / causal_conv1d_update ---------------------------------------------


def dirty_allocator(shape, dtype):
    """Leaves a NaN-filled block of this size in torch's caching allocator, so that an output
    the adapter allocates with torch.empty_like most likely starts as NaN (a row it forgets to
    write then fails the comparison instead of passing on stale zeros)."""
    block = poison(shape, dtype)
    del block


def conv_case(d, w, lengths, slots, cols, dtype, state_dtype, seed):
    """vLLM's prefill layouts on fresh random data: x = mixed_qkv.transpose(0, 1) [D, T], the
    pool [slots, cols, D] seen as [slots, D, cols], weight [D, W] (conv1d.weight squeezed)."""
    torch.manual_seed(seed)
    t = sum(lengths)
    mixed = torch.randn(t, d, device=DEV).to(dtype)
    pool = torch.randn(slots, cols, d, device=DEV).to(state_dtype).transpose(1, 2)
    weight = (torch.randn(d, w, device=DEV) * 0.5).to(dtype)
    bias = torch.randn(d, device=DEV).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=DEV)
    return mixed.transpose(0, 1), weight, bias, pool, cu


@pytest.mark.parametrize("dtype,state_dtype", [(torch.bfloat16, torch.bfloat16),
                                               (torch.float16, torch.float16),
                                               (torch.float32, torch.float32),
                                               (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("d,lengths", [(256, [1, 2, 3, 4, 0, 300, 37]),
                                       (8192, [17, 1, 64])])  # 8192: Qwen3-Next's conv_dim, TP1
def test_vllm_causal_conv1d_fn_against_reference(dtype, state_dtype, d, lengths):
    w, n = 4, len(lengths)
    slots = n + 3
    x, weight, bias, pool, cu = conv_case(d, w, lengths, slots, w - 1, dtype, state_dtype,
                                          seed=d + n)
    idx = (torch.randperm(slots - 1, device=DEV)[:n] + 1).to(torch.int32)
    idx[1] = -1  # PAD_SLOT_ID: zero rows here, the pool untouched
    if n > 3:
        idx[3] = 0  # slot 0 is a real slot for vLLM's conv (only -1 is padding)
    has = torch.rand(n, device=DEV) < 0.6
    before, x_before = pool.clone(), x.clone()
    dirty_allocator((x.shape[1], d), dtype)
    out = vllm.causal_conv1d_fn(x, weight, bias, pool, cu, cache_indices=idx,
                                has_initial_state=has, activation="silu")
    torch.cuda.synchronize()
    assert out.shape == x.shape and out.stride() == x.stride() and out.dtype == dtype
    assert torch.equal(x, x_before)  # vLLM returns a new tensor; x is not written
    rows, expected = out.transpose(0, 1), before.clone()
    for i in range(n):
        a, b, slot = int(cu[i]), int(cu[i + 1]), int(idx[i])
        if slot == -1:
            assert torch.count_nonzero(rows[a:b]) == 0
            continue
        hist = before[slot] if bool(has[i]) else torch.zeros_like(before[slot])
        xs = x.transpose(0, 1)[a:b].to(state_dtype)  # vLLM converts x to the pool's dtype
        if b > a:
            want = conv_reference(xs, weight, bias, hist, True)
            tol = TOL[dtype] if dtype != torch.float32 else 1e-4
            close(rows[a:b], want, tol, tol)
            expected[slot] = torch.cat([hist, xs.T], dim=1)[:, -(w - 1):]
    assert torch.equal(pool, expected)  # inputs copied into the pool, untouched slots bytewise


def test_vllm_causal_conv1d_fn_on_a_column_slice_keeps_vllms_output_layout():
    # Qwen3.5's mixed_qkv is the first columns of the qkvz projection ([T, qkv + z] rows):
    # x = mixed_qkv.T is then not dense. vLLM's output is torch.empty_like(x), whose layout
    # depends on torch's version (torch 2.11 keeps x's stride order: a dense [T, D] seen as
    # [D, T]); kjit reads x in place and writes whatever layout that gives, like vLLM.
    d, z, w, lengths = 128, 64, 4, [3, 9, 1]
    torch.manual_seed(12)
    t, n = sum(lengths), len(lengths)
    wide = torch.randn(t, d + z, device=DEV).to(torch.bfloat16)
    x = wide[:, :d].transpose(0, 1)
    _, weight, bias, pool, cu = conv_case(d, w, lengths, n + 1, w - 1, torch.bfloat16,
                                          torch.bfloat16, seed=13)
    idx = torch.tensor([2, 0, 3], device=DEV, dtype=torch.int32)
    has = torch.tensor([True, False, True], device=DEV)
    before, wide_before = pool.clone(), wide.clone()
    dirty_allocator((d, t), torch.bfloat16)
    out = vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx, has, activation=None)
    torch.cuda.synchronize()
    assert out.stride() == torch.empty_like(x).stride()
    assert torch.equal(wide, wide_before)
    for i in range(n):
        a, b, slot = int(cu[i]), int(cu[i + 1]), int(idx[i])
        hist = before[slot] if bool(has[i]) else torch.zeros_like(before[slot])
        want = conv_reference(x.transpose(0, 1)[a:b], weight, bias, hist, False)
        close(out.transpose(0, 1)[a:b], want, TOL[torch.bfloat16], TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seqlen,spec", [(None, False), (1, False), (4, False), (1, True),
                                         (4, True)])
def test_vllm_causal_conv1d_update_against_reference(dtype, seqlen, spec):
    # seqlen None: x [batch, dim] (vLLM's decode); else [batch, dim, seqlen] over token-major
    # rows; spec: num_accepted_tokens with vLLM's pool of width - 2 + seqlen columns.
    b, d, w = 37, 512, 4
    s = seqlen or 1
    cols = w - 2 + s if spec else w - 1
    slots = b + 5
    _, weight, bias, pool, _ = conv_case(d, w, [1], slots, cols, dtype, dtype, seed=b + s)
    if seqlen is None:
        x = torch.randn(b, d, device=DEV).to(dtype)
    else:
        x = torch.randn(b, s, d, device=DEV).to(dtype).transpose(1, 2)
    idx = torch.randperm(slots, device=DEV)[:b].to(torch.int32)
    idx[4] = -1
    accepted = (torch.randint(1, s + 1, (b,), device=DEV, dtype=torch.int32) if spec else None)
    before = pool.clone()
    dirty_allocator(tuple(x.shape), dtype)
    out = vllm.causal_conv1d_update(x, pool, weight, bias, "silu", idx,
                                    num_accepted_tokens=accepted)
    torch.cuda.synchronize()
    assert out.shape == x.shape and out.dtype == dtype
    x3 = x[:, :, None] if seqlen is None else x  # [B, D, S]
    o3 = out[:, :, None] if seqlen is None else out
    expected = before.clone()
    tol = TOL[dtype] if dtype != torch.float32 else 1e-4
    for r in range(b):
        slot = int(idx[r])
        if slot == -1:
            assert torch.count_nonzero(o3[r]) == 0
            continue
        first = 0 if accepted is None else int(accepted[r]) - 1
        hist = before[slot][:, first:first + w - 1]
        close(o3[r].T, conv_reference(x3[r].T, weight, bias, hist, True), tol, tol)
        seq = torch.cat([hist, x3[r]], dim=1)
        if spec:
            expected[slot][:, :w - 2 + s] = seq[:, 1:w - 1 + s]
        else:
            expected[slot] = seq[:, -(w - 1):]
    assert torch.equal(pool, expected)


def test_vllm_causal_conv1d_against_vllm_triton():
    fn = original("vllm_anchor.causal_conv1d:causal_conv1d_fn")
    update = original("vllm_anchor.causal_conv1d:causal_conv1d_update")
    d, w, lengths = 1024, 4, [5, 1, 130, 2, 64]
    n, slots = len(lengths), 9
    x, weight, bias, pool, cu = conv_case(d, w, lengths, slots, w - 1, torch.bfloat16,
                                          torch.bfloat16, seed=5)
    idx = torch.tensor([3, -1, 7, 0, 5], device=DEV, dtype=torch.int32)
    has = torch.tensor([True, True, False, True, False], device=DEV)
    theirs_pool = pool.clone()
    mine = vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx, has, "silu")
    theirs = fn(x, weight, bias, theirs_pool, cu, idx, has, "silu")
    torch.cuda.synchronize()
    keep = torch.ones(x.shape[1], dtype=torch.bool, device=DEV)
    keep[int(cu[1]):int(cu[2])] = False  # the padding row: zeros here, unwritten there
    tol = TOL[torch.bfloat16]
    close(mine[:, keep], theirs[:, keep], tol, tol)
    assert torch.equal(pool, theirs_pool)  # both copy the same inputs into the pool
    # decode, then a speculative step on a wider pool
    xd = torch.randn(n, d, device=DEV).to(torch.bfloat16)
    mine_d = vllm.causal_conv1d_update(xd, pool, weight, bias, "silu", idx)
    theirs_d = update(xd, theirs_pool, weight, bias, "silu", idx)
    torch.cuda.synchronize()
    valid = idx != -1
    close(mine_d[valid], theirs_d[valid], tol, tol)
    assert torch.equal(pool, theirs_pool)
    s = 3
    _, _, _, spool, _ = conv_case(d, w, [1], slots, w - 2 + s, torch.bfloat16, torch.bfloat16,
                                  seed=6)
    theirs_spool = spool.clone()
    xs = torch.randn(n, s, d, device=DEV).to(torch.bfloat16).transpose(1, 2)
    accepted = torch.tensor([1, 3, 2, 1, 3], device=DEV, dtype=torch.int32)
    mine_s = vllm.causal_conv1d_update(xs, spool, weight, bias, True, idx,
                                       num_accepted_tokens=accepted)
    theirs_s = update(xs, theirs_spool, weight, bias, True, idx, num_accepted_tokens=accepted)
    torch.cuda.synchronize()
    close(mine_s[valid], theirs_s[valid], tol, tol)
    assert torch.equal(spool, theirs_spool)


def varlen_case(d, w, lengths, slots, spec, dtype, seed):
    """vLLM's varlen speculative step: x [num_tokens, dim] (mixed_qkv_spec), query_start_loc
    [batch + 1] over `lengths` plus two trailing padded tokens, the pool [slots, cols, D] seen
    as [slots, D, cols] with cols = width - 2 + max(lengths) when speculative."""
    torch.manual_seed(seed)
    most = max(lengths)
    cols = w - 2 + most if spec else w - 1
    _, weight, bias, pool, _ = conv_case(d, w, [1], slots, cols, dtype, dtype, seed=seed)
    qsl = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                       device=DEV)
    x = torch.randn(int(qsl[-1]) + 2, d, device=DEV).to(dtype)
    return x, weight, bias, pool, qsl, cols


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("spec", [True, False])
def test_vllm_causal_conv1d_update_varlen_against_reference(dtype, spec):
    # Rows of 0..8 tokens (row 1 empty, row 4 padding), num_accepted_tokens per row.
    d, w = 512, 4
    lengths = [3, 0, 8, 1, 5, 2, 0, 4, 7, 6, 1]
    b, slots = len(lengths), len(lengths) + 4
    x, weight, bias, pool, qsl, cols = varlen_case(d, w, lengths, slots, spec, dtype, seed=7)
    idx = (torch.randperm(slots - 1, device=DEV)[:b] + 1).to(torch.int32)
    idx[4] = -1
    accepted = (torch.randint(1, cols - w + 3, (b,), device=DEV, dtype=torch.int32)
                if spec else None)
    before = pool.clone()
    dirty_allocator(tuple(x.shape), dtype)
    out = vllm.causal_conv1d_update(x, pool, weight, bias, "silu", idx,
                                    num_accepted_tokens=accepted, query_start_loc=qsl,
                                    max_query_len=max(lengths))
    torch.cuda.synchronize()
    assert out.shape == x.shape and out.dtype == dtype
    expected = before.clone()
    tol = TOL[dtype] if dtype != torch.float32 else 1e-4
    for r in range(b):
        a0, a1, slot = int(qsl[r]), int(qsl[r + 1]), int(idx[r])
        if a1 == a0:
            continue  # no output, slot untouched
        if slot == -1:
            assert torch.count_nonzero(out[a0:a1]) == 0
            continue
        first = 0 if accepted is None else int(accepted[r]) - 1
        hist = before[slot][:, first:first + w - 1]
        close(out[a0:a1], conv_reference(x[a0:a1], weight, bias, hist, True), tol, tol)
        seq = torch.cat([hist, x[a0:a1].T], dim=1)
        if spec:
            expected[slot][:, :w - 2 + a1 - a0] = seq[:, 1:w - 1 + a1 - a0]
        else:
            expected[slot][:, :w - 1] = seq[:, -(w - 1):]
    assert torch.equal(pool, expected)  # untouched slots and columns bytewise


def test_vllm_causal_conv1d_update_varlen_against_vllm_triton():
    # How vLLM's GDN layers call it for speculative decoding: num_accepted_tokens,
    # query_start_loc and max_query_len, pad_slot_id -1.
    update = original("vllm_anchor.causal_conv1d:causal_conv1d_update")
    d, w = 1024, 4
    lengths = [4, 1, 0, 3, 4, 2, 4]
    b, slots = len(lengths), len(lengths) + 3
    x, weight, bias, pool, qsl, cols = varlen_case(d, w, lengths, slots, True, torch.bfloat16,
                                                   seed=9)
    idx = torch.tensor([3, -1, 5, 0, 8, 1, 6], device=DEV, dtype=torch.int32)
    accepted = torch.tensor([1, 2, 3, 1, 4, 2, 3], device=DEV, dtype=torch.int32)
    theirs_pool = pool.clone()
    mine = vllm.causal_conv1d_update(x, pool, weight, bias, "silu", idx,
                                     num_accepted_tokens=accepted, query_start_loc=qsl,
                                     max_query_len=max(lengths))
    theirs = update(x, theirs_pool, weight, bias, "silu", idx, num_accepted_tokens=accepted,
                    query_start_loc=qsl, max_query_len=max(lengths))
    torch.cuda.synchronize()
    keep = torch.zeros(x.shape[0], dtype=torch.bool, device=DEV)
    for r in range(b):
        if int(idx[r]) != -1:  # padding rows: zeros here, unwritten there
            keep[int(qsl[r]):int(qsl[r + 1])] = True
    tol = TOL[torch.bfloat16]
    close(mine[keep], theirs[keep], tol, tol)
    assert torch.equal(pool, theirs_pool)  # the same columns rolled into the pool
    # Rows of max_query_len each, without num_accepted_tokens: equal there too.
    full = [3] * b
    x2, _, _, pool2, qsl2, _ = varlen_case(d, w, full, slots, False, torch.bfloat16, seed=10)
    theirs_pool2 = pool2.clone()
    mine2 = vllm.causal_conv1d_update(x2, pool2, weight, bias, "silu", idx, query_start_loc=qsl2,
                                      max_query_len=3)
    theirs2 = update(x2, theirs_pool2, weight, bias, "silu", idx, query_start_loc=qsl2,
                     max_query_len=3)
    torch.cuda.synchronize()
    rows = torch.repeat_interleave(idx != -1, 3)
    close(mine2[:rows.numel()][rows], theirs2[:rows.numel()][rows], tol, tol)
    assert torch.equal(pool2, theirs_pool2)


def test_vllm_causal_conv1d_errors_past_the_adapter_are_kjit_errors():
    # What vLLM's Python does not check reaches kjit, which names the argument (ValueError).
    x, weight, bias, pool, cu = conv_case(64, 4, [3, 2], 4, 3, torch.bfloat16,
                                          torch.bfloat16, seed=1)
    idx = torch.tensor([1, 2], device=DEV, dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        vllm.causal_conv1d_fn(x, weight[:, :1].contiguous(), bias, pool, cu, idx)
    assert isinstance(info.value, kjit.InvalidArgument) and "weight" in str(info.value)
    with pytest.raises(kjit.InvalidArgument, match="state_indices"):
        vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx[:1])
    with pytest.raises(kjit.InvalidArgument, match="query_start_loc has shape"):
        vllm.causal_conv1d_update(x.T.contiguous(), pool, weight, bias, "silu", idx,
                                  query_start_loc=cu[:2], max_query_len=3)


# --- every adapter under CUDA graph capture -------------------------------------------------


def _capture_cases():
    """name -> make(); make() returns (call, state) where call() runs the adapter and returns
    its result tensors, and state lists the tensors a call updates in place (restored before
    each run so that the eager and the replayed call start from the same values)."""
    t, h, d = 8, 128, 128  # 128 heads x 128: past FlashInfer's 1024 threads per block
    bf16 = torch.bfloat16

    def merge_inputs(head_major=False):
        va, vb = torch.randn(2, t, h, d, device=DEV, dtype=bf16)
        shape = (h, t) if head_major else (t, h)
        return va, finite_lse(shape), vb, finite_lse(shape)

    def vllm_merge():
        va, sa, vb, sb = merge_inputs(head_major=True)
        out, out_lse = torch.empty_like(va), torch.empty_like(sa)

        def call():
            vllm.merge_attn_states(out, va, sa, vb, sb, out_lse, 5)
            return out, out_lse
        return call, []

    def sglang_merge(fn):
        def make():
            va, sa, vb, sb = merge_inputs()
            vo, so = torch.empty_like(va), torch.empty_like(sa)
            return (lambda: fn(va, sa, vb, sb, vo, so)), []
        return make

    def fi_merge():
        va, sa, vb, sb = merge_inputs()
        return (lambda: flashinfer.merge_state(va, sa, vb, sb)), []

    def fi_in_place():
        va, sa, vb, sb = merge_inputs()
        mask = torch.arange(t, device=DEV) % 3 != 0

        def call():
            flashinfer.merge_state_in_place(va, sa, vb, sb, mask)
            return va, sa
        return call, [va, sa]

    def fi_states():
        vs = torch.randn(t, 3, h, d, device=DEV, dtype=bf16)
        ss = finite_lse((t, 3, h))
        return (lambda: flashinfer.merge_states(vs, ss)), []

    def decode(engine):
        def make():
            args = decode_case(6, 2, 4, 128, 128, 10, seed=5)
            idx = torch.tensor([4, 0, 7, -1, 2, 9], device=DEV, dtype=torch.int32)
            fn = getattr(kjit.compat, engine).fused_recurrent_gated_delta_rule_packed_decode
            return (lambda: fn(**args, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True),
                    [args["initial_state"]])
        return make

    def fla_call(name):
        def make():
            case = fla_case(1, 80, 2, 4, 64, seed=12)
            h0 = torch.randn(2, 4, 64, 64, device=DEV) * 0.1
            cu = torch.tensor([0, 17, 80], device=DEV, dtype=torch.int64)
            fn = getattr(fla, name)
            return (lambda: fn(**case, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                               use_qk_l2norm_in_kernel=True)), []
        return make

    def sigmoid_gating():
        args, call = sigmoid_gating_args(6, 2, 4, 128, 10, True, seed=3)
        idx = torch.tensor([4, 0, 7, -1, 2, 9], device=DEV, dtype=torch.int32)
        return ((lambda: (sglang.fused_sigmoid_gating_delta_rule_update(
            **call, initial_state_indices=idx), args["initial_state"])),
            [args["initial_state"]])

    def vllm_conv_fn():
        x, weight, bias, pool, cu = conv_case(256, 4, [5, 1, 40], 6, 3, bf16, bf16, seed=4)
        idx = torch.tensor([2, -1, 4], device=DEV, dtype=torch.int32)
        has = torch.tensor([True, False, True], device=DEV)
        return (lambda: (vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx, has), pool),
                [pool])

    def vllm_conv_update():
        _, weight, bias, pool, _ = conv_case(256, 4, [1], 10, 5, bf16, bf16, seed=7)
        x = torch.randn(6, 3, 256, device=DEV, dtype=bf16).transpose(1, 2)
        idx = torch.tensor([4, 0, 7, -1, 2, 9], device=DEV, dtype=torch.int32)
        accepted = torch.tensor([1, 2, 3, 1, 3, 2], device=DEV, dtype=torch.int32)
        return ((lambda: (vllm.causal_conv1d_update(x, pool, weight, bias, "silu", idx,
                                                    num_accepted_tokens=accepted), pool)),
                [pool])

    return {
        "vllm.merge_attn_states": vllm_merge,
        "vllm.causal_conv1d_fn": vllm_conv_fn,
        "vllm.causal_conv1d_update": vllm_conv_update,
        "sglang.fused_sigmoid_gating_delta_rule_update": sigmoid_gating,
        "vllm.packed_decode": decode("vllm"),
        "sglang.merge_state": sglang_merge(sglang.merge_state),
        "sglang.merge_state_v2": sglang_merge(sglang.merge_state_v2),
        "sglang.merge_state_triton": sglang_merge(sglang.merge_state_triton),
        "sglang.packed_decode": decode("sglang"),
        "flashinfer.merge_state": fi_merge,
        "flashinfer.merge_state_in_place": fi_in_place,
        "flashinfer.merge_states": fi_states,
        "fla.chunk_gated_delta_rule": fla_call("chunk_gated_delta_rule"),
        "fla.fused_recurrent_gated_delta_rule": fla_call("fused_recurrent_gated_delta_rule"),
    }


CAPTURE = _capture_cases()


@pytest.mark.parametrize("name", sorted(CAPTURE))
def test_every_adapter_replays_its_eager_result_under_graph_capture(name):
    # The first (eager) call plans and loads the kernels; the captured call must then neither
    # compile nor synchronize, and its replay must give the eager call's bytes.
    torch.manual_seed(len(name))
    call, state = CAPTURE[name]()
    saved = [x.clone() for x in state]

    def restore():
        for x, s in zip(state, saved):
            x.copy_(s)

    with torch.no_grad():
        eager = [x.clone() for x in call() if x is not None]
        restore()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = [x for x in call() if x is not None]
        restore()
        for x in captured:
            if x.is_floating_point() and not any(x is s for s in state):
                x.fill_(float("nan"))
        graph.replay()
    torch.cuda.synchronize()
    assert len(captured) == len(eager)
    for got, want in zip(captured, eager):
        assert torch.equal(got, want), f"{name}: replay differs from the eager call"


# --- the recorded signatures against the importable originals -------------------------------

with open(os.path.join(os.path.dirname(__file__), "compat_signatures.json")) as _f:
    _RECORDED = [e for e in __import__("json").load(_f)["functions"] if e["anchor"]]


@pytest.mark.parametrize("entry", _RECORDED, ids=[e["adapter"] for e in _RECORDED])
def test_recorded_signature_equals_the_importable_original(entry):
    # compat_signatures.json is written by hand from the sources; where the original imports
    # here (fla-core's wheel, the transcribed Triton files), compare it with the real thing.
    import inspect

    fn = original(entry["anchor"])
    got = [(p.name, p.kind.name,
            "<none>" if p.default is inspect.Parameter.empty else p.default)
           for p in inspect.signature(fn).parameters.values()]
    want = [(p["name"], p["kind"], p.get("default", "<none>")) for p in entry["params"]]
    assert got == want, entry["original"]
