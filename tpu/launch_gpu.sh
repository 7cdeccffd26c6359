#!/usr/bin/env bash
# Launches `python -m jaxrl_mt.train` on one multi-GPU host: one process drives all local GPUs,
# laid out as the mesh "data,fsdp,tensor" (e.g. 1,8,1: parameters and optimizer state sharded
# over 8 GPUs; 8,1,1: data parallel).
#
# Usage: tpu/launch_gpu.sh [--config configs/rlsta.py:paper] [--mesh 1,8,1] [--gpus 0,1,2,3]
#          [--workdir DIR] [--dry-run] [-- --config.rl.lr=1e-6 ...]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

CONFIG="configs/rlsta.py:paper" MESH="auto" GPUS="" WORKDIR=""
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --mesh) MESH="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

cmd=(env XLA_PYTHON_CLIENT_MEM_FRACTION=0.9)
[[ -n "$GPUS" ]] && cmd+=("CUDA_VISIBLE_DEVICES=$GPUS")
cmd+=(.venv/bin/python -m jaxrl_mt.train --config "$CONFIG" "--config.mesh_shape=$MESH")
[[ -n "$WORKDIR" ]] && cmd+=("--config.workdir=$WORKDIR")
cmd+=("${EXTRA[@]}")
run "${cmd[@]}"
