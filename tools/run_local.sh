#!/usr/bin/env bash
# Starts the local node on the embedded model (see README): `pw serve models/tiny-moe` checks
# the model, builds its any-precision store once into the cache (~/.cache/pagedweight), writes
# the node file and runs pw-cluster on it: the router (OpenAI API on 127.0.0.1:8000), a prefill
# worker, a decode worker and the broker, logs and control keys in BUILD/run; it prints the URL
# with curl examples. Without `pw` it runs deploy/local.yaml, without the cluster binaries a
# generation demo.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
if [ -x "$BUILD/bin/pw" ]; then
  exec "$BUILD/bin/pw" serve models/tiny-moe --port 8000 --run-dir "$BUILD/run"
fi
if [ -x "$BUILD/bin/pw-cluster" ]; then
  exec "$BUILD/bin/pw-cluster" up --config deploy/local.yaml
fi
exec "$BUILD/bin/pw-generate" --model models/tiny-moe --prompt "The Lord said unto Moses" --max-tokens 64
