# SPDX-License-Identifier: Apache-2.0
"""kjit.compat adapters beside the originals they replace, same process, same inputs.

For each adapter: host time per call (us, best of 5 rounds of N calls on a tiny problem, so
the host is the bottleneck) and GPU time per call (us, median of CUDA-event-timed batches) on
a serving-size problem, with the original's figures where it imports from KJIT_ANCHORS_DIR
(vLLM's / SGLang's / FlashInfer's Triton kernels, fla-core; see docs/engines.md) and the ratio
original / kjit (> 1: kjit faster). An original that cannot run a shape (FlashInfer's Triton
merge is written for sm_90 only) is reported with its error.

Usage: KJIT_ANCHORS_DIR=.anchors python bench/python/compat_bench.py [--quick] [--json PATH]
"""

import argparse
import importlib
import json
import math
import os
import statistics
import sys
import time

import torch

import kjit  # noqa: F401  (registers the torch fast path before the adapters run)
from kjit.compat import fla, flashinfer, sglang, vllm

DEV = "cuda"
ROWS = []


def log(text=""):
    print(text, flush=True)


def anchor(dotted):
    """The original `module:name` from KJIT_ANCHORS_DIR, or the text saying why not."""
    root = os.environ.get("KJIT_ANCHORS_DIR")
    if not root:
        return "KJIT_ANCHORS_DIR not set"
    for path in (root, os.path.join(root, "compat_site")):
        if path not in sys.path:
            sys.path.insert(0, path)
    module, name = dotted.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception as error:  # noqa: BLE001 - any failure means: no anchor
        return f"not importable: {error!r}"


def host_us(fn, n, rounds=5):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
        torch.cuda.synchronize()
    return best


def gpu_us(fn, iters=20, reps=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    return statistics.median(times)


def measure(name, shape, mine, theirs, n, gpu):
    """One row: kjit's adapter and the original on the same closure arguments."""
    entry = {"adapter": name, "shape": shape, "what": "gpu_us" if gpu else "host_us"}
    timer = (lambda f: gpu_us(f)) if gpu else (lambda f: host_us(f, n))
    entry["kjit"] = timer(mine)
    parts = [f"{name:52s} {shape:30s} {'gpu' if gpu else 'host'} kjit {entry['kjit']:9.2f} us"]
    if isinstance(theirs, str):
        entry["original"] = theirs
        parts.append(f"original: {theirs}")
    else:
        try:
            entry["original"] = timer(theirs)
            parts.append(f"original {entry['original']:9.2f} us "
                         f"(x{entry['original'] / entry['kjit']:5.2f})")
        except Exception as error:  # noqa: BLE001 - report the original's failure
            entry["original"] = f"failed: {type(error).__name__}: {str(error)[:120]}"
            parts.append(f"original {entry['original']}")
    ROWS.append(entry)
    log(" | ".join(parts))


def merge_inputs(t, h, d, dtype=torch.bfloat16, head_major=False):
    va, vb = torch.randn(2, t, h, d, device=DEV, dtype=dtype)
    shape = (h, t) if head_major else (t, h)
    sa, sb = torch.randn(shape, device=DEV) * 4, torch.randn(shape, device=DEV) * 4
    return va, sa, vb, sb


def merges(quick, n):
    log("== merges (bf16)")
    for gpu, (t, h, d) in ((False, (1, 8, 128)), (True, (4096, 32, 128)),
                           (True, (4096, 128, 512) if not quick else (512, 128, 512))):
        shape = f"T={t} H={h} D={d}"
        va, sa, vb, sb = merge_inputs(t, h, d, head_major=True)
        out, out_lse = torch.empty_like(va), torch.empty_like(sa)
        theirs = anchor("vllm_anchor.merge_attn_states:merge_attn_states")
        measure("vllm.merge_attn_states", shape,
                lambda: vllm.merge_attn_states(out, va, sa, vb, sb, out_lse),
                theirs if isinstance(theirs, str) else
                (lambda: theirs(out, va, sa, vb, sb, out_lse)), n, gpu)
        va, sa, vb, sb = merge_inputs(t, h, d)
        vo, so = torch.empty_like(va), torch.empty_like(sa)
        measure("sglang.merge_state_v2", shape,
                lambda: sglang.merge_state_v2(va, sa, vb, sb, vo, so),
                "sgl_kernel (CUDA) not in the anchors", n, gpu)
        theirs = anchor("sglang_anchor.merge_state:merge_state")
        measure("sglang.merge_state_triton", shape,
                lambda: sglang.merge_state_triton(va, sa, vb, sb, vo, so),
                theirs if isinstance(theirs, str) else (lambda: theirs(va, sa, vb, sb, vo, so)),
                n, gpu)
        theirs = anchor("flashinfer_anchor.cascade:merge_state")
        measure("flashinfer.merge_state", shape, lambda: flashinfer.merge_state(va, sa, vb, sb),
                theirs if isinstance(theirs, str) else (lambda: theirs(va, sa, vb, sb)), n, gpu)
        theirs = anchor("flashinfer_anchor.cascade:merge_state_in_place")
        measure("flashinfer.merge_state_in_place", shape,
                lambda: flashinfer.merge_state_in_place(vo, so, vb, sb),
                theirs if isinstance(theirs, str) else (lambda: theirs(vo, so, vb, sb)), n, gpu)
        s = 4
        vs = torch.randn(t, s, h, d, device=DEV, dtype=torch.bfloat16) if gpu else \
            torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16)
        ss = torch.randn(vs.shape[:3], device=DEV)
        theirs = anchor("flashinfer_anchor.cascade:merge_states")
        measure("flashinfer.merge_states", shape + f" S={s}",
                lambda: flashinfer.merge_states(vs, ss),
                theirs if isinstance(theirs, str) else (lambda: theirs(vs, ss)), n, gpu)


