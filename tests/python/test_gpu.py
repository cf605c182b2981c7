# SPDX-License-Identifier: Apache-2.0
"""GPU tests of the kjit package against float64 torch references: fresh random inputs,
poisoned outputs, boundary shapes, strided views, explicit streams, CUDA graph capture after
prewarm, torch.compile through the custom ops. Skipped, with the reason, without torch or a
CUDA device."""

import math
import os

import pytest

# JAX (tested last) would otherwise take 75% of the GPU's memory when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

torch = pytest.importorskip("torch", reason="torch is not installed: GPU tests need it")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

import kjit  # noqa: E402  (after torch, so that the torch fast path is registered)

import reference  # noqa: E402

DEV = "cuda"
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 2e-5}


def close(actual, expected, rtol, atol):
    """|a - e| <= atol + rtol |e| everywhere, with infinities equal; returns the worst excess."""
    a, e = actual.double(), expected.double()
    assert not torch.isnan(a).any(), "NaN in the output (poison not overwritten?)"
    same_inf = torch.isinf(e) & (a == e)
    err = torch.where(same_inf, torch.zeros_like(a), (a - e).abs() - (atol + rtol * e.abs()))
    worst = err.max().item() if err.numel() else 0.0
    assert worst <= 0, f"max excess {worst:.3g} over atol {atol} rtol {rtol}"


def close_state(actual, expected):
    """The issue's criterion for bf16 prefill states, ||a - e|| <= 2e-2 ||e||, plus an
    element-wise bound at the same level (2e-2 of the largest |e|) so that a few wrong elements
    cannot hide in the norm. The chunked path keeps T' and a copy of the state in bf16, so the
    state is not accurate to 2e-3 per element; the C++ suite uses the same criterion."""
    a, e = actual.double(), expected.double()
    assert not torch.isnan(a).any(), "NaN in the state (poison not overwritten?)"
    rel = ((a - e).norm() / (e.norm() + 1e-30)).item()
    assert rel <= 2e-2, f"relative error {rel:.3g} over 2e-2"
    close(a, e, 2e-2, 2e-2 * (e.abs().max().item() + 1e-6))


