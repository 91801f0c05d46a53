#!/usr/bin/env python3
"""Two routers in front of the same workers (router.replicas > 1 behind one Service), with real
processes on loopback: routers "a" and "b", one prefill and one decode worker registered with
both (`--router A --router B`). Each router numbers its requests from 1, so the workers see the
same request ids from both.
  1. references: each prompt alone through router a (greedy, ignore_eos);
  2. both routers serving at once: every prompt sent to a and to b concurrently: every reply has
     its reference text (batch-invariant kernels: a greedy text does not depend on its batch);
  3. router b SIGKILLed while both routers' long requests run on the decode worker: router a's
     requests all finish with their reference texts; the workers drop router b's requests (the
     decode worker's KV blocks all free again, nothing running or leased, the prefill worker
     idle) and stay ready (registered with router a), and router a serves on.

Usage: two_router_test.py BUILD_DIR MODEL_DIR
"""
import json
import os
import signal
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from cluster import SKIP, LocalCluster, http_get, model_present, wait_until  # noqa: E402
from completions import post_completion  # noqa: E402
from localhost import free_port  # noqa: E402
from prom_samples import pick  # noqa: E402

DEADLINE_S = 300  # generous: a busy 2-core machine
PROMPTS = 4
SHORT = 48  # tokens of step 2
LONG = 1500  # tokens of step 3: long enough that the kill lands mid-stream (the context is 2048)


