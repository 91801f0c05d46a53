#!/usr/bin/env python3
"""e2e fault tests (router side): with greedy decoding,
  1. SIGKILL of a decode worker mid-stream: every stream finishes with exactly the reference text
     (the router re-places the requests with the tokens already sent: no gap, no repeat), also
     two with seeded sampling (the random draws continue where they stopped);
  2. SIGKILL of a prefill worker while requests arrive: they are re-dispatched and finish with
     the reference text;
  3. the cluster serves again afterwards;
  4. SIGTERM of the router: streams in flight finish, new requests get 503, the router exits 0.

With --store, case 1 only, on the default deployment's experts (deploy/local.yaml): a broker
serving BUILD_DIR/tiny-moe.apw, every expert at 8 bits on the decode workers (the prefill
workers run bf16 experts). Longer streams, killed once each has streamed 300 tokens, greedy and
seeded sampling: the decode worker that takes over must recompute the KV of the streamed tokens
at the widths they were decoded with (a bf16 re-prefill changes the text of about 3 in 8).

Usage: fault_test.py BUILD_DIR MODEL_DIR [--store]
"""
import argparse
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import SKIP, LocalCluster, model_present  # noqa: E402

PROMPTS = ["In the beginning", "The Lord said unto Moses", "int main(int argc, char** argv) {",
           "def parse(self, text):", "Q: Why is the sky blue?\nA:", "Once upon a time",
           "#include <stdio.h>\n", "And it came to pass"]
MAX_TOKENS = 400  # streams must outlast failure detection (3 heartbeats)
# Seeded sampling: a stream taken over continues the request's random draws where they stopped.
SAMPLED = {"temperature": 0.8, "seed": 11, "ignore_eos": True}


class Stream(threading.Thread):
    """One streamed completion; records text, events and the outcome. `sampling`: request fields
    beyond the greedy default (temperature 0)."""

    def __init__(self, url, prompt, max_tokens=MAX_TOKENS, sampling=None):
        super().__init__(daemon=True)
        self.url = urllib.parse.urlparse(url)
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.sampling = dict(sampling or {"temperature": 0})
        self.text = ""
        self.chunks = 0
        self.finish = None
        self.error = None
        self.status = None
        self.done_marker = False

    def run(self):
        try:
            conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=300)
            body = json.dumps({"model": "tiny-moe", "prompt": self.prompt,
                               "max_tokens": self.max_tokens, "stream": True, **self.sampling})
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.status = resp.status
            if resp.status != 200:
                self.error = resp.read().decode()
                return
            while True:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    self.done_marker = True
                    break
                msg = json.loads(data)
                if "error" in msg:
                    self.error = msg["error"]["message"]
                    continue
                for ch in msg["choices"]:
                    if ch.get("text"):
                        self.text += ch["text"]
                        self.chunks += 1
                    if ch.get("finish_reason"):
                        self.finish = ch["finish_reason"]
        except Exception as e:  # noqa: BLE001 - reported as the stream's error
            self.error = f"{type(e).__name__}: {e}"


def complete(url, prompt, sampling=None):
    s = Stream(url, prompt, sampling=sampling)
    s.run()
    return s


