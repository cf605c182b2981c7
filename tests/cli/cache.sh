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
echo "cache: ok"
