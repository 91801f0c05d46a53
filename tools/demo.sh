#!/usr/bin/env bash
# make demo: the local node of deploy/local.yaml, a real Prometheus on 127.0.0.1:9090 scraping
# it (deploy/prometheus/prometheus.yml), and 60 s of bursty load (pw-loadgen, gamma arrivals,
# burstiness 0.5). Prints the report and leaves in out/: report.txt, demo.json (the result),
# demo-latency-cdf.png and demo-timeline.png (pw-loadgen-plot), prometheus.txt (what Prometheus
# saw), the processes' logs under out/run/. Everything is stopped at the end.
#   DEMO_SECONDS (60), DEMO_RATE (8 req/s), PROM_PORT (9090) override the defaults.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
OUT=out
SECONDS_LOAD=${DEMO_SECONDS:-60}
RATE=${DEMO_RATE:-8}
PROM_PORT=${PROM_PORT:-9090}
for b in pw-cluster pw-loadgen pw-loadgen-plot; do
  [ -x "$BUILD/bin/$b" ] || { echo "demo: $BUILD/bin/$b is missing (make build)" >&2; exit 2; }
done
command -v prometheus >/dev/null || { echo "demo: prometheus is missing (apt-get install prometheus)" >&2; exit 2; }
mkdir -p "$OUT"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

"$BUILD/bin/pw-cluster" up --config deploy/local.yaml --run-dir "$OUT/run" > "$OUT/cluster.log" 2>&1 &
pids+=($!)
echo "demo: starting the node (logs in $OUT/run/)"
for _ in $(seq 1 240); do
  curl -sf http://127.0.0.1:8000/health > /dev/null && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then cat "$OUT/cluster.log" >&2; exit 1; fi
  sleep 0.5
done
curl -sf http://127.0.0.1:8000/health > /dev/null || { echo "demo: the node is not healthy" >&2; exit 1; }
"$BUILD/bin/pw-cluster" status --config deploy/local.yaml || true

prometheus --config.file=deploy/prometheus/prometheus.yml --storage.tsdb.path="$OUT/prometheus-data" \
  --web.listen-address=127.0.0.1:$PROM_PORT > "$OUT/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$PROM_PORT/-/ready" > /dev/null && break
  sleep 0.5
done
echo "demo: Prometheus on http://127.0.0.1:$PROM_PORT (Grafana: deploy/grafana/)"

"$BUILD/bin/pw-loadgen" --base-url http://127.0.0.1:8000 --model tiny-moe \
  --request-rate "$RATE" --burstiness 0.5 --duration "$SECONDS_LOAD" --num-prompts 0 \
  --random-input-len 128 --random-range-ratio 0.5 --random-output-len 64 --ignore-eos \
  --num-warmups 4 --goodput ttft:500 tpot:50 --percentile-metrics ttft,tpot,itl,e2el \
  --metric-percentiles 50,90,99 --save-result --result-dir "$OUT" --result-filename demo.json \
  | tee "$OUT/report.txt"
"$BUILD/bin/pw-loadgen-plot" "$OUT/demo.json" --title "make demo (gamma 0.5, $RATE req/s)" || true

sleep 6  # the last scrapes
query() {
  curl -sfG "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)["data"]["result"]
print(", ".join("%s %.4g" % (x["metric"] or "", float(x["value"][1])) for x in r) or "(no data)")'
}
{
  echo "Prometheus, over the run:"
  echo "  healthy processes: $(query 'sum(up{job="pagedweight"})')"
  echo "  completions: $(query 'sum(increase(pagedweight_router_request_success_total[2m]))')"
  echo "  TTFT p99 s: $(query 'histogram_quantile(0.99, sum by (le) (rate(pagedweight_router_time_to_first_token_seconds_bucket[2m])))')"
  echo "  prefill queue time p99 s: $(query 'histogram_quantile(0.99, sum by (le) (rate(pagedweight_worker_request_queue_time_seconds_bucket[2m])))')"
  echo "  KV usage max: $(query 'max_over_time(pagedweight_router_kv_cache_usage_perc[2m])')"
} | tee "$OUT/prometheus.txt"
echo "demo: results in $OUT/ (report.txt, demo.json, demo-*.png, prometheus.txt)"
