# SPDX-License-Identifier: Apache-2.0
"""float64 torch references of the kjit ops, written from the op contracts in
include/kjit/ops/*.hpp (not from the kernels)."""

import math

import torch


def merge(vs, ss, base, pos_inf_as_empty=True):
    """vs: list of [T, H, D], ss: list of [T, H] (token-major). Returns float64 (v, s)."""
    v = torch.stack([x.double() for x in vs])  # [n, T, H, D]
    s = torch.stack([x.double() for x in ss])  # [n, T, H]
    if pos_inf_as_empty:
        s = torch.where(s == math.inf, torch.full_like(s, -math.inf), s)
    ln_base = math.log(2.0) if base == 2 else 1.0
    m = s.max(0).values
    empty = m == -math.inf
    shifted = torch.where(s == -math.inf, torch.full_like(s, -math.inf),
                          s - torch.where(empty, torch.zeros_like(m), m))
    w = torch.exp(shifted * ln_base)
    total = w.sum(0)
    safe = torch.where(empty, torch.ones_like(total), total)
    out = (w[..., None] * torch.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0)).sum(0)
    out = torch.where(empty[..., None], torch.zeros_like(out), out / safe[..., None])
    lse = torch.where(empty, torch.full_like(m, -math.inf), m + torch.log(safe) / ln_base)
    return out, lse


def softplus(x, threshold):
    return torch.where(x > threshold, x, torch.log1p(torch.exp(x)))


def gdn_step(h, q, k, v, g, beta, scale, l2norm):
    """h [..., V, K], q/k [..., K], v [..., V], g/beta [...]: one recurrent step in place on a
    copy; returns (new h, out [..., V])."""
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * scale
    h = h * torch.exp(g)[..., None, None]
    u = beta[..., None] * (v - (h @ k[..., None]).squeeze(-1))
    h = h + u[..., None] * k[..., None, :]
    return h, (h @ q[..., None]).squeeze(-1)


def gdn_decode(mixed_qkv, g, beta, state, indices, heads, scale=None, l2norm=True,
               nonpositive=False):
    """float64 reference. g, beta: [B, HV] gates (already converted). Returns (out [B, HV, V],
    new pool): padding rows give zeros and leave the pool alone."""
    b = mixed_qkv.shape[0]
    slots, hv, vd, kd = state.shape
    x = mixed_qkv.double()
    q = x[:, :heads * kd].reshape(b, heads, kd).repeat_interleave(hv // heads, 1)
    k = x[:, heads * kd:2 * heads * kd].reshape(b, heads, kd).repeat_interleave(hv // heads, 1)
    v = x[:, 2 * heads * kd:].reshape(b, hv, vd)
    pool = state.double().clone()
    out = torch.zeros(b, hv, vd, dtype=torch.float64, device=state.device)
    scale = kd ** -0.5 if scale is None else scale
    for n in range(b):
        slot = int(indices[n])
        if slot < 0 or (nonpositive and slot == 0) or slot >= slots:
            continue
        h, o = gdn_step(pool[slot], q[n], k[n], v[n], g[n].double(), beta[n].double(), scale,
                        l2norm)
        pool[slot] = h
        out[n] = o
    return out, pool


def gdn_prefill(q, k, v, g, beta, cu_seqlens, state, indices, has_initial=None, scale=0.0,
                l2norm=True, checkpoints=None):
    """Sequential float64 recurrence over each sequence's tokens. Returns (out [T, HV, V],
    new pool, final states [N, HV, V, K]). checkpoints: (every, list) appends the state after
    every `every` tokens of each sequence to the list, in sequence order."""
    t, h, kd = q.shape
    hv, vd = v.shape[1], v.shape[2]
    rep = hv // h
    qd = q.double().repeat_interleave(rep, 1)
    kk = k.double().repeat_interleave(rep, 1)
    vv = v.double()
    scale = kd ** -0.5 if scale == 0.0 else scale
    pool = state.double().clone()
    out = torch.zeros(t, hv, vd, dtype=torch.float64, device=q.device)
    finals = []
    for n in range(len(cu_seqlens) - 1):
        slot = int(indices[n])
        padded = slot < 0 or slot >= state.shape[0]
        start = not padded and (has_initial is None or bool(has_initial[n]))
        hs = pool[slot].clone() if start else torch.zeros(hv, vd, kd, dtype=torch.float64,
                                                           device=q.device)
        bos = int(cu_seqlens[n])
        for i in range(bos, int(cu_seqlens[n + 1])):
            hs, out[i] = gdn_step(hs, qd[i], kk[i], vv[i], g[i].double(), beta[i].double(),
                                  scale, l2norm)
            if checkpoints is not None and (i + 1 - bos) % checkpoints[0] == 0:
                checkpoints[1].append(hs.clone())
        finals.append(hs)
        if not padded:
            pool[slot] = hs
    return out, pool, torch.stack(finals)
