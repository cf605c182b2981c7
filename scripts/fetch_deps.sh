#!/usr/bin/env bash
# Downloads the .deb files of fmt, xxHash and doctest into .deps/ (git-ignored), for the GPU
# machine, which has no network: scripts/device.sh unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libfmt-dev libfmt9 libxxhash-dev libxxhash0 doctest-dev
# Wheels for the Python package on the GPU machine (its Python is 3.12; no network there):
# the build backend and binding library, pytest and NumPy for the tests, and fla-core (the
# fla kernels, pure Python) + einops as benchmark anchors. fla-core's own requirement, torch,
# is already installed there: --no-deps keeps pip from fetching it.
mkdir -p wheels
pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
  --platform manylinux_2_17_x86_64 --platform any -d wheels \
  nanobind scikit-build-core pytest numpy
pip download -q --only-binary=:all: --no-deps --python-version 3.12 --platform any -d wheels \
  fla-core einops