def wait_until(cond, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def kill_decode_mid_stream(c, requests, reference, min_chunks, check, what):
    """Starts `requests` ((prompt, max_tokens, sampling) each), SIGKILLs the decode worker
    running the most of them once each has streamed `min_chunks` chunks (or finished), and
    checks that every stream finishes with its reference text (`reference[i]` for request i)."""
    replaced = "pagedweight_router_backend_requests_replaced_total"
    before = c.metrics().get(replaced, 0)
    streams = [Stream(c.url, p, n, sp) for p, n, sp in requests]
    for s in streams:
        s.start()
    wait_until(lambda: all(s.chunks >= min_chunks or s.finish for s in streams), 120)
    unfinished = sum(1 for s in streams if not s.finish)
    running = {w: sum(v for k, v in c.worker_metrics(w).items()
                      if k.split("{")[0] == "pagedweight_worker_num_requests_running")
               for w in ("decode-0", "decode-1")}
    victim = max(running, key=running.get)
    print(f"running per decode worker: {running}; chunks streamed: "
          f"{[s.chunks for s in streams]}; killing {victim}")
    c.signal(victim, signal.SIGKILL)
    for s in streams:
        s.join(300)
    moved = c.metrics().get(replaced, 0) - before
    print(f"{unfinished} streams running at the kill, {moved} requests placed again")
    check(moved >= 1, f"{what}: the killed decode worker held requests that moved")
    for s, want in zip(streams, reference):
        check(s.error is None and s.done_marker and s.text == want,
              f"{what}: {s.prompt!r} {s.sampling} finished identical "
              f"(error={s.error}, finish={s.finish})")


def store_case(build_dir, model_dir, check, failures):
    """Case 1 with the default deployment's 8-bit experts (see the module comment)."""
    store = os.path.join(build_dir, "tiny-moe.apw")
    if not os.path.exists(store):
        print(f"SKIPPED: no {store} (the build's tiny_store target makes it)")
        return SKIP
    max_tokens = 1024
    requests = [(p, max_tokens, None) for p in PROMPTS] + \
               [(p, max_tokens, SAMPLED) for p in PROMPTS[:2]]
    log_dir = os.path.join(build_dir, "e2e-logs", "fault-store")
    # KV for every stream on one decode worker (deploy/local.yaml's 2048 blocks): a preempted
    # request's recompute is another matter than the failover's.
    with LocalCluster(build_dir, model_dir, log_dir, decode_workers=2, prefill_workers=1,
                      heartbeat_ms=250, store=store, initial_bits=8, kv_blocks=2048) as c:
        # Undisturbed, all at once (batch-invariant kernels: the same text as one by one).
        streams = [Stream(c.url, p, n, sp) for p, n, sp in requests]
        for s in streams:
            s.start()
        for s in streams:
            s.join(300)
        for s in streams:
            check(s.error is None and s.done_marker, f"reference run of {s.prompt!r}: {s.error}")
        reference = [s.text for s in streams]
        kill_decode_mid_stream(c, requests, reference, 300, check, "decode SIGKILL, 8-bit experts")
        if failures:
            c.dump_logs()
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--store", action="store_true",
                    help="only the decode SIGKILL, with 8-bit experts from the broker's store")
    args = ap.parse_args()
    build_dir, model_dir = os.path.abspath(args.build_dir), os.path.abspath(args.model_dir)
    if not model_present(model_dir):
        return SKIP
    log_dir = os.path.join(build_dir, "e2e-logs", "fault")
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            failures.append(what)

    if args.store:
        if store_case(build_dir, model_dir, check, failures) == SKIP:
            return SKIP
        print(f"{len(failures)} failure(s)")
        return 1 if failures else 0

    with LocalCluster(build_dir, model_dir, log_dir, decode_workers=2, prefill_workers=2,
                      heartbeat_ms=250, router_args=["--drain-timeout-ms", "60000"]) as c:
        reference = {}
        for p in PROMPTS:
            s = complete(c.url, p)
            check(s.error is None and s.done_marker, f"reference run of {p!r}: {s.error}")
            reference[p] = s.text
        sampled_reference = {}
        for p in PROMPTS[:2]:
            s = complete(c.url, p, SAMPLED)
            check(s.error is None and s.done_marker, f"reference run of {p!r} {SAMPLED}: {s.error}")
            sampled_reference[p] = s.text

        # 0. A client that disconnects mid-stream: the request is cancelled on the workers and
        #    its KV blocks are freed.
        def closed_by_client():
            return sum(v for k, v in c.metrics().items()
                       if k.startswith("pagedweight_router_requests_total") and 'code="499"' in k)
        closed_before = closed_by_client()
        conn = http.client.HTTPConnection("127.0.0.1", c.port, timeout=60)
        conn.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny-moe", "prompt": PROMPTS[0], "max_tokens": 1900, "stream": True,
             "ignore_eos": True}), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        for _ in range(5):
            resp.readline()
        conn.close()

        def kv_used():
            return sum(v for w in ("decode-0", "decode-1")
                       for k, v in c.worker_metrics(w).items()
                       if k.split("{")[0] == "pagedweight_kv_blocks" and 'state="used"' in k)
        freed = wait_until(lambda: c.metrics().get("pagedweight_router_num_requests_running") == 0
                           and kv_used() == 0, 10)
        check(closed_by_client() == closed_before + 1, "the router saw the client leave (499)")
        check(freed, f"client disconnect cancels and frees KV (used blocks {kv_used()})")

        # 1. SIGKILL a decode worker mid-stream.
        requests = [(p, MAX_TOKENS, None) for p in PROMPTS] + \
                   [(p, MAX_TOKENS, SAMPLED) for p in PROMPTS[:2]]
        kill_decode_mid_stream(c, requests, [reference[p] for p in PROMPTS] +
                               [sampled_reference[p] for p in PROMPTS[:2]], 3, check,
                               "decode SIGKILL")

        # 2. SIGKILL a prefill worker while requests are being placed.
        streams = [Stream(c.url, p) for p in PROMPTS]
        for s in streams:
            s.start()
        c.signal("prefill-0", signal.SIGKILL)
        for s in streams:
            s.join(300)
        for s in streams:
            check(s.error is None and s.done_marker and s.text == reference[s.prompt],
                  f"prefill SIGKILL: {s.prompt!r} finished identical (error={s.error})")

        # 3. Serving again.
        s = complete(c.url, PROMPTS[0])
        check(s.error is None and s.text == reference[PROMPTS[0]], "serves after the failures")

        # 4. SIGTERM of the router: in-flight streams finish, new work is refused.
        streams = [Stream(c.url, p) for p in PROMPTS[:4]]
        for s in streams:
            s.start()
        wait_until(lambda: all(s.chunks >= 1 or s.finish for s in streams), 120)
        c.signal("router", signal.SIGTERM)
        time.sleep(0.05)
        late = complete(c.url, PROMPTS[1])
        check(late.status == 503 or (late.status is None and late.error),
              f"new request while draining refused (status {late.status})")
        for s in streams:
            s.join(300)
        for s in streams:
            check(s.error is None and s.done_marker and s.text == reference[s.prompt],
                  f"router SIGTERM: in-flight {s.prompt!r} finished (error={s.error})")
        try:
            rc = c.procs["router"].wait(timeout=60)
        except Exception:  # noqa: BLE001
            rc = None
        check(rc == 0, f"router exited 0 after draining (rc={rc})")
        if failures:
            c.dump_logs()
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
