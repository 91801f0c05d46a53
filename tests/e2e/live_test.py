#!/usr/bin/env python3
"""Liveness on main-loop progress (/live, the chart's startup and liveness probes), with real
processes on loopback: a router, a broker serving the embedded model's store, a prefill and a
decode worker, all with --main-loop-stale-ms 1000.
  1. a decode worker still waiting for its broker's expert weights (no broker there): /metrics
     200, /live 503 "starting" (its main loop has not run: the startupProbe's time);
  2. the cluster up: /live 200 on every process;
  3. for each process in turn, only its main loop's thread stopped (ptrace PTRACE_SEIZE +
     PTRACE_INTERRUPT on that thread; its HTTP threads keep running): /live turns 503 naming
     how long the loop has not come round while /metrics still answers 200; resumed
     (PTRACE_DETACH): /live 200 again; then the prefill worker's compute thread (pw-compute)
     alone, its control loop running on: /live 503 naming the compute loop, 200 once resumed;
  4. every thread resumed: the cluster serves a completion.
The main loop is the main thread for pw-prefill, pw-decode and pw-broker, and the thread named
pw-backend (the cluster backend) for pw-router, whose HTTP threads are separate.

Usage: live_test.py BUILD_DIR MODEL_DIR
"""
import ctypes
import errno
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from cluster import SKIP, LocalCluster, http_get, model_present  # noqa: E402
from completions import post_completion  # noqa: E402
from localhost import free_port  # noqa: E402

DEADLINE_S = 180  # generous: model load on a busy 2-core machine
STALE_MS = 1000

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: wait for a thread that is not a child

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long


def ptrace(request, tid):
    if libc.ptrace(request, tid, None, None) == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"ptrace({request:#x}, {tid}): {os.strerror(e)}")


class StoppedThread:
    """Stops one thread of another process (the others run on) until the block ends."""

    def __init__(self, tid):
        self.tid = tid

    def __enter__(self):
        ptrace(PTRACE_SEIZE, self.tid)
        ptrace(PTRACE_INTERRUPT, self.tid)
        os.waitpid(self.tid, WALL)  # the thread is in its ptrace stop from here
        return self

    def __exit__(self, *exc):
        ptrace(PTRACE_DETACH, self.tid)
        return False


def wait_for(what, cond, procs=()):
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        for name, p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode} while waiting for {what}")
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"not within {DEADLINE_S} s: {what}")


def thread_named(pid, comm):
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if f.read().strip() == comm:
                return int(tid)
    raise AssertionError(f"process {pid} has no thread named {comm}")


def ptrace_allowed():
    """Whether this test may stop a thread of its own child (root, or ptrace_scope allowing
    it); a child that only sleeps is tried."""
    import subprocess
    p = subprocess.Popen(["sleep", "60"])
    try:
        with StoppedThread(p.pid):
            pass
        return True
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            print(f"SKIPPED: ptrace is refused here ({e})")
            return False
        raise
    finally:
        p.kill()
        p.wait()


def main():
    build_dir, model_dir = sys.argv[1], sys.argv[2]
    if not model_present(model_dir):
        return SKIP
    store = os.path.join(build_dir, "tiny-moe.apw")
    if not os.path.exists(store):
        print(f"SKIPPED: no {store} (the build's tiny_store target makes it)")
        return SKIP
    if not ptrace_allowed():
        return SKIP
    stale = ["--main-loop-stale-ms", str(STALE_MS)]
    with tempfile.TemporaryDirectory(prefix="pw-live-") as log_dir:
        # 1. Before the main loop: a decode worker whose broker is not there waits for its
        #    expert weights with /metrics up.
        c = LocalCluster(build_dir, model_dir, log_dir, kv_blocks=64, heartbeat_ms=200,
                         store=store, initial_bits=8, common_args=stale)
        try:
            c.broker_port = free_port()  # nothing listens there yet
            c.start_worker("decode", 9)
            port = c.metrics_ports["decode-9"]
            procs = [("decode-9", c.procs["decode-9"])]
            wait_for("decode-9 /metrics", lambda: http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200,
                     procs)
            status, body = http_get(f"http://127.0.0.1:{port}/live")
            assert status == 503 and "starting: the main loop has not run yet" in body, (status, body)
            print(f"before the main loop: /metrics 200, /live {status} {body.strip()!r}")
            p = c.procs.pop("decode-9")
            p.kill()
            p.wait()
        except BaseException:
            c.dump_logs()
            raise
        finally:
            c.__exit__(None, None, None)

        # 2. The cluster: every process live.
        with LocalCluster(build_dir, model_dir, log_dir, kv_blocks=64, heartbeat_ms=200,
                          store=store, initial_bits=8, common_args=stale) as c:
            live_urls = {"router": c.url + "/live"}
            metrics_urls = {"router": c.url + "/metrics"}
            for name in ("broker", "prefill-0", "decode-0"):
                live_urls[name] = f"http://127.0.0.1:{c.metrics_ports[name]}/live"
                metrics_urls[name] = f"http://127.0.0.1:{c.metrics_ports[name]}/metrics"
            procs = list(c.procs.items())
            for name, url in live_urls.items():
                wait_for(f"{name} /live 200", lambda: http_get(url)[0] == 200, procs)
            print("cluster up: /live 200 on", ", ".join(live_urls))

            # 3. One main loop stopped at a time.
            for name, url in live_urls.items():
                pid = c.procs[name].pid
                tid = thread_named(pid, "pw-backend") if name == "router" else pid
                with StoppedThread(tid):
                    status, body = wait_for(
                        f"{name} /live 503 with its main loop stopped",
                        lambda: (lambda r: r if r[0] == 503 else None)(http_get(url)), procs)
                    assert "the main loop has not come round for" in body, (name, body)
                    assert f"main_loop_stale_ms {STALE_MS}" in body, (name, body)
                    m_status, m_body = http_get(metrics_urls[name])
                    assert m_status == 200 and "pagedweight_" in m_body, (name, m_status)
                    print(f"{name}: main loop (thread {tid}) stopped: /live {status} "
                          f"{body.strip()!r}, /metrics {m_status}")
                wait_for(f"{name} /live 200 once resumed", lambda: http_get(url)[0] == 200, procs)
                print(f"{name}: resumed: /live 200")

            # 3b. The prefill worker's compute thread stopped alone (its control loop runs on and
            #     heartbeats): /live fails too, naming the compute loop.
            name, url = "prefill-0", live_urls["prefill-0"]
            tid = thread_named(c.procs[name].pid, "pw-compute")
            with StoppedThread(tid):
                status, body = wait_for(
                    f"{name} /live 503 with its compute thread stopped",
                    lambda: (lambda r: r if r[0] == 503 else None)(http_get(url)), procs)
                assert "the compute loop has not come round for" in body, (name, body)
                print(f"{name}: compute thread {tid} stopped: /live {status} {body.strip()!r}")
            wait_for(f"{name} /live 200 once resumed", lambda: http_get(url)[0] == 200, procs)
            print(f"{name}: compute thread resumed: /live 200")

            # 4. Everything resumed: the cluster serves.
            c.wait_healthy()
            status, _, reply = post_completion(
                c.port, {"model": c.model_name, "prompt": "The Lord said unto Moses",
                         "max_tokens": 8, "temperature": 0})
            assert status == 200 and reply["choices"][0]["text"], (status, reply)
            print("all resumed: a completion served")
    return 0


if __name__ == "__main__":
    sys.exit(main())
