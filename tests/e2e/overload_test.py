#!/usr/bin/env python3
"""Overload where memory, not the queue, is the limit: deploy/tight-planner.yaml (the embedded
model's .apw store, the broker's planner on, a 26 MiB decode page pool, reservations held for
a lowering) under pw-cluster, hit by one burst of heavy requests at once:

  - LONG requests: PROMPT-token prompts generating MAX_TOKENS tokens each (ignore_eos);
  - FANOUT requests: n = best_of = 16 candidates with logprobs;
  - ECHO requests: prompts near the context length with echo and logprobs (max_tokens 0).

The router's queue (max_waiting 1024) holds them all; what runs out is the decode pool's KV.
The deploy file's time constants are kept except the KV lease, cut from 30 s to LEASE_MS so
that a prefill queue a 2-core machine works through in a few seconds outlasts it. Before the
router admitted by KV, the default size (24 requests) saw 16 leases expire and 15 requests
placed again, and the full size (244 requests, the 30 s lease) 28 and 28, with 151 requests
answered 504 after 300 s; both saw the broker declare the starting decode worker dead.

Passes when
  - every request is answered either 200 (all its choices, their full length for LONG) or 429
    with a Retry-After of whole seconds and an OpenAI error object, nothing else (no 503 after
    3 placements, no 504);
  - no KV lease expired on the decode worker (pagedweight_kv_leases_expired_total);
  - no request was placed again (pagedweight_router_backend_requests_replaced_total): none had
    its prefill thrown away;
  - no process declared a peer dead (router, broker, workers' logs);
    (the last two except at moments the machine stalled: the test's own 50 ms timer woke a
    second late or more, see StallWatch; such stalls are printed)
  - at rest every KV block is free again and no reservation is left.

Usage: overload_test.py BUILD_DIR MODEL_DIR [--long N] [--fanout N] [--echo N] [--lease-ms MS]
                        [--log-dir D]
(--long 200 --fanout 22 --echo 22 --lease-ms 30000 is the full-size scenario.)
Exit: 0 pass, 1 fail, 77 skipped (no weights or no store).
"""
import argparse
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "pylib")]
from cluster import SKIP, http_get, model_present  # noqa: E402
from completions import post_completion  # noqa: E402
from localhost import free_port  # noqa: E402
from prom_samples import scrape_if_up  # noqa: E402

LEASE_MS = 3000
PROMPT, MAX_TOKENS = 400, 1500   # the scenario's long requests
ECHO_PROMPT = 2040               # of the 2048-token context
CLIENT_TIMEOUT_S = 1200          # a hang guard only; the router's own timeout is the deploy's
STALL_S = 1.0                    # the test's own 50 ms timer woke this late: nothing of ours ran


def deploy_yaml(src, build_dir, model_dir, run_dir, ports, lease_ms):
    """deploy/tight-planner.yaml with this build's paths, free ports and `lease_ms`."""
    with open(src) as f:
        text = f.read()
    subs = [
        (r"(?m)^model_dir: .*$", f"model_dir: {model_dir}\nbin_dir: {build_dir}/bin"),
        (r"(?m)^run_dir: .*$", f"run_dir: {run_dir}"),
        (r"(?m)^(  )port: \d+", rf"\g<1>port: {ports['http']}"),
        (r"(?m)^(  lease_ms: )\d+", rf"\g<1>{lease_ms}"),
        (r"(?m)^(  store: ).*$", rf"\g<1>{build_dir}/tiny-moe.apw"),
    ]
    for pattern, repl in subs:
        text, n = re.subn(pattern, repl, text)
        if n != 1:
            raise RuntimeError(f"{src}: expected one match of {pattern!r}, found {n}")
    # Every control and metrics port in order of appearance: router, broker; prefill; decode.
    names = iter(["router-control", "broker-control", "broker", "prefill-0", "decode-0"])

    def port(m):
        return f"{m.group(1)}{ports[next(names)]}"
    text = re.sub(r"(?m)^(\s+(?:- )?(?:control_port|metrics_port): )\d+", port, text)
    return text


def requests_of(args):
    """[(kind, body)] of the burst, the kinds interleaved (the first ones sent run first)."""
    out = []
    for i in range(args.long):
        prompt = [1 + (i * 7 + k) % 500 for k in range(PROMPT)]
        out.append(("long", {"model": "tiny-moe", "prompt": prompt, "max_tokens": MAX_TOKENS,
                             "temperature": 0, "ignore_eos": True}))
    for i in range(args.fanout):
        prompt = [2 + (i * 11 + k) % 500 for k in range(PROMPT)]
        out.append(("fanout", {"model": "tiny-moe", "prompt": prompt, "max_tokens": 64,
                               "n": 16, "best_of": 16, "logprobs": 2, "temperature": 1.0,
                               "seed": i}))
    for i in range(args.echo):
        prompt = [3 + (i * 13 + k) % 500 for k in range(ECHO_PROMPT)]
        out.append(("echo", {"model": "tiny-moe", "prompt": prompt, "max_tokens": 0,
                             "echo": True, "logprobs": 1}))
    # Round robin over the kinds, in the order they were made.
    kinds = {}
    for kind, body in out:
        kinds.setdefault(kind, []).append((kind, body))
    mixed = []
    while any(kinds.values()):
        for queue in kinds.values():
            if queue:
                mixed.append(queue.pop(0))
    return mixed


