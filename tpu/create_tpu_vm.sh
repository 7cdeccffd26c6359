#!/usr/bin/env bash
# Creates a Cloud TPU VM or pod slice (one VM per worker host).
#
# Usage: tpu/create_tpu_vm.sh --name NAME --zone ZONE [--accelerator v4-8] [--version IMAGE]
#                             [--project PROJECT] [--spot] [--dry-run]
# Example: tpu/create_tpu_vm.sh --name rlsta-pod --zone us-central2-b --accelerator v4-32 --dry-run
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

NAME="" ZONE="" ACCEL="v4-8" VERSION="tpu-ubuntu2204-base" PROJECT="" SPOT=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator) ACCEL="$2"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ -n "$NAME" ]] || die "--name is required"
[[ -n "$ZONE" ]] || die "--zone is required"

cmd=(gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE" --accelerator-type="$ACCEL" --version="$VERSION")
[[ -n "$PROJECT" ]] && cmd+=(--project="$PROJECT")
[[ "$SPOT" == 1 ]] && cmd+=(--spot)
run "${cmd[@]}"