def poison(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


def random_lse(shape, special=True):
    s = torch.randn(shape, device=DEV) * 4
    if special and s.numel() >= 4:
        flat = s.view(-1)
        flat[0] = -math.inf
        flat[1] = math.inf
        flat[-1] = -math.inf
    return s


# --- merge_state ----------------------------------------------------------------------------------

MERGE_SHAPES = [(1, 1, 8), (7, 128, 128), (64, 256, 128), (3, 5, 1024), (33, 32, 72)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("t,h,d", MERGE_SHAPES)
@pytest.mark.parametrize("base", [2, "e"])
def test_merge_state(dtype, t, h, d, base):
    torch.manual_seed(t * 1000 + h + d)
    v_a = torch.randn(t, h, d, device=DEV).to(dtype)
    v_b = torch.randn(t, h, d, device=DEV).to(dtype)
    s_a, s_b = random_lse((t, h)), random_lse((t, h))
    v_out, s_out = poison((t, h, d), dtype), poison((t, h), torch.float32)
    got_v, got_s = kjit.merge_state(v_a, s_a, v_b, s_b, v_out, s_out, lse_base=base)
    assert got_v is v_out and got_s is s_out
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([v_a, v_b], [s_a, s_b], 2 if base == 2 else math.e)
    close(v_out, ref_v, TOL[dtype], TOL[dtype])
    close(s_out, ref_s, 1e-5, 1e-5)


def test_merge_state_allocates_outputs_and_f32_out():
    v_a = torch.randn(16, 8, 64, device=DEV, dtype=torch.bfloat16)
    v_b = torch.randn_like(v_a)
    s_a, s_b = random_lse((16, 8)), random_lse((16, 8))
    v, s = kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e", out_dtype=torch.float32)
    assert v.dtype == torch.float32 and v.shape == v_a.shape and s.shape == s_a.shape
    assert s.dtype == torch.float32 and v.device == v_a.device and s.device == v_a.device
    assert v.is_contiguous() and s.is_contiguous() and not v.requires_grad
    v2, s2 = kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e", return_lse=False)
    assert s2 is None and v2.dtype == torch.bfloat16
    # A dtype by name goes through the Python allocator; a strided input still gets a dense
    # output (the fast C++ allocator).
    v3, _ = kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e", out_dtype="f32")
    base = torch.randn(16, 10, 64, device=DEV, dtype=torch.bfloat16)
    strided = base[:, 1:9, :]
    assert not strided.is_contiguous()
    v4, s4 = kjit.merge_state(strided, s_a, v_b, s_b, lse_base="e")
    assert v4.is_contiguous() and v4.shape == strided.shape and s4.shape == (16, 8)
    with pytest.raises(kjit.InvalidArgument, match="last-dimension stride"):
        kjit.merge_state(torch.randn(16, 8, 128, device=DEV, dtype=torch.bfloat16)[..., ::2],
                         s_a, v_b, s_b, lse_base="e")
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([v_a, v_b], [s_a, s_b], math.e)
    close(v, ref_v, 1e-5, 1e-5)
    close(s, ref_s, 1e-5, 1e-5)
    close(v2, ref_v, TOL[torch.bfloat16], TOL[torch.bfloat16])
    close(v3, ref_v, 1e-5, 1e-5)
    ref_v4, ref_s4 = reference.merge([strided, v_b], [s_a, s_b], math.e)
    close(v4, ref_v4, TOL[torch.bfloat16], TOL[torch.bfloat16])
    close(s4, ref_s4, 1e-5, 1e-5)


def test_merge_state_strided_views_and_head_major_lse():
    t, h, d = 40, 12, 128
    big = torch.randn(t, h + 3, d + 16, device=DEV, dtype=torch.float16)
    v_a = big[:, 1:h + 1, 8:d + 8]  # token and head strides of the bigger tensor
    v_b = torch.randn(t, h, d, device=DEV, dtype=torch.float16)
    s_a = random_lse((h, t))
    s_b = random_lse((t, h)).t()  # a transposed view: [H, T] with strides (1, H)
    out = poison((t, h, d), torch.float16)
    _, s = kjit.merge_state(v_a, s_a, v_b, s_b, out, lse_base="e", lse_layout="head_major")
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([v_a, v_b], [s_a.t(), s_b.t()], math.e)
    close(out, ref_v, TOL[torch.float16], TOL[torch.float16])
    close(s.t(), ref_s, 1e-5, 1e-5)


def test_merge_state_in_place_with_mask_leaves_masked_rows_bitwise():
    t, h, d = 50, 16, 64
    v = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16)
    s = random_lse((t, h))
    v_o, s_o = torch.randn_like(v), random_lse((t, h))
    mask = torch.rand(t, device=DEV) < 0.5
    v0, s0 = v.clone(), s.clone()
    kjit.merge_state_in_place(v, s, v_o, s_o, mask, lse_base=2)
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([v0, v_o], [s0, s_o], 2)
    keep = ~mask
    assert torch.equal(v[keep], v0[keep]) and torch.equal(s[keep], s0[keep])
    close(v[mask], ref_v[mask], TOL[torch.bfloat16], TOL[torch.bfloat16])
    close(s[mask], ref_s[mask], 1e-5, 1e-5)


@pytest.mark.parametrize("states", [1, 3, 8])
def test_merge_states(states):
    t, h, d = 9, 24, 256
    v = torch.randn(t, states, h, d, device=DEV, dtype=torch.float16)
    s = random_lse((t, states, h))
    v_out, s_out = kjit.merge_states(v, s, lse_base="e")
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge(list(v.unbind(1)), list(s.unbind(1)), math.e)
    close(v_out, ref_v, TOL[torch.float16], TOL[torch.float16])
    close(s_out, ref_s, 1e-5, 1e-5)


def test_explicit_streams():
    t, h, d = 64, 8, 128
    v_a = torch.randn(t, h, d, device=DEV)
    v_b, s_a, s_b = torch.randn_like(v_a), random_lse((t, h)), random_lse((t, h))
    ref_v, _ = reference.merge([v_a, v_b], [s_a, s_b], math.e)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for stream in (side, side.cuda_stream):
        out = poison((t, h, d), torch.float32)
        kjit.merge_state(v_a, s_a, v_b, s_b, out, lse_base="e", stream=stream)
        side.synchronize()
        close(out, ref_v, 1e-5, 1e-5)
    with torch.cuda.stream(side):  # the default follows torch's current stream
        out = poison((t, h, d), torch.float32)
        kjit.merge_state(v_a, s_a, v_b, s_b, out, lse_base="e")
    side.synchronize()
    close(out, ref_v, 1e-5, 1e-5)


def test_torch_fast_path_reads_cuda_tensors_and_the_current_stream():
    fast = kjit._kjit._torch_fastpath()
    if not fast:
        pytest.skip(f"the torch fast path is not in use: {kjit.torch_fastpath_error}")
    base = torch.zeros(6, 8, 10, device=DEV, dtype=torch.bfloat16)
    try:
        for tensor in (base, base[1:, ::2], base.transpose(0, 2), base[2, 3, 4]):
            kjit._kjit._torch_fastpath(True)
            got = kjit._kjit._read_tensor(tensor)
            kjit._kjit._torch_fastpath(False)
            want = kjit._kjit._read_tensor(tensor)
            assert got[-1] == "fast" and got[:-1] == want[:-1]
            assert got[4] == torch.cuda.current_device()
        # The stream None resolves to: c10's guard registry (fast) and torch's raw getter.
        side = torch.cuda.Stream()
        for stream in (torch.cuda.current_stream(), side):
            with torch.cuda.stream(stream):
                kjit._kjit._torch_fastpath(True)
                got = kjit._kjit._current_stream(torch.cuda.current_device())
                kjit._kjit._torch_fastpath(False)
                want = kjit._kjit._current_stream(torch.cuda.current_device())
            assert got == want == stream.cuda_stream
    finally:
        kjit._kjit._torch_fastpath(fast)


def test_errors_on_gpu_tensors():
    v = torch.randn(4, 8, 64, device=DEV, dtype=torch.bfloat16)
    s = torch.zeros(4, 8, device=DEV)
    with pytest.raises(kjit.InvalidArgument, match="v_b is not in CUDA device memory"):
        kjit.merge_state(v, s, v.cpu(), s, lse_base="e")
    with pytest.raises(kjit.InvalidArgument, match="s_b has dtype f16; accepted: f32"):
        kjit.merge_state(v, s, v, s.half(), lse_base="e")
    with pytest.raises(kjit.InvalidArgument, match="last-dimension stride 2"):
        kjit.merge_state(v[..., ::2], s, v[..., ::2], s, lse_base="e")
    # token_major at D = 1024 (f32) packs 4 heads per block: 262141 heads need 65536 blocks in
    # grid y, one past the limit. Planned only: the tensors would take 4 GiB.
    with pytest.raises(kjit.PlanError, match="65536 head groups exceed grid y limit 65535"):
        kjit.plan("merge_state", dtype="f32", tokens=1, heads=262141, head_dim=1024,
                  mode="token_major", arch="sm_90")


# --- graph capture ------------------------------------------------------------------------------


def test_cuda_graph_capture_after_prewarm():
    t, h, d = 24, 40, 96  # a shape no other test uses, so nothing is loaded before prewarm
    specs = kjit.prewarm("merge_state", tokens=t, heads=h, head_dim=d, dtype="bf16",
                         lse_base="2")
    assert specs and all("head_dim=96" in spec for spec in specs)
    v_a = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16)
    v_b, s_a, s_b = torch.randn_like(v_a), random_lse((t, h)), random_lse((t, h))
    v_out, s_out = poison((t, h, d), torch.bfloat16), poison((t, h), torch.float32)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            kjit.merge_state(v_a, s_a, v_b, s_b, v_out, s_out, lse_base=2)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):  # new inputs each replay: the graph reads the captured buffers
        v_a.copy_(torch.randn_like(v_a))
        s_a.copy_(random_lse((t, h)))
        v_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref_v, ref_s = reference.merge([v_a, v_b], [s_a, s_b], 2)
        close(v_out, ref_v, TOL[torch.bfloat16], TOL[torch.bfloat16])
        close(s_out, ref_s, 1e-5, 1e-5)


