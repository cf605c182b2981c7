# Shared by the scripts in this folder: dependency install and configure/build.
# shellcheck shell=bash

KJIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
KJIT_BUILD=${KJIT_BUILD:-$KJIT_ROOT/build}

# Installs what the build needs from Debian's packages when running as root; otherwise says
# what is missing. The CUDA toolkit itself (headers, libnvrtc) is expected at CUDA_HOME or
# /usr/local/cuda.
kjit_ensure_packages() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v ninja >/dev/null || missing+=(ninja-build)
  command -v g++ >/dev/null || missing+=(g++)
  command -v clang-format >/dev/null || missing+=(clang-format)
  [ -f /usr/include/fmt/format.h ] || missing+=(libfmt-dev)
  [ -f /usr/include/xxhash.h ] || missing+=(libxxhash-dev)
  [ -f /usr/include/doctest/doctest.h ] || missing+=(doctest-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "kjit: installing ${missing[*]}"
      apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "kjit: missing packages: ${missing[*]} (run as root to install them, or install them yourself)" >&2
      return 1
    fi
  fi
  local cuda=${KJIT_CUDA_HOME:-${CUDA_HOME:-/usr/local/cuda}}
  if [ ! -f "$cuda/include/nvrtc.h" ]; then
    echo "kjit: no CUDA toolkit at $cuda (need include/cuda.h, include/nvrtc.h and libnvrtc); set CUDA_HOME" >&2
    return 1
  fi
}

# Configures (once) and builds into $KJIT_BUILD. Extra arguments go to cmake's configure step.
kjit_build() {
  if [ ! -f "$KJIT_BUILD/build.ninja" ]; then
    cmake -S "$KJIT_ROOT" -B "$KJIT_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
  fi
  cmake --build "$KJIT_BUILD" -- -j"$(nproc)"
}

# The measurement build of the warp-specialized prefill kernel (docs/performance.md, "Where the
# warpgroups wait"): a copy of the tree at $1 (the build trees, dependencies and anchors left
# out) with KJIT_GDN_WS_PROFILE turned on, bench_gdn_prefill built into $2 against the
# dependencies unpacked under /tmp/deps (the GPU machine's recipe), logs to $3.configure.log and
# $3.build.log. Fails, saying why, when the switch is not found or the build fails.
kjit_ws_profile_build() {
  local src=$1 build=$2 log=$3
  rm -rf "$src" && mkdir -p "$src"
  (cd "$KJIT_ROOT" && tar --exclude='./build*' --exclude=./.deps --exclude=./.ab \
    --exclude=./.anchors --exclude=./out -cf - .) | tar -xf - -C "$src"
  sed -i 's/^#define KJIT_GDN_WS_PROFILE 0$/#define KJIT_GDN_WS_PROFILE 1/' \
    "$src/templates/gdn_prefill/params.h"
  if ! grep -q '^#define KJIT_GDN_WS_PROFILE 1$' "$src/templates/gdn_prefill/params.h"; then
    echo "profile: the switch was not found in params.h" >&2
    return 1
  fi
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKJIT_WERROR=OFF \
    -DCMAKE_PREFIX_PATH=/tmp/deps/usr >"$log.configure.log" 2>&1 &&
    cmake --build "$build" --target bench_gdn_prefill -- -j"$(nproc)" >"$log.build.log" 2>&1 ||
    { grep -E 'error|FAILED' "$log.build.log" | head -20 >&2; return 1; }
}

# Builds kjit's Python package into the target folder $1, the build log to $2 (verbose: the
# callers grep it), against the dependencies unpacked under /tmp/deps (the GPU machine's recipe;
# scripts/device_python.sh and device_flashqla.sh). No venv: the machine's python3 holds torch,
# and a venv beside it would not see its packages; the folder goes on PYTHONPATH instead.
kjit_python_package_into() {
  local site=$1 log=$2
  mkdir -p "$site"
  python3 -m pip install -q -v --no-index --no-build-isolation --no-deps --target "$site" \
    -C cmake.args="-DCMAKE_PREFIX_PATH=/tmp/deps/usr" -C build-dir=/tmp/kjit-py-build \
    "$KJIT_ROOT/python" >"$log" 2>&1
}
