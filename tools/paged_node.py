"""What the paged-serving benchmarks share: talking to a running node (pw-cluster up).

pw-ctl against the broker (its key file from the run_dir), waiting until a plan epoch is
committed, the decode worker's /metrics as a dict, one greedy completion. Standard library only.
"""
import json
import re
import subprocess
import sys
import time
import urllib.request


def add_node_args(p):
    p.add_argument("--pw-ctl", default="build/bin/pw-ctl")
    p.add_argument("--broker", default="tcp://127.0.0.1:5556")
    p.add_argument("--control-keys", default="build/run/control.keys",
                   help="the node's key file (pw-cluster writes it into its run_dir)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--decode-metrics", type=int, default=9102)
    p.add_argument("--model", default="tiny-moe")


def ctl(a, *args):
    out = subprocess.run([a.pw_ctl, "--broker", a.broker, "--control-keys", a.control_keys] + list(args),
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"pw-ctl {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def change(a, *args):
    """A pw-ctl command that changes widths (set-bits, apply); returns its plan epoch."""
    return int(re.search(r"plan epoch (\d+)", ctl(a, *args)).group(1))


def wait_committed(a, epoch, timeout=600):
    """Seconds until every decode worker committed `epoch`; exits on timeout."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        m = re.search(r"committed epoch (\d+), 0 change", ctl(a, "show"))
        if m and int(m.group(1)) >= epoch:
            return time.time() - t0
        time.sleep(0.05)
    sys.exit(f"epoch {epoch} not committed in {timeout} s")


def metrics(a):
    """The decode worker's samples: {'name{labels}': value}."""
    return scrape(a.decode_metrics)


def scrape(port):
    """The samples of the /metrics on 127.0.0.1:`port`: {'name{labels}': value}."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        k, v = line.rsplit(" ", 1)
        out[k] = float(v)
    return out


def pick(m, prefix, label=""):
    """Sum of the samples whose name (with labels) starts with `prefix` and contains `label`."""
    return sum(v for k, v in m.items() if k.startswith(prefix) and label in k)


def complete(a, prompt, max_tokens, timeout=600):
    """One greedy completion (ignore_eos) of token ids; returns its completion token count."""
    body = json.dumps({"model": a.model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{a.http_port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())["usage"]["completion_tokens"]
