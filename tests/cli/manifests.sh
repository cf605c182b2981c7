#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every deployment manifest of cache/manifests precompiles for sm_90 on the CPU and verifies
# on H100/H200. Ops missing from the build are skipped by the tool with a printed note.
. "$(dirname "$0")/common.sh"
require_nvrtc
jobs=$(nproc 2>/dev/null || echo 2)
for manifest in "$SRC"/cache/manifests/*.txt; do
  name=$(basename "$manifest" .txt)
  run 0 precompile "$manifest" --arch sm_90 -o "$WORK/$name.kjb" -j "$jobs" --verify h100,h200
  printf '%s\n' "$OUT" | grep -E '^(note|compiled|largest|verified)' | sed "s/^/$name: /"
  contains "$OUT" "verified:"
done
echo "manifests: ok"
