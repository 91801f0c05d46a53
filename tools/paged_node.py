"""What the paged-serving benchmarks share: talking to a running node (pw-cluster up) that the
command line describes (add_node_args).

pw-ctl against the broker (its key file from the run_dir), waiting until a plan epoch is
committed, the decode worker's /metrics as a dict, one greedy completion. Standard library only
(tools/pylib).
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib"))
from completions import post_completion  # noqa: E402
from prom_samples import scrape  # noqa: E402
from pw_ctl import PwCtl  # noqa: E402


def add_node_args(p):
    p.add_argument("--pw-ctl", default="build/bin/pw-ctl")
    p.add_argument("--broker", default="tcp://127.0.0.1:5556")
    p.add_argument("--control-keys", default="build/run/control.keys",
                   help="the node's key file (pw-cluster writes it into its run_dir)")
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--decode-metrics", type=int, default=9102)
    p.add_argument("--model", default="tiny-moe")


def ctl(a):
    """pw-ctl against the node's broker."""
    return PwCtl(a.pw_ctl, a.broker, a.control_keys)


def change(a, *args):
    """A pw-ctl command that changes widths (set-bits, apply); returns its plan epoch."""
    return ctl(a).change(*args)


def wait_committed(a, epoch, timeout=600):
    """Seconds until every decode worker committed `epoch`; exits on timeout."""
    return ctl(a).wait_committed(epoch, timeout)


def metrics(a):
    """The decode worker's samples: {'name{labels}': value}."""
    return scrape(a.decode_metrics)


def complete(a, prompt, max_tokens, timeout=600):
    """One greedy completion (ignore_eos) of token ids; returns its completion token count."""
    status, _, reply = post_completion(a.http_port, {
        "model": a.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
        "ignore_eos": True}, timeout)
    if status != 200:
        raise RuntimeError(f"completion: HTTP {status}: {reply}")
    return reply["usage"]["completion_tokens"]
