#!/usr/bin/env python3
"""Writes the reference fixtures the C++ tests compare against, from HF tokenizers/transformers.

Run in the venv made by `make venv`. Subcommands:
  tokenizer   tests/fixtures/tokenizer_cases.json: [{"text", "ids", "decoded"}], ids from the
              HF tokenizer of models/tiny-moe (no special tokens added; special tokens written
              inside the text are matched), decoded = decode(ids) with special tokens kept.
  random      tests/fixtures/models/{qwen2_moe,qwen3_moe,olmoe,mixtral}/: tiny random-weight
              checkpoints (bf16) from a fixed seed, and logits.safetensors with p{i}.ids
              (int32 [T]) and p{i}.logits (float32 [T, V]) for prompts of 1, 5 and 40 ids.
  tiny        from models/tiny-moe: tests/fixtures/tiny_logits.safetensors, greedy.json and
              heldout.json (see WriteHeldout for the perplexity rule).
  all         the three above.
  routing     prints expert specialisation by domain on the held-out documents (model card).

References are computed by HF transformers in float32 from the bf16 weights (the upcast is
exact), eager attention, so the C++ engine (bf16 weights, fp32 math) sees identical weights.
"""

import argparse
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
TINY = os.path.join(ROOT, "models", "tiny-moe")

# ---------------------------------------------------------------------------------------------
# tokenizer cases


