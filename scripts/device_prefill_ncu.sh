#!/usr/bin/env bash
# For the GPU machine: Nsight Compute on one launch of kjit's warp-specialized gdn_prefill kernel
# and one of an anchor's kernel (KJIT_PREFILL_ANCHOR_LIB, e.g. FlashInfer's SM90 kernel) on the
# same shape, and a table of what each does per chunk (per block and 64-token chunk): warp
# instructions, shared-memory and global instructions, IPC, pipe activity, stall mix
# (docs/performance.md, "A cost per call or per step, FlashInfer's kernel in Nsight Compute").
# Needs .deps carried (scripts/fetch_deps.sh) and the anchor library.
# Knobs: KJIT_NCU_SHAPE (H/HV/SEQSxLEN, equal lengths; default 16/16/16x8192),
# KJIT_NCU_ANCHOR_KERNEL (a regex of the anchor's kernel name; default device_kernel, CUTLASS's).
# The raw metrics, details and per-instruction source pages go to $OUT (ncu_<who>_*.csv); last, kjit's
# roles by instruction (scripts/ncu_source_top.py, KJIT_NCU_TOP lines a role).
# Usage: KJIT_PREFILL_ANCHOR_LIB=$PWD/.anchors/fi/libkjit_fi_prefill.so bash scripts/device_prefill_ncu.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/deps
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
command -v ncu >/dev/null || { echo "ncu is not on PATH: nothing measured"; exit 1; }
[ -n "${KJIT_PREFILL_ANCHOR_LIB:-}" ] || echo "KJIT_PREFILL_ANCHOR_LIB unset: kjit's kernel only"
shape=${KJIT_NCU_SHAPE:-16/16/16x8192}

build=/tmp/kjit-ncu-build
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKJIT_WERROR=OFF \
  -DCMAKE_PREFIX_PATH=/tmp/deps/usr >"$out/ncu_configure.log" 2>&1 &&
  cmake --build "$build" --target bench_gdn_prefill -- -j16 >"$out/ncu_build.log" 2>&1 ||
  { tail -20 "$out/ncu_build.log"; exit 1; }

# The few-sequences table on the one shape, the ws kernel forced: kjit's launches are the
# bench's check (1), then the shape's warm-up calls; the anchor's all run on the shape.
run_ncu() {  # who, kernel regex, launches skipped
  KJIT_LOG=warn KJIT_CACHE_DIR=/tmp/kjit-ncu-cache KJIT_PREFILL_BENCH_FEW_ONLY=1 \
    KJIT_PREFILL_BENCH_FORCE=chunked_ws KJIT_PREFILL_BENCH_FEW_SHAPES="$shape" \
    timeout 300 ncu --clock-control none --set full --import-source no -k "$2" --launch-skip "$3" \
    --launch-count 1 -f -o "/tmp/kjit-ncu-$1" "$build/bench/bench_gdn_prefill" \
    >"$out/ncu_$1.log" 2>&1 || { tail -5 "$out/ncu_$1.log"; return 1; }
  ncu -i "/tmp/kjit-ncu-$1.ncu-rep" --page raw --csv >"$out/ncu_$1_raw.csv" 2>/dev/null
  ncu -i "/tmp/kjit-ncu-$1.ncu-rep" --page details --csv >"$out/ncu_$1_details.csv" 2>/dev/null
  ncu -i "/tmp/kjit-ncu-$1.ncu-rep" --page source --csv --print-source sass \
    >"$out/ncu_$1_source.csv" 2>/dev/null
}
run_ncu kjit regex:gdn_prefill_ws 2 || exit 1
whos=kjit
if [ -n "${KJIT_PREFILL_ANCHOR_LIB:-}" ]; then
  run_ncu anchor "regex:${KJIT_NCU_ANCHOR_KERNEL:-device_kernel}" 3 && whos="kjit anchor"
fi

KJIT_SCRIPTS="$root/scripts" python3 - "$out" "$shape" $whos <<'PY'
import csv, os, re, sys

sys.path.insert(0, os.environ["KJIT_SCRIPTS"])
from ncu_source_top import number, read_source, stall_mix  # the pages, read as the script does

out, shape, whos = sys.argv[1], sys.argv[2], sys.argv[3:]
heads, value_heads, seqs, length = map(int, re.split(r"[/x]", shape))
chunks = seqs * value_heads * ((length + 63) // 64)  # (block, chunk) pairs


# Units as ncu prints them in the raw page's second row, to seconds, bytes and hertz.
SCALE = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6,
         "Gbyte": 1e9, "Tbyte": 1e12, "hz": 1.0, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9}


def raw(who):
    rows = list(csv.reader(open(f"{out}/ncu_{who}_raw.csv", errors="replace")))
    return {h: number(v) * SCALE.get(u, 1.0) for h, u, v in zip(rows[0], rows[1], rows[2])}


def stalls(who):
    code, _, _, reasons = read_source(f"{out}/ncu_{who}_source.csv")
    mix = stall_mix(code, reasons)
    total = sum(mix.values()) or 1.0
    return ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in mix.most_common(5))


lines = [
    ("duration (us)", lambda m: m["gpu__time_duration.sum"] * 1e6),
    ("SM clock (GHz)", lambda m: m["smsp__cycles_elapsed.avg.per_second"] / 1e9),
    ("warp instructions a chunk", lambda m: m["smsp__inst_executed.sum"] / chunks),
    ("shared loads a chunk", lambda m: m["smsp__sass_inst_executed_op_shared_ld.sum"] / chunks),
    ("shared stores a chunk", lambda m: m["smsp__sass_inst_executed_op_shared_st.sum"] / chunks),
    ("stmatrix a chunk", lambda m: m["smsp__inst_executed_op_shared_stsm.sum"] / chunks),
    ("shared wavefronts a chunk", lambda m: m["l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"] / chunks),
    ("global store requests a chunk", lambda m: m["l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"] / chunks),
    ("LDGSTS a chunk", lambda m: m["smsp__inst_executed_op_ldgsts.sum"] / chunks),
    ("IPC (active)", lambda m: m["sm__inst_executed.avg.per_cycle_active"]),
    ("tensor pipe active (%)", lambda m: m["sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"]),
    ("l1tex throughput (%)", lambda m: m["l1tex__throughput.avg.pct_of_peak_sustained_active"]),
    ("DRAM read + write (GB)", lambda m: (m["dram__bytes_read.sum"] + m["dram__bytes_write.sum"]) / 1e9),
]
metrics = {who: raw(who) for who in whos}
print(f"per chunk = per (block, 64-token chunk), {chunks} of them; shape {shape}")
print(f"{'':32s}" + "".join(f"{w:>14s}" for w in whos))
for name, f in lines:
    cells = []
    for who in whos:
        try:
            cells.append(f"{f(metrics[who]):14.2f}")
        except (KeyError, ZeroDivisionError):
            cells.append(f"{'-':>14s}")
    print(f"{name:32s}" + "".join(cells))
for who in whos:
    print(f"stalls {who}: {stalls(who)}")
PY
# Where kjit's roles stall, by instruction (the SASS index is kjit inspect --sass's).
python3 "$root/scripts/ncu_source_top.py" "$out/ncu_kjit_source.csv" "${KJIT_NCU_TOP:-8}"