def check_reply(kind, body, status, headers, reply):
    """'' when the answer is one the test accepts, else why not."""
    if status == 429:
        ra = headers.get("retry-after", "")
        if not ra.isdigit() or int(ra) < 1:
            return f"429 without a Retry-After of whole seconds: {ra!r}"
        err = reply.get("error") if isinstance(reply, dict) else None
        if not isinstance(err, dict) or not all(k in err for k in ("message", "type", "param",
                                                                   "code")):
            return f"429 without an OpenAI error object: {str(reply)[:200]}"
        return ""
    if status != 200:
        return f"HTTP {status}: {str(reply)[:300]}"
    choices = reply.get("choices", []) if isinstance(reply, dict) else []
    n = body.get("n", 1)
    if len(choices) != n:
        return f"{len(choices)} choices for n = {n}"
    if kind == "long" and reply.get("usage", {}).get("completion_tokens") != MAX_TOKENS:
        return f"completion_tokens {reply.get('usage')} instead of {MAX_TOKENS}"
    return ""


class StallWatch(threading.Thread):
    """Sleeps 50 ms over and over and keeps the wall-clock windows in which a wake-up came
    STALL_S late or more: the machine ran nothing of ours then (a paused VM, a host out of
    memory), and every process finds all its peers silent at once when it resumes. A peer
    declared dead, or a request placed again, at such a moment is the machine's doing, not the
    node's: the test reports those apart and does not count them."""

    def __init__(self):
        super().__init__(daemon=True)
        self.windows = []
        self.done = threading.Event()

    def run(self):
        last = time.monotonic()
        while not self.done.wait(0.05):
            now = time.monotonic()
            if now - last >= STALL_S:
                end = time.time()
                self.windows.append((end - (now - last), end))
            last = now

    def covers(self, wall, after_s=1.0):
        """True when `wall` falls in a stall or within `after_s` after its end."""
        return wall is not None and any(a <= wall <= b + after_s for a, b in self.windows)


