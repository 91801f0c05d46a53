#!/usr/bin/env bash
# Starts the local cluster on the embedded model (see README). Until the cluster lands, it
# runs a generation demo with the in-process engine.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
if [ -x "$BUILD/bin/pw-cluster" ]; then
  exec "$BUILD/bin/pw-cluster" up --config deploy/local.yaml
fi
exec "$BUILD/bin/pw-generate" --model models/tiny-moe --prompt "The Lord said unto Moses" --max-tokens 64
