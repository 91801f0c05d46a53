#!/usr/bin/env python3
"""The official `openai` Python client against a running PagedWeight cluster.

Usage: openai_client_test.py --url http://127.0.0.1:PORT --model NAME [--api-key KEY]
Checks: a streamed chat completion (content arrives in several chunks, ends with a finish reason
and usage); greedy completions give the same text streamed and not; the model list; errors come
back as the client's typed exceptions (404 unknown model, 400 bad max_tokens); logprobs in both
shapes, streamed and not, with the generated tokens' log-probabilities (decode worker) equal to
the same tokens' prompt log-probabilities under echo (prefill worker); n and best_of; bad values
with their `param`; with --api-key, a wrong or missing key is refused with 401.
"""
import argparse
import json
import math
import sys
import urllib.error
import urllib.request

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default="unused")
    args = ap.parse_args()
    base = args.url.rstrip("/") + "/v1"
    client = openai.OpenAI(base_url=base, api_key=args.api_key, max_retries=0, timeout=120)
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    models = [m.id for m in client.models.list().data]
    check(args.model in models, f"models.list() contains {args.model}: {models}")

    stream = client.chat.completions.create(
        model=args.model, messages=[{"role": "user", "content": "Tell me about the sea."}],
        max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True})
    content, n_content_chunks, finish, usage, roles = "", 0, None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.role:
                roles.append(choice.delta.role)
            if choice.delta.content:
                content += choice.delta.content
                n_content_chunks += 1
            if choice.finish_reason:
                finish = choice.finish_reason
    check(roles[:1] == ["assistant"], f"first delta carries role assistant: {roles}")
    check(finish in ("stop", "length"), f"stream ends with a finish reason: {finish}")
    check(usage is not None and usage.completion_tokens >= 1,
          f"usage chunk: {usage}")
    check(n_content_chunks >= 1 or finish == "stop",
          f"streamed {n_content_chunks} content chunks: {content!r}")

    prompt = "In the beginning"
    full = client.completions.create(model=args.model, prompt=prompt, max_tokens=16, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=args.model, prompt=prompt, max_tokens=16, temperature=0, stream=True)
        if c.choices)
    check(full.choices[0].text == streamed,
          f"greedy completion equal streamed and not: {full.choices[0].text!r} vs {streamed!r}")
    check(full.usage.completion_tokens >= 1, f"completion usage: {full.usage}")

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        check(False, "unknown model refused")
    except openai.NotFoundError as e:
        check(e.status_code == 404, "unknown model -> NotFoundError 404")
    try:
        client.completions.create(model=args.model, prompt="x", max_tokens=-1)
        check(False, "negative max_tokens refused")
    except openai.BadRequestError as e:
        check(e.status_code == 400, "negative max_tokens -> BadRequestError 400")

    check_logprobs(client, args.model, check)
    check_choices(client, args.model, check)
    check_bad_values(client, args.model, check)
    if args.api_key != "unused":
        check_auth(base, args.url, args.model, args.api_key, check)

    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


def check_logprobs(client, model, check):
    prompt = "Once upon a time"
    r = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    n = len(lp.tokens)
    check(n == r.usage.completion_tokens or r.choices[0].finish_reason == "stop",
          f"completions logprobs: one entry per token ({n}, usage {r.usage.completion_tokens})")
    check(len(lp.token_logprobs) == n and len(lp.top_logprobs) == n and len(lp.text_offset) == n,
          "completions logprobs: tokens, token_logprobs, top_logprobs, text_offset align")
    check(all(v <= 0 for v in lp.token_logprobs), "log-probabilities are <= 0")
    greedy = all(abs(v - max(top.values())) < 1e-5 and 1 <= len(top) <= 4
                 for v, top in zip(lp.token_logprobs, lp.top_logprobs))
    check(greedy, "greedy: each chosen token is the most likely of its top_logprobs")
    check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[:1] == [0],
          f"text offsets start at 0 and grow: {lp.text_offset}")
    streamed = []
    for c in client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0,
                                       logprobs=3, stream=True):
        if c.choices and c.choices[0].logprobs:
            streamed += c.choices[0].logprobs.token_logprobs
    check(len(streamed) == n and all(abs(a - b) < 1e-6 for a, b in zip(streamed,
                                                                          lp.token_logprobs)),
          "streamed token_logprobs equal the full response's")

    # The generated tokens' log-probabilities (first from the prefill worker, the rest from the
    # decode worker) equal the same tokens scored as a prompt under echo.
    text = r.choices[0].text
    e = client.completions.create(model=model, prompt=prompt + text, max_tokens=0, echo=True,
                                  logprobs=1, temperature=0)
    elp = e.choices[0].logprobs
    check(e.choices[0].text == prompt + text, "echo returns the prompt as the text")
    check(elp.token_logprobs[0] is None and elp.top_logprobs[0] is None,
          "echo: the first prompt token has no log-probability")
    check(e.usage.completion_tokens == 0, f"max_tokens 0: no completion tokens {e.usage}")
    k = len(lp.tokens)
    same_tokens = elp.tokens[-k:] == lp.tokens
    check(same_tokens, f"echo re-tokenizes the generated text the same: {elp.tokens[-k:]} "
                       f"vs {lp.tokens}")
    if same_tokens:
        diff = max(abs(a - b) for a, b in zip(elp.token_logprobs[-k:], lp.token_logprobs))
        check(diff < 1e-3, f"generated logprobs equal echo's prompt logprobs (max diff {diff:.2e})")

    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=8,
        temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    check(len(content) >= 1 and all(len(c.top_logprobs) == 2 for c in content),
          f"chat logprobs: content with 2 top_logprobs each ({len(content)} tokens)")
    check(all(bytes(c.bytes).decode("utf-8", "replace") and c.logprob <= 0 for c in content),
          "chat logprobs carry bytes and logprob")
    streamed = []
    for c in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=8,
            temperature=0, logprobs=True, top_logprobs=2, stream=True):
        if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content:
            streamed += [x.logprob for x in c.choices[0].logprobs.content]
    check(len(streamed) == len(content) and all(abs(a - b.logprob) < 1e-6
                                                for a, b in zip(streamed, content)),
          "streamed chat logprobs equal the full response's")


