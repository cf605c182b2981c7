# SPDX-License-Identifier: Apache-2.0
"""kjit's causal_conv1d_update side by side with vLLM's Triton causal_conv1d_update, same
process, same inputs, same pool (Qwen3-Next sizes: D = 8192, W = 4, bf16, SiLU).

vLLM's code is not part of kjit: put a copy of vllm/model_executor/layers/mamba/ops/
causal_conv1d.py at bench/python/third_party/vllm_causal_conv1d.py (the folder is git-ignored),
e.g. `curl -o bench/python/third_party/vllm_causal_conv1d.py https://raw.githubusercontent.com/
vllm-project/vllm/main/vllm/model_executor/layers/mamba/ops/causal_conv1d.py`. Its vllm imports
(PAD_SLOT_ID, NULL_BLOCK_ID, triton_utils, current_platform) are stubbed here, so vLLM itself
need not be installed; torch and triton must be. Without network, the file is in vLLM's wheel:
`pip download --no-deps vllm` and `unzip -p vllm-*.whl vllm/model_executor/layers/mamba/ops/
causal_conv1d.py`.

For each B in 1, 32, 256, 2048 (S = 1, random distinct slots of a pool twice the batch, vLLM's
pool layout [slots, W-1, D] seen as [slots, D, W-1]): both outputs and both pools compared,
then the median GPU us of each over CUDA-event-timed calls with L2 flushed before each call.

Usage: python bench/python/bench_causal_conv1d_vllm.py [--json PATH]
"""

import argparse
import importlib.util
import json
import os
import statistics
import sys
import types

import torch

import kjit

HERE = os.path.dirname(os.path.abspath(__file__))
VLLM_FILE = os.path.join(HERE, "third_party", "vllm_causal_conv1d.py")
D, W = 8192, 4


def load_vllm():
    """vLLM's module with its vllm imports stubbed (PAD_SLOT_ID = -1, NULL_BLOCK_ID = 0,
    triton_utils, current_platform)."""
    if not os.path.exists(VLLM_FILE):
        return None, f"{VLLM_FILE} does not exist (see this script's docstring)"
    import triton
    import triton.language as tl

    def stub(name, **attrs):
        module = types.ModuleType(name)
        module.__path__ = []
        for key, value in attrs.items():
            setattr(module, key, value)
        sys.modules.setdefault(name, module)

    class Platform:
        """vllm.platforms.current_platform as the file asks it (newer vLLM): a CUDA device,
        no programmatic dependent launch (one kernel timed alone gains nothing from it)."""

        @staticmethod
        def is_cpu():
            return False

        @staticmethod
        def is_arch_support_pdl():
            return False

    for name in ("vllm", "vllm.attention", "vllm.attention.backends", "vllm.v1",
                 "vllm.v1.attention", "vllm.v1.attention.backends"):
        stub(name)
    stub("vllm.attention.backends.utils", PAD_SLOT_ID=-1)
    stub("vllm.v1.attention.backends.utils", PAD_SLOT_ID=-1, NULL_BLOCK_ID=0)
    stub("vllm.platforms", current_platform=Platform())
    stub("vllm.triton_utils", tl=tl, triton=triton)
    spec = importlib.util.spec_from_file_location("vllm_causal_conv1d", VLLM_FILE)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # noqa: BLE001 - any failure means: no anchor
        return None, f"vLLM's file does not import here: {error!r}"
    return module, ""


def median_us(fn, flush, reps=50):
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    args = parser.parse_args()
    vllm, why = load_vllm()
    if vllm is None:
        print(f"vLLM anchor skipped: {why}")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
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
        if vllm is not None:
            pool_v = base.clone().transpose(1, 2)
            out_v = vllm.causal_conv1d_update(x, pool_v, weight, bias, activation="silu",
                                              conv_state_indices=idx)
            torch.cuda.synchronize()
            row["max_abs_out_diff"] = (out_k.float() - out_v.float()).abs().max().item()
            row["pools_equal"] = bool(torch.equal(pool_k, pool_v))
            row["vllm_us"] = median_us(
                lambda: vllm.causal_conv1d_update(x, pool_v, weight, bias, activation="silu",
                                                  conv_state_indices=idx), flush)
        row["kjit_us"] = median_us(
            lambda: kjit.causal_conv1d_update(x, weight, pool_k, idx, bias=bias,
                                              activation="silu", out=out_k), flush)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
