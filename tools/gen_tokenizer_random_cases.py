#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer_random_cases.json: token ids HF `tokenizers` gives for random
mixed-script strings (fixed seed), for the committed tokenizer and for variants of it that
exercise the other supported configurations (Qwen2 / Llama-3 split patterns, add_prefix_space,
ignore_merges, "a b" merges, added-token flags). tests/common/tokenizer_test.cc applies each
variant's patch to models/tiny-moe/tokenizer.json and compares its own ids with these.

Format: {"tokenizer": path, "seed": int, "variants": [{"name", "patch", "cases": [{"text", "ids"}]}],
         "decode_cases": [{"ids", "skip_special_tokens", "text"}]}
decode_cases are random id sequences (often invalid UTF-8 once concatenated) with HF's decode.
A patch maps a dotted path in tokenizer.json ("pre_tokenizer", "model.ignore_merges") to the
value that replaces it; "+added_tokens" appends to the added_tokens list; "!merges_as_strings"
rewrites model.merges from [a, b] pairs to "a b" strings.

Usage: .venv/bin/python tools/gen_tokenizer_random_cases.py [--tokenizer T] [--out F] [--n N]
"""
import argparse
import copy
import json
import os
import random

from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = QWEN2.replace(r"\p{N}|", r"\p{N}{1,3}|", 1)

# Pools the generator draws fragments from.
POOLS = [
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    list("0123456789"),
    list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    [" ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\x0b", "\x0c", "\x85", "\xa0",
     "\u1680", "\u2003", "\u2028", "\u2029", "\u202f", "\u3000", " \n ", "\t\t\n"],
    list("àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿßœŒĳ"),
    list("αβγδεζηθλμπσφχψωΑΒΓΔΩάέήίόύώ"),
    list("абвгдежзийклмнопрстуфхцчшщъыьэюяАБВГДЖЯ"),
    list("日本語中文字漢字東京大学の一二三人"),
    list("한국어안녕하세요"),
    list("مرحبابالعالم"),
    list("שלוםעולם"),
    list("ภาษาไทย"),
    list("हिन्दीदेवनागरी"),
    ["😀", "🎉", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🤖", "🦀"],
    ["\u0301", "\u0308", "\u200d", "\u200b", "\ufeff", "\u00ad", "\ufffd"],
    list("٠١٢٣٤٥٦٧٨٩½¾²³ⅫⅣ①②"),
    ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "'ſ", "'x", "''", "n't"],
    ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im", "|>", "<|", "<tool>", "wor", "word"],
    ["def ", "return ", "    ", "if (x) {", "}\n", "==", "->", "::", "/*", "*/", "#include",
     "12345", "3.14159", "0x1F", "1e-9", "http://example.com/a?b=c"],
]


# Edge cases every variant also checks, ahead of the random strings.
FIXED = ["", " ", "  ", "   x", "\n", " \n ", "\n\n\n", "a  b", "a\r\n\r\nb", "a \r\n  b",
         "x \t\n y", "1234567", "12 345 6789", "'S'LL'ſ'Re", "don't I'd we'VE", "x'ſ", "''s",
         "\u00a0\u00a0x", "\u3000y", "\u2028z", "\t\t", "end  ", "!!!\n\n", " ?!", "a\u0301b",
         "<|im_end|>  x", "x  <|im_start|>", "  <tool>  y", "a<tool>b", "wor word sword wor_ (wor)",
         "<|im", "<|im<|im_end|>", "<|endoftext|><|endoftext|>", "٣٤٥ ½ Ⅻ", "😀😀 👍🏽",
         "日本語のテキスト", "def f(x):\n    return x  # c\n"]


def random_codepoint(rng):
    while True:
        cp = rng.randrange(0x20, 0x30000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def random_text(rng):
    n = rng.choice([0, 1, 2, 3, 5, 8, 13, 21, 40])
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            parts.append(random_codepoint(rng))
        else:
            pool = rng.choice(POOLS)
            k = rng.choice([1, 1, 2, 3, 6])
            parts.append("".join(rng.choice(pool) for _ in range(k)))
    return "".join(parts)


def apply_patch(tok_json, patch):
    j = copy.deepcopy(tok_json)
    for path, value in patch.items():
        if path == "!merges_as_strings":
            j["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1]
                                    for m in j["model"]["merges"]]
            continue
        if path.startswith("+"):
            j[path[1:]] = j.get(path[1:], []) + value
            continue
        keys = path.split(".")
        node = j
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return j


def variants(tok_json):
    vocab_size = len(tok_json["model"]["vocab"])
    next_id = max([vocab_size] + [t["id"] + 1 for t in tok_json["added_tokens"]])
    split_seq = lambda pat, prefix=False: {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pat}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": False,
             "use_regex": False}]}
    return [
        ("as_committed", {}),
        ("qwen2_split", {"pre_tokenizer": split_seq(QWEN2)}),
        ("llama3_split", {"pre_tokenizer": split_seq(LLAMA3)}),
        ("gpt2_split_prefix_space", {"pre_tokenizer": split_seq(GPT2, prefix=True)}),
        ("bytelevel_prefix_space", {"pre_tokenizer.add_prefix_space": True}),
        ("bytelevel_no_regex", {"pre_tokenizer.use_regex": False}),
        ("ignore_merges_string_merges", {"model.ignore_merges": True,
                                         "!merges_as_strings": True}),
        ("added_token_flags", {"+added_tokens": [
            {"id": next_id, "content": "<tool>", "single_word": False, "lstrip": True,
             "rstrip": True, "normalized": False, "special": True},
            {"id": next_id + 1, "content": "wor", "single_word": True, "lstrip": False,
             "rstrip": False, "normalized": True, "special": False},
            {"id": next_id + 2, "content": "<|im", "single_word": False, "lstrip": False,
             "rstrip": True, "normalized": True, "special": False},
        ]}),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="models/tiny-moe/tokenizer.json")
    ap.add_argument("--out", default="tests/fixtures/tokenizer_random_cases.json")
    ap.add_argument("--n", type=int, default=150, help="random strings per variant")
    ap.add_argument("--seed", type=int, default=20261129)
    args = ap.parse_args()
    path = os.path.join(ROOT, args.tokenizer)
    with open(path, encoding="utf-8") as f:
        tok_json = json.load(f)
    out = {"tokenizer": args.tokenizer, "seed": args.seed, "variants": []}
    for vi, (name, patch) in enumerate(variants(tok_json)):
        tok = Tokenizer.from_str(json.dumps(apply_patch(tok_json, patch)))
        rng = random.Random(args.seed * 1000 + vi)
        cases = []
        for text in FIXED + [random_text(rng) for _ in range(args.n)]:
            cases.append({"text": text, "ids": tok.encode(text).ids})
        out["variants"].append({"name": name, "patch": patch, "cases": cases})
    tok = Tokenizer.from_str(json.dumps(tok_json))
    rng = random.Random(args.seed)
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    out["decode_cases"] = []
    for k in range(args.n):
        ids = [rng.randrange(vocab_size) for _ in range(rng.choice([0, 1, 2, 3, 5, 8, 20]))]
        if k % 3 == 0:  # bias towards single-byte tokens, which split characters
            ids = [tok.token_to_id(tok.id_to_token(i)[:1]) or i for i in ids]
        skip = k % 2 == 1
        out["decode_cases"].append({"ids": ids, "skip_special_tokens": skip,
                                    "text": tok.decode(ids, skip_special_tokens=skip)})
    with open(os.path.join(ROOT, args.out), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out}: {len(out['variants'])} variants x {args.n} strings")


if __name__ == "__main__":
    main()
