#!/usr/bin/env python3
"""The Helm chart run for real on this machine: renders helm/pagedweight for the image `make
image` built, plays it with `podman kube play` (each pod in its own network namespace), waits
until the router is alive and then ready (a prefill and a decode worker registered), sends a
completion and a chat completion through the router pod, checks the prefill pod put KV into a
decode pod (another network namespace), SIGKILLs a decode pod's worker while 6 requests run and
checks every one completes, and tears everything down. The router is played first, then the
workers with the overrides podman_workers describes.

    kube_play_test.py BUILD        (make test-kube; exits 77, skipped, where podman is absent)

The values are what podman 4.3 can run: no native sidecar (an init container that never exits
would block the pod), the control plane without keys and no API keys (its kube play mounts a
Secret's data undecoded and ignores stringData), the model inside the image."""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "helm"))
from run_chart_tests import ensure_venv  # noqa: E402

RELEASE = "pwe2e"
DEADLINE_S = int(os.environ.get("PW_KUBE_DEADLINE_S", "240"))
MAX_TOKENS = 1500  # the requests outlast the kill


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


# What podman 4.3 lacks and the chart's workers rely on, given by this test alone: the
# downward API's $(POD_NAME), $(POD_IP), $(NODE_NAME) in args are not expanded (the id is fixed,
# the pod IP read from the pod's /etc/hosts at start, the node named "podman"), and there are no
# Services (the router control Service's name maps to the router pod's IP: hostAliases).
POD_IP_SCRIPT = ('ip=$(getent hosts "$(cat /etc/hostname)"); ip=${ip%% *}; a=(); '
                 'for x in "$@"; do a+=("${x//__POD_IP__/$ip}"); done; exec "$0" "${a[@]}"')


def podman_workers(docs, router_ip):
    """The prefill and decode Deployments with the overrides above, and a second decode pod
    (podman 4.3 plays one pod per Deployment, whatever its replicas, and does not restart a
    killed container: the requests of a killed decode worker go to the other)."""
    docs = list(docs) + [copy.deepcopy(d) for d in docs if d["metadata"]["name"].endswith("-decode")]
    out = []
    seen = {}
    for d in docs:
        role = d["metadata"]["name"].rsplit("-", 1)[1]
        index = seen[role] = seen.get(role, -1) + 1
        if index:
            d["metadata"]["name"] += f"-{index}"
            # podman publishes containerPorts on the host: the copy's would collide.
            for c in d["spec"]["template"]["spec"]["containers"]:
                for k in ("ports", "startupProbe", "readinessProbe", "livenessProbe"):
                    c.pop(k, None)
        spec = d["spec"]["template"]["spec"]
        main = next(c for c in spec["containers"] if c["name"] == role)
        router = main["args"][main["args"].index("--router") + 1]
        host = router.split("://", 1)[1].rsplit(":", 1)[0]
        spec["hostAliases"] = [{"ip": router_ip, "hostnames": [host]}]
        subst = {"$(POD_NAME)": f"{role}-{index}", "$(POD_IP)": "__POD_IP__", "$(NODE_NAME)": "podman"}
        main["args"] = [subst.get(a, a) for a in main["args"]]
        # 4.3 refuses the fieldRefs status.podIP and spec.nodeName.
        main["env"] = [e for e in main.get("env", []) if e["name"] not in ("POD_IP", "NODE_NAME")]
        main["command"] = ["bash", "-c", POD_IP_SCRIPT] + main["command"]
        out.append(d)
    return out


def pod_ip(pod, env):
    infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}", env=env).strip()
    return podman("inspect", infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                  env=env).strip()


