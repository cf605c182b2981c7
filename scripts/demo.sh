#!/usr/bin/env bash
# The main job: install what is missing, build the demo (examples/demo.cpp), then run it twice:
# the first run compiles the op kernels with NVRTC, the second loads every one from the disk
# cache. On a machine with a GPU the demo also launches merge_state and verifies it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
kjit_ensure_packages
# Only the demo and the library it links; scripts/test.sh builds everything else.
if [ ! -f "$KJIT_BUILD/build.ninja" ]; then
  cmake -S "$KJIT_ROOT" -B "$KJIT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$KJIT_BUILD" --target kjit_demo -- -j"$(nproc)"
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-$KJIT_BUILD/demo-cache}
echo "== first run (cache dir $KJIT_CACHE_DIR) =="
"$KJIT_BUILD/examples/kjit_demo"
echo "== second run: every kernel comes from the disk cache =="
"$KJIT_BUILD/examples/kjit_demo"
