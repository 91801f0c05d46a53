#!/usr/bin/env python3
"""The official `openai` Python client against a running PagedWeight cluster.

Usage: openai_client_test.py --url http://127.0.0.1:PORT --model NAME
Checks: a streamed chat completion (content arrives in several chunks, ends with a finish reason
and usage); greedy completions give the same text streamed and not; the model list; errors come
back as the client's typed exceptions (404 unknown model, 400 bad max_tokens).
"""
import argparse
import sys

import openai


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url.rstrip("/") + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
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

    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
