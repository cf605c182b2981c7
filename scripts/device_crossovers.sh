#!/usr/bin/env bash
# For the GPU machine: the measurements behind the planner's device-dependent choices, in one
# device call on one build, with a compact summary last (docs/performance.md, "The planner's
# choice between the two kernels and the warp-specialized one" and "The prefill's span on the
# H100"). Both choices follow DeviceLimits::dram_bytes_per_second per SM (gdn_prefill's one
# threshold for HV = H and HV > H since "S as register A"), so run it on every GPU the rules
# should hold for and compare:
#   - the live limits the planner sees (the GPU test printing them, and the DRAM figure);
#   - causal_conv1d's prefill: the planner's span beside spans 64 and 32 forced;
#   - gdn_prefill: bench_gdn_prefill with the planner's modes (and FlashInfer's SM90 kernel when
#     KJIT_PREFILL_ANCHOR_LIB names its library), then with the warp-specialized kernel forced,
#     then the main table with the two kernels forced (bv128_wgmma); the few-sequence table's
#     "chunked" column is the two kernels forced too; then short chains (equal lengths around the
#     chunk threshold) with each path forced.
# Needs .deps carried (scripts/fetch_deps.sh). Knobs: KJIT_BUILD (default /tmp/kjit-build),
# KJIT_PREFILL_ANCHOR_LIB, KJIT_CROSSOVER_MAIN_ONLY=1 (main prefill tables only, ~40 s less),
# KJIT_CROSSOVER_PROFILE=1 (also a copy of the tree built with KJIT_GDN_WS_PROFILE 1: where each
# warpgroup of the warp-specialized kernel spends its chunk loop, docs/performance.md).
# Usage: bash scripts/device_crossovers.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/deps
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
build=${KJIT_BUILD:-/tmp/kjit-build}
# shellcheck source=lib.sh
source "$root/scripts/lib.sh"
t0=$(date +%s)
elapsed() { echo "[$(($(date +%s) - t0)) s] $*"; }
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKJIT_WERROR=OFF \
  -DCMAKE_PREFIX_PATH=/tmp/deps/usr >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$build" --target kjit_gpu_tests bench_causal_conv1d bench_gdn_prefill -- -j16 \
  >"$out/build.log" 2>&1 || { grep -E 'error|FAILED' "$out/build.log" | head -20; exit 1; }
elapsed built
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
export KJIT_LOG=warn KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-cache}
cd "$build" || exit 1
timeout 60 ./tests/kjit_gpu_tests -tc='planner gpu: the driver*' >"$out/limits.log" 2>&1
if grep -q '^SKIPPED' "$out/limits.log"; then
  grep -m1 '^SKIPPED' "$out/limits.log"
  echo "no GPU here: nothing measured"
  exit 1
fi
KJIT_CONV_BENCH_MODES='span=64,span=32' timeout 120 ./bench/bench_causal_conv1d \
  "$out/conv.jsonl" >"$out/conv.txt" 2>&1
elapsed causal_conv1d
main_only=()
[ "${KJIT_CROSSOVER_MAIN_ONLY:-0}" = 1 ] && main_only=(KJIT_PREFILL_BENCH_MAIN_ONLY=1)
env "${main_only[@]}" timeout 200 ./bench/bench_gdn_prefill >"$out/prefill_planner.txt" 2>&1
elapsed gdn_prefill planner
env "${main_only[@]}" KJIT_PREFILL_BENCH_FORCE=chunked_ws KJIT_PREFILL_ANCHOR_LIB= \
  timeout 150 ./bench/bench_gdn_prefill >"$out/prefill_ws.txt" 2>&1
elapsed gdn_prefill ws
# The two kernels forced (main table): where the planner takes ws, its other side (HV = H and 2H
# in the table: the rule once depended on them).
KJIT_PREFILL_BENCH_MAIN_ONLY=1 KJIT_PREFILL_BENCH_FORCE=chunked_bv128_wgmma KJIT_PREFILL_ANCHOR_LIB='' \
  timeout 100 ./bench/bench_gdn_prefill >"$out/prefill_two.txt" 2>&1
elapsed gdn_prefill two kernels
# Short chains (the rule's chunk threshold: 15 chunks x value heads per SM below 30 GB/s of DRAM
# per SM, 48 above; docs/performance.md "Whole chunks by boxes only, ..."): equal lengths around
# both thresholds, the kernel and the two kernels forced. KJIT_CROSSOVER_SHORT overrides the list.
short=${KJIT_CROSSOVER_SHORT:-16/16/16x128,16/16/16x256,16/16/8x512,16/16/16x512,16/16/16x1024,16/16/8x2048,16/32/8x256,16/32/4x1024,16/32/16x512,16/32/4x2048,16/16/16x2048}
for mode in chunked_ws chunked_bv128_wgmma; do
  KJIT_PREFILL_BENCH_FEW_ONLY=1 KJIT_PREFILL_BENCH_FORCE=$mode KJIT_PREFILL_ANCHOR_LIB='' \
    KJIT_PREFILL_BENCH_FEW_SHAPES=$short timeout 120 ./bench/bench_gdn_prefill \
    >"$out/prefill_short_$mode.txt" 2>&1
done
elapsed gdn_prefill short chains

if [ "${KJIT_CROSSOVER_PROFILE:-0}" = 1 ]; then
  # The measurement build (scripts/lib.sh); only the benchmark is built.
  kjit_ws_profile_build /tmp/kjit-profile-src /tmp/kjit-profile-build "$out/profile"
  (cd /tmp/kjit-profile-build && KJIT_PREFILL_BENCH_PROFILE=1 KJIT_PREFILL_BENCH_FORCE=chunked_ws \
    KJIT_PREFILL_BENCH_MAIN_ONLY=1 KJIT_CACHE_DIR=/tmp/kjit-profile-cache timeout 200 \
    ./bench/bench_gdn_prefill >"$out/prefill_profile.txt" 2>&1)
  elapsed profile
fi

echo "=== $gpu"
grep -E 'GB/s DRAM|FAILED|ERROR' "$out/limits.log" | head -3
echo "=== causal_conv1d prefill (D = 8192): planner's span, then forced spans; GPU us, ratio to copy"
python3 - "$out/conv.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    if d.get("op") != "causal_conv1d" or "us" not in d:
        continue
    if "candidate" in d:
        print(f"  {d['tokens']:>7} {d['candidate']:>8} {d['us']:9.2f} copy {d['ratio_to_copy']:.3f}"
              f" (x{d['speedup']:.3f} of the planner's)")
    else:
        span = d["spec"].split("span=")[1].split(",")[0]
        print(f"  {d['tokens']:>7} planner span={span:>2} {d['us']:9.2f} copy {d['ratio_to_copy']:.3f}")
PY
for f in prefill_planner prefill_ws prefill_two prefill_short_chunked_ws \
  prefill_short_chunked_bv128_wgmma; do
  echo "=== gdn_prefill, $f (GPU us; H, HV, T, seqs | ... )"
  grep -E '^ +16 +(16|32) +|FAILED|mismatch' "$out/$f.txt" | cut -c1-175
done
if [ -f "$out/prefill_profile.txt" ]; then
  echo "=== gdn_prefill ws profile (cycles per chunk and warp at each site)"
  sed -n '/cycles per chunk and warp/,$p' "$out/prefill_profile.txt" | cut -c1-400
fi
elapsed "done"
