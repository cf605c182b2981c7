# SPDX-License-Identifier: Apache-2.0
"""kjit.compat.fla's own logic without torch or a GPU, run by test_compat_cpu.py in a subprocess:
a NumPy-backed stand-in for the few torch calls the adapter makes is installed as `torch`, and
kjit's gdn_prefill is replaced by a float64 recurrence in kjit's layout ([HV, V, K] states,
pool slots, final_state, padding indices). The adapter's results are compared with an
independent recurrence in fla's own form (K-major states S [K, V]: S = a (I - b k k^T) S +
b k v^T, o = S^T q) over equal-length and varlen batches, no / f32 / f16 initial states, both
state layouts, with and without final states, raw gates and beta; the initial state must come
back unwritten. This checks the layout work (reshapes, the transposing copies, which buffer
receives the final states) that the GPU tests can only check together with the kernel."""
import sys, types
import numpy as np
import kjit  # before the stand-in is installed: kjit registers the real torch, if any

class D:
    def __init__(s, name, np_t): s.name, s.np = name, np_t
    def __str__(s): return "torch." + s.name
    __repr__ = __str__

f32, f16, i32, i64 = D("float32", np.float32), D("float16", np.float16), D("int32", np.int32), D("int64", np.int64)
BYNP = {np.dtype(np.float32): f32, np.dtype(np.float16): f16, np.dtype(np.int32): i32,
        np.dtype(np.int64): i64, np.dtype(np.float64): D("float64", np.float64), np.dtype(bool): D("bool", bool)}

