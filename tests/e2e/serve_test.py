"""`pw serve MODEL_DIR` end to end, with real processes on loopback.

The checkpoint is not the embedded model: a synthetic qwen3_moe (make_synthetic_moe, random
weights) written as a sharded Hugging Face cache snapshot
(<tmp>/hub/models--pwtest--tiny-sharded/snapshots/rev0: model.safetensors split in two shards
with model.safetensors.index.json, files linked from ../../blobs like the hub's cache, the
embedded model's tokenizer and the Qwen3 family's real chat template as chat_template.jinja),
served with nothing but `pw serve DIR` and a cache directory and port of the test's own:

  1. the first start is SIGKILLed as soon as its progress shows a layer of the store built;
     the calibration, the store's .tmp and its progress are kept, no store is published;
  2. the second start resumes (the calibration and the layers done are reused), publishes a
     store byte-identical to an uninterrupted `pw-quantize` build, and serves: /v1/models
     lists the default name pwtest/tiny-sharded, a completion and a chat completion answer, a
     chat is rendered by the snapshot's Qwen3 template (/tokenize then /detokenize);
  3. the third start finds the store in the cache (not rebuilt: same inode and mtime) and
     serves again; its time from start to a served completion is printed; a fourth, its options
     from a --config file, serves the bf16 experts (--bits 16: no store, no broker) under
     another name;
  4. bad directories and budgets exit non-zero within seconds (REFUSE_S) with a message naming
     the file and the fix:
     no config.json, an unknown model_type, a missing shard, a tokenizer with more ids than
     config.json's vocab_size, a memory budget below the smallest plan, no tokenizer.json (the
     message names --tokenizer), a --tokenizer path that does not exist;
  5. a checkpoint of weights and config.json alone is served with `--tokenizer FILE` (vLLM's
     flag): the store is the cached one (the tokenizer is no part of the model hash), the
     router tokenizes with that tokenizer and renders chats with the chat template beside it.

    serve_test.py BUILD_DIR MODEL_DIR
Exit 0 on success, 1 on failure, 77 (skipped) without the model's weights.
"""
import filecmp
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "pylib"))
from localhost import free_port  # noqa: E402

SKIP = 77
DEADLINE_S = 300  # generous bound on any one wait; never a performance figure
THREADS = "2"     # the store build's threads, the same for the reference build


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def split_safetensors(src, out_dir, names):
    """Splits one safetensors file into len(names) shards (tensors dealt round-robin in name
    order) and writes model.safetensors.index.json beside them."""
    with open(src, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", None)
    tensors = sorted(header)
    weight_map = {}
    for i, shard in enumerate(names):
        mine = tensors[i::len(names)]
        h, blobs, at = {}, [], 0
        for t in mine:
            b, e = header[t]["data_offsets"]
            blob = data[b:e]
            h[t] = {"dtype": header[t]["dtype"], "shape": header[t]["shape"], "data_offsets": [at, at + len(blob)]}
            blobs.append(blob)
            at += len(blob)
            weight_map[t] = shard
        if meta is not None:
            h["__metadata__"] = meta
        hb = json.dumps(h).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(out_dir, shard), "wb") as f:
            f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(len(x) for x in [data])}, "weight_map": weight_map}, f)


REFUSE_S = 10  # a bad directory or budget is refused within this many seconds

# The Qwen3 family's own chat template (the embedded model is a qwen3_moe): the snapshot ships
# it as chat_template.jinja, as checkpoints saved by transformers 5 do.
QWEN3_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat_templates",
                              "llama.cpp-Qwen-Qwen3-0.6B.jinja")


