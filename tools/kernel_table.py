#!/usr/bin/env python3
"""Markdown tables from a pw-bench-kernels JSON file (--benchmark_format=json --benchmark_out=F).

  python3 tools/kernel_table.py kernels.json

Per shape, thread count and token count: the bf16 GEMV time, then per width the fast path
(apq8gemv) and the exact path (apgemv): time, GB/s of bytes read, speed-up over bf16; and for
1 token the fast path's rate as a fraction of a read of the same bytes (memread) with the same
threads, in the same run.
"""
import json
import re
import sys


def main(path):
    data = json.load(open(path))
    cases = {}
    for b in data["benchmarks"]:
        if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
            continue
        name = re.sub(r"/real_time$", "", b["run_name"] if "run_name" in b else b["name"])
        name = re.sub(r"_median$", "", name)
        t = b["real_time"] if "/threads" in name else b["cpu_time"]
        cases[name] = (t, b.get("bytes_per_second", 0.0) / 1e9)
    shapes = sorted({m.group(1) for n in cases for m in [re.match(r"apq8gemv/(\d+x\d+)/", n)] if m},
                    key=lambda s: [int(v) for v in s.split("x")])
    threads = sorted({m.group(1) or "" for n in cases for m in [re.match(r".*?(/threads\d+)?$", n)]})
    print(f"CPU context: {data['context'].get('num_cpus')} CPUs at "
          f"{data['context'].get('mhz_per_cpu')} MHz (as Google Benchmark reports)\n")
    hdr = "| shape | threads | tokens | bf16 us | " + " | ".join(
        f"b{b} fast us (GB/s, x bf16) | b{b} exact us" for b in range(3, 9)) + " |"
    print(hdr)
    print("|---|---:|---:|---:|" + "---:|---:|" * 6)
    fractions = []
    for th in threads:
        for shape in shapes:
            for tok in (1, 4, 16):
                bf = cases.get(f"bf16gemv/{shape}/t{tok}{th}")
                if not bf:
                    continue
                row = [shape, th[8:] or "1", str(tok), f"{bf[0]:.0f}"]
                for bits in range(3, 9):
                    q = cases.get(f"apq8gemv/{shape}/b{bits}/t{tok}{th}")
                    e = cases.get(f"apgemv/{shape}/b{bits}/t{tok}{th}")
                    row.append(f"{q[0]:.0f} ({q[1]:.1f}, {bf[0] / q[0]:.2f}x)" if q else "—")
                    row.append(f"{e[0]:.0f}" if e else "—")
                    if q and tok == 1:
                        # bytes of this case = GB/s * time
                        nbytes = round(q[1] * 1e9 * q[0] * 1e-6)
                        best = None
                        for n, v in cases.items():
                            m = re.match(r"memread/(\d+)" + re.escape(th) + "$", n)
                            if m and (best is None or abs(int(m.group(1)) - nbytes) < abs(best[0] - nbytes)):
                                best = (int(m.group(1)), v)
                        if best:
                            fractions.append((shape, th[8:] or "1", bits, q[1], best[1][1], q[1] / best[1][1],
                                              bf[0] / q[0], 0.7 * 16 / bits))
                print("| " + " | ".join(row) + " |")
    print("\nOne token, fast path against a read of the same bytes (memread, same threads, same run)"
          " and against the 0.7 x 16/b target:\n")
    print("| shape | threads | bits | fast GB/s | memread GB/s | fraction | x bf16 | target x bf16 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for f in fractions:
        print(f"| {f[0]} | {f[1]} | {f[2]} | {f[3]:.1f} | {f[4]:.1f} | {100 * f[5]:.0f} % | {f[6]:.2f}x | {f[7]:.2f}x |")


if __name__ == "__main__":
    main(sys.argv[1])
