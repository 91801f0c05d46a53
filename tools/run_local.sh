#!/usr/bin/env bash
# Starts the local cluster on the embedded model (see README): pw-cluster launches the router
# (OpenAI API on 127.0.0.1:8000), a prefill worker, a decode worker and the broker, and prints
# the URL with a curl example. Without the cluster binaries it falls back to a generation demo.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
if [ -x "$BUILD/bin/pw-cluster" ]; then
  exec "$BUILD/bin/pw-cluster" up --config deploy/local.yaml
fi
exec "$BUILD/bin/pw-generate" --model models/tiny-moe --prompt "The Lord said unto Moses" --max-tokens 64