def test_capture_without_prewarm_is_refused_with_the_reason():
    t, h, d = 5, 6, 40  # never used elsewhere: not loaded
    v = torch.randn(t, h, d, device=DEV, dtype=torch.float16)
    s = torch.zeros(t, h, device=DEV)
    out = torch.empty_like(v)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    raised = None
    with torch.cuda.stream(stream):
        try:
            with torch.cuda.graph(graph, stream=stream):
                try:
                    kjit.merge_state(v, s, v, s, out, None, lse_base="e", return_lse=False)
                except kjit.DriverError as error:
                    raised = error
        except RuntimeError:
            pass  # an empty capture may be reported by torch; the kjit error is what matters
    assert raised is not None, "a compile/load under capture was not refused"
    assert "capturing" in str(raised) and "prewarm" in str(raised)


# --- torch.compile through the custom ops ---------------------------------------------------------


def test_torch_compile_custom_op():
    if not hasattr(torch.ops, "kjit") or not hasattr(torch.ops.kjit, "merge_state"):
        pytest.skip("torch.library.custom_op unavailable (torch < 2.4)")
    t, h, d = 32, 8, 64
    v_a = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16)
    v_b, s_a, s_b = torch.randn_like(v_a), random_lse((t, h)), random_lse((t, h))

    def f(v_a, s_a, v_b, s_b):
        v, s = torch.ops.kjit.merge_state(v_a, s_a, v_b, s_b, "e")
        return v.float() * 2, s

    compiled = torch.compile(f, fullgraph=True)
    v, s = compiled(v_a, s_a, v_b, s_b)
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge([v_a, v_b], [s_a, s_b], math.e)
    close(v, 2 * ref_v, 2 * TOL[torch.bfloat16], 2 * TOL[torch.bfloat16])
    close(s, ref_s, 1e-5, 1e-5)


