#!/usr/bin/env python3
"""The cluster serves an MLA model, with real processes: pw-router, pw-prefill and pw-decode on
the deepseek_v3 and kimi_k2 fixtures (every KV layer a latent of kv_lora_rank 32 +
qk_rope_head_dim 8 values a token, memory/kv_spec.h) start, register and answer greedy
completions; the prefill worker puts exactly the prompts' latent rows into the decode worker's
pool (16 bf16 rows of 40 values, 1280 bytes, per layer of a block), whose pages are 4096 bytes
(--page-bytes) against the prefill worker's 1280. The fixtures ship no tokenizer: the router
reads the embedded model's, whose vocabulary holds the fixtures' 2048 ids.

Usage: latent_kv_test.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import LocalCluster  # noqa: E402

LAYERS, BLOCK_TOKENS, LATENT_BYTES = 3, 16, 16 * 40 * 2


def complete(url, model, prompt, max_tokens):
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200, r.status
        return json.loads(r.read().decode())


def main():
    build, source = sys.argv[1], sys.argv[2]
    tokenizer = os.path.join(source, "models", "tiny-moe")
    for fixture in ("deepseek_v3", "kimi_k2"):
        model = os.path.join(source, "tests", "fixtures", "models", fixture)
        log_dir = os.path.join(build, "test-logs", "latent_kv_" + fixture)
        with LocalCluster(build, model, log_dir, model_name=fixture, kv_blocks=64,
                          router_args=["--tokenizer", tokenizer],
                          decode_args=["--page-bytes", "4096"]) as c:
            prompts = [[3 + (i * 37 + k) % 2000 for i in range(n)] for k, n in ((0, 40), (5, 23))]
            texts = []
            for p in prompts:
                out = complete(c.url, fixture, p, 16)
                assert out["usage"]["prompt_tokens"] == len(p), out
                assert out["usage"]["completion_tokens"] == 16, out
                texts.append(out["choices"][0]["text"])
                # Greedy: the same prompt again gives the same text.
                again = complete(c.url, fixture, p, 16)
                assert again["choices"][0]["text"] == texts[-1], (again, texts[-1])
            moved = sum(v for k, v in c.worker_metrics("prefill-0").items()
                        if k.startswith("pagedweight_kv_transfer_bytes_total"))
            want = 2 * sum(-(-len(p) // BLOCK_TOKENS) for p in prompts) * LAYERS * LATENT_BYTES
            assert moved == want, f"{fixture}: {moved} KV bytes put, want {want}"
            print(f"{fixture}: served {len(prompts) * 2} completions, {int(moved)} latent bytes moved")
    print("OK")


if __name__ == "__main__":
    main()
