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