class T:
    requires_grad = False
    device = "cpu"
    def __init__(s, a): s.a = np.asarray(a)
    shape = property(lambda s: s.a.shape)
    ndim = property(lambda s: s.a.ndim)
    dtype = property(lambda s: BYNP[s.a.dtype])
    def stride(s): return tuple(x // s.a.itemsize for x in s.a.strides)
    def reshape(s, *shape): return T(s.a.reshape(shape))
    def transpose(s, i, j): return T(np.swapaxes(s.a, i, j))
    def to(s, d): return T(s.a.astype(d.np))
    def copy_(s, o): s.a[...] = o.a; return s
    def contiguous(s): return T(np.ascontiguousarray(s.a))
    def clone(s): return T(s.a.copy())
    def __len__(s): return len(s.a)
    def _o(s, o): return o.a if isinstance(o, T) else o
    def __add__(s, o): return T(s.a + s._o(o))
    __radd__ = __add__
    def __mul__(s, o): return T(s.a * s._o(o))
    __rmul__ = __mul__
    def __neg__(s): return T(-s.a)
    def __gt__(s, o): return T(s.a > s._o(o))

torch = types.ModuleType("torch")
torch.Tensor = T
torch.float32, torch.int32, torch.int64 = f32, i32, i64
torch.is_grad_enabled = lambda: True
torch.arange = lambda *a, dtype=None, device=None: T(np.arange(*a).astype(dtype.np))
torch.zeros = lambda *shape, dtype=None, device=None: T(np.zeros(shape, dtype.np))
torch.ones = lambda *shape, dtype=None, device=None: T(np.ones(shape, dtype.np))
torch.empty = lambda shape, dtype=None, device=None: T(np.full(shape, np.nan, dtype.np))
torch.full = lambda shape, v, dtype=None, device=None: T(np.full(shape, v, dtype.np))
torch.exp = lambda x: T(np.exp(x.a))
torch.log1p = lambda x: T(np.log1p(x.a))
torch.sigmoid = lambda x: T(1 / (1 + np.exp(-x.a)))
torch.where = lambda c, x, y: T(np.where(c.a, x.a, y.a))
sys.modules["torch"] = torch

import kjit
from kjit import _api
from kjit.compat import fla

def fake_prefill(q, k, v, cu, pool, idx, g, beta, final_state=None, scale=0.0, l2norm_qk=True):
    qa, ka, va = (x.a.astype(np.float64) for x in (q, k, v))
    T_, H, K = qa.shape; HV, V = va.shape[1:]
    out = np.zeros((T_, HV, V))
    cu_, ix = cu.a.tolist(), idx.a.tolist()
    for n in range(len(cu_) - 1):
        s = ix[n]; pad = s < 0 or s >= pool.shape[0]
        hs = np.zeros((HV, V, K)) if pad else pool.a[s].astype(np.float64).copy()
        for t in range(cu_[n], cu_[n + 1]):
            for hv in range(HV):
                h = hv // (HV // H); qq, kk = qa[t, h], ka[t, h]
                if l2norm_qk:
                    qq = qq / np.sqrt(qq @ qq + 1e-6); kk = kk / np.sqrt(kk @ kk + 1e-6)
                qq = qq * (scale or K ** -0.5)
                Hs = hs[hv] * np.exp(g.a[t, hv])
                u = beta.a[t, hv] * (va[t, hv] - Hs @ kk)
                Hs = Hs + np.outer(u, kk); hs[hv] = Hs; out[t, hv] = Hs @ qq
        if final_state is not None: final_state.a[n] = hs
        elif not pad: pool.a[s] = hs
    return T(out.astype(q.a.dtype))

_api.gdn_prefill = fake_prefill

def kmajor_reference(q, k, v, g, beta, cu, h0, scale, l2norm):
    # fla's form: S [K, V], S = a (I - b k k^T) S + b k v^T, o = S^T q
    qa, ka, va = (x.astype(np.float64) for x in (q, k, v))
    T_, H, K = qa.shape; HV, V = va.shape[1:]
    out = np.zeros((T_, HV, V)); finals = []
    for n in range(len(cu) - 1):
        S = np.zeros((HV, K, V)) if h0 is None else h0[n].astype(np.float64).copy()
        for t in range(cu[n], cu[n + 1]):
            for hv in range(HV):
                h = hv // (HV // H); qq, kk = qa[t, h], ka[t, h]
                if l2norm:
                    qq = qq / np.sqrt(qq @ qq + 1e-6); kk = kk / np.sqrt(kk @ kk + 1e-6)
                qq = qq * scale
                a, b = np.exp(g[t, hv]), beta[t, hv]
                S[hv] = a * (np.eye(K) - b * np.outer(kk, kk)) @ S[hv] + b * np.outer(kk, va[t, hv])
                out[t, hv] = S[hv].T @ qq
        finals.append(S)
    return out, np.stack(finals)

rng = np.random.default_rng(0)
def run(fn, B, Tn, H, HV, K, varlen, h0_kind, v_first, out_final, **extra):
    q = rng.standard_normal((B, Tn, H, K)).astype(np.float16)
    k = rng.standard_normal((B, Tn, H, K)).astype(np.float16)
    v = rng.standard_normal((B, Tn, HV, K)).astype(np.float16)
    g = (-rng.random((B, Tn, HV)) * 0.3).astype(np.float32)
    beta = rng.random((B, Tn, HV)).astype(np.float32)
    N = B
    cu = None
    if varlen:
        assert B == 1; cu_l = [0, 3, Tn]; N = 2; cu = T(np.array(cu_l, np.int64))
    else:
        cu_l = [i * Tn for i in range(B + 1)]
    h0k = None if h0_kind is None else (rng.standard_normal((N, HV, K, K)) * 0.1).astype(np.float32 if h0_kind == "f32" else np.float16)
    given = None
    if h0k is not None:
        given = T(np.ascontiguousarray(np.swapaxes(h0k, -1, -2)) if v_first else h0k.copy())
    before = None if given is None else given.a.copy()
    o, st = fn(T(q), T(k), T(v), g=T(g), beta=T(beta), initial_state=given, output_final_state=out_final,
               cu_seqlens=cu, state_v_first=v_first, use_qk_l2norm_in_kernel=True, scale=0.2, **extra)
    ro, rf = kmajor_reference(q.reshape(B * Tn, H, K), k.reshape(B * Tn, H, K), v.reshape(B * Tn, HV, K),
                              g.reshape(B * Tn, HV), beta.reshape(B * Tn, HV), cu_l, h0k, 0.2, True)
    assert o.shape == (B, Tn, HV, K), o.shape
    err = np.abs(o.a.astype(np.float64).reshape(B * Tn, HV, K) - ro).max() / (np.abs(ro).max())
    assert err < 2e-3, err
    if out_final:
        fs = st.a if not v_first else np.swapaxes(st.a, -1, -2)
        assert st.a.dtype == np.float32 and st.a.flags["C_CONTIGUOUS"]
        e2 = np.abs(fs - rf).max() / np.abs(rf).max()
        assert e2 < 1e-5, e2
    else:
        assert st is None
    if given is not None:
        assert np.array_equal(given.a, before), "initial_state written"
    return err

n = 0
for fn in (fla.chunk_gated_delta_rule, fla.fused_recurrent_gated_delta_rule):
    for varlen in (False, True):
        for h0_kind in (None, "f32", "f16"):
            for v_first in (False, True):
                for out_final in (False, True):
                    B = 1 if varlen else 2
                    run(fn, B, 7, 1, 2, 4, varlen, h0_kind, v_first, out_final); n += 1
print("fla glue ok:", n, "cases")
# autograd refusal path with grad enabled and requires_grad
q = T(np.zeros((1, 2, 1, 4), np.float16)); q.requires_grad = True
try:
    fla.chunk_gated_delta_rule(q, q, q, T(np.zeros((1, 2, 1), np.float32)), T(np.zeros((1, 2, 1), np.float32)))
    raise SystemExit("no autograd error")
except kjit.compat.UnsupportedFeature as e:
    print("autograd refused:", e)

# raw gates: use_gate_in_kernel + use_beta_sigmoid_in_kernel (+ allow_neg_eigval)
B, Tn, H, HV, K = 1, 6, 1, 2, 4
q = rng.standard_normal((B, Tn, H, K)).astype(np.float16); k = rng.standard_normal((B, Tn, H, K)).astype(np.float16)
v = rng.standard_normal((B, Tn, HV, K)).astype(np.float16)
graw = rng.standard_normal((B, Tn, HV)).astype(np.float32) * 10  # some above the threshold 20 after bias
braw = rng.standard_normal((B, Tn, HV)).astype(np.float32)
A_log = rng.standard_normal(HV).astype(np.float32); dt = (rng.standard_normal(HV) * 10).astype(np.float32)
for neg in (False, True):
    o, _ = fla.fused_recurrent_gated_delta_rule(T(q), T(k), T(v), g=T(graw), beta=T(braw), use_gate_in_kernel=True,
        A_log=T(A_log), dt_bias=T(dt), use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg,
        use_qk_l2norm_in_kernel=True)
    x = graw.astype(np.float64) + dt
    g = -np.exp(A_log.astype(np.float64)) * np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))
    b = (2.0 if neg else 1.0) / (1 + np.exp(-braw.astype(np.float64)))
    ro, _ = kmajor_reference(q[0], k[0], v[0], g[0], b[0], [0, Tn], None, K ** -0.5, True)
    err = np.abs(o.a[0].astype(np.float64) - ro).max() / np.abs(ro).max()
    assert err < 2e-3, err
print("raw gates ok")
