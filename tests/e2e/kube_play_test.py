#!/usr/bin/env python3
"""The Helm chart run for real on this machine: renders helm/pagedweight for the image `make
image` built, plays it with `podman kube play` (each pod in its own network namespace), waits
until the router is alive and then ready (a prefill and a decode worker registered), sends a
completion and a chat completion through the router pod, and tears everything down.

    kube_play_test.py BUILD        (make test-kube; exits 77, skipped, where podman is absent)

The values are what podman 4.3 can run: no native sidecar (an init container that never exits
would block the pod), the control plane without keys and no API keys (its kube play mounts a
Secret's data undecoded and ignores stringData), the model inside the image."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "helm"))
from run_chart_tests import ensure_venv  # noqa: E402

RELEASE = "pwe2e"
DEADLINE_S = 240


def podman(*args, check=True, env=None):
    r = subprocess.run(["podman", *args], capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def http(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return None, str(e)


def worker_logs(env):
    """The last lines of every worker container's log, by name."""
    names = podman("ps", "-a", "--format", "{{.Names}}", env=env).split()
    out = {}
    for n in names:
        if n.startswith(RELEASE) and (n.endswith("-prefill") or n.endswith("-decode") or n.endswith("-broker")):
            r = subprocess.run(["podman", "logs", "--tail", "3", n], capture_output=True, text=True, env=env)
            out[n] = (r.stdout + r.stderr).strip().splitlines()[-3:]
    return out


def fatal_worker_error(env):
    """A worker's last log line when it is the error a worker exits with at start ("pw-decode:
    ..."): it would fail the same way at every restart."""
    for name, lines in worker_logs(env).items():
        if lines and re.match(r"^pw-(prefill|decode): ", lines[-1]):
            return f"{name}: {lines[-1]}"
    return None


def remove_leftovers(manifests, env):
    """`kube down` of podman 4.3 leaves the volumes it made for ConfigMaps; a later play would
    reuse one, node file and all."""
    podman("kube", "down", manifests, check=False, env=env)
    for v in podman("volume", "ls", "--format", "{{.Name}}", env=env).split():
        if v.startswith(RELEASE + "-"):
            podman("volume", "rm", "-f", v, check=False, env=env)


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
    if shutil.which("podman") is None:
        print("SKIP: podman is not installed (tools/install_deps.sh image installs it)")
        return 77
    ref = os.path.join(build, "image.ref")
    if not os.path.exists(ref):
        print(f"FAIL: no image: {ref} is missing; `make image` builds it (make test-kube does)")
        return 1
    image = open(ref).read().strip()
    env = dict(os.environ, CONTAINERS_CONF=os.path.join(build, "containers.conf"))
    py = ensure_venv(os.path.join(build, "helm-venv"))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        values = os.path.join(tmp, "values.yaml")
        repo, tag = image.rsplit(":", 1)
        with open(values, "w") as f:
            json.dump({"image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
                       "controlPlane": {"insecure": True}, "apiKeys": {"enabled": False},
                       "broker": {"nativeSidecar": False}, "router": {"preStopSleepSeconds": 0}}, f)
        manifests = os.path.join(tmp, "pagedweight.yaml")
        with open(manifests, "w") as f:
            subprocess.run([py, os.path.join(ROOT, "tests", "helm", "render_chart.py"), RELEASE, "default", values],
                           stdout=f, check=True)
        remove_leftovers(manifests, env)  # a previous run's
        try:
            print(podman("kube", "play", manifests, env=env).strip().splitlines()[0], flush=True)
            pod = f"{RELEASE}-pagedweight-router-pod-0"
            infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}", env=env).strip()
            ip = podman("inspect", infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                        env=env).strip()
            base = f"http://{ip}:8000"
            print(f"router pod {pod} at {base}", flush=True)
            deadline = time.time() + DEADLINE_S
            while http("GET", base + "/metrics", timeout=5)[0] != 200:
                if time.time() > deadline:
                    print("FAIL: the router never answered /metrics")
                    return 1
                time.sleep(1)
            print(f"router alive after {time.time() - t0:.0f} s: {http('GET', base + '/health')}", flush=True)
            while True:
                status, body = http("GET", base + "/health", timeout=5)
                if status == 200:
                    break
                fatal = fatal_worker_error(env)
                if fatal:
                    print(f"FAIL: a worker cannot start: {fatal}")
                    return 1
                if time.time() > deadline:
                    print(f"FAIL: the router is not ready after {DEADLINE_S} s: /health {status} {body}")
                    for name, lines in worker_logs(env).items():
                        print(f"  {name}: " + " | ".join(lines))
                    return 1
                time.sleep(2)
            print(f"router ready after {time.time() - t0:.0f} s: {body}", flush=True)
            status, body = http("POST", base + "/v1/completions",
                                {"model": "tiny-moe", "prompt": "The Lord said unto Moses", "max_tokens": 16})
            assert status == 200, (status, body)
            text = json.loads(body)["choices"][0]["text"]
            status, body = http("POST", base + "/v1/chat/completions",
                                {"model": "tiny-moe", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
            assert status == 200, (status, body)
            chat = json.loads(body)["choices"][0]["message"]["content"]
            print(f"completion {text!r}; chat {chat!r}")
        finally:
            remove_leftovers(manifests, env)
            print(f"torn down; {time.time() - t0:.0f} s in all", flush=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
