#!/usr/bin/env bash
# KV transfer between two "nodes" (two network namespaces joined by a veth pair, as two pods or
# hosts: UCX over TCP), beside ucx_perftest over TCP at the same size, same run. Root (ip netns).
#
#   tools/bench_kv_cross_node.sh [BUILD] [MIB...]        (default: 8 32)
#
# The initiator (the prefill worker's side) runs in namespace pwkv-a at 10.233.7.1, the owner of
# the registered region (the decode worker's KV pool) in pwkv-b at 10.233.7.2; UCX_TLS=tcp,
# since shared memory would still join two network namespaces of one host. Each side's UCX uses
# its end of the veth (pw-bench-ucx --host/--owner-host; UCX_NET_DEVICES for ucx_perftest):
# left on lo, the owner's worker address offers 127.0.0.1, which the other namespace cannot
# reach. Every command runs under a timeout; the namespaces are removed on exit.
set -euo pipefail
BUILD=${1:-build}
shift || true
SIZES=("${@:-8}")
[ $# -gt 0 ] || SIZES=(8 32)
A=pwkv-a B=pwkv-b IP_A=10.233.7.1 IP_B=10.233.7.2
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add "$A"
ip netns add "$B"
ip link add pwkv-va type veth peer name pwkv-vb
ip link set pwkv-va netns "$A"
ip link set pwkv-vb netns "$B"
ip -n "$A" addr add "$IP_A/24" dev pwkv-va
ip -n "$B" addr add "$IP_B/24" dev pwkv-vb
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set pwkv-va up
ip -n "$B" link set pwkv-vb up
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
echo "load: $(cut -d' ' -f1-3 /proc/loadavg); veth MTU $(ip -n "$A" -o link show pwkv-va | grep -o 'mtu [0-9]*')"
for MIB in "${SIZES[@]}"; do
  BYTES=$((MIB << 20))
  echo "== pw-bench-ucx, ${MIB} MiB, owner in $B, UCX_TLS=tcp"
  ip netns exec "$A" env UCX_TLS=tcp timeout 300 "$BUILD/bin/pw-bench-ucx" --mib "$MIB" --reps 5 \
    --chunks-kib 256,$((MIB * 1024)) --modes none --owner-netns "$B" --owner-host "$IP_B" --host "$IP_A"
  for t in ucp_put_bw ucp_get; do
    PORT=$((20000 + RANDOM % 20000))
    ip netns exec "$B" env UCX_TLS=tcp UCX_NET_DEVICES=pwkv-vb timeout 300 ucx_perftest -p "$PORT" >/dev/null 2>&1 &
    SERVER=$!
    sleep 1
    echo "== ucx_perftest $t, ${MIB} MiB messages, UCX_TLS=tcp: $(ip netns exec "$A" env UCX_TLS=tcp \
      UCX_NET_DEVICES=pwkv-va timeout 240 ucx_perftest "$IP_B" -p "$PORT" -t "$t" -s "$BYTES" -n 10 -w 2 2>&1 | grep Final)"
    wait "$SERVER" 2>/dev/null || true
  done
done
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
