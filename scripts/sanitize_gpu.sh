#!/usr/bin/env bash
# For the GPU machine, after a scripts/device.sh-style build into $KJIT_BUILD: runs the GPU
# suite under compute-sanitizer's memcheck (with leak check), racecheck and synccheck, writes
# one log per tool to $OUT and prints one summary line per tool:
#   sanitize memcheck: 0 errors (rc 0, doctest 31 passed 0 failed, 212 s, log $OUT/memcheck.log)
# Exit status: 0 when every tool ran and reported no error.
#
# What runs (sanitizers slow kernels 10-100x, and a device command has 10 minutes):
#   memcheck   the whole suite except the two tests whose inputs alone take minutes under it
#              (merge_state with more than 2^31 elements, the 100k-token prefill); every op,
#              dtype, grid mode and boundary test stays in.
#   racecheck, synccheck  a representative subset: for each op every grid mode / value tile
#              (the code paths with shared memory and barriers), merge_states and in_place,
#              prefill's P formed by the state kernel (its mbarrier handoff),
#              prefill's mixed lengths, and the planner's 100 KiB dynamic-smem launch.
# Override with KJIT_MEMCHECK_ARGS / KJIT_RACECHECK_ARGS / KJIT_SYNCCHECK_ARGS (one doctest
# argument, passed as one word: test names contain spaces; "" for the whole suite). Tools to run: KJIT_SANITIZE_TOOLS (default
# "memcheck racecheck synccheck"); per-tool time limit: KJIT_SANITIZE_TIMEOUT (s, default 540).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KJIT_BUILD:-/tmp/kjit-build}
out=${OUT:-$root/out}
sanitizer=${COMPUTE_SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
tests=$build/tests/kjit_gpu_tests
mkdir -p "$out"
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-cache}
export KJIT_LOG=${KJIT_LOG:-warn}
if [ ! -x "$tests" ]; then
  echo "sanitize: no $tests: build first (KJIT_TARGETS=kjit_gpu_tests bash scripts/device.sh with KJIT_SKIP_TESTS=1)" >&2
  exit 2
fi
if [ ! -x "$sanitizer" ]; then
  echo "sanitize: no compute-sanitizer at $sanitizer (set COMPUTE_SANITIZER)" >&2
  exit 2
fi

subset='gdn_decode gpu: every grid mode*,gdn_decode gpu: small batches*,gdn_prefill: every value tile*,gdn_prefill: mixed lengths*,gdn_prefill chunked: P formed by the state kernel*,gpu merge_state: every grid mode*,gpu merge_states: S = 0*,gpu merge_state_in_place*,planner gpu: 100 KiB*'
memcheck_args=${KJIT_MEMCHECK_ARGS-"-tce=*more than 2^31*,*100k-token*"}
racecheck_args=${KJIT_RACECHECK_ARGS-"-tc=$subset"}
synccheck_args=${KJIT_SYNCCHECK_ARGS-"-tc=$subset"}

# Compile every kernel once without a sanitizer, so that the sanitized runs spend their time
# in kernels rather than in NVRTC (the disk cache serves them).
# One doctest argument, or none.
as_args() { if [ -n "$1" ]; then printf '%s\0' "$1"; fi; }
mapfile -d '' warm < <(as_args "$memcheck_args")
timeout 600 "$tests" "${warm[@]}" >"$out/sanitize_warmup.log" 2>&1 || true

status=0
for tool in ${KJIT_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
  case $tool in
    memcheck) extra=(--leak-check full); args=$memcheck_args ;;
    racecheck) extra=(--racecheck-report all); args=$racecheck_args ;;
    synccheck) extra=(); args=$synccheck_args ;;
    *) echo "sanitize: unknown tool $tool" >&2; status=2; continue ;;
  esac
  log=$out/$tool.log
  t0=$(date +%s)
  mapfile -d '' test_args < <(as_args "$args")
  timeout "${KJIT_SANITIZE_TIMEOUT:-540}" "$sanitizer" --tool "$tool" --error-exitcode 1 \
    "${extra[@]}" --print-limit 100 "$tests" "${test_args[@]}" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  # compute-sanitizer ends with "ERROR SUMMARY: N errors"; racecheck also prints a
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" line.
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  hazards=$(grep -oE 'RACECHECK SUMMARY: .*' "$log" | tail -1)
  # A racecheck run with no hazards may print only its own summary: its error count stands in.
  if [ -z "$errors" ] && [ -n "$hazards" ]; then
    errors=$(echo "$hazards" | grep -oE '\(([0-9]+) errors' | grep -oE '[0-9]+')
  fi
  cases=$(grep -E '^\[doctest\] test cases:' "$log" | tail -1 | tr -s ' ')
  passed=$(echo "$cases" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+')
  failed=$(echo "$cases" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
  note=""
  [ "$rc" = 124 ] && note=", TIMED OUT after ${KJIT_SANITIZE_TIMEOUT:-540} s"
  [ -n "$hazards" ] && note="$note, $hazards"
  echo "sanitize $tool: ${errors:-?} errors (rc $rc, doctest ${passed:-?} passed ${failed:-?} failed, ${secs} s$note, log $log)"
  if [ "$rc" != 0 ] || [ "${errors:-x}" != 0 ]; then
    status=1
    grep -E '^========= (Invalid|Race|Barrier|Leaked|Program hit|Error|Warning)' "$log" | sort | uniq -c | sort -rn | head -10
  fi
done
exit $status
