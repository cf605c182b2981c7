#!/usr/bin/env bash
# Runs the GPU suite (tests/kjit_gpu_tests) in N processes at once, each a share of the test
# cases, and prints one summary. The suite's time goes mostly to the CPU (NVRTC compiles of
# each case's kernels, float64 references), which one process runs on one core: on the 16-core
# GPU machine one process took longer than a device call's 600 s; shards bring that down.
# Processes share the disk cache (KJIT_CACHE_DIR), which is safe across processes.
#
# Usage: bash scripts/gpu_suite.sh [build dir]     (default $KJIT_BUILD, else build)
# Knobs: KJIT_GPU_TEST_SHARDS (default: cores / 2, at most 8), KJIT_GPU_TEST_FILTER (a doctest
# -tc filter applied before sharding), KJIT_GPU_TEST_TIMEOUT (seconds per shard, default 540),
# KJIT_GPU_TEST_BIN (another doctest binary, e.g. to try the sharding without a GPU), OUT (logs).
# Exit status: 0 when every case passed, 77 when the suite skipped (no GPU), 1 otherwise.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-${KJIT_BUILD:-$root/build}}
bin=${KJIT_GPU_TEST_BIN:-$build/tests/kjit_gpu_tests}
out=${OUT:-$root/out}
mkdir -p "$out"
cores=$(nproc)
shards=${KJIT_GPU_TEST_SHARDS:-$((cores / 2 < 1 ? 1 : (cores / 2 > 8 ? 8 : cores / 2)))}
deadline=${KJIT_GPU_TEST_TIMEOUT:-540}
filter=${KJIT_GPU_TEST_FILTER:-*}
[ -x "$bin" ] || { echo "gpu_suite: no test binary at $bin (build kjit_gpu_tests first)"; exit 1; }

# The case names, one per line (doctest lists them between two rules of '=').
listing=$("$bin" --list-test-cases --no-version -tc="$filter" 2>&1)
status=$?
if [ $status -eq 77 ] || grep -q '^SKIPPED' <<<"$listing"; then
  grep -m1 '^SKIPPED' <<<"$listing"
  exit 77
fi
mapfile -t names < <(awk '/^==========/ { rule++; next } rule == 1 && NF' <<<"$listing")
if [ ${#names[@]} -eq 0 ]; then
  echo "gpu_suite: no test case matches '$filter'"
  exit 1
fi
[ "$shards" -gt ${#names[@]} ] && shards=${#names[@]}

# Round robin over the names: cases of one family (often alike in cost) land on different shards.
# A doctest filter splits at commas, and '?' matches any one character: commas in names become '?'.
declare -a filters
for i in "${!names[@]}"; do
  s=$((i % shards))
  filters[$s]+="${filters[$s]:+,}${names[$i]//,/?}"
done
t0=$(date +%s)
pids=()
for s in $(seq 0 $((shards - 1))); do
  timeout "$deadline" "$bin" --no-version --duration=true -tc="${filters[$s]}" \
    >"$out/gpu_suite.$s.log" 2>&1 &
  pids+=($!)
done
failed=0
for s in $(seq 0 $((shards - 1))); do
  wait "${pids[$s]}"
  rc=$?
  [ $rc -ne 0 ] && failed=1
  echo "shard $s: rc $rc, $(grep -E '^\[doctest\] test cases:' "$out/gpu_suite.$s.log" | tr -s ' ')"
done

# What did not finish: every listed case without a duration line (killed by the deadline, or in
# a shard that crashed before it).
done_names=$(sed -nE 's/^[0-9.]+ s: //p' "$out"/gpu_suite.*.log | sort -u)
missing=0
for name in "${names[@]}"; do
  if ! grep -qxF -- "$name" <<<"$done_names"; then
    [ $missing -eq 0 ] && echo "not finished:"
    echo "  $name"
    missing=$((missing + 1))
  fi
done
# The cases that failed or crashed: the case heading last seen before each error.
bad=$(awk '/^TEST CASE:/ { sub(/^TEST CASE: +/, ""); name = $0 }
           /ERROR|FATAL|CRASHED/ && name != "" { print name }' "$out"/gpu_suite.*.log | sort -u)
[ -n "$bad" ] && { echo "failed:"; sed 's/^/  /' <<<"$bad"; }
grep -hE 'ERROR|FATAL|CRASHED' "$out"/gpu_suite.*.log | head -20
passed=$(grep -hE '^\[doctest\] test cases:' "$out"/gpu_suite.*.log |
  awk -F'|' '{ split($2, a, " "); n += a[1] } END { print n + 0 }')
echo "gpu suite: ${#names[@]} cases in $shards shards, $passed passed, $missing not finished," \
  "$(($(date +%s) - t0)) s"
[ $failed -eq 0 ] && [ $missing -eq 0 ] && [ "$passed" -eq ${#names[@]} ] && exit 0
exit 1