def TokenizerStrings(heldout_text):
    s = []
    # Empty, single characters, single bytes of each UTF-8 length.
    s += ["", " ", "a", "Z", "0", ".", "\n", "\t", "\r", "'", "\"", "\\", "~", "\x00", "\x7f",
          "é", "ß", "€", "中", "😀", "\u00a0", "\u200b", "\ufeff"]
    # ASCII prose.
    s += [
        "Hello world",
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "In the beginning God created the heaven and the earth.",
        "And God said, Let there be light: and there was light.",
        "A fool and his money are soon parted.",
        "You will be successful in your work.",
        "The functions in the printf() family produce output according to a format.",
        "This manual page describes the Linux programmer's interface.",
        "It was the best of times, it was the worst of times.",
        "To be, or not to be: that is the question.",
        "All work and no play makes Jack a dull boy. " * 3,
        "Mr. Smith went to Washington D.C. on Jan. 5th, 1999.",
        "e-mail, co-operate, state-of-the-art, well-known",
        "UPPER CASE WORDS AND lower case words AND MiXeD CaSe",
        "camelCaseIdentifier snake_case_identifier SCREAMING_SNAKE kebab-case",
    ]
    # Code.
    s += [
        "def foo(x):\n    return x * 2\n",
        "class Foo(Base):\n    \"\"\"Docstring.\"\"\"\n\n    def __init__(self, a, b=None):\n"
        "        self.a = a\n",
        "import os\nimport sys\nfrom collections import OrderedDict\n",
        "for i in range(10):\n\tif i % 2 == 0:\n\t\tprint(i, end='')\n",
        "#include <stdio.h>\n\nint main(int argc, char **argv) {\n  printf(\"%d\\n\", argc);\n"
        "  return 0;\n}\n",
        "#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
        "extern int pthread_mutex_lock (pthread_mutex_t *__mutex) __THROWNL __nonnull ((1));",
        "typedef unsigned long long int uint64_t;",
        "struct stat { dev_t st_dev; ino_t st_ino; };",
        "x += 1; y -= 2; z *= 3; w /= 4; v %= 5; u <<= 6; t >>= 7;",
        "if (a && b || !c) { return -1; } else if (a != b) { x = a->b.c[0]; }",
        "lambda x, *args, **kwargs: {k: v for k, v in kwargs.items() if v is not None}",
        "print(f\"{name!r:>10} = {value:.3f}\")",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
        "$ ls -la /usr/share/man | grep '^d' > out.txt 2>&1 &",
        "0x7fffffff 0XDEADBEEF 0b1010 0o777 1e-9 3.14159f 42ULL",
        "// comment\n/* block\n * comment */\n",
        "    # indented comment\n",
    ]
    # Whitespace runs.
    s += [
        "  ", "   ", "    ", "        ", "                ", "\t\t", "\t\t\t\t", "\n\n",
        "\n\n\n", "\n\n\n\n\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", " \t \n \t ", "\t \t",
        "a  b", "a   b", "a    b", "a\tb", "a\t\tb", "a\nb", "a\n\nb", "a \n b", "a\t\n\tb",
        "trailing space ", "trailing spaces   ", "trailing tab\t", "trailing newline\n",
        "trailing mixed \t\n", "  leading spaces", "\tleading tab", "\nleading newline",
        "word \u00a0 nbsp", "x\u2003y\u2009z", "line1\nline2\n  indented\n\tTabbed\n",
        "end of text.   \n\n\n   ",
    ]
    # Contractions.
    s += [
        "it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "DON'T", "WE'RE",
        "THEY'VE", "I'M", "YOU'LL", "HE'D", "John's book", "JOHN'S BOOK", "'s", "'t", "'re",
        "'ve", "'m", "'ll", "'d", "'S", "'T", "'tis", "rock 'n' roll", "the dogs' bones",
        "can't won't shan't", "I'd've", "o'clock", "'quoted'", "it’s (curly)",
    ]
    # Digits and numbers.
    s += [
        "1", "12", "123", "1234", "12345", "1234567890", "3.14159265358979323846",
        "9999999999999999999999999999", "-42", "+7", "1,000,000", "1.000.000,00", "2026-11-29",
        "12:34:56", "v1.2.3", "192.168.0.1", "$100.00", "50%", "1/2", "10^6", "x2y3z4",
        "Genesis 1:1", "Psalm 23:1-6", "0000", "007",
    ]
    # Punctuation runs.
    s += [
        "!!!", "???", "...", "....", "!?!?", "---", "--", "===", "***", "###", "~~~",
        "<<<>>>", "(((())))", "[[]]", "{{}}", ";;", "::", "->", "=>", "::=", "&&||",
        "!@#$%^&*()_+-=[]{}|;':\",./<>?`~", "...and then?!", "\"quoted\"", "''", "``",
        "--option=value", "/* */", "#!/bin/sh", "@decorator", "a.b.c.d", "__init__",
    ]
    # Unicode.
    s += [
        "café", "naïve résumé", "Zürich", "São Paulo", "Ærøskøbing", "façade", "Ångström",
        "ﬁle ligature", "Ελληνικά γράμματα", "αβγδε", "Привет, мир!", "Москва",
        "مرحبا بالعالم", "שלום עולם", "こんにちは世界", "你好，世界", "中文字符测试",
        "한국어 텍스트", "ภาษาไทย", "हिन्दी", "e\u0301", "a\u0308o\u0308u\u0308",
        "Z\u0351\u0352\u0353algo", "\u0041\u030a", "ǅ ǆ ǈ", "ﬀ ﬃ", "Ω ≈ ç √ ∫ ˜ µ ≤ ≥ ÷",
        "∀x∈ℝ: x²≥0", "½ ¼ ¾ ⅓", "①②③", "™ © ®", "“smart quotes” ‘single’", "— – …",
        "\u2028\u2029", "mixed English and 中文 and Ελληνικά", "ｆｕｌｌｗｉｄｔｈ",
        "\U0001d49c\U0001d4b7", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    ]
    # Emoji.
    s += [
        "😀😃😄", "👍", "👍🏽", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "❤️", "🇺🇸", "🇯🇵🇫🇷", "🇬🇧 flag",
        "I ❤️ Unicode 🎉", "🤷‍♀️", "1️⃣", "©️", "🧑‍🤝‍🧑", "text😀text", " 😀 ", "🐍 python",
    ]
    # Special tokens inside text.
    s += [
        "<|endoftext|>", "<|im_start|>", "<|im_end|>",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
        "<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more text", "a <|endoftext|> b", "<|endoftext|><|endoftext|>",
        "<|im_start|><|im_end|>", "<|im_start", "|im_end|>", "<|endoftext", "< |endoftext| >",
        "<|unknown|>",
    ]
    # Strings from the held-out text: fixed offsets and lengths.
    if heldout_text:
        n = len(heldout_text)
        lengths = [8, 20, 40, 64, 100, 160, 256, 400, 600, 1000]
        for i in range(40):
            start = (i * 7919 * 13) % max(1, n - 1100)
            length = lengths[i % len(lengths)]
            s.append(heldout_text[start:start + length])
    return s


