#!/usr/bin/env python3
"""Trains the embedded model, models/tiny-moe: tokenizer first, then a qwen3_moe from scratch.

Stages (run in the venv made by `make venv`):
  tokenizer  byte-level BPE (vocab 4096) on the training corpus of tools/corpus.py, written to
             OUT/tokenizer.json and OUT/tokenizer_config.json.
  model      a Qwen3MoeForCausalLM trained from a fixed seed on the tokenized corpus, saved in
             bf16 to OUT/config.json and OUT/model.safetensors; the loss is logged to a CSV.

  .venv/bin/python tools/train_tiny_moe.py tokenizer --corpus corpus/train.txt --out models/tiny-moe
  .venv/bin/python tools/train_tiny_moe.py model --corpus corpus/train.txt --out models/tiny-moe \
      --seed 1234 --steps 1500 --threads 1 --log runs/loss.csv
"""

import argparse
import json
import math
import os
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
MODEL_CONFIG = dict(
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


def TrainModel(args):
    import numpy as np
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if args.moe_impl == "grouped":
        modeling_qwen3_moe.Qwen3MoeSparseMoeBlock.forward = GroupedMoeForward

    t0 = time.time()
    tokens = TokenizeCorpus(args.corpus, os.path.join(args.out, "tokenizer.json"))
    n_blocks = (tokens.numel() - 1) // args.seq
    print(f"corpus: {tokens.numel()} tokens, {n_blocks} blocks of {args.seq} "
          f"(tokenized in {time.time() - t0:.1f}s)", flush=True)
    blocks = tokens[: n_blocks * args.seq].view(n_blocks, args.seq)
    gen = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(n_blocks, generator=gen)

    config = Qwen3MoeConfig(**MODEL_CONFIG)
    model = Qwen3MoeForCausalLM(config)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params} parameters", flush=True)

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

    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    log = open(args.log, "w", encoding="utf-8")
    log.write("step,lm_loss,aux_loss,lr,elapsed_s\n")
    t_start = time.time()
    cursor = 0
    for step in range(args.steps):
        if cursor + args.batch > n_blocks:
            cursor = 0
        idx = order[cursor:cursor + args.batch]
        cursor += args.batch
        batch = blocks[idx]
        for g in opt.param_groups:
            g["lr"] = LrAt(step)
        out = model(input_ids=batch, labels=batch, output_router_logits=True)
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
    log.close()
    wall = time.time() - t_start
    print(f"trained {args.steps} steps in {wall:.0f}s", flush=True)
    if args.steps_only:
        return
    model.config.output_router_logits = False
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"saved to {args.out}", flush=True)


def Main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["tokenizer", "model"])
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
    parser.add_argument("--steps-only", action="store_true",
                        help="train and log but do not save (for timing)")
    args = parser.parse_args(argv)
    if args.stage == "tokenizer":
        TrainTokenizer(args.corpus, args.out)
    else:
        TrainModel(args)
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