def decode_inputs(b, h, hv, k, v, slots):
    return dict(mixed_qkv=torch.randn(b, 2 * h * k + hv * v, device=DEV, dtype=torch.bfloat16),
                a=torch.randn(b, hv, device=DEV, dtype=torch.bfloat16),
                b=torch.randn(b, hv, device=DEV, dtype=torch.bfloat16),
                A_log=torch.randn(hv, device=DEV) * 0.5,
                dt_bias=torch.randn(hv, device=DEV, dtype=torch.bfloat16), scale=k ** -0.5,
                initial_state=torch.randn(slots, hv, v, k, device=DEV) * 0.1,
                out=torch.empty(b, 1, hv, v, device=DEV, dtype=torch.bfloat16),
                ssm_state_indices=(torch.randperm(slots - 1, device=DEV)[:b] + 1).int(),
                use_qk_l2norm_in_kernel=True)


def decodes(quick, n):
    log("== packed GDN decode (Qwen3-Next per-rank: H=16, HV=32, K=V=128; f32 pool)")
    for gpu, b in ((False, 1), (True, 64), (True, 256 if quick else 1024)):
        args = decode_inputs(b, 16, 32, 128, 128, b + 2)
        for engine in ("vllm", "sglang"):
            mine = getattr(sys.modules[f"kjit.compat.{engine}"],
                           "fused_recurrent_gated_delta_rule_packed_decode")
            theirs = anchor(f"{engine}_anchor.fused_recurrent:"
                            "fused_recurrent_gated_delta_rule_packed_decode")
            measure(f"{engine}.fused_recurrent_gated_delta_rule_packed_decode", f"B={b}",
                    lambda: mine(**args),
                    theirs if isinstance(theirs, str) else (lambda: theirs(**args)), n, gpu)


def sigmoid_gating_decode(quick, n):
    log("== SGLang non-packed decode (q/k/v split views of the projection row)")
    for gpu, b in ((False, 1), (True, 64), (True, 256 if quick else 1024)):
        args = decode_inputs(b, 16, 32, 128, 128, b + 2)
        q, k, v = torch.split(args["mixed_qkv"], [16 * 128, 16 * 128, 32 * 128], dim=-1)
        call = dict(A_log=args["A_log"], a=args["a"], dt_bias=args["dt_bias"], softplus_beta=1.0,
                    softplus_threshold=20.0, q=q.view(1, b, 16, 128), k=k.view(1, b, 16, 128),
                    v=v.view(1, b, 32, 128), b=args["b"],
                    initial_state_source=args["initial_state"],
                    initial_state_indices=args["ssm_state_indices"],
                    cu_seqlens=torch.arange(b + 1, device=DEV, dtype=torch.int32),
                    use_qk_l2norm_in_kernel=True)
        measure("sglang.fused_sigmoid_gating_delta_rule_update", f"B={b}",
                lambda: sglang.fused_sigmoid_gating_delta_rule_update(**call),
                "SGLang's kernel is not among the anchors", n, gpu)


