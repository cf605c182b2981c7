#!/usr/bin/env bash
# Compiles the library's and the CLI's sources with clang++ -fsyntax-only, with the flags of the
# main (g++) build's compile_commands.json. The libFuzzer stage (docs/reliability.md) builds
# both with clang, and twice a C++20 feature that clang 14 lacks (a lambda capturing a structured
# binding) compiled under g++ and broke it unnoticed (lib/cache/bundle.cpp, tools/manifest.cpp).
# Skips, saying why, when clang++ is not on PATH. Usage: bash scripts/check_clang.sh [build dir]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
build=${1:-$KJIT_BUILD}
if ! command -v clang++ >/dev/null; then
  echo "clang check: skipped: no clang++ on PATH"
  exit 0
fi
if [ ! -f "$build/compile_commands.json" ]; then
  echo "clang check: no $build/compile_commands.json (build first)" >&2
  exit 1
fi
start=$(date +%s)
log=$(mktemp)
units=$(mktemp)
trap 'rm -f "$log" "$units"' EXIT
# One shell command per translation unit of lib/ and tools/ (a unity file counts when it
# includes them), with the g++ flags kept except -Werror: a warning that clang has and g++ has
# not is not what this checks.
python3 - "$build/compile_commands.json" "$KJIT_ROOT" >"$units" <<'PY'
import json, shlex, sys
root = sys.argv[2]
for unit in json.load(open(sys.argv[1])):
    src = unit["file"]
    text = open(src).read() if src.endswith(".cxx") else ""
    if not any(f"{root}/{d}/" in src or f"{root}/{d}/" in text for d in ("lib", "tools")):
        continue
    args, kept, skip = shlex.split(unit["command"])[1:], [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = True
        elif a != "-Werror" and a != src:
            kept.append(a)
    print(f"cd {shlex.quote(unit['directory'])} && clang++ {shlex.join(kept)} -fsyntax-only "
          f"{shlex.quote(src)} || echo 'clang check: {src} does not compile'")
PY
count=$(wc -l <"$units")
# As many at once as there are cores.
running=0
while IFS= read -r command; do
  bash -c "$command" >>"$log" 2>&1 &
  running=$((running + 1))
  if [ "$running" -ge "$(nproc)" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done <"$units"
wait
failed=$(grep -c "^clang check: .* does not compile" "$log" || true)
if [ "$failed" -gt 0 ]; then
  grep -E "error:|does not compile" "$log" | head -20 >&2
  echo "clang check failed: $failed of $count translation units ($(clang++ --version | head -1))" >&2
  exit 1
fi
echo "clang check: $count translation units of lib/ and tools/ compile with $(clang++ --version | head -1) ($(($(date +%s) - start)) s)"
