#!/usr/bin/env python3
"""Trains the embedded model, models/tiny-moe: tokenizer first, then a qwen3_moe from scratch.

Stages (run in the venv made by `make venv`):
  tokenizer  byte-level BPE (vocab 4096) on the training corpus of tools/corpus.py, written to
             OUT/tokenizer.json and OUT/tokenizer_config.json.
  model      a Qwen3MoeForCausalLM trained from a fixed seed on the tokenized corpus, saved in
             bf16 to OUT/config.json and OUT/model.safetensors; the loss is logged to a CSV.

  .venv/bin/python tools/train_tiny_moe.py tokenizer --corpus corpus/train.txt --out models/tiny-moe
  .venv/bin/python tools/train_tiny_moe.py model --corpus corpus/train.txt --out models/tiny-moe \
      --seed 1234 --steps N --log runs/loss.csv
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


def Main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stage", choices=["tokenizer", "model"])
    parser.add_argument("--corpus", default="corpus/train.txt")
    parser.add_argument("--out", default="models/tiny-moe")
    args = parser.parse_args(argv)
    if args.stage == "tokenizer":
        TrainTokenizer(args.corpus, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
