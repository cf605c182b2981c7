# SPDX-License-Identifier: Apache-2.0
"""kjit.compat.sglang.fused_sigmoid_gating_delta_rule_update's own logic without torch or a GPU,
run by test_compat_cpu.py in a subprocess (it installs compat_fla_glue's NumPy stand-in as
`torch`). kjit's gdn_decode is replaced by a float64 step in its contract (packed rows
[q | k | v], [slots, HV, V, K] pool, index < 0 = padding); the adapter's output and pool are
compared with a step computed from the separate q, k, v the caller passed. With q, k, v the
split views of one row buffer the packed row handed to kjit must share that buffer's memory
(no copy); with separate buffers it is a concatenation. Also kjit.compat.vllm.merge_attn_states'
prefill_tokens_with_context split (merged views, copied suffix) with kjit.merge_state replaced
by a float64 merge."""

import numpy as np

import compat_fla_glue as glue  # noqa: I100 - the stand-in lives there
from kjit import _kjit

SEEN = {}


def gdn_decode_stand_in(mixed_qkv, a, b, a_log, dt_bias, state, state_indices, out=None,
                        scale=None, l2norm_qk=True, softplus_threshold=20.0,
                        invalid_index="negative"):
    SEEN["mixed"] = mixed_qkv
    rows = mixed_qkv.shape[0]
    heads_v, dim_v, dim_k = state.shape[1:]
    heads = (mixed_qkv.shape[1] - heads_v * dim_v) // (2 * dim_k)
    result = np.zeros((rows, heads_v, dim_v))
    x = mixed_qkv.a.astype(np.float64)
    for n in range(rows):
        slot = int(state_indices.a[n])
        if slot < 0 or (invalid_index == "nonpositive" and slot == 0):
            continue
        for hv in range(heads_v):
            h = hv // (heads_v // heads)
            q = glue.l2norm(x[n, h * dim_k:(h + 1) * dim_k])
            k = glue.l2norm(x[n, (heads + h) * dim_k:(heads + h + 1) * dim_k])
            v = x[n, 2 * heads * dim_k + hv * dim_v:2 * heads * dim_k + (hv + 1) * dim_v]
            z = float(a.a[n, hv]) + float(dt_bias.a[hv])
            g = -np.exp(float(a_log.a[hv])) * (z if z > softplus_threshold else np.log1p(np.exp(z)))
            beta = 1 / (1 + np.exp(-float(b.a[n, hv])))
            s = state.a[slot, hv].astype(np.float64) * np.exp(g)
            s = s + np.outer(beta * (v - s @ k), k)
            state.a[slot, hv] = s
            result[n, hv] = s @ (q * (scale or dim_k ** -0.5))
    return glue.Tensor(result.astype(mixed_qkv.a.dtype))


def expected(q, k, v, a, b, a_log, dt_bias, pool, idx):
    """The step from the caller's own q [N, H, K], k, v [N, HV, V], fp64; pool updated."""
    rows, heads, dim_k = q.shape
    heads_v = v.shape[1]
    out = np.zeros(v.shape)
    for n in range(rows):
        if idx[n] < 0:
            continue
        for hv in range(heads_v):
            h = hv // (heads_v // heads)
            qq, kk = glue.l2norm(q[n, h].astype(np.float64)), glue.l2norm(k[n, h].astype(np.float64))
            z = float(a[n, hv]) + float(dt_bias[hv])
            g = -np.exp(float(a_log[hv])) * (z if z > 20 else np.log1p(np.exp(z)))
            beta = 1 / (1 + np.exp(-float(b[n, hv])))
            s = pool[idx[n], hv].astype(np.float64) * np.exp(g)
            s = s + np.outer(beta * (v[n, hv] - s @ kk), kk)
            pool[idx[n], hv] = s
            out[n, hv] = s @ (qq * dim_k ** -0.5)
    return out


