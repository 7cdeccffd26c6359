#!/usr/bin/env bash
# Copies this checkout to every worker of a TPU VM / pod slice and installs it there
# (tpu/install.sh: a venv with jaxrl_mt, jax[tpu] and the embedded model).
#
# Usage: tpu/install_tpu_vm.sh --name NAME --zone ZONE [--project PROJECT] [--dest DIR] [--dry-run]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

NAME="" ZONE="" PROJECT="" DEST="jaxrl_mt"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --dest) DEST="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -n "$NAME" ]] || die "--name is required"
[[ -n "$ZONE" ]] || die "--zone is required"

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
TARBALL="${TMPDIR:-/tmp}/jaxrl_mt-src.tgz"
common=(--zone="$ZONE" --worker=all)
[[ -n "$PROJECT" ]] && common+=(--project="$PROJECT")

run tar -C "$ROOT" --exclude=.venv --exclude=runs --exclude=.git -czf "$TARBALL" .
run gcloud compute tpus tpu-vm scp "$TARBALL" "$NAME:jaxrl_mt-src.tgz" "${common[@]}"
run gcloud compute tpus tpu-vm ssh "$NAME" "${common[@]}" \
  --command="$(remote_cmd mkdir -p "$DEST") && $(remote_cmd tar -xzf jaxrl_mt-src.tgz -C "$DEST") && cd $(quote_word "$DEST") && bash tpu/install.sh --accelerator tpu"
