#!/usr/bin/env python3
"""e2e: the official `openai` client against a local cluster (openai_client_test.py), with API keys.

Usage: run_openai_e2e.py BUILD_DIR MODEL_DIR
The `openai` package is not a build dependency: this test keeps its own venv in
BUILD_DIR/e2e-venv with only `openai` from PyPI, created on first use. When that venv cannot be
made (no network), the test reports itself skipped (exit 77), so `make test` on a machine
without PyPI still passes.
"""
import json
import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "pylib")]
from cluster import SKIP, LocalCluster, model_present  # noqa: E402
from pypi_venv import ensure_venv  # noqa: E402


def shared_prefill(c, key):
    """n = 4 computes the prompt once: the prefill worker's prompt-token counter grows by the
    prompt's length, not four times it."""
    def counter():
        return sum(v for k, v in c.worker_metrics("prefill-0").items()
                   if k.startswith("pagedweight_worker_prompt_tokens_total"))
    before = counter()
    body = json.dumps({"model": c.model_name, "prompt": "The candidates share one prefill",
                       "max_tokens": 4, "temperature": 1.0, "seed": 3, "n": 4}).encode()
    req = urllib.request.Request(c.url + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=120) as resp:
        out = json.loads(resp.read())
    grown = counter() - before
    ok = len(out["choices"]) == 4 and grown == out["usage"]["prompt_tokens"]
    print(("ok   " if ok else "FAIL ") + f"n=4 prefills the prompt once: prompt-token counter "
          f"+{grown:g} for a prompt of {out['usage']['prompt_tokens']} tokens")
    return ok


def main():
    build_dir, model_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not model_present(model_dir):
        return SKIP
    py = ensure_venv(os.path.join(build_dir, "e2e-venv"), "openai", "openai", timeout=600)
    if py is None:
        print("SKIPPED: cannot install the openai client (PyPI unreachable?)")
        return SKIP
    log_dir = os.path.join(build_dir, "e2e-logs", "openai")
    # The router takes its key from the environment here (PW_API_KEY, two keys); the client
    # sends the second.
    key = "pw-e2e-" + os.urandom(8).hex()
    os.environ["PW_API_KEY"] = "pw-other-key," + key
    try:
        cluster = LocalCluster(build_dir, model_dir, log_dir)
        with cluster as c:
            client = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  "openai_client_test.py")
            r = subprocess.run([py, client, "--url", c.url, "--model", c.model_name,
                                "--api-key", key], timeout=600)
            if r.returncode != 0:
                c.dump_logs()
            elif not shared_prefill(c, key):
                r = subprocess.CompletedProcess([], 1)
            for name in ("router",):
                with open(os.path.join(log_dir, name + ".log")) as f:
                    if key in f.read():
                        print("FAIL the router logged an API key")
                        return 1
            return r.returncode
    finally:
        os.environ.pop("PW_API_KEY", None)


if __name__ == "__main__":
    sys.exit(main())
