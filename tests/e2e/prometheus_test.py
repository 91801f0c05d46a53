#!/usr/bin/env python3
"""e2e observability test: a local cluster, a real Prometheus server on loopback scraping it,
and pw-loadgen sending bursty load for ~30 s. Passes when
  - every process's /metrics passes `promtool check metrics`;
  - every PromQL expression of the Grafana dashboards (deploy/grafana/dashboards/*.json) whose
    metrics exist in Prometheus evaluates through its HTTP API and returns data (expressions on
    metrics no process exports yet are listed as skipped);
  - pw-loadgen's completed requests equal the router's counter of completions
    (pagedweight_router_requests_total{endpoint="completions",code="200"}) and its
    request_success_total.

Usage: prometheus_test.py BUILD_DIR MODEL_DIR [--seconds 30]
Skips (77) when the model is absent or the `prometheus`/`promtool` binaries are not installed.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "pylib")]
from cluster import SKIP, LocalCluster, http_get, model_present  # noqa: E402
from localhost import free_port  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
# Grafana's variables as a short scrape would need them.
GRAFANA_VARS = {"$__rate_interval": "10s", "$layer": ".*", "${datasource}": ""}
NAME_RE = re.compile(r"\b(pagedweight_[a-z0-9_]+|up)\b")


def dashboard_exprs():
    out = []
    for path in sorted(glob.glob(os.path.join(REPO, "deploy", "grafana", "dashboards", "*.json"))):
        with open(path) as f:
            d = json.load(f)
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((os.path.basename(path), p["title"], t["expr"]))
    return out


def prom_query(base, expr):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http_get(url, timeout=10)
    if status != 200:
        return None, f"HTTP {status}: {body[:300]}"
    return json.loads(body)["data"]["result"], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--seconds", type=float, default=30)
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    if not model_present(os.path.abspath(args.model_dir)):
        return SKIP
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prometheus or not promtool:
        print("SKIPPED: prometheus/promtool not installed (Debian package `prometheus`)")
        return SKIP
    log_dir = os.path.join(build_dir, "e2e-logs", "prometheus")
    failures = []
    # LYNX on and, when the embedded model's store is built, experts from a broker at 4 bits
    # under a residency budget, so that the memory dashboard's panels have data too.
    store = os.path.join(build_dir, "tiny-moe.apw")
    decode_args = ["--lynx"]
    if os.path.exists(store):
        decode_args += ["--residency", "0.5", "--miss-policy", "rule-0.15"]
    else:
        store = None
        print("no build/tiny-moe.apw: the memory dashboard's paged panels are skipped")
    with LocalCluster(build_dir, os.path.abspath(args.model_dir), log_dir, kv_blocks=1024,
                      decode_args=decode_args, store=store) as c:
        targets = {"router": f"127.0.0.1:{c.port}"}
        for name, port in c.metrics_ports.items():
            targets[name] = f"127.0.0.1:{port}"
        # promtool on every /metrics.
        for name, hp in targets.items():
            status, text = http_get(f"http://{hp}/metrics")
            r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                               text=True)
            print(f"promtool check metrics {name}: rc {r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
            if status != 200 or r.returncode != 0:
                failures.append(f"{name}: /metrics HTTP {status}, promtool: {r.stdout}{r.stderr}")

        tmp = tempfile.mkdtemp(prefix="pw-prom-", dir=log_dir)
        cfg = os.path.join(tmp, "prometheus.yml")
        with open(cfg, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n"
                    "  - job_name: pagedweight\n    static_configs:\n")
            for name, hp in targets.items():
                role = name.split("-")[0]
                f.write(f"      - targets: ['{hp}']\n        labels: {{pw_process: {name}, pw_role: {role}}}\n")
        r = subprocess.run([promtool, "check", "config", cfg], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("promtool check config: " + r.stdout + r.stderr)
        # The repository's config too.
        r = subprocess.run([promtool, "check", "config",
                            os.path.join(REPO, "deploy", "prometheus", "prometheus.yml")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            failures.append("deploy/prometheus/prometheus.yml: " + r.stdout + r.stderr)
        prom_port = free_port()
        base = f"http://127.0.0.1:{prom_port}"
        plog = open(os.path.join(log_dir, "prometheus.log"), "w")
        prom = subprocess.Popen([prometheus, f"--config.file={cfg}",
                                 f"--storage.tsdb.path={os.path.join(tmp, 'data')}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"],
                                stdout=plog, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + 60
            while http_get(base + "/-/ready")[0] != 200:
                if time.time() > deadline or prom.poll() is not None:
                    raise RuntimeError("prometheus did not become ready (see prometheus.log)")
                time.sleep(0.2)
            before = c.metrics()
            out = os.path.join(log_dir, "loadgen.json")
            argv = [os.path.join(build_dir, "bin", "pw-loadgen"), "--base-url", c.url,
                    # usage: no probe request, so the counts below compare one for one.
                    "--model", "tiny-moe", "--token-count", "usage",
                    "--request-rate", "6", "--burstiness", "0.5",
                    "--duration", str(args.seconds), "--num-prompts", "0",
                    "--random-input-len", "48", "--random-output-len", "16",
                    "--random-range-ratio", "0.5", "--ignore-eos", "--max-concurrency", "64",
                    "--goodput", "ttft:2000", "--seed", "11", "--quiet",
                    "--result-filename", out]
            print("+", " ".join(argv), flush=True)
            rc = subprocess.run(argv, timeout=args.seconds + 300).returncode
            with open(out) as f:
                result = json.load(f)
            after = c.metrics()
            key = 'pagedweight_router_requests_total{code="200",endpoint="completions"}'
            router_ok = after.get(key, 0) - before.get(key, 0)
            succ = sum(v for k, v in after.items()
                       if k.startswith("pagedweight_router_request_success_total")) - \
                sum(v for k, v in before.items()
                    if k.startswith("pagedweight_router_request_success_total"))
            print(f"loadgen completed {result['completed']} failed {result['failed']}; router "
                  f"completions {router_ok:.0f}, request_success_total {succ:.0f}")
            if rc != 0 or result["failed"] != 0:
                failures.append(f"pw-loadgen exit {rc}, {result['failed']} failed requests")
            if result["completed"] < 50:
                failures.append(f"only {result['completed']} requests completed")
            if result["completed"] != router_ok or result["completed"] != succ:
                failures.append("the load generator's count differs from the router's")
            time.sleep(3)  # the last scrapes
            status, body = http_get(base + "/api/v1/label/__name__/values")
            names = set(json.loads(body)["data"]) if status == 200 else set()
            evaluated = skipped = 0
            for dash, title, expr in dashboard_exprs():
                e = expr
                for k, v in GRAFANA_VARS.items():
                    e = e.replace(k, v)
                wanted = set(NAME_RE.findall(e))
                missing = [n for n in wanted if n not in names and not any(
                    m.startswith(n + "_") for m in names)]
                if missing:
                    skipped += 1
                    print(f"skip  {dash} / {title}: no {', '.join(sorted(missing))} yet")
                    continue
                res, err = prom_query(base, e)
                evaluated += 1
                if err or not res:
                    failures.append(f"{dash} / {title}: {e} -> {err or 'no data'}")
                    print(f"FAIL  {dash} / {title}: {e} -> {err or 'no data'}")
                else:
                    print(f"ok    {dash} / {title}: {len(res)} series")
            print(f"dashboard expressions: {evaluated} evaluated, {skipped} skipped")
            if evaluated < 15:
                failures.append(f"only {evaluated} dashboard expressions could be evaluated")
        finally:
            prom.terminate()
            try:
                prom.wait(timeout=20)
            except subprocess.TimeoutExpired:
                prom.kill()
        for f_ in failures:
            print("FAIL:", f_)
        if failures:
            c.dump_logs()
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
