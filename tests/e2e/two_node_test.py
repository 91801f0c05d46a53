#!/usr/bin/env python3
"""Two nodes, one lost under load, with real processes on loopback: one router; node "a" and
node "b" each a broker serving the embedded model's store, a prefill worker and a decode worker
registered with `--node a` / `--node b` (each decode worker reads its own node's broker).
  1. 8 requests at once (greedy, ignore_eos); once all are admitted and node b's decode worker
     runs some of them, every process of node b is SIGKILLed (broker, prefill, decode): all 8
     complete with every token (the router places those that were on node b again, on node a);
  2. the router's view: one decode and one prefill worker, both of node a; 4 more requests are
     all placed there (node a's workers count them) and none fails;
  3. each of the 8 again, alone, on node a: the same text as under the loss (batch-invariant
     kernels: a greedy text does not depend on what it was batched with, nor on a request's
     move to another node mid-stream).
The burst comes first, on workers that have served nothing, so the router's view of both decode
workers' free KV is the same and it spreads the burst over both nodes.

Usage: two_node_test.py BUILD_DIR MODEL_DIR
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
MAX_TOKENS = 1500  # long enough that the kill lands mid-stream (the context is 2048)
NODES = ("a", "b")


def body(i, max_tokens=MAX_TOKENS):
    return {"model": "tiny-moe", "prompt": f"Request {i}: In the beginning", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def wait_for(what, cond, c):
    return wait_until(what, cond, c, DEADLINE_S)


def main():
    build_dir, model_dir = sys.argv[1], sys.argv[2]
    if not model_present(model_dir):
        return SKIP
    store = os.path.join(build_dir, "tiny-moe.apw")
    if not os.path.exists(store):
        print(f"SKIPPED: no {store} (the build's tiny_store target makes it)")
        return SKIP
    with tempfile.TemporaryDirectory(prefix="pw-2node-") as log_dir:
        c = LocalCluster(build_dir, model_dir, log_dir, kv_blocks=512, heartbeat_ms=200,
                         store=store, initial_bits=8)
        try:
            # The brokers' ports apart from the cluster's own (free_port may hand one out twice).
            taken = {c.port, c.worker_port, c.broker_port}
            broker_ports = []
            while len(broker_ports) < len(NODES):
                port = free_port()
                if port not in taken:
                    taken.add(port)
                    broker_ports.append(port)
            c.start_router()
            for i, node in enumerate(NODES):
                port = broker_ports[i]
                c.start_broker(f"broker-{node}", port)
                c.start_worker("prefill", i, node=node)
                c.start_worker("decode", i, node=node, broker_port=port)
            health = c.wait_healthy(timeout=DEADLINE_S)
            wait_for("both nodes' workers registered",
                     lambda: json.loads(http_get(c.url + "/health")[1] or "{}").get("decode_workers") == 2
                     and json.loads(http_get(c.url + "/health")[1]).get("prefill_workers") == 2, c)
            # ... and heard from: a decode worker counts its free KV from its first heartbeat on,
            # and the burst's spread depends on both being counted alike.
            wait_for("both decode workers' free KV known to the router",
                     lambda: c.metrics().get("pagedweight_router_backend_free_kv_blocks") == 2 * c.kv_blocks, c)
            print(f"two nodes up: {http_get(c.url + '/health')[1]}")

            # 1. 8 at once; node b lost while it runs some.
            results = {}

            def one(i):
                results[i] = post_completion(c.port, body(i), timeout=DEADLINE_S)

            threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()

            def running(name):
                return pick(c.worker_metrics(name), "pagedweight_worker_num_requests_running")

            # Every request admitted first (the router refuses with 429 what arrives once node
            # b's KV is gone and the rest no longer fits), and node b running some of them.
            def admitted():
                h = json.loads(http_get(c.url + "/health")[1] or "{}")
                return h.get("running", 0) + h.get("waiting", 0)

            wait_for("all 8 admitted and requests running on node b's decode worker",
                     lambda: (admitted() == 8 and running("decode-1") >= 1)
                     or not any(t.is_alive() for t in threads), c)
            on_b = running("decode-1")
            assert on_b >= 1, "every request ended before node b ran one"
            for name in ("decode-1", "prefill-1", "broker-b"):
                c.signal(name, signal.SIGKILL)
            for name in ("decode-1", "prefill-1", "broker-b"):
                c.procs[name].wait()
            print(f"node b lost (broker, prefill, decode SIGKILLed) with {on_b:.0f} request(s) "
                  f"running on it, {sum(t.is_alive() for t in threads)} not done")
            for t in threads:
                t.join(DEADLINE_S)
            assert not any(t.is_alive() for t in threads), "requests still running"
            for i in range(8):
                status, _, reply = results[i]
                assert status == 200, (i, status, reply)
                assert reply["usage"]["completion_tokens"] == MAX_TOKENS, (i, reply["usage"])
            print(f"all 8 completed with {MAX_TOKENS} tokens")

            # 2. Only node a is placed on from here.
            health = wait_for("the router drops node b's workers",
                              lambda: (lambda h: h if h.get("decode_workers") == 1
                                       and h.get("prefill_workers") == 1 else None)(
                                  json.loads(http_get(c.url + "/health")[1] or "{}")), c)
            ok_before = pick(c.worker_metrics("decode-0"), "pagedweight_worker_requests_total", 'status="ok"')
            prompts_before = pick(c.worker_metrics("prefill-0"), "pagedweight_worker_prompt_tokens_total")
            for i in range(8, 12):
                status, _, reply = post_completion(c.port, body(i, 16))
                assert status == 200 and reply["usage"]["completion_tokens"] == 16, (i, status, reply)
            # (A worker counts a request shortly after the router has its end: wait for it.)
            wait_for("node a's decode worker counts the 4",
                     lambda: pick(c.worker_metrics("decode-0"), "pagedweight_worker_requests_total",
                                  'status="ok"') >= ok_before + 4, c)
            wait_for("node a's prefill worker counts their prompts",
                     lambda: pick(c.worker_metrics("prefill-0"),
                                  "pagedweight_worker_prompt_tokens_total") > prompts_before, c)
            print(f"after the loss: {json.dumps(health)}; 4 more requests all on node a")

            # 3. The texts under the loss are each request's text alone.
            for i in range(8):
                status, _, reply = post_completion(c.port, body(i))
                assert status == 200, (i, status, reply)
                assert reply["choices"][0]["text"] == results[i][2]["choices"][0]["text"], (
                    i, "the text under the loss differs from the request's text alone")
            print("the 8 texts under the loss are each request's text alone")
        except BaseException:
            c.dump_logs()
            raise
        finally:
            c.__exit__(None, None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