def main():
    glue.install_stand_in()
    glue.Tensor.data_ptr = lambda self: self.a.__array_interface__["data"][0]
    glue.Tensor.element_size = lambda self: self.a.itemsize
    glue.Tensor.as_strided = lambda self, shape, strides: glue.Tensor(
        np.lib.stride_tricks.as_strided(self.a, shape,
                                        tuple(s * self.a.itemsize for s in strides)))
    import torch  # the stand-in

    torch.cat = lambda parts, dim=-1: glue.Tensor(np.concatenate([p.a for p in parts], dim))
    _kjit.gdn_decode = gdn_decode_stand_in
    from kjit.compat import sglang

    rng = np.random.default_rng(1)
    rows, heads, heads_v, dim, slots = 5, 2, 4, 8, 9
    width = (2 * heads + heads_v) * dim
    for packed in (True, False):
        # a row buffer wider than q|k|v (a projection row with more columns after v)
        buffer = rng.standard_normal((rows, width + 16)).astype(np.float16)
        q2, k2 = buffer[:, :heads * dim], buffer[:, heads * dim:2 * heads * dim]
        v2 = buffer[:, 2 * heads * dim:width]
        if not packed:
            # Each part in a buffer of its own, at its usual columns: the row strides still
            # agree, only the addresses tell that they are not one row.
            parts = []
            for part, start in ((q2, 0), (k2, heads * dim), (v2, 2 * heads * dim)):
                other = rng.standard_normal(buffer.shape).astype(np.float16)
                other[:, start:start + part.shape[1]] = part
                parts.append(other[:, start:start + part.shape[1]])
            q2, k2, v2 = parts
        a = rng.standard_normal((rows, heads_v)).astype(np.float16)
        b = rng.standard_normal((rows, heads_v)).astype(np.float16)
        a_log = rng.standard_normal(heads_v).astype(np.float32)
        dt_bias = rng.standard_normal(heads_v).astype(np.float32)
        pool = (rng.standard_normal((slots, heads_v, dim, dim)) * 0.1).astype(np.float32)
        idx = np.array([3, -1, 0, 8, 5], np.int32)
        want_pool = pool.astype(np.float64)
        want = expected(q2.reshape(rows, heads, dim), k2.reshape(rows, heads, dim),
                        v2.reshape(rows, heads_v, dim), a, b, a_log, dt_bias, want_pool, idx)
        T = glue.Tensor
        o = sglang.fused_sigmoid_gating_delta_rule_update(
            A_log=T(a_log), a=T(a), dt_bias=T(dt_bias), softplus_beta=1.0,
            softplus_threshold=20.0, q=T(q2.reshape(1, rows, heads, dim)),
            k=T(k2.reshape(1, rows, heads, dim)), v=T(v2.reshape(1, rows, heads_v, dim)),
            b=T(b), initial_state_source=T(pool), initial_state_indices=T(idx),
            cu_seqlens=T(np.arange(rows + 1, dtype=np.int32)), use_qk_l2norm_in_kernel=True)
        assert o.shape == (1, rows, heads_v, dim), o.shape
        err = np.abs(o.a[0].astype(np.float64) - want).max() / np.abs(want).max()
        assert err < 2e-3, err
        assert np.abs(pool - want_pool).max() < 1e-5
        shares = np.shares_memory(SEEN["mixed"].a, buffer)
        assert shares == packed, f"packed={packed}: the row handed to kjit shares={shares}"
    print("sigmoid gating glue ok")
    check_vllm_merge_split(rng)
    print("vllm merge glue ok")


def merge_stand_in(v_a, s_a, v_b, s_b, v_out=None, s_out=None, *, lse_base=None,
                   lse_layout="token_major", return_lse=True, **_):
    """kjit.merge_state's contract in float64 for natural-log [H, T] LSEs, written through
    the given views (so a wrong slice shows up in the caller's buffers)."""
    assert lse_base == "e" and lse_layout == "head_major"
    a, b = s_a.a.astype(np.float64).T, s_b.a.astype(np.float64).T  # [T, H]
    m = np.maximum(a, b)
    wa, wb = np.exp(a - m), np.exp(b - m)
    v = (wa[..., None] * v_a.a + wb[..., None] * v_b.a) / (wa + wb)[..., None]
    v_out.a[...] = v
    if return_lse:
        s_out.a[...] = (m + np.log(wa + wb)).T
    return v_out, s_out


def check_vllm_merge_split(rng):
    """vLLM's prefill_tokens_with_context: tokens before it are merged (on views of the
    caller's buffers, head-major LSE slices [:, :n]), the rest copy the suffix."""
    from kjit.compat import vllm

    _kjit.merge_state = merge_stand_in
    T = glue.Tensor
    tokens, heads, dim, n = 7, 3, 8, 4
    pv, sv = (rng.standard_normal((tokens, heads, dim)).astype(np.float32) for _ in range(2))
    pl, sl = (rng.standard_normal((heads, tokens)).astype(np.float32) for _ in range(2))
    out = np.full((tokens, heads, dim), np.nan, np.float32)
    out_lse = np.full((heads, tokens), np.nan, np.float32)
    vllm.merge_attn_states(T(out), T(pv), T(pl), T(sv), T(sl), T(out_lse), n)
    want_v, want_s = merge_stand_in(T(pv[:n]), T(pl[:, :n]), T(sv[:n]), T(sl[:, :n]),
                                    T(np.zeros((n, heads, dim))), T(np.zeros((heads, n))),
                                    lse_base="e", lse_layout="head_major")
    assert np.allclose(out[:n], want_v.a, atol=1e-6) and np.allclose(out_lse[:, :n], want_s.a)
    assert np.array_equal(out[n:], sv[n:]) and np.array_equal(out_lse[:, n:], sl[:, n:])


if __name__ == "__main__":
    main()
