# SPDX-License-Identifier: Apache-2.0
"""GPU time of one call with L2 evicted before it: the timing protocol of the Python benches.

Before each timed call a 256 MiB write evicts L2 and a GPU sleep (torch.cuda._sleep) keeps the
device busy while the host enqueues the call, so the two events bracket GPU work only. Without
the sleep, a call whose host side outlasts the flush (a Python wrapper launching several
kernels: vLLM's two Triton kernels of a decode step take ~70 us of host time, FlashQLA's
wrapper more) is charged its host time: bench_fused_decode_vllm.py's first run timed vLLM's
B = 1 step at 114 us that way. A call whose enqueueing outlasts the sleep is reported.
"""

import statistics
import time

import torch


class GpuTimer:
    SLEEP_CYCLES = 20_000_000  # ~10 ms at an H100's or H200's clocks

    def __init__(self, flush_bytes=256 << 20, log=print):
        self.flush = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        self.log = log

    def __call__(self, fn, reps=50, warmup=5):
        """Median GPU us of `fn` over `reps` calls, each after an L2 eviction."""
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            self.flush.fill_(1)
            torch.cuda._sleep(self.SLEEP_CYCLES)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            enqueued = time.perf_counter()
            fn()
            end.record()
            host_ms = (time.perf_counter() - enqueued) * 1e3
            if start.query():  # the sleep was over before the call was enqueued
                self.log(f"  (host enqueueing took {host_ms:.1f} ms, longer than the sleep)")
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)
