#!/usr/bin/env python3
"""e2e: the official `openai` client streams a chat completion from a local cluster.

Usage: run_openai_e2e.py BUILD_DIR MODEL_DIR
The `openai` package is not a build dependency: this test keeps its own venv in
BUILD_DIR/e2e-venv with only `openai` from PyPI, created on first use. When that venv cannot be
made (no network), the test reports itself skipped (exit 77), so `make test` on a machine
without PyPI still passes.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, LocalCluster, model_present  # noqa: E402



def ensure_venv(build_dir):
    venv = os.path.join(build_dir, "e2e-venv")
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", "import openai"]).returncode == 0:
        return py
    print("creating", venv, "with the openai client from PyPI")
    if subprocess.run(["/usr/bin/python3", "-m", "venv", venv]).returncode != 0:
        return None
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "openai"], timeout=600)
    if r.returncode != 0:
        return None
    return py


def main():
    build_dir, model_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not model_present(model_dir):
        return SKIP
    py = ensure_venv(build_dir)
    if py is None:
        print("SKIPPED: cannot install the openai client (PyPI unreachable?)")
        return SKIP
    log_dir = os.path.join(build_dir, "e2e-logs", "openai")
    with LocalCluster(build_dir, model_dir, log_dir) as c:
        client = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_client_test.py")
        r = subprocess.run([py, client, "--url", c.url, "--model", c.model_name], timeout=600)
        if r.returncode != 0:
            c.dump_logs()
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
