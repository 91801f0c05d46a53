#!/usr/bin/env python3
"""Paired comparison of two per-token NLL files written by `pw-eval ppl --nll-out`.

Both runs must score the same text with the same windows. Prints each run's perplexity, the
mean per-token NLL difference (B - A) and its standard error. Tokens inside one window are not
independent, so the standard error comes from per-window sums of the differences (windows are
evaluated from an empty cache and are independent draws of text). |z| < 2 means the two runs
are not distinguishable on this text.

  tools/compare_nll.py A.nll B.nll
"""
import math
import sys


def load(path):
    windows, nll = [], []
    with open(path, encoding="ascii") as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 2:
                sys.exit(f"{path}:{line_no}: expected '<window> <nll>'")
            windows.append(int(parts[0]))
            nll.append(float(parts[1]))
    if not nll:
        sys.exit(f"{path}: no predictions")
    return windows, nll


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    wa, a = load(argv[1])
    wb, b = load(argv[2])
    if wa != wb:
        sys.exit("the two files do not score the same predictions (window lists differ)")
    n = len(a)
    per_window = {}
    for w, x, y in zip(wa, a, b):
        per_window[w] = per_window.get(w, 0.0) + (y - x)
    sums = list(per_window.values())
    k = len(sums)
    mean_w = sum(sums) / k
    var_w = sum((s - mean_w) ** 2 for s in sums) / (k - 1) if k > 1 else float("nan")
    # Mean per-token difference = total / n; its variance from the k window totals.
    diff = sum(sums) / n
    se = math.sqrt(k * var_w) / n if k > 1 else float("nan")
    ppl_a = math.exp(sum(a) / n)
    ppl_b = math.exp(sum(b) / n)
    print(f"predictions {n} windows {k}")
    print(f"ppl A {ppl_a:.6f}  ppl B {ppl_b:.6f}  ratio B/A {ppl_b / ppl_a:.6f}")
    print(f"mean nll B-A {diff:+.3e} nats/token  se {se:.3e}  z {diff / se if se > 0 else float('nan'):+.2f}")


if __name__ == "__main__":
    main(sys.argv)
