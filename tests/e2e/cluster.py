"""Starts a local PagedWeight cluster (pw-router, pw-prefill, pw-decode) on free loopback ports
for end-to-end tests, with the Python standard library only.

    with LocalCluster(build_dir, model_dir) as c:
        c.url            # http://127.0.0.1:<port>
        c.metrics()      # router /metrics as {name{labels}: value}
        c.rss_kib()      # resident memory of every process
Each process logs to <log_dir>/<name>.log; on failure the tails are printed.
"""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from localhost import free_port, rss_kib  # noqa: E402
from prom_samples import parse_metrics, scrape_if_up  # noqa: E402


SKIP = 77  # CTest SKIP_RETURN_CODE of the e2e tests


def model_present(model_dir):
    """True when the model's weights exist; otherwise prints why the test is skipped."""
    if any(f.endswith(".safetensors") for f in os.listdir(model_dir)):
        return True
    print(f"SKIPPED: no *.safetensors in {model_dir} (the model is not trained/committed yet)")
    return False


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def wait_until(what, cond, cluster, deadline_s):
    """cond()'s first true value, polled every 50 ms; past deadline_s, the cluster's logs dumped
    and an AssertionError naming `what`."""
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    cluster.dump_logs()
    raise AssertionError(f"not within {deadline_s} s: {what}")


