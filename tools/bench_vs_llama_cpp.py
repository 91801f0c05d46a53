#!/usr/bin/env python3
"""PagedWeight beside llama.cpp on one machine, in one run: the engine in-process and the node served.

  /usr/bin/python3 tools/bench_vs_llama_cpp.py --llama-cpp LLAMA_DIR --python CONVERTER_PY \\
      --checkpoint CHECKPOINT_DIR [--tokenizer models/tiny-moe] [--rounds 2] [--parts decode,prefill,served]

LLAMA_DIR: a llama.cpp source tree (github.com/ggml-org/llama.cpp; the figures in
docs/benchmarks.md were taken at commit c392e509, 2025-02-20), with its CPU build in
LLAMA_DIR/build (--llama-build elsewhere). A build that lacks one of llama-server, llama-bench,
llama-batched-bench, llama-quantize gets those targets only (Release, -DGGML_NATIVE=ON
-DLLAMA_CURL=OFF).
CONVERTER_PY: a Python outside the repository that runs LLAMA_DIR/convert_hf_to_gguf.py (torch,
transformers, numpy, sentencepiece, pyyaml; gguf-py is taken from LLAMA_DIR).
CHECKPOINT_DIR: a Hugging Face checkpoint (e.g. make_synthetic_moe's OLMoE-dimension one).
One that ships no tokenizer.json gets --tokenizer's files beside symlinks to its own (the
converter pads the vocabulary to config.json's size, so every tensor keeps its shape).

Built here, and only these: pw, pw-cluster, pw-router, pw-prefill, pw-decode, pw-broker,
pw-quantize, pw-bench-engine, pw-loadgen (in --build, default build/). Made once and reused
under --work (default build/vs-llama-cpp): the model directory, GGUF bf16 (llama.cpp's
converter; the two edits this checkpoint needs are made in this process, not in LLAMA_DIR: an
unknown pre-tokenizer hash is taken as gpt-2, and a key written twice with the same value is
written once), Q4_K_M (or --quant4's type, e.g. MXFP4_MOE for gpt_oss) and Q8_0
(llama-quantize), and the any-precision store (`pw serve --bits 4` builds it into --work/store).

In-process, each round: pw-bench-engine --same-prompts at batch 1, 8, 32 (bf16 held as `pw serve --bits 16`'s
decode worker holds it, --dense16: packed losslessly where the CPU has AVX512-BF16; and 4-bit
experts with the dense matrices of --dense4, by default ap4 with an ap6 lm_head as Q4_K_M holds
Q4_K attention and a Q6_K output (an int8 lm_head without AVX-512 VBMI), beside Q4_K_M or --quant4) beside llama-bench tg (batch 1) and
llama-batched-bench -fa (batch 8, 32); 8-bit beside Q8_0 at batch 1; prefill of one prompt of
64, 512 and 2048 tokens (bf16, and 4-bit beside --quant4) beside llama-bench pp. Served, each round: `pw serve --bits 16` /
`--bits 4 --max-bits 4 --dense ap4 --lm-head ap6` (--dense4) beside `llama-server -t T -np 32 -cb` on the bf16 /
Q4_K_M (--quant4) GGUF, each loaded by the same client (pw-loadgen --dataset-name random, 64 tokens in, 128 out,
--ignore-eos, --request-rate inf, --max-concurrency 1/8/32, --token-count auto). Ours and llama.cpp's alternate within every round (A B A B over the
rounds), so a shared machine's load falls on both. Each round's figures and each ratio's median,
min and max are printed, with the CPU (lscpu) and the load average before and after each part.

Served in pairs (--parts served-pairs): a one-stream figure taken minutes apart compares two
moments of a host whose memory rate moves (docs/benchmarks.md, "Decode steps beside a read of
their bytes"), so here both servers of a width are up at once, idle between requests, and
--pairs times one request of 64 tokens in and 128 out goes to each in turn (the order swapped
every pair, each server warmed by one request first); the table gives each pair's ratio, its
median, min and max, and each side's median output tok/s.

Before the rounds every file either side maps (the checkpoint's safetensors, the GGUFs, the
store) is dropped from the page cache and read back once (--keep-page-cache: not), so both
sides map the same kind of pages: a file cached as it was written is held in 4 KiB pages, one
read back is held in large folios (2 MiB where the kernel's readahead makes them), and the same
engine's prefill moved by about 7 % between the two (docs/benchmarks.md, "Page-cache state").
/proc/meminfo's FileHugePages before and after is printed.
"""
import argparse
import glob
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PW_TARGETS = ["pw", "pw-cluster", "pw-router", "pw-prefill", "pw-decode", "pw-broker", "pw-quantize",
              "pw-bench-engine", "pw-loadgen"]
