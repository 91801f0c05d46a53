#!/usr/bin/env python3
"""Decode throughput while expert planes move, beside the same load with no movement.

Runs against a running cluster (pw-cluster up --config ...): a fixed closed-loop load
(--concurrency streams of greedy completions, --max-tokens each, ignore_eos) in windows of
--window seconds, alternating, --rounds times:
  still-low:  every block at --low bits, no movement;
  moving:     a plan raising --fraction of the blocks (the first ones of each layer) to --high
              bits is sent as the window starts; planes move while the load runs;
  still-high: the widths the plan ended at, no movement;
  then every block back to --low (not measured).
Prints output tokens/s per window and the ratio moving / still (time-weighted mean of the
still-low and still-high windows that bracket it, i.e. the same widths without movement),
the movement's duration and the bytes it moved (decode worker's /metrics).
Standard library only.
"""
import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request


def ctl(args, a):
    out = subprocess.run([a.pw_ctl, "--broker", a.broker, "--control-keys", a.control_keys] + args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pw-ctl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def wait_committed(epoch, a, timeout=600):
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = re.search(r"committed epoch (\d+), 0 change", ctl(["show"], a))
        if m and int(m.group(1)) >= epoch:
            return time.time() - t0
        time.sleep(0.05)
    sys.exit(f"epoch {epoch} not committed in {timeout} s")


def change(args, a):
    out = ctl(args, a)
    return int(re.search(r"plan epoch (\d+)", out).group(1))


def metric(a, name):
    body = urllib.request.urlopen(f"http://127.0.0.1:{a.decode_metrics}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def load_window(a, seconds):
    """Closed loop: each stream sends its next request when the last one finished. Counts output
    tokens of requests that finished inside the window (started after its start)."""
    stop = time.time() + seconds
    tokens = [0] * a.concurrency
    errors = []

    def stream(i):
        n = 0
        while time.time() < stop:
            body = json.dumps({"model": a.model, "prompt": [1 + (i * 7 + n) % 300, 5, 9, 17],
                               "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{a.http_port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            try:
                r = json.loads(urllib.request.urlopen(req, timeout=300).read())
                tokens[i] += r["usage"]["completion_tokens"]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(str(e))
            n += 1

    t0 = time.time()
    threads = [threading.Thread(target=stream, args=(i,)) for i in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    if errors:
        sys.exit(f"{len(errors)} failed requests, first: {errors[0]}")
    return sum(tokens) / wall


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pw-ctl", default="build/bin/pw-ctl")
    p.add_argument("--broker", default="tcp://127.0.0.1:5556")
    p.add_argument("--control-keys", default="build/run/control.keys",
                   help="the node's key file (pw-cluster writes it into its run_dir)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--decode-metrics", type=int, default=9102)
    p.add_argument("--model", default="tiny-moe")
    p.add_argument("--layers", type=int, required=True)
    p.add_argument("--experts", type=int, required=True)
    p.add_argument("--low", type=int, default=3)
    p.add_argument("--high", type=int, default=8)
    p.add_argument("--fraction", type=float, default=0.5)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    plan = "/tmp/pw_bench_raise.yaml"
    n = int(a.experts * a.fraction)
    with open(plan, "w") as f:
        f.write("blocks:\n")
        for layer in range(a.layers):
            for e in range(n):
                f.write(f"  - {{layer: {layer}, expert: {e}, bits: {a.high}}}\n")
    rows = []
    for r in range(a.rounds):
        wait_committed(change(["set-bits", str(a.low), "--all"], a), a)
        low = load_window(a, a.window)
        b0 = metric(a, 'pagedweight_plane_bytes_moved_total{direction="raise"')
        epoch = change(["apply", plan], a)
        done = {}
        threading.Thread(target=lambda: done.setdefault("s", wait_committed(epoch, a)), daemon=True).start()
        moving = load_window(a, a.window)
        while "s" not in done:
            time.sleep(0.05)
        moved = metric(a, 'pagedweight_plane_bytes_moved_total{direction="raise"') - b0
        high = load_window(a, a.window)
        rows.append((low, moving, high, done["s"], moved))
        print(f"round {r}: still-low {low:.1f} tok/s, moving {moving:.1f} tok/s "
              f"(movement {done['s']:.2f} s, {moved / 2**20:.1f} MiB), still-high {high:.1f} tok/s",
              flush=True)
    ratios = []
    for low, moving, high, secs, moved in rows:
        frac = min(1.0, secs / a.window)
        # Without movement the window would have run `frac` of its time between the widths and
        # the rest at the final ones: bracket with the mean of low and high for the first part.
        still = frac * (low + high) / 2 + (1 - frac) * high
        ratios.append(moving / still)
    print(f"moving / still (same widths, no movement): " + ", ".join(f"{x:.3f}" for x in ratios) +
          f"; mean {sum(ratios) / len(ratios):.3f}")


if __name__ == "__main__":
    main()