# --- Gated DeltaNet -------------------------------------------------------------------------------


def decode_inputs(b, h, hv, k, v, slots, dtype=torch.bfloat16, seed=0):
    torch.manual_seed(seed)
    qkv = torch.randn(b, 2 * h * k + hv * v, device=DEV).to(dtype)
    a = torch.randn(b, hv, device=DEV).to(dtype)
    bb = torch.randn(b, hv, device=DEV).to(dtype)
    a_log = torch.randn(hv, device=DEV) * 0.5
    dt_bias = torch.randn(hv, device=DEV).to(dtype)
    state = torch.randn(slots, hv, v, k, device=DEV) * 0.1
    return qkv, a, bb, a_log, dt_bias, state


@pytest.mark.parametrize("b,h,hv,k,v", [(1, 1, 1, 16, 16), (7, 2, 4, 64, 128),
                                        (33, 4, 8, 128, 128), (3, 1, 2, 256, 64)])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_gdn_decode(b, h, hv, k, v, index_dtype):
    slots = b + 3
    qkv, a, bb, a_log, dt_bias, state = decode_inputs(b, h, hv, k, v, slots, seed=b * 31 + k)
    idx = torch.randperm(slots, device=DEV)[:b].to(index_dtype)
    if b > 2:
        idx[1] = -1  # padding row: zeros out, pool untouched
    pool = state.clone()
    out = poison((b, hv, v), torch.bfloat16)
    got = kjit.gdn_decode(qkv, a, bb, a_log, dt_bias, state, idx, out)
    assert got is out
    torch.cuda.synchronize()
    g = -torch.exp(a_log.double()) * reference.softplus(a.double() + dt_bias.double(), 20.0)
    beta = torch.sigmoid(bb.double())
    ref_out, ref_pool = reference.gdn_decode(qkv, g, beta, pool, idx, h)
    scale = ref_out.abs().max().item() + 1e-6
    close(out, ref_out, TOL[torch.bfloat16], TOL[torch.bfloat16] * scale)
    close(state, ref_pool, 1e-4, 1e-4)


