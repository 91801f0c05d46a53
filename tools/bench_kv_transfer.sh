#!/usr/bin/env bash
# KV transfer prefill -> decode with the paged layout, beside ucx_perftest's put bandwidth over
# shared memory at the same total size, same machine, same run.
#
#   tools/bench_kv_transfer.sh [BUILD] [MIB]
#
# pw-bench-ucx's putall is the prefill worker's transfer: every (block, layer) page posted at
# once, then one flush; chunk = one page when no two pages are adjacent on both sides (4 KiB
# for the embedded model in bf16, 128 KiB for the OLMoE-dimension one), larger when runs of
# adjacent pages merge (a fresh pool hands pages out in order). ucx_perftest (Debian
# ucx-utils) puts MIB MiB messages from one process to another with UCX_TLS=sm,self.
set -euo pipefail
BUILD=${1:-build}
MIB=${2:-128}
BYTES=$((MIB << 20))
PORT=$((20000 + RANDOM % 20000))
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
echo "== pw-bench-ucx (${MIB} MiB, shared memory endpoint mode)"
"$BUILD/bin/pw-bench-ucx" --mib "$MIB" --reps 5 --chunks-kib 4,32,128,1024,$((MIB * 1024)) --modes none
echo "== ucx_perftest ucp_put_bw, ${MIB} MiB messages, UCX_TLS=sm,self"
UCX_TLS=sm,self ucx_perftest -p "$PORT" >/dev/null 2>&1 &
SERVER=$!
sleep 1
UCX_TLS=sm,self ucx_perftest 127.0.0.1 -p "$PORT" -t ucp_put_bw -s "$BYTES" -n 20 2>&1 | tail -4
wait "$SERVER" 2>/dev/null || true
