#!/bin/bash
# Issue 17: the engine benchmarks before (b009c27, pre-restructure) and after the restructure,
# alternating on the same host, 3 rounds; run from the repository root with the project's venv:
#   bash docs/results/bench_restructure/run.sh [NEW_COMMIT]   (default: HEAD)
# then: python docs/results/bench_restructure/summary.py
set -e
ROOT=$PWD
OUT=$ROOT/docs/results/bench_restructure
PY=${PY:-$ROOT/.venv/bin/python}
git worktree add -f /tmp/old17 b009c27 >/dev/null 2>&1 || true
git worktree add -f /tmp/new17 "${1:-HEAD}" >/dev/null 2>&1 || true
for round in 1 2 3; do
  for mode in sampling scoring; do
    (cd /tmp/old17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.bench $mode --json $OUT/old_${mode}_$round.json)
    (cd /tmp/new17 && PYTHONPATH=$PWD $PY -m jaxrl_mt.benchmarks $mode --json $OUT/new_${mode}_$round.json)
  done
done
