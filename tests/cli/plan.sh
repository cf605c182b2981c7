#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kjit plan: JSON and text output, every op, and one-line usage errors with exit code 2.
. "$(dirname "$0")/common.sh"

run 0 plan merge_state --dtype bf16 --tokens 64 --heads 256 --head-dim 128 --arch sm_90 --json
J="$OUT"
[ "$(json 'j["op"]' "$J" '.op')" = merge_state ] || fail "op: $J"
[ -n "$(json 'j["mode"]' "$J" '.mode')" ] || fail "mode: $J"
[ "$(json 'len(j["launches"])' "$J" '.launches | length')" = 1 ] || fail "launches: $J"
spec=$(json 'j["launches"][0]["spec"]' "$J" '.launches[0].spec')
case "$spec" in merge_state:*head_dim=128*@sm_90) ;; *) fail "spec: $spec" ;; esac
contains "$spec" "in=bf16"
[ "$(json 'len(j["launches"][0]["grid"])' "$J" '.launches[0].grid | length')" = 3 ] || fail "grid"
[ "$(json 'len(j["launches"][0]["block"])' "$J" '.launches[0].block | length')" = 3 ] || fail "block"
smem=$(json 'j["launches"][0]["dynamic_smem"]' "$J" '.launches[0].dynamic_smem')
[ "$smem" -ge 0 ] || fail "dynamic_smem: $smem"

# The same problem as text, by product name, and with --opt=value spelling.
run 0 plan merge_state --dtype=bf16 --tokens 64 --heads 256 --head-dim 128 --arch h100
contains "$OUT" "launch 1 of 1: $spec"
contains "$OUT" "op merge_state"