LLAMA_TARGETS = ["llama-server", "llama-bench", "llama-batched-bench", "llama-quantize"]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]

# llama.cpp's converter run in this process, with the two edits this checkpoint needs.
CONVERT = r"""
import sys
llama_dir = sys.argv.pop(1)
sys.path.insert(0, llama_dir + "/gguf-py")
sys.path.insert(0, llama_dir)
import gguf
import convert_hf_to_gguf as c
try:  # llama.cpp of 2026: the model classes live in its conversion package
    from conversion.base import TextModel as base
except ImportError:
    base = getattr(c, "TextModel", None) or c.Model
known_pre = base.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return known_pre(self, tokenizer)
    except NotImplementedError:
        print("bench_vs_llama_cpp: pre-tokenizer hash not in the converter's list, taken as gpt-2", file=sys.stderr)
        return "gpt-2"
base.get_vocab_base_pre = get_vocab_base_pre
add_key_value = gguf.GGUFWriter.add_key_value
def add_key_value_once(self, key, val, vtype, *rest, **kw):
    for kv in self.kv_data:
        if key in kv and kv[key].value == val:
            return
    return add_key_value(self, key, val, vtype, *rest, **kw)
gguf.GGUFWriter.add_key_value = add_key_value_once
sys.argv[0] = llama_dir + "/convert_hf_to_gguf.py"
c.main()
"""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    return open("/proc/loadavg").read().split()[0]


def run(cmd, **kw):
    log("+ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def out_of(cmd, env=None):
    log("+ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_vs_llama_cpp: {cmd[0]} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout + p.stderr


def lscpu():
    """lscpu's fields, by name."""
    info = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        k, _, v = line.partition(":")
        info[k.strip()] = v.strip()
    return info


def cpu_description():
    info = lscpu()
    flags = set(info.get("Flags", "").split())
    simd = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512vbmi",
                        "amx_bf16", "amx_int8", "avx_vnni"] if f in flags]
    mem = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem = int(line.split()[1]) // (1024 * 1024)
    return (f"{info.get('Model name', '?')} (family {info.get('CPU family', '?')}, model {info.get('Model', '?')}), "
            f"{info.get('CPU(s)', '?')} CPUs "
            f"({info.get('Thread(s) per core', '?')} thread(s) per core), L2 {info.get('L2 cache', '?')}, "
            f"L3 {info.get('L3 cache', '?')}, {mem} GiB, "
            f"SIMD: {' '.join(simd) or 'none of avx2/avx512'}; hypervisor: {info.get('Hypervisor vendor', 'none')}")


# ---- builds and conversions (each skipped when its output exists) ----

def file_huge_pages_kib():
    for line in open("/proc/meminfo"):
        if line.startswith("FileHugePages:"):
            return int(line.split()[1])
    return -1


def refresh_page_cache(paths):
    """Drops each file's clean pages from the page cache and reads it back sequentially."""
    before = file_huge_pages_kib()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while os.read(fd, 8 << 20):
                pass
        finally:
            os.close(fd)
    log(f"page cache: {len(paths)} files dropped and read back; FileHugePages {before} -> "
        f"{file_huge_pages_kib()} KiB")


