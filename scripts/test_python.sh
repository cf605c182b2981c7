#!/usr/bin/env bash
# Builds and installs the Python package (python/) into a virtual environment and runs its
# pytest suites: the CPU tests always, the GPU tests where torch sees a CUDA device (otherwise
# pytest prints why they were skipped). Usage: bash scripts/test_python.sh [pytest args...]
#   KJIT_PY_VENV  the environment (default build-py/venv; created with system site packages so
#                 an installed torch stays visible)
#   CMAKE_ARGS    extra CMake arguments for the extension build (e.g. -DCMAKE_PREFIX_PATH=...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${KJIT_PY_VENV:-$root/build-py/venv}
if [ ! -x "$venv/bin/python" ]; then
  "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import nanobind, scikit_build_core, pytest, numpy" 2>/dev/null; then
  links=()
  [ -d "$root/.deps/wheels" ] && links=(--find-links "$root/.deps/wheels")
  "$py" -m pip install -q "${links[@]}" nanobind scikit-build-core pytest numpy
fi
t0=$(date +%s)
# --no-build-isolation: build with the environment's nanobind/scikit-build-core (works offline).
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
  "$py" -m pip install -q --no-build-isolation "$root/python"
echo "python package: built and installed in $(( $(date +%s) - t0 )) s"
# Whether torch tensors are read by kjit._kjit_torch (built only when torch was importable).
(cd /tmp && "$py" -c "import kjit; print('torch fast path: ' + ('loaded' if kjit.torch_fastpath() else 'not in use: ' + str(kjit.torch_fastpath_error)))")
cd "$root/tests/python"
# -rfEs: name every failure and error, and the reason of every skipped test (no GPU, no torch,
# no NVRTC).
"$py" -m pytest -q -rfEs -p no:cacheprovider "$@" .
