#!/usr/bin/python3
"""The serving figures of docs/benchmarks.md ("Serving under bursty load"), in one invocation.

Starts the embedded cluster (tests/e2e/cluster.py: pw-router, one pw-prefill, one pw-decode,
--threads 1 each, decode maxBatch 64, 2048 KV blocks) and runs pw-loadgen against it:

  1. TTFT side by side (odd rounds in reverse order): the Azure conversation trace (AzureLLMInferenceTrace_conv.csv) at 4x,
     prompts clipped to 384 tokens, outputs to 256 (exact, ignore_eos), 300 requests, under
     each configuration, interleaved over --repeat rounds (one fresh cluster per run):
       before  the Python load generator of the previous tree (--python-loadgen FILE) and the
               router with --prefill-ahead 0 (the old scheduling)
       client  pw-loadgen (C++) and --prefill-ahead 0
       after   pw-loadgen and the default prefill ahead
     with the TTFT breakdown from the cluster's own histograms (router queue for a decode slot,
     prefill queue, prefill + KV write);
  2. Poisson (burstiness 1) and gamma (burstiness 0.5) arrivals at three rates, 256-token
     prompts and 128-token outputs (range ratio 0.5), --duration seconds each (after);
  3. the trace replay (after), saved with plots.
Every result JSON, its plots (pw-loadgen-plot) and a summary.md land in --out.

Usage: bench_serving.py BUILD_DIR MODEL_DIR --trace CSV [--python-loadgen FILE] [--out DIR]
                        [--rates 4 8 16] [--duration 20] [--repeat 2]
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
from cluster import LocalCluster  # noqa: E402

HISTS = {"ttft": "pagedweight_router_time_to_first_token_seconds",
         "router_queue": "pagedweight_router_request_queue_time_seconds",
         "prefill_queue": "pagedweight_worker_request_queue_time_seconds",
         "prefill": "pagedweight_worker_request_prefill_time_seconds"}


def hist_mean_ms(m0, m1, name):
    def tot(m, suffix):
        return sum(v for k, v in m.items() if k.split("{")[0] == name + suffix)
    n = tot(m1, "_count") - tot(m0, "_count")
    return (tot(m1, "_sum") - tot(m0, "_sum")) / n * 1000 if n else float("nan")


def load_avg():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def trace_args(trace):
    return ["--trace", trace, "--trace-speedup", "4", "--clip-context", "384",
            "--clip-output", "256", "--num-prompts", "300"]


def run_cpp(build, url, extra, out):
    argv = [os.path.join(build, "bin", "pw-loadgen"), "--base-url", url, "--ignore-eos",
            "--num-warmups", "4", "--goodput", "ttft:500", "tpot:50",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--quiet", "--result-filename", out] + extra
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, stdout=subprocess.DEVNULL, timeout=900)
    with open(out) as f:
        d = json.load(f)
    return {"completed": d["completed"], "failed": d["failed"], "req_s": d["request_throughput"],
            "out_tok_s": d["output_throughput"], "ttft_p50": d["p50_ttft_ms"],
            "ttft_p90": d["p90_ttft_ms"], "ttft_p99": d["p99_ttft_ms"],
            "tpot_p50": d["p50_tpot_ms"], "tpot_p99": d["p99_tpot_ms"],
            "itl_p50": d["p50_itl_ms"], "itl_p99": d["p99_itl_ms"],
            "goodput": d["goodput_fraction"], "goodput_req_s": d["request_goodput"]}


def run_python(pyloadgen, url, trace, out):
    # The previous tree's flags; its SLOs set to the same goodput definition.
    argv = [sys.executable, pyloadgen, "--url", url, "--trace", trace, "--trace-speedup", "4",
            "--max-prompt-tokens", "384", "--max-output-tokens", "256", "--num-requests", "300",
            "--ignore-eos", "--slo-ttft-ms", "500", "--slo-tpot-ms", "50", "--json-out", out]
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, stdout=subprocess.DEVNULL, timeout=900)
    with open(out) as f:
        d = json.load(f)
    return {"completed": d["completed"], "failed": d["failed"],
            "req_s": d["request_throughput_per_s"], "out_tok_s": d["output_token_throughput_per_s"],
            "ttft_p50": d["ttft"]["p50_ms"], "ttft_p90": d["ttft"]["p90_ms"],
            "ttft_p99": d["ttft"]["p99_ms"], "tpot_p50": d["tpot"]["p50_ms"],
            "tpot_p99": d["tpot"]["p99_ms"], "itl_p50": d["itl"]["p50_ms"],
            "itl_p99": d["itl"]["p99_ms"], "goodput": d["goodput_per_s"] / d["request_throughput_per_s"]
            if d["request_throughput_per_s"] else 0, "goodput_req_s": d["goodput_per_s"]}


def cluster(build, model, log_dir, ahead):
    return LocalCluster(build, model, log_dir, kv_blocks=2048, max_batch=64,
                        router_args=["--prefill-ahead", str(ahead)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--python-loadgen")
    ap.add_argument("--out", default="out/bench")
    ap.add_argument("--rates", type=float, nargs="+", default=[4, 8, 16])
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-figures", action="store_true")
    args = ap.parse_args()
    build, model = os.path.abspath(args.build_dir), os.path.abspath(args.model_dir)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    logs = os.path.join(out, "logs")
    lines = [f"# bench_serving.py, started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC", ""]

    # 1. Side by side.
    configs = [("after", None, -1), ("client", None, 0)]
    if args.python_loadgen:
        configs.append(("before", args.python_loadgen, 0))
    rows = []
    for rnd in range(args.repeat):
        # Odd rounds run the configurations in reverse order, so a load trend on the machine
        # does not favour one of them.
        for name, py, ahead in (configs if rnd % 2 == 0 else configs[::-1]):
            la0 = load_avg()
            with cluster(build, model, logs, ahead) as c:
                m0 = {**c.metrics(), **c.worker_metrics("prefill-0")}
                path = os.path.join(out, f"side-{name}-{rnd}.json")
                r = (run_python(py, c.url, args.trace, path) if py else
                     run_cpp(build, c.url, trace_args(args.trace), path))
                m1 = {**c.metrics(), **c.worker_metrics("prefill-0")}
            for k, h in HISTS.items():
                r["mean_" + k] = hist_mean_ms(m0, m1, h)
            r.update(config=name, round=rnd, load=f"{la0}->{load_avg()}")
            print(json.dumps(r), flush=True)
            rows.append(r)
    lines += ["## TTFT side by side (trace 4x, clip 384/256, 300 requests)", "",
              "| config | round | load avg | completed | req/s | TTFT p50 | p90 | p99 ms | TPOT p50 | p99 ms "
              "| ITL p50 | p99 ms | goodput % | router queue | prefill queue | prefill+KV ms (means) |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['round']} | {r['load']} | {r['completed']} | {r['req_s']:.2f} | "
                     f"{r['ttft_p50']:.0f} | {r['ttft_p90']:.0f} | {r['ttft_p99']:.0f} | {r['tpot_p50']:.2f} | "
                     f"{r['tpot_p99']:.2f} | {r['itl_p50']:.2f} | {r['itl_p99']:.2f} | {r['goodput'] * 100:.1f} | "
                     f"{r['mean_router_queue']:.0f} | {r['mean_prefill_queue']:.0f} | {r['mean_prefill']:.0f} |")
    lines.append("")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    if args.skip_figures:
        print("\n".join(lines))
        return 0

    # 2. and 3.: one cluster, default (after) configuration.
    fig = []
    with cluster(build, model, logs, -1) as c:
        for burst in (1.0, 0.5):
            for rate in args.rates:
                la0 = load_avg()
                path = os.path.join(out, f"rate{rate:g}-b{burst:g}.json")
                r = run_cpp(build, c.url, ["--request-rate", str(rate), "--burstiness", str(burst),
                                           "--duration", str(args.duration), "--num-prompts", "0",
                                           "--drain-timeout", "inf",  # every request sent completes, as measured before
                                           "--random-input-len", "256", "--random-output-len", "128",
                                           "--random-range-ratio", "0.5", "--seed", "1"], path)
                r.update(rate=rate, burst=burst, load=f"{la0}->{load_avg()}")
                print(json.dumps(r), flush=True)
                fig.append(r)
                subprocess.run([os.path.join(build, "bin", "pw-loadgen-plot"), path, "--title",
                                f"{'Poisson' if burst == 1 else 'gamma 0.5'} {rate:g} req/s"])
        la0 = load_avg()
        path = os.path.join(out, "trace-4x.json")
        tr = run_cpp(build, c.url, trace_args(args.trace), path)
        tr["load"] = f"{la0}->{load_avg()}"
        subprocess.run([os.path.join(build, "bin", "pw-loadgen-plot"), path, "--title",
                        "Azure conversation trace, 4x"])
    for b in (1.0, 0.5):
        runs = [os.path.join(out, f"rate{r:g}-b{b:g}.json") for r in args.rates]
        subprocess.run([os.path.join(build, "bin", "pw-loadgen-plot")] + runs + [
            "--out-prefix", os.path.join(out, f"pareto-b{b:g}"),
            "--title", "Poisson" if b == 1 else "gamma 0.5"])
    lines += ["## Poisson and gamma 0.5 arrivals (256/128 tokens, range 0.5)", "",
              "| arrivals | rate req/s | load avg | completed | req/s | output tok/s | TTFT p50 | p90 | p99 ms "
              "| TPOT p50 | p99 ms | ITL p50 | p99 ms | goodput % |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in fig:
        lines.append(f"| {'Poisson' if r['burst'] == 1 else 'gamma 0.5'} | {r['rate']:g} | {r['load']} | "
                     f"{r['completed']} | {r['req_s']:.2f} | {r['out_tok_s']:.0f} | {r['ttft_p50']:.0f} | "
                     f"{r['ttft_p90']:.0f} | {r['ttft_p99']:.0f} | {r['tpot_p50']:.2f} | {r['tpot_p99']:.2f} | "
                     f"{r['itl_p50']:.2f} | {r['itl_p99']:.2f} | {r['goodput'] * 100:.1f} |")
    lines += ["", "## Trace replay (after)", "", json.dumps(tr), ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