def build_project(build):
    if not os.path.exists(os.path.join(build, "CMakeCache.txt")):
        run(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release"], stdout=subprocess.DEVNULL)
    run(["nice", "-n", "5", "cmake", "--build", build, "-j", "2", "--target"] + PW_TARGETS)


def build_llama(llama_dir, llama_build):
    if all(os.access(os.path.join(llama_build, "bin", t), os.X_OK) for t in LLAMA_TARGETS):
        return
    if not os.path.exists(os.path.join(llama_build, "CMakeCache.txt")):
        run(["cmake", "-S", llama_dir, "-B", llama_build, "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
             "-DLLAMA_CURL=OFF"], stdout=subprocess.DEVNULL)
    run(["nice", "-n", "5", "cmake", "--build", llama_build, "-j", "2", "--target"] + LLAMA_TARGETS)


def model_dir(args):
    """The checkpoint itself when it has a tokenizer, else a directory of symlinks beside --tokenizer's files."""
    if os.path.exists(os.path.join(args.checkpoint, "tokenizer.json")):
        return args.checkpoint
    d = os.path.join(args.work, "model")
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(args.checkpoint):
        link = os.path.join(d, name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(os.path.join(args.checkpoint, name)), link)
    for name in TOKENIZER_FILES:
        src = os.path.join(args.tokenizer, name)
        link = os.path.join(d, name)
        if os.path.exists(src) and not os.path.lexists(link):
            os.symlink(os.path.abspath(src), link)
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        sys.exit(f"bench_vs_llama_cpp: {args.checkpoint} has no tokenizer.json and {args.tokenizer} neither")
    return d


def ggufs(args, llama_build, mdir):
    out = {}
    bf16 = os.path.join(args.work, "model-bf16.gguf")
    if not os.path.exists(bf16):
        tmp = bf16 + ".part"
        run([args.python, "-c", CONVERT, os.path.abspath(args.llama_cpp), mdir, "--outtype", "bf16", "--outfile", tmp])
        os.rename(tmp, bf16)
    out["bf16"] = bf16
    for q in [args.quant4, "Q8_0"]:
        path = os.path.join(args.work, f"model-{q}.gguf")
        if not os.path.exists(path):
            run([os.path.join(llama_build, "bin", "llama-quantize"), bf16, path + ".part", q],
                stdout=subprocess.DEVNULL)
            os.rename(path + ".part", path)
        out[q] = path
    return out


# ---- servers ----

def wait_healthy(port, proc, what, deadline_s):
    end = time.time() + deadline_s
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"bench_vs_llama_cpp: {what} exited {proc.returncode} before it was healthy (log above)")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    stop(proc)
    sys.exit(f"bench_vs_llama_cpp: {what} not healthy after {deadline_s} s")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def dense4(args):
    """(--dense, --lm-head) of the 4-bit rows from --dense4 DENSE[:LM_HEAD]. auto: ap4 with an ap6
    lm_head where the any-precision fast path runs 6 bits at speed (AVX-512 with VNNI, VBMI and
    GFNI), else ap4 with an int8 lm_head (on AVX2 a 6-bit lookup costs more shuffles than the
    bytes it saves: docs/benchmarks.md, "Dense matrices below 8 bits")."""
    if args.dense4 == "auto":
        flags = set(lscpu().get("Flags", "").split())
        fast6 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi", "gfni"} <= flags
        return ("ap4", "ap6") if fast6 else ("ap4", "int8")
    dense, _, lm_head = args.dense4.partition(":")
    return dense, lm_head or "dense"


def dense16(args):
    """--dense of the bf16 rows: --dense16, or for auto what `pw serve --bits 16` picks (bf16-packed
    where the CPU has AVX512-BF16, services/serve/serve.h ServeDense; bf16 otherwise)."""
    if args.dense16 != "auto":
        return args.dense16
    with open("/proc/cpuinfo") as f:
        return "bf16-packed" if " avx512_bf16" in f.read() else "bf16"


def engine16(args):
    """pw-bench-engine's flags for the bf16 rows as the served decode worker runs them: --dense16's
    dense matrices and, with bf16-packed, the experts packed as its bf16_experts: auto does."""
    d = dense16(args)
    return ["--dense", d] + (["--bf16-experts", "packed"] if d == "bf16-packed" else [])


def dense4_name(args):
    dense, lm_head = dense4(args)
    return f"{dense} dense" + ("" if lm_head == "dense" else f" + {lm_head} lm_head")


def start_ours(args, mdir, bits, port, logf):
    cmd = [os.path.join(args.build, "bin", "pw"), "serve", mdir, "--bits", str(bits), "--port", str(port),
           "--memory", args.memory, "--store-dir", os.path.join(args.work, "store"),
           "--served-model-name", "model"]
    if bits < 16:  # the width held (the planner may not raise it: equal bits) and the dense weights
        dense, lm_head = dense4(args)
        cmd += ["--max-bits", str(bits), "--dense", dense, "--lm-head", lm_head]
    else:
        cmd += ["--dense", dense16(args)]
    log("+ " + " ".join(cmd))
    return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)


