#!/usr/bin/env python3
"""Two or more pw-bench-kernels builds compared case by case, back to back.

  python3 tools/pair_bench.py --rounds 8 --cases 'apq8gemv/2048x1024/b8/t1,bf16gemv/2048x1024/t1' \
      BEFORE/pw-bench-kernels AFTER/pw-bench-kernels

On a host whose memory rate moves by tens of percent from one minute to the next, a full run of
one build and then of the other compares two moments, not two builds. Here each case is run
alone by every build in turn (the order reversed every other round), so each pair of times is
seconds apart; the table gives each build's median time and the median, min and max of its
per-round ratio to the first build's (below 1: faster). A case name is matched exactly; the
time is CPU time, or real time for the /threadsN cases (as tools/kernel_table.py reads them).
"""
import argparse
import re
import statistics
import subprocess
import sys


def run_case(binary, case, min_time):
    out = subprocess.run(
        [binary, f"--benchmark_filter=^{re.escape(case)}$", f"--benchmark_min_time={min_time}",
         "--benchmark_format=csv"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith('"'):
            fields = line.split(",")
            # name, iterations, real_time, cpu_time, time_unit, ...
            return float(fields[2] if "/threads" in case else fields[3])
    sys.exit(f"pair_bench: {binary} has no case {case!r} (see --benchmark_list_tests)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", required=True, help="comma-separated exact case names")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--min-time", default="0.15", help="--benchmark_min_time of each run (s)")
    ap.add_argument("binaries", nargs="+", help="pw-bench-kernels builds; the first is the base")
    args = ap.parse_args()
    if len(args.binaries) < 2:
        ap.error("give at least two builds")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    names = [f"build {i}" for i in range(len(args.binaries))]
    head = "| case | " + " | ".join(f"{n} median" for n in names)
    head += " | " + " | ".join(f"{n} / build 0: median [min-max]" for n in names[1:]) + " |"
    print(" ".join(f"build {i} = {b}" for i, b in enumerate(args.binaries)) + "\n")
    print(head)
    print("|---" * (1 + len(names) + len(names) - 1) + "|")
    for case in [c for c in args.cases.split(",") if c]:
        times = [[] for _ in args.binaries]
        for r in range(args.rounds):
            order = list(range(len(args.binaries)))
            if r % 2:
                order.reverse()
            for i in order:
                times[i].append(run_case(args.binaries[i], case, args.min_time))
        row = f"| {case} | " + " | ".join(f"{statistics.median(t):.1f}" for t in times)
        for t in times[1:]:
            ratios = [a / b for a, b in zip(t, times[0])]
            row += f" | {statistics.median(ratios):.3f} [{min(ratios):.2f}-{max(ratios):.2f}]"
        print(row + " |", flush=True)


if __name__ == "__main__":
    main()
