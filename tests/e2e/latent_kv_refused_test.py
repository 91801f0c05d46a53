#!/usr/bin/env python3
"""The cluster's workers refuse an MLA model at start, with real processes: pw-prefill and
pw-decode on the deepseek_v3 and kimi_k2 fixtures (every KV layer latent, memory/kv_spec.h)
exit 1 before registering, naming the model directory, the layer and the kind, since the KV
transfer does not move latent pages yet (services/common/transferable_kv.h). No router runs:
the refusal comes before the worker looks for one.

Usage: latent_kv_refused_test.py BUILD_DIR SOURCE_DIR
"""
import os
import subprocess
import sys

DEADLINE_S = 120  # generous: model load on a busy 2-core machine


def main():
    build, source = sys.argv[1], sys.argv[2]
    for fixture in ("deepseek_v3", "kimi_k2"):
        model = os.path.join(source, "tests", "fixtures", "models", fixture)
        for worker in ("pw-prefill", "pw-decode"):
            p = subprocess.run(
                [os.path.join(build, "bin", worker), "--model", model, "--insecure",
                 "--router", "tcp://127.0.0.1:9"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=DEADLINE_S)
            out = p.stdout
            assert p.returncode == 1, f"{worker} {fixture}: exit {p.returncode}\n{out}"
            want = (f"{model}: KV layer 0 is latent; the cluster's KV transfer moves "
                    "full-attention and sliding-window pages only, so an MLA (latent KV) model "
                    "is not served by the cluster yet")
            assert want in out, f"{worker} {fixture}: no clear refusal\n{out}"
            print(f"{worker} {fixture}: refused at start")
    print("OK")


if __name__ == "__main__":
    main()