def start_llama(args, llama_build, gguf_path, port, logf):
    cmd = [os.path.join(llama_build, "bin", "llama-server"), "-m", gguf_path, "-t", str(args.threads),
           "-np", "32", "-cb", "-c", "8192", "--host", "127.0.0.1", "--port", str(port)]
    log("+ " + " ".join(cmd))
    return subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)


def loadgen(args, port, c, result_dir, name, prompts=None, warmups=1):
    """Output tok/s of pw-loadgen at concurrency c (64 tokens in, 128 out): `prompts` requests
    (default: --prompts-c1 at one stream, else max(c, --prompts-min)) after `warmups` others."""
    n = prompts or (args.prompts_c1 if c == 1 else max(c, args.prompts_min))
    cmd = [os.path.join(args.build, "bin", "pw-loadgen"), "--base-url", f"http://127.0.0.1:{port}",
           "--model", "model", "--dataset-name", "random", "--random-input-len", "64",
           "--random-output-len", "128", "--random-token-max", str(args.token_max), "--ignore-eos",
           "--request-rate", "inf", "--max-concurrency", str(c), "--num-prompts", str(n),
           "--num-warmups", str(warmups), "--token-count", "auto", "--quiet", "--save-result",
           "--result-dir", result_dir, "--result-filename", name]
    out_of(cmd)
    r = json.load(open(os.path.join(result_dir, name)))
    if r.get("completed", n) != n:
        sys.exit(f"bench_vs_llama_cpp: {name}: {r.get('completed')} of {n} requests completed")
    return r["output_throughput"]


def served_point(args, label, starter, port, rdir):
    """One server up, pw-loadgen at each concurrency, down: {C: output tok/s}."""
    logf = open(os.path.join(rdir, f"{label}.log"), "w")
    t0 = time.time()
    proc = starter(port, logf)
    try:
        wait_healthy(port, proc, label, args.start_timeout)
        log(f"  {label} healthy after {time.time() - t0:.0f} s")
        res = {}
        for c in args.streams:
            res[c] = loadgen(args, port, c, rdir, f"{label}-c{c}.json")
            log(f"  {label} C={c}: {res[c]:.1f} output tok/s (load {loadavg()})")
        return res
    finally:
        stop(proc)
        logf.close()


def served_pairs(args, width, ours_starter, llama_starter, rdir):
    """Both servers of a width up at once; --pairs one-stream requests to each in turn, the order
    swapped every pair: [(ours tok/s, llama-server tok/s)]."""
    procs, pairs = [], []
    try:
        for k, (label, starter) in enumerate([(f"pairs-ours-{width}", ours_starter),
                                              (f"pairs-llama-{width}", llama_starter)]):
            logf = open(os.path.join(rdir, f"{label}.log"), "w")
            proc = starter(args.port + 10 + k, logf)
            procs.append((proc, logf))
            wait_healthy(args.port + 10 + k, proc, label, args.start_timeout)
        ours_port, llama_port = args.port + 10, args.port + 11
        for port, side in ((ours_port, "ours"), (llama_port, "llama")):
            loadgen(args, port, 1, rdir, f"pairs-{side}-{width}-warmup.json", prompts=1, warmups=1)
        for i in range(args.pairs):
            order = [("ours", ours_port), ("llama", llama_port)]
            if i % 2:
                order.reverse()
            got = {side: loadgen(args, port, 1, rdir, f"pairs-{side}-{width}-{i}.json", prompts=1, warmups=0)
                   for side, port in order}
            pairs.append((got["ours"], got["llama"]))
            log(f"  pair {i + 1} {width}: {got['ours']:.1f} / {got['llama']:.1f} output tok/s "
                f"(load {loadavg()})")
        return pairs
    finally:
        for proc, logf in procs:
            stop(proc)
            logf.close()


# ---- in-process ----

def engine_rows(text):
    """The 'Wall clock:' table of pw-bench-engine: [(batch, prefill tok/s, decode tok/s)]."""
    rows = []
    part = text.split("Wall clock:", 1)[1].split("Per CPU second", 1)[0]
    for line in part.splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) < 5 or not cells[-1].replace(".", "").isdigit():
            continue
        if cells[1].isdigit():     # model | batch | prefill | decode | ...
            rows.append((int(cells[1]), float(cells[2]), float(cells[3])))
        elif cells[2].isdigit():   # model | experts | batch | prefill | decode | ...
            rows.append((int(cells[2]), float(cells[3]), float(cells[4])))
    if not rows:
        sys.exit("bench_vs_llama_cpp: no rows in pw-bench-engine's output:\n" + text[-2000:])
    return rows


