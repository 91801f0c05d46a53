#!/usr/bin/env python3
"""A worker's readiness (/ready on its metrics port, the chart's readinessProbe), with real
processes on loopback:
  1. a prefill and a decode worker started before any router: /metrics answers 200 while /ready
     answers 503 naming what is missing (the router);
  2. the router started: /ready turns 200 once each has registered, and the router serves;
  3. the router SIGKILLed: /ready turns 503 again (router lost), and 200 once a new router runs;
  4. --advertise-host that is not an IPv4 address of this host: the worker exits 2 naming the
     option (a pod's address comes from status.podIP; nothing derives it silently).

Usage: worker_ready_test.py BUILD_DIR MODEL_DIR
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, LocalCluster, http_get, model_present  # noqa: E402

DEADLINE_S = 180  # generous: model load on a busy 2-core machine


def wait_for(what, cond, c):
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        for name, p in c.procs.items():
            if p.poll() is not None and name != "router":
                c.dump_logs()
                raise AssertionError(f"{name} exited with {p.returncode} while waiting for {what}")
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    c.dump_logs()
    raise AssertionError(f"not within {DEADLINE_S} s: {what}")


def ready(c, name):
    return http_get(f"http://127.0.0.1:{c.metrics_ports[name]}/ready")


def main():
    build_dir, model_dir = sys.argv[1], sys.argv[2]
    if not model_present(model_dir):
        return SKIP
    with tempfile.TemporaryDirectory(prefix="pw-ready-") as log_dir:
        c = LocalCluster(build_dir, model_dir, log_dir, kv_blocks=64)
        try:
            workers = ["prefill-0", "decode-0"]
            c.start_worker("prefill", 0)
            c.start_worker("decode", 0)
            for w in workers:
                port = c.metrics_ports[w]
                wait_for(f"{w} /metrics", lambda: http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200, c)
                status, body = ready(c, w)
                assert status == 503, (w, status, body)
                assert "not registered with a router" in body, (w, body)
            print("no router: /metrics 200, /ready 503 'not registered with a router'")

            c.start_router()
            for w in workers:
                wait_for(f"{w} /ready 200", lambda: ready(c, w)[0] == 200, c)
                assert ready(c, w)[1].strip() == "ready", ready(c, w)
            c.wait_healthy()
            print("router up: /ready 200 on both")

            c.signal("router", signal.SIGKILL)
            c.procs["router"].wait()
            for w in workers:
                wait_for(f"{w} /ready 503 after the router's loss",
                         lambda: ready(c, w)[0] == 503 and "router lost" in ready(c, w)[1], c)
            print("router killed: /ready 503 'router lost' on both")
            c.start_router()
            for w in workers:
                wait_for(f"{w} /ready 200 again", lambda: ready(c, w)[0] == 200, c)
            print("router again: /ready 200 on both")
        finally:
            c.__exit__(None, None, None)

        for kind in ("prefill", "decode"):
            r = subprocess.run([os.path.join(c.bin, f"pw-{kind}"), "--model", model_dir,
                                "--router", "tcp://pw-router-control:5555", "--insecure",
                                "--advertise-host", "pod-ip", "--threads", "1"],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 2, (kind, r.returncode, r.stderr)
            assert "advertise_host: bind host 'pod-ip' is not an IPv4 address" in r.stderr, r.stderr
        print("--advertise-host pod-ip: refused, exit 2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
