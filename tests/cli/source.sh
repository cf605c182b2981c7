#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kjit source: the stub with line numbers, then every included template with line numbers.
. "$(dirname "$0")/common.sh"

run 0 source 'probe:heavy=1@sm_90'
contains "$OUT" "// ===== stub (probe:heavy=1@sm_90) ====="
contains "$OUT" '#include "templates/probe/probe.cuh"'
contains "$OUT" "// ===== templates/probe/probe.cuh ====="
printf '%s\n' "$OUT" | grep -qE '^ +1  ' || fail "no line numbers: $OUT"
# The template as printed is the template file, line for line.
lines=$(wc -l <"$SRC/templates/probe/probe.cuh")
printf '%s\n' "$OUT" | grep -qE "^ +$lines  " || fail "probe.cuh has $lines lines, not shown"

run 0 plan gdn_decode --batch 8 --heads 16 --v-heads 32 --k 128 --v 128 --arch sm_90 --json
spec=$(json 'j["launches"][0]["spec"]' "$OUT" '.launches[0].spec')
run 0 source "$spec"
contains "$OUT" "// ===== templates/gdn_decode/gdn_decode.cuh ====="
# Transitive includes of the template are shown too.
for include in $(grep -oE '#include "templates/[^"]+"' "$SRC/templates/gdn_decode/gdn_decode.cuh" | cut -d'"' -f2); do
  contains "$OUT" "// ===== $include ====="
done
echo "source: ok"
