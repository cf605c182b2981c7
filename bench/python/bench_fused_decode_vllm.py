# SPDX-License-Identifier: Apache-2.0
"""kjit's fused decode step (gdn_decode with the conv update inside, one kernel) beside vLLM's two
Triton kernels for the same step (causal_conv1d_update, then fused_recurrent_gated_delta_rule_
packed_decode), and beside kjit's own two kernels (causal_conv1d_update + gdn_decode): same
process, same inputs, same pools (issue 22's "against vLLM's two Triton kernels").

Qwen3-Next per rank: H = 16, HV = 32, K = V = 128, conv width 4 over mixed_qkv's 8192 channels,
bf16 mixed_qkv and conv pool (vLLM's [slots, W-1, D] seen as [slots, D, W-1]), f32 state pool
[slots, HV, V, K], random distinct slots >= 1 of a pool twice the batch (vLLM 0.34 treats slot 0
as a null block). Each path runs on its own copy of both pools; the outputs and both pools are
compared (bf16 tolerance), then each path is timed: median GPU us over CUDA-event-timed calls,
L2 flushed before each and the GPU kept asleep while the call is enqueued (gpu_timer.py), so
the events bracket GPU work only, not the host time of vLLM's two Python launches (the kernels'
own durations: bench_gdn_decode with KJIT_BENCH_CUPTI=1).

vLLM's kernels come from KJIT_ANCHORS_DIR (scripts/fetch_vllm_anchors.sh lays them out); without
them only kjit's two forms are timed.

Usage: KJIT_ANCHORS_DIR=.anchors python bench/python/bench_fused_decode_vllm.py [--json PATH]
"""

import argparse
import json

import torch

import kjit
from compat_bench import anchor  # (this folder: KJIT_ANCHORS_DIR's originals, or why not)
from gpu_timer import GpuTimer  # (this folder: GPU time only, L2 evicted before each call)

H, HV, K, V, W = 16, 32, 128, 128, 4
D = 2 * H * K + HV * V


def close(name, got, want, tol):
    """The largest |got - want| over tol (1 + |want|); fails the run past 1."""
    worst = ((got.double() - want.double()).abs() / (tol * (1 + want.double().abs()))).max().item()
    if not worst <= 1.0:
        raise SystemExit(f"{name}: differs from kjit's two kernels by {worst:.3g} tolerances")
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    vllm = (anchor("vllm_anchor.causal_conv1d:causal_conv1d_update"),
            anchor("vllm_anchor.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode"))
    why = [x for x in vllm if isinstance(x, str)]
    if why:
        print(f"vLLM's kernels skipped: {why[0]} (scripts/fetch_vllm_anchors.sh)")
        vllm = None
    timer = GpuTimer()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    weight, bias = randn(D, W, scale=0.5), randn(D)
    a_log, dt_bias = randn(HV, dtype=torch.float32, scale=0.5), randn(HV)
    print(f"fused decode step: H={H} HV={HV} K=V={K} W={W} D={D}, bf16 mixed_qkv and conv pool, "
          "f32 state; median GPU us (gpu_timer.py: events around GPU work only, L2 flushed)")
    print(f"{'B':>5} | {'kjit fused':>10} | {'kjit conv + decode':>18} | {'vLLM conv + decode':>18}"
          f" | {'vLLM / fused':>12}")
    rows = []
    for batch in (1, 32, 256):
        slots = 2 * batch + 1
        idx = (torch.randperm(slots - 1, device="cuda", generator=gen)[:batch] + 1).int()
        x = randn(batch, D)
        a, b = randn(batch, HV), randn(batch, HV)
        conv_base = randn(slots, W - 1, D)
        state_base = randn(slots, HV, V, K, dtype=torch.float32, scale=0.1)
        scale = K ** -0.5

        def pools():
            return conv_base.clone().transpose(1, 2), state_base.clone()

        # kjit, fused: mixed_qkv before the convolution, both pools updated in one kernel.
        conv_f, state_f = pools()
        out_f = torch.empty(batch, HV, V, device="cuda", dtype=torch.bfloat16)

        def fused():
            kjit.gdn_decode(x, a, b, a_log, dt_bias, state_f, idx, out=out_f, scale=scale,
                            conv_weight=weight, conv_bias=bias, conv_state=conv_f)

        # kjit, two kernels.
        conv_t, state_t = pools()
        out_t = torch.empty(batch, HV, V, device="cuda", dtype=torch.bfloat16)
        qkv_t = torch.empty_like(x)  # (preallocated, as vLLM's path below)

        def two():
            kjit.causal_conv1d_update(x, weight, conv_t, idx, bias=bias, activation="silu",
                                      out=qkv_t)
            kjit.gdn_decode(qkv_t, a, b, a_log, dt_bias, state_t, idx, out=out_t, scale=scale)

        fused()
        two()
        torch.cuda.synchronize()
        row = {"batch": batch,
               "fused_vs_two": close("kjit fused", out_f, out_t, 1 / 64),
               "pools_equal": bool(torch.equal(conv_f, conv_t))}
        close("kjit fused state", state_f, state_t, 1e-3)
        if vllm is not None:
            conv_update, packed_decode = vllm
            conv_v, state_v = pools()
            out_v = torch.empty(batch, 1, HV, V, device="cuda", dtype=torch.bfloat16)
            qkv_v = torch.empty_like(x)

            def theirs():
                conv_update(x, conv_v, weight, bias, activation="silu", conv_state_indices=idx,
                            out=qkv_v)
                packed_decode(mixed_qkv=qkv_v, a=a, b=b, A_log=a_log, dt_bias=dt_bias, scale=scale,
                              initial_state=state_v, out=out_v, ssm_state_indices=idx,
                              use_qk_l2norm_in_kernel=True)

            theirs()
            torch.cuda.synchronize()
            row["vllm_vs_kjit"] = close("vLLM", out_v.view(batch, HV, V), out_t, 1 / 64)
            # (vLLM's conv rounds its outputs to bf16 at other elements than kjit's, one bf16 step
            # apart: the step's state then differs by up to that step's effect, not 1e-3.)
            row["vllm_state_vs_kjit"] = close("vLLM state", state_v, state_t, 1 / 64)
            row["vllm_conv_pool_equal"] = bool(torch.equal(conv_v, conv_t))
        row["fused_us"] = timer(fused)
        row["two_us"] = timer(two)
        if vllm is not None:
            row["vllm_us"] = timer(theirs)
        vllm_text = f"{row['vllm_us']:18.2f}" if "vllm_us" in row else f"{'-':>18}"
        ratio = f"{row['vllm_us'] / row['fused_us']:11.2f}x" if "vllm_us" in row else f"{'-':>12}"
        print(f"{batch:5d} | {row['fused_us']:10.2f} | {row['two_us']:18.2f} | {vllm_text} | "
              f"{ratio}")
        rows.append(row)
    for row in rows:
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