def ours_engine(args, mdir, extra, env_extra=None):
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [os.path.join(args.build, "bin", "pw-bench-engine"), "--model", mdir, "--threads", str(args.threads),
           "--runs", "1", "--warmups", "1", "--bw-passes", "1", "--bw-streams", "4", "--bw-gib", "0.5"] + extra
    return engine_rows(out_of(cmd, env=env))


def llama_bench(args, llama_build, gguf_path, p, n):
    cmd = [os.path.join(llama_build, "bin", "llama-bench"), "-m", gguf_path, "-t", str(args.threads),
           "-p", p, "-n", n, "-r", "1", "-o", "json"]
    text = out_of(cmd)
    data = json.loads(text[text.index("["):text.rindex("]") + 1])
    return {(d["n_prompt"], d["n_gen"]): d["avg_ts"] for d in data}


def flash_attn_args(binary):
    """Flash attention on: a bare -fa before llama.cpp's 2025 releases, -fa on|off|auto after."""
    usage = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
    return ["-fa", "on"] if "[on|off|auto]" in usage else ["-fa"]


def llama_batched(args, llama_build, gguf_path, npl):
    binary = os.path.join(llama_build, "bin", "llama-batched-bench")
    cmd = [binary, "-m", gguf_path, "-t", str(args.threads), "-npp", "64", "-ntg", "16",
           "-npl", ",".join(map(str, npl)), "-c", "4096"] + flash_attn_args(binary) + [
           "--output-format", "jsonl"]
    res = {}
    for line in out_of(cmd).splitlines():
        if line.startswith('{"n_kv_max"'):
            d = json.loads(line)
            res[d["pl"]] = d["speed_tg"]
    return res


def decode_round(args, mdir, llama_build, g, store):
    """One round of decode, ours then llama.cpp's for each pair: {row name: (ours, llama.cpp)}."""
    r = {}
    ours = ours_engine(args, mdir, ["--same-prompts", "--batches", "1,8,32", "--prompt-len", "64"] +
                       engine16(args))
    lb = llama_bench(args, llama_build, g["bf16"], "0", "32")
    lbb = llama_batched(args, llama_build, g["bf16"], [8, 32])
    by_batch = {b: d for b, _, d in ours}
    r["decode batch 1, bf16 / bf16"] = (by_batch[1], lb[(0, 32)])
    r["decode batch 8, bf16 / bf16"] = (by_batch[8], lbb[8])
    r["decode batch 32, bf16 / bf16"] = (by_batch[32], lbb[32])
    if store:
        dense, lm_head = dense4(args)
        q = ours_engine(args, mdir, ["--store", store, "--bits", "4", "--dense", dense, "--lm-head", lm_head, "--same-prompts",
                                     "--batches", "1,8,32", "--prompt-len", "64"])
        lq = llama_bench(args, llama_build, g[args.quant4], "0", "32")
        lqb = llama_batched(args, llama_build, g[args.quant4], [8, 32])
        q_by_batch = {b: d for b, _, d in q}
        name = "4-bit experts + " + dense4_name(args)
        r[f"decode batch 1, {name} / {args.quant4}"] = (q_by_batch[1], lq[(0, 32)])
        r[f"decode batch 8, {name} / {args.quant4}"] = (q_by_batch[8], lqb[8])
        r[f"decode batch 32, {name} / {args.quant4}"] = (q_by_batch[32], lqb[32])
        q8 = ours_engine(args, mdir, ["--store", store, "--bits", "8", "--dense", "int8", "--batches", "1"])
        l8 = llama_bench(args, llama_build, g["Q8_0"], "0", "32")
        r["decode batch 1, 8-bit experts + int8 dense / Q8_0"] = (q8[0][2], l8[(0, 32)])
    return r


def prefill_round(args, mdir, llama_build, g, store):
    """One round of prefill (one prompt of each length), ours then llama.cpp's: bf16, and 4-bit
    experts + --dense4's dense matrices beside --quant4 where there is a store."""
    r = {}
    widths = [("bf16", ["--dense", dense16(args)], "bf16")]  # the prefill worker's experts stay as they are
    if store:
        dense, lm_head = dense4(args)
        widths.append(("4-bit experts + " + dense4_name(args),
                       ["--store", store, "--bits", "4", "--dense", dense, "--lm-head", lm_head], args.quant4))
    for name, extra, gguf in widths:
        pre = {}
        for n in args.prefill:
            rows = ours_engine(args, mdir, extra + ["--batches", "1", "--prompt-len", str(n), "--decode-steps", "1"])
            pre[n] = rows[0][1]
        lp = llama_bench(args, llama_build, g[gguf], ",".join(map(str, args.prefill)), "0")
        for n in args.prefill:
            r[f"prefill {n} tokens, {name} / {gguf}"] = (pre[n], lp[(n, 0)])
    return r


