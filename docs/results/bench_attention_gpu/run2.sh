#!/usr/bin/env bash
# Issue 31's second device call, after `cudnn` became the rolled sequence-length layout with a
# run-time blockwise branch: parity (with a row holding a gap), Qwen2.5-1.5B cudnn at 8,192 tokens,
# Qwen2.5-7B cudnn and blockwise (the first call's step timed out before blockwise). Logs under $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/tmp/attn_out}; mkdir -p "$O"
PY=${PYTHON:-python3}; LEN=${LEN:-8192}; S1=${S1:-qwen2.5-1.5b}; S2=${S2:-qwen2.5-7b}
B="$PY -m jaxrl_mt.benchmarks attention --dtype bfloat16 --length $LEN --remat"
timeout ${T0:-45} $B --shape tiny --length 256 --programs score --impls cudnn --parity --repeats 1 \
  > "$O/parity2.log" 2>&1; echo "parity rc=$?"; cat "$O/parity2.log"
timeout ${T1:-70} $B --shape "$S1" --programs score,prefill,train --impls cudnn \
  --json "$O/s1_cudnn2.json" > "$O/s1_cudnn2.log" 2>&1; echo "s1 rc=$?"; cat "$O/s1_cudnn2.log"
timeout ${T2:-210} $B --shape "$S2" --programs prefill,train --impls cudnn,blockwise \
  --json "$O/s2b.json" > "$O/s2b.log" 2>&1; echo "s2 rc=$?"; cat "$O/s2b.log"
