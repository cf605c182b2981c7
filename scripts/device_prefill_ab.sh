#!/usr/bin/env bash
# For the GPU machine: one device call that compares prefill kernel changes and puts FlashInfer's
# SM90 kernel beside them, with a compact summary last (the form of the twenty-seventh session's
# call, docs/performance.md "S as register A, ..."):
#   1. scripts/device_ab.sh run: the trees prepared into .ab and the working tree, built side by
#      side; the three gdn_prefill GPU groups and racecheck of the ws cases on the working tree;
#      bench_gdn_prefill's main table on every tree with the ws kernel forced;
#   2. bench_gdn_prefill on the working tree with the planner's modes and FlashInfer beside it
#      (main table and PREFILL_AB_FEW shapes), when .anchors/fi/libkjit_fi_prefill.so is there
#      (scripts/build_flashinfer_anchor.sh builds it here);
#   3. the working tree's benchmark again under each environment of PREFILL_AB_VARIANTS (e.g.
#      "KJIT_TENSOR_MAPS=loads;KJIT_TENSOR_MAPS=1": settings A/B'd in one build);
#   4. a second ws pass on every tree and variant in reverse order, while the call has time left.
#
#   here:   bash scripts/device_ab.sh prepare main [REV...]; bash scripts/build_flashinfer_anchor.sh
#   there:  bash scripts/device_prefill_ab.sh   (carry .deps, .ab and .anchors/fi/libkjit_fi_prefill.so)
#
# Knobs: PREFILL_AB_FORCE (default chunked_ws; empty: the planner's modes), PREFILL_AB_VARIANTS
# (';'-separated environments for step 3, each one or more VAR=value), PREFILL_AB_FEW (the
# few-sequences shapes beside FlashInfer, default 16/16/16x8192,16/16/8x4096), PREFILL_AB_BUDGET
# (seconds after which no second pass starts, default 380), PREFILL_AB_LOGS (the logs' folder on the
# GPU machine, default /tmp/prefill-ab-logs, emptied at the start: name a folder of its own, not
# $OUT; $OUT gets the logs as prefill_ab_logs.tgz), and
# device_ab.sh's own (AB_TESTS ...).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Every log goes to a folder of its own and, at the end, into one archive in $OUT: the device tool
# returns at most 8 files a call, fewer than two trees' logs, tails and passes make.
final_out=${OUT:-$root/out}
export OUT=${PREFILL_AB_LOGS:-/tmp/prefill-ab-logs}
if [ "$(realpath -m "$OUT")" = "$(realpath -m "$final_out")" ]; then
  echo "PREFILL_AB_LOGS must not be \$OUT ($final_out): it is emptied first" >&2
  exit 1
fi
rm -rf "$OUT" && mkdir -p "$OUT" "$final_out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU")
force=${PREFILL_AB_FORCE-chunked_ws}
bench_env=(KJIT_PREFILL_BENCH_MAIN_ONLY=1 KJIT_PREFILL_BENCH_NO_VERIFY=1)
[ -n "$force" ] && bench_env+=("KJIT_PREFILL_BENCH_FORCE=$force")
AB_TARGETS=${AB_TARGETS:-kjit_gpu_tests bench_gdn_prefill} \
  AB_TESTS=${AB_TESTS:-gdn_prefill chunked*;gdn_prefill: *;gdn_prefill context-parallel*} \
  AB_SANITIZE=${AB_SANITIZE-gdn_prefill chunked_ws*} AB_SANITIZE_TOOLS=${AB_SANITIZE_TOOLS:-racecheck} \
  AB_ENV_ALL="${bench_env[*]}" bash "$root/scripts/device_ab.sh" run >"$OUT/ab.log" 2>&1
anchor=$root/.anchors/fi/libkjit_fi_prefill.so
if [ -f "$anchor" ]; then
  (cd /tmp/ab-build-work && KJIT_PREFILL_ANCHOR_LIB=$anchor KJIT_CACHE_DIR=/tmp/ab-cache-anchor \
    KJIT_PREFILL_BENCH_FEW_SHAPES=${PREFILL_AB_FEW:-16/16/16x8192,16/16/8x4096} \
    timeout 200 ./bench/bench_gdn_prefill >"$OUT/anchor.txt" 2>&1
  echo "rc=$?" >>"$OUT/anchor.txt")
fi
# Settings A/B'd in the working tree's build: one bench run per environment, named by its index.
variants=()
[ -n "${PREFILL_AB_VARIANTS:-}" ] && IFS=';' read -r -a variants <<<"$PREFILL_AB_VARIANTS"
run_variant() { # run_variant INDEX OUTFILE
  local -a vars
  read -r -a vars <<<"${variants[$1]}"
  (cd /tmp/ab-build-work && env "${bench_env[@]}" "${vars[@]}" KJIT_CACHE_DIR="/tmp/ab-cache-v$1" \
    timeout 90 ./bench/bench_gdn_prefill >"$2" 2>&1
  echo "rc=$? (${variants[$1]})" >>"$2")
}
for i in "${!variants[@]}"; do run_variant "$i" "$OUT/bench-work-v$i.txt"; done
pass2=()
if [ "$SECONDS" -lt "${PREFILL_AB_BUDGET:-380}" ]; then
  for ((i = ${#variants[@]} - 1; i >= 0; i--)); do
    run_variant "$i" "$OUT/pass2-work-v$i.txt"
    pass2+=("$OUT/pass2-work-v$i.txt")
  done
  for build in /tmp/ab-build-work $(ls -dr /tmp/ab-build-[0-9][0-9]-* 2>/dev/null); do
    [ "$SECONDS" -lt $((${PREFILL_AB_BUDGET:-380} + 120)) ] || break
    name=$(basename "$build")
    (cd "$build" && env "${bench_env[@]}" KJIT_CACHE_DIR="/tmp/ab-cache-2-$name" timeout 90 \
      ./bench/bench_gdn_prefill >"$OUT/pass2-$name.txt" 2>&1)
    pass2+=("$OUT/pass2-$name.txt")
  done
fi
# GPU us of each tree's main-table rows (H, HV, T, seqs | GPU us), one line a tree and pass.
rows() {
  grep -E "^ +16 +(16|32) +[0-9]+ +[0-9]+ \|" "$1" | head -6 |
    awk -F'|' '{split($2, us, " "); printf "%s| %s; ", $1, us[1]}' | tr -s ' '
  grep -hE "mismatch|FAIL" "$1" | head -2
  echo
}
echo "=== GPU: $gpu; ws forced: ${force:-no (planner)}"
for i in "${!variants[@]}"; do echo "    work-v$i: ${variants[$i]}"; done
for f in "$OUT"/bench-*.txt; do echo "-- pass 1 $(basename "$f" .txt): $(rows "$f")"; done
for f in "${pass2[@]}"; do echo "-- pass 2 $(basename "$f" .txt): $(rows "$f")"; done
if [ -f "$OUT/anchor.txt" ]; then
  echo "=== the working tree (planner) beside FlashInfer"
  grep -E "^ +16 +(16|32) +|rc=|anchor|mismatch|FAIL" "$OUT/anchor.txt" | cut -c1-230
fi
echo "=== $(grep -E "^\[[0-9]+ s\]" "$OUT/ab.log" | tr '\n' ' ') total $SECONDS s"
echo "=== tests"
cat "$OUT/summary.txt" 2>/dev/null
tar -C "$OUT" -czf "$final_out/prefill_ab_logs.tgz" . && echo "=== logs: prefill_ab_logs.tgz in \$OUT"
