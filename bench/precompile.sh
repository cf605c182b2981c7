#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Precompile throughput: specs compiled per second by `kjit precompile` with 1 worker process
# and with N workers (default: the CPU count), each run on a cold, private disk cache, so that
# every spec is really compiled by NVRTC. Prints one JSON object per run and the speed-up.
#
# usage: bench/precompile.sh <kjit binary> [manifest] [arch] [N]
set -euo pipefail
KJIT="${1:?usage: bench/precompile.sh <kjit binary> [manifest] [arch] [jobs]}"
MANIFEST="${2:-$(dirname "$0")/../cache/manifests/qwen3_next_gdn_tp4.txt}"
ARCH="${3:-sm_90}"
JOBS="${4:-$(nproc)}"
WORK=$(mktemp -d /tmp/kjit-bench-precompile-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export KJIT_LOG=error

declare -A rate
for jobs in 1 "$JOBS"; do
  export KJIT_CACHE_DIR="$WORK/cache-j$jobs"
  out=$("$KJIT" precompile "$MANIFEST" --arch "$ARCH" -o "$WORK/j$jobs.kjb" -j "$jobs" 2>&1)
  line=$(printf '%s\n' "$out" | grep '^compiled ')
  # "compiled N specs in T s with J worker(s): R specs/s, F failed"
  specs=$(awk '{print $2}' <<<"$line")
  seconds=$(awk '{print $5}' <<<"$line")
  rate[$jobs]=$(awk '{print $10}' <<<"$line")
  printf '{"bench":"precompile","manifest":"%s","arch":"%s","jobs":%s,"specs":%s,"seconds":%s,"specs_per_s":%s}\n' \
    "$(basename "$MANIFEST")" "$ARCH" "$jobs" "$specs" "$seconds" "${rate[$jobs]}"
done
awk -v a="${rate[1]}" -v b="${rate[$JOBS]}" -v j="$JOBS" \
  'BEGIN { printf "{\"bench\":\"precompile\",\"speedup_j%s_over_j1\":%.2f}\n", j, b / a }'
