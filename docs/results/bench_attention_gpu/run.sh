#!/usr/bin/env bash
# Issue 31's device check, one call: the measured bf16 ceiling, kernel parity, then prefill /
# scoring / train step at 8,192 tokens per attention implementation, Qwen2.5-1.5B and -7B shapes
# (random weights: nothing downloaded). Writes logs and JSON under $OUT (default /tmp/attn_out).
# On the device: bash docs/results/bench_attention_gpu/run.sh   (PYTHON, LEN, SHAPES, PEAK override)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
O=${OUT:-/tmp/attn_out}; mkdir -p "$O"
PY=${PYTHON:-python3}; LEN=${LEN:-8192}; S1=${S1:-qwen2.5-1.5b}; S2=${S2:-qwen2.5-7b}; PEAK=${PEAK---peak}
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv 2>&1
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  date -u; } > "$O/env.txt" 2>&1; cat "$O/env.txt"
B="$PY -m jaxrl_mt.benchmarks attention --dtype bfloat16 --length $LEN --remat"
timeout ${T0:-45} $B --shape tiny --length 256 --programs score --impls einsum $PEAK --parity --repeats 1 \
  > "$O/parity.log" 2>&1; echo "parity rc=$?"; cat "$O/parity.log"
timeout ${T1:-240} $B --shape "$S1" --programs score,prefill,extend,train --impls einsum,cudnn,blockwise \
  --json "$O/s1.json" > "$O/s1.log" 2>&1; echo "s1 rc=$?"; cat "$O/s1.log"
JAXRL_MT_CUDNN_MASK=rolled timeout ${T2:-80} $B --shape "$S1" --programs score,prefill,train --impls cudnn \
  --json "$O/s1_rolled.json" > "$O/s1_rolled.log" 2>&1; echo "s1 rolled rc=$?"; cat "$O/s1_rolled.log"
timeout ${T3:-200} $B --shape "$S2" --programs prefill,train --impls cudnn,einsum,blockwise \
  --json "$O/s2.json" > "$O/s2.log" 2>&1; echo "s2 rc=$?"; cat "$O/s2.log"
