#!/usr/bin/env bash
# For the GPU machine (no network, torch and triton installed, no fmt/xxhash): unpacks the .deb
# files and installs the wheels that scripts/fetch_deps.sh put into .deps/, builds and installs
# the Python package, runs the CPU and GPU pytest suites and the Python benchmark. Logs go to
# $OUT (default ./out); a compact summary is printed last.
# Usage: bash scripts/device_python.sh [--quick]   (--quick: fewer benchmark shapes)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
source "$root/scripts/lib.sh"
out=${OUT:-$root/out}
mkdir -p "$out" /tmp/deps
t0=$(date +%s)
for f in "$root"/.deps/*.deb; do dpkg -x "$f" /tmp/deps; done
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-py-cache}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}

# No venv: the machine's python3 (the one holding torch) may itself be a venv, whose packages a
# --system-site-packages venv would not see. Everything installs into a target folder on
# PYTHONPATH instead; the image already has nanobind, scikit-build-core, pytest and numpy.
py=python3
site=/tmp/kjit-py-site
mkdir -p "$site"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
pip_install() {
  "$py" -m pip install -q --no-index --find-links "$root/.deps/wheels" --target "$site" "$@"
}
need=()
for module in nanobind scikit_build_core pytest numpy; do
  "$py" -c "import $module" 2>/dev/null || need+=("${module//_/-}")
done
if [ ${#need[@]} -gt 0 ]; then
  pip_install "${need[@]}" >"$out/pip_deps.log" 2>&1 ||
    { echo "pip: dependency install failed"; tail -5 "$out/pip_deps.log"; exit 1; }
fi
pip_install --no-deps fla-core einops >>"$out/pip_deps.log" 2>&1 ||
  echo "note: fla-core not installed (benchmark anchor unavailable)"
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

t1=$(date +%s)
kjit_python_package_into "$site" "$out/python_build.log" ||
  { echo "python package build FAILED"; grep -E 'error|Error' "$out/python_build.log" | head -20; exit 1; }
echo "python package build: $(( $(date +%s) - t1 )) s"
# Whether kjit._kjit_torch (the C++ torch tensor reader) was built, and whether it loads.
grep -E 'kjit: (building kjit._kjit_torch|torch not importable)' "$out/python_build.log" |
  sed 's/^ *//' | head -2
fastpath=$(cd /tmp && "$py" -c "import kjit; print('torch fast path: ' + ('loaded' if kjit.torch_fastpath() else 'NOT in use: ' + str(kjit.torch_fastpath_error)))" 2>&1 | tail -1)
echo "$fastpath"

t2=$(date +%s)
(cd "$root/tests/python" && timeout 300 "$py" -m pytest -q -rfEs -p no:cacheprovider \
  --junitxml="$out/pytest.xml" . >"$out/pytest.log" 2>&1)
rc=$?
echo "pytest rc=$rc ($(( $(date +%s) - t2 )) s)"
grep -E '^(FAILED|ERROR|SKIPPED)' "$out/pytest.log" | head -30

t3=$(date +%s)
if [ "${KJIT_PY_BENCH:-1}" != 0 ]; then  # KJIT_PY_BENCH=0: tests only
  timeout 240 "$py" "$root/bench/python/bench_ops.py" "$@" --json "$out/bench_python.json" \
    >"$out/bench_python.txt" 2>&1
  echo "bench rc=$? ($(( $(date +%s) - t3 )) s)"
fi

echo "===== summary"
echo "$fastpath"
cat "$out/bench_python.txt"
tail -1 "$out/pytest.log"
echo "total: $(( $(date +%s) - t0 )) s"
