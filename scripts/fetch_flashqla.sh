#!/usr/bin/env bash
# Packs FlashQLA (QwenLM's TileLang GDN kernels, issue 19's second anchor) for the GPU machine,
# which has no network: the wheels of flash-qla 0.1.3 and its requirements, unzipped and
# re-zipped without compression so that xz sees their contents (82 MB of wheels -> ~52 MB),
# as .anchors/fq/fqla.tar.xz beside the .deb files scripts/device.sh needs (git-ignored; carry
# `.anchors/fq` alone: .deps would push a call past its 64 MiB). On the GPU machine,
# scripts/device_flashqla.sh builds kjit's Python package, installs these wheels and runs
# bench/python/bench_gdn_prefill_anchors.py beside FlashQLA. FlashQLA JIT-compiles its kernels
# there on first use: 16-50 s per new shape.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" \
  flash-qla==0.1.3 tilelang==0.1.15 apache-tvm-ffi==0.1.12 z3-solver==4.15.4.0 \
  torch-c-dlpack-ext
mkdir -p "$work/stored" .anchors/fq
for wheel in "$work"/wheels/*.whl; do
  unpacked="$work/unpacked"
  rm -rf "$unpacked" && mkdir "$unpacked"
  (cd "$unpacked" && unzip -q "$wheel" && zip -q -0 -r "$work/stored/$(basename "$wheel")" .)
done
tar cf - -C "$work" stored | xz -6 -T0 > .anchors/fq/fqla.tar.xz
cp .deps/*.deb .anchors/fq/ 2>/dev/null || echo "note: run scripts/fetch_deps.sh for the .deb files"
ls -la .anchors/fq