# ---- tables ----

def ratio_cell(pairs):
    rs = [a / b for a, b in pairs if b > 0]
    if not rs:
        return "—"
    if len(rs) == 1:
        return f"{rs[0]:.2f}x"
    return f"{statistics.median(rs):.2f}x ({min(rs):.2f}–{max(rs):.2f})"


def print_engine_table(rounds, threads):
    print(f"\nIn-process, tokens/s, {threads} threads (ours: pw-bench-engine; llama.cpp: llama-bench, "
          "llama-batched-bench -fa for batch 8 and 32); ours / llama.cpp per round:\n")
    print("| | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " | ratio, median (min–max) |")
    print("|---|" + "---|" * len(rounds) + "---:|")
    for name in rounds[0]:
        cells = [f"{r[name][0]:.1f} / {r[name][1]:.1f}" for r in rounds]
        print(f"| {name} | " + " | ".join(cells) + f" | {ratio_cell([r[name] for r in rounds])} |")


def print_served_table(rounds, streams, pairs):
    print("\nServed, output tokens/s (pw-loadgen, 64 in / 128 out, --ignore-eos, --request-rate inf, "
          "--token-count auto); ours / llama-server per round:\n")
    head = "| streams |"
    for title in pairs:
        head += f" {title}: rounds | ratio |"
    print(head)
    print("|---:|" + "---|---:|" * len(pairs))
    for c in streams:
        line = f"| {c} |"
        for ours_key, llama_key in pairs.values():
            ps = [(r[ours_key][c], r[llama_key][c]) for r in rounds if ours_key in r and llama_key in r]
            line += " " + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in ps) + f" | {ratio_cell(ps)} |"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (convert_hf_to_gguf.py, gguf-py)")
    ap.add_argument("--llama-build", help="its CPU build directory (default LLAMA_DIR/build)")
    ap.add_argument("--python", required=True, help="the Python that runs llama.cpp's converter")
    ap.add_argument("--checkpoint", required=True, help="Hugging Face checkpoint directory")
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "models", "tiny-moe"),
                    help="tokenizer files for a checkpoint that ships none (default models/tiny-moe)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"), help="the project's build directory")
    ap.add_argument("--work", default=None, help="model directory, GGUFs, store, results (default BUILD/vs-llama-cpp)")
    ap.add_argument("--parts", default="decode,prefill,served",
                    help="comma-separated: decode and prefill (in-process), served")
    ap.add_argument("--quant4", default="Q4_K_M",
                    help="llama-quantize type beside our 4-bit experts (MXFP4_MOE: gpt_oss's own)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds; ours and llama.cpp's alternate in each")
    ap.add_argument("--threads", type=int, default=2, help="threads of pw-bench-engine, llama-bench, llama-server")
    ap.add_argument("--streams", default="1,8,32", help="served concurrencies")
    ap.add_argument("--prefill", default="64,512,2048", help="prefill prompt lengths")
    ap.add_argument("--prompts-c1", type=int, default=3, help="requests at one stream")
    ap.add_argument("--pairs", type=int, default=20, help="served-pairs: one-stream request pairs per width")
    ap.add_argument("--prompts-min", type=int, default=8, help="requests at C > 1: max(C, this)")
    ap.add_argument("--token-max", type=int, default=4095, help="largest random prompt token id")
    ap.add_argument("--memory", default="8G", help="pw serve --memory")
    ap.add_argument("--served-widths", default="bf16,4bit",
                    help="served pairs: bf16 (bf16 / bf16) and/or 4bit (4-bit / --quant4)")
    ap.add_argument("--dense16", default="auto", choices=["auto", "bf16", "bf16-packed"],
                    help="--dense of the bf16 rows, in-process and served; auto: what pw serve --bits 16 picks "
                         "(bf16-packed, the same values packed losslessly, where the CPU has AVX512-BF16)")
    ap.add_argument("--dense4", default="auto",
                    help="DENSE[:LM_HEAD] of the 4-bit rows, in-process and served (--dense, --lm-head: bf16, "
                         "int8, ap3..ap8); auto: ap4:ap6 with AVX-512 VBMI (attention at 4 bits and lm_head at "
                         "6, as Q4_K_M), else ap4:int8")
    ap.add_argument("--port", type=int, default=18600, help="first of the ports the servers use")
    ap.add_argument("--start-timeout", type=int, default=1800, help="seconds a server (or a store build) may take")
    ap.add_argument("--no-build", action="store_true", help="use the binaries as they are")
    ap.add_argument("--keep-page-cache", action="store_true",
                    help="leave the files' pages as they are cached (default: dropped and read back)")
    args = ap.parse_args()
    args.work = args.work or os.path.join(args.build, "vs-llama-cpp")
    args.streams = [int(x) for x in args.streams.split(",")]
    args.served_widths = set(args.served_widths.split(","))
    if not args.served_widths or not args.served_widths <= {"bf16", "4bit"}:
        sys.exit(f"bench_vs_llama_cpp: --served-widths: bf16 and/or 4bit")
    args.prefill = [int(x) for x in args.prefill.split(",")]
    parts = set(args.parts.split(","))
    if not parts or not parts <= {"decode", "prefill", "served", "served-pairs"}:
        sys.exit(f"bench_vs_llama_cpp: --parts {args.parts}: decode, prefill, served and/or served-pairs")
    if args.pairs < 1:
        sys.exit("bench_vs_llama_cpp: --pairs: at least 1")
    llama_build = args.llama_build or os.path.join(args.llama_cpp, "build")
    if not os.path.exists(os.path.join(args.llama_cpp, "convert_hf_to_gguf.py")):
        sys.exit(f"bench_vs_llama_cpp: {args.llama_cpp}: no convert_hf_to_gguf.py (a llama.cpp source tree?)")
    if not os.path.exists(os.path.join(args.checkpoint, "config.json")):
        sys.exit(f"bench_vs_llama_cpp: {args.checkpoint}: no config.json")
    os.makedirs(args.work, exist_ok=True)

    if not args.no_build:
        build_project(args.build)
        build_llama(args.llama_cpp, llama_build)
    mdir = model_dir(args)
    g = ggufs(args, llama_build, mdir)
    stores = glob.glob(os.path.join(args.work, "store", "**", "*.apw"), recursive=True)
    if not stores:
        log("building the any-precision store (pw serve --bits 4, stopped once healthy)")
        rdir = tempfile.mkdtemp(dir=args.work)
        proc = start_ours(args, mdir, 4, args.port, open(os.path.join(rdir, "store-build.log"), "w"))
        wait_healthy(args.port, proc, "pw serve --bits 4", args.start_timeout)
        stop(proc)
        stores = glob.glob(os.path.join(args.work, "store", "**", "*.apw"), recursive=True)
    store = stores[0] if stores else None
    if not args.keep_page_cache:
        mapped = sorted({os.path.realpath(p) for p in glob.glob(os.path.join(mdir, "*.safetensors"))} |
                        set(g.values()) | ({store} if store else set()))
        refresh_page_cache(mapped)

    commit = "?"
    if os.path.exists(os.path.join(args.llama_cpp, ".git")):
        commit = subprocess.run(["git", "-C", args.llama_cpp, "rev-parse", "--short=8", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "?"
    elif os.path.exists(os.path.join(args.llama_cpp, "COMMIT")):
        commit = open(os.path.join(args.llama_cpp, "COMMIT")).read().strip()[:8]
    ours_commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=7", "HEAD"],
                                 capture_output=True, text=True).stdout.strip()
    print(f"CPU: {cpu_description()}")
    print(f"PagedWeight {ours_commit}; llama.cpp {commit} ({llama_build}); checkpoint {args.checkpoint}; "
          f"{args.threads} threads; {args.rounds} rounds, ours and llama.cpp's alternating")
    print(f"GGUFs: {', '.join(os.path.basename(p) for p in g.values())}; store: {store}")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    rdir = os.path.join(args.work, "results-" + stamp)
    os.makedirs(rdir)
    engine_b1 = []
    if parts & {"decode", "prefill"}:
        rounds, loads = [], []
        t0 = time.strftime("%H:%M:%S", time.gmtime())
        for i in range(args.rounds):
            la = loadavg()
            r = {}
            if "decode" in parts:
                r.update(decode_round(args, mdir, llama_build, g, store))
            if "prefill" in parts:
                r.update(prefill_round(args, mdir, llama_build, g, store))
            rounds.append(r)
            loads.append(f"{la} -> {loadavg()}")
            print(f"in-process round {i + 1} (load {loads[-1]}): " +
                  "; ".join(f"{k} {a:.1f} / {b:.1f}" for k, (a, b) in r.items()), flush=True)
        print(f"\nIn-process rounds {t0}–{time.strftime('%H:%M:%S', time.gmtime())} UTC, "
              f"load average per round: {'; '.join(loads)}")
        print_engine_table(rounds, args.threads)
        if "decode" in parts:
            engine_b1 = [r["decode batch 1, bf16 / bf16"][0] for r in rounds]
        sys.stdout.flush()
    if "served" in parts:
        rounds, loads = [], []
        t0 = time.strftime("%H:%M:%S", time.gmtime())
        servers = [
            ("ours-bf16", lambda port, f: start_ours(args, mdir, 16, port, f)),
            ("llama-bf16", lambda port, f: start_llama(args, llama_build, g["bf16"], port, f)),
            ("ours-4bit", lambda port, f: start_ours(args, mdir, 4, port, f)),
            ("llama-4bit", lambda port, f: start_llama(args, llama_build, g[args.quant4], port, f)),
        ]
        servers = [s for s in servers if s[0].split("-")[1] in args.served_widths]
        for i in range(args.rounds):
            la = loadavg()
            r = {}
            for k, (label, starter) in enumerate(servers):
                r[label] = served_point(args, f"r{i + 1}-{label}", starter, args.port + k, rdir)
                print(f"served round {i + 1}, {label} (load {loadavg()}): " +
                      ", ".join(f"C={c} {v:.1f}" for c, v in r[label].items()) + " output tok/s", flush=True)
            rounds.append(r)
            loads.append(f"{la} -> {loadavg()}")
        print(f"\nServed rounds {t0}–{time.strftime('%H:%M:%S', time.gmtime())} UTC, "
              f"load average per round: {'; '.join(loads)}")
        pairs = {"bf16 / bf16": ("ours-bf16", "llama-bf16"), f"4-bit / {args.quant4}": ("ours-4bit", "llama-4bit")}
        print_served_table(rounds, args.streams,
                           {t: k for t, k in pairs.items() if k[0].split("-")[1] in args.served_widths})
        if engine_b1 and 1 in args.streams and "bf16" in args.served_widths:
            served = [r["ours-bf16"][1] for r in rounds]
            print(f"\nServed at one stream / the engine's own batch-1 decode (bf16, medians): "
                  f"{statistics.median(served):.1f} / {statistics.median(engine_b1):.1f} = "
                  f"{statistics.median(served) / statistics.median(engine_b1):.2f} (target >= 0.90)")
    if "served-pairs" in parts:
        t0 = time.strftime("%H:%M:%S", time.gmtime())
        la = loadavg()
        starters = {
            "bf16": (lambda port, f: start_ours(args, mdir, 16, port, f),
                     lambda port, f: start_llama(args, llama_build, g["bf16"], port, f)),
            "4bit": (lambda port, f: start_ours(args, mdir, 4, port, f),
                     lambda port, f: start_llama(args, llama_build, g[args.quant4], port, f)),
        }
        results = {w: served_pairs(args, w, *starters[w], rdir)
                   for w in ("bf16", "4bit") if w in args.served_widths}
        print(f"\nServed in pairs {t0}–{time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
              f"{la} -> {loadavg()}: one stream, one request (64 in, 128 out) to each server in turn, "
              f"{args.pairs} pairs a width, both servers up:\n")
        print("| width | ours, median tok/s | llama-server, median tok/s | ours / llama-server a pair: median (min–max) |")
        print("|---|---:|---:|---:|")
        names = {"bf16": "bf16 / bf16", "4bit": f"4-bit / {args.quant4}"}
        for w, ps in results.items():
            print(f"| {names[w]} | {statistics.median(a for a, _ in ps):.1f} | "
                  f"{statistics.median(b for _, b in ps):.1f} | {ratio_cell(ps)} |")
    print(f"\nraw results: {rdir}")


if __name__ == "__main__":
    main()
