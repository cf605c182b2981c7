#!/usr/bin/env bash
# The main job: install what is missing, build, then run the demo twice (the second run shows
# the disk-cache hits). On a machine with a GPU the demo also launches and verifies.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
kjit_ensure_packages
kjit_build
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-$KJIT_BUILD/demo-cache}
echo "== first run (cache dir $KJIT_CACHE_DIR) =="
"$KJIT_BUILD/examples/kjit_demo"
echo "== second run: every kernel comes from the disk cache =="
"$KJIT_BUILD/examples/kjit_demo"