def test_gdn_decode_gated_nonpositive_and_allocated_out():
    b, h, hv, k, v = 6, 2, 4, 64, 64
    qkv, _, _, _, _, state = decode_inputs(b, h, hv, k, v, b + 1, dtype=torch.float16)
    g = -torch.rand(b, hv, device=DEV)
    beta = torch.rand(b, hv, device=DEV)
    idx = torch.arange(b, device=DEV, dtype=torch.int32)  # slot 0 is the null block
    pool = state.clone()
    out = kjit.gdn_decode_gated(qkv, g, beta, state, idx, invalid_index="nonpositive",
                                scale=0.3)
    assert out.shape == (b, hv, v) and out.dtype == torch.float16
    torch.cuda.synchronize()
    ref_out, ref_pool = reference.gdn_decode(qkv, g, beta, pool, idx, h, scale=0.3,
                                             nonpositive=True)
    close(out, ref_out, TOL[torch.float16], TOL[torch.float16])
    close(state, ref_pool, 1e-4, 1e-4)
    assert torch.equal(state[0], pool[0])


@pytest.mark.parametrize("lens,hv,kv", [([1, 69, 130], 4, 64), ([64], 2, 128), ([0, 3, 64], 2, 64)])
def test_gdn_prefill(lens, hv, kv):
    torch.manual_seed(sum(lens) + hv)
    h, n = 2 if hv % 2 == 0 else 1, len(lens)
    t = sum(lens)
    q = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(t, hv, kv, device=DEV, dtype=torch.bfloat16)
    a = torch.randn(t, hv, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(t, hv, device=DEV, dtype=torch.bfloat16)
    a_log = torch.randn(hv, device=DEV) * 0.5
    dt_bias = torch.randn(hv, device=DEV)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV, dtype=torch.int32)
    slots = n + 2
    state = torch.randn(slots, hv, kv, kv, device=DEV) * 0.1
    idx = torch.randperm(slots, device=DEV)[:n].to(torch.int32)
    if n > 1:
        idx[0] = -1  # padding sequence
    has_initial = torch.ones(n, device=DEV, dtype=torch.bool)
    has_initial[-1] = False
    pool = state.clone()
    out = poison((t, hv, kv), torch.bfloat16)
    kjit.gdn_prefill(q, k, v, cu, state, idx, a=a, b=b, a_log=a_log, dt_bias=dt_bias,
                     has_initial_state=has_initial, out=out)
    torch.cuda.synchronize()
    g = -torch.exp(a_log.double()) * reference.softplus(a.double() + dt_bias.double(), 20.0)
    beta = torch.sigmoid(b.double())
    ref_out, ref_pool, _ = reference.gdn_prefill(q, k, v, g, beta, cu.cpu(), pool, idx.cpu(),
                                                 has_initial.cpu())
    scale = ref_out.abs().max().item() + 1e-6
    close(out, ref_out, 2e-2, 2e-2 * scale)
    close_state(state, ref_pool)


