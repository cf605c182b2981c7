#!/usr/bin/env bash
# Lays out vLLM's Triton kernels as anchors for the GPU machine (no network there; torch and triton
# are), from one vLLM wheel: nothing of vLLM is committed, everything lands in git-ignored folders.
#   .anchors/vllm_anchor/   causal_conv1d, fused_recurrent (packed GDN decode, with fla's op and
#                           utils beside it) and merge_attn_states (vLLM's Triton merge), importable
#                           as `vllm_anchor.<module>` from KJIT_ANCHORS_DIR=.anchors (the compat
#                           tests and bench/python/compat_bench.py)
#   .anchors/vllm/          the few `vllm.*` names those files import (platform queries, PAD_SLOT_ID,
#                           NULL_BLOCK_ID), stubbed, so that vLLM itself need not be installed
#                           (it shadows a real vLLM in a process that puts .anchors first on its
#                           path: the anchors are for processes without one)
# bench/python/bench_causal_conv1d_vllm.py and compat_bench.py import them from there too. Carry
# `.anchors/vllm_anchor` and `.anchors/vllm` to the GPU machine.
# Usage: bash scripts/fetch_vllm_anchors.sh [WHEEL]   (default: pip download of vllm==$VLLM_VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${VLLM_VERSION:-0.34.0}
wheel=${1:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$wheel" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$work" "vllm==$version"
  wheel=$(ls "$work"/vllm-*.whl)
fi
[ -f "$wheel" ] || {
  echo "fetch_vllm_anchors: no wheel at '$wheel'" >&2
  exit 1
}

take() {  # take <path in the wheel> <destination>
  unzip -p "$wheel" "$1" >"$2" || {
    echo "fetch_vllm_anchors: $1 is not in $(basename "$wheel") (vLLM moved it?)" >&2
    exit 1
  }
}
fla=vllm/third_party/flash_linear_attention/ops
rm -rf .anchors/vllm_anchor .anchors/vllm
mkdir -p .anchors/vllm_anchor
echo "# vLLM $version's Triton kernels (scripts/fetch_vllm_anchors.sh); not kjit's code." \
  >.anchors/vllm_anchor/__init__.py
take vllm/model_executor/layers/mamba/ops/causal_conv1d.py .anchors/vllm_anchor/causal_conv1d.py
take "$fla/fused_recurrent.py" .anchors/vllm_anchor/fused_recurrent.py
take "$fla/op.py" .anchors/vllm_anchor/op.py
take "$fla/utils.py" .anchors/vllm_anchor/utils.py
take vllm/v1/attention/ops/triton_merge_attn_states.py .anchors/vllm_anchor/merge_attn_states.py

# The stubbed vllm package: only what the files above import.
mkdir -p .anchors/vllm/v1/attention/backends .anchors/vllm/utils
for d in .anchors/vllm .anchors/vllm/v1 .anchors/vllm/v1/attention .anchors/vllm/utils; do
  echo "# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh), not vLLM." >"$d/__init__.py"
done
cat >.anchors/vllm/platforms.py <<'EOF'
# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh): vLLM's current_platform as its Triton
# kernels query it, answered for the CUDA device torch sees.
import torch


class _CudaPlatform:
    # The yes / no questions: a CUDA device, no programmatic dependent launch (one kernel timed
    # alone gains nothing from it).
    _ANSWERS = {"is_cuda": True, "is_cuda_alike": True, "is_rocm": False, "is_xpu": False,
                "is_cpu": False, "is_arch_support_pdl": False}

    def get_device_name(self, device_id=0):
        return torch.cuda.get_device_name(device_id)

    def get_device_capability(self, device_id=0):
        major, minor = torch.cuda.get_device_capability(device_id)
        return type("Capability", (), {"major": major, "minor": minor})()

    def has_device_capability(self, capability, device_id=0):
        major, minor = torch.cuda.get_device_capability(device_id)
        want = capability if isinstance(capability, tuple) else divmod(capability, 10)
        return (major, minor) >= tuple(want)

    def is_device_capability(self, capability, device_id=0):
        major, minor = torch.cuda.get_device_capability(device_id)
        return major * 10 + minor == capability

    def is_device_capability_family(self, capability, device_id=0):
        return torch.cuda.get_device_capability(device_id)[0] == capability // 10

    def fp8_dtype(self):
        return torch.float8_e4m3fn

    def __getattr__(self, name):
        if name in _CudaPlatform._ANSWERS:
            return lambda *args, **kwargs: _CudaPlatform._ANSWERS[name]
        raise AttributeError(f"the anchors' vllm stub has no current_platform.{name} "
                             "(scripts/fetch_vllm_anchors.sh)")


current_platform = _CudaPlatform()
EOF
cat >.anchors/vllm/triton_utils.py <<'EOF'
# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh).
import triton
import triton.language as tl

try:
    from triton.language.extra import libdevice as tldevice
except ImportError:  # older triton
    tldevice = None
EOF
cat >.anchors/vllm/utils/platform_utils.py <<'EOF'
# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh).
import functools

import torch


@functools.cache
def cuda_get_device_properties(device, names):
    properties = torch.cuda.get_device_properties(device)
    return tuple(getattr(properties, name) for name in names)
EOF
cat >.anchors/vllm/v1/attention/backends/utils.py <<'EOF'
# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh): vLLM's padding rules.
PAD_SLOT_ID = -1
NULL_BLOCK_ID = 0
EOF
echo "# Stub for kjit's anchors (scripts/fetch_vllm_anchors.sh)." \
  >.anchors/vllm/v1/attention/backends/__init__.py
# What the files import from vllm, against what the stub has: a new import fails here, not there.
grep -hoE '^ *from vllm[.a-z0-9_]* import [A-Za-z_, ]+' .anchors/vllm_anchor/*.py | sort -u
echo "vLLM $version anchors in .anchors/vllm_anchor (stubs in .anchors/vllm)"
