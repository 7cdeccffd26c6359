#!/usr/bin/env bash
# Creates tunix's own virtual environment, .venv-tunix (git-ignored), from PyPI, for
# `python -m jaxrl_mt.benchmarks tunix`. tunix's pins are not ours: the project's .venv is not
# touched, and the tunix side of the benchmark runs in this venv as a subprocess that reads the
# model from the HF folder (safetensors) only, never importing jaxrl_mt.
#
# Usage: jaxrl_mt/benchmarks/tunix_env.sh [VENV_DIR]   (default: .venv-tunix at the repo root)
# Pins: TUNIX_PINS below is the set that installed together (tunix 0.1.7 pins no jax; its [prod] extra
# pulls jax[tpu], so jax is pinned here instead). Override with TUNIX_PINS="...".
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${1:-.venv-tunix}"
PY="${PYTHON:-python3}"
# jax/jaxlib/flax/optax/numpy as in our .venv (same XLA on both sides); safetensors<0.8 is tunix's pin (ours: 0.8).
TUNIX_PINS=${TUNIX_PINS:-"google-tunix==0.1.7 jax==0.10.2 jaxlib==0.10.2 flax==0.12.8 optax==0.2.8 numpy==2.4.6 qwix==0.1.8 orbax-checkpoint==0.12.8 safetensors==0.7.0"}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# shellcheck disable=SC2086
"$VENV/bin/python" -m pip install -q $TUNIX_PINS
"$VENV/bin/python" -c "import tunix, jax, flax; print('tunix', getattr(tunix, '__version__', '?'), 'jax', jax.__version__, 'flax', flax.__version__)"
echo "tunix installed in $(cd "$VENV" && pwd)"