def check_choices(client, model, check):
    r = client.completions.create(model=model, prompt="The sea", max_tokens=8, temperature=0, n=3)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    check(len(texts) == 3 and len(set(texts)) == 1, f"greedy n=3: three identical choices {texts}")
    check(r.usage.completion_tokens == sum(8 for _ in texts) or
          any(c.finish_reason == "stop" for c in r.choices), f"n=3 usage {r.usage}")
    r = client.completions.create(model=model, prompt="The sea", max_tokens=8, temperature=1.0,
                                  n=4, seed=5)
    check(sorted(c.index for c in r.choices) == [0, 1, 2, 3], "n=4 sampled: indices 0..3")
    again = client.completions.create(model=model, prompt="The sea", max_tokens=8,
                                      temperature=1.0, n=4, seed=5)
    check([c.text for c in r.choices] == [c.text for c in again.choices],
          "n=4 with a seed is reproducible")
    b = client.completions.create(model=model, prompt="The sea", max_tokens=8, temperature=1.0,
                                  n=1, best_of=3, seed=5, logprobs=0)
    check(len(b.choices) == 1, "best_of=3, n=1: one choice")
    mean = lambda c: sum(c.logprobs.token_logprobs) / max(1, len(c.logprobs.token_logprobs))
    # The returned candidate is the best (mean token log-probability) of the three with the
    # same seeds: candidates i are seeded seed + i, so n=3 with seed 5 draws the same three.
    three = client.completions.create(model=model, prompt="The sea", max_tokens=8,
                                      temperature=1.0, n=3, seed=5, logprobs=0)
    best = max(three.choices, key=lambda c: (mean(c), -c.index))
    check(b.choices[0].text == best.text, f"best_of picks the likeliest candidate: "
                                          f"{b.choices[0].text!r} vs {best.text!r}")
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=0,
        n=2)
    check(len(chat.choices) == 2 and chat.choices[0].message.content ==
          chat.choices[1].message.content, "chat greedy n=2: identical choices")


def check_bad_values(client, model, check):
    cases = [("logprobs", dict(prompt="x", logprobs=-1)),
             ("logprobs", dict(prompt="x", logprobs=21)),
             ("n", dict(prompt="x", n=0)),
             ("n", dict(prompt="x", n=17)),
             ("best_of", dict(prompt="x", n=2, best_of=1)),
             ("prompt", dict(prompt="word " * 3000, max_tokens=0, echo=True, logprobs=1))]
    for param, kw in cases:
        try:
            client.completions.create(model=model, max_tokens=kw.pop("max_tokens", 4), **kw)
            check(False, f"{param} {kw} refused")
        except openai.BadRequestError as e:
            got = (e.body or {}).get("param") if isinstance(e.body, dict) else None
            check(e.status_code == 400 and got == param,
                  f"bad {param}: 400 with param {got!r}")


def check_auth(base, url, model, key, check):
    wrong = openai.OpenAI(base_url=base, api_key="not-the-key", max_retries=0, timeout=30)
    try:
        wrong.models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "wrong key -> AuthenticationError 401")
    req = urllib.request.Request(base + "/models")
    try:
        urllib.request.urlopen(req, timeout=30)
        check(False, "a missing key is refused")
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
        check(e.code == 401 and body["error"]["code"] == "invalid_api_key",
              f"missing key -> 401 invalid_api_key {body}")
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        check(r.status == 200, "/health stays open with API keys")


if __name__ == "__main__":
    sys.exit(main())
