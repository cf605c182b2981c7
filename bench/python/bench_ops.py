# SPDX-License-Identifier: Apache-2.0
"""kjit from Python, side by side with the anchors that import in this process.

0. Reading torch tensors (ns per tensor, CPU tensors and CUDA tensors): the C++ fast path
   (kjit._kjit_torch) against the Python attribute path. `--read-only` runs only this part,
   which needs no GPU.
1. Host time per call (us, best of 5 rounds of N calls, tiny problems so the host is the
   bottleneck): torch eager op, torch stream lookups, a Triton launch, kjit ops with outputs
   given / allocated / an explicit stream, and the torch.ops.kjit custom op.
2. GPU time per call (us, median over CUDA-event-timed batches) on the C++ benchmark shapes
   (bench/*.cpp), with each anchor's time and anchor/kjit ratio (> 1: kjit faster):
   merge_state vs a Triton merge kernel written here and torch eager; gdn_decode and
   gdn_prefill vs fla (flash-linear-attention / fla-core) when it imports.

Usage: python bench/python/bench_ops.py [--quick] [--read-only] [--json PATH]
"""

import argparse
import json
import math
import statistics
import sys
import time

import torch

import kjit

DEV = "cuda"
RESULTS = {"host_us": {}, "read_ns_per_tensor": {}, "gpu": []}


def log(text=""):
    print(text, flush=True)


# --- host overhead -----------------------------------------------------------------------------


def host_us(fn, n, rounds=5):
    for _ in range(200):
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


def try_triton():
    try:
        import triton
        import triton.language as tl
    except Exception as error:  # noqa: BLE001 - any failure means: no anchor
        return None, f"triton does not import: {error}"

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offsets, tl.load(src + offsets, mask=offsets < n), mask=offsets < n)

    @triton.jit
    def merge_kernel(va, sa, vb, sb, vo, so, D: tl.constexpr, LN_BASE: tl.constexpr):
        # One program per (token, head) row of contiguous [T, H, D] / [T, H]; base-e or base-2
        # LSE via LN_BASE; an empty state (-inf) gets weight 0.
        row = tl.program_id(0)
        a = tl.load(sa + row)
        b = tl.load(sb + row)
        m = tl.maximum(a, b)
        safe = tl.where(m == float("-inf"), 0.0, m)
        wa = tl.exp((a - safe) * LN_BASE)
        wb = tl.exp((b - safe) * LN_BASE)
        total = wa + wb
        offs = tl.arange(0, D)
        x = tl.load(va + row * D + offs).to(tl.float32)
        y = tl.load(vb + row * D + offs).to(tl.float32)
        out = tl.where(total > 0, (x * wa + y * wb) / total, 0.0)
        tl.store(vo + row * D + offs, out.to(vo.dtype.element_ty))
        tl.store(so + row, tl.where(total > 0, safe + tl.log(total) / LN_BASE, float("-inf")))

    return (triton, copy_kernel, merge_kernel), ""


