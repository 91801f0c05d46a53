#!/usr/bin/env python3
"""The quality-aware planner against static expert widths under one bursty load.

For each mode of --modes, on a fresh node started from --config (deploy/tight-planner.yaml:
the embedded model, a decode page pool too small for 8-bit experts plus the KV a burst needs),
with free ports:
  planner       the config as it is (broker.planner on, decode reserve_wait_ms);
  no-routing    the planner without routing statistics (broker.planner.use_routing false);
  static8       planner off, every block at 8 bits (the store's top width), reservations
                answered at once (decode reserve_wait_ms 0, the default: a burst that does not
                fit is preempted, or refused and retried by the router);
  static8-hold  the same with the config's reserve_wait_ms (a burst queues at the worker);
  static4       planner off, `pw-ctl set-bits 4 --all` before the load, reserve_wait_ms 0;
  ranked        planner off, the damage-ranked map of `pw-quantize plan --avg-bits A` applied
                before the load (A: --ranked-avg-bits, default the planner run's time-weighted
                bits per expert weight from its sampled maps), reserve_wait_ms 0;
  static-mode   broker.planner.static true (the planner runs and never changes a width);
  no-async      broker.planner.async_movement false (widths change only where a request joins
                or leaves the decode batch);
  no-floor      the planner without the backlog bounds: broker.planner.min_bits 3,
                min_mean_bits 0 and decode demand_horizon_tokens 0 (every request's whole
                growth to max_tokens counts);
  floor4        the backlog floor as a per-block floor: min_bits 4, min_mean_bits 0;
  no-residuals  the planner without prompt residuals (broker.planner.use_residuals false);
  no-ceiling    the planner without the mean-width ceiling (broker.planner.max_mean_bits 0:
                between bursts it raises every block to max_bits).
--residuals HEADS (pw-quantize residuals) sets broker.planner.residuals in every planner mode.
--set KEY.PATH=VALUE replaces any config value (before the mode's own changes); --model-dir,
--store, --pool-mb and --page-bytes replace the config's model, store and decode
pool (another model: e.g. the synthetic OLMoE-dimension checkpoint, whose directory needs a
tokenizer.json beside its config.json and model.safetensors; --token-max keeps random prompt
ids below that tokenizer's vocabulary).
then runs pw-loadgen (gamma arrivals, --burstiness) and samples the decode worker's /metrics
every 100 ms (pagedweight_committed_width_mean{layer="all"}, preemptions, held reservations)
and, in the planner modes, `pw-ctl show --block` every --map-every s (the committed width of
every block). Writes OUT/MODE/loadgen.json, OUT/MODE/samples.json, the distinct width maps
seen (OUT/MODE/maps/map-K.json, pw-eval --bits-map format) with their share of the load's
time (OUT/MODE/maps.json), and prints one markdown row per mode. --eval then scores those
maps and the static ones with `pw-eval ppl` and prints the quality rows; --damage instead scores
them with the store's own damage table (sum over blocks of (calibration tokens + 1) * D_i[b_i],
the expected squared output error the quantizer measured; no perplexity, for a model whose
weights are random).
Needs PyYAML (the config) and the Release build (build/bin, build/tiny-moe.apw).
"""
import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pylib"))
from completions import post_completion  # noqa: E402
from localhost import free_port  # noqa: E402
from prom_samples import pick, scrape  # noqa: E402
from pw_ctl import PwCtl  # noqa: E402


