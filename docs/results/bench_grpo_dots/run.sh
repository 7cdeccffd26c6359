#!/usr/bin/env bash
# One GRPO step (bench grpo defaults: 4 prompts x G 4, 128 new tokens, 3 steps), idle host, one process at a time:
# our side with the decode kernels on XLA's default dots (YNNPACK) and on Eigen's (JAXRL_MT_DECODE_DOTS),
# our side with Eigen's dots everywhere (XLA_FLAGS: does the update gain too?), then ours against TRL's
# GRPOTrainer in one run with the shipped default. Run from the repository root:
# bash docs/results/bench_grpo_dots/run.sh > docs/results/bench_grpo_dots/log.txt 2>&1
set -u
PY=${PY:-.venv/bin/python}
D=docs/results/bench_grpo_dots
JAXRL_MT_DECODE_DOTS=xla $PY -m jaxrl_mt.benchmarks grpo --only ours --json $D/ours_xla.json 2>&1 | grep -v -i warn
JAXRL_MT_DECODE_DOTS=eigen $PY -m jaxrl_mt.benchmarks grpo --only ours --json $D/ours_eigen.json 2>&1 | grep -v -i warn
XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type= $PY -m jaxrl_mt.benchmarks grpo --only ours \
  --json $D/ours_eigen_everywhere.json 2>&1 | grep -v -i warn
$PY -m jaxrl_mt.benchmarks grpo --json $D/ours_vs_trl.json 2>&1 | grep -v -i warn
# then our side alone with gradient checkpointing forced on (TRL's setting in the run above), for the memory criterion
$PY -m jaxrl_mt.benchmarks grpo --only ours --remat on --json $D/ours_remat_on.json 2>&1 | grep -v -i warn
