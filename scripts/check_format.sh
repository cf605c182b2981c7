#!/usr/bin/env bash
# Fails when any tracked C++/CUDA file differs from clang-format's output.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.h' '*.cuh' '*.cu')
if [ ${#files[@]} -eq 0 ]; then exit 0; fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/kjit-format.log; then
  grep -E '^[^ ].*: (warning|error):' /tmp/kjit-format.log | cut -d: -f1 | sort -u | sed 's/^/needs clang-format: /' >&2
  echo "format check failed: run clang-format -i on the files above" >&2
  exit 1
fi
echo "format check: ${#files[@]} files clean"
