# SPDX-License-Identifier: Apache-2.0
"""kjit.compat.fla's own logic without torch or a GPU, run by test_compat_cpu.py in a subprocess:
a NumPy-backed stand-in for the few torch calls the adapter makes is installed as `torch`, and
kjit's gdn_prefill is replaced by a float64 recurrence in kjit's layout ([HV, V, K] states,
pool slots, final_state, padding indices). The adapter's results are compared with an
independent recurrence in fla's own form (K-major states S [K, V]: S = a (I - b k k^T) S +
b k v^T, o = S^T q) over equal-length and varlen batches, no / f32 / f16 initial states, both
state layouts, with and without final states, raw gates and beta; the initial state must come
back unwritten. The stand-in accepts only the state strides kjit does (K or V contiguous, final
states in the pool's layout), and the adapter must hand a float32 initial state to kjit as it
is (the same memory, transposed view for fla's K-major layout) and return the very tensor kjit
wrote the final states into: no copies. This checks the layout work (reshapes, views, which
buffer receives the final states) that the GPU tests can only check together with the
kernel."""

import sys
import types

import numpy as np

import kjit  # before the stand-in is installed: kjit registers the real torch, if any


class DType:
    def __init__(self, name, np_type):
        self.name, self.np = name, np_type

    def __str__(self):
        return "torch." + self.name  # what kjit's dtype names parse

    __repr__ = __str__


F32, F16 = DType("float32", np.float32), DType("float16", np.float16)
I32, I64 = DType("int32", np.int32), DType("int64", np.int64)
BY_NUMPY = {np.dtype(d.np): d for d in (F32, F16, I32, I64)}
BY_NUMPY[np.dtype(np.float64)] = DType("float64", np.float64)
BY_NUMPY[np.dtype(bool)] = DType("bool", bool)


class Tensor:
    """The tensor methods kjit.compat.fla uses, on a NumPy array."""

    requires_grad = False
    device = "cpu"

    def __init__(self, array):
        self.a = np.asarray(array)

    shape = property(lambda self: self.a.shape)
    ndim = property(lambda self: self.a.ndim)
    dtype = property(lambda self: BY_NUMPY[self.a.dtype])

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], tuple):  # torch takes both spellings
            shape = shape[0]
        return Tensor(self.a.reshape(shape))

    def transpose(self, i, j):
        return Tensor(np.swapaxes(self.a, i, j))

    def to(self, dtype):
        return Tensor(self.a.astype(dtype.np))

    def copy_(self, other):
        self.a[...] = other.a
        return self

    def contiguous(self):
        return Tensor(np.ascontiguousarray(self.a))

    def __getitem__(self, index):
        return Tensor(self.a[index])

    def __len__(self):
        return len(self.a)

    @staticmethod
    def _raw(x):
        return x.a if isinstance(x, Tensor) else x

    def __add__(self, other):
        return Tensor(self.a + self._raw(other))

    __radd__ = __add__

    def __mul__(self, other):
        return Tensor(self.a * self._raw(other))

    __rmul__ = __mul__

    def __neg__(self):
        return Tensor(-self.a)

    def __gt__(self, other):
        return Tensor(self.a > self._raw(other))


def install_stand_in():
    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.float32, torch.int32, torch.int64 = F32, I32, I64
    torch.is_grad_enabled = lambda: True
    torch.arange = lambda *a, dtype=None, device=None: Tensor(np.arange(*a).astype(dtype.np))
    torch.zeros = lambda *shape, dtype=None, device=None: Tensor(np.zeros(shape, dtype.np))
    torch.ones = lambda *shape, dtype=None, device=None: Tensor(np.ones(shape, dtype.np))
    # NaN-filled: a buffer the adapter forgets to fill shows up in the comparison.
    torch.empty = lambda shape, dtype=None, device=None: Tensor(np.full(shape, np.nan, dtype.np))
    torch.full = lambda shape, value, dtype=None, device=None: Tensor(
        np.full(shape, value, dtype.np))
    torch.exp = lambda x: Tensor(np.exp(x.a))
    torch.log1p = lambda x: Tensor(np.log1p(x.a))
    torch.sigmoid = lambda x: Tensor(1 / (1 + np.exp(-x.a)))
    torch.where = lambda c, x, y: Tensor(np.where(c.a, x.a, y.a))
    sys.modules["torch"] = torch


def l2norm(x):
    return x / np.sqrt(x @ x + 1e-6)