def body(i, max_tokens):
    return {"model": "tiny-moe", "prompt": f"Request {i}: Once upon a time", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def wait_for(what, cond, c):
    return wait_until(what, cond, c, DEADLINE_S)


def health(port):
    status, text = http_get(f"http://127.0.0.1:{port}/health")
    try:
        return status, json.loads(text or "{}")
    except ValueError:
        return status, {}


def burst(jobs):
    """Runs post_completion(port, body) for every (key, port, body) at once: {key: result}."""
    results = {}

    def one(key, port, b):
        results[key] = post_completion(port, b, timeout=DEADLINE_S)

    threads = [threading.Thread(target=one, args=job) for job in jobs]
    for t in threads:
        t.start()
    return results, threads


def text_of(result, key, tokens):
    status, _, reply = result
    assert status == 200, (key, status, reply)
    assert reply["usage"]["completion_tokens"] == tokens, (key, reply["usage"])
    return reply["choices"][0]["text"]


def main():
    build_dir, model_dir = sys.argv[1], sys.argv[2]
    if not model_present(model_dir):
        return SKIP
    with tempfile.TemporaryDirectory(prefix="pw-2router-") as log_dir:
        c = LocalCluster(build_dir, model_dir, log_dir, kv_blocks=512, heartbeat_ms=200)
        try:
            # Router b's ports apart from the cluster's own (free_port may hand one out twice).
            taken = {c.port, c.worker_port}
            ports = []
            while len(ports) < 2:
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    ports.append(port)
            port_a, port_b = c.port, ports[0]
            control = [c.worker_port, ports[1]]
            c.start_router("router-a", port_a, control[0])
            c.start_router("router-b", port_b, control[1])
            c.start_worker("prefill", 0, router_ports=control)
            c.start_worker("decode", 0, router_ports=control)
            for name, port in (("a", port_a), ("b", port_b)):
                wait_for(f"router {name} healthy with both workers",
                         lambda port=port: (lambda s, h: s == 200 and h.get("decode_workers") == 1
                                            and h.get("prefill_workers") == 1)(*health(port)), c)
            print("two routers up, one prefill and one decode worker registered with both")

            # 1. Each prompt alone through router a.
            short_ref, long_ref = {}, {}
            for i in range(PROMPTS):
                short_ref[i] = text_of(post_completion(port_a, body(i, SHORT), timeout=DEADLINE_S),
                                       ("alone", i), SHORT)
                long_ref[i] = text_of(post_completion(port_a, body(i, LONG), timeout=DEADLINE_S),
                                      ("alone long", i), LONG)
            print(f"references: {PROMPTS} prompts alone through router a")

            # 2. Both routers at once, the same prompts (and the same request ids at the workers).
            jobs = [((r, i), port, body(i, SHORT)) for r, port in (("a", port_a), ("b", port_b))
                    for i in range(PROMPTS)]
            results, threads = burst(jobs)
            for t in threads:
                t.join(DEADLINE_S)
            assert not any(t.is_alive() for t in threads), "requests still running"
            for (r, i), _, _ in jobs:
                assert text_of(results[(r, i)], (r, i), SHORT) == short_ref[i], (
                    r, i, "a text served beside the other router's requests differs from its text alone")
            print(f"both routers served {PROMPTS} requests each at once, every text its own")

            # 3. Router b lost mid-stream.
            jobs = [((r, i), port, body(i, LONG)) for r, port in (("a", port_a), ("b", port_b))
                    for i in range(PROMPTS)]
            results, threads = burst(jobs)

            def running():
                return pick(c.worker_metrics("decode-0"), "pagedweight_worker_num_requests_running")

            wait_for("both routers' requests running on the decode worker",
                     lambda: running() >= 2 * PROMPTS or not any(t.is_alive() for t in threads), c)
            assert running() >= 2 * PROMPTS, "requests ended before the kill"
            c.signal("router-b", signal.SIGKILL)
            c.procs["router-b"].wait()
            print(f"router b SIGKILLed with {running():.0f} requests running on the decode worker")
            for t in threads:
                t.join(DEADLINE_S)
            assert not any(t.is_alive() for t in threads), "requests still running"
            for i in range(PROMPTS):
                assert text_of(results[("a", i)], ("a", i), LONG) == long_ref[i], (
                    i, "router a's text under router b's loss differs from its text alone")
            for i in range(PROMPTS):
                status = results[("b", i)][0]
                assert status != 200, ("b", i, "a request of the killed router completed", status)
            print(f"router a's {PROMPTS} requests finished with their texts; router b's did not")

            # The workers dropped router b's requests: nothing runs or is leased, every KV block
            # of the decode worker is free again (none used, reserved or quarantined), the
            # prefill worker is idle.
            def drained():
                d = c.worker_metrics("decode-0")
                p = c.worker_metrics("prefill-0")
                return (d and p
                        and pick(d, "pagedweight_worker_num_requests_running") == 0
                        and pick(d, "pagedweight_worker_num_requests_waiting") == 0
                        and pick(d, "pagedweight_kv_blocks", 'state="free"') == c.kv_blocks
                        and pick(d, "pagedweight_kv_blocks", 'state="used"') == 0
                        and pick(d, "pagedweight_kv_blocks", 'state="reserved"') == 0
                        and pick(p, "pagedweight_worker_num_requests_running") == 0
                        and pick(p, "pagedweight_worker_num_requests_waiting") == 0)

            wait_for("the workers drop router b's requests (KV back to zero)", drained, c)
            with open(os.path.join(log_dir, "decode-0.log")) as f:
                log = f.read()
            assert f"of router tcp://127.0.0.1:{control[1]}: router lost" in log, \
                "the decode worker does not say it dropped router b's requests"
            for name in ("prefill-0", "decode-0"):
                status, text = http_get(f"http://127.0.0.1:{c.metrics_ports[name]}/ready")
                assert status == 200, (name, "not ready with router a left", status, text)
            print("the workers dropped router b's requests: KV all free, nothing running; still ready")

            # Router a serves on.
            for i in range(PROMPTS):
                assert text_of(post_completion(port_a, body(i, SHORT), timeout=DEADLINE_S),
                               ("after", i), SHORT) == short_ref[i], (i, "router a after the loss")
            print("router a serves on after router b's loss")
        except BaseException:
            c.dump_logs()
            raise
        finally:
            c.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
