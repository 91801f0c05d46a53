#!/usr/bin/env python3
"""Trains the small models on the Debian corpus: the embedded model, models/tiny-moe (a qwen3_moe),
and tiny-next (a qwen3_next with 512 experts), tokenizer first, then the model from scratch.

Stages:
  tokenizer  byte-level BPE (vocab 4096) on the training corpus of tools/corpus.py, written to
             OUT/tokenizer.json and OUT/tokenizer_config.json.
  model      a model of --arch trained from a fixed seed on the tokenized corpus, saved in
             bf16 to OUT/config.json and OUT/model.safetensors; the loss is logged to a CSV.
             --tokenizer-from DIR copies DIR's tokenizer into OUT first (tiny-next reuses
             tiny-moe's).
  heldout    teacher-forced held-out perplexity of the saved model OUT by HF's own forward
             (float32 from the bf16 weights, eager attention), by the windowing rule of
             tools/make_fixtures.py (pw-eval ppl's); --nll-out writes "<window> <nll>" per
             prediction, as `pw-eval ppl --nll-out` does, for tools/compare_nll.py.
  check-moe  the training-time MoE forward of --arch against HF's own on a small random batch:
             prints the largest absolute difference of outputs and gradients, fails above 1e-5.

  --arch qwen3_moe (the embedded model; the venv made by `make venv`, transformers 4.x):
  .venv/bin/python tools/train_tiny_moe.py tokenizer --corpus corpus/train.txt --out models/tiny-moe
  .venv/bin/python tools/train_tiny_moe.py model --corpus corpus/train.txt --out models/tiny-moe \
      --seed 1234 --steps 1500 --threads 1 --log runs/loss.csv
  --arch qwen3_next (tiny-next; transformers >= 5, whose experts are stacked 3-D tensors):
  python tools/train_tiny_moe.py model --arch qwen3_next --tokenizer-from models/tiny-moe \
      --corpus corpus/train.txt --out build/tiny-next --seed 1234 --steps 1500 --threads 1
"""

import argparse
import json
import math
import os
import shutil
import sys
import time

DOC_SEPARATOR = "<|endoftext|>"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 4096

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def ReadDocs(corpus_path):
    with open(corpus_path, "r", encoding="utf-8") as f:
        text = f.read()
    docs = [d for d in text.split(DOC_SEPARATOR) if d]
    if not docs:
        raise SystemExit(f"{corpus_path}: no documents")
    return docs


# ---------------------------------------------------------------------------------------------
# tokenizer


def TrainTokenizer(corpus_path, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    docs = ReadDocs(corpus_path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    for i, s in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(s) != i:
            raise SystemExit(f"special token {s} got id {tok.token_to_id(s)}, expected {i}")
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"vocab size {tok.get_vocab_size()}, expected {VOCAB_SIZE}")
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(SPECIAL_TOKENS)
        },
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print(f"tokenizer: vocab {tok.get_vocab_size()} written to {out_dir}")


# ---------------------------------------------------------------------------------------------
# model

# Architecture of the embedded model (qwen3_moe). Every layer is sparse.
QWEN3_MOE_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=512,          # unused: no dense MLP layers (mlp_only_layers empty)
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=32,
    num_experts_per_tok=4,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    use_sliding_window=False,
    tie_word_embeddings=False,
    output_router_logits=True,
    router_aux_loss_coef=0.01,
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
    initializer_range=0.02,
)


# Architecture of tiny-next (qwen3_next): Qwen3-Next-80B-A3B's layout scaled to hidden 128. Its
# ratios are kept where they matter to the serving system: 512 routed experts top-10 plus a
# sigmoid-gated shared expert in every layer, expert width hidden/4 (512 of 2048 there), shared
# expert width hidden; three Gated DeltaNet layers then one output-gated full-attention layer
# (full_attention_interval 4); linear attention with twice as many value heads as key heads
# (16/32 there), key width = hidden; full attention 4 query / 2 KV heads, partial rotary 0.25.
QWEN3_NEXT_CONFIG = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=128,
    intermediate_size=512,          # unused: no dense MLP layers (mlp_only_layers empty)
    moe_intermediate_size=32,
    shared_expert_intermediate_size=128,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=4,
    linear_num_value_heads=8,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=512,
    num_experts_per_tok=10,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    max_position_embeddings=2048,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.25),
    rms_norm_eps=1e-6,
    hidden_act="silu",
    attention_bias=False,
    tie_word_embeddings=False,
    output_router_logits=True,
    router_aux_loss_coef=0.01,
    bos_token_id=None,
    eos_token_id=0,
    pad_token_id=0,
    initializer_range=0.02,
)


