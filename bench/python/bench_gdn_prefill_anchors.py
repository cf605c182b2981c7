# SPDX-License-Identifier: Apache-2.0
"""gdn_prefill beside the Python-side anchors of issue 19, same process, same inputs.

kjit.gdn_prefill against FlashQLA (QwenLM's TileLang kernels, pip package flash-qla) and fla
(fla-core's chunk_gated_delta_rule), whichever import, on the issue's shapes: K = V = 128, bf16
q/k/v, f32 states [N, HV, V, K], precomputed gates (g f32 log decay, beta f32), 16 uneven
sequences and a few long equal ones. Every call is timed alone with CUDA events after a write
of 256 MiB that evicts L2 (the C++ benches' protocol); the figure is the median of --reps.

kjit always normalizes q and k itself (l2norm_qk=True, fused into its chunk kernel). Each
anchor is timed twice: on q and k normalized beforehand ("kernel alone", what the issue's
targets compare with) and with its own in-kernel normalization ("+ norm"). FlashQLA picks its
own (approximate) context-parallel path for few long sequences (auto_cp, its default).

Outputs are compared with kjit's (relative L2 of out and of the final states): a row whose
anchor disagrees is marked.

The uneven lengths come from the same rule as bench/harness.hpp's uneven_offsets (weights 1..N
shuffled, here by Python's random with seed 7, so the lengths differ from the C++ bench's) and
are printed. FlashQLA JIT-compiles its kernels on first use (printed as "first call").

FlashQLA on the GPU machine: scripts/fetch_flashqla.sh packs its wheels here.

Usage: python bench/python/bench_gdn_prefill_anchors.py [--quick] [--reps N] [--json PATH]
"""

import argparse
import json
import random
import sys
import time

import torch

import kjit
from gpu_timer import GpuTimer  # (this folder: GPU time only, L2 evicted before each call)

DEV = "cuda"
KD = 128


def log(text=""):
    print(text, flush=True)


def uneven_offsets(tokens, seqs, seed=7):
    weights = list(range(1, seqs + 1))
    random.Random(seed).shuffle(weights)
    total = seqs * (seqs + 1) // 2
    cu, used = [0], 0
    for i in range(seqs):
        length = tokens - used if i + 1 == seqs else tokens * weights[i] // total
        used += length
        cu.append(used)
    return cu