def make_snapshot(bindir, model_dir, hub):
    """A checkpoint that is not the embedded model as a sharded hub cache snapshot: a synthetic
    qwen3_moe (make_synthetic_moe: 4 layers, 16 experts top-8, hidden 128, random weights) with
    the embedded model's tokenizer (its vocabulary: 4096 ids) and Qwen3's chat template; returns
    the snapshot directory."""
    repo = os.path.join(hub, "models--pwtest--tiny-sharded")
    blobs, snap = os.path.join(repo, "blobs"), os.path.join(repo, "snapshots", "rev0")
    os.makedirs(blobs)
    os.makedirs(snap)
    staging = tempfile.mkdtemp(dir=hub)
    synthetic = tempfile.mkdtemp(dir=hub)
    subprocess.run([os.path.join(bindir, "make_synthetic_moe"), "--type", "qwen3_moe", "--layers", "4",
                    "--experts", "16", "--vocab", "4096", "--hidden", "128", "--expert-ffn", "64",
                    "--seed", "7", "--out", synthetic], check=True, capture_output=True)
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    split_safetensors(os.path.join(synthetic, "model.safetensors"), staging, shards)
    shutil.copy(os.path.join(synthetic, "config.json"), staging)
    shutil.rmtree(synthetic)
    for name in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(os.path.join(model_dir, name), staging)
    shutil.copy(QWEN3_TEMPLATE, os.path.join(staging, "chat_template.jinja"))
    for name in sorted(os.listdir(staging)):
        with open(os.path.join(staging, name), "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        os.replace(os.path.join(staging, name), os.path.join(blobs, digest))
        os.symlink(os.path.join("..", "..", "blobs", digest), os.path.join(snap, name))
    os.rmdir(staging)
    return snap


class Serve:
    """One `pw serve` process; its stdout and stderr collected line by line ('\\r' ends a
    progress bar's line too)."""

    def __init__(self, pw, args, log):
        self.log = open(log, "w")
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen([pw, "serve"] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        buf = b""
        while True:
            chunk = self.proc.stdout.read1(4096) if hasattr(self.proc.stdout, "read1") else self.proc.stdout.read(1)
            if not chunk:
                break
            self.log.write(chunk.decode(errors="replace"))
            self.log.flush()
            buf += chunk
            parts = re.split(rb"[\r\n]", buf)
            buf = parts.pop()
            with self.cond:
                self.lines.extend(p.decode(errors="replace") for p in parts if p)
                self.cond.notify_all()
        with self.cond:
            if buf:
                self.lines.append(buf.decode(errors="replace"))
            self.lines.append(None)  # end of output
            self.cond.notify_all()

    def wait_line(self, pattern):
        """The first line matching `pattern`, or None once the output ends."""
        rx = re.compile(pattern)
        seen = 0
        deadline = time.time() + DEADLINE_S
        with self.cond:
            while time.time() < deadline:
                while seen < len(self.lines):
                    line = self.lines[seen]
                    seen += 1
                    if line is None:
                        return None
                    if rx.search(line):
                        return line
                self.cond.wait(1)
        return None

    def text(self):
        with self.cond:
            return "\n".join(x for x in self.lines if x is not None)

    def children(self):
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.reader.join(timeout=10)
        self.log.close()
        return self.proc.returncode


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_served(url, name):
    """Polls until a completion for `name` answers 200 (the node registered its workers)."""
    deadline = time.time() + DEADLINE_S
    last = None
    while time.time() < deadline:
        try:
            last = post(url + "/v1/completions", {"model": name, "prompt": "The sea", "max_tokens": 4})
            if last[0] == 200:
                return last[1]
        except OSError as e:
            last = e
        time.sleep(0.2)
    fail(f"{url} never served a completion for '{name}': {last}")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def main():
    build, model = sys.argv[1], sys.argv[2]
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        print(f"SKIPPED: no model.safetensors in {model}")
        return SKIP
    bindir = os.path.join(build, "bin")
    pw = os.path.join(bindir, "pw")
    tmp = tempfile.mkdtemp(prefix="pw-serve-test-")
    try:
        snap = make_snapshot(bindir, model, os.path.join(tmp, "hub"))
        cache = os.path.join(tmp, "cache")
        port = free_port()
        common = ["--store-dir", cache, "--port", str(port), "--memory", "2G", "--quantize-threads", THREADS]
        url = f"http://127.0.0.1:{port}"
        stores = os.path.join(cache, "stores")

        # 1. Killed while building the store, once a layer is done.
        s = Serve(pw, [snap] + common, os.path.join(tmp, "serve1.log"))
        line = s.wait_line(r"quantize: layer \d+ \(\d+/\d+\) done")
        if line is None:
            s.stop()
            fail("no layer progress line from the first start:\n" + s.text())
        kids = s.children()
        os.kill(s.proc.pid, signal.SIGKILL)
        s.proc.wait()
        s.stop()
        for k in kids:  # the build dies with pw serve
            deadline = time.time() + DEADLINE_S
            while pid_alive(k) and time.time() < deadline:
                time.sleep(0.05)
            if pid_alive(k):
                fail(f"the store build (pid {k}) outlived its pw serve")
        partial = [d for d in os.listdir(stores) if d.endswith(".partial")]
        published = [d for d in os.listdir(stores) if d.endswith(".apw")]
        if len(partial) != 1 or published:
            fail(f"after the kill: partial dirs {partial}, stores {published}")
        # The store is written once, to its .tmp beside its final name; the partial directory
        # records the layers flushed to it. A layer's progress line is printed after its record,
        # so at least the layers announced are kept (one more may have been recorded since).
        kept = os.listdir(os.path.join(stores, partial[0]))
        tmps = [d for d in os.listdir(stores) if d.endswith(".apw.tmp")]
        if "store-progress.bin" not in kept or "calibration.bin" not in kept or len(tmps) != 1:
            fail(f"after the kill: {partial[0]} holds {sorted(kept)}, store temporaries {tmps}")
        announced = len(re.findall(r"quantize: layer \d+ \(\d+/\d+\) done", s.text()))
        total = int(re.search(r"layer \d+ \(\d+/(\d+)\)", line).group(1))
        print(f"killed after '{line.strip()}': {announced} of {total} layers announced, kept in {partial[0]}")
        if announced >= total:
            fail(f"expected the kill before the last layer, {announced} of {total} announced")

        # 2. Resumed, published, served. The model hash is kept between starts only once every
        # file is a second older than the hashing (model_hash_cache.h): let the snapshot's
        # files reach that age, so this start keeps it and its pw-quantize reads it there.
        newest = max(os.stat(os.path.join(snap, f)).st_ctime for f in os.listdir(snap))
        time.sleep(max(0.0, newest + 1.5 - time.time()))
        s = Serve(pw, [snap] + common, os.path.join(tmp, "serve2.log"))
        if s.wait_line(r"resuming the build") is None:
            s.stop()
            fail("the second start did not resume:\n" + s.text())
        done = s.wait_line(r"pw-quantize: .*layers reused")
        reused = re.search(r"\((\d+) layers reused\)", done or "")
        if (reused is None or not announced <= int(reused.group(1)) < total or "statistics reused" not in done):
            s.stop()
            fail(f"expected the calibration and {announced} to {total - 1} layers reused, got: {done}\n" + s.text())
        if "(model hash remembered)" not in done:  # pw serve hashed it for the store's key
            s.stop()
            fail(f"pw-quantize hashed the checkpoint again: {done}")
        if s.wait_line(r"model 'pwtest/tiny-sharded' at " + re.escape(url)) is None:
            s.stop()
            fail("no endpoint line with the default name:\n" + s.text())
        # pw-cluster's own curl line (it used to say "tiny-moe" whatever the model).
        if s.wait_line(r'"model": "pwtest/tiny-sharded", "prompt"') is None:
            s.stop()
            fail("no completions curl line with the served name:\n" + s.text())
        wait_served(url, "pwtest/tiny-sharded")
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            ids = [m["id"] for m in json.loads(r.read())["data"]]
        if ids != ["pwtest/tiny-sharded"]:
            fail(f"/v1/models lists {ids}")
        code, body = post(url + "/v1/completions", {"model": "pwtest/tiny-sharded", "prompt": "The Lord said",
                                                    "max_tokens": 8, "temperature": 0})
        if code != 200 or body["usage"]["completion_tokens"] < 1:
            fail(f"completion: {code} {body}")
        code, chat = post(url + "/v1/chat/completions", {"model": "pwtest/tiny-sharded", "max_tokens": 8,
                                                         "messages": [{"role": "user", "content": "Hello"}]})
        if code != 200 or chat["choices"][0]["message"]["role"] != "assistant" or chat["usage"]["completion_tokens"] < 1:
            fail(f"chat completion: {code} {chat}")
        # The chat is rendered with the snapshot's own template (Qwen3's, its thinking switch
        # off through chat_template_kwargs), not a default one.
        messages = [{"role": "user", "content": "Hello"}]
        code_t, tok = post(url + "/tokenize", {"messages": messages, "chat_template_kwargs": {"enable_thinking": False}})
        code_d, text = post(url + "/detokenize", {"tokens": tok.get("tokens", [])})
        want = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        if code_t != 200 or code_d != 200 or text["prompt"] != want:
            s.stop()
            fail(f"the chat prompt is not Qwen3's template's: {code_t} {tok}, {code_d} {text}")
        print(f"served: completion {body['choices'][0]['text']!r}, chat {chat['choices'][0]['message']['content']!r}, "
              f"Qwen3's template ({tok['count']} prompt tokens)")
        rc = s.stop()
        if rc != 0:
            fail(f"pw serve (pw-cluster) exited {rc} on SIGTERM")
        published = [d for d in os.listdir(stores) if d.endswith(".apw")]
        if len(published) != 1 or any(d.endswith(".partial") for d in os.listdir(stores)):
            fail(f"after the resumed build: {os.listdir(stores)}")
        store = os.path.join(stores, published[0])

        # The resumed store is the uninterrupted build's, byte for byte.
        ref = os.path.join(tmp, "reference.apw")
        # pw serve calibrates as pw-quantize does by default: the bundled text through the
        # snapshot's tokenizer.
        subprocess.run([os.path.join(bindir, "pw-quantize"), "--model", snap, "--threads", THREADS, "--quiet",
                        "--out", ref], check=True)
        if not filecmp.cmp(store, ref, shallow=False):
            fail(f"the resumed store {store} differs from an uninterrupted build {ref}")
        print(f"resumed store identical to an uninterrupted build ({os.path.getsize(store)} bytes)")

        # 3. Found in the cache: not rebuilt.
        before = os.stat(store)
        t0 = time.time()
        s = Serve(pw, [snap] + common, os.path.join(tmp, "serve3.log"))
        if s.wait_line(r"store found in the cache") is None:
            s.stop()
            fail("the third start did not find the store in the cache:\n" + s.text())
        wait_served(url, "pwtest/tiny-sharded")
        second_start = time.time() - t0
        if "building" in s.text() or "pw-quantize" in s.text():
            s.stop()
            fail("the third start built the store again:\n" + s.text())
        s.stop()
        after = os.stat(store)
        if (before.st_ino, before.st_mtime_ns) != (after.st_ino, after.st_mtime_ns):
            fail("the cached store was rewritten")
        # The broker found the model hash where pw serve keeps it: no expert byte read again.
        broker_logs = glob.glob(os.path.join(cache, "run", "*", "broker.log"))
        hash_lines = [l for b in broker_logs for l in open(b, errors="replace") if "broker: model hash" in l]
        if not hash_lines or "remembered in " + cache not in hash_lines[-1]:
            fail(f"the broker did not take the model hash from {cache}/hashes: {hash_lines} in {broker_logs}")
        print(f"start with the store cached: {second_start:.1f}s to the first served completion")

        # bf16 experts (no store, no broker), the options from a --config file, another name.
        conf = os.path.join(tmp, "serve.yaml")
        with open(conf, "w") as f:
            f.write(f"model_dir: {snap}\nbits: 16\nmemory: 1G\nport: {port}\nserved_model_name: tiny-bf16\n"
                    f"run_dir: {tmp}/run-bf16\ndense: ap4\nlm_head: ap6\n")
        s = Serve(pw, ["--config", conf, "--store-dir", cache], os.path.join(tmp, "serve4.log"))
        wait_served(url, "tiny-bf16")
        code, body = post(url + "/v1/completions", {"model": "tiny-bf16", "prompt": "The Lord said",
                                                    "max_tokens": 8, "temperature": 0})
        if code != 200 or body["usage"]["completion_tokens"] < 1:
            s.stop()
            fail(f"completion with dense ap4, lm_head ap6: {code} {body}")
        s.stop()
        with open(os.path.join(tmp, "run-bf16", "node.yaml")) as f:
            node = f.read()
        if "enabled: false" not in node or "store:" in node or "pw-quantize" in s.text():
            fail("--bits 16 still used a store:\n" + node + s.text())
        if os.path.exists(os.path.join(tmp, "run-bf16", "broker.log")):
            fail("--bits 16 started a broker")
        # dense: ap4 and lm_head: ap6 from the file reached both workers.
        for w in ("prefill-0", "decode-0"):
            with open(os.path.join(tmp, "run-bf16", w + ".log")) as f:
                if "dense matrices ap4, lm_head ap6" not in f.read():
                    fail(f"dense: ap4 / lm_head: ap6 did not reach {w}:\n" + node)
        print("served with --bits 16, dense ap4, lm_head ap6 and --config: no store, no broker")

        # 4. Refusals.
        def refused(name, target, pattern, extra=()):
            t = time.time()
            r = subprocess.run([pw, "serve", target, "--store-dir", cache, "--port", str(free_port())] + list(extra),
                               capture_output=True, text=True, timeout=DEADLINE_S)
            out = r.stdout + r.stderr
            took = time.time() - t
            if r.returncode == 0 or not re.search(pattern, out):
                fail(f"{name}: exit {r.returncode}, expected a message matching {pattern!r}:\n{out}")
            # Within seconds: the checks read the directory's small files, no weights are
            # hashed and nothing is built (a generous bound for a loaded CI machine).
            if took > REFUSE_S:
                fail(f"{name}: refused after {took:.1f}s, more than {REFUSE_S}s")
            print(f"{name}: exit {r.returncode} after {took:.2f}s: {out.strip().splitlines()[-1]}")

        def variant(name):
            d = os.path.join(tmp, "bad", name)
            shutil.copytree(snap, d)  # the links' targets, copied
            return d

        d = variant("no-config")
        os.remove(os.path.join(d, "config.json"))
        refused("no config.json", d, re.escape(d) + r"/config\.json: missing.*download")
        d = variant("unknown-family")
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        cfg["model_type"] = "llama"
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        refused("unknown family", d, r"config\.json.*model_type.*'llama'.*qwen2_moe, qwen3_moe, olmoe.*mixtral")
        d = variant("missing-shard")
        os.remove(os.path.join(d, "model-00002-of-00002.safetensors"))
        refused("missing shard", d, r"model\.safetensors\.index\.json.*model-00002-of-00002\.safetensors.*download")
        d = variant("foreign-tokenizer")
        with open(os.path.join(d, "tokenizer.json")) as f:
            tok = json.load(f)
        tok["added_tokens"].append({"id": 5000, "content": "<|foreign|>", "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
        with open(os.path.join(d, "tokenizer.json"), "w") as f:
            json.dump(tok, f)
        # (the added token's id is derived, as HF does: the next one after the vocabulary, 4096)
        refused("tokenizer of another model", d,
                re.escape(d) + r"/tokenizer\.json: the tokenizer has ids up to 4096 but .*config\.json says "
                r"vocab_size 4096.*copy")
        refused("memory below the smallest plan", snap, r"--memory 20M .*too small.*smallest plan.*give --memory",
                ["--memory", "20M"])
        d = variant("no-tokenizer")
        os.remove(os.path.join(d, "tokenizer.json"))
        refused("no tokenizer", d, re.escape(d) + r"/tokenizer\.json: missing.*--tokenizer DIR\|FILE")
        refused("--tokenizer that does not exist", d, r"--tokenizer .*/nowhere: no such file or directory",
                ["--tokenizer", os.path.join(tmp, "nowhere")])

        # 5. --tokenizer: weights and config.json here, the tokenizer and its chat template there
        # (Qwen2.5's template, which writes a default system prompt the embedded one does not).
        bare = variant("weights-only")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            os.remove(os.path.join(bare, name))
        tok_dir = os.path.join(tmp, "tokenizer-elsewhere")
        os.makedirs(tok_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(model, name), tok_dir)
        src = os.path.dirname(os.path.abspath(__file__))
        shutil.copy(os.path.join(src, "..", "fixtures", "chat_templates", "llama.cpp-Qwen-Qwen2.5-7B-Instruct.jinja"),
                    os.path.join(tok_dir, "chat_template.jinja"))
        s = Serve(pw, [bare, "--tokenizer", os.path.join(tok_dir, "tokenizer.json")] + common,
                  os.path.join(tmp, "serve5.log"))
        if s.wait_line(r"store found in the cache") is None:
            s.stop()
            fail("--tokenizer: the store was not the cached one:\n" + s.text())
        wait_served(url, "weights-only")
        messages = [{"role": "user", "content": "Hello"}]
        code, chat = post(url + "/v1/chat/completions", {"model": "weights-only", "max_tokens": 4, "messages": messages})
        code_t, tok = post(url + "/tokenize", {"messages": messages})
        if code != 200 or code_t != 200:
            s.stop()
            fail(f"--tokenizer: chat {code} {chat}, tokenize {code_t} {tok}")
        code_d, text = post(url + "/detokenize", {"tokens": tok["tokens"]})
        s.stop()
        want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        if code_d != 200 or not text["prompt"].startswith(want) or chat["usage"]["prompt_tokens"] != tok["count"]:
            fail(f"--tokenizer: the chat prompt is not the template's beside the tokenizer: {text}, {chat['usage']}")
        run_dirs = [os.path.join(cache, "run", r) for r in os.listdir(os.path.join(cache, "run"))]
        nodes = [open(os.path.join(r, "node.yaml")).read() for r in run_dirs if os.path.exists(os.path.join(r, "node.yaml"))]
        if not any(f'tokenizer: "{tok_dir}"' in n for n in nodes):
            fail("--tokenizer: no node file names the tokenizer's directory:\n" + "\n".join(nodes))
        print(f"served weights-only with --tokenizer {tok_dir}/tokenizer.json: chat prompt {tok['count']} tokens "
              "from the template beside it")
        print("PASS")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
