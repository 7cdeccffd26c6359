#!/usr/bin/env bash
# Launches `python -m jaxrl_mt.train` on several GPU hosts, one process per host, all driving one
# global mesh. Two ways:
#   --hosts h0,h1,...: over ssh; host i gets JAX_COORDINATOR_ADDRESS=h0:PORT, JAX_NUM_PROCESSES=N,
#                      JAX_PROCESS_ID=i (read by jaxrl_mt.parallel.maybe_initialize_distributed);
#   --slurm NODES:     one srun task per node; JAXRL_MT_DISTRIBUTED=1 lets JAX read SLURM's variables.
# The checkout (with its .venv, see tpu/install.sh --accelerator cuda12) must sit at --dest on every
# host, and --workdir on a filesystem all hosts share.
#
# Usage: tpu/launch_multinode_gpu.sh (--hosts h0,h1 | --slurm 2) [--port 12355] [--gpus-per-node 8]
#          [--config configs/rlsta.py:paper] [--mesh data,fsdp,tensor] [--workdir DIR] [--dest DIR]
#          [--dry-run] [-- --config.rl.lr=1e-6 ...]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

HOSTS="" SLURM_NODES="" PORT=12355 GPN=8 CONFIG="configs/rlsta.py:paper" MESH="auto" WORKDIR="" DEST="jaxrl_mt"
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) HOSTS="$2"; shift 2 ;;
    --slurm) SLURM_NODES="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --gpus-per-node) GPN="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --mesh) MESH="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --dest) DEST="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -n "$HOSTS" || -n "$SLURM_NODES" ]] || die "give --hosts h0,h1,... or --slurm NODES"
[[ -z "$HOSTS" || -z "$SLURM_NODES" ]] || die "--hosts and --slurm exclude each other"

train=(.venv/bin/python -m jaxrl_mt.train --config "$CONFIG" "--config.mesh_shape=$MESH")
[[ -n "$WORKDIR" ]] && train+=("--config.workdir=$WORKDIR")
train+=("${EXTRA[@]}")

if [[ -n "$SLURM_NODES" ]]; then
  run srun --nodes="$SLURM_NODES" --ntasks-per-node=1 --gpus-per-node="$GPN" --chdir="$DEST" \
    env JAXRL_MT_DISTRIBUTED=1 "${train[@]}"
  exit 0
fi

IFS=, read -r -a hosts <<< "$HOSTS"
n=${#hosts[@]}
coord="${hosts[0]}:$PORT"
for i in "${!hosts[@]}"; do
  env_i=(env "JAX_COORDINATOR_ADDRESS=$coord" "JAX_NUM_PROCESSES=$n" "JAX_PROCESS_ID=$i")
  run_bg ssh "${hosts[$i]}" "cd $(quote_word "$DEST") && $(remote_cmd "${env_i[@]}" "${train[@]}")"
done
wait_all
