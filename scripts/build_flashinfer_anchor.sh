#!/usr/bin/env bash
# Builds .anchors/fi/libkjit_fi_prefill.so (git-ignored): FlashInfer's SM90 GDN prefill kernel
# behind bench/anchors/flashinfer_gdn_prefill.cu's C ABI, for bench_gdn_prefill's
# KJIT_PREFILL_ANCHOR_LIB. Here (the CPU machine: nvcc needs no GPU), ~4 minutes on two cores;
# carry the library to the GPU machine. Nothing of FlashInfer or CUTLASS enters the repository:
# their sources are unpacked from local git mirrors (e.g. the `fetch` tool's
# /work/.mirror/<owner>+<name>/repo) into .anchors/fi.
#
#   FI_REPO=<flashinfer git dir> CUTLASS_REPO=<cutlass git dir> bash scripts/build_flashinfer_anchor.sh
#
# FORCE=1 rebuilds every object.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.anchors/fi
fi_repo=${FI_REPO:-/work/.mirror/flashinfer-ai+flashinfer/repo}
cutlass_repo=${CUTLASS_REPO:-/work/.mirror/NVIDIA+cutlass/repo}
fi_commit=28406af5
cutlass_commit=b46b16d0
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out/build"
cd "$out"
if [ ! -f flashinfer/csrc/gdn_prefill_sm90_kernel_inst.jinja ]; then
  mkdir -p flashinfer
  git -C "$fi_repo" archive "$fi_commit" include csrc | tar -x -C flashinfer
fi
if [ ! -f cutlass/include/cutlass/cutlass.h ]; then
  mkdir -p cutlass
  git -C "$cutlass_repo" archive "$cutlass_commit" include tools/util/include | tar -x -C cutlass
fi

# FlashInfer's instantiation template rendered as its JIT renders it: bf16, beta and alpha given,
# the initial state read, no checkpoints; without and with grouped value heads (HV > H).
for gva in 0 1; do
  flag=$([ $gva = 1 ] && echo true || echo false)
  sed -e "s/{{ dtype }}/nv_bfloat16/g" -e "s/{{ is_gva }}/$flag/g" -e "s/{{ needs_beta }}/true/g" \
    -e "s/{{ needs_alpha }}/true/g" -e "s/{{ init_state }}/true/g" \
    -e "s/{{ enable_checkpointing }}/false/g" \
    flashinfer/csrc/gdn_prefill_sm90_kernel_inst.jinja >build/inst_gva$gva.cu.new
  if grep -q '{{' build/inst_gva$gva.cu.new; then
    echo "build_flashinfer_anchor: the template has fields this script does not fill" >&2
    exit 1
  fi
  if cmp -s build/inst_gva$gva.cu.new build/inst_gva$gva.cu; then
    rm build/inst_gva$gva.cu.new
  else
    mv build/inst_gva$gva.cu.new build/inst_gva$gva.cu
  fi
done

includes=(-I"$out/flashinfer/include" -I"$out/flashinfer/csrc" -I"$out/cutlass/include"
  -I"$out/cutlass/tools/util/include")
# shellcheck disable=SC2054 # (the commas are inside one nvcc flag)
common=(-std=c++20 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC
  -Xcompiler -fvisibility=hidden --expt-relaxed-constexpr -static-global-template-stub=false
  -Xfatbin=-compress-all)
# FlashInfer's own flags for this module (its JIT), so that the kernel is the one engines run.
flashinfer_flags=(-use_fast_math -DFLAT_SM90A_ENABLED -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
  -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_F16)
stale() { # stale OUT IN...: OUT is missing or older than an input
  local target=$1
  shift
  [ -n "${FORCE:-}" ] || [ ! -f "$target" ] && return 0
  for f in "$@"; do [ "$f" -nt "$target" ] && return 0; done
  return 1
}
# The two CUTLASS translation units side by side (~3.5-4 minutes each on one core of this machine;
# one after the other took ~7.5, side by side ~4).
pids=()
for gva in 0 1; do
  if stale build/inst_gva$gva.o build/inst_gva$gva.cu; then
    echo "nvcc inst_gva$gva.cu (a CUTLASS translation unit, ~4 minutes)"
    "$nvcc" "${common[@]}" "${flashinfer_flags[@]}" "${includes[@]}" -c build/inst_gva$gva.cu \
      -o build/inst_gva$gva.o &
    pids+=($!)
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || { echo "build_flashinfer_anchor: nvcc failed" >&2; exit 1; }; done
shim=$root/bench/anchors/flashinfer_gdn_prefill.cu
# The shim without fast math: its L2-norm kernel divides and takes square roots exactly.
if stale build/shim.o "$shim"; then
  "$nvcc" "${common[@]}" -c "$shim" -o build/shim.o
fi
echo '{ global: kjit_anchor_name; kjit_anchor_gdn_prefill; kjit_anchor_l2norm; local: *; };' \
  >build/exports.map
# cudart linked statically; the driver is reached through it at run time (CUTLASS finds
# cuTensorMapEncodeTiled by cudaGetDriverEntryPoint), so no -lcuda.
"$nvcc" -shared -cudart=static -gencode=arch=compute_90a,code=sm_90a build/shim.o \
  build/inst_gva0.o build/inst_gva1.o -Xlinker --version-script="$out/build/exports.map" \
  -Xlinker -s -Xlinker --as-needed -o libkjit_fi_prefill.so
ls -l "$out/libkjit_fi_prefill.so"
