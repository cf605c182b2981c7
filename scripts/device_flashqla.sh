#!/usr/bin/env bash
# For the GPU machine: gdn_prefill beside FlashQLA in one process (issue 19's second anchor,
# docs/performance.md "FlashQLA beside kjit in one process"). Builds kjit's Python package there,
# installs FlashQLA from the wheels scripts/fetch_flashqla.sh packed into .anchors/fq (with the
# .deb files the build needs), and runs bench/python/bench_gdn_prefill_anchors.py; the table is
# printed last and kept in $OUT (fq.txt, fq.json). Carry `.anchors/fq` alone (~53 MB; with .deps
# a call would pass its 64 MiB). FlashQLA JIT-compiles 16-40 s per new shape: the whole run takes
# ~4 minutes on an H100. Arguments go to the benchmark (e.g. --quick, --reps 9).
# Usage: bash scripts/device_flashqla.sh [--quick] [--reps N]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/scripts/lib.sh"
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/deps /tmp/fq
t0=$(date +%s)
ls "$root"/.anchors/fq/fqla.tar.xz >/dev/null 2>&1 ||
  { echo "no .anchors/fq/fqla.tar.xz: run scripts/fetch_flashqla.sh where there is network"; exit 1; }
for f in "$root"/.anchors/fq/*.deb; do dpkg -x "$f" /tmp/deps; done
nvidia-smi --query-gpu=name --format=csv,noheader
(tar xJf "$root/.anchors/fq/fqla.tar.xz" -C /tmp/fq &&
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fqsite \
    /tmp/fq/stored/*.whl >"$out/fq_pip.log" 2>&1
 echo "FlashQLA install rc=$?") &
site=/tmp/kjit-py-site
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-12} kjit_python_package_into "$site" \
  "$out/py_build.log" ||
  { echo "kjit python package build FAILED"; grep -iE ' error' "$out/py_build.log" | head; exit 1; }
wait
echo "builds: $(($(date +%s) - t0)) s"
(cd /tmp && PYTHONPATH="$site:/tmp/fqsite" KJIT_CACHE_DIR=/tmp/kjit-py-cache \
  python3 "$root/bench/python/bench_gdn_prefill_anchors.py" --anchors flashqla --reps 5 \
  --json "$out/fq.json" "$@" >"$out/fq.txt" 2>&1)
echo "benchmark rc=$? ($(($(date +%s) - t0)) s)"
echo "===== summary"
grep -vE '^\s*$|TileLang' "$out/fq.txt" | cut -c1-330