class LocalCluster:
    def __init__(self, build_dir, model_dir, log_dir, model_name="tiny-moe", kv_blocks=512,
                 decode_workers=1, prefill_workers=1, heartbeat_ms=200, max_batch=128,
                 router_args=(), decode_args=(), kv_dtype=None, store=None, initial_bits=4,
                 common_args=()):
        self.bin = os.path.join(build_dir, "bin")
        self.model_dir = model_dir
        self.model_name = model_name
        self.log_dir = log_dir
        self.kv_blocks = kv_blocks
        self.n_decode = decode_workers
        self.n_prefill = prefill_workers
        self.heartbeat_ms = heartbeat_ms
        self.max_batch = max_batch
        self.router_args = list(router_args)
        self.decode_args = list(decode_args)
        self.common_args = list(common_args)  # given to every process (router, broker, workers)
        self.kv_dtype = kv_dtype  # None: the workers' default (bf16)
        # An .apw store: a broker serves it and the decode workers read their experts from it
        # (pool pages, any-precision widths), the prefill workers every block at initial_bits
        # (a prompt's KV then comes from the experts its decode steps run, so a request moved
        # to another node, whose prefill recomputes what it had streamed, keeps its text);
        # None: every worker reads the checkpoint's bf16.
        self.store = store
        self.initial_bits = initial_bits
        self.broker_port = free_port() if store else None
        self.port = free_port()
        self.worker_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs = {}
        self.metrics_ports = {}
        os.makedirs(log_dir, exist_ok=True)
        # Fresh control-plane keys (ZeroMQ CURVE), as pw-cluster makes for a run.
        self.keys = os.path.join(log_dir, "control.keys")
        if os.path.exists(self.keys):
            os.remove(self.keys)
        subprocess.run([os.path.join(self.bin, "pw-cluster"), "keys", "--out", self.keys],
                       check=True)

    def _start(self, name, argv):
        log = open(os.path.join(self.log_dir, name + ".log"), "w")
        # Batch-invariant dense kernels: a prompt's greedy text is the same bits whatever it
        # was batched with, so runs under load can be compared with a reference run.
        env = dict(os.environ, PW_BATCH_INVARIANT="1")
        self.procs[name] = subprocess.Popen(argv + self.common_args, stdout=log,
                                            stderr=subprocess.STDOUT, env=env)

    def start_router(self, name="router", port=None, worker_port=None):
        """Router `name` on HTTP `port` and control `worker_port` (default: the cluster's)."""
        self._start(name, [os.path.join(self.bin, "pw-router"), "--model", self.model_dir,
                           "--model-name", self.model_name, "--port", str(port or self.port),
                           "--workers", f"tcp://127.0.0.1:{worker_port or self.worker_port}",
                           "--heartbeat-ms", str(self.heartbeat_ms),
                           "--control-keys", self.keys] + self.router_args)

    def start_broker(self, name="broker", port=None):
        """A broker serving the store on `port` (default: the cluster's broker port)."""
        self.metrics_ports[name] = free_port()
        self._start(name, [os.path.join(self.bin, "pw-broker"), "--model", self.model_dir,
                           "--model-name", self.model_name,
                           "--bind", f"tcp://127.0.0.1:{port or self.broker_port}",
                           "--heartbeat-ms", str(self.heartbeat_ms), "--store", self.store,
                           "--initial-bits", str(self.initial_bits),
                           "--metrics", f"127.0.0.1:{self.metrics_ports[name]}",
                           "--control-keys", self.keys])

    def start_worker(self, kind, index, node=None, broker_port=None, router_ports=None):
        """Worker `kind`-`index`; `node`: the node it registers on (default: the hostname),
        `broker_port`: a decode worker's broker (default: the cluster's), `router_ports`: the
        control ports of the routers it registers with (default: the cluster's router)."""
        name = f"{kind}-{index}"
        argv = [os.path.join(self.bin, f"pw-{kind}"), "--model", self.model_dir]
        for port in router_ports or [self.worker_port]:
            argv += ["--router", f"tcp://127.0.0.1:{port}"]
        argv += ["--id", name,
                "--model-name", self.model_name, "--kv-blocks", str(self.kv_blocks),
                "--heartbeat-ms", str(self.heartbeat_ms), "--threads", "1",
                "--control-keys", self.keys]
        self.metrics_ports[name] = free_port()
        argv += ["--metrics", f"127.0.0.1:{self.metrics_ports[name]}"]
        if self.kv_dtype:
            argv += ["--kv-dtype", self.kv_dtype]
        if node:
            argv += ["--node", node]
        if kind == "decode":
            argv += ["--max-batch", str(self.max_batch)] + self.decode_args
            if self.store:
                argv += ["--broker", f"tcp://127.0.0.1:{broker_port or self.broker_port}"]
        elif self.store:
            argv += ["--store", self.store, "--expert-bits", str(self.initial_bits)]
        self._start(name, argv)

    def __enter__(self):
        try:
            if self.store:
                self.start_broker()
            self.start_router()
            for i in range(self.n_prefill):
                self.start_worker("prefill", i)
            for i in range(self.n_decode):
                self.start_worker("decode", i)
            self.wait_healthy()
        except BaseException:
            # `with` calls no __exit__ when __enter__ raises: stop what was started here.
            self.__exit__(None, None, None)
            raise
        return self

    def wait_healthy(self, timeout=180):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    self.dump_logs()
                    raise RuntimeError(f"{name} exited with {p.returncode} during startup")
            status, body = http_get(self.url + "/health")
            if status == 200:
                return json.loads(body)
            time.sleep(0.2)
        self.dump_logs()
        raise RuntimeError(f"cluster not healthy after {timeout} s: {http_get(self.url + '/health')}")

    def metrics(self):
        status, body = http_get(self.url + "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return parse_metrics(body)

    def worker_metrics(self, name):
        """A worker's own /metrics, parsed ({} when it does not answer)."""
        return scrape_if_up(self.metrics_ports[name])

    def rss_kib(self):
        """{name: resident KiB} of the processes that are still there."""
        rss = {name: rss_kib(p.pid) for name, p in self.procs.items()}
        return {name: kib for name, kib in rss.items() if kib is not None}

    def signal(self, name, sig):
        self.procs[name].send_signal(sig)

    def dump_logs(self, lines=40):
        for name in self.procs:
            path = os.path.join(self.log_dir, name + ".log")
            try:
                with open(path) as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            print(f"---- {name} ({path}) ----")
            print("".join(tail), end="")

    def __exit__(self, *exc):
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if exc[0] is not None:
            self.dump_logs()
        return False