def WriteTokenizerCases(heldout_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    heldout_text = ""
    if heldout_path and os.path.exists(heldout_path):
        with open(heldout_path, "r", encoding="utf-8") as f:
            heldout_text = f.read()
    else:
        raise SystemExit(f"{heldout_path}: held-out text not found (run tools/corpus.py heldout)")
    raw = Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(TINY)
    cases = []
    seen = set()
    for text in TokenizerStrings(heldout_text):
        if text in seen:
            continue
        seen.add(text)
        ids = raw.encode(text, add_special_tokens=False).ids
        ids_hf = hf.encode(text, add_special_tokens=False)
        if ids != ids_hf:
            raise SystemExit(f"tokenizers and transformers disagree on {text!r}")
        decoded = raw.decode(ids, skip_special_tokens=False)
        cases.append({"text": text, "ids": ids, "decoded": decoded})
    if len(cases) < 200:
        raise SystemExit(f"only {len(cases)} tokenizer cases")
    path = os.path.join(FIXTURES, "tokenizer_cases.json")
    os.makedirs(FIXTURES, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        # One case per line keeps diffs readable.
        f.write("[\n" + ",\n".join(json.dumps(c, ensure_ascii=False) for c in cases) + "\n]\n")
    mismatched = sum(1 for c in cases if c["decoded"] != c["text"])
    print(f"tokenizer: {len(cases)} cases written to {path} ({mismatched} not round-tripping)")


# ---------------------------------------------------------------------------------------------
# small random-weight checkpoints, one per supported model type

RANDOM_SEED = 20261129
RANDOM_PROMPT_LENGTHS = [1, 5, 40]


def RandomConfigs():
    """Tiny configs of each supported type. Shapes are deliberately varied: tied and untied
    embeddings, head_dim * heads != hidden (qwen3_moe), odd head dims (olmoe)."""
    from transformers import MixtralConfig, OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common = dict(vocab_size=4096, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  rope_theta=10000.0, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    return {
        "qwen2_moe": Qwen2MoeConfig(
            hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, qkv_bias=True, decoder_sparse_step=1, mlp_only_layers=[],
            use_sliding_window=False, tie_word_embeddings=True, **common),
        "qwen3_moe": Qwen3MoeConfig(
            hidden_size=48, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
            mlp_only_layers=[], use_sliding_window=False, attention_bias=False,
            tie_word_embeddings=False, **common),
        "olmoe": OlmoeConfig(
            hidden_size=48, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, clip_qkv=None, attention_bias=False,
            tie_word_embeddings=False, **common),
        "mixtral": MixtralConfig(
            hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2,
            sliding_window=None, tie_word_embeddings=True, **common),
    }


def RandomizeWeights(model, seed):
    """Fills every parameter from a fixed seed with values large enough that logits, routing
    and norms all matter: matrices N(0, 0.1^2), norm weights 1 + N(0, 0.1^2), biases
    N(0, 0.1^2). Parameters are visited in sorted name order."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name and p.dim() == 1:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)


def LoadReference(model_dir):
    """Loads a bf16 checkpoint as float32 (exact upcast) with eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def ForwardWithMargins(model, ids):
    """Returns (logits [T, V] float32, smallest router top-k margin, smallest top-1 logit
    margin). A router margin is p_k - p_{k+1} of the softmaxed router logits of one token in
    one layer: a tiny margin would make the reference fragile against rounding."""
    import torch

    k = model.config.num_experts_per_tok
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long),
                    output_router_logits=True, use_cache=False)
    logits = out.logits[0].float()
    router_margin = float("inf")
    for rl in out.router_logits:
        probs = torch.softmax(rl.float(), dim=-1)
        top = torch.topk(probs, k + 1, dim=-1).values
        router_margin = min(router_margin, (top[:, k - 1] - top[:, k]).min().item())
    top2 = torch.topk(logits, 2, dim=-1).values
    logit_margin = (top2[:, 0] - top2[:, 1]).min().item()
    return logits, router_margin, logit_margin


def SaveTensors(path, tensors):
    from safetensors.torch import save_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)