def fla_calls(quick, n):
    log("== fla (bf16 q/k/v, H=16, HV=32, K=V=128, varlen, K-major f32 states)")
    for gpu, lens in ((False, [1]), (True, [2048] * 4), (True, [512] * (8 if quick else 64))):
        t = sum(lens)
        q = torch.randn(1, t, 16, 128, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(1, t, 16, 128, device=DEV, dtype=torch.bfloat16)
        v = torch.randn(1, t, 32, 128, device=DEV, dtype=torch.bfloat16)
        g = -torch.rand(1, t, 32, device=DEV) * 0.1
        beta = torch.rand(1, t, 32, device=DEV)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV)
        h0 = torch.randn(len(lens), 32, 128, 128, device=DEV) * 0.1
        kw = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu,
                  use_qk_l2norm_in_kernel=True)
        for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
            if gpu and name.startswith("fused") and t > 4096:
                continue  # the recurrent original is sequential: minutes at this size
            mine = getattr(fla, name)
            theirs = anchor(f"fla.ops.gated_delta_rule:{name}")
            with torch.no_grad():
                measure(f"fla.{name}", f"N={len(lens)} T={t}",
                        lambda: mine(q, k, v, g=g, beta=beta, **kw),
                        theirs if isinstance(theirs, str) else
                        (lambda: theirs(q, k, v, g=g, beta=beta, **kw)), max(n // 10, 20), gpu)


def conv_calls(quick, n):
    log("== vLLM causal_conv1d (Qwen3-Next TP1: conv_dim D=8192, W=4, bf16, SiLU; pool "
        "[slots, W-1, D] seen as [slots, D, W-1])")
    d, w = 8192, 4
    weight = torch.randn(d, w, device=DEV, dtype=torch.bfloat16) * 0.5
    bias = torch.randn(d, device=DEV, dtype=torch.bfloat16)
    fn = anchor("vllm_anchor.causal_conv1d:causal_conv1d_fn")
    for gpu, lens in ((False, [1]), (True, [2048] * 4), (True, [512] * (8 if quick else 64))):
        t, nseq = sum(lens), len(lens)
        x = torch.randn(t, d, device=DEV, dtype=torch.bfloat16).transpose(0, 1)
        pool = torch.randn(nseq + 2, w - 1, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2)
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=DEV,
                          dtype=torch.int32)
        idx = (torch.randperm(nseq + 1, device=DEV)[:nseq] + 1).int()
        has = torch.ones(nseq, device=DEV, dtype=torch.bool)
        # (vLLM's own calls pass metadata with the Triton program lists; without it vLLM copies
        # query_start_loc to the host every call, which this row's original includes.)
        measure("vllm.causal_conv1d_fn", f"N={nseq} T={t}",
                lambda: vllm.causal_conv1d_fn(x, weight, bias, pool, cu, idx, has),
                fn if isinstance(fn, str) else (lambda: fn(x, weight, bias, pool, cu, idx, has)),
                max(n // 10, 20), gpu)
    update = anchor("vllm_anchor.causal_conv1d:causal_conv1d_update")
    for gpu, b, s in ((False, 1, 1), (True, 64, 1), (True, 256 if quick else 1024, 1),
                      (True, 64, 4)):
        cols = w - 1 if s == 1 else w - 2 + s
        pool = torch.randn(2 * b, cols, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2)
        idx = torch.randperm(2 * b, device=DEV)[:b].int()
        x = torch.randn(b, d, device=DEV, dtype=torch.bfloat16) if s == 1 else \
            torch.randn(b, s, d, device=DEV, dtype=torch.bfloat16).transpose(1, 2)
        accepted = None if s == 1 else torch.randint(1, s + 1, (b,), device=DEV).int()
        kw = dict(conv_state_indices=idx, num_accepted_tokens=accepted)
        measure("vllm.causal_conv1d_update", f"B={b} S={s}",
                lambda: vllm.causal_conv1d_update(x, pool, weight, bias, "silu", **kw),
                update if isinstance(update, str) else
                (lambda: update(x, pool, weight, bias, "silu", **kw)), n, gpu)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller GPU shapes")
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        log("compat_bench: torch sees no CUDA device; nothing to measure")
        return
    log(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"kjit torch fast path: {kjit.torch_fastpath()}")
    n = 300 if args.quick else 2000
    merges(args.quick, n)
    decodes(args.quick, n)
    sigmoid_gating_decode(args.quick, n)
    fla_calls(args.quick, n)
    conv_calls(args.quick, n)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(ROWS, f, indent=1)


if __name__ == "__main__":
    main()