class Node:
    """One pw-cluster on free ports from a variant of the config."""

    def __init__(self, a, mode, cfg, out_dir):
        self.a, self.mode, self.out_dir = a, mode, out_dir
        os.makedirs(out_dir, exist_ok=True)
        cfg["run_dir"] = os.path.join(out_dir, "run")
        cfg["bin_dir"] = os.path.abspath(os.path.join(a.build, "bin"))
        cfg["model_dir"] = os.path.abspath(cfg["model_dir"])
        cfg["broker"]["store"] = os.path.abspath(cfg["broker"]["store"])
        self.http = cfg["router"]["port"] = free_port()
        cfg["router"]["control_port"] = free_port()
        self.broker = cfg["broker"]["control_port"] = free_port()
        cfg["broker"]["metrics_port"] = free_port()
        for w in cfg["prefill"]:
            w["metrics_port"] = free_port()
        self.decode_metrics = cfg["decode"][0]["metrics_port"] = free_port()
        self.keys = os.path.join(cfg["run_dir"], "control.keys")
        self.ctl = PwCtl(os.path.join(a.build, "bin", "pw-ctl"), f"tcp://127.0.0.1:{self.broker}", self.keys,
                         label=mode)
        self.yaml = os.path.join(out_dir, "cluster.yaml")
        with open(self.yaml, "w") as f:
            yaml.safe_dump(cfg, f)
        self.proc = None
        self.model_name = cfg.get("model_name", "tiny-moe")

    def __enter__(self):
        log = open(os.path.join(self.out_dir, "pw-cluster.out"), "w")
        self.proc = subprocess.Popen([os.path.join(self.a.build, "bin", "pw-cluster"), "up", "--config", self.yaml],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while post_completion(self.http, {"model": self.model_name, "prompt": [1, 2, 3], "max_tokens": 1},
                              timeout=10)[0] != 200:
            if time.time() - t0 > self.a.start_timeout or self.proc.poll() is not None:
                raise SystemExit(f"{self.mode}: the node did not start serving; see {self.out_dir}")
            time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def block_widths(self):
        rows = re.findall(r"^(\d+)\s+(\d+)\s+(gate_up|down)\s+(\d+)\s+(\d+)\s*$", self.ctl("show", "--block"), re.M)
        return tuple((int(l), int(e), p, int(c)) for l, e, p, _, c in rows)


def variant(a, mode, ranked_map):
    with open(a.config) as f:
        cfg = yaml.safe_load(f)
    planner = cfg["broker"].setdefault("planner", {})
    if a.model_dir:
        cfg["model_dir"] = a.model_dir
    cfg["broker"]["store"] = a.store
    if a.pool_mb:
        cfg["decode"][0]["pool_mb"] = a.pool_mb
    if a.page_bytes >= 0:
        cfg["decode"][0]["page_bytes"] = a.page_bytes
    for item in a.set:  # KEY.PATH=VALUE, list items by index: decode.0.max_batch=64
        path, _, value = item.partition("=")
        keys = path.split(".")
        where = cfg
        for k in keys[:-1]:
            where = where[int(k)] if isinstance(where, list) else where.setdefault(k, {})
        where[int(keys[-1]) if isinstance(where, list) else keys[-1]] = yaml.safe_load(value)
    setup = []
    if mode == "planner":
        pass
    elif mode == "no-routing":
        planner["use_routing"] = False
    elif mode == "static-mode":
        planner["static"] = True
    elif mode == "no-residuals":
        planner["use_residuals"] = False
    elif mode == "no-async":
        planner["async_movement"] = False
    elif mode == "no-floor":
        planner["min_bits"] = 3
        planner["min_mean_bits"] = 0
        cfg["decode"][0]["demand_horizon_tokens"] = 0
    elif mode == "no-ceiling":
        planner["max_mean_bits"] = 0
    elif mode == "floor4":
        planner["min_bits"] = 4
        planner["min_mean_bits"] = 0
    elif mode in ("static8", "static8-hold", "static4", "ranked"):
        planner["enabled"] = False
        if mode in ("static8", "static8-hold"):
            cfg["broker"]["initial_bits"] = 8  # the store's top width, whatever cap the planner has
        if mode != "static8-hold":
            cfg["decode"][0]["reserve_wait_ms"] = 0
        if mode == "static4":
            setup = ["set-bits", "4", "--all"]
        elif mode == "ranked":
            setup = ["apply", ranked_map]
    else:
        raise SystemExit(f"unknown mode {mode}")
    if a.residuals:
        planner["residuals"] = os.path.abspath(a.residuals)
    return cfg, setup


def plan_file(width_map, path):
    """A pw-quantize / pw-eval width map as a pw-ctl plan file (blocks only)."""
    with open(width_map) as f:
        m = json.load(f)
    with open(path, "w") as f:
        json.dump({"blocks": [{"layer": b["layer"], "expert": b["expert"], "proj": b["proj"], "bits": b["bits"]}
                              for b in m["blocks"]]}, f)
    return path


def run_mode(a, mode, ranked_map=None):
    out_dir = os.path.join(a.out, mode)
    cfg, setup = variant(a, mode, ranked_map)
    planned = cfg["broker"]["planner"].get("enabled", False)
    with Node(a, mode, cfg, out_dir) as node:
        if setup:
            if setup[0] == "apply":
                setup = ["apply", plan_file(setup[1], os.path.join(out_dir, "plan.json"))]
            print(f"{mode}: {' '.join(setup)} committed in {node.ctl.wait_committed(node.ctl.change(*setup), timeout=120):.2f} s", flush=True)
        samples, maps = [], []
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                m = scrape(node.decode_metrics)
                samples.append({"t": time.time(),
                                "bits": pick(m, "pagedweight_committed_width_mean", 'layer="all"'),
                                "preemptions": pick(m, "pagedweight_worker_num_preemptions_total"),
                                "held": pick(m, "pagedweight_kv_reservations_held_total", 'outcome="held"'),
                                "waited_out": pick(m, "pagedweight_kv_reservations_held_total", 'outcome="waited_out"'),
                                "kv_pages": pick(m, "pagedweight_pool_pages", 'tenant="kv"'),
                                "free_pages": pick(m, "pagedweight_pool_pages", 'tenant="free"')})
                time.sleep(0.1)

        def map_sampler():
            while not stop.is_set():
                maps.append((time.time(), node.block_widths()))
                stop.wait(a.map_every)

        m0 = scrape(node.decode_metrics)
        threads = [threading.Thread(target=sampler)] + ([threading.Thread(target=map_sampler)] if planned else [])
        for t in threads:
            t.start()
        result = os.path.join(out_dir, "loadgen.json")
        argv = [os.path.join(a.build, "bin", "pw-loadgen"), "--base-url", f"http://127.0.0.1:{node.http}",
                "--model", node.model_name, "--request-rate", str(a.rate), "--burstiness", str(a.burstiness),
                "--duration", str(a.duration), "--random-input-len", str(a.input_len),
                "--random-output-len", str(a.output_len), "--random-range-ratio", str(a.range_ratio),
                "--ignore-eos", "--seed", str(a.seed), "--metric-percentiles", "50,90,99",
                "--request-timeout", "300", "--quiet", "--result-filename", result]
        if a.token_max:
            argv += ["--random-token-max", str(a.token_max)]
        if a.prompt_text:  # prompts cut from a text (the served model's tokenizer) instead of random ids
            argv += ["--dataset-name", "text", "--dataset-path", os.path.abspath(a.prompt_text),
                     "--tokenizer", cfg["model_dir"]]
        t_start = time.time()
        rc = subprocess.run(argv).returncode
        t_end = time.time()
        # After the load: how long until the widths are back at the top (the planner's max_bits).
        top = cfg["broker"]["planner"].get("max_bits", 8)
        recovered = None
        while planned and time.time() - t_end < 30:
            if samples and samples[-1]["bits"] >= top:
                recovered = time.time() - t_end
                break
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join()
        m1 = scrape(node.decode_metrics)
    with open(result) as f:
        s = json.load(f)
    load = [x for x in samples if t_start <= x["t"] <= t_end]
    # Time-weighted mean width over the load (each 100 ms sample weighs the gap to the next).
    tw = sum(x["bits"] * (y["t"] - x["t"]) for x, y in zip(load, load[1:])) / max(1e-9, load[-1]["t"] - load[0]["t"])
    row = {"mode": mode, "rc": rc, "completed": s.get("completed"), "failed": s.get("failed"),
           "output_throughput": s.get("output_throughput"), "request_throughput": s.get("request_throughput"),
           "ttft_p50": s.get("median_ttft_ms"), "ttft_p99": s.get("p99_ttft_ms"),
           "tpot_p50": s.get("median_tpot_ms"), "tpot_p99": s.get("p99_tpot_ms"),
           "bits_min": min(x["bits"] for x in load), "bits_time_weighted": tw,
           "bits_end": samples[-1]["bits"], "recovered_s": recovered,
           "preemptions": pick(m1, "pagedweight_worker_num_preemptions_total") - pick(m0, "pagedweight_worker_num_preemptions_total"),
           "held": pick(m1, "pagedweight_kv_reservations_held_total", 'outcome="held"'),
           "waited_out": pick(m1, "pagedweight_kv_reservations_held_total", 'outcome="waited_out"'),
           "kv_pages_peak": max(x["kv_pages"] for x in load), "load_window_s": t_end - t_start}
    if planned:
        row["weight_bits_time_weighted"] = write_maps(out_dir, [(t, m) for t, m in maps if t_start <= t <= t_end], t_end)
    with open(os.path.join(out_dir, "samples.json"), "w") as f:
        json.dump({"samples": samples, "row": row}, f)
    return row


def write_maps(out_dir, maps, t_end):
    """Distinct committed maps seen during the load, each weighted by the time it held."""
    os.makedirs(os.path.join(out_dir, "maps"), exist_ok=True)
    weights = {}
    for (t, m), nxt in zip(maps, maps[1:] + [(t_end, None)]):
        weights[m] = weights.get(m, 0.0) + (nxt[0] - t)
    total = sum(weights.values())
    index = []
    for k, (m, w) in enumerate(sorted(weights.items(), key=lambda kv: -kv[1])):
        path = os.path.join(out_dir, "maps", f"map-{k}.json")
        with open(path, "w") as f:
            json.dump({"default_bits": 8, "blocks": [{"layer": l, "expert": e, "proj": p, "bits": b}
                                                     for l, e, p, b in m]}, f)
        index.append({"map": path, "share": w / total, "mean_bits": weighted_bits(m)})
    with open(os.path.join(out_dir, "maps.json"), "w") as f:
        json.dump(index, f, indent=1)
    return sum(x["share"] * x["mean_bits"] for x in index)


def weighted_bits(m):
    """Bits per expert weight of a map, weighted by block size (gate_up [2I, H] is twice down [H, I])."""
    size = {"gate_up": 2.0, "down": 1.0}
    return sum(size[p] * b for _, _, p, b in m) / sum(size[p] for _, _, p, _ in m)


def ppl(a, extra, store=True):
    argv = [os.path.join(a.build, "bin", "pw-eval"), "ppl", "--model", a.model, "--text", a.heldout,
            "--ctx", "256", "--threads", "2"] + (["--store", a.store] if store else []) + extra
    out = subprocess.run(argv, capture_output=True, text=True)
    m = re.search(r"^ppl\s+([0-9.]+)", out.stdout, re.M)
    if out.returncode != 0 or not m:
        raise SystemExit(f"{' '.join(argv)}: {out.stderr.strip()[-400:]}")
    return float(m.group(1))


def block_pages(proj, bits, page_bytes=4096, hidden=128, ffn=128):
    """memory::WeightPageTable::PagesFor (planes and int8 LUT); the defaults: the embedded model."""
    rows, cols = (2 * ffn, hidden) if proj == "gate_up" else (hidden, ffn)
    if bits == 0:
        return 0
    plane_tile = page_bytes // (((cols + 255) // 256) * 32)
    return bits * math.ceil(rows / plane_tile) + math.ceil(rows / (page_bytes >> bits))


def map_pages(path):
    with open(path) as f:
        return sum(block_pages(b["proj"], b["bits"]) for b in json.load(f)["blocks"])


def uniform_pages(bits, layers=4, experts=32):
    return layers * experts * (block_pages("gate_up", bits) + block_pages("down", bits))


def map_bits(path):
    with open(path) as f:
        m = json.load(f)
    return weighted_bits([(b["layer"], b["expert"], b["proj"], b["bits"]) for b in m["blocks"]])


def read_store(path):
    """The .apw header's shape and every block's (layer, expert, proj, calib_tokens, damage[0..8])
    (docs/formats.md: header fields at 32.., block table entries of 128 bytes)."""
    import struct
    with open(path, "rb") as f:
        head = f.read(256)
        if head[:8] != b"PWAPW\r\n\x1a":
            raise SystemExit(f"{path}: not an .apw store")
        layers, experts, hidden, ffn, num_blocks, entry_bytes = struct.unpack_from("<6I", head, 32)
        (table_offset,) = struct.unpack_from("<Q", head, 56)
        f.seek(table_offset)
        table = f.read(num_blocks * entry_bytes)
    blocks = {}
    for k in range(num_blocks):
        e = table[k * entry_bytes:(k + 1) * entry_bytes]
        layer, expert, kind = struct.unpack_from("<3I", e, 0)
        (calib,) = struct.unpack_from("<Q", e, 40)
        d = struct.unpack_from("<7d", e, 48)
        damage = [d[0], None, None] + list(d[1:])  # D[0], D[3..8]
        blocks[(layer, expert, "gate_up" if kind == 0 else "down")] = (calib, damage)
    return {"layers": layers, "experts": experts, "hidden": hidden, "ffn": ffn, "blocks": blocks}


def pool_page_bytes(a):
    """The decode pool's page size: the config's page_bytes, or one layer of one 16-token KV block."""
    with open(a.config) as f:
        cfg = yaml.safe_load(f)
    pb = a.page_bytes if a.page_bytes >= 0 else cfg["decode"][0].get("page_bytes", 0)
    if pb:
        return pb
    with open(os.path.join(a.model_dir or cfg["model_dir"], "config.json")) as f:
        mc = json.load(f)
    head_dim = mc.get("head_dim") or mc["hidden_size"] // mc["num_attention_heads"]
    return (2 * mc["num_key_value_heads"] * 16 * head_dim * 2 + 63) // 64 * 64  # bf16 KV


def run_maps(a, mode):
    """The width maps a run of `mode` recorded (its maps.json index), or None if it did not run."""
    index_path = os.path.join(a.out, mode, "maps.json")
    if not os.path.exists(index_path):
        return None
    with open(index_path) as f:
        return json.load(f)


def damage_rows(a):
    """Store-damage rows: each planner mode's maps time-weighted (all of them), the static
    modes' maps, and at the same bits the damage-ranked map and the uniform widths around it."""
    st = read_store(a.store)
    pb = pool_page_bytes(a)

    def score(widths):  # {(layer, expert, proj): bits}, default 8
        dmg = sum((c + 1.0) * d[widths.get(k, 8)] for k, (c, d) in st["blocks"].items())
        bits = weighted_bits([(l, e, p, widths.get((l, e, p), 8)) for l, e, p in st["blocks"]])
        pages = sum(block_pages(p, widths.get((l, e, p), 8), pb, st["hidden"], st["ffn"]) for l, e, p in st["blocks"])
        return dmg, bits, pages

    def load(path):
        with open(path) as f:
            return {(b["layer"], b["expert"], b["proj"]): b["bits"] for b in json.load(f)["blocks"]}

    uniform = {u: score({k: u for k in st["blocks"]}) for u in range(3, 9)}
    rows = []
    for mode in a.modes:
        index = run_maps(a, mode)
        if index is None:
            continue
        dmg = bits = pages = 0.0
        for x in index:
            d, b, p = score(load(x["map"]))
            dmg += x["share"] * d
            bits += x["share"] * b
            pages += x["share"] * p
        rows.append({"what": f"{mode}: time-weighted over its {len(index)} maps", "bits": bits, "pages": pages,
                     "damage": dmg})
        ranked = os.path.join(a.out, mode, f"ranked-{bits:.3f}.json")
        subprocess.run([os.path.join(a.build, "bin", "pw-quantize"), "plan", "--store", a.store,
                        "--avg-bits", f"{bits:.3f}", "--out", ranked], check=True, capture_output=True)
        d, b, p = score(load(ranked))
        rows.append({"what": f"damage-ranked at the {mode} run's mean", "bits": b, "pages": p, "damage": d})
        for u in sorted({max(3, math.floor(bits)), min(8, math.ceil(bits))}):
            d, b, p = uniform[u]
            rows.append({"what": f"uniform {u} bits", "bits": b, "pages": p, "damage": d})
    for u in (4, 8):
        d, b, p = uniform[u]
        rows.append({"what": f"uniform {u} bits" + (" (the store's top width)" if u == 8 else ""), "bits": b,
                     "pages": p, "damage": d})
    with open(os.path.join(a.out, "damage.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


def evaluate(a):
    """Quality rows: each planner run's maps (time-weighted: exp of the share-weighted mean
    log-perplexity over the --max-maps maps that held the most time, shares renormalised), and
    at the same bits per expert weight the damage-ranked map and the uniform widths around it."""
    rows = []
    cache_path = os.path.join(a.out, "ppl-cache.json")  # perplexity per map or width, kept between runs
    done = json.load(open(cache_path)) if os.path.exists(cache_path) else {}

    def once(key, extra):
        if key not in done:
            done[key] = ppl(a, extra)
            with open(cache_path, "w") as f:
                json.dump(done, f)
        return done[key]

    rows.append({"what": "bf16 experts (checkpoint)", "bits": 16, "ppl": done.get("bf16") or ppl(a, [], store=False)})
    done["bf16"] = rows[-1]["ppl"]
    for mode in a.modes:
        index = run_maps(a, mode)
        if index is None:
            continue
        kept = index[: a.max_maps]
        share = sum(x["share"] for x in kept)
        log_ppl, bits = 0.0, 0.0
        for x in kept:
            x["mean_bits"] = map_bits(x["map"])
            x["ppl"] = once(x["map"], ["--bits-map", x["map"]])
            log_ppl += x["share"] / share * math.log(x["ppl"])
            bits += x["share"] / share * x["mean_bits"]
        pages = sum(x["share"] / share * map_pages(x["map"]) for x in kept)
        rows.append({"what": f"{mode}: time-weighted over {len(kept)} of {len(index)} maps ({share:.1%} of the time)",
                     "bits": bits, "pages": pages, "ppl": math.exp(log_ppl), "maps": kept})
        ranked = os.path.join(a.out, mode, f"ranked-{bits:.3f}.json")
        subprocess.run([os.path.join(a.build, "bin", "pw-quantize"), "plan", "--store", a.store,
                        "--avg-bits", f"{bits:.3f}", "--out", ranked], check=True, capture_output=True)
        rows.append({"what": f"damage-ranked at the {mode} run's mean", "bits": map_bits(ranked),
                     "pages": map_pages(ranked), "ppl": once(ranked, ["--bits-map", ranked])})
        for u in sorted({max(3, math.floor(bits)), min(8, math.ceil(bits))}):
            rows.append({"what": f"uniform {u} bits", "bits": u, "pages": uniform_pages(u),
                         "ppl": once(f"u{u}", ["--bits", str(u)])})
    rows.append({"what": "uniform 8 bits (the store's top width)", "bits": 8, "pages": uniform_pages(8),
                 "ppl": once("u8", ["--bits", "8"])})
    with open(os.path.join(a.out, "quality.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="deploy/tight-planner.yaml")
    p.add_argument("--build", default="build")
    p.add_argument("--out", default="build/bench-planner")
    p.add_argument("--modes", default="planner,static8,static4,ranked")
    p.add_argument("--rate", type=float, default=40)
    p.add_argument("--burstiness", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=192)
    p.add_argument("--range-ratio", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--map-every", type=float, default=0.5, help="seconds between pw-ctl show --block samples")
    p.add_argument("--ranked-avg-bits", type=float, default=0, help="0: the planner run's time-weighted mean")
    p.add_argument("--eval", action="store_true", help="score the planner runs' maps with pw-eval ppl")
    p.add_argument("--max-maps", type=int, default=12, help="--eval: the maps holding the most time")
    p.add_argument("--model", default="models/tiny-moe")
    p.add_argument("--store", default="", help="the .apw store (default: the config's broker.store)")
    p.add_argument("--model-dir", default="", help="the checkpoint directory (default: the config's model_dir)")
    p.add_argument("--pool-mb", type=int, default=0, help="the decode page pool in MiB (default: the config's)")
    p.add_argument("--page-bytes", type=int, default=-1, help="the decode pool's page size (default: the config's)")
    p.add_argument("--prompt-text", default="", help="prompts cut from this text instead of random token ids")
    p.add_argument("--token-max", type=int, default=0, help="random prompt token ids below this (0: pw-loadgen's)")
    p.add_argument("--start-timeout", type=float, default=180, help="seconds a node may take to start serving")
    p.add_argument("--set", action="append", default=[],
                   help="KEY.PATH=VALUE: replace one config value in every mode, e.g. broker.planner.low_watermark=0.01")
    p.add_argument("--damage", action="store_true", help="score the runs' maps with the store's damage table")
    p.add_argument("--heldout", default="build/eval/heldout.txt")
    p.add_argument("--residuals", default="", help="prompt residual heads for the planner modes (.pwrh)")
    a = p.parse_args()
    a.modes = a.modes.split(",")
    os.makedirs(a.out, exist_ok=True)
    if not a.store:
        with open(a.config) as f:
            a.store = yaml.safe_load(f)["broker"]["store"]
    a.store = os.path.abspath(a.store)
    if a.model_dir:
        a.model_dir = os.path.abspath(a.model_dir)
    if a.damage:
        rows = damage_rows(a)
        u8 = next(r["damage"] for r in rows if r["what"].startswith("uniform 8"))
        u4 = next(r["damage"] for r in rows if r["what"] == "uniform 4 bits")
        print("| experts | bits per expert weight | pool pages (planes + LUT) | store damage | vs uniform 8 | vs uniform 4 |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['what']} | {r['bits']:.3f} | {r['pages']:.0f} | {r['damage']:.4g} | {r['damage'] / u8:.2f}x | "
                  f"{r['damage'] / u4:.4f}x |", flush=True)
        return
    if a.eval:
        rows = evaluate(a)
        base = rows[0]["ppl"]
        print("| experts | bits per expert weight | pool pages (planes + LUT) | perplexity | vs bf16 |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            pages = f"{r['pages']:.0f}" if "pages" in r else "-"
            print(f"| {r['what']} | {r['bits']:.3f} | {pages} | {r['ppl']:.4f} | {100 * (r['ppl'] / base - 1):+.3f} % |",
                  flush=True)
        return
    rows = []
    for mode in a.modes:
        ranked = None
        if mode == "ranked":
            avg = a.ranked_avg_bits or next((r["weight_bits_time_weighted"] for r in rows if r["mode"] == "planner"), 0)
            if not avg:
                raise SystemExit("ranked: give --ranked-avg-bits or run the planner mode first")
            ranked = os.path.join(a.out, f"ranked-{avg:.3f}.json")
            subprocess.run([os.path.join(a.build, "bin", "pw-quantize"), "plan", "--store", a.store,
                            "--avg-bits", f"{avg:.3f}", "--out", ranked], check=True, capture_output=True)
        load0 = os.getloadavg()[0]
        r = run_mode(a, mode, ranked)
        r["load"] = f"{load0:.2f}->{os.getloadavg()[0]:.2f}"
        rows.append(r)
        print(json.dumps(r), flush=True)
    with open(os.path.join(a.out, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print("| mode | load avg | completed | failed | output tok/s | TTFT p50 | p99 ms | TPOT p50 | p99 ms | "
          "mean bits: min / time-weighted / end | preemptions | held (waited out) | KV pages peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mode']} | {r['load']} | {r['completed']} | {r['failed']} | {r['output_throughput']:.0f} | "
              f"{r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['tpot_p50']:.2f} | {r['tpot_p99']:.2f} | "
              f"{r['bits_min']:.2f} / {r['bits_time_weighted']:.2f} / {r['bits_end']:.2f} | {r['preemptions']:.0f} | "
              f"{r['held']:.0f} ({r['waited_out']:.0f}) | {r['kv_pages_peak']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
