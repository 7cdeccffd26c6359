#!/usr/bin/env bash
# Launches `python -m jaxrl_mt.train` on every worker of a TPU VM / pod slice at once.
# Each worker runs one process; JAXRL_MT_DISTRIBUTED=1 makes jaxrl_mt call
# jax.distributed.initialize(), which finds the pod's coordinator and process ids by itself.
#
# Usage: tpu/launch_tpu.sh --name NAME --zone ZONE [--config configs/rlsta.py:paper]
#          [--mesh data,fsdp,tensor] [--workdir DIR] [--project P] [--dest DIR] [--dry-run]
#          [-- --config.rl.lr=1e-6 ...]
# The workdir must be the same shared filesystem on every worker (NFS / Filestore / gcsfuse):
# orbax writes one checkpoint from all hosts together.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

NAME="" ZONE="" PROJECT="" DEST="jaxrl_mt" CONFIG="configs/rlsta.py:paper" MESH="auto" WORKDIR=""
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --dest) DEST="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --mesh) MESH="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -n "$NAME" ]] || die "--name is required"
[[ -n "$ZONE" ]] || die "--zone is required"

train=(env JAXRL_MT_DISTRIBUTED=1 .venv/bin/python -m jaxrl_mt.train --config "$CONFIG" "--config.mesh_shape=$MESH")
[[ -n "$WORKDIR" ]] && train+=("--config.workdir=$WORKDIR")
train+=("${EXTRA[@]}")
common=(--zone="$ZONE" --worker=all)
[[ -n "$PROJECT" ]] && common+=(--project="$PROJECT")
run gcloud compute tpus tpu-vm ssh "$NAME" "${common[@]}" \
  --command="cd $(quote_word "$DEST") && $(remote_cmd "${train[@]}")"
