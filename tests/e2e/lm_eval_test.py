#!/usr/bin/env python3
"""e2e: lm-evaluation-harness scores held-out continuations through the router, and agrees
with pw-eval's own log-likelihood of the same continuations.

Usage: lm_eval_test.py BUILD_DIR MODEL_DIR [--pairs N] [--report FILE]
Pairs (context of ~400 characters, continuation of ~100 starting at a word) are cut at evenly
spaced places of BUILD_DIR/eval/heldout.txt (`make eval-data`). The same pairs are scored three
ways:
  1. `pw-eval loglik` (the engine, teacher-forced, in process);
  2. the API directly: /tokenize, then /v1/completions with echo, logprobs 0 and max_tokens 0,
     summing the continuation tokens' token_logprobs;
  3. lm-evaluation-harness (`lm_eval` from PyPI, model `local-completions` with the router's
     remote tokenizer endpoints), task tests/e2e/lm_eval/pw_heldout_loglik.yaml.
Each continuation's log-likelihood must agree within TOLERANCE nats between every two. The
router runs with an API key, which lm_eval sends (OPENAI_API_KEY, auth_token).
lm_eval is not a build dependency: it lives in BUILD_DIR/lmeval-venv, made on first use; when
that cannot be made (no PyPI), or the held-out text or the weights are absent, the test reports
itself skipped (exit 77).
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "tools", "pylib")]
from cluster import SKIP, LocalCluster, model_present  # noqa: E402
from pypi_venv import ensure_venv  # noqa: E402

LM_EVAL = "lm_eval[api]==0.4.13"
TOLERANCE = 2e-3  # nats per continuation (batched vs. whole-sequence kernels, float32 on the wire)
API_KEY = "pw-test-key-lm-eval"


def make_pairs(text, n):
    pairs = []
    for k in range(n):
        start = (k * len(text)) // n
        start = text.find(" ", start) + 1
        if start <= 0:
            continue
        ctx = text[start:start + 400]
        cut = ctx.rfind(" ")
        ctx = ctx[:cut].rstrip()
        rest = text[start + len(ctx):start + len(ctx) + 100]
        cut = rest.rfind(" ")
        cont = rest[:cut]
        if not ctx.strip() or not cont.strip() or not cont.startswith((" ", "\n")):
            continue
        pairs.append({"context": ctx, "continuation": cont})
    return pairs


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def api_loglik(url, model, pair):
    """The continuation's log-likelihood through the API, tokenized as lm_eval does."""
    ctx, cont = pair["context"], pair["continuation"]
    spaces = len(ctx) - len(ctx.rstrip())
    if spaces:
        cont, ctx = ctx[-spaces:] + cont, ctx[:-spaces]
    whole = post(url + "/tokenize", {"prompt": ctx + cont})["tokens"]
    ctx_len = len(post(url + "/tokenize", {"prompt": ctx})["tokens"])
    r = post(url + "/v1/completions", {"model": model, "prompt": whole, "max_tokens": 0,
                                       "echo": True, "logprobs": 0, "temperature": 0})
    lps = r["choices"][0]["logprobs"]["token_logprobs"]
    assert len(lps) == len(whole), (len(lps), len(whole))
    return sum(lps[ctx_len:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("model_dir")
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--report", help="write the three sums as JSON here")
    args = ap.parse_args()
    build_dir, model_dir = os.path.abspath(args.build_dir), os.path.abspath(args.model_dir)
    if not model_present(model_dir):
        return SKIP
    heldout = os.path.join(build_dir, "eval", "heldout.txt")
    if not os.path.exists(heldout):
        print(f"SKIPPED: {heldout} is absent (make eval-data)")
        return SKIP
    py = ensure_venv(os.path.join(build_dir, "lmeval-venv"), LM_EVAL, "lm_eval", timeout=1200)
    if py is None:
        print(f"SKIPPED: cannot install {LM_EVAL} (PyPI unreachable?)")
        return SKIP

    work = os.path.join(build_dir, "e2e-logs", "lm_eval")
    os.makedirs(work, exist_ok=True)
    with open(heldout, encoding="utf-8") as f:
        pairs = make_pairs(f.read(), args.pairs)
    data_file = os.path.join(work, "heldout_pairs.jsonl")
    with open(data_file, "w", encoding="utf-8") as f:
        for p in pairs:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    task_dir = os.path.join(work, "tasks")
    os.makedirs(task_dir, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "lm_eval", "pw_heldout_loglik.yaml")) as f:
        task = f.read().replace("@DATA_FILE@", data_file)
    with open(os.path.join(task_dir, "pw_heldout_loglik.yaml"), "w") as f:
        f.write(task)
    print(f"{len(pairs)} pairs from {heldout}")

    # 1. pw-eval, in process.
    out = subprocess.run([os.path.join(build_dir, "bin", "pw-eval"), "loglik", "--model",
                          model_dir, "--pairs", data_file], capture_output=True, text=True,
                         timeout=600)
    if out.returncode != 0:
        print(out.stdout, out.stderr)
        return 1
    pw_ll = [float(line.split()[2]) for line in out.stdout.splitlines()
             if line.startswith("ll ")]
    assert len(pw_ll) == len(pairs), (len(pw_ll), len(pairs))

    failures = []
    log_dir = os.path.join(build_dir, "e2e-logs", "lm_eval_cluster")
    # pw-eval runs the engine's fp32 KV; the workers keep the same layout here, so the three
    # computations agree to rounding (bf16 KV, the serving default, moves them by ~1e-2 nats).
    with LocalCluster(build_dir, model_dir, log_dir, kv_dtype="fp32",
                      router_args=["--api-key", API_KEY]) as c:
        # 2. The API directly.
        api_ll = [api_loglik(c.url, c.model_name, p) for p in pairs]
        # 3. lm-evaluation-harness.
        out_dir = os.path.join(work, "results")
        env = dict(os.environ, OPENAI_API_KEY=API_KEY, HF_DATASETS_OFFLINE="1",
                   HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        model_args = ",".join([f"base_url={c.url}/v1/completions", f"model={c.model_name}",
                               "tokenizer_backend=remote", "tokenized_requests=True",
                               f"auth_token={API_KEY}", "num_concurrent=1", "max_retries=1",
                               "max_length=2047"])
        cmd = [py, "-m", "lm_eval", "run", "--model", "local-completions", "--model_args",
               model_args, "--tasks", "pw_heldout_loglik", "--include_path", task_dir,
               "--batch_size", "1", "--output_path", out_dir, "--log_samples"]
        print(" ".join(cmd))
        r = subprocess.run(cmd, env=env, timeout=1200)
        if r.returncode != 0:
            c.dump_logs()
            print("lm_eval failed", file=sys.stderr)
            return 1
    samples = sorted(glob.glob(os.path.join(out_dir, "**", "samples_pw_heldout_loglik*.jsonl"),
                               recursive=True), key=os.path.getmtime)
    if not samples:
        print("no lm_eval samples file under", out_dir, file=sys.stderr)
        return 1
    lm_ll = [None] * len(pairs)
    with open(samples[-1]) as f:
        for line in f:
            s = json.loads(line)
            resp = s["filtered_resps"][0]
            lm_ll[s["doc_id"]] = float(resp[0] if isinstance(resp, list) else resp)
    if any(v is None for v in lm_ll):
        print("lm_eval did not score every pair", file=sys.stderr)
        return 1

    worst = 0.0
    for i, (a, b, l) in enumerate(zip(pw_ll, api_ll, lm_ll)):
        d = max(abs(a - b), abs(a - l), abs(b - l))
        worst = max(worst, d)
        if d > TOLERANCE:
            failures.append(f"pair {i}: pw-eval {a:.6f} api {b:.6f} lm_eval {l:.6f}")
    n_tokens = sum(int(line.split()[3]) for line in out.stdout.splitlines()
                   if line.startswith("ll "))
    report = {"pairs": len(pairs), "continuation_tokens": n_tokens,
              "pw_eval_sum": sum(pw_ll), "api_sum": sum(api_ll), "lm_eval_sum": sum(lm_ll),
              "max_abs_diff_per_pair": worst, "tolerance": TOLERANCE}
    print(json.dumps(report, indent=1))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    for m in failures:
        print("FAIL", m)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