run 0 plan merge_states --tokens 7 --states 4 --heads 128 --head-dim 512 --arch sm_100a --json
contains "$(json 'j["launches"][0]["spec"]' "$OUT" '.launches[0].spec')" "@sm_100a"
run 0 plan gdn_decode --batch 8 --heads 16 --v-heads 32 --k 128 --v 128 --state-dtype f32 --arch sm_90
contains "$OUT" "gdn_decode:"
# 512 MiB of state: a ranking kernel first, the step in slot order; --row-order overrides it.
run 0 plan gdn_decode --batch 256 --heads 16 --v-heads 32 --k 128 --v 128 --arch h200
contains "$OUT" "launch 1 of 2: gdn_decode_order:"
contains "$OUT" "ordered=1@sm_90"
run 0 plan gdn_decode --batch 256 --heads 16 --v-heads 32 --k 128 --v 128 --row-order as_given --arch h200
contains "$OUT" "launch 1 of 1: gdn_decode:"
contains "$OUT" "ordered=0@sm_90"
run 0 plan gdn_decode --batch 3 --heads 16 --v-heads 32 --k 128 --v 128 --row-order by_slot --arch h200
contains "$OUT" "forced by options.row_order"
usage_error plan gdn_decode --batch 3 --heads 16 --v-heads 32 --k 128 --v 128 --row-order sorted --arch h200
contains "$ERR" "row_order must be auto, by_slot or as_given, got 'sorted'"
# The fused decode step (gdn_decode with options.conv): one launch of its own kernel.
run 0 plan gdn_decode_conv --batch 1 --heads 16 --v-heads 32 --k 128 --v 128 --arch h200
contains "$OUT" "launch 1 of 1: gdn_decode_conv:"
contains "$OUT" "width=4,warps=16"
contains "$OUT" "cluster (4, 1, 1)"
run 0 plan gdn_decode_conv --batch 1 --heads 16 --v-heads 32 --k 128 --v 128 --arch a100
contains "$OUT" "width=4,warps=32"
usage_error plan gdn_decode_conv --batch 1 --heads 16 --v-heads 32 --k 128 --v 128 --width 9 --arch h200
contains "$ERR" "options.conv->weight"
# causal_conv1d: one 1-D launch at Qwen3-Next's width, in place the sequential mode, and the
# update past grid-y sizes of B and D.
run 0 plan causal_conv1d --tokens 131072 --seqs 16 --dim 8192 --arch h200
contains "$OUT" "width=4,vec=8,chunk=4,span=64,mode=chunked,pool=block,silu=1,stages=4@sm_90"
run 0 plan causal_conv1d --tokens 1000 --seqs 4 --dim 64 --in-place 1 --width 8 --arch sm_80
contains "$OUT" "mode=sequential"
run 0 plan causal_conv1d_update --batch 70000 --steps 4 --dim 65536 --spec 1 --arch h200
contains "$OUT" "mode=rows"
usage_error plan causal_conv1d --tokens 64 --seqs 1 --dim 100 --arch h200
contains "$ERR" "a multiple of 8"
run 0 plan gdn_prefill --tokens 1000 --seqs 4 --heads 16 --v-heads 32 --k 128 --v 128 --arch h200
contains "$OUT" "gdn_prefill:"
contains "$OUT" "ckpt=0,stages=3@sm_90"
contains "$OUT" "P formed by the chunk kernel"
# Where DRAM is slow per SM (below 40 GB/s: the H100 and the H200) many long chains take the
# warp-specialized kernel, and say why.
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 32 --k 128 --v 128 --arch h100
contains "$OUT" "mode chunked_ws"
contains "$OUT" "25.4 GB/s of DRAM bandwidth per SM (< 40 with 32 value heads share each of 16 q/k heads)"
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 32 --k 128 --v 128 --arch h200
contains "$OUT" "mode chunked_ws"
contains "$OUT" "36.4 GB/s of DRAM bandwidth per SM (< 40 with 32 value heads"
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 16 --k 128 --v 128 --arch h200
contains "$OUT" "mode chunked_ws"
contains "$OUT" "36.4 GB/s of DRAM bandwidth per SM (< 40 with one value head per q/k head)"
# A fabricated device: an H100 with 5.4 TB/s of DRAM (40.9 GB/s per SM) keeps the two kernels, and
# says why.
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 32 --k 128 --v 128 --arch base=h100,dram_gbps=5400
contains "$OUT" "mode chunked_bv128_wgmma"
contains "$OUT" "40.9 GB/s of DRAM bandwidth per SM"
run 2 plan gdn_prefill --tokens 8192 --seqs 4 --heads 16 --v-heads 16 --k 128 --v 128 --arch base=h100,dram=4
contains "$ERR" "unknown device key 'dram'"
# State checkpoints: the kernel with ckpt=1, and an interval that is no multiple of 64 refused.
run 0 plan gdn_prefill --tokens 1000 --seqs 4 --heads 16 --v-heads 32 --k 128 --v 128 --checkpoint 128 --arch h200
contains "$OUT" "ckpt=1,stages=3@sm_90"
contains "$OUT" "state checkpoints every 128 tokens"
run 2 plan gdn_prefill --tokens 1000 --seqs 4 --heads 16 --v-heads 32 --k 128 --v 128 --checkpoint 100 --arch h200
contains "$ERR" "checkpoint_every_n_tokens = 100"
# The whole-V state kernel and the chunk kernel's products on wgmma by default on sm_90 (both
# compiled for sm_90a), with P formed by the chunk kernel (two value heads per q/k head; 8k tokens
# in 4 sequences: too few chunks for the warp-specialized kernel).
run 0 plan gdn_prefill --tokens 8192 --seqs 4 --heads 16 --v-heads 32 --k 128 --v 128 --arch h200
contains "$OUT" "mode chunked_bv128_wgmma"
contains "$OUT" "stages=3@sm_90a"
contains "$OUT" "l2norm=1@sm_90a"
contains "$OUT" "P formed by the chunk kernel"
# Who forms P on the mma.sync tiles: the state kernel for the whole-V tile without GVA (both
# kernels say so), the chunk kernel when forced with _p0; _p1 on a narrow tile refused.
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_bv128 --arch h200
contains "$OUT" "l2norm=1,statep=1@sm_90"
contains "$OUT" "stages=3,statep=1@sm_90"
contains "$OUT" "P formed by the state kernel"
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_bv128_p0 --arch h200
contains "$OUT" "P formed by the chunk kernel"
run 2 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_bv32_p1 --arch h200
contains "$ERR" "P is formed by the state kernel's wide mma.sync tiles"
# The warp-specialized kernel: one launch on sm_90a, no workspace; refused before sm_90a.
run 0 plan gdn_prefill --tokens 131072 --seqs 16 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_ws --arch h200
contains "$OUT" "mode chunked_ws"
contains "$OUT" "launch 1 of 1: gdn_prefill_ws:"
contains "$OUT" "@sm_90a"
run 2 plan gdn_prefill --tokens 8192 --seqs 4 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_ws --arch a100
contains "$ERR" "needs compute capability 9.0"
# One long sequence: the context-parallel path (4 launches) and why; a forced segment length; a
# segment length that is no positive number is a usage error.
run 0 plan gdn_prefill --tokens 32768 --seqs 1 --heads 16 --v-heads 16 --k 128 --v 128 --arch h200
contains "$OUT" "mode chunked_cp63_bv128"
contains "$OUT" "launch 4 of 4: gdn_prefill_state_cp:"
contains "$OUT" "context-parallel state: segments of 63 chunks"
run 0 plan gdn_prefill --tokens 32768 --seqs 1 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_cp8_s3 --arch h200
contains "$OUT" "mode chunked_cp8_bv128"
contains "$OUT" "stages=3@sm_90"
run 2 plan gdn_prefill --tokens 32768 --seqs 1 --heads 16 --v-heads 16 --k 128 --v 128 --mode chunked_cp0 --arch h200
contains "$ERR" "options.force_mode 'chunked_cp0' is not a mode"
# Sizes whose fake tensors would overflow int64 are usage errors, not crashes.
run 2 plan gdn_decode --batch 8 --heads 16 --v-heads 32 --k 4611686018427387905 --v 128 --arch h200
contains "$ERR" "k = 4611686018427387905 is out of range"
run 2 plan merge_state --tokens 4 --heads 2 --head-dim 64 --dtype =x --arch h200
contains "$ERR" "'=x' is not a dtype"
run 0 plan --help
contains "$OUT" "--head-dim"
run 0 --help
contains "$OUT" "precompile"