def WriteRandomModels():
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    for index, (model_type, config) in enumerate(RandomConfigs().items()):
        out_dir = os.path.join(FIXTURES, "models", model_type)
        os.makedirs(out_dir, exist_ok=True)
        # Try seeds in a fixed order until no router or top-1 decision is a near tie.
        for attempt in range(20):
            seed = RANDOM_SEED + 100 * index + attempt
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
            RandomizeWeights(model, seed)
            model = model.to(torch.bfloat16)
            model.config.output_router_logits = False
            model.save_pretrained(out_dir, safe_serialization=True)
            gen_cfg = os.path.join(out_dir, "generation_config.json")
            if os.path.exists(gen_cfg):
                os.remove(gen_cfg)
            ref = LoadReference(out_dir)
            gen = torch.Generator().manual_seed(seed)
            tensors = {}
            worst_router, worst_logit = float("inf"), float("inf")
            for i, length in enumerate(RANDOM_PROMPT_LENGTHS):
                ids = torch.randint(3, config.vocab_size, (length,), generator=gen).tolist()
                logits, rm, lm = ForwardWithMargins(ref, ids)
                worst_router, worst_logit = min(worst_router, rm), min(worst_logit, lm)
                tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"p{i}.logits"] = logits
            if worst_router > 1e-4 and worst_logit > 1e-3:
                break
            print(f"{model_type}: seed {seed} has a near tie (router {worst_router:.2e}, "
                  f"logit {worst_logit:.2e}); trying the next seed")
        else:
            raise SystemExit(f"{model_type}: no seed without near ties")
        SaveTensors(os.path.join(out_dir, "logits.safetensors"), tensors)
        size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
        print(f"{model_type}: seed {seed}, model.safetensors {size} bytes, min router margin "
              f"{worst_router:.3e}, min top-1 logit margin {worst_logit:.3e}")


# ---------------------------------------------------------------------------------------------
# fixtures of the embedded model

TINY_LOGIT_PROMPTS = [
    "The",
    "In the beginning God created the heaven and the earth.",
    "A journey of a thousand miles begins with a single step.",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"hello\\n\");\n    return 0;\n}\n",
    "def read_config(path):\n    \"\"\"Return the parsed configuration.\"\"\"\n"
    "    with open(path) as f:\n        return json.load(f)\n",
    "NAME\nmmap, munmap - map or unmap files or devices into memory\n\nSYNOPSIS\n"
    "#include <sys/mman.h>\n",
    "<|im_start|>user\nWhat does the fortune say?<|im_end|>\n<|im_start|>assistant\n",
    "Zürich, Москва, 東京 and 👍🏽: unicode in prose.",
]
# One long prompt cut from the held-out text (character offset, target token count).
TINY_LONG_PROMPT = (20000, 200)

GREEDY_PROMPTS = [
    "And it came to pass, when",
    "The LORD is my shepherd;",
    "You will",
    "Q: Why did the programmer quit his job?\nA:",
    "#include <stdlib.h>\n\n",
    "static inline int\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "    for i in range(",
    "DESCRIPTION\nThe",
    "The following options are supported:",
]
GREEDY_NEW_TOKENS = 32

HELDOUT_CTX = 256
HELDOUT_RULE = (
    "Tokenize the whole held-out text with tokenizer.json (no special tokens added). Cut the "
    "ids into consecutive non-overlapping windows of ctx tokens; the last window may be "
    "shorter and is included if it has at least 2 tokens. Each window is scored "
    "independently from an empty cache: within a window, token i (i >= 1) is predicted from "
    "tokens 0..i-1 of that window; position 0 of each window is not predicted. nll_sum is the "
    "sum over all predictions of -log softmax(logits)[target] (natural log, float64 sum); "
    "n_tokens is the number of predictions; ppl = exp(nll_sum / n_tokens).")


def LoadTinyTokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(TINY, "tokenizer.json"))


