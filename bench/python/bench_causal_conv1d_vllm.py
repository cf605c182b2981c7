# SPDX-License-Identifier: Apache-2.0
"""kjit's causal_conv1d_update side by side with vLLM's Triton causal_conv1d_update, same
process, same inputs, same pool (Qwen3-Next sizes: D = 8192, W = 4, bf16, SiLU).

vLLM's code is not part of kjit: scripts/fetch_vllm_anchors.sh lays out its causal_conv1d.py
(from a vLLM wheel, with a stub for the vllm.* names it imports) as vllm_anchor.causal_conv1d
under .anchors, which KJIT_ANCHORS_DIR names here, as for the compat tests and compat_bench.py;
torch and triton must be installed, vLLM need not be.

For each B in 1, 32, 256, 2048 (S = 1, random distinct slots of a pool twice the batch, vLLM's
pool layout [slots, W-1, D] seen as [slots, D, W-1]): both outputs and both pools compared,
then the median GPU us of each over CUDA-event-timed calls with L2 flushed before each call
(gpu_timer.py: the events bracket GPU work only).

Usage: KJIT_ANCHORS_DIR=.anchors python bench/python/bench_causal_conv1d_vllm.py [--json PATH]
"""

import argparse
import json

import torch

import kjit
from compat_bench import anchor  # (this folder: KJIT_ANCHORS_DIR's originals, or why not)
from gpu_timer import GpuTimer  # (this folder: GPU time only, L2 evicted before each call)

D, W = 8192, 4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    update = anchor("vllm_anchor.causal_conv1d:causal_conv1d_update")
    if isinstance(update, str):
        print(f"vLLM anchor skipped: {update} (scripts/fetch_vllm_anchors.sh)")
        update = None
    timer = GpuTimer()
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(D, W, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5
    bias = torch.randn(D, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows = []
    for batch in (1, 32, 256, 2048):
        slots = 2 * batch + 1
        base = torch.randn(slots, W - 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        idx = (torch.randperm(slots - 1, device="cuda", generator=gen)[:batch] + 1).to(torch.int32)
        x = torch.randn(batch, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        pool_k = base.clone().transpose(1, 2)  # [slots, D, W-1] view of [slots, W-1, D]
        out_k = kjit.causal_conv1d_update(x, weight, pool_k, idx, bias=bias, activation="silu")
        row = {"batch": batch, "dim": D, "width": W}
        if update is not None:
            pool_v = base.clone().transpose(1, 2)
            out_v = update(x, pool_v, weight, bias, activation="silu", conv_state_indices=idx)
            torch.cuda.synchronize()
            row["max_abs_out_diff"] = (out_k.float() - out_v.float()).abs().max().item()
            row["pools_equal"] = bool(torch.equal(pool_k, pool_v))
            row["vllm_us"] = timer(
                lambda: update(x, pool_v, weight, bias, activation="silu", conv_state_indices=idx))
        row["kjit_us"] = timer(
            lambda: kjit.causal_conv1d_update(x, weight, pool_k, idx, bias=bias,
                                              activation="silu", out=out_k))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
