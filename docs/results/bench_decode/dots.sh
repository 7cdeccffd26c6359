#!/usr/bin/env bash
# YNNPACK's dots (XLA:CPU's default from jaxlib 0.10) against Eigen's, same run, alternating, idle host:
# the decode step at batch 1-32 (decode_batch.py, whole program under XLA_FLAGS), then `bench sampling`
# (the decode kernels only, JAXRL_MT_DECODE_DOTS) and `bench scoring` (whole program, XLA_FLAGS).
# Run from the repository root: bash docs/results/bench_decode/dots.sh > docs/results/bench_decode/dots_session12.txt
set -u
PY=${PY:-.venv/bin/python}
OFF=--xla_cpu_experimental_ynn_fusion_type=
for round in 1 2; do
  for dots in xla eigen; do
    flags=""; [ "$dots" = eigen ] && flags=$OFF
    echo "== round $round: decode step, dots $dots (XLA_FLAGS='$flags')"
    XLA_FLAGS="$flags" $PY docs/results/bench_decode/decode_batch.py 2>&1 | grep -v -i warn
  done
done
for round in 1 2; do
  for dots in xla eigen; do
    echo "== round $round: bench sampling, JAXRL_MT_DECODE_DOTS=$dots"
    JAXRL_MT_DECODE_DOTS=$dots $PY -m jaxrl_mt.benchmarks sampling 2>&1 | grep -v -i warn | tail -8
  done
done
for dots in xla eigen; do
  flags=""; [ "$dots" = eigen ] && flags=$OFF
  echo "== bench scoring, dots $dots (XLA_FLAGS='$flags')"
  XLA_FLAGS="$flags" $PY -m jaxrl_mt.benchmarks scoring 2>&1 | grep -v -i warn | tail -6
done
