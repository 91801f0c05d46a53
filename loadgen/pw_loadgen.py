#!/usr/bin/env python3
"""pw-loadgen: a load generator for PagedWeight's OpenAI-compatible router (Python stdlib only).

Arrivals:
  - gamma bursts: gaps between request starts drawn from a gamma distribution with
    shape = burstiness and mean = 1/rate (burstiness 1 = Poisson; < 1 = burstier);
  - --rate inf: every request at once (bounded by --max-concurrency);
  - --trace FILE: replay an Azure LLM inference trace CSV (TIMESTAMP, ContextTokens,
    GeneratedTokens): arrival times from the timestamps (scaled by --trace-speedup), prompt and
    output lengths from the token counts (clipped to --max-prompt-tokens / --max-output-tokens).
At most --max-concurrency requests are in flight; a request that would exceed it waits.

Each request streams (SSE) and is timed on the client:
  TTFT  = first content chunk - request sent
  ITL   = every gap between consecutive content chunks
  TPOT  = (latency - TTFT) / (output tokens - 1), per request with >= 2 output tokens
  E2E   = last byte - request sent
Output tokens come from the usage chunk (stream_options.include_usage). Goodput counts requests
meeting --slo-ttft-ms and --slo-tpot-ms. Results print as a table; --json-out writes them all.
"""
import argparse
import asyncio
import csv
import datetime
import json
import math
import random
import sys
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] if lo == hi else s[lo] + (s[hi] - s[lo]) * (k - lo)


class RequestResult:
    __slots__ = ("ok", "status", "error", "prompt_tokens", "output_tokens", "ttft", "itl",
                 "latency", "start", "text")

    def __init__(self):
        self.ok = False
        self.status = 0
        self.error = ""
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.ttft = None
        self.itl = []
        self.latency = None
        self.start = 0.0
        self.text = ""


async def read_response_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