def log_time(line):
    """Wall-clock seconds of a log line's leading UTC timestamp; None when it has none."""
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z", line)
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f")
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def log_lines(run_dir, *needles):
    """(process log, line) of every line of the node's logs holding one of `needles`."""
    out = []
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if not name.endswith(".log"):
            continue
        with open(os.path.join(run_dir, name), errors="replace") as f:
            for line in f:
                if any(n in line for n in needles):
                    out.append((name, line.strip()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--long", type=int, default=20)
    ap.add_argument("--fanout", type=int, default=2)
    ap.add_argument("--echo", type=int, default=2)
    ap.add_argument("--lease-ms", type=int, default=LEASE_MS,
                    help=f"the router's KV lease (default {LEASE_MS}; the deploy file's is 30000)")
    ap.add_argument("--log-dir", help="default: BUILD_DIR/e2e-logs/overload")
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    model_dir = os.path.abspath(args.model_dir)
    if not model_present(model_dir):
        return SKIP
    if not os.path.exists(os.path.join(build_dir, "tiny-moe.apw")):
        print(f"SKIPPED: no {build_dir}/tiny-moe.apw (the tiny_store target)")
        return SKIP
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                       "tight-planner.yaml")
    log_dir = os.path.abspath(args.log_dir or os.path.join(build_dir, "e2e-logs", "overload"))
    run_dir = os.path.join(log_dir, "run")
    shutil.rmtree(run_dir, ignore_errors=True)  # pw-cluster appends to the logs there
    os.makedirs(log_dir, exist_ok=True)
    ports = {k: free_port() for k in ("http", "router-control", "broker-control", "broker",
                                       "prefill-0", "decode-0")}
    yaml = os.path.join(log_dir, "cluster.yaml")
    with open(yaml, "w") as f:
        f.write(deploy_yaml(src, build_dir, model_dir, run_dir, ports, args.lease_ms))
    out = open(os.path.join(log_dir, "pw-cluster.out"), "w")
    proc = subprocess.Popen([os.path.join(build_dir, "bin", "pw-cluster"), "up", "--config", yaml],
                            stdout=out, stderr=subprocess.STDOUT)
    failures = []
    stalls = StallWatch()
    stalls.start()
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if http_get(f"http://127.0.0.1:{ports['http']}/health")[0] == 200:
                break
            time.sleep(0.2)
        if http_get(f"http://127.0.0.1:{ports['http']}/health")[0] != 200:
            raise RuntimeError("the node did not become healthy")
        # The decode worker's heartbeats have reached the router (its free KV shows).
        while time.time() < deadline:
            m = scrape_if_up(ports["http"])
            if m.get("pagedweight_router_backend_free_kv_blocks", 0) > 0:
                break
            time.sleep(0.2)

        burst = requests_of(args)
        results = [None] * len(burst)

        def run(i):
            kind, body = burst[i]
            results[i] = post_completion(ports["http"], body, CLIENT_TIMEOUT_S)
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(burst))]
        t0 = time.time()
        for t in threads:
            t.start()
        # What admission and the decode worker show, every few seconds while the burst runs.
        while any(t.is_alive() for t in threads):
            m = scrape_if_up(ports["http"])
            kv = {s: m.get(f'pagedweight_router_kv_admission_blocks{{state="{s}"}}')
                  for s in ("capacity", "committed", "queued")}
            d = {}
            for k, v in scrape_if_up(ports["decode-0"]).items():
                if k.startswith(("pagedweight_worker_num_preemptions_total",
                                 "pagedweight_kv_leases_expired_total")):
                    d[k.split("{")[0].replace("pagedweight_", "")] = v
            print(f"  {time.time() - t0:5.0f} s: running "
                  f"{m.get('pagedweight_router_num_requests_running')}, waiting "
                  f"{m.get('pagedweight_router_num_requests_waiting')}, KV blocks {kv}, {d}",
                  flush=True)
            for t in threads:
                t.join(timeout=5 / len(threads))
        for t in threads:
            t.join()
        print(f"burst of {len(burst)} requests answered in {time.time() - t0:.1f} s")

        counts = {}
        for (kind, body), (status, headers, reply) in zip(burst, results):
            counts[(kind, status)] = counts.get((kind, status), 0) + 1
            why = check_reply(kind, body, status, headers, reply)
            if why:
                failures.append(f"{kind}: {why}")
        for (kind, status), c in sorted(counts.items()):
            print(f"  {kind:6s} HTTP {status}: {c}")

        def metric(port, name):
            m = scrape_if_up(port)
            return sum(v for k, v in m.items() if k.split("{")[0] == name)
        expired = metric(ports["decode-0"], "pagedweight_kv_leases_expired_total")
        replaced = metric(ports["http"], "pagedweight_router_backend_requests_replaced_total")
        print(f"leases expired: {expired:.0f}, requests placed again: {replaced:.0f}")
        if expired:
            failures.append(f"{expired:.0f} KV leases expired")
        if replaced:
            again = log_lines(run_dir, "placed again (")
            if not again or not all(stalls.covers(log_time(line)) for _, line in again):
                failures.append(f"{replaced:.0f} requests were placed again")
            else:
                print(f"NOTE: {replaced:.0f} requests were placed again, each while the machine "
                      "stalled (below): not counted")

        # At rest: every KV block free, nothing reserved (the next heartbeats show it).
        rest = {}
        for _ in range(100):
            m = scrape_if_up(ports["decode-0"])
            rest = {s: sum(v for k, v in m.items() if k.split("{")[0] == "pagedweight_kv_blocks"
                           and f'state="{s}"' in k) for s in ("used", "reserved")}
            if rest == {"used": 0, "reserved": 0}:
                break
            time.sleep(0.2)
        if rest != {"used": 0, "reserved": 0}:
            failures.append(f"KV not free at rest: {rest}")
        # Before the node stops (its processes leave one by one then, and the last ones see the
        # first ones fall silent).
        stalls.done.set()
        for a, b in stalls.windows:
            print(f"NOTE: the machine stalled for {b - a:.1f} s from "
                  f"{datetime.datetime.fromtimestamp(a, datetime.timezone.utc):%H:%M:%S.%f} UTC "
                  "(the test's own timer woke that late)")
        dead = log_lines(run_dir, "declared dead", "silent for 3 heartbeats")
        counted = [(n, line) for n, line in dead if not stalls.covers(log_time(line))]
        for name, line in dead:
            print(f"{name}: {line}" + ("" if (name, line) in counted else "  [machine stall]"))
        if counted:
            failures.append(f"{len(counted)} peer(s) declared dead")
    except RuntimeError as e:
        failures.append(str(e))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        out.close()

    for f in failures[:40]:
        print("FAIL:", f)
    if len(failures) > 40:
        print(f"FAIL: ... and {len(failures) - 40} more")
    if failures:
        # The processes' logs only: the run directory also holds the node's control keys.
        for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
            if not name.endswith(".log"):
                continue
            with open(os.path.join(run_dir, name), errors="replace") as f:
                print(f"---- {name}\n{f.read()[-2500:]}")
    print("PASS" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
