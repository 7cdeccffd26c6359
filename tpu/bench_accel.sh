#!/usr/bin/env bash
# Runs the accelerator benchmark on this machine's first GPU / TPU chip: decode, scoring and GRPO
# train-step rates of Qwen2.5-0.5B and -1.5B shapes (random bf16 weights, nothing downloaded) at
# batch 1..256, against the chip's peaks, written as a markdown table (and the numbers as JSON).
#
# Usage: tpu/bench_accel.sh [--out docs/results/accel_{device}.md] [--shapes qwen2.5-0.5b,qwen2.5-1.5b]
#          [--batches 1,2,4,8,16,32,64,128,256] [--new-tokens 128] [--prompt-len 128] [--no-remat]
#          [--python .venv/bin/python] [--dry-run] [-- EXTRA ARGS of python -m jaxrl_mt.benchmarks accel]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

OUT="docs/results/accel_{device}.md" SHAPES="qwen2.5-0.5b,qwen2.5-1.5b" BATCHES="1,2,4,8,16,32,64,128,256"
# remat on by default: the 0.5B train step at 256 x 256 tokens needs ~164 GiB of activations without it
NEW_TOKENS=128 PROMPT_LEN=128 REMAT=1 PYTHON=".venv/bin/python"
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --shapes) SHAPES="$2"; shift 2 ;;
    --batches) BATCHES="$2"; shift 2 ;;
    --new-tokens) NEW_TOKENS="$2"; shift 2 ;;
    --prompt-len) PROMPT_LEN="$2"; shift 2 ;;
    --remat) REMAT=1; shift ;;
    --no-remat) REMAT=0; shift ;;
    --python) PYTHON="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ "$OUT" == *.md ]] || die "--out must end in .md, got $OUT"

cmd=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 "$PYTHON" -m jaxrl_mt.benchmarks accel --shape "$SHAPES"
     --batch "$BATCHES" --dtype bfloat16 --new-tokens "$NEW_TOKENS" --prompt-len "$PROMPT_LEN"
     --markdown "$OUT" --json "${OUT%.md}.json")
[[ "$REMAT" == 1 ]] && cmd+=(--remat)
cmd+=("${EXTRA[@]}")
run "${cmd[@]}"
