#!/bin/bash
# Issue 18: the experiment's own GRPO step (configs/rlsta.py:experiment: 4 prompts x G 6, prompt bucket 256,
# 64 new tokens, T 0.5, beta 1e-3) before and after the speed work, the same work on both sides: the same
# 83 filtered training items (copied from the experiment's run folder, so no filtering runs), no probe, the
# same seed; nothing else running. From the repository root with the project's venv:
#   bash docs/results/bench_experiment_step/run.sh [RUN_DIR] [OLD] [NEW]
#   (defaults: runs/rlsta_exp, 5d26c6d (before session 8), HEAD; STEPS=4 in the environment; ~15 min on 2 cores)
# Writes {old,new}.log, metrics_{old,new}.jsonl and summary.md next to this script.
set -e
ROOT=$PWD
OUT=$ROOT/docs/results/bench_experiment_step
PY=${PY:-$ROOT/.venv/bin/python}
RUN=${1:-runs/rlsta_exp}
STEPS=${STEPS:-4}
for f in histories.jsonl histories.jsonl.stats.json train_items.jsonl train_items.jsonl.stats.json; do
  [ -f "$RUN/$f" ] || { echo "$RUN/$f: not found (run the experiment's RLSTA arm first)" >&2; exit 2; }
done
declare -A REV=([old]=${2:-5d26c6d} [new]=${3:-HEAD})
for side in old new; do
  tree=/tmp/bench_exp_$side wd=/tmp/bench_exp_wd_$side
  rm -rf "$tree" "$wd"; git worktree prune
  git worktree add -f --detach "$tree" "${REV[$side]}" >/dev/null
  mkdir -p "$wd" && cp "$RUN"/histories.jsonl* "$RUN"/train_items.jsonl* "$wd"/
  (cd "$tree" && PYTHONPATH=$PWD /usr/bin/time -v "$PY" -m jaxrl_mt.train --config configs/rlsta.py:experiment \
     --config.workdir="$wd" --config.rl.steps="$STEPS" --config.eval.probe_source= --config.checkpoint.every=1000) \
     > "$OUT/$side.log" 2>&1
  cp "$wd/metrics.jsonl" "$OUT/metrics_$side.jsonl"
  echo "commit $(git -C "$tree" rev-parse HEAD)" >> "$OUT/$side.log"
done
"$PY" "$OUT/summary.py" "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
