#!/usr/bin/env python3
"""One lowering decision of the planner's rule, offline: every block of the store at 8 bits,
then the least-damage-per-page step (policies/planner/planner.cc's greedy, re-stated here so
that its step weight can be varied) until the experts fit a pool-page budget; each map scored
by `pw-eval ppl` on the held-out text beside `pw-quantize plan`'s damage-ranked map at the same
bits. It separates the quality of one map from the time mix of a served run.

Step weights (r_i: the block's calibration share, apw::CalibrationShares):
  unweighted   1 (the planner without routing statistics before it read the calibration share)
  calib-share  r_i clamped to [0.05, 8] (the planner without live mass now)
  hot-floor-B  the same, and blocks with r_i >= 2 never below B bits (the hot floor, as live
               mass that agrees with the calibration would set it)

  python3 tools/planner_map_sweep.py --budgets 2000,2304,3072 --out build/map-sweep
"""
import argparse
import heapq
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_planner as bp  # noqa: E402  (read_store, block_pages, map_bits, map_pages, ppl)


def shares(st):
    tokens = {}
    for (l, e, p), (c, _) in st["blocks"].items():
        tokens[(l, p)] = tokens.get((l, p), 0) + c
    E = st["experts"]
    return {k: (c + 1) / (tokens[(k[0], k[2])] + E) * E for k, (c, _) in st["blocks"].items()}


def lower_to(st, budget, weight, floor):
    w = {k: 8 for k in st["blocks"]}
    pages = sum(bp.block_pages(k[2], 8) for k in w)

    def step(k):
        for to in range(w[k] - 1, floor(k) - 1, -1):
            freed = bp.block_pages(k[2], w[k]) - bp.block_pages(k[2], to)
            if freed > 0:
                d = max(0.0, st["blocks"][k][1][to] - st["blocks"][k][1][w[k]]) * weight(k)
                return (d / freed, k, to, freed)
        return None

    heap = [s for s in map(step, w) if s]
    heapq.heapify(heap)
    while pages > budget and heap:
        _, k, to, freed = heapq.heappop(heap)
        w[k], pages = to, pages - freed
        s = step(k)
        if s:
            heapq.heappush(heap, s)
    return w


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--store", default="build/tiny-moe.apw")
    p.add_argument("--model", default="models/tiny-moe")
    p.add_argument("--heldout", default="build/eval/heldout.txt")
    p.add_argument("--budgets", default="2000,2304,3072", help="pool pages (4 KiB) for the experts")
    p.add_argument("--hot-floors", default="6")
    p.add_argument("--out", default="build/map-sweep")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    st = bp.read_store(a.store)
    r = shares(st)
    clamp = lambda k: min(8.0, max(0.05, r[k]))  # noqa: E731
    rules = [("unweighted", lambda k: 1.0, lambda k: 3), ("calib-share", clamp, lambda k: 3)]
    for f in map(int, a.hot_floors.split(",")):
        rules.append((f"hot-floor-{f}", clamp, lambda k, f=f: f if r[k] >= 2 else 3))
    cache_path = os.path.join(a.out, "ppl-cache.json")
    cache = json.load(open(cache_path)) if os.path.exists(cache_path) else {}

    def score(path):
        if path not in cache:
            cache[path] = bp.ppl(a, ["--bits-map", path])
            json.dump(cache, open(cache_path, "w"))
        return cache[path]

    print("| pool pages | map | bits per expert weight | pages | perplexity |\n|---:|---|---:|---:|---:|")
    for budget in map(int, a.budgets.split(",")):
        for name, weight, floor in rules:
            w = lower_to(st, budget, weight, floor)
            path = os.path.join(a.out, f"{name}-{budget}.json")
            with open(path, "w") as f:
                json.dump({"default_bits": 8, "blocks": [{"layer": l, "expert": e, "proj": pr, "bits": b}
                                                         for (l, e, pr), b in sorted(w.items())]}, f)
            print(f"| {budget} | {name} | {bp.map_bits(path):.3f} | {bp.map_pages(path)} | {score(path):.4f} |",
                  flush=True)
            if name == "calib-share":
                ranked = os.path.join(a.out, f"ranked-{budget}.json")
                subprocess.run([os.path.join(a.build, "bin", "pw-quantize"), "plan", "--store", a.store, "--avg-bits",
                                f"{bp.map_bits(path):.4f}", "--out", ranked], check=True, capture_output=True)
                print(f"| {budget} | damage-ranked at those bits | {bp.map_bits(ranked):.3f} | {bp.map_pages(ranked)} | "
                      f"{score(ranked):.4f} |", flush=True)


if __name__ == "__main__":
    main()