def test_gdn_prefill_checkpoints_against_the_reference():
    torch.manual_seed(5)
    lens, h, hv, kv, every = [0, 70, 200, 130, 64], 2, 4, 64, 64
    t, n = sum(lens), len(lens)
    q = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(t, hv, kv, device=DEV, dtype=torch.bfloat16)
    g = -torch.rand(t, hv, device=DEV) * 0.2
    beta = torch.rand(t, hv, device=DEV)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV, dtype=torch.int32)
    state = torch.randn(n + 1, hv, kv, kv, device=DEV) * 0.1
    idx = torch.arange(n, device=DEV, dtype=torch.int32)
    idx[2] = -1  # padding: checkpoints from a zero start, pool untouched
    pool = state.clone()
    starts = kjit.gdn_prefill_checkpoint_starts(cu.tolist(), every)
    assert starts == [0, 0, 1, 4, 6, 7]
    # kjit makes checkpoint_cu_starts and state_checkpoints (a host copy of cu_seqlens) ...
    out, ckpt = kjit.gdn_prefill(q, k, v, cu, state, idx, g=g, beta=beta,
                                 checkpoint_every_n_tokens=every)
    assert ckpt.shape == (starts[-1], hv, kv, kv) and ckpt.dtype == state.dtype
    # ... or the caller gives both (no synchronization; poisoned rows must all be written).
    state2 = pool.clone()
    given = poison((starts[-1], hv, kv, kv), torch.float32)
    out2, ckpt2 = kjit.gdn_prefill(
        q, k, v, cu, state2, idx, g=g, beta=beta, checkpoint_every_n_tokens=every,
        state_checkpoints=given,
        checkpoint_cu_starts=torch.tensor(starts, device=DEV, dtype=torch.int64))
    assert ckpt2 is given
    torch.cuda.synchronize()
    listed = []
    ref_out, ref_pool, _ = reference.gdn_prefill(q, k, v, g, beta, cu.cpu(), pool, idx.cpu(),
                                                 checkpoints=(every, listed))
    ref_ckpt = torch.stack(listed)
    scale = ref_out.abs().max().item() + 1e-6
    for o, c, st in ((out, ckpt, state), (out2, ckpt2, state2)):
        close(o, ref_out, 2e-2, 2e-2 * scale)
        close_state(c, ref_ckpt)
        close_state(st, ref_pool)
    assert torch.equal(state[2], pool[2]) and torch.equal(ckpt, ckpt2)
    # The torch custom op (torch.compile's path) takes the same buffers.
    if hasattr(torch.ops, "kjit") and hasattr(torch.ops.kjit, "gdn_prefill_with_checkpoints"):
        state3, given3 = pool.clone(), poison((starts[-1], hv, kv, kv), torch.float32)
        out3 = torch.ops.kjit.gdn_prefill_with_checkpoints(
            q, k, v, cu, state3, idx, given3,
            torch.tensor(starts, device=DEV, dtype=torch.int64), every, g=g, beta=beta)
        torch.cuda.synchronize()
        assert torch.equal(out3, out2) and torch.equal(given3, ckpt2)
        assert torch.equal(state3, state2)
    with pytest.raises(kjit.InvalidArgument, match="checkpoint_every_n_tokens"):
        kjit.gdn_prefill(q, k, v, cu, state, idx, g=g, beta=beta, checkpoint_every_n_tokens=65)


def test_gdn_prefill_with_a_caller_workspace():
    torch.manual_seed(9)
    lens, h, hv, kv = [130, 1, 64], 2, 4, 128
    t, n = sum(lens), len(lens)
    q = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    k = torch.randn(t, h, kv, device=DEV, dtype=torch.bfloat16)
    v = torch.randn(t, hv, kv, device=DEV, dtype=torch.bfloat16)
    g = -torch.rand(t, hv, device=DEV) * 0.2
    beta = torch.rand(t, hv, device=DEV)
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV, dtype=torch.int32)
    state = torch.randn(n, hv, kv, kv, device=DEV) * 0.1
    idx = torch.arange(n, device=DEV, dtype=torch.int32)
    pool = state.clone()
    need = kjit.gdn_prefill_workspace_bytes(t, hv)
    assert need > 0
    workspace = torch.full((need,), 0xFF, device=DEV, dtype=torch.uint8)  # poisoned
    out = kjit.gdn_prefill(q, k, v, cu, state, idx, g=g, beta=beta, workspace=workspace)
    torch.cuda.synchronize()
    ref_out, ref_pool, _ = reference.gdn_prefill(q, k, v, g, beta, cu.cpu(), pool, idx.cpu())
    scale = ref_out.abs().max().item() + 1e-6
    close(out, ref_out, 2e-2, 2e-2 * scale)
    close_state(state, ref_pool)
    with pytest.raises(kjit.InvalidArgument, match="options.workspace holds"):
        kjit.gdn_prefill(q, k, v, cu, state, idx, g=g, beta=beta, workspace=workspace[:need - 1])


