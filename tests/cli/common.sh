# SPDX-License-Identifier: Apache-2.0
# Helpers of the CLI tests. Each test script is run as: <script> <kjit binary> <source dir>
# <work dir>, and sources this file. The work dir is emptied first; the disk cache lives in it.
set -u
KJIT="$1"
SRC="$2"
WORK="$3"
rm -rf "$WORK"
mkdir -p "$WORK"
export KJIT_CACHE_DIR="$WORK/cache"
export KJIT_LOG=error
unset KJIT_BUNDLE_PATH KJIT_DISABLE_JIT KJIT_NVRTC_LIBRARY

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# run <expected exit code> <args...>: runs kjit, leaves stdout in $OUT and stderr in $ERR.
run() {
  local expected="$1"
  shift
  "$KJIT" "$@" >"$WORK/stdout" 2>"$WORK/stderr"
  local code=$?
  OUT="$(cat "$WORK/stdout")"
  ERR="$(cat "$WORK/stderr")"
  if [ "$code" != "$expected" ]; then
    echo "--- stdout" >&2
    echo "$OUT" >&2
    echo "--- stderr" >&2
    echo "$ERR" >&2
    fail "kjit $* exited $code, expected $expected"
  fi
}

# A usage error: exit code 2 and exactly one line on stderr, no stack trace.
usage_error() {
  run 2 "$@"
  local lines
  lines=$(printf '%s\n' "$ERR" | grep -c .)
  [ "$lines" = 1 ] || fail "kjit $* printed $lines lines on stderr, expected 1: $ERR"
  case "$ERR" in kjit:*) ;; *) fail "kjit $*: stderr does not start with 'kjit:': $ERR" ;; esac
}

contains() {
  case "$1" in *"$2"*) ;; *) fail "expected '$2' in: $1" ;; esac
}

# json <expression over the object j> <json text>: prints the value (python3, else jq).
json() {
  if command -v python3 >/dev/null 2>&1 && python3 -c 'import json' 2>/dev/null; then
    printf '%s' "$2" | python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"
  else
    printf '%s' "$2" | jq -r "$3"
  fi
}

# Skips (exit 77) when NVRTC cannot be loaded: compile tests need the toolkit.
require_nvrtc() {
  "$KJIT" inspect 'probe:heavy=0@sm_90' --resources >"$WORK/nvrtc.out" 2>&1 || {
    if grep -qi "nvrtc" "$WORK/nvrtc.out"; then
      echo "SKIPPED: NVRTC is not available: $(head -1 "$WORK/nvrtc.out")"
      exit 77
    fi
    cat "$WORK/nvrtc.out" >&2
    fail "kjit inspect of the probe failed"
  }
}

# flip_byte <file> <offset>: xors one byte with 0x01 in place.
flip_byte() {
  local byte
  byte=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
