#!/usr/bin/env python3
"""The expert-miss table of docs/quality.md from tools/miss_quality_sweep.sh's misses.csv: one
markdown row per run, then Pearson's r of the substituted mass m and of the substituted share
of calls against the perplexity change, over the rows of each budget and of both.

  python3 tools/miss_table.py build/misses/misses.csv
"""
import csv
import math
import sys

NAMES = {"fetch-every-miss": "fetch-every-miss", "rule-0.15": "0.15 rule",
         "first-choice": "first-choice", "weight-blind": "weight-blind (control)",
         "quality-first": "**quality-first**", "speed-first": "**speed-first**"}


def Pearson(xs, ys):
    n = len(xs)
    if n < 3:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def Main(path):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows or rows[0]["preset"] != "all-resident":
        raise SystemExit(f"{path}: expected the all-resident row first")
    print("| residency | policy | eviction | perplexity | vs all-resident | substituted mass m "
          "| substituted / selected | fetches / token | admissions / token | pw-sim µs / token |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    base = rows[0]
    sim_base = f"{float(rows[1]['sim_us_all_resident']):.1f}" if len(rows) > 1 else ""
    print(f"| 100 % | all resident | — | {float(base['ppl']):.4f} | — | 0 | 0 | 0 | 0 | {sim_base} |")
    runs = rows[1:]
    for r in runs:
        print(f"| {float(r['residency']) * 100:.0f} % | {NAMES.get(r['preset'], r['preset'])} | "
              f"{r['eviction']} | {float(r['ppl']):.4f} | {float(r['ppl_change_pct']):+.2f} % | "
              f"{float(r['mass_mean']):.4f} | {float(r['substitution_rate']) * 100:.1f} % | "
              f"{float(r['fetches_per_token']):.3f} | {float(r['admissions_per_token']):.3f} | "
              f"{float(r['sim_us_per_token']):.1f} |")
    print()
    print("| rows | r(m, Δppl) | r(substituted / selected, Δppl) |")
    print("|---|---:|---:|")
    groups = []
    for res in sorted({r["residency"] for r in runs}):
        at = [r for r in runs if r["residency"] == res]
        groups.append((f"{float(res) * 100:.0f} %, all {len(at)}", at))
        subst = [r for r in at if float(r["substitution_rate"]) > 0]
        groups.append((f"{float(res) * 100:.0f} %, the {len(subst)} that substitute", subst))
    groups.append((f"every budget, all {len(runs)}", runs))
    for label, at in groups:
        d = [float(r["ppl_change_pct"]) for r in at]
        m = [float(r["mass_mean"]) for r in at]
        s = [float(r["substitution_rate"]) for r in at]
        print(f"| {label} | {Pearson(m, d):.3f} | {Pearson(s, d):.3f} |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.exit(Main(sys.argv[1]))
