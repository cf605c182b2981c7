#!/usr/bin/env bash
# Downloads the .deb files of fmt, xxHash and doctest into .deps/ (git-ignored), for the GPU
# machine, which has no network: scripts/device.sh unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps && cd .deps
apt-get download libfmt-dev libfmt9 libxxhash-dev libxxhash0 doctest-dev