def Encode(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def WriteTinyLogits(model, tok, heldout_text):
    import torch

    prompts = list(TINY_LOGIT_PROMPTS)
    start, target = TINY_LONG_PROMPT
    ids_long = Encode(tok, heldout_text[start:start + 8 * target])[:target]
    tensors = {}
    report = []
    all_ids = [Encode(tok, p) for p in prompts] + [ids_long]
    for i, ids in enumerate(all_ids):
        if not ids:
            raise SystemExit(f"prompt {i} tokenizes to nothing")
        logits, rm, lm = ForwardWithMargins(model, ids)
        tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"p{i}.logits"] = logits
        report.append(f"p{i}: {len(ids)} ids, router margin {rm:.2e}, top-1 margin {lm:.2e}")
    path = os.path.join(FIXTURES, "tiny_logits.safetensors")
    SaveTensors(path, tensors)
    print(f"tiny logits: {len(all_ids)} prompts written to {path}")
    for line in report:
        print("  " + line)


def GreedyIds(model, ids, n_new):
    """Plain greedy decoding: argmax of the raw logits, full recompute each step, no eos
    stopping, no logits processors. Returns (new ids, smallest top-1 margin)."""
    import torch

    seq = list(ids)
    margin = float("inf")
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            top2 = torch.topk(logits.float(), 2)
            margin = min(margin, (top2.values[0] - top2.values[1]).item())
            seq.append(int(top2.indices[0]))
    return seq[len(ids):], margin


def WriteGreedy(model, tok):
    import torch

    cases = []
    for prompt in GREEDY_PROMPTS:
        ids = Encode(tok, prompt)
        out, margin = GreedyIds(model, ids, GREEDY_NEW_TOKENS)
        # Cross-check with transformers' own generate (cached decoding).
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_NEW_TOKENS,
                                 min_new_tokens=GREEDY_NEW_TOKENS, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
        if gen != out and 0 not in out:
            raise SystemExit(f"greedy mismatch between recompute and generate on {prompt!r}")
        cases.append({"prompt": prompt, "prompt_ids": ids, "output_ids": out,
                      "output_text": tok.decode(out, skip_special_tokens=False),
                      "min_top1_margin": round(margin, 6)})
        print(f"  greedy {prompt!r} -> {tok.decode(out)!r} (min top-1 margin {margin:.2e})")
    path = os.path.join(FIXTURES, "greedy.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"greedy: {len(cases)} prompts written to {path}")


def HeldOutWindows(ids, ctx):
    windows = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    return [w for w in windows if len(w) >= 2]


def CorpusPackageVersions():
    """Versions of the Debian packages tools/corpus.py reads: a held-out text whose sha256
    differs from the fixture's was extracted from other package versions."""
    import subprocess

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import corpus

    packages = sorted(set(["bible-kjv", "bible-kjv-text"] + corpus.FORTUNE_PACKAGES +
                          corpus.MAN_PACKAGES + corpus.C_PACKAGES + corpus.PYTHON_PACKAGES))
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version}\n"] + packages,
                         capture_output=True, text=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def WriteHeldout(model, tok, heldout_path):
    """Teacher-forced perplexity by HELDOUT_RULE, plus routing balance for the model card."""
    import math as _math

    import torch

    with open(heldout_path, "rb") as f:
        data = f.read()
    ids = Encode(tok, data.decode("utf-8"))
    windows = HeldOutWindows(ids, HELDOUT_CTX)
    n_layers = model.config.num_hidden_layers
    n_experts = model.config.num_experts
    k = model.config.num_experts_per_tok
    counts = torch.zeros(n_layers, n_experts, dtype=torch.float64)
    nll_sum = 0.0
    n_tokens = 0
    with torch.no_grad():
        for w in windows:
            out = model(input_ids=torch.tensor([w]), use_cache=False, output_router_logits=True)
            logp = torch.log_softmax(out.logits[0, :-1].double(), dim=-1)
            target = torch.tensor(w[1:])
            nll_sum += -logp.gather(1, target[:, None]).sum().item()
            n_tokens += len(w) - 1
            for layer, rl in enumerate(out.router_logits):
                sel = torch.topk(rl.float(), k, dim=-1).indices.reshape(-1)
                counts[layer] += torch.bincount(sel, minlength=n_experts).double()
    ppl = _math.exp(nll_sum / n_tokens)
    result = {
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "ctx": HELDOUT_CTX,
        "n_windows": len(windows),
        "n_ids": len(ids),
        "n_tokens": n_tokens,
        "nll_sum": nll_sum,
        "ppl": ppl,
        "rule": HELDOUT_RULE,
        "packages": CorpusPackageVersions(),
    }
    path = os.path.join(FIXTURES, "heldout.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"heldout: {len(ids)} ids, {len(windows)} windows, {n_tokens} predictions, "
          f"ppl {ppl:.4f} written to {path}")
    print("routing balance on the held-out text (fraction of assignments per expert):")
    print("| layer | min | max | CV |")
    print("|---|---|---|---|")
    for layer in range(n_layers):
        frac = counts[layer] / counts[layer].sum()
        cv = (frac.std(unbiased=False) / frac.mean()).item()
        print(f"| {layer} | {frac.min().item():.4f} | {frac.max().item():.4f} | {cv:.3f} |")