def host_section(n, triton_parts):
    log("== host time per call (us): best of 5 rounds of %d calls" % n)
    x = torch.randn(128, device=DEV)
    y, z = torch.randn_like(x), torch.empty_like(x)
    rows = [("torch.add(out=) eager", lambda: torch.add(x, y, out=z)),
            ("torch.cuda.current_stream().cuda_stream",
             lambda: torch.cuda.current_stream().cuda_stream)]
    if hasattr(torch._C, "_cuda_getCurrentRawStream"):
        rows.append(("torch._C._cuda_getCurrentRawStream(0)",
                     lambda: torch._C._cuda_getCurrentRawStream(0)))
    if triton_parts is not None:
        _, copy_kernel, _ = triton_parts
        rows.append(("triton launch (copy 128)",
                     lambda: copy_kernel[(1,)](x, z, 128, BLOCK=128)))
    t, h, d = 1, 8, 128
    v_a = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16)
    v_b, v_o = torch.randn_like(v_a), torch.empty_like(v_a)
    s_a, s_b, s_o = (torch.randn(t, h, device=DEV) for _ in range(3))
    raw = torch.cuda.current_stream().cuda_stream
    rows += [
        ("kjit.merge_state, outputs given",
         lambda: kjit.merge_state(v_a, s_a, v_b, s_b, v_o, s_o, lse_base="e")),
        ("kjit.merge_state, stream=int given",
         lambda: kjit.merge_state(v_a, s_a, v_b, s_b, v_o, s_o, lse_base="e", stream=raw)),
        ("kjit.merge_state, every option as keyword",
         lambda: kjit.merge_state(v_a, s_a, v_b, s_b, v_out=v_o, s_out=s_o, lse_base="e",
                                  lse_layout="token_major", pos_inf_as_empty=True, mode="",
                                  stream=raw)),
        ("kjit.merge_state, outputs allocated",
         lambda: kjit.merge_state(v_a, s_a, v_b, s_b, lse_base="e")),
        ("kjit.merge_state_in_place",
         lambda: kjit.merge_state_in_place(v_o, s_o, v_b, s_b, lse_base="e")),
    ]
    b, hh, hv, kd = 1, 16, 32, 128
    qkv = torch.randn(b, 2 * hh * kd + hv * kd, device=DEV, dtype=torch.bfloat16)
    ga, gb = (torch.randn(b, hv, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    a_log, dt_bias = torch.randn(hv, device=DEV), torch.randn(hv, device=DEV,
                                                               dtype=torch.bfloat16)
    pool = torch.zeros(4, hv, kd, kd, device=DEV)
    idx = torch.zeros(b, device=DEV, dtype=torch.int32)
    out = torch.empty(b, hv, kd, device=DEV, dtype=torch.bfloat16)
    rows.append(("kjit.gdn_decode B=1, out given",
                 lambda: kjit.gdn_decode(qkv, ga, gb, a_log, dt_bias, pool, idx, out)))
    if hasattr(torch.ops, "kjit") and hasattr(torch.ops.kjit, "merge_state"):
        rows.append(("torch.ops.kjit.merge_state (custom op)",
                     lambda: torch.ops.kjit.merge_state(v_a, s_a, v_b, s_b, "e")))
    fast = kjit._kjit._torch_fastpath()
    if fast:
        # The same calls with the fast path off: what the C++ tensor reader saves per call.
        rows += [
            ("kjit.merge_state, outputs given (attr path)",
             lambda: kjit.merge_state(v_a, s_a, v_b, s_b, v_o, s_o, lse_base="e")),
            ("kjit.gdn_decode B=1, out given (attr path)",
             lambda: kjit.gdn_decode(qkv, ga, gb, a_log, dt_bias, pool, idx, out)),
        ]
    for name, fn in rows:
        kjit._kjit._torch_fastpath(fast and not name.endswith("(attr path)"))
        try:
            us = host_us(fn, n)
        except Exception as error:  # noqa: BLE001 - report and keep going
            log(f"  {name:45s} FAILED: {type(error).__name__}: {error}")
            continue
        finally:
            kjit._kjit._torch_fastpath(fast)
        RESULTS["host_us"][name] = us
        log(f"  {name:45s} {us:7.2f}")


# --- tensor reading ----------------------------------------------------------------------------


def read_ns(args, n, rounds=5):
    """Best-of-rounds ns per _read_args_for_bench(*args) call (reads only, no launch)."""
    read = kjit._kjit._read_args_for_bench
    for _ in range(200):
        read(*args)
    best = math.inf
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            read(*args)
        best = min(best, (time.perf_counter() - start) / n * 1e9)
    return best


def read_section(n, device="cpu"):
    """ns per torch tensor the binding spends reading it, through the C++ fast path
    (kjit._kjit_torch) and through the Python attribute path: the slope between reading 8
    tensors and none in one call, so that the call itself is not counted."""
    fast_available = kjit._kjit._torch_fastpath()
    log(f"== reading torch tensors ({device}): ns per tensor, best of 5 rounds of {n} calls; "
        f"fast path {'loaded' if fast_available else 'NOT loaded: ' + str(kjit.torch_fastpath_error)}")
    tensors = [torch.empty(4, 8, 16, device=device, dtype=torch.bfloat16)[:, ::2]
               for _ in range(8)]
    paths = [("fast path (kjit._kjit_torch)", True)] if fast_available else []
    paths.append(("attribute path (fallback)", False))
    try:
        for name, enable in paths:
            kjit._kjit._torch_fastpath(enable)
            empty = read_ns((), n)
            eight = read_ns(tensors, n)
            per = (eight - empty) / len(tensors)
            RESULTS["read_ns_per_tensor"][f"{device} {name}"] = per
            log(f"  {name:45s} {per:7.1f} ns/tensor  (call with 8: {eight / 1000:.2f} us, "
                f"with 0: {empty / 1000:.2f} us)")
    finally:
        kjit._kjit._torch_fastpath(fast_available)


# --- GPU time ----------------------------------------------------------------------------------


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


def row(op, shape, kjit_us, anchors):
    parts = [f"{op:11s} {shape:34s} kjit {kjit_us:9.2f} us"]
    entry = {"op": op, "shape": shape, "kjit_us": kjit_us, "anchors": {}}
    for name, us in anchors.items():
        if isinstance(us, str):
            parts.append(f"{name}: {us}")
            continue
        entry["anchors"][name] = us
        parts.append(f"{name} {us:9.2f} us (x{us / kjit_us:5.2f})")
    RESULTS["gpu"].append(entry)
    log(" | ".join(parts))


def merge_section(quick, triton_parts):
    log("== merge_state bf16, GPU us; (xR) = anchor / kjit")
    shapes = [(64, 32, 128), (4096, 32, 128), (16384, 128, 128), (4096, 128, 256)]
    if not quick:
        shapes += [(1, 8, 64), (64, 256, 128), (16384, 256, 512)]
    for t, h, d in shapes:
        v_a = torch.randn(t, h, d, device=DEV, dtype=torch.bfloat16)
        v_b, v_o = torch.randn_like(v_a), torch.empty_like(v_a)
        s_a, s_b, s_o = (torch.randn(t, h, device=DEV) for _ in range(3))
        k_us = gpu_us(lambda: kjit.merge_state(v_a, s_a, v_b, s_b, v_o, s_o, lse_base="e"))
        anchors = {}
        if triton_parts is not None:
            _, _, merge_kernel = triton_parts
            t_o = torch.empty_like(v_a)
            t_s = torch.empty_like(s_a)
            call = lambda: merge_kernel[(t * h,)](v_a, s_a, v_b, s_b, t_o, t_s, D=d,  # noqa: E731
                                                   LN_BASE=1.0)
            anchors["triton"] = gpu_us(call)
            torch.cuda.synchronize()
            err = (t_o.float() - v_o.float()).abs().max().item()
            if err > 0.05:
                anchors["triton"] = f"DISAGREES with kjit (max |diff| {err:.3g})"

        def eager():
            m = torch.maximum(s_a, s_b)
            wa, wb = torch.exp(s_a - m), torch.exp(s_b - m)
            tot = wa + wb
            return (v_a.float() * (wa / tot)[..., None] + v_b.float() * (wb / tot)[..., None]
                    ).to(v_a.dtype), m + torch.log(tot)

        anchors["torch eager"] = gpu_us(eager)
        row("merge_state", f"T={t} H={h} D={d}", k_us, anchors)


def try_fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
        return (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule), ""
    except Exception as error:  # noqa: BLE001
        return None, f"fla does not import ({type(error).__name__}: {error})"


def decode_section(quick, fla):
    log("== gdn_decode H=16 K=V=128 bf16, f32 state pool, GPU us")
    h, kd = 16, 128
    batches = [1, 32, 256, 2048] if quick else [1, 8, 32, 256, 1024, 2048]
    for hv in (32, 64):
        for b in batches:
            qkv = torch.randn(b, 2 * h * kd + hv * kd, device=DEV, dtype=torch.bfloat16)
            a, bb = (torch.randn(b, hv, device=DEV, dtype=torch.bfloat16) for _ in range(2))
            a_log = torch.randn(hv, device=DEV)
            dt_bias = torch.randn(hv, device=DEV, dtype=torch.bfloat16)
            pool = torch.randn(b + 1, hv, kd, kd, device=DEV) * 0.01
            idx = torch.randperm(b + 1, device=DEV)[:b].to(torch.int32)
            out = torch.empty(b, hv, kd, device=DEV, dtype=torch.bfloat16)
            k_us = gpu_us(lambda: kjit.gdn_decode(qkv, a, bb, a_log, dt_bias, pool, idx, out))
            anchors = {}
            if fla is None:
                anchors["fla"] = "unavailable"
            elif b * hv > 65535:
                # fla's recurrent kernel launches grid (.., B*HV) and faults past 65535 (an
                # illegal address that poisons the process's context): not run.
                anchors["fla"] = f"not run: B*HV = {b * hv} > 65535 faults in fla"
            else:
                try:
                    # fla's recurrent kernel on [1, B, ...] tokens is not a pooled decode; as the
                    # closest public form: B sequences of one token, states passed densely.
                    q = qkv[:, :h * kd].reshape(b, 1, h, kd).repeat_interleave(hv // h, 2)
                    k = qkv[:, h * kd:2 * h * kd].reshape(b, 1, h, kd).repeat_interleave(
                        hv // h, 2)
                    v = qkv[:, 2 * h * kd:].reshape(b, 1, hv, kd)
                    g = (-torch.exp(a_log) * torch.nn.functional.softplus(
                        a.float() + dt_bias.float())).reshape(b, 1, hv)
                    beta = torch.sigmoid(bb.float()).reshape(b, 1, hv).to(torch.bfloat16)
                    init = pool[:b].clone()
                    call = lambda: fla[1](q, k, v, g, beta, scale=kd ** -0.5,  # noqa: E731
                                          initial_state=init, output_final_state=True,
                                          use_qk_l2norm_in_kernel=True)
                    anchors["fla fused_recurrent (dense states)"] = gpu_us(call)
                except Exception as error:  # noqa: BLE001
                    anchors["fla"] = f"failed: {type(error).__name__}: {error}"[:120]
            row("gdn_decode", f"B={b} HV={hv}", k_us, anchors)


def prefill_section(quick, fla):
    log("== gdn_prefill K=V=128 bf16, f32 state, raw gates, GPU us")
    shapes = [(16, 16, 8192, 4), (16, 32, 8192, 4)]
    if not quick:
        shapes += [(16, 16, 32768, 16), (16, 32, 32768, 16)]
    kd = 128
    for h, hv, t, n in shapes:
        q = torch.randn(t, h, kd, device=DEV, dtype=torch.bfloat16)
        k = torch.randn(t, h, kd, device=DEV, dtype=torch.bfloat16)
        v = torch.randn(t, hv, kd, device=DEV, dtype=torch.bfloat16)
        a, b = (torch.randn(t, hv, device=DEV, dtype=torch.bfloat16) for _ in range(2))
        a_log, dt_bias = torch.randn(hv, device=DEV), torch.randn(hv, device=DEV)
        cu = torch.linspace(0, t, n + 1, device=DEV).round().to(torch.int32)
        pool = torch.randn(n, hv, kd, kd, device=DEV) * 0.01
        idx = torch.arange(n, device=DEV, dtype=torch.int32)
        out = torch.empty(t, hv, kd, device=DEV, dtype=torch.bfloat16)
        k_us = gpu_us(lambda: kjit.gdn_prefill(q, k, v, cu, pool, idx, a=a, b=b, a_log=a_log,
                                               dt_bias=dt_bias, out=out), iters=5, reps=5)
        anchors = {}
        if fla is None:
            anchors["fla"] = "unavailable"
        else:
            try:
                rep = hv // h
                fq = q.repeat_interleave(rep, 1)[None]
                fk = k.repeat_interleave(rep, 1)[None]
                g = (-torch.exp(a_log) * torch.nn.functional.softplus(
                    a.float() + dt_bias)).to(torch.float32)[None]
                beta = torch.sigmoid(b.float()).to(torch.bfloat16)[None]
                init = pool.clone()
                call = lambda: fla[0](fq, fk, v[None], g, beta, scale=kd ** -0.5,  # noqa: E731
                                      initial_state=init, output_final_state=True,
                                      cu_seqlens=cu.long(), use_qk_l2norm_in_kernel=True)
                anchors["fla chunk"] = gpu_us(call, iters=5, reps=5)
            except Exception as error:  # noqa: BLE001
                anchors["fla"] = f"failed: {type(error).__name__}: {error}"[:120]
        row("gdn_prefill", f"H={h} HV={hv} T={t} N={n}", k_us, anchors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--calls", type=int, default=20000, help="calls per host-time round")
    parser.add_argument("--read-only", action="store_true",
                        help="only the tensor-reading section (runs without a GPU)")
    parser.add_argument("--host-only", action="store_true",
                        help="only tensor reading and host time per call (no GPU-time shapes)")
    args = parser.parse_args()
    read_section(args.calls)
    if args.read_only:
        return 0
    if not torch.cuda.is_available():
        log("SKIPPED (the rest): torch sees no CUDA device")
        return 0
    log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"python {sys.version.split()[0]}")
    triton_parts, why = try_triton()
    if triton_parts is None:
        log(f"triton anchor unavailable: {why}")
    fla, why = try_fla()
    if fla is None:
        log(f"fla anchor unavailable: {why}")
    read_section(args.calls, DEV)
    host_section(args.calls, triton_parts)
    if not args.host_only:
        run_gpu_sections(args.quick, triton_parts, fla)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1)
    host = RESULTS["host_us"]
    key = "kjit.merge_state, outputs given"
    if key in host:
        log(f"summary: kjit host {host[key]:.2f} us/call (goal <= 5.0), "
            f"torch eager {host.get('torch.add(out=) eager', float('nan')):.2f}, "
            f"triton {host.get('triton launch (copy 128)', float('nan')):.2f}")
    return 0


def run_gpu_sections(quick, triton_parts, fla):
    merge_section(quick, triton_parts)
    decode_section(quick, fla)
    prefill_section(quick, fla)


if __name__ == "__main__":
    sys.exit(main())
