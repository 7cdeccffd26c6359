#!/usr/bin/env bash
# The device check: on this machine's first GPU / TPU chip, in under 8 minutes on one H100 and with
# nothing downloaded, runs 3 trainer steps of configs/rlsta.py:paper_shapes (random:qwen2.5-1.5b),
# `benchmarks accel` (Qwen2.5-0.5B/1.5B shapes), the embedded model's device-vs-CPU parity and a
# greedy LiC evaluation (FULL + SHARDED, 32 conversations); writes device_check.json + .md under
# $OUT when set, else docs/results/device/<device kind>/, and prints where.
#
# Usage: tpu/device_check.sh [--shape full|tiny] [--out DIR] [--parts device,train,accel,parity,lic,memory]
#          [--budget PART=SECONDS]... [--python .venv/bin/python] [--dry-run]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

SHAPE="full" PYTHON=".venv/bin/python" OUT_DIR="" PARTS=""
BUDGETS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --shape) SHAPE="$2"; shift 2 ;;
    --out) OUT_DIR="$2"; shift 2 ;;
    --parts) PARTS="$2"; shift 2 ;;
    --budget) BUDGETS+=(--budget "$2"); shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ "$SHAPE" == full || "$SHAPE" == tiny ]] || die "--shape must be full or tiny, got $SHAPE"

cmd=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 "$PYTHON" -m jaxrl_mt.benchmarks device_check --shape "$SHAPE")
[[ -n "$OUT_DIR" ]] && cmd+=(--out "$OUT_DIR")
[[ -n "$PARTS" ]] && cmd+=(--parts "$PARTS")
cmd+=("${BUDGETS[@]}")
run "${cmd[@]}"
