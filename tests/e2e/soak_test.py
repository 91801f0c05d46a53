#!/usr/bin/env python3
"""Fault soak: a whole node under pw-cluster (broker, router, prefill, decode), steady bursty
greedy load for several minutes while every ~20 s a random process other than the router is
SIGKILLed (pw-cluster restarts it) or SIGSTOPped for a few seconds (then SIGCONT).

Passes when
  - no request is lost or wrong: every completion answers 200 with the text an undisturbed
    run of the same cluster gave for the same prompt (greedy);
  - at the end KV and lease accounting is back to zero: the router runs no request and counts
    every block free, each worker reports 0 used and 0 reserved (leased) blocks;
  - the resident memory of every process (the router is never killed; a restarted process is
    compared with its first instance) is at the end at most 10 % + 16 MiB above its value after
    the warm-up.
Prints the figures (requests, faults, latency, RSS) and writes them to <log_dir>/soak.json.

Usage: soak_test.py BUILD_DIR MODEL_DIR [--seconds S (240)] [--fault-every S (20)] [--seed N]
Exit: 0 pass, 1 fail, 77 skipped (no weights).
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "pylib")]
from cluster import SKIP, model_present  # noqa: E402
from completions import post_completion  # noqa: E402
from localhost import free_port, rss_kib  # noqa: E402
from prom_samples import scrape_if_up  # noqa: E402

PROMPTS = ["In the beginning", "The Lord said unto Moses", "int main(int argc, char** argv) {",
           "def parse(self, text):", "Q: Why is the sky blue?\nA:", "Once upon a time",
           "#include <stdio.h>\n", "And it came to pass", "The manual page says",
           "static void usage(void)", "It was a dark and stormy night", "import os\nimport sys\n"]
KV_BLOCKS = {"prefill-0": 256, "decode-0": 1024}
CLIENTS = 12
RSS_MARGIN = (1.10, 16 * 1024)  # factor, KiB


def complete(port, prompt, max_tokens, timeout=180):
    """(status, text or error) of one greedy completion."""
    status, _, reply = post_completion(port, {"model": "tiny-moe", "prompt": prompt,
                                              "max_tokens": max_tokens, "temperature": 0}, timeout)
    text = reply if isinstance(reply, str) else json.dumps(reply)
    if status != 200:
        return status, text[:200]
    try:
        return 200, reply["choices"][0]["text"]
    except (TypeError, KeyError, IndexError) as e:
        return 0, f"{e!r} in {text[:200]}"


class Node:
    """pw-cluster up on free loopback ports, with metrics on every process."""

    def __init__(self, build_dir, model_dir, log_dir, heartbeat_ms=300):
        self.build_dir = build_dir
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)
        ports = set()

        def port():
            while True:
                p = free_port()
                if p not in ports:
                    ports.add(p)
                    return p
        self.http = port()
        self.ctl = port()
        self.metrics = {"broker": port(), "prefill-0": port(), "decode-0": port()}
        yaml = os.path.join(log_dir, "cluster.yaml")
        with open(yaml, "w") as f:
            f.write(f"model_dir: {model_dir}\nmodel_name: tiny-moe\nrun_dir: {log_dir}/run\n"
                    f"bin_dir: {build_dir}/bin\nheartbeat_ms: {heartbeat_ms}\n"
                    f"drain_timeout_ms: 10000\n"
                    f"router: {{port: {self.http}, control_port: {self.ctl}, lease_ms: 20000}}\n"
                    f"broker: {{control_port: {port()}, metrics_port: {self.metrics['broker']}}}\n"
                    f"prefill: [{{id: prefill-0, kv_blocks: {KV_BLOCKS['prefill-0']}, "
                    f"metrics_port: {self.metrics['prefill-0']}}}]\n"
                    f"decode: [{{id: decode-0, kv_blocks: {KV_BLOCKS['decode-0']}, "
                    f"metrics_port: {self.metrics['decode-0']}}}]\n"
                    f"restart: {{initial_backoff_ms: 200, max_backoff_ms: 2000, "
                    f"stable_after_ms: 5000}}\n")
        self.out = open(os.path.join(log_dir, "pw-cluster.out"), "w")
        # Batch-invariant dense kernels: the undisturbed reference and the runs under load and
        # faults batch each prompt differently, and must still give the same text.
        self.proc = subprocess.Popen([os.path.join(build_dir, "bin", "pw-cluster"), "up",
                                      "--config", yaml], stdout=self.out,
                                     stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PW_BATCH_INVARIANT="1"))

    def children(self):
        """{name: pid} of pw-cluster's children."""
        out = {}
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except OSError:
            return out
        for pid in pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            exe = os.path.basename(argv[0].decode())
            if exe in ("pw-router", "pw-broker"):
                out[exe[3:]] = pid
            elif b"--section" in argv:  # pw-cluster starts workers as --config FILE --section ID
                out[argv[argv.index(b"--section") + 1].decode()] = pid
            elif b"--id" in argv:
                out[argv[argv.index(b"--id") + 1].decode()] = pid
        return out

    def wait_serving(self, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            if complete(self.http, [1, 2, 3], 1, timeout=10)[0] == 200:
                return True
            time.sleep(0.2)
        return False

    def worker_metrics(self, name):
        return scrape_if_up(self.metrics[name])

    def router_metrics(self):
        return scrape_if_up(self.http)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        for pid in self.children().values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def dump_logs(self):
        run = os.path.join(self.log_dir, "run")
        for name in ["pw-cluster.out"] + sorted(os.listdir(run) if os.path.isdir(run) else []):
            path = os.path.join(self.log_dir, name) if name == "pw-cluster.out" else \
                os.path.join(run, name)
            if not os.path.isfile(path) or not (name.endswith(".log") or name.endswith(".out")):
                continue
            with open(path, errors="replace") as f:
                text = f.read()[-3000:]
            print(f"--- {name}\n{text}")


def accounting(node):
    """What must be zero at rest, as {what: value}."""
    out = {}
    m = node.router_metrics()
    out["router requests running"] = m.get("pagedweight_router_num_requests_running")
    out["router used KV blocks"] = m.get("pagedweight_router_backend_used_kv_blocks")
    free = m.get("pagedweight_router_backend_free_kv_blocks")
    out["router KV blocks not free"] = None if free is None else KV_BLOCKS["decode-0"] - free
    for w in ("prefill-0", "decode-0"):
        wm = node.worker_metrics(w)
        for state in ("used", "reserved"):
            vals = [v for k, v in wm.items()
                    if k.split("{")[0] == "pagedweight_kv_blocks" and f'state="{state}"' in k]
            out[f"{w} {state} KV blocks"] = sum(vals) if vals else None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("PW_SOAK_SECONDS", 240)))
    ap.add_argument("--fault-every", type=float, default=20)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("PW_SOAK_SEED", 15)))
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    model_dir = os.path.abspath(args.model_dir)
    if not model_present(model_dir):
        return SKIP
    rng = random.Random(args.seed)
    print(f"soak: {args.seconds:.0f} s, a fault every ~{args.fault_every:.0f} s, seed {args.seed}")
    log_dir = os.path.join(build_dir, "e2e-logs", "soak")
    node = Node(build_dir, model_dir, log_dir)
    failures = []
    try:
        if not node.wait_serving():
            node.dump_logs()
            print("FAIL: the node did not start serving")
            return 1
        # Reference texts from the undisturbed node (also the warm-up).
        work = [(p, 8 + 8 * (i % 5)) for i, p in enumerate(PROMPTS)]
        ref = {}
        for p, n in work:
            status, text = complete(node.http, p, n)
            if status != 200:
                print(f"FAIL: reference request failed: {status} {text}")
                node.dump_logs()
                return 1
            ref[(p, n)] = text
        base_pids = node.children()
        base_rss = {name: rss_kib(pid) for name, pid in base_pids.items()}
        print("processes:", base_pids)

        stop = threading.Event()
        level = [CLIENTS]
        lock = threading.Lock()
        stats = {"ok": 0, "wrong": 0, "failed": 0}
        latencies = []
        bad = []

        def client(i):
            crng = random.Random(args.seed * 1000 + i)
            while not stop.is_set():
                if i >= level[0]:  # idle in this phase of the burst pattern
                    time.sleep(0.05)
                    continue
                p, n = work[crng.randrange(len(work))]
                t0 = time.time()
                status, text = complete(node.http, p, n)
                dt = time.time() - t0
                with lock:
                    latencies.append(dt)
                    if status == 200 and text == ref[(p, n)]:
                        stats["ok"] += 1
                    else:
                        stats["wrong" if status == 200 else "failed"] += 1
                        if len(bad) < 10:
                            bad.append(f"{p!r} max_tokens {n}: HTTP {status}: {text[:160]!r}")

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        faults = []
        start = time.time()
        next_fault = start + args.fault_every * rng.uniform(0.5, 1.0)
        next_level = start
        stopped = None  # (name, pid, resume_at)
        while time.time() - start < args.seconds:
            now = time.time()
            if now >= next_level:  # bursty: the number of active clients changes every 2-5 s
                level[0] = rng.choice([1, 2, 4, 8, CLIENTS, CLIENTS])
                next_level = now + rng.uniform(2, 5)
            if stopped and now >= stopped[2]:
                os.kill(stopped[1], signal.SIGCONT)
                stopped = None
            if now >= next_fault and stopped is None:
                kids = node.children()
                victims = sorted(n for n in kids if n != "router")
                if victims:
                    name = rng.choice(victims)
                    if rng.random() < 0.5:
                        os.kill(kids[name], signal.SIGKILL)
                        faults.append((round(now - start, 1), name, "SIGKILL"))
                    else:
                        pause = rng.uniform(2, 8)
                        os.kill(kids[name], signal.SIGSTOP)
                        stopped = (name, kids[name], now + pause)
                        faults.append((round(now - start, 1), name, f"SIGSTOP {pause:.1f} s"))
                    print(f"  t={now - start:6.1f} s: {faults[-1][1]} {faults[-1][2]} "
                          f"(so far: {stats})", flush=True)
                next_fault = now + args.fault_every * rng.uniform(0.75, 1.25)
            time.sleep(0.05)
        if stopped:
            os.kill(stopped[1], signal.SIGCONT)
        stop.set()
        for t in threads:
            t.join(240)
        elapsed = time.time() - start

        # Accounting back to zero once the node has settled (heartbeats carry worker state).
        deadline = time.time() + 20
        acc = accounting(node)
        while time.time() < deadline and any(v != 0 for v in acc.values()):
            time.sleep(0.5)
            acc = accounting(node)
        end_pids = node.children()
        end_rss = {name: rss_kib(pid) for name, pid in end_pids.items()}
        killed = {n for _, n, how in faults if how == "SIGKILL"}

        lat = sorted(latencies)
        pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0)
        report = {
            "seconds": round(elapsed, 1), "seed": args.seed, "clients": CLIENTS,
            "requests": stats, "faults": faults,
            "latency_s": {"p50": round(pct(0.5), 3), "p99": round(pct(0.99), 3),
                          "max": round(lat[-1], 3) if lat else 0},
            "accounting_at_end": acc,
            "rss_kib": {n: {"after_warmup": base_rss.get(n), "end": end_rss.get(n),
                            "restarted": n in killed or base_pids.get(n) != end_pids.get(n)}
                        for n in sorted(set(base_rss) | set(end_rss))},
        }
        with open(os.path.join(log_dir, "soak.json"), "w") as f:
            json.dump(report, f, indent=1)
        print(json.dumps(report, indent=1))

        if stats["wrong"] or stats["failed"]:
            failures.append(f"{stats['wrong']} wrong and {stats['failed']} failed requests: "
                            + "; ".join(bad))
        if stats["ok"] == 0:
            failures.append("no request was served")
        if len(faults) < max(1, int(args.seconds / args.fault_every) - 1):
            failures.append(f"only {len(faults)} faults were injected")
        for what, v in acc.items():
            if v != 0:
                failures.append(f"{what}: {v} at the end (expected 0)")
        for n, r in report["rss_kib"].items():
            # Restarted processes too: a fresh one that served for a while must not be bigger.
            if not r["after_warmup"] or not r["end"]:
                continue
            if r["end"] > r["after_warmup"] * RSS_MARGIN[0] + RSS_MARGIN[1]:
                failures.append(f"RSS of {n} grew {r['after_warmup']} -> {r['end']} KiB")
        if node.proc.poll() is not None:
            failures.append(f"pw-cluster exited with {node.proc.returncode}")
    finally:
        if failures:
            node.dump_logs()
        node.stop()
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("PASS: no request lost or wrong, accounting back to zero, RSS flat")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
