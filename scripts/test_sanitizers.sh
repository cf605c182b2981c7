#!/usr/bin/env bash
# The sanitizer and fuzz stage of the test command (issue 9), each in its own build tree:
#   1. asan  (g++, ASan + UBSan): every CPU unit test, the stress tests, and a short run of
#            every fuzz target through the replay driver (corpus + mutations);
#   2. tsan  (g++, ThreadSanitizer): a subset, the unit tests of tests/unit/cache_*,
#            bundle_*, compile_nvrtc_* and plan_multi_device_* (the ones with threads or
#            processes sharing the cache, the NVRTC pool, the runtime; a TSan tree builds only
#            those), ops_gdn_prefill_sm90_emulated_test.cpp (the sm_90a kernels' emulated threads,
#            as TSan fibers), ops_gdn_decode_conv_emulated_test.cpp (the fused decode step's
#            clustered blocks at once, their conv-pool columns ordered by the cluster barrier)
#            and the stress tests; the other op, planner and codegen tests are
#            single-threaded and left to ASan;
#   Both run the compile sweeps of compile_nvrtc_test.cpp on a sample of their specs
#   (KJIT_TEST_SAMPLE_SWEEPS=1, set by the test presets): a sweep's time is NVRTC's, which no
#   sanitizer instruments; the main stage compiles every spec.
#   3. fuzz  (clang + libFuzzer, ASan + UBSan): every target for KJIT_FUZZ_SECONDS seconds
#            (default 20) from the committed seeds, new inputs kept in build-fuzz/fuzz/work.
#            Not in the default stages: it is a third build of the library, too long for CI's
#            budget; the asan stage runs the same targets through the replay driver.
# Stages to run: KJIT_SANITIZERS (default "asan tsan"). Prints the wall time of each.
# Usage: bash scripts/test_sanitizers.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$KJIT_ROOT"
stages=${KJIT_SANITIZERS:-asan tsan}
jobs=${KJIT_JOBS:-2}
fuzz_seconds=${KJIT_FUZZ_SECONDS:-20}
t_all=$(date +%s)

stage_time() { echo "sanitizers: $1 took $(( $(date +%s) - $2 )) s"; }

configure() {  # preset, build dir, extra args
  local preset=$1 dir=$2
  shift 2
  if [ ! -f "$dir/build.ninja" ]; then
    cmake --preset "$preset" "$@" >/dev/null
  fi
}

for stage in $stages; do
  t0=$(date +%s)
  case $stage in
    asan)
      configure asan build-asan
      cmake --build --preset asan -j "$jobs"
      ctest --preset asan -j "$jobs"
      ;;
    tsan)
      configure tsan build-tsan
      cmake --build --preset tsan -j "$jobs"
      # A TSan tree's unit tests are the subset (tests/CMakeLists.txt), one process per test
      # case as in the other stages, so that both cores run.
      ctest --preset tsan -j "$jobs"
      ;;
    fuzz)
      if ! command -v clang++ >/dev/null; then
        echo "sanitizers: fuzz skipped: no clang++ (the asan stage ran the fuzz targets with the replay driver)"
        continue
      fi
      if [ ! -f "$(clang++ -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a" ]; then
        echo "sanitizers: fuzz skipped: clang has no libFuzzer (apt-get install libclang-rt-14-dev)"
        continue
      fi
      configure fuzz build-fuzz
      cmake --build --preset fuzz -j "$jobs"
      mkdir -p build-fuzz/fuzz/seeds
      build-fuzz/fuzz/kjit_fuzz_make_seeds build-fuzz/fuzz/seeds >/dev/null
      for target in build-fuzz/fuzz/kjit_fuzz_*; do
        name=${target##*/kjit_fuzz_}
        [ "$name" = make_seeds ] && continue
        work=build-fuzz/fuzz/work/$name
        mkdir -p "$work"
        seeds=(fuzz/corpus/"$name")
        [ -d build-fuzz/fuzz/seeds/"$name" ] && seeds+=(build-fuzz/fuzz/seeds/"$name")
        # New inputs go to $work (reused by the next run), never into the committed seeds.
        log=build-fuzz/fuzz/$name.log
        if ! KJIT_LOG=error "$target" -max_total_time="$fuzz_seconds" -seed=1 -max_len=65536 \
            -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 "$work" "${seeds[@]}" >"$log" 2>&1; then
          tail -40 "$log"
          echo "sanitizers: fuzz target $name FAILED (log: $log; crash input: see above)"
          exit 1
        fi
        runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
        corpus=$(grep -oE 'INITED.*corp: [0-9]+' "$log" | head -1 | grep -oE '[0-9]+$' || echo "?")
        cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$' || echo "?")
        echo "sanitizers: libFuzzer $name: $runs inputs in ${fuzz_seconds} s, $corpus seeds, coverage $cov edges, no crash"
      done
      ;;
    *)
      echo "sanitizers: unknown stage '$stage' (asan, tsan, fuzz)" >&2
      exit 2
      ;;
  esac
  stage_time "$stage" "$t0"
done
stage_time "all stages" "$t_all"