def equal_offsets(tokens, seqs):
    return [tokens * i // seqs for i in range(seqs + 1)]


def rel_l2(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def try_import(name):
    try:
        if name == "flashqla":
            import flash_qla

            return flash_qla.chunk_gated_delta_rule, f"flash-qla {flash_qla.__version__}"
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return chunk_gated_delta_rule, "fla-core"
    except Exception as error:  # noqa: BLE001 - any failure means: no anchor
        return None, f"{type(error).__name__}: {error}"[:160]


def run_shape(timer, anchors, h, hv, cu, reps, results):
    t, n = cu[-1], len(cu) - 1
    gen = torch.Generator(device=DEV).manual_seed(t * 31 + n * 7 + hv)
    q = torch.randn(t, h, KD, device=DEV, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(t, h, KD, device=DEV, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(t, hv, KD, device=DEV, dtype=torch.bfloat16, generator=gen)
    # Gates as the engines produce them: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b).
    a = torch.randn(t, hv, device=DEV, generator=gen)
    a_log = torch.randn(hv, device=DEV, generator=gen) * 0.5
    dt_bias = torch.randn(hv, device=DEV, generator=gen) * 0.5
    g = (-torch.exp(a_log) * torch.nn.functional.softplus(a + dt_bias)).float().contiguous()
    beta = torch.sigmoid(torch.randn(t, hv, device=DEV, generator=gen)).float().contiguous()
    init = torch.randn(n, hv, KD, KD, device=DEV, generator=gen) * 0.05  # [N, HV, V, K]
    cu_t = torch.tensor(cu, dtype=torch.int32, device=DEV)
    idx = torch.arange(n, dtype=torch.int32, device=DEV)
    out = torch.empty(t, hv, KD, device=DEV, dtype=torch.bfloat16)
    qn = torch.nn.functional.normalize(q.float(), dim=-1).to(torch.bfloat16)
    kn = torch.nn.functional.normalize(k.float(), dim=-1).to(torch.bfloat16)

    pool = init.clone()
    kjit.gdn_prefill(q, k, v, cu_t, pool, idx, g=g, beta=beta, out=out)
    torch.cuda.synchronize()
    ref_out, ref_state = out.clone(), pool.clone()
    plan = kjit.gdn_prefill(q, k, v, cu_t, pool, idx, g=g, beta=beta, out=out, _plan=True)
    mode = getattr(plan, "mode", "?")
    kjit_us = timer(lambda: kjit.gdn_prefill(q, k, v, cu_t, pool, idx, g=g, beta=beta, out=out),
                    reps, warmup=1)
    entry = {"H": h, "HV": hv, "tokens": t, "seqs": n, "kjit_us": kjit_us, "kjit_mode": mode,
             "anchors": {}}
    parts = [f"{h:3d} {hv:3d} {t:7d} {n:3d} | kjit {kjit_us:8.1f} ({mode})"]
    cu_long = cu_t.long()
    for name, (fn, _) in anchors.items():
        for variant, (qq, kk, norm) in (("kernel", (qn, kn, False)), ("+norm", (q, k, True))):
            key = f"{name} {variant}"
            try:
                state0 = init.clone()
                call = lambda: fn(qq[None], kk[None], v[None], g[None], beta[None],  # noqa: E731
                                  scale=KD ** -0.5, initial_state=state0,
                                  output_final_state=True, cu_seqlens=cu_long,
                                  use_qk_l2norm_in_kernel=norm,
                                  **({"state_v_first": True} if name == "FlashQLA" else {}))
                started = time.perf_counter()
                o, s = call()
                torch.cuda.synchronize()
                first = time.perf_counter() - started
                if name != "FlashQLA":
                    s = s.transpose(-1, -2)  # fla's states are [N, HV, K, V]
                diff = (rel_l2(o[0], ref_out), rel_l2(s, ref_state))
                us = timer(call, reps, warmup=1)
                ok = diff[0] < 2e-2 and diff[1] < 2e-2
                entry["anchors"][key] = {"us": us, "out_rel": diff[0], "state_rel": diff[1],
                                         "first_call_s": first}
                parts.append(f"{key} {us:8.1f} (x{us / kjit_us:4.2f}) "
                             f"diff {diff[0]:.0e}/{diff[1]:.0e}{'' if ok else ' MISMATCH'}"
                             f"{f' first call {first:.0f} s' if first > 5 else ''}")
            except Exception as error:  # noqa: BLE001
                parts.append(f"{key}: failed {type(error).__name__}: {error}"[:140])
                entry["anchors"][key] = f"failed: {error}"[:200]
    results.append(entry)
    log(" | ".join(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--anchors", default="flashqla,fla", help="comma list: flashqla, fla")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        log("SKIPPED: torch sees no CUDA device")
        return 0
    log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    anchors = {}
    for name in args.anchors.split(","):
        if not name:
            continue
        fn, why = try_import(name)
        label = "FlashQLA" if name == "flashqla" else "fla"
        log(f"anchor {label}: {why if fn is None else 'imported (' + why + ')'}")
        if fn is not None:
            anchors[label] = (fn, why)
    timer = GpuTimer(log=log)
    uneven = [(16, 16, 8192, 4), (16, 16, 32768, 16), (16, 32, 32768, 16),
              (16, 16, 131072, 16), (16, 32, 131072, 16)]
    few = [(16, 16, 32768, 1), (16, 16, 16384 * 2, 2), (16, 16, 8192 * 4, 4),
           (16, 16, 4096 * 8, 8), (16, 32, 32768, 1), (16, 16, 131072, 1),
           (16, 16, 8192 * 16, 16)]
    if args.quick:
        uneven, few = uneven[:3], few[:5]
    results = []
    log("GPU us per call, L2 evicted before each; (xR) = anchor / kjit, > 1: kjit faster; "
        "diff = relative L2 of out / final state against kjit's")
    log("  H  HV  tokens seqs")
    for h, hv, t, n in uneven:
        cu = uneven_offsets(t, n)
        log(f"uneven lengths {[cu[i + 1] - cu[i] for i in range(n)]}")
        run_shape(timer, anchors, h, hv, cu, args.reps, results)
    for h, hv, t, n in few:
        run_shape(timer, anchors, h, hv, equal_offsets(t, n), args.reps, results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
