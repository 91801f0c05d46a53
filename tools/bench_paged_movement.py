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
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "pylib")]
from paged_node import add_node_args, change, complete, metrics, wait_committed  # noqa: E402
from prom_samples import pick  # noqa: E402


def load_window(a, seconds):
    """Closed loop: each stream sends its next request when the last one finished. Counts output
    tokens of requests that finished inside the window (started after its start)."""
    stop = time.time() + seconds
    tokens = [0] * a.concurrency
    errors = []

    def stream(i):
        n = 0
        while time.time() < stop:
            try:
                tokens[i] += complete(a, [1 + (i * 7 + n) % 300, 5, 9, 17], a.max_tokens, timeout=300)
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
    add_node_args(p)
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
        wait_committed(a, change(a, "set-bits", str(a.low), "--all"))
        low = load_window(a, a.window)
        b0 = pick(metrics(a), 'pagedweight_plane_bytes_moved_total{direction="raise"')
        epoch = change(a, "apply", plan)
        done = {}
        threading.Thread(target=lambda: done.setdefault("s", wait_committed(a, epoch)), daemon=True).start()
        moving = load_window(a, a.window)
        while "s" not in done:
            time.sleep(0.05)
        moved = pick(metrics(a), 'pagedweight_plane_bytes_moved_total{direction="raise"') - b0
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
