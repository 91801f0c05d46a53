#!/usr/bin/env bash
# Creates .venv with the Python tooling used offline (training, fixtures, quantization checks).
# `make test` never needs it: its outputs are committed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -r tools/requirements.txt
