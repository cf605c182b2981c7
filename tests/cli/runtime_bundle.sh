#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Runtime itself (not the tool's own bundle lookup: inspect --via-runtime) serving kernels
# from KJIT_BUNDLE_PATH without NVRTC, and KernelNotInBundle naming the nearest specs.
. "$(dirname "$0")/common.sh"
require_nvrtc

cat >"$WORK/m.txt" <<'MANIFEST'
merge_state dtype=bf16 heads=8 head_dim=128 tokens=64 lse_base=e
MANIFEST
run 0 precompile "$WORK/m.txt" --arch sm_90 -o "$WORK/m.kjb" -j 1
run 0 plan merge_state --dtype bf16 --tokens 64 --heads 8 --head-dim 128 --lse-base e --arch sm_90 --json
spec=$(json 'j["launches"][0]["spec"]' "$OUT" '.launches[0].spec')
export KJIT_BUNDLE_PATH="$WORK/m.kjb" KJIT_DISABLE_JIT=1 KJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so
run 0 inspect --via-runtime "$spec"
contains "$OUT" "from          bundle"
missing=${spec/head_dim=128/head_dim=256}
run 1 inspect --via-runtime "$missing"
contains "$ERR" "$missing is in no bundle"
contains "$ERR" "$spec (differs in head_dim"
echo "runtime_bundle: ok"