def state_layout(state):
    """kjit's accepted strides of a [.., HV, V, K] state: 'vk' (K contiguous) or 'kv' (V
    contiguous, the transpose of [.., HV, K, V]); anything else fails, as in kjit."""
    st, (dim_v, dim_k) = state.stride(), state.shape[2:]
    if st[1] == dim_v * dim_k and st[2] == dim_k and st[3] == 1:
        return "vk"
    if st[1] == dim_v * dim_k and st[2] == 1 and st[3] == dim_v:
        return "kv"
    raise AssertionError(f"kjit refuses state strides {st} of shape {state.shape}")


CALLS = []  # (state, final_state) of each call, for the no-copy checks


def kjit_prefill_stand_in(q, k, v, cu_seqlens, state, state_indices, g, beta, final_state=None,
                          scale=0.0, l2norm_qk=True):
    """kjit.gdn_prefill's contract in float64: [HV, V, K] states (K or V contiguous) read from
    the pool slot of each sequence (zeros for index < 0), written back there or to final_state
    (in the pool's layout)."""
    layout = state_layout(state)
    if final_state is not None:
        assert state_layout(final_state) == layout, "final_state not in the pool's layout"
    CALLS.append((state, final_state))
    qa, ka, va = (x.a.astype(np.float64) for x in (q, k, v))
    tokens, heads, dim_k = qa.shape
    heads_v, dim_v = va.shape[1:]
    out = np.zeros((tokens, heads_v, dim_v))
    cu, idx = cu_seqlens.a.tolist(), state_indices.a.tolist()
    for n in range(len(cu) - 1):
        slot = idx[n]
        padding = slot < 0 or slot >= state.shape[0]
        hs = np.zeros((heads_v, dim_v, dim_k)) if padding else state.a[slot].astype(np.float64)
        for t in range(cu[n], cu[n + 1]):
            for hv in range(heads_v):
                qq, kk = qa[t, hv // (heads_v // heads)], ka[t, hv // (heads_v // heads)]
                if l2norm_qk:
                    qq, kk = l2norm(qq), l2norm(kk)
                qq = qq * (scale or dim_k ** -0.5)
                h = hs[hv] * np.exp(g.a[t, hv])
                h = h + np.outer(beta.a[t, hv] * (va[t, hv] - h @ kk), kk)
                hs[hv], out[t, hv] = h, h @ qq
        if final_state is not None:
            final_state.a[n] = hs
        elif not padding:
            state.a[slot] = hs
    return Tensor(out.astype(q.a.dtype))


def fla_recurrence(q, k, v, g, beta, cu, h0, scale):
    """fla's form, K-major: S [K, V], S = a (I - b k k^T) S + b k v^T, o = S^T q."""
    tokens, heads, dim_k = q.shape
    heads_v, dim_v = v.shape[1:]
    out, finals = np.zeros((tokens, heads_v, dim_v)), []
    for n in range(len(cu) - 1):
        s = np.zeros((heads_v, dim_k, dim_v)) if h0 is None else h0[n].astype(np.float64)
        for t in range(cu[n], cu[n + 1]):
            for hv in range(heads_v):
                qq = l2norm(q[t, hv // (heads_v // heads)].astype(np.float64)) * scale
                kk = l2norm(k[t, hv // (heads_v // heads)].astype(np.float64))
                decay, b = np.exp(g[t, hv]), beta[t, hv]
                s[hv] = (decay * (np.eye(dim_k) - b * np.outer(kk, kk)) @ s[hv]
                         + b * np.outer(kk, v[t, hv]))
                out[t, hv] = s[hv].T @ qq
        finals.append(s)
    return out, np.stack(finals)


def check(fn, rng, batch, varlen, h0_kind, v_first, final):
    seq, heads, heads_v, dim = 7, 1, 2, 4
    q = rng.standard_normal((batch, seq, heads, dim)).astype(np.float16)
    k = rng.standard_normal((batch, seq, heads, dim)).astype(np.float16)
    v = rng.standard_normal((batch, seq, heads_v, dim)).astype(np.float16)
    g = (-rng.random((batch, seq, heads_v)) * 0.3).astype(np.float32)
    beta = rng.random((batch, seq, heads_v)).astype(np.float32)
    cu_list = [0, 3, seq] if varlen else [i * seq for i in range(batch + 1)]
    count = len(cu_list) - 1
    h0 = None  # K-major, as fla takes it
    if h0_kind is not None:
        h0 = (rng.standard_normal((count, heads_v, dim, dim)) * 0.1).astype(h0_kind)
    given = None if h0 is None else Tensor(
        np.ascontiguousarray(np.swapaxes(h0, -1, -2)) if v_first else h0.copy())
    before = None if given is None else given.a.copy()
    o, state = fn(Tensor(q), Tensor(k), Tensor(v), g=Tensor(g), beta=Tensor(beta),
                  initial_state=given, output_final_state=final,
                  cu_seqlens=Tensor(np.array(cu_list, np.int64)) if varlen else None,
                  state_v_first=v_first, use_qk_l2norm_in_kernel=True, scale=0.2)
    pool, final_state = CALLS[-1]
    if given is not None and h0_kind == np.float32:
        # Read in place: the caller's memory, as a view (transposed when K-major).
        assert np.shares_memory(pool.a, given.a), "a float32 initial state was copied"
        assert state_layout(pool) == ("vk" if v_first else "kv")
    if final:
        # Returned as kjit wrote it: no transposing copy afterwards.
        written = final_state if final_state is not None else pool
        assert np.shares_memory(state.a, written.a), "the final states were copied"
    flat = batch * seq
    ref_o, ref_final = fla_recurrence(q.reshape(flat, heads, dim), k.reshape(flat, heads, dim),
                                      v.reshape(flat, heads_v, dim), g.reshape(flat, heads_v),
                                      beta.reshape(flat, heads_v), cu_list, h0, 0.2)
    assert o.shape == (batch, seq, heads_v, dim), o.shape
    err = np.abs(o.a.astype(np.float64).reshape(ref_o.shape) - ref_o).max() / np.abs(ref_o).max()
    assert err < 2e-3, err
    if final:
        assert state.a.dtype == np.float32 and state.a.flags["C_CONTIGUOUS"]
        got = np.swapaxes(state.a, -1, -2) if v_first else state.a
        err = np.abs(got - ref_final).max() / np.abs(ref_final).max()
        assert err < 1e-5, err
    else:
        assert state is None
    if given is not None:
        assert np.array_equal(given.a, before), "initial_state was written"


def check_raw_gates(rng):
    from kjit.compat import fla

    seq, heads_v, dim = 6, 2, 4
    q = rng.standard_normal((1, seq, 1, dim)).astype(np.float16)
    k = rng.standard_normal((1, seq, 1, dim)).astype(np.float16)
    v = rng.standard_normal((1, seq, heads_v, dim)).astype(np.float16)
    g_raw = rng.standard_normal((1, seq, heads_v)).astype(np.float32) * 10
    b_raw = rng.standard_normal((1, seq, heads_v)).astype(np.float32)
    a_log = rng.standard_normal(heads_v).astype(np.float32)
    dt_bias = (rng.standard_normal(heads_v) * 10).astype(np.float32)  # some x past 20
    for neg in (False, True):
        o, _ = fla.fused_recurrent_gated_delta_rule(
            Tensor(q), Tensor(k), Tensor(v), g=Tensor(g_raw), beta=Tensor(b_raw),
            use_gate_in_kernel=True, A_log=Tensor(a_log), dt_bias=Tensor(dt_bias),
            use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg, use_qk_l2norm_in_kernel=True)
        x = g_raw.astype(np.float64) + dt_bias
        g = -np.exp(a_log.astype(np.float64)) * np.where(x > 20, x,
                                                          np.log1p(np.exp(np.minimum(x, 20))))
        beta = (2.0 if neg else 1.0) / (1 + np.exp(-b_raw.astype(np.float64)))
        ref_o, _ = fla_recurrence(q[0], k[0], v[0], g[0], beta[0], [0, seq], None, dim ** -0.5)
        err = np.abs(o.a[0].astype(np.float64) - ref_o).max() / np.abs(ref_o).max()
        assert err < 2e-3, err


def main():
    install_stand_in()
    from kjit import _api
    from kjit.compat import fla

    _api.gdn_prefill = kjit_prefill_stand_in
    rng = np.random.default_rng(0)
    cases = 0
    for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
        for varlen in (False, True):
            for h0_kind in (None, np.float32, np.float16):
                for v_first in (False, True):
                    for final in (False, True):
                        check(fn, rng, 1 if varlen else 2, varlen, h0_kind, v_first, final)
                        cases += 1
    print(f"fla glue ok: {cases} cases")
    check_raw_gates(rng)
    print("raw gates ok")
    q = Tensor(np.zeros((1, 2, 1, 4), np.float16))
    q.requires_grad = True
    zeros = Tensor(np.zeros((1, 2, 1), np.float32))
    try:
        fla.chunk_gated_delta_rule(q, q, q, zeros, zeros)
    except kjit.compat.UnsupportedFeature as error:
        assert "autograd" in str(error)
        print("autograd refused")
    else:
        raise SystemExit("an input requiring grad was accepted")


if __name__ == "__main__":
    main()
