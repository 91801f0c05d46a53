#!/usr/bin/env python3
"""TTFT and inter-token latency of a local cluster at several concurrent stream counts.

Starts pw-router + pw-prefill + pw-decode (tests/e2e/cluster.py) on the given model, then for
each concurrency N runs pw-loadgen with N streams kept busy (--rate inf --max-concurrency N,
max(16, 4N) requests, token-id prompts of --prompt-tokens, exactly --max-tokens generated with
ignore_eos) and prints one markdown row per N.

Usage: bench_cluster.py BUILD_DIR MODEL_DIR [--streams 1 16 64] [--prompt-tokens 64]
                        [--max-tokens 64] [--repeat 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from cluster import LocalCluster  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per stream count; the table shows the median of each column")
    args = ap.parse_args()
    build_dir = os.path.abspath(args.build_dir)
    log_dir = os.path.join(build_dir, "bench-logs")
    rows = []
    with LocalCluster(build_dir, os.path.abspath(args.model_dir), log_dir, kv_blocks=2048,
                      max_batch=128) as c:
        itl_sum = "pagedweight_router_inter_token_latency_seconds_sum"
        itl_count = "pagedweight_router_inter_token_latency_seconds_count"
        for n in [n for n in args.streams for _ in range(args.repeat)]:
            m0 = c.metrics()
            out = os.path.join(log_dir, f"streams-{n}.json")
            argv = [os.path.join(build_dir, "bin", "pw-loadgen"), "--base-url", c.url,
                    "--num-prompts", str(max(16, 4 * n)), "--request-rate", "inf",
                    "--max-concurrency", str(n), "--random-input-len", str(args.prompt_tokens),
                    "--random-output-len", str(args.max_tokens), "--ignore-eos", "--seed", "1",
                    "--metric-percentiles", "50,90", "--quiet", "--result-filename", out]
            print("+", " ".join(argv), flush=True)
            if subprocess.run(argv).returncode != 0:
                print(f"streams {n}: some requests failed", file=sys.stderr)
                return 1
            with open(out) as f:
                s = json.load(f)
            m1 = c.metrics()
            gaps = m1.get(itl_count, 0) - m0.get(itl_count, 0)
            s["router_itl_mean_ms"] = ((m1.get(itl_sum, 0) - m0.get(itl_sum, 0)) / gaps * 1000
                                       if gaps else float("nan"))
            rows.append((n, s))
    print("| streams | TTFT p50 ms | TTFT p90 ms | TPOT mean ms | ITL mean ms (router) | "
          "ITL p50 / p90 ms (client) | output tok/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.streams:
        runs = [s for k, s in rows if k == n]

        def med(f):
            return statistics.median(f(s) for s in runs)
        print(f"| {n} | {med(lambda s: s['p50_ttft_ms']):.1f} | "
              f"{med(lambda s: s['p90_ttft_ms']):.1f} | "
              f"{med(lambda s: s['mean_tpot_ms']):.2f} | "
              f"{med(lambda s: s['router_itl_mean_ms']):.2f} | "
              f"{med(lambda s: s['p50_itl_ms']):.2f} / {med(lambda s: s['p90_itl_ms']):.2f} | "
              f"{med(lambda s: s['output_throughput']):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
