#!/usr/bin/env bash
# For the GPU machine: where the warp-specialized gdn_prefill kernel's warps stall, by stretch of
# its chunk loop (docs/performance.md, "Where the warpgroups wait"). Builds a copy of the tree with
# KJIT_GDN_WS_PROFILE 1 (whose clock reads mark the stretches in the SASS), runs Nsight Compute's
# stall sampling on one call of 128k tokens, H = HV = 16, 16 sequences (`bench_gdn_prefill x
# profile`, the ws kernel forced), and prints per region between two clock reads (SASS order):
# its instructions, its share of the warp samples and its top stall reasons; then the stall mix
# of each role and the kernel's issue figures. Region k holds the code before the k-th clock
# read; in the builds measured so far the state role's reads come first in loop order (full,
# chunk_ready, inverse x 3, S products, chunk_ready, R, t_ready, Vn, O + update, store; a
# q norms read before chunk_ready until the norms moved to the chunk warpgroup) and the chunk
# warpgroup's after them (full, empty + fill, q norms, products, k norms, decay, t_ready, A stores):
# check that against the instruction counts before reading a region by its name.
# Needs .deps carried (scripts/fetch_deps.sh). Knobs: KJIT_STALLS_SRC (default
# /tmp/kjit-stalls-src), KJIT_STALLS_SKIP (launches of the kernel skipped before the profiled
# one, default 1: the first call compiles and touches the buffers). The per-instruction table
# goes to $OUT/ws_stalls_source.csv.
# Usage: bash scripts/device_ws_stalls.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
src=${KJIT_STALLS_SRC:-/tmp/kjit-stalls-src}
mkdir -p "$out" /tmp/deps
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
command -v ncu >/dev/null || { echo "ncu is not on PATH: nothing measured"; exit 1; }

# shellcheck source=lib.sh
source "$root/scripts/lib.sh"
kjit_ws_profile_build "$src" "$src/build" "$out/ws_stalls" || exit 1

cd "$src/build" || exit 1
report=/tmp/kjit-ws-stalls
KJIT_LOG=warn KJIT_CACHE_DIR=/tmp/kjit-stalls-cache KJIT_PREFILL_BENCH_FORCE=chunked_ws \
  timeout 300 ncu --clock-control none --set full --import-source no -k regex:gdn_prefill_ws \
  --launch-skip "${KJIT_STALLS_SKIP:-1}" --launch-count 1 -f -o "$report" \
  ./bench/bench_gdn_prefill /tmp/kjit-ws-stalls.jsonl profile >"$out/ws_stalls_ncu.log" 2>&1 ||
  { tail -5 "$out/ws_stalls_ncu.log"; exit 1; }
ncu -i "$report.ncu-rep" --page source --csv --print-source sass >"$out/ws_stalls_source.csv" ||
  exit 1
ncu -i "$report.ncu-rep" --page details --csv >"$out/ws_stalls_details.csv" 2>/dev/null

python3 - "$out/ws_stalls_source.csv" "$out/ws_stalls_details.csv" <<'PY'
import collections, csv, sys

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next(i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r])
hdr = [c.strip() for c in rows[head]]
source, samples = hdr.index("Source"), hdr.index("Warp Stall Sampling (All Samples)")
reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


body = [r for r in rows[head + 1:] if len(r) > source]
regions = [[]]
for r in body:
    regions[-1].append(r)
    if "CLOCK" in r[source]:
        regions.append([])
total = sum(num(r[samples]) for r in body) or 1.0
print(f"{len(regions) - 1} clock reads; {total:.0f} warp samples")
for k, region in enumerate(regions):
    s = sum(num(r[samples]) for r in region)
    mix = collections.Counter()
    for r in region:
        for i in reasons:
            mix[hdr[i]] += num(r[i])
    top = ", ".join(f"{h[6:]} {100 * v / (s or 1):.0f}%" for h, v in mix.most_common(3))
    print(f"R{k:02d} {len(region):5d} instr {100 * s / total:5.1f}% of samples: {top}")
mix = collections.Counter()
for r in body:
    for i in reasons:
        mix[hdr[i]] += num(r[i])
print("whole kernel: " + ", ".join(f"{h[6:]} {100 * v / total:.1f}%" for h, v in mix.most_common(8)))
wanted = ("Duration", "Issue Slots Busy", "Executed Ipc Active", "Warp Cycles Per Issued Instruction",
          "No Eligible", "Mem Busy", "Max Bandwidth", "Grid Size")
for r in csv.reader(open(sys.argv[2], errors="replace")):
    if len(r) > 2 and r[-3] in wanted:
        print(f"{r[-3]}: {r[-1]} {r[-2]}")
PY
