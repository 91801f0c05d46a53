#!/usr/bin/python3
"""pw-loadgen-plot: plots of pw-loadgen result JSON files (matplotlib; Debian python3-matplotlib).

For a single run RESULT.json it writes, next to --out-prefix (default: the JSON's path without
.json):
  PREFIX-latency-cdf.png   empirical CDFs of TTFT, TPOT, ITL and E2E latency (ms, log x)
  PREFIX-timeline.png      completed requests/s, output tokens/s and requests in flight over time
For a sweep (a JSON with "sweep", or several single-run JSONs given together):
  PREFIX-pareto.png        output throughput against TTFT p50/p99 and TPOT p50, one point per rate

Usage: pw-loadgen-plot RESULT.json [MORE.json ...] [--out-prefix PREFIX] [--title TITLE]
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # pragma: no cover - reported to the user
    sys.exit("pw-loadgen-plot: matplotlib is missing (apt-get install python3-matplotlib)")


def tpots(run):
    out = []
    for ttft, e2el, n in zip(run.get("ttfts", []), run.get("e2els", []), run.get("output_lens", [])):
        if n and n > 1 and e2el > 0:
            out.append((e2el - ttft) / (n - 1) * 1000)
    return out


def cdf(ax, values, label):
    if not values:
        return
    v = sorted(values)
    n = len(v)
    ax.step(v, [(i + 1) / n for i in range(n)], where="post", label=f"{label} (n={n})")


def plot_run(run, prefix, title):
    ok = [e == "" for e in run.get("errors", [])]
    ttft = [t * 1000 for t, good in zip(run.get("ttfts", []), ok) if good]
    e2el = [t * 1000 for t, good in zip(run.get("e2els", []), ok) if good]
    itl = [g * 1000 for gaps, good in zip(run.get("itls", []), ok) if good for g in gaps]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
    for ax, (name, vals) in zip(axes, [("TTFT", ttft), ("TPOT", tpots(run)), ("ITL", itl),
                                       ("E2E latency", e2el)]):
        cdf(ax, vals, name)
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests" if name != "ITL" else "fraction of gaps")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{title}: latency CDFs")
    fig.tight_layout()
    fig.savefig(prefix + "-latency-cdf.png", dpi=110)
    plt.close(fig)

    tl = run.get("timeline", {})
    t = tl.get("t", [])
    if len(t) >= 2:
        def rate(key):
            v = tl[key]
            return [(v[i] - (v[i - 1] if i else 0)) / (t[i] - (t[i - 1] if i else 0))
                    for i in range(len(t))]
        fig, ax1 = plt.subplots(figsize=(10, 4))
        ax1.plot(t, rate("completed"), label="completed requests/s", color="tab:blue")
        ax1.plot(t, tl["in_flight"], label="requests in flight", color="tab:orange")
        ax1.set_xlabel("time since start (s)")
        ax1.set_ylabel("requests/s, requests")
        ax2 = ax1.twinx()
        # "output_chunks": result files written before tokens were counted per token
        key = "output_tokens" if "output_tokens" in tl else "output_chunks"
        ax2.plot(t, rate(key), label="output tokens/s", color="tab:green", alpha=0.7)
        ax2.set_ylabel("output tokens/s")
        lines = ax1.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax1.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
        ax1.grid(True, alpha=0.3)
        fig.suptitle(f"{title}: throughput and requests in flight")
        fig.tight_layout()
        fig.savefig(prefix + "-timeline.png", dpi=110)
        plt.close(fig)


def plot_pareto(runs, prefix, title):
    pts = sorted(runs, key=lambda r: r["output_throughput"])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [r["output_throughput"] for r in pts]
    for key, label in [("p50_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
                       ("p50_tpot_ms", "TPOT p50")]:
        ax.plot(x, [r[key] for r in pts], marker="o", label=label)
    for r in pts:
        ax.annotate(f"{r['request_rate']} req/s", (r["output_throughput"], r["p99_ttft_ms"]),
                    fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_yscale("log")
    ax.set_xlabel("output throughput (tokens/s)")
    ax.set_ylabel("latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"{title}: latency against throughput")
    fig.tight_layout()
    fig.savefig(prefix + "-pareto.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="pw-loadgen-plot", description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--out-prefix")
    ap.add_argument("--title", default="pw-loadgen")
    args = ap.parse_args(argv)
    docs = []
    for path in args.results:
        try:
            with open(path) as f:
                docs.append(json.load(f))
        except (OSError, ValueError) as e:
            sys.exit(f"pw-loadgen-plot: {path}: {e}")
    prefix = args.out_prefix or os.path.splitext(args.results[0])[0]
    written = []
    if len(docs) == 1 and "sweep" not in docs[0]:
        plot_run(docs[0], prefix, args.title)
        written += [prefix + "-latency-cdf.png", prefix + "-timeline.png"]
    else:
        runs = [r for d in docs for r in (d["sweep"] if "sweep" in d else [d])]
        plot_pareto(runs, prefix, args.title)
        written.append(prefix + "-pareto.png")
    for w in written:
        if os.path.exists(w):
            print("wrote", w)
    return 0


if __name__ == "__main__":
    sys.exit(main())
