#!/usr/bin/env python3
"""e2e load test: 500 requests with bursty arrivals, up to 128 concurrent streams,
against a local cluster. Passes when every request completes without error, every KV block is
free again afterwards (decode workers' heartbeats, as the router's /metrics shows them), and no
process grew (resident memory after the load within 10% + 16 MiB of after a same-shape warmup).

Usage: load_test.py BUILD_DIR MODEL_DIR [--requests 500] [--rate 200] [--burstiness 0.5]
"""
import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, LocalCluster, model_present  # noqa: E402

KV_BLOCKS = 1024


def loadgen(build_dir, url, n, rate, burstiness, out):
    argv = [os.path.join(build_dir, "bin", "pw-loadgen"), "--base-url", url,
            "--num-prompts", str(n), "--request-rate", str(rate), "--burstiness", str(burstiness),
            "--max-concurrency", "128", "--random-input-len", "48", "--random-range-ratio", "0.5",
            "--random-output-len", "24", "--seed", "7", "--request-timeout", "600", "--quiet",
            "--result-filename", out]
    print("+", " ".join(argv), flush=True)
    return subprocess.run(argv, timeout=1800).returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--burstiness", type=float, default=0.5)
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    if not model_present(os.path.abspath(args.model_dir)):
        return SKIP
    log_dir = os.path.join(build_dir, "e2e-logs", "load")
    with LocalCluster(build_dir, os.path.abspath(args.model_dir), log_dir,
                      kv_blocks=KV_BLOCKS) as c:
        # Warmup of the same shape, so buffers sized by batch are allocated before measuring.
        if loadgen(build_dir, c.url, 128, float("inf"), 1.0, os.path.join(log_dir, "warmup.json")):
            print("FAIL: warmup had failed requests")
            return 1
        before = c.rss_kib()
        rc = loadgen(build_dir, c.url, args.requests, args.rate, args.burstiness,
                     os.path.join(log_dir, "load.json"))
        failures = []
        if rc != 0:
            failures.append("some requests failed (see the loadgen report above)")
        # KV: every block free again (wait for the next heartbeats).
        deadline = time.time() + 10
        m = {}
        while time.time() < deadline:
            m = c.metrics()
            if (m.get("pagedweight_router_backend_used_kv_blocks") == 0 and
                    m.get("pagedweight_router_backend_free_kv_blocks") == KV_BLOCKS and
                    m.get("pagedweight_router_num_requests_running") == 0):
                break
            time.sleep(0.2)
        print("after load: free KV blocks", m.get("pagedweight_router_backend_free_kv_blocks"),
              "used", m.get("pagedweight_router_backend_used_kv_blocks"),
              "running", m.get("pagedweight_router_num_requests_running"))
        if m.get("pagedweight_router_backend_used_kv_blocks") != 0 or \
                m.get("pagedweight_router_backend_free_kv_blocks") != KV_BLOCKS:
            failures.append("KV blocks not all free after the load")
        after = c.rss_kib()
        for name, kib in before.items():
            grown = after.get(name, 0) - kib
            print(f"rss {name}: {kib} KiB -> {after.get(name, 0)} KiB")
            if after.get(name, 0) > kib * 1.10 + 16 * 1024:
                failures.append(f"{name} grew by {grown} KiB")
        for f in failures:
            print("FAIL:", f)
        if failures:
            c.dump_logs()
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
