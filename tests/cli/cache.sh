#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kjit inspect through the disk cache, then kjit cache ls/stats/verify/explain/prune/clear.
. "$(dirname "$0")/common.sh"
require_nvrtc  # compiles probe:heavy=0@sm_90 into $KJIT_CACHE_DIR

run 0 inspect 'probe:heavy=0@sm_90'
contains "$OUT" "from          disk cache"
key=$(printf '%s\n' "$OUT" | awk '$1 == "key" {print $2}')
[ ${#key} = 32 ] || fail "no key in: $OUT"
run 0 inspect 'probe:heavy=0@sm_90' --resources
contains "$OUT" "registers"
run 0 inspect 'probe:heavy=1@sm_90' --ptx --key
contains "$OUT" "== PTX =="
contains "$OUT" ".entry"
contains "$OUT" "== key material =="
contains "$OUT" "templates:"

run 0 cache ls
contains "$OUT" "$key"
contains "$OUT" "probe:heavy=0@sm_90"
contains "$OUT" "probe:heavy=1@sm_90"
contains "$OUT" "2 entries under $KJIT_CACHE_DIR"
run 0 cache stats
contains "$OUT" "entries  2"
run 0 cache verify
contains "$OUT" "2 entries checked, 0 corrupt"
run 0 cache explain "$key"
contains "$OUT" "spec         probe:heavy=0@sm_90"
contains "$OUT" "== key material =="
run 1 cache explain 00000000000000000000000000000000

# A flipped byte in an entry: verify reports it and exits 1; ls marks it.
entry=$(find "$KJIT_CACHE_DIR" -name "$key.kjc")
flip_byte "$entry" 60
run 1 cache verify
contains "$OUT" "CORRUPT $entry"
run 0 cache ls
contains "$OUT" "CORRUPT"

# prune keeps the total under the limit, deleting oldest first; clear deletes the rest.
touch -d '2001-01-01' "$entry"
size=$(stat -c %s "$(find "$KJIT_CACHE_DIR" -name '*.kjc' ! -name "$key.kjc")")
run 0 cache prune --max-size "$size"
contains "$OUT" "removed 1 entries"
[ ! -e "$entry" ] || fail "the oldest entry was not pruned"
run 0 cache stats
contains "$OUT" "entries  1"
run 0 cache clear
run 0 cache stats
contains "$OUT" "entries  0"
[ -d "$KJIT_CACHE_DIR" ] || fail "clear removed the root"
# --- issue 20 ---------------------------------------------------------------------------------
spec0='probe:heavy=0@sm_90'
spec1='probe:heavy=1@sm_90'
run 0 inspect "$spec0"
contains "$OUT" "compiled now (NVRTC), stored in the disk cache $KJIT_CACHE_DIR"
# JIT disabled and no NVRTC: a kernel in the (pre-filled) disk cache is served from it; one that
# is not is KernelNotInBundle naming the cache it searched.
KJIT_DISABLE_JIT=1 KJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so run 0 inspect "$spec0"
contains "$OUT" "from          disk cache $KJIT_CACHE_DIR"
KJIT_DISABLE_JIT=1 KJIT_NVRTC_LIBRARY=/nonexistent/libnvrtc.so run 1 inspect "$spec1"
contains "$ERR" "$spec1 is in no bundle, not in the disk cache $KJIT_CACHE_DIR"
# KJIT_LOG in any case; each resolution logged once, with where the kernel came from.
KJIT_LOG=Debug run 0 inspect "$spec0"
contains "$ERR" "[kjit debug] $spec0: from the disk cache, $KJIT_CACHE_DIR/v1/"
[ "$(printf '%s\n' "$ERR" | grep -c "$spec0: ")" = 1 ] || fail "not one resolution line: $ERR"
KJIT_LOG=INFO run 0 inspect "$spec1"
contains "$ERR" "[kjit info] $spec1: compiling with NVRTC"
# inspect says what became of a kernel it compiled.
KJIT_DISABLE_DISK_CACHE=1 run 0 inspect "$spec0"
contains "$OUT" "not stored: the disk cache is turned off (KJIT_DISABLE_DISK_CACHE=1)"
: >"$WORK/not-a-dir"
KJIT_CACHE_DIR="$WORK/not-a-dir" run 0 inspect "$spec0"
contains "$OUT" "not stored in the disk cache $WORK/not-a-dir: it is not a directory"

# The cases below need a user that file modes apply to: root runs kjit as uid 65534.
cat >"$WORK/as_other.sh" <<WRAPPER
#!/bin/sh
if [ "\$(id -u)" = 0 ]; then
  exec setpriv --reuid=65534 --regid=65534 --clear-groups "$KJIT" "\$@"
fi
exec "$KJIT" "\$@"
WRAPPER
chmod 755 "$WORK/as_other.sh"
if [ "$(id -u)" = 0 ] && ! command -v setpriv >/dev/null 2>&1; then
  echo "cache: ok (read-only and undeletable cases skipped: root without setpriv)"
  exit 0
fi
give_away() { if [ "$(id -u)" = 0 ]; then chown -R 65534:65534 "$@"; fi; }

ro="$WORK/ro-cache"
mkdir -p "$ro"
give_away "$ro"
chmod 0500 "$ro"
KJIT="$WORK/as_other.sh" KJIT_CACHE_DIR="$ro" run 0 inspect "$spec0"
contains "$OUT" "not stored in the disk cache $ro: it is read-only"
chmod 0700 "$ro"

# clear and prune report each entry they cannot delete, and exit 1.
cc="$WORK/undeletable"
KJIT_CACHE_DIR="$cc" run 0 inspect "$spec0"
KJIT_CACHE_DIR="$cc" run 0 inspect "$spec1"
give_away "$cc"
fan_outs=$(find "$cc/v1" -mindepth 3 -maxdepth 3 -type d)
for dir in $fan_outs; do
  if [ "$(id -u)" = 0 ]; then chown 0:0 "$dir"; fi
  chmod 0555 "$dir"
done
KJIT="$WORK/as_other.sh" KJIT_CACHE_DIR="$cc" run 1 cache prune --max-size 0
contains "$ERR" "kjit: cannot remove $cc/v1/"
contains "$ERR" "could not be removed"
contains "$OUT" "removed 0 entries"
KJIT="$WORK/as_other.sh" KJIT_CACHE_DIR="$cc" run 1 cache clear
contains "$ERR" "kjit: cannot remove $cc/v1/"
contains "$ERR" "2 file(s) or directories could not be removed"
KJIT_CACHE_DIR="$cc" run 0 cache stats
contains "$OUT" "entries  2"
for dir in $fan_outs; do chmod 0755 "$dir"; done
echo "cache: ok"