# Bad arguments: one line on stderr, exit 2.
usage_error
usage_error frobnicate
usage_error plan
usage_error plan attention --tokens 1 --arch sm_90
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --arch sm_90 --device 0
usage_error plan merge_state --tokens 64 --heads 8 --arch sm_90
usage_error plan merge_state --tokens many --heads 8 --head-dim 128 --arch sm_90
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --arch sm_42
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --arch sm_90 --color red
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --arch sm_90 --json=yes
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 12 --arch sm_90
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --lse-base 10 --arch sm_90
usage_error plan gdn_decode --batch 8 --heads 3 --v-heads 32 --k 128 --v 128 --arch sm_90
# Issue 20: sizes out of range are named (not reported as their consequence), a missing value
# is named (not "give one op"), and an option given twice is refused.
usage_error plan merge_state --tokens 64 --heads 0 --head-dim 128 --arch sm_90
contains "$ERR" "heads = 0 is out of range; heads must be >= 1"
usage_error plan merge_state --tokens --heads 8 --head-dim 128 --arch sm_90
contains "$ERR" "plan: --tokens needs a value"
usage_error plan merge_state --tokens 64 --heads 8 --heads 16 --head-dim 128 --arch sm_90
contains "$ERR" "--heads given twice ('8', then '16')"
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --head_dim 64 --arch sm_90
contains "$ERR" "--head-dim and --head_dim name the same value"
usage_error plan merge_state --tokens 64 --heads 8 --head-dim 128 --arch sm_90 --arch sm_80
usage_error precompile m.txt --arch sm_90 -o a.kjb -o b.kjb
contains "$ERR" "-o given twice"
# An empty batch is a call an engine makes: it plans, launching nothing.
run 0 plan merge_state --tokens 0 --heads 8 --head-dim 128 --arch sm_90
contains "$OUT" "mode empty"
# The example of the malformed-spec message is a spec that works.
usage_error source 'probe:heavy=1'
example=$(printf '%s\n' "$ERR" | sed -n 's/.*e\.g\. \([^ ]*\).*/\1/p')
[ -n "$example" ] || fail "no example in: $ERR"
run 0 source "$example"
usage_error source
usage_error source 'nofamily:x=1@sm_90'
usage_error inspect 'probe:heavy=2@sm_90'
usage_error cache
usage_error cache prune
usage_error cache prune --max-size lots
usage_error cache explain nothex
usage_error bundle info
usage_error precompile
usage_error precompile /nonexistent.txt --arch sm_90 -o x.kjb
usage_error precompile /nonexistent.txt --arch sm_90 -o x.kjb -j 0

# tests/golden/manifest_plans.txt (compared by the unit suite with what the planners return now)
# is what `kjit plan --json` prints: its records of one merge_state and one gdn_decode problem,
# byte for byte, found by their headers.
golden="$SRC/tests/golden/manifest_plans.txt"
record() { grep -A1 -F -x "# $1" "$golden" | sed -n 2p; }
run 0 plan merge_state --dtype bf16 --head-dim 128 --heads 128 --layout token_major --lse-base e --out-dtype bf16 --pos-inf-empty 1 --tokens 1 --arch sm_80 --json
[ "$OUT" = "$(record 'deepseek_v3_mla_dp.txt:7 merge_state dtype=bf16 head_dim=128 heads=128 layout=token_major lse_base=e out_dtype=bf16 pos_inf_empty=1 tokens=1 @sm_80')" ] || fail "merge_state plan differs from its golden record"
run 0 plan gdn_decode --a-log-dtype f32 --batch 64 --dt-bias-dtype bf16 --dtype bf16 --gate-dtype bf16 --gated 0 --heads 16 --index-dtype i32 --invalid negative --k 128 --l2norm 1 --out-dtype bf16 --row-order auto --state-dtype f32 --v 128 --v-heads 32 --arch sm_86 --json
[ "$OUT" = "$(record 'qwen3_next_gdn_tp1.txt:4 gdn_decode a_log_dtype=f32 batch=64 dt_bias_dtype=bf16 dtype=bf16 gate_dtype=bf16 gated=0 heads=16 index_dtype=i32 invalid=negative k=128 l2norm=1 out_dtype=bf16 row_order=auto state_dtype=f32 v=128 v_heads=32 @sm_86')" ] || fail "gdn_decode plan differs from its golden record"
echo "plan: ok"
