#!/usr/bin/env bash
# The whole test suite: format check, build with warnings as errors, then every test through
# ctest (unit, stress, package, examples; the GPU suite skips with its reason where no GPU
# exists).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
kjit_ensure_packages
"$KJIT_ROOT/scripts/check_format.sh"
KJIT_BUILD=${KJIT_BUILD:-$KJIT_ROOT/build} kjit_build -DKJIT_WERROR=ON
cd "$KJIT_BUILD"
# ctest shows no output of a skipped test: say here why the GPU suite will skip, if it does.
./tests/kjit_gpu_tests --count >/dev/null || ./tests/kjit_gpu_tests --count | grep SKIPPED || true
ctest --output-on-failure -j"$(nproc)" "$@"