def GroupedMoeForward(self, hidden_states):
    """Training-time forward of Qwen3MoeSparseMoeBlock with the same math as HF's.

    hidden_states: [B, S, H]. Returns ([B, S, H], router_logits [B*S, E]). Routing is
    computed exactly as in HF (softmax in fp32, top-k, renormalised when norm_topk_prob);
    the assignments are then sorted by expert once, so each expert runs on one contiguous
    slice and the outputs are scattered back with a single index_add.
    """
    import torch
    import torch.nn.functional as F

    batch, seq, hidden = hidden_states.shape
    x = hidden_states.reshape(-1, hidden)
    router_logits = self.gate(x)
    weights = F.softmax(router_logits, dim=1, dtype=torch.float)
    weights, experts = torch.topk(weights, self.top_k, dim=-1)
    if self.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    flat_experts = experts.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    token_of = order // self.top_k
    sorted_weights = weights.reshape(-1)[order]
    counts = torch.bincount(flat_experts, minlength=self.num_experts).tolist()
    xs = x.index_select(0, token_of)
    outs = []
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        outs.append(self.experts[e](xs[start:start + n]))
        start += n
    y = torch.cat(outs, dim=0) * sorted_weights[:, None]
    out = torch.zeros_like(x).index_add_(0, token_of, y)
    return out.reshape(batch, seq, hidden), router_logits


