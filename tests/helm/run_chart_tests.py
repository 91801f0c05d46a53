#!/usr/bin/env python3
"""Runs tests/helm/test_chart.py with pytest in the chart tests' venv (BUILD/helm-venv), making
the venv from tests/helm/requirements.txt first when it is missing or out of date. PyPI must be
reachable for that: without it the test fails and says so (the chart is not tested)."""
import argparse
import hashlib
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_venv(venv):
    req = os.path.join(HERE, "requirements.txt")
    digest = hashlib.sha256(open(req, "rb").read()).hexdigest()
    stamp = os.path.join(venv, "requirements.sha256")
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and os.path.exists(stamp) and open(stamp).read() == digest:
        return py
    t0 = time.time()
    print(f"making {venv} from {req} (PyPI)", flush=True)
    if subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", venv]).returncode != 0:
        sys.exit(f"cannot make the venv {venv} (python3-venv installed?)")
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", req],
                       timeout=1200)
    if r.returncode != 0:
        sys.exit(f"pip could not install {req} into {venv}: is PyPI reachable? The chart tests need it.")
    with open(stamp, "w") as f:
        f.write(digest)
    print(f"venv ready in {time.time() - t0:.0f} s", flush=True)
    return py


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="the CMake build directory (binaries, venv)")
    ap.add_argument("pytest_args", nargs="*")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    py = ensure_venv(os.path.join(build, "helm-venv"))
    env = dict(os.environ, PW_BUILD=build)
    cmd = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", os.path.join(HERE, "test_chart.py")] + a.pytest_args
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
