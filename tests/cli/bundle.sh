#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kjit precompile -> bundle: build, show, verify (real and fabricated devices), load from the
# bundle without NVRTC, name the nearest specs on a miss, reject a corrupted bundle.
. "$(dirname "$0")/common.sh"
require_nvrtc

cat >"$WORK/small.txt" <<'MANIFEST'
# two problems, one spec each (maybe the same)
merge_state dtype=bf16 heads=8 head_dim=128 tokens=64,4096 lse_base=e
MANIFEST
run 0 precompile "$WORK/small.txt" --arch sm_90 -o "$WORK/small.kjb" -j 2 --verify h100,h200
contains "$OUT" "distinct specs for sm_90"
contains "$OUT" "largest register use"
contains "$OUT" "wrote $WORK/small.kjb"
contains "$OUT" "verified:"
[ -f "$WORK/small.kjb" ] || fail "no bundle written"

run 0 plan merge_state --dtype bf16 --tokens 64 --heads 8 --head-dim 128 --lse-base e --arch sm_90 --json
spec=$(json 'j["launches"][0]["spec"]' "$OUT" '.launches[0].spec')

run 0 bundle info "$WORK/small.kjb"
contains "$OUT" "$spec"
contains "$OUT" "archs            sm_90"
contains "$OUT" "merge_state dtype=bf16 heads=8"

# Offline proofs: fine on H100; a fabricated device too small for the planned blocks fails
# with the limit named; a device of an arch the bundle lacks fails.
run 0 bundle verify "$WORK/small.kjb" --verify h100
run 2 bundle verify "$WORK/small.kjb" --verify-device name=tiny,threads=32,grid_y=7
contains "$ERR" "verification failed"
contains "$ERR" "tiny"
run 2 bundle verify "$WORK/small.kjb" --verify b200
contains "$ERR" "only for sm_90"
run 2 precompile "$WORK/small.txt" --arch sm_90 -o "$WORK/again.kjb" --verify-device name=tiny,regs=1024
contains "$ERR" "registers per block"

# No NVRTC, JIT disabled: inspect is served by the bundle.
export KJIT_BUNDLE_PATH="$WORK/small.kjb" KJIT_DISABLE_JIT=1 KJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so
run 0 inspect "$spec" --key
contains "$OUT" "from          bundle $WORK/small.kjb"
contains "$OUT" "registers"
contains "$OUT" "== key material =="
run 0 inspect "$spec" --sass
contains "$OUT" "== SASS =="
# A spec the bundle lacks: KernelNotInBundle naming the nearest bundled spec.
missing=${spec/head_dim=128/head_dim=256}
run 1 inspect "$missing"
contains "$ERR" "$missing is in no bundle"
contains "$ERR" "nearest: $spec (differs in head_dim"

# A bundle from another build is refused before use (library version / template digest are
# checked by the unit tests; here: a flipped byte anywhere in the middle).
cp "$WORK/small.kjb" "$WORK/corrupt.kjb"
size=$(stat -c %s "$WORK/corrupt.kjb")
flip_byte "$WORK/corrupt.kjb" $((size / 2))
run 1 bundle info "$WORK/corrupt.kjb"
contains "$ERR" "corrupt.kjb is corrupt"
export KJIT_BUNDLE_PATH="$WORK/corrupt.kjb"
run 1 inspect "$spec"
contains "$ERR" "is corrupt"
[ "$(printf '%s\n' "$ERR" | grep -c .)" = 1 ] || fail "more than one line: $ERR"
echo "bundle: ok"