def BatchedExpertsForward(self, hidden_states, top_k_index, top_k_weights):
    """Training-time forward of transformers 5's stacked experts (Qwen3NextExperts: gate_up_proj
    [E, 2I, H], down_proj [E, H, I]) with the same math as HF's per-expert loop.

    hidden_states [T, H], top_k_index / top_k_weights [T, k] (the router's choices and
    renormalised weights). A loop over 512 experts costs more than their arithmetic, so the
    T*k assignments are sorted by expert once and cut into rows of C = ceil(T*k / E) slots,
    each row holding one expert's assignments (an expert with n assignments gets ceil(n / C)
    rows, the last one padded with zeros): at most 2*E rows whatever the routing, and padding at
    most one row per expert. Two torch.bmm over the rows, each with its expert's weights
    gathered, then one index_add back to the tokens.
    """
    import torch

    tokens, hidden = hidden_states.shape
    k = top_k_index.shape[1]
    n = tokens * k
    num_experts = self.num_experts
    flat = top_k_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    token_of = order // k
    weights = top_k_weights.reshape(-1)[order]
    counts = torch.bincount(flat, minlength=num_experts)
    cap = max(1, -(-n // num_experts))
    rows_of = (counts + cap - 1) // cap
    n_rows = int(rows_of.sum())
    row_expert = torch.repeat_interleave(torch.arange(num_experts), rows_of)
    first = torch.cumsum(counts, 0) - counts
    first_row = torch.cumsum(rows_of, 0) - rows_of
    pos = torch.arange(n) - first[sorted_experts]
    slot = (first_row[sorted_experts] + pos // cap) * cap + pos % cap
    x = hidden_states.new_zeros(n_rows * cap, hidden).index_copy(
        0, slot, hidden_states.index_select(0, token_of)).view(n_rows, cap, hidden)
    gate_up = torch.bmm(x, self.gate_up_proj.index_select(0, row_expert).transpose(1, 2))
    gate, up = gate_up.chunk(2, dim=-1)
    y = torch.bmm(self.act_fn(gate) * up, self.down_proj.index_select(0, row_expert).transpose(1, 2))
    y = y.reshape(n_rows * cap, hidden).index_select(0, slot) * weights[:, None]
    return torch.zeros_like(hidden_states).index_add_(0, token_of, y.to(hidden_states.dtype))


class Arch:
    """One trainable architecture: its HF config and model classes, its config values and
    the training-time MoE forward it installs for --moe-impl grouped."""

    def __init__(self, name):
        import transformers

        self.name = name
        self.patch_error = None
        major = int(transformers.__version__.split(".")[0])
        if name == "qwen3_moe":
            from transformers.models.qwen3_moe import modeling_qwen3_moe

            self.config_class = transformers.Qwen3MoeConfig
            self.model_class = transformers.Qwen3MoeForCausalLM
            self.values = QWEN3_MOE_CONFIG
            if major >= 5:
                self.patch_error = ("--arch qwen3_moe: the grouped forward is written for "
                                    f"transformers 4.x (found {transformers.__version__}); use "
                                    "the venv of `make venv` or --moe-impl hf")
            self.patch = (modeling_qwen3_moe.Qwen3MoeSparseMoeBlock, "forward", GroupedMoeForward)
        elif name == "qwen3_next":
            if major < 5:
                raise SystemExit("--arch qwen3_next needs transformers >= 5 (stacked expert "
                                 f"tensors); found {transformers.__version__}")
            from transformers.models.qwen3_next import modeling_qwen3_next

            self.config_class = transformers.Qwen3NextConfig
            self.model_class = transformers.Qwen3NextForCausalLM
            self.values = QWEN3_NEXT_CONFIG
            self.patch = (modeling_qwen3_next.Qwen3NextExperts, "forward", BatchedExpertsForward)
        else:
            raise SystemExit(f"unknown --arch {name}")

    def InstallGroupedForward(self):
        if self.patch_error:
            raise SystemExit(self.patch_error)
        cls, attr, fn = self.patch
        setattr(cls, attr, fn)

    def Config(self):
        return self.config_class(**self.values)


def CheckMoe(args):
    """HF's MoE block forward against the grouped one, on one layer of --arch's config with
    random weights and a small batch whose routing leaves some experts empty and gives others
    several rows. Compares the outputs and the gradients of every parameter and the input."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    arch = Arch(args.arch)
    if arch.patch_error:
        raise SystemExit(arch.patch_error)
    config = arch.Config()
    model = arch.model_class(config)
    block = model.model.layers[0].mlp
    cls, attr, fn = arch.patch
    hf_forward = getattr(cls, attr)
    x = torch.randn(2, 40, config.hidden_size)
    # Concentrate the routing so some experts get several rows of the grouped forward.
    with torch.no_grad():
        w = block.gate.weight if hasattr(block.gate, "weight") else None
        if w is not None:
            w.mul_(20.0)
    with torch.no_grad():
        logits = block.gate(x.reshape(-1, config.hidden_size))
        logits = logits[0] if isinstance(logits, tuple) else logits
        chosen = torch.topk(logits, config.num_experts_per_tok, dim=-1).indices
        counts = torch.bincount(chosen.reshape(-1), minlength=config.num_experts)
    cap = -(-chosen.numel() // config.num_experts)
    results = []
    for forward in (hf_forward, fn):
        setattr(cls, attr, forward)
        xi = x.clone().requires_grad_(True)
        block.zero_grad(set_to_none=True)
        out = block(xi)
        y = out[0] if isinstance(out, tuple) else out
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads = {n: p.grad.clone() for n, p in block.named_parameters() if p.grad is not None}
        results.append((y.detach(), xi.grad.clone(), grads))
    setattr(cls, attr, hf_forward)
    (y0, gx0, g0), (y1, gx1, g1) = results
    diff_out = (y0 - y1).abs().max().item()
    diff_grad = max([(gx0 - gx1).abs().max().item()] +
                    [(g0[n] - g1[n]).abs().max().item() for n in g0])
    if set(g0) != set(g1):
        raise SystemExit(f"check-moe: gradients of {sorted(set(g0) ^ set(g1))} differ in presence")
    print(f"check-moe {args.arch}: {x.shape[0] * x.shape[1]} tokens, "
          f"{config.num_experts} experts top-{config.num_experts_per_tok} "
          f"({int((counts == 0).sum())} unused, busiest {int(counts.max())} assignments, "
          f"{int(((counts + cap - 1) // cap).sum())} rows of {cap}): "
          f"max |out diff| {diff_out:.3e} (|out| max {y0.abs().max().item():.3e}), "
          f"max |grad diff| {diff_grad:.3e}")
    if diff_out > 1e-5 or diff_grad > 1e-5:
        raise SystemExit("check-moe: the grouped forward differs from HF's")


def CopyTokenizer(src_dir, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(src_dir, name)
        if not os.path.exists(src):
            raise SystemExit(f"--tokenizer-from: {src} does not exist")
        shutil.copyfile(src, os.path.join(out_dir, name))


def TokenizeCorpus(corpus_path, tokenizer_path):
    """Returns a 1-D int64 tensor: every training document's ids followed by id 0."""
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_path)
    docs = ReadDocs(corpus_path)
    pieces = []
    batch = 512
    for i in range(0, len(docs), batch):
        for enc in tok.encode_batch(docs[i:i + batch], add_special_tokens=False):
            pieces.append(np.asarray(enc.ids, dtype=np.int64))
            pieces.append(np.zeros(1, dtype=np.int64))
    return torch.from_numpy(np.concatenate(pieces))

# What must match between a run and the run it resumes: anything that changes the data order,
# the model or the schedule.
RESUME_KEYS = ("arch", "seed", "steps", "batch", "seq", "lr", "warmup", "weight_decay",
               "moe_impl", "corpus")


def SaveTrainState(path, args, model, opt, next_step, cursor, elapsed):
    """Everything a resumed run needs to continue as if it had not stopped, written to a
    temporary file and renamed, so a run killed while saving keeps the previous state."""
    import torch

    state = {"next_step": next_step, "cursor": cursor, "elapsed": elapsed,
             "args": {k: getattr(args, k) for k in RESUME_KEYS},
             "model": model.state_dict(), "optimizer": opt.state_dict(),
             "rng": torch.get_rng_state()}
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def LoadTrainState(path, args, model, opt):
    import torch

    state = torch.load(path, weights_only=False)
    saved = state["args"]
    for k in RESUME_KEYS:
        if saved.get(k) != getattr(args, k):
            raise SystemExit(f"--resume: {path} was written with --{k.replace('_', '-')} "
                             f"{saved.get(k)!r}, this run has {getattr(args, k)!r}")
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return state["next_step"], state["cursor"], state["elapsed"]


def OpenLossLog(path, first_step):
    """The loss CSV: a new file for a fresh run; for a resumed one, the rows before first_step
    kept (a row after the last saved state was logged by the run that stopped) and appended to."""
    header = "step,lm_loss,aux_loss,lr,elapsed_s\n"
    if first_step == 0 or not os.path.exists(path):
        log = open(path, "w", encoding="utf-8")
        log.write(header)
        return log
    with open(path, "r", encoding="utf-8") as f:
        rows = f.readlines()[1:]
    kept = [r for r in rows if r.strip() and int(r.split(",")[0]) < first_step]
    log = open(path, "w", encoding="utf-8")
    log.write(header + "".join(kept))
    return log


def TrainModel(args):
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    arch = Arch(args.arch)
    if args.moe_impl == "grouped":
        arch.InstallGroupedForward()
    if args.tokenizer_from:
        CopyTokenizer(args.tokenizer_from, args.out)

    t0 = time.time()
    tokens = TokenizeCorpus(args.corpus, os.path.join(args.out, "tokenizer.json"))
    n_blocks = (tokens.numel() - 1) // args.seq
    print(f"corpus: {tokens.numel()} tokens, {n_blocks} blocks of {args.seq} "
          f"(tokenized in {time.time() - t0:.1f}s)", flush=True)
    blocks = tokens[: n_blocks * args.seq].view(n_blocks, args.seq)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n_blocks, generator=gen)

    config = arch.Config()
    model = arch.model_class(config)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.arch}, {n_params} parameters ({2 * n_params / 1e6:.1f} MB in bf16)",
          flush=True)

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = max(1, min(args.warmup, args.steps // 10))

    def LrAt(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        t = (step - warmup) / max(1, args.steps - warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    state_path = os.path.join(args.out, "train-state.pt")
    first_step, cursor, elapsed_before = 0, 0, 0.0
    if args.resume and os.path.exists(state_path):
        first_step, cursor, elapsed_before = LoadTrainState(state_path, args, model, opt)
        print(f"resumed from {state_path} at step {first_step} ({elapsed_before:.0f}s trained)",
              flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    log = OpenLossLog(args.log, first_step)
    t_start = time.time() - elapsed_before
    for step in range(first_step, args.steps):
        if cursor + args.batch > n_blocks:
            cursor = 0
        idx = order[cursor:cursor + args.batch]
        cursor += args.batch
        batch = blocks[idx]
        for g in opt.param_groups:
            g["lr"] = LrAt(step)
        out = model(input_ids=batch, labels=batch, output_router_logits=True, use_cache=False)
        lm_loss = out.loss - config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            elapsed = time.time() - t_start
            log.write(f"{step},{lm_loss.item():.4f},{out.aux_loss.item():.4f},"
                      f"{LrAt(step):.6f},{elapsed:.1f}\n")
            log.flush()
            print(f"step {step} lm_loss {lm_loss.item():.4f} aux {out.aux_loss.item():.4f} "
                  f"lr {LrAt(step):.2e} {elapsed:.1f}s ({elapsed / (step + 1):.2f}s/step)",
                  flush=True)
        if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 \
                and step + 1 < args.steps:
            SaveTrainState(state_path, args, model, opt, step + 1, cursor,
                           time.time() - t_start)
    log.close()
    wall = time.time() - t_start
    print(f"trained {args.steps} steps in {wall:.0f}s", flush=True)
    if not args.steps_only:
        model.config.output_router_logits = False
        model = model.to(torch.bfloat16)
        model.save_pretrained(args.out, safe_serialization=True)
        print(f"saved to {args.out}", flush=True)
    # Only now: a run killed while saving still resumes from its last state.
    if os.path.exists(state_path):
        os.remove(state_path)


def HeldOut(args):
    """HF's held-out perplexity of the model in --out (tools/make_fixtures.py's rule). Windows
    of equal length run together (no padding, so each is still scored alone)."""
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_fixtures as mf
    from tokenizers import Tokenizer

    torch.set_num_threads(args.threads)
    model = mf.LoadReference(args.out)
    tok = Tokenizer.from_file(os.path.join(args.out, "tokenizer.json"))
    with open(args.heldout, "r", encoding="utf-8") as f:
        ids = tok.encode(f.read(), add_special_tokens=False).ids
    windows = mf.HeldOutWindows(ids, args.ctx)
    nll = [None] * len(windows)
    t0 = time.time()
    with torch.no_grad():
        i = 0
        while i < len(windows):
            j = i
            while j < len(windows) and j - i < 16 and len(windows[j]) == len(windows[i]):
                j += 1
            batch = torch.tensor(windows[i:j])
            logits = model(input_ids=batch, use_cache=False).logits[:, :-1].double()
            logp = torch.log_softmax(logits, dim=-1)
            picked = -logp.gather(2, batch[:, 1:, None])[..., 0]
            for w in range(i, j):
                nll[w] = picked[w - i].tolist()
            i = j
    n_tokens = sum(len(x) for x in nll)
    nll_sum = sum(sum(x) for x in nll)
    print(f"heldout {args.out}: {len(ids)} ids, {len(windows)} windows of {args.ctx}, "
          f"{n_tokens} predictions, nll_sum {nll_sum:.2f}, ppl {math.exp(nll_sum / n_tokens):.4f} "
          f"({time.time() - t0:.0f}s)", flush=True)
    if args.nll_out:
        with open(args.nll_out, "w", encoding="ascii") as f:
            for w, values in enumerate(nll):
                for v in values:
                    f.write(f"{w} {v:.9g}\n")


def Main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["tokenizer", "model", "check-moe", "heldout"])
    parser.add_argument("--arch", choices=["qwen3_moe", "qwen3_next"], default="qwen3_moe",
                        help="qwen3_moe: tiny-moe; qwen3_next: tiny-next (512 experts)")
    parser.add_argument("--tokenizer-from", default="",
                        help="copy tokenizer.json and tokenizer_config.json from this model "
                             "directory into --out before training")
    parser.add_argument("--corpus", default="corpus/train.txt")
    parser.add_argument("--out", default="models/tiny-moe")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument("--warmup", type=int, default=50, help="linear warmup steps")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (results are reproducible for a fixed value)")
    parser.add_argument("--moe-impl", choices=["hf", "grouped"], default="grouped",
                        help="training-time MoE forward (same math; grouped is faster)")
    parser.add_argument("--log", default="runs/loss.csv", help="loss curve CSV")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--heldout", default="build/eval/heldout.txt",
                        help="heldout: the evaluation text (make eval-data)")
    parser.add_argument("--ctx", type=int, default=256, help="heldout: window length")
    parser.add_argument("--nll-out", default="", help="heldout: per-prediction NLL file")
    parser.add_argument("--checkpoint-every", type=int, default=50,
                        help="model: save the training state to OUT/train-state.pt every N "
                             "steps (0: never); removed when the run ends")
    parser.add_argument("--resume", action="store_true",
                        help="model: continue from OUT/train-state.pt when it exists")
    parser.add_argument("--steps-only", action="store_true",
                        help="train and log but do not save (for timing)")
    args = parser.parse_args(argv)
    if args.stage == "tokenizer":
        TrainTokenizer(args.corpus, args.out)
    elif args.stage == "check-moe":
        CheckMoe(args)
    elif args.stage == "heldout":
        HeldOut(args)
    else:
        TrainModel(args)
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
