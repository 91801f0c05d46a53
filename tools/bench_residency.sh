#!/usr/bin/env bash
# Cluster decode time per token with an expert residency budget (the decode worker's `misses:`
# block) against every expert resident, one node per configuration, same load each time.
#
#   tools/bench_residency.sh [BUILD] [MODEL_DIR] [STORE] [RESIDENCY] [POLICIES] [PROMPTS] [OUT_LEN] [CONC]
#
# Defaults: build, models/tiny-moe, build/tiny-moe.apw, 0.25,
# "all-resident fetch-every-miss quality-first speed-first", 24 prompts of 16 random tokens,
# 64 output tokens (ignore_eos), one request at a time. The broker serves STORE at 4 bits.
# For each configuration: pw-cluster up, pw-loadgen (2 warm-up requests left out), then the
# decode worker's /metrics for misses, fetches and substitutions per decoded token. Prints one
# Markdown row per configuration. TPOT = time per output token after the first (pw-loadgen's
# mean_tpot_ms), i.e. the decode step as a client sees it.
#
# A configuration is a policy name, optionally followed by +key=value overrides: a misses key
# (admission_beta=0, eviction=lru, ...) goes into the misses block, pacing=free|fetches|steps
# becomes the decode entry's weight_pacing (default auto; e.g. "quality-first+admission_beta=0",
# "quality-first+pacing=free"). REPEAT=N runs the whole list N times, alternating, so
# configurations compared see the same machine load.
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-models/tiny-moe}
STORE=${3:-build/tiny-moe.apw}
RESIDENCY=${4:-0.25}
POLICIES=${5:-"all-resident fetch-every-miss quality-first speed-first"}
PROMPTS=${6:-24}
OUT_LEN=${7:-64}
CONC=${8:-1}
BITS=${BITS:-4}
VOCAB_MAX=${VOCAB_MAX:-4096}
MODEL=$(realpath "$MODEL")
STORE=$(realpath "$STORE")
BIN=$(realpath "$BUILD/bin")
WORK=$(mktemp -d)
trap '[ "$CLUSTER" != 0 ] && kill "$CLUSTER" 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
CLUSTER=0
lscpu | grep -E "Model name|^CPU\(s\)" | sed 's/  */ /g'
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "model $MODEL, store $STORE at $BITS bits, residency $RESIDENCY, $PROMPTS prompts x $OUT_LEN tokens, concurrency $CONC"
echo
echo "| configuration | TPOT mean ms | TPOT median ms | output tok/s | misses / token | fetches / token | substituted / token | mean m | fetch ms (mean) | get / check / table ms | step fetch wait ms / token | admissions / token | paced ms / token | load |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
metric() {  # metric NAME_PREFIX FILE -> value (0 when absent)
  awk -v p="$1" 'index($0, p) == 1 { v = $NF } END { print (v == "" ? 0 : v) }' "$2"
}
REPEAT=${REPEAT:-1}
LIST=""
for _ in $(seq 1 "$REPEAT"); do LIST="$LIST $POLICIES"; done
N=0
for P in $LIST; do
  N=$((N + 1))
  HTTP=$(port); CTL=$(port); BRK=$(port); MET=$(port)
  RUN="$WORK/$N"
  mkdir -p "$RUN"
  NAME=${P%%+*}
  EXTRA=""; PACING=auto
  if [ "$NAME" != "$P" ]; then
    IFS='+' read -r -a KV <<< "${P#*+}"
    for kv in "${KV[@]}"; do
      k=${kv%%=*}; v=${kv#*=}
      if [ "$k" = pacing ]; then PACING=$v; else EXTRA="$EXTRA, $k: $v"; fi
    done
  fi
  MISSES=""
  [ "$NAME" != "all-resident" ] && MISSES=", misses: {policy: $NAME, residency: $RESIDENCY$EXTRA}"
  cat > "$RUN/cluster.yaml" <<EOF
model_dir: $MODEL
model_name: bench
run_dir: $RUN
bin_dir: $BIN
router: {port: $HTTP, control_port: $CTL}
broker: {control_port: $BRK, store: $STORE, initial_bits: $BITS}
prefill: [{id: prefill-0, kv_blocks: 256}]
decode: [{id: decode-0, kv_blocks: 512, metrics_port: $MET, weight_pacing: $PACING$MISSES}]
EOF
  "$BIN/pw-cluster" up --config "$RUN/cluster.yaml" > "$RUN/pw-cluster.out" 2>&1 &
  CLUSTER=$!
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null "http://127.0.0.1:$HTTP/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model":"bench","prompt":[1,2,3],"max_tokens":1}' && break
    sleep 0.5
  done
  "$BIN/pw-loadgen" --base-url "http://127.0.0.1:$HTTP" --model bench --dataset-name random \
    --random-input-len 16 --random-output-len "$OUT_LEN" --random-range-ratio 0 --ignore-eos \
    --random-token-max "$VOCAB_MAX" --num-prompts "$PROMPTS" --num-warmups 2 --max-concurrency "$CONC" \
    --request-rate inf --seed 1 --save-result --result-dir "$RUN" --result-filename result.json --quiet \
    > "$RUN/loadgen.out" 2>&1
  sleep 0.6  # the worker's metrics are exported every 200 ms
  curl -sf "http://127.0.0.1:$MET/metrics" > "$RUN/metrics.txt"
  kill "$CLUSTER"; wait "$CLUSTER" 2>/dev/null || true; CLUSTER=0
  python3 - "$P" "$RUN/result.json" "$RUN/metrics.txt" "$MODEL/config.json" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF'
import json, sys
name, result, metrics, config, load = sys.argv[1:6]
layers = json.load(open(config))["num_hidden_layers"]
r = json.load(open(result))
m = {}
for line in open(metrics):
    if line.startswith("#") or not line.strip():
        continue
    key, val = line.rsplit(" ", 1)
    m[key] = float(val)
def get(prefix):
    return sum(v for k, v in m.items() if k.startswith(prefix))
tl = get("pagedweight_expert_token_layers_total")
tokens = tl / layers  # tokens the decode worker's policy decided (every layer is MoE)
misses = get('pagedweight_expert_selections_total{result="miss"')
fetched = get('pagedweight_expert_misses_total{action="fetched"')
subst = get('pagedweight_expert_misses_total{action="substituted"')
mass = get("pagedweight_substituted_gate_mass_total")
fs = get("pagedweight_expert_fetch_seconds_sum"); fc = get("pagedweight_expert_fetch_seconds_count")
def per_token(x):
    return f"{x / tokens:.2f}" if tokens else "-"
row = [name, f"{r['mean_tpot_ms']:.3f}", f"{r['median_tpot_ms']:.3f}", f"{r['output_throughput']:.0f}",
       per_token(misses), per_token(fetched), per_token(subst),
       f"{mass / tl:.4f}" if tl else "-", f"{1e3 * fs / fc:.3f}" if fc else "-"]
def phase(p):
    label = '{phase="' + p + '"'
    c = get("pagedweight_expert_fetch_phase_seconds_count" + label)
    return f"{1e3 * get('pagedweight_expert_fetch_phase_seconds_sum' + label) / c:.3f}" if c else "-"
row.append(" / ".join(phase(p) for p in ("get", "check", "table")))
row.append(per_token(1e3 * get("pagedweight_step_fetch_wait_seconds_sum")))
row.append(per_token(get('pagedweight_expert_admissions_total{state="started"')))
row.append(per_token(1e3 * get("pagedweight_plane_mover_paced_seconds_total")))
row.append(load)
print("| " + " | ".join(row) + " |")
EOF
done
echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
