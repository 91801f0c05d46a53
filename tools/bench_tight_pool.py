#!/usr/bin/env python3
"""Requests running at once under a tight page pool, at two expert widths, in one run.

Against a running cluster whose decode worker has a pool budget (pool_mb) too small for
8-bit experts plus the KV the load needs (deploy/tight.yaml): for each phase of --phases
(widths), pw-ctl set-bits W --all, wait for the commit, then --requests concurrent greedy
completions of --max-tokens each (ignore_eos), sampling the decode worker's /metrics every
100 ms: requests running (peak and mean), pool pages by tenant, preemptions, output tok/s.
The last phase sets its width while the previous phase's load is still running (the weights
come back while serving). Standard library only.
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


def set_bits(a, bits):
    return wait_committed(a, change(a, "set-bits", str(bits), "--all"), timeout=300)


def run_load(a, label, during=None):
    samples = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            m = metrics(a)
            samples.append((time.time(), pick(m, "pagedweight_worker_num_requests_running"),
                            pick(m, 'pagedweight_pool_pages{tenant="kv"'),
                            pick(m, 'pagedweight_pool_pages{tenant="weights"'),
                            pick(m, 'pagedweight_pool_pages{tenant="free"')))
            time.sleep(0.1)

    m0 = metrics(a)
    tokens = [0] * a.requests
    errors = []

    def one(i):
        try:
            tokens[i] = complete(a, [1 + i % 300, 7, 11, 13, 17, 19, 23, 29], a.max_tokens)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e))

    s = threading.Thread(target=sampler)
    s.start()
    t0 = time.time()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.requests)]
    for t in threads:
        t.start()
    if during is not None:
        time.sleep(a.switch_after)
        during()
    for t in threads:
        t.join()
    wall = time.time() - t0
    stop.set()
    s.join()
    m1 = metrics(a)
    running = [x[1] for x in samples]
    print(f"{label}: {a.requests} requests x {a.max_tokens} tokens in {wall:.1f} s = "
          f"{sum(tokens) / wall:.1f} tok/s; running at once: peak {max(running):.0f}, mean "
          f"{sum(running) / len(running):.1f}; pool pages kv peak {max(x[2] for x in samples):.0f}, "
          f"weights {samples[0][3]:.0f} -> {samples[-1][3]:.0f}; preemptions "
          f"{pick(m1, 'pagedweight_worker_num_preemptions_total') - pick(m0, 'pagedweight_worker_num_preemptions_total'):.0f}; "
          f"failed {len(errors)}", flush=True)
    if errors:
        print("  first error:", errors[0])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_node_args(p)
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--switch-after", type=float, default=3.0)
    a = p.parse_args()
    print("commit 8 bits:", f"{set_bits(a, 8):.2f} s")
    run_load(a, "8 bits")
    print("commit 4 bits:", f"{set_bits(a, 4):.2f} s")
    run_load(a, "4 bits")
    run_load(a, f"4 bits, then set-bits 8 after {a.switch_after} s",
             during=lambda: print("  set-bits 8 --all sent; committed after",
                                  f"{set_bits(a, 8):.2f} s (while serving)", flush=True))


if __name__ == "__main__":
    main()
