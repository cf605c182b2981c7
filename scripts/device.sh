#!/usr/bin/env bash
# For the GPU machine (no network, no fmt/xxhash/doctest installed): unpack the .deb files that
# scripts/fetch_deps.sh put into .deps/, build, run the whole test suite including the GPU
# suite, then the benchmarks named in $KJIT_BENCHES (default: all). Output goes to $OUT when
# set. Usage: bash scripts/device.sh [bench args...]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/deps
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
export KJIT_BUILD=${KJIT_BUILD:-/tmp/kjit-build}
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-cache}
t0=$(date +%s)
cmake -S "$root" -B "$KJIT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKJIT_WERROR=OFF \
  -DCMAKE_PREFIX_PATH=/tmp/deps/usr >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
targets=${KJIT_TARGETS:-all}
# -k 0: a target that fails to build is reported, and everything else still runs.
cmake --build "$KJIT_BUILD" --target $targets -- -j16 -k 0 >"$out/build.log" 2>&1 ||
  grep -E 'error|FAILED' "$out/build.log" | head -20
echo "build: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
if [ "${KJIT_SKIP_TESTS:-0}" != 1 ]; then
  if [ -n "${KJIT_GPU_TEST_ARGS:-}" ]; then
    # Given doctest arguments: one process, as asked.
    (cd "$KJIT_BUILD" && KJIT_LOG=warn timeout ${KJIT_GPU_TEST_TIMEOUT:-900} ./tests/kjit_gpu_tests $KJIT_GPU_TEST_ARGS >"$out/gpu_tests.log" 2>&1); echo "gpu tests rc=$?"
    tail -4 "$out/gpu_tests.log"
    grep -E 'ERROR|FAILED|failed' "$out/gpu_tests.log" | head -40
  else
    # The whole suite in shards (scripts/gpu_suite.sh), one summary.
    KJIT_LOG=warn KJIT_GPU_TEST_TIMEOUT=${KJIT_GPU_TEST_TIMEOUT:-540} OUT=$out \
      bash "$root/scripts/gpu_suite.sh" "$KJIT_BUILD" >"$out/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
    grep -vE '^shard ' "$out/gpu_tests.log" | head -40
  fi
fi
if [ -x "$KJIT_BUILD/examples/kjit_demo" ]; then
  echo "== demo (twice: compile, then disk-cache hits)"
  KJIT_CACHE_DIR=/tmp/kjit-demo-cache "$KJIT_BUILD/examples/kjit_demo" 2>&1 | tail -12
  KJIT_CACHE_DIR=/tmp/kjit-demo-cache "$KJIT_BUILD/examples/kjit_demo" 2>&1 | tail -12
fi
for b in ${KJIT_BENCHES:-$(cd "$KJIT_BUILD/bench" && ls bench_* 2>/dev/null)}; do
  echo "== $b"
  "$KJIT_BUILD/bench/$b" "/tmp/$b.json" 2>&1 | tee "$out/$b.txt" | tail -${KJIT_BENCH_TAIL:-60}
done
echo "total: $(( $(date +%s) - t0 )) s"