async def iter_body(reader, headers):
    """Yields body bytes as they arrive (chunked or Content-Length)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.strip().split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    else:
        n = int(headers.get("content-length", "0"))
        if n:
            yield await reader.readexactly(n)


async def one_request(args, host, port, path, payload, result):
    body = json.dumps(payload).encode()
    req = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
           ).encode() + body
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 22)
        result.start = time.perf_counter()
        writer.write(req)
        await writer.drain()
        status, headers = await read_response_head(reader)
        result.status = status
        last = None
        buf = b""
        async for data in iter_body(reader, headers):
            if status != 200:
                buf += data
                continue
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload_text = event[6:]
                if payload_text == b"[DONE]":
                    result.ok = result.error == ""
                    continue
                msg = json.loads(payload_text)
                if "error" in msg:
                    result.error = msg["error"].get("message", "error")
                    continue
                if msg.get("usage"):
                    result.output_tokens = msg["usage"]["completion_tokens"]
                    result.prompt_tokens = msg["usage"]["prompt_tokens"]
                for choice in msg.get("choices", []):
                    piece = choice.get("text")
                    if piece is None:
                        piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        now = time.perf_counter()
                        if result.ttft is None:
                            result.ttft = now - result.start
                        else:
                            result.itl.append(now - last)
                        last = now
                        result.text += piece
        result.latency = time.perf_counter() - result.start
        if status != 200:
            result.ok = False
            try:
                result.error = json.loads(buf)["error"]["message"]
            except Exception:  # noqa: BLE001 - report whatever came back
                result.error = buf[:200].decode("utf-8", "replace")
        elif not result.ok and not result.error:
            result.error = "stream ended without [DONE]"
    except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the run
        result.ok = False
        result.error = f"{type(e).__name__}: {e}"
        if result.latency is None and result.start:
            result.latency = time.perf_counter() - result.start
    finally:
        if writer is not None:
            writer.close()


WORDS = ("the of and to in is that it was for on are as with his they at be this from have or "
         "by one had not but what all were when we there can an your which their said if do will "
         "each about how up out them then she many some so these would other into has more her "
         "two like him see time could no make than first been its who now people my made over did "
         "down only way find use may water long little very after words called just where most "
         "know").split()


def make_prompt(rng, n_tokens, args):
    if args.text_prompts:
        return " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens)))
    # Token ids give exact prompt lengths; ids are drawn from [lo, hi) of the vocabulary.
    return [rng.randrange(args.token_id_min, args.token_id_max) for _ in range(max(1, n_tokens))]


def build_schedule(args, rng):
    """[(arrival seconds, prompt tokens, output tokens)]."""
    sched = []
    if args.trace:
        with open(args.trace, newline="") as f:
            rows = list(csv.DictReader(f))
        rows = rows[args.trace_offset:args.trace_offset + args.num_requests]
        if not rows:
            sys.exit(f"pw-loadgen: {args.trace}: no rows at offset {args.trace_offset}")
        t0 = None
        for i, row in enumerate(rows):
            try:
                ts = datetime.datetime.fromisoformat(row["TIMESTAMP"].strip()[:26])
                ctx = int(row["ContextTokens"])
                gen = int(row["GeneratedTokens"])
            except (KeyError, ValueError) as e:
                sys.exit(f"pw-loadgen: {args.trace}: row {i + 2 + args.trace_offset}: bad field ({e})")
            t0 = t0 or ts
            sched.append(((ts - t0).total_seconds() / args.trace_speedup,
                          max(1, min(ctx, args.max_prompt_tokens)),
                          max(1, min(gen, args.max_output_tokens))))
        return sched
    t = 0.0
    for _ in range(args.num_requests):
        p = args.prompt_tokens if args.prompt_jitter == 0 else max(
            1, int(rng.uniform(1 - args.prompt_jitter, 1 + args.prompt_jitter) * args.prompt_tokens))
        sched.append((t, p, args.max_tokens))
        if math.isfinite(args.rate) and args.rate > 0:
            theta = 1.0 / (args.rate * args.burstiness)
            t += rng.gammavariate(args.burstiness, theta)
    return sched


async def run(args):
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    chat = args.endpoint == "chat"
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if chat:
        args.text_prompts = True
    rng = random.Random(args.seed)
    sched = build_schedule(args, rng)
    sem = asyncio.Semaphore(args.max_concurrency)
    results = [RequestResult() for _ in sched]
    in_flight = 0
    peak = 0

    async def launch(i, prompt_len, out_len):
        nonlocal in_flight, peak
        async with sem:
            in_flight += 1
            peak = max(peak, in_flight)
            prompt = make_prompt(rng, prompt_len, args)
            payload = {"model": args.model, "max_tokens": out_len, "stream": True,
                       "stream_options": {"include_usage": True},
                       "temperature": args.temperature}
            if args.ignore_eos:
                payload["ignore_eos"] = True
            if chat:
                payload["messages"] = [{"role": "user", "content": prompt}]
            else:
                payload["prompt"] = prompt
            try:
                await asyncio.wait_for(one_request(args, host, port, path, payload, results[i]),
                                       args.timeout)
            except asyncio.TimeoutError:
                results[i].ok = False
                results[i].error = f"timed out after {args.timeout} s"
            in_flight -= 1

    t_start = time.perf_counter()
    tasks = []
    for i, (at, p, o) in enumerate(sched):
        delay = at - (time.perf_counter() - t_start)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(launch(i, p, o)))
    await asyncio.gather(*tasks)
    duration = time.perf_counter() - t_start
    return summarize(args, results, duration, peak)


def summarize(args, results, duration, peak):
    ok = [r for r in results if r.ok]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [g for r in ok for g in r.itl]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.ttft is not None and r.output_tokens > 1]
    e2e = [r.latency for r in ok if r.latency is not None]
    out_tokens = sum(r.output_tokens for r in ok)
    good = [r for r in ok if r.ttft is not None
            and r.ttft * 1000 <= args.slo_ttft_ms
            and (r.output_tokens <= 1 or
                 (r.latency - r.ttft) / (r.output_tokens - 1) * 1000 <= args.slo_tpot_ms)]
    errors = {}
    for r in results:
        if not r.ok:
            key = f"{r.status} {r.error[:120]}"
            errors[key] = errors.get(key, 0) + 1

    def stats(values):
        return {"mean_ms": (sum(values) / len(values) * 1000) if values else float("nan"),
                **{f"p{q}_ms": percentile(values, q) * 1000 for q in (50, 90, 99)}}

    return {
        "requests": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": errors, "duration_s": duration, "peak_concurrency": peak,
        "request_throughput_per_s": len(ok) / duration if duration > 0 else 0.0,
        "output_token_throughput_per_s": out_tokens / duration if duration > 0 else 0.0,
        "output_tokens": out_tokens, "goodput_per_s": len(good) / duration if duration else 0.0,
        "ttft": stats(ttft), "itl": stats(itl), "tpot": stats(tpot), "e2e": stats(e2e),
    }


def print_report(s):
    print(f"requests {s['requests']}  completed {s['completed']}  failed {s['failed']}  "
          f"peak concurrency {s['peak_concurrency']}  duration {s['duration_s']:.2f} s")
    print(f"throughput {s['request_throughput_per_s']:.2f} req/s, "
          f"{s['output_token_throughput_per_s']:.1f} output tok/s, goodput "
          f"{s['goodput_per_s']:.2f} req/s")
    print(f"{'metric':<6} {'mean ms':>10} {'p50 ms':>10} {'p90 ms':>10} {'p99 ms':>10}")
    for k in ("ttft", "itl", "tpot", "e2e"):
        v = s[k]
        print(f"{k:<6} {v['mean_ms']:>10.2f} {v['p50_ms']:>10.2f} {v['p90_ms']:>10.2f} "
              f"{v['p99_ms']:>10.2f}")
    for k, n in s["errors"].items():
        print(f"error x{n}: {k}")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="pw-loadgen", description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny-moe")
    ap.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    ap.add_argument("--num-requests", type=int, default=500)
    ap.add_argument("--rate", type=float, default=float("inf"),
                    help="mean request rate per second (inf: all at once)")
    ap.add_argument("--burstiness", type=float, default=1.0,
                    help="gamma shape of the gaps (1 = Poisson, <1 burstier)")
    ap.add_argument("--max-concurrency", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--prompt-jitter", type=float, default=0.0,
                    help="prompt length drawn uniformly in (1 +- jitter) * prompt-tokens")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true",
                    help="ask the server to ignore end-of-sequence (if it supports it)")
    ap.add_argument("--text-prompts", action="store_true",
                    help="send word prompts instead of token-id prompts")
    ap.add_argument("--token-id-min", type=int, default=16)
    ap.add_argument("--token-id-max", type=int, default=4000)
    ap.add_argument("--trace", help="Azure LLM inference trace CSV to replay")
    ap.add_argument("--trace-offset", type=int, default=0)
    ap.add_argument("--trace-speedup", type=float, default=1.0)
    ap.add_argument("--max-prompt-tokens", type=int, default=1024)
    ap.add_argument("--max-output-tokens", type=int, default=256)
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=200.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json-out")
    args = ap.parse_args(argv)
    if args.burstiness <= 0:
        ap.error("--burstiness must be > 0")
    if args.max_concurrency < 1:
        ap.error("--max-concurrency must be >= 1")
    if args.trace_speedup <= 0:
        ap.error("--trace-speedup must be > 0")
    summary = asyncio.run(run(args))
    print_report(summary)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