# --- other DLPack producers: CuPy, JAX ---------------------------------------------------------


def test_cupy_arrays_in_and_out_on_a_cupy_stream():
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    torch.manual_seed(11)
    t, h, d = 37, 8, 64
    tv = [torch.randn(t, h, d, device=DEV) for _ in range(2)]
    ts = [random_lse((t, h)) for _ in range(2)]
    # CuPy's own allocations holding the same values (not views of torch memory).
    cv = [cp.asarray(x.cpu().numpy()) for x in tv]
    cs = [cp.asarray(x.cpu().numpy()) for x in ts]
    v_out = cp.full((t, h, d), cp.nan, dtype=cp.float32)
    s_out = cp.full((t, h), cp.nan, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.deviceSynchronize()  # the inputs are written before kjit's stream reads them
    kjit.merge_state(cv[0], cs[0], cv[1], cs[1], v_out, s_out, lse_base="e", stream=stream)
    stream.synchronize()
    ref_v, ref_s = reference.merge(tv, ts, math.e)
    close(torch.from_numpy(cp.asnumpy(v_out)), ref_v.cpu(), 2e-5, 2e-5)
    close(torch.from_numpy(cp.asnumpy(s_out)), ref_s.cpu(), 1e-5, 1e-5)


def test_jax_arrays_as_inputs():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    gpus = [device for device in jax.devices() if device.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    torch.manual_seed(12)
    t, h, d = 19, 4, 128
    tv = [torch.randn(t, h, d, device=DEV) for _ in range(2)]
    ts = [random_lse((t, h)) for _ in range(2)]
    # JAX arrays are immutable: inputs only; the outputs are torch tensors.
    jv = [jax.device_put(x.cpu().numpy(), gpus[0]).block_until_ready() for x in tv]
    js = [jax.device_put(x.cpu().numpy(), gpus[0]).block_until_ready() for x in ts]
    v_out, s_out = poison((t, h, d), torch.float32), poison((t, h), torch.float32)
    kjit.merge_state(jv[0], js[0], jv[1], js[1], v_out, s_out, lse_base="e")
    torch.cuda.synchronize()
    ref_v, ref_s = reference.merge(tv, ts, math.e)
    close(v_out, ref_v, 2e-5, 2e-5)
    close(s_out, ref_s, 1e-5, 1e-5)


# --- causal_conv1d ------------------------------------------------------------------------------


def conv_reference(x, weight, bias, history, silu):
    """float64 y of one sequence: F.conv1d over history ++ x (channels first), per channel."""
    seq = torch.cat([history.double(), x.double().T], dim=1)  # [D, W-1+T]
    y = torch.nn.functional.conv1d(seq.unsqueeze(0), weight.double().unsqueeze(1),
                                   None if bias is None else bias.double(),
                                   groups=weight.shape[0])[0].T  # [T, D]
    return y * torch.sigmoid(y) if silu else y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("transposed_pool", [False, True])
def test_causal_conv1d_varlen_against_conv1d(dtype, transposed_pool):
    d, w = 256, 4
    lengths = [1, 2, w - 1, w, 1000, 37]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=DEV)
    t, n = int(cu[-1]), len(lengths)
    x = torch.randn(t, d, device=DEV, dtype=dtype)
    weight = torch.randn(d, w, device=DEV, dtype=dtype) * 0.5
    bias = torch.randn(d, device=DEV, dtype=dtype)
    slots = n + 2
    if transposed_pool:
        pool = torch.randn(slots, w - 1, d, device=DEV, dtype=dtype).transpose(1, 2)
    else:
        pool = torch.randn(slots, d, w - 1, device=DEV, dtype=dtype)
    idx = torch.randperm(slots, device=DEV)[:n].to(torch.int32)
    idx[2] = -1  # padding: zero rows, slot untouched
    has = (torch.arange(n, device=DEV) % 2 == 0)
    before = pool.clone()
    out = kjit.causal_conv1d(x, weight, pool, cu, idx, bias=bias, has_initial_state=has,
                             activation="silu")
    torch.cuda.synchronize()
    expected_pool = before.clone()
    for i in range(n):
        a, b = int(cu[i]), int(cu[i + 1])
        if int(idx[i]) < 0:
            assert torch.all(out[a:b] == 0)
            continue
        hist = before[int(idx[i])] if bool(has[i]) else torch.zeros_like(before[0])
        want = conv_reference(x[a:b], weight, bias, hist, True)
        close(out[a:b], want, TOL[dtype], TOL[dtype])
        both = torch.cat([hist, x[a:b].T], dim=1)
        expected_pool[int(idx[i])] = both[:, -(w - 1):]
    assert torch.equal(pool, expected_pool)
    # In place (the sequential mode) gives the same rows and pool.
    y = x.clone()
    pool.copy_(before)
    kjit.causal_conv1d(y, weight, pool, cu, idx, bias=bias, has_initial_state=has, out=y,
                       activation="silu")
    close(y, out, TOL[dtype], TOL[dtype])
    assert torch.equal(pool, expected_pool)


def test_causal_conv1d_update_speculative_chain():
    b, s, d, w = 6, 3, 128, 4
    cols = w - 2 + s
    weight = torch.randn(d, w, device=DEV, dtype=torch.float32) * 0.5
    pool = torch.randn(b + 1, d, cols, device=DEV, dtype=torch.float32)
    idx = torch.arange(1, b + 1, dtype=torch.int32, device=DEV)
    accepted = torch.ones(b, dtype=torch.int32, device=DEV)
    for step in range(3):
        x = torch.randn(b, s, d, device=DEV, dtype=torch.float32)
        before = pool.clone()
        out = kjit.causal_conv1d_update(x, weight, pool, idx, num_accepted_tokens=accepted,
                                        invalid_index="nonpositive")
        torch.cuda.synchronize()
        for r in range(b):
            a = int(accepted[r])
            hist = before[r + 1][:, a - 1:a + w - 2]
            close(out[r], conv_reference(x[r], weight, None, hist, False), 2e-5, 2e-5)
            both = torch.cat([hist, x[r].T], dim=1)
            assert torch.equal(pool[r + 1][:, :w - 2 + s], both[:, 1:w - 1 + s])
        accepted = torch.randint(1, s + 1, (b,), dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_qk_l2norm_against_float64(dtype):
    t, hq, hk, d = 37, 6, 2, 128
    # Strided views: q rows are heads of a wider projection row, k rows every other head.
    q_buf = torch.randn(t, hq + 3, d, device=DEV, dtype=dtype) * 3
    k_buf = torch.randn(t, 2 * hk, d, device=DEV, dtype=dtype)
    q, k = q_buf[:, 1:hq + 1], k_buf[:, ::2]
    q_out, k_out = poison((t, hq, d), dtype), poison((t, hk, d), dtype)
    got_q, got_k = kjit.qk_l2norm(q, k, q_out=q_out, k_out=k_out)
    torch.cuda.synchronize()
    assert got_q is q_out and got_k is k_out

    def want(x):
        x = x.double()
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
    close(q_out, want(q), tol, tol)
    close(k_out, want(k), tol, tol)
    # q alone, allocated, and in place on k.
    alone = kjit.qk_l2norm(q)
    close(alone, want(q), tol, tol)
    before, others = k.clone(), k_buf[:, 1::2].clone()
    kjit.qk_l2norm(k, q_out=k)
    torch.cuda.synchronize()
    close(k, want(before), tol, tol)
    assert torch.equal(k_buf[:, 1::2], others)  # the heads between k's are not written
    with pytest.raises(kjit.InvalidArgument, match="D = 100"):
        kjit.qk_l2norm(torch.randn(2, 1, 100, device=DEV, dtype=dtype))