def remove_leftovers(manifests, env):
    """`kube down` of podman 4.3 leaves the volumes it made for ConfigMaps; a later play would
    reuse one, node file and all."""
    podman("kube", "down", manifests, check=False, env=env)
    # kube down stops at a pod it does not find (the workers are played apart): the release's
    # pods by name.
    for pod in podman("pod", "ls", "--format", "{{.Name}}", env=env).split():
        if pod.startswith(RELEASE + "-"):
            podman("pod", "rm", "-f", pod, check=False, env=env)
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
        # The router first, then the workers (podman_workers).
        with open(manifests) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        is_worker = [d["kind"] == "Deployment" and d["metadata"]["name"].endswith(("-prefill", "-decode"))
                     for d in docs]
        router_manifests = os.path.join(tmp, "router.yaml")
        with open(router_manifests, "w") as f:
            yaml.safe_dump_all([d for d, w in zip(docs, is_worker) if not w], f)
        workers_manifests = os.path.join(tmp, "workers.yaml")
        remove_leftovers(manifests, env)  # a previous run's
        try:
            print(podman("kube", "play", router_manifests, env=env).strip().splitlines()[0], flush=True)
            pod = f"{RELEASE}-pagedweight-router-pod-0"
            infra = podman("pod", "inspect", pod, "--format", "{{.InfraContainerID}}", env=env).strip()
            ip = podman("inspect", infra, "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                        env=env).strip()
            base = f"http://{ip}:8000"
            print(f"router pod {pod} at {base}", flush=True)
            with open(workers_manifests, "w") as f:
                yaml.safe_dump_all(podman_workers([d for d, w in zip(docs, is_worker) if w], ip), f)
            # The ConfigMaps the router's play made, named for the workers' volumes.
            configmaps = os.path.join(tmp, "configmaps.yaml")
            with open(configmaps, "w") as f:
                yaml.safe_dump_all([d for d in docs if d["kind"] == "ConfigMap"], f)
            print(podman("kube", "play", "--configmap", configmaps, workers_manifests,
                         env=env).strip().splitlines()[0], flush=True)
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

            # The KV of those requests went from the prefill pod to the decode pod: two network
            # namespaces, so over the network (UCX's TCP transport; no shared memory between pods).
            prefill_ip = pod_ip(f"{RELEASE}-pagedweight-prefill-pod-0", env)
            status, metrics = http("GET", f"http://{prefill_ip}:9101/metrics", timeout=5)
            put = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                      if line.startswith("pagedweight_ucx_bytes_total{") and 'op="put"' in line)
            assert status == 200 and put > 0, (status, put)
            # The transports UCX chose for those puts (the prefill worker reads them from its
            # endpoint: services/transport/ucx.h, Endpoint::Transports): tcp, and nothing else.
            by_transport = {}
            for line in metrics.splitlines():
                if line.startswith("pagedweight_kv_transfer_bytes_total{"):
                    key, value = line.rsplit(" ", 1)
                    by_transport[re.search(r'transport="([^"]*)"', key).group(1)] = float(value)
            assert set(by_transport) == {"tcp"} and by_transport["tcp"] == put, (by_transport, put)
            print(f"KV put from the prefill pod ({prefill_ip}) to the decode pod: {put:.0f} bytes, "
                  f"over UCX transport {sorted(by_transport)}")

            # A decode pod's worker SIGKILLed while requests run: the router places them again on
            # the other decode pod; none is lost.
            deadline = time.time() + DEADLINE_S
            while json.loads(http("GET", base + "/health", timeout=5)[1] or "{}").get("decode_workers") != 2:
                assert time.time() < deadline, "the second decode worker did not register"
                time.sleep(0.5)
            # The two decode pods (the chart's and its copy, podman_workers): the router may place
            # the whole burst on either, so the one killed is the one running a request.
            decode_pods = {f"{RELEASE}-pagedweight-decode-pod-0": None, f"{RELEASE}-pagedweight-decode-1-pod-0": None}
            for pod in decode_pods:
                decode_pods[pod] = pod_ip(pod, env)
            results = {}

            def one(i):
                # A request that fails below HTTP (reset, refused, timed out) is a result too, so
                # that it is reported rather than leaving the count of running requests short.
                try:
                    results[i] = http("POST", base + "/v1/completions",
                                      {"model": "tiny-moe", "prompt": f"Request {i}: In the beginning",
                                       "max_tokens": MAX_TOKENS, "ignore_eos": True}, timeout=DEADLINE_S)
                except Exception as e:  # noqa: BLE001 (any failure is the test's finding)
                    results[i] = (-1, f"{type(e).__name__}: {e}")
            threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            # Under way on the pod to be killed: its worker runs at least one of them (its own
            # gauge), so the kill takes requests mid-stream (the others are placed after it).

            def running_on(ip):
                status, m = http("GET", f"http://{ip}:9102/metrics", timeout=5)
                return sum(float(line.rsplit(" ", 1)[1]) for line in m.splitlines()
                           if line.startswith("pagedweight_worker_num_requests_running")) if status == 200 else 0

            victim, on_victim = None, 0
            while victim is None:
                failed = {i: r for i, r in results.items() if r[0] != 200}
                assert not failed, f"requests failed before the kill: {failed}"
                assert any(t.is_alive() for t in threads), "all 6 requests ended before one ran on a decode pod"
                for pod, ip in decode_pods.items():
                    if (n := running_on(ip)) >= 1:
                        victim, on_victim = pod, n
                        break
                else:
                    time.sleep(0.02)
            decode = f"{victim}-decode"
            podman("kill", "--signal", "KILL", decode, env=env)
            # (the router re-places them on the other decode pod)
            print(f"SIGKILL to {decode} running {on_victim:.0f} of the {sum(t.is_alive() for t in threads)} requests not done",
                  flush=True)
            for t in threads:
                t.join()
            if any(r[0] != 200 for r in results.values()):
                print(podman("ps", "-a", "--format", "{{.Names}} {{.Status}}", env=env))
                for name, lines in worker_logs(env).items():
                    print(f"  {name}: " + " | ".join(lines))
                print(http("GET", base + "/health", timeout=5))
            for i, (status, body) in sorted(results.items()):
                assert status == 200, (i, status, body)
                assert json.loads(body)["usage"]["completion_tokens"] == MAX_TOKENS, (i, body)
            assert sum(t.is_alive() for t in threads) == 0
            print(f"all 6 requests completed with {MAX_TOKENS} tokens")
        finally:
            remove_leftovers(manifests, env)
            print(f"torn down; {time.time() - t0:.0f} s in all", flush=True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
