#!/usr/bin/env bash
# A/B of kernel changes on the GPU machine in one device call: several source trees built side
# by side, one GPU-test filter run on the last tree, one benchmark run on every tree in turn
# (same process order, same inputs), a compact table last. The trees are the working tree and
# git revisions exported beforehand (the GPU machine gets no .git):
#
#   here:   bash scripts/device_ab.sh prepare a1f8b59 HEAD~1      (-> .ab/<rev>/, git-ignored)
#   there:  bash scripts/device_ab.sh run                          (carry .deps and .ab)
#
# run takes every tree prepare exported into .ab (NN-<rev>, in the order given) and then the
# working tree ("work"). Knobs (all optional):
#   AB_TARGETS  the working tree's build targets (default: kjit_gpu_tests bench_gdn_prefill);
#               the other trees build only the benchmark binary
#   AB_TESTS    doctest -tc filters for the working tree, ';'-separated, each in its own process
#               (default: the three prefill groups); AB_TESTS=none skips
#   AB_BENCH    benchmark binary and arguments (default: bench_gdn_prefill)
#   AB_ENV      environment for the working tree's benchmark only, e.g. an anchor library:
#               AB_ENV="KJIT_PREFILL_ANCHOR_LIB=$PWD/.anchors/fi/libkjit_fi_prefill.so"
#   AB_ENV_ALL  environment for every tree's benchmark, e.g. a forced mode
#               (AB_ENV_ALL="KJIT_PREFILL_BENCH_FORCE=chunked_ws KJIT_PREFILL_BENCH_NO_VERIFY=1")
#   AB_GREP     extended regex of the benchmark lines to summarize (default: prefill rows)
#   AB_SANITIZE doctest filter to run once under compute-sanitizer racecheck and once under
#               memcheck, beside the tests (default: none)
#   AB_SANITIZE_TOOLS  the compute-sanitizer tools for AB_SANITIZE (default: racecheck memcheck;
#               add synccheck for kernels with cluster or named barriers)
#   AB_DIR      where prepare exports and run finds the trees (default: .ab). Two sets of trees
#               for two A/Bs in one device call: `AB_DIR=.ab/b bash scripts/device_ab.sh prepare
#               REV...` beside the default set, carry both, and run twice, the second time with
#               AB_DIR=.ab/b (build folders are per tree name, so a revision in both builds once;
#               the second run rewrites $OUT's summary.txt and bench-work.txt: copy them first).
#
# The test and sanitizer summaries also go to $OUT/summary.txt, and the last 60 lines of each
# test log to $OUT/<log>.tail: the device tool returns only the end of a call's output, where the
# benchmark tables can push the test lines out.
#
# Pace builds of the warp-specialized kernel (which side sets its step): after prepare,
#   sed -i '1i #define KJIT_GDN_WS_PACE 1' .ab/00-*/templates/gdn_prefill/params.h   (state side)
#   sed -i '1i #define KJIT_GDN_WS_PACE 2' .ab/01-*/templates/gdn_prefill/params.h   (chunk side)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ab=${AB_DIR:-.ab}
[[ "$ab" = /* ]] || ab=$root/$ab

if [ "${1:-}" = prepare ]; then
  shift
  # Only the exported trees go: scripts kept beside them in .ab (a call's own steps) stay.
  mkdir -p "$ab" && rm -rf "$ab"/[0-9][0-9]-*/
  i=0
  for rev in "$@"; do
    name=$(printf '%02d-%s' "$i" "$(git -C "$root" rev-parse --short "$rev")") || exit 1
    mkdir -p "$ab/$name"
    git -C "$root" archive "$rev" | tar -x -C "$ab/$name"
    # The unit tests' golden plan list (5.7 MB) is not built there; emptied, a few trees stay
    # under the device tool's 64 MiB carry limit.
    : >"$ab/$name/tests/golden/manifest_plans.txt"
    i=$((i + 1))
  done
  ls "$ab"
  exit 0
fi
[ "${1:-}" = run ] || {
  echo "usage: $0 prepare REV... | run" >&2
  exit 2
}

out=${OUT:-$root/out}
logs=/tmp/ab-logs
mkdir -p "$out" "$logs" /tmp/deps
rm -f "$out/summary.txt"
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
t0=$(date +%s)
elapsed() { echo "[$(($(date +%s) - t0)) s] $*"; }

trees=()
names=()
for d in "$ab"/[0-9][0-9]-*/; do
  [ -d "$d" ] || continue
  trees+=("${d%/}")
  names+=("$(basename "$d")")
done
trees+=("$root")
names+=(work)

read -r -a targets <<<"${AB_TARGETS:-kjit_gpu_tests bench_gdn_prefill}"
read -r -a bench <<<"${AB_BENCH:-bench_gdn_prefill}"
jobs=$((16 / ${#trees[@]} + 1))  # the GPU machine's 16 cores shared by the parallel builds
for i in "${!trees[@]}"; do
  (
    build=/tmp/ab-build-${names[$i]}
    # The tests run on the working tree only: the other trees build just the benchmark.
    [ "${names[$i]}" = work ] || targets=("${bench[0]}")
    cmake -S "${trees[$i]}" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKJIT_WERROR=OFF \
      -DCMAKE_PREFIX_PATH=/tmp/deps/usr >"$logs/configure-${names[$i]}.log" 2>&1 &&
      cmake --build "$build" --target "${targets[@]}" -- -j$jobs -k 0 \
        >"$logs/build-${names[$i]}.log" 2>&1 || echo "build ${names[$i]} failed (see $logs)"
  ) &
done
wait
elapsed "built ${names[*]}"

export KJIT_LOG=warn
work=/tmp/ab-build-work
pids=()
if [ "${AB_TESTS:-}" != none ]; then
  IFS=';' read -r -a filters <<<"${AB_TESTS:-gdn_prefill: *;gdn_prefill chunked*;gdn_prefill context-parallel*}"
  for i in "${!filters[@]}"; do
    (cd "$work" && KJIT_CACHE_DIR=/tmp/ab-cache-t$i timeout 400 ./tests/kjit_gpu_tests \
      -tc="${filters[$i]}" >"$logs/tests-$i.log" 2>&1
    echo "rc=$?" >>"$logs/tests-$i.log") &
    pids+=($!)
  done
fi
if [ -n "${AB_SANITIZE:-}" ]; then
  for tool in ${AB_SANITIZE_TOOLS:-racecheck memcheck}; do
    (cd "$work" && KJIT_CACHE_DIR=/tmp/ab-cache-$tool timeout 400 \
      /usr/local/cuda/bin/compute-sanitizer --tool $tool ./tests/kjit_gpu_tests \
      -tc="$AB_SANITIZE" >"$logs/$tool.log" 2>&1
    echo "rc=$?" >>"$logs/$tool.log") &
    pids+=($!)
  done
fi
for p in "${pids[@]}"; do wait "$p"; done
elapsed "tests"
# (Every compute-sanitizer tool's name ends in "check": whichever AB_SANITIZE_TOOLS ran.)
for f in "$logs"/tests-*.log "$logs"/*check.log; do
  [ -f "$f" ] || continue
  tail -60 "$f" >"$out/$(basename "$f" .log).tail"
  {
    echo "-- $(basename "$f" .log): $(grep -hE 'assertions:|SUMMARY' "$f" | tr -s ' ' | tr '\n' ' ')$(tail -1 "$f")"
    grep -E "ERROR:|FAILED" -A3 "$f" | grep -v "ERROR SUMMARY: 0" | head -8
  } | tee -a "$out/summary.txt"
done

for i in "${!trees[@]}"; do
  build=/tmp/ab-build-${names[$i]}
  extra=()
  [ -n "${AB_ENV_ALL:-}" ] && read -r -a extra <<<"$AB_ENV_ALL"
  if [ "${names[$i]}" = work ] && [ -n "${AB_ENV:-}" ]; then
    read -r -a work_env <<<"$AB_ENV"
    extra+=("${work_env[@]}")
  fi
  (cd "$build" && env "${extra[@]}" KJIT_CACHE_DIR="/tmp/ab-cache-${names[$i]}" timeout 300 \
    "./bench/${bench[0]}" "${bench[@]:1}" >"$out/bench-${names[$i]}.txt" 2>&1
  echo "rc=$?" >>"$out/bench-${names[$i]}.txt")
  elapsed "bench ${names[$i]}"
done
for i in "${!trees[@]}"; do
  echo "== ${names[$i]}"
  grep -E "${AB_GREP:-^ +16 +(16|32) +|anchor|rc=|FAIL|mismatch|profile}" "$out/bench-${names[$i]}.txt" |
    cut -c1-200 | head -40
done
# The tests' lines again, last, where a cut output still shows them.
[ -f "$out/summary.txt" ] && cat "$out/summary.txt"
elapsed "done"