def WriteTinyFixtures(heldout_path):
    import torch

    torch.set_num_threads(int(os.environ.get("PW_FIXTURE_THREADS", "1")))
    if not os.path.exists(heldout_path):
        raise SystemExit(f"{heldout_path}: held-out text not found (run tools/corpus.py heldout)")
    with open(heldout_path, "r", encoding="utf-8") as f:
        heldout_text = f.read()
    model = LoadReference(TINY)
    tok = LoadTinyTokenizer()
    WriteTinyLogits(model, tok, heldout_text)
    WriteGreedy(model, tok)
    WriteHeldout(model, tok, heldout_path)


def PrintDomainRouting():
    """Expert specialisation by domain on the held-out documents: for each layer and domain,
    the share of the domain's expert assignments that land on its 8 most used experts (1/4
    for uniform routing over 32 experts), and that domain's most used expert."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import corpus

    torch.set_num_threads(int(os.environ.get("PW_FIXTURE_THREADS", "1")))
    model = LoadReference(TINY)
    tok = LoadTinyTokenizer()
    n_layers = model.config.num_hidden_layers
    n_experts = model.config.num_experts
    k = model.config.num_experts_per_tok
    counts = {}
    for name, body, _ in corpus.AllDocs():
        if not corpus.IsHeldOut(name):
            continue
        domain = name.split("/", 1)[0]
        c = counts.setdefault(domain, torch.zeros(n_layers, n_experts, dtype=torch.float64))
        ids = Encode(tok, corpus.CutAtLine(body, corpus.HELDOUT_DOC_CHARS))
        with torch.no_grad():
            for w in HeldOutWindows(ids, HELDOUT_CTX):
                out = model(input_ids=torch.tensor([w]), use_cache=False,
                            output_router_logits=True)
                for layer, rl in enumerate(out.router_logits):
                    sel = torch.topk(rl.float(), k, dim=-1).indices.reshape(-1)
                    c[layer] += torch.bincount(sel, minlength=n_experts).double()
    domains = sorted(counts)
    print("| layer | " + " | ".join(domains) + " |")
    print("|---|" + "---|" * len(domains))
    for layer in range(n_layers):
        cells = []
        for d in domains:
            frac = counts[d][layer] / counts[d][layer].sum()
            top = torch.topk(frac, 8)
            cells.append(f"{top.values.sum().item():.2f} (e{int(top.indices[0])})")
        print(f"| {layer} | " + " | ".join(cells) + " |")


def Main(argv):
    global TINY, FIXTURES
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["tokenizer", "random", "tiny", "all", "routing"])
    parser.add_argument("--heldout", default=os.path.join(ROOT, "build", "eval", "heldout.txt"),
                        help="held-out text written by tools/corpus.py heldout")
    parser.add_argument("--model", default=TINY, help="the embedded model directory")
    parser.add_argument("--fixtures", default=FIXTURES, help="output directory")
    args = parser.parse_args(argv)
    TINY, FIXTURES = args.model, args.fixtures
    if args.what in ("tokenizer", "all"):
        WriteTokenizerCases(args.heldout)
    if args.what in ("random", "all"):
        WriteRandomModels()
    if args.what in ("tiny", "all"):
        WriteTinyFixtures(args.heldout)
    if args.what == "routing":
        PrintDomainRouting()
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
