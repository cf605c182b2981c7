#!/usr/bin/env bash
# For the GPU machine, one call that does everything the session budget allows: builds, then runs
# compute-sanitizer (memcheck, racecheck, synccheck; scripts/sanitize_gpu.sh) on the last GPU in
# the background while the GPU suite, the Python package's tests and benchmark, and the C++
# benchmarks named in $KJIT_BENCHES run in the foreground. On a machine with one GPU the
# sanitizers start after the benchmarks. KJIT_SANITIZE=0 skips them. Logs go to $OUT; a compact
# summary comes last. Needs .deps carried (scripts/fetch_deps.sh).
# Usage: KJIT_BENCHES="bench_launch_overhead bench_gdn_decode" bash scripts/device_all.sh
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out"
export KJIT_BUILD=${KJIT_BUILD:-/tmp/kjit-build}
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-cache}
t0=$(date +%s)

benches=${KJIT_BENCHES-bench_launch_overhead bench_gdn_decode}
KJIT_TARGETS="kjit_gpu_tests kjit_demo $benches" KJIT_SKIP_TESTS=1 KJIT_BENCHES=' ' \
  bash "$root/scripts/device.sh" >"$out/build_summary.txt" 2>&1
tail -3 "$out/build_summary.txt"

gpus=$(nvidia-smi -L | wc -l)
last=$((gpus > 0 ? gpus - 1 : 0))
sanitize_pids=()
start_sanitizers() {
  for tool in ${KJIT_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    # One folder per tool: each writes its own warm-up log.
    mkdir -p "$out/sanitize_$tool"
    OUT=$out/sanitize_$tool CUDA_VISIBLE_DEVICES=$last KJIT_SANITIZE_TOOLS=$tool \
      KJIT_SANITIZE_TIMEOUT=${KJIT_SANITIZE_TIMEOUT:-400} \
      bash "$root/scripts/sanitize_gpu.sh" >"$out/sanitize_$tool.txt" 2>&1 &
    sanitize_pids+=($!)
  done
}
# With two GPUs or more the sanitizers run beside everything else on the last one; with one they
# wait for the benchmarks, whose GPU times they would distort.
if [ "${KJIT_SANITIZE:-1}" != 0 ] && [ "$gpus" -ge 2 ]; then start_sanitizers; fi

# The suite in shards (scripts/gpu_suite.sh: one process took more than a device call's 600 s).
KJIT_LOG=warn KJIT_GPU_TEST_TIMEOUT=${KJIT_GPU_TEST_TIMEOUT:-300} OUT=$out \
  bash "$root/scripts/gpu_suite.sh" "$KJIT_BUILD" >"$out/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - t0 )) s since start)" | tee "$out/summary.txt"
grep -E '^gpu suite:' "$out/gpu_tests.log" | tee -a "$out/summary.txt"
grep -vE '^shard |^gpu suite:' "$out/gpu_tests.log" | head -20

if [ "${KJIT_PYTHON:-1}" != 0 ]; then
  timeout "${KJIT_PYTHON_TIMEOUT:-240}" bash "$root/scripts/device_python.sh" --quick \
    >"$out/python_summary.txt" 2>&1
  echo "python rc=$?" | tee -a "$out/summary.txt"
fi

for b in $benches; do
  (cd "$KJIT_BUILD/bench" && timeout 120 "./$b" "/tmp/$b.json" >"$out/$b.txt" 2>&1)
  echo "$b rc=$?" | tee -a "$out/summary.txt"
done

if [ "${KJIT_SANITIZE:-1}" != 0 ] && [ "$gpus" -lt 2 ]; then start_sanitizers; fi
for pid in "${sanitize_pids[@]}"; do wait "$pid"; done
echo "===== summary ($(( $(date +%s) - t0 )) s)"
cat "$out/summary.txt"
grep -h '^sanitize' "$out"/sanitize_*.txt 2>/dev/null
tail -25 "$out/python_summary.txt" 2>/dev/null
for b in $benches; do
  echo "== $b"
  tail -"${KJIT_BENCH_TAIL:-25}" "$out/$b.txt"
done
