#!/bin/bash
# Issue 17, the two benchmarks run.sh does not cover: the GRPO step against TRL and the LiC simulator
# ratio, before (b009c27) and after, the same work on both sides (remat on, as the old default; 3
# steps, the first compiles), nothing else running. From the repository root with the project's venv:
#   bash docs/results/bench_restructure/run_grpo_sim.sh [NEW_COMMIT]   (default: HEAD; ~45 min on 2 cores)
# Writes grpo_{old,new}.json and sim_{old,new}_{1,2,3}.txt next to this script.
set -e
ROOT=$PWD
OUT=$ROOT/docs/results/bench_restructure
PY=${PY:-$ROOT/.venv/bin/python}
git worktree add -f /tmp/old17 b009c27 >/dev/null 2>&1 || true
git worktree add -f /tmp/new17 "${1:-HEAD}" >/dev/null 2>&1 || true
(cd /tmp/old17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.rl.bench_grpo --steps 3 --json $OUT/grpo_old.json)
(cd /tmp/new17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.benchmarks grpo --steps 3 --remat on --json $OUT/grpo_new.json)
for round in 1 2 3; do
  (cd /tmp/old17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.eval.bench_sim > $OUT/sim_old_$round.txt 2>&1)
  (cd /tmp/new17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.benchmarks simulator > $OUT/sim_new_$round.txt 2>&1)
done
