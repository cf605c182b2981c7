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

# Reproducible (issue 20): the same manifest compiled twice from empty caches, by two workers
# finishing in any order, is the same bytes.
cat >"$WORK/several.txt" <<'MANIFEST'
merge_state dtype=bf16 heads=8 head_dim=64,128,256 tokens=64 lse_base=e,2
MANIFEST
KJIT_CACHE_DIR="$WORK/cache-a" run 0 precompile "$WORK/several.txt" --arch sm_90 -o "$WORK/a.kjb" -j 2
KJIT_CACHE_DIR="$WORK/cache-b" run 0 precompile "$WORK/several.txt" --arch sm_90 -o "$WORK/b.kjb" -j 2
cmp "$WORK/a.kjb" "$WORK/b.kjb" || fail "two builds of one manifest differ"
! grep -aq "Compile time" "$WORK/a.kjb" || fail "the bundle stores ptxas timings"

# Refused up front, with one line and before any compile (issue 20): an empty or comment-only
# manifest, -o naming the manifest, -o naming a directory or a missing directory.
: >"$WORK/empty.txt"
usage_error precompile "$WORK/empty.txt" --arch sm_90 -o "$WORK/empty.kjb"
contains "$ERR" "has no op lines"
printf '# only a comment\n\n   # another\n' >"$WORK/comments.txt"
usage_error precompile "$WORK/comments.txt" --arch sm_90 -o "$WORK/empty.kjb"
[ ! -e "$WORK/empty.kjb" ] || fail "a bundle of 0 kernels was written"
cp "$WORK/small.txt" "$WORK/keep.txt"
usage_error precompile "$WORK/keep.txt" --arch sm_90 -o "$WORK/keep.txt"
contains "$ERR" "is the manifest itself"
cmp "$WORK/small.txt" "$WORK/keep.txt" || fail "the manifest was overwritten"
usage_error precompile "$WORK/keep.txt" --arch sm_90 -o "$WORK/../$(basename "$WORK")/keep.txt"
contains "$ERR" "is the manifest itself"
mkdir -p "$WORK/outdir"
export KJIT_CACHE_DIR="$WORK/cache-refused"
usage_error precompile "$WORK/small.txt" --arch sm_90 -o "$WORK/outdir"
contains "$ERR" "is a directory"
usage_error precompile "$WORK/small.txt" --arch sm_90 -o "$WORK/missing/x.kjb"
contains "$ERR" "does not exist"
[ ! -e "$KJIT_CACHE_DIR" ] || fail "a refused precompile compiled first"
export KJIT_CACHE_DIR="$WORK/cache"
# A range with no value the op accepts names the line (and compiles nothing).
printf '# sizes\nmerge_state dtype=bf16 heads=8 head_dim=65..71 tokens=64\n' >"$WORK/norange.txt"
usage_error precompile "$WORK/norange.txt" --arch sm_90 -o "$WORK/norange.kjb"
contains "$ERR" "norange.txt:2: head_dim=65..71: range 65..71 holds no value the op accepts"

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
