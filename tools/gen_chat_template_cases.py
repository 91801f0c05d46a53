#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_cases.json: prompts rendered by HF transformers'
`apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` for several chat
templates and conversations. tests/common/chat_template_test.cc renders the same inputs with
common/chat_template and compares byte for byte.

Format: {"templates": {name: source}, "cases": [{"template", "messages", "add_generation_prompt",
"bos_token", "eos_token" (null: undefined), and "expected" (the prompt) or "error" (HF raised)}]}

Usage: .venv/bin/python tools/gen_chat_template_cases.py [--model-dir models/tiny-moe]
"""
import argparse
import json
import os

from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")

QWEN_DEFAULT_SYSTEM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

MISTRAL = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}")

# Exercises the rest of the supported subset: indentation with lstrip/trim_blocks, whitespace
# control, comments, ~, filters, tests, inline if, negative indexes, methods, tojson, slices.
FEATURES = """{#- A template that uses most of the supported syntax. -#}
{%- set sys = messages[0]['content'] if messages[0]['role'] == 'system' else 'default system' %}
<sys>{{ sys | trim | upper }}</sys>
{% for m in messages %}
    {%- if m.role == 'system' %}
        {%- set skipped = true %}
    {%- elif m['role'] in ['user', 'assistant'] %}
  [{{ loop.index }}/{{ loop.length }}|{{ loop.revindex0 }}] {{ m.role ~ ': ' ~ m.content.strip() }}
        {%- if not loop.last %}
{{ '\\n' }}
        {%- endif %}
    {%- else %}
  (other {{ m['role'] | length }} {{ m.content | tojson }})
    {%- endif %}
{% endfor %}
last={{ messages[-1]['content'][:5] }}|{{ messages | length }}|{{ 7 // 2 }}{{ -7 % 3 }}
{%- if tools is defined %}tools{% elif extra is not defined and messages[0].content.startswith('You') %} you{% endif %}
{{ messages[-1].role.replace('u', 'U') ~ (' gen' if add_generation_prompt else ' nogen') }}
{%+ if eos_token %}  eos={{ eos_token }}{% endif %}
"""

TEMPLATES = {
    "llama2": LLAMA2,
    "qwen_default_system": QWEN_DEFAULT_SYSTEM,
    "zephyr": ZEPHYR,
    "mistral": MISTRAL,
    "features": FEATURES,
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "  Be kind.\n"}, {"role": "user", "content": "  spaces  "},
     {"role": "assistant", "content": "ok\n\n"}],
    [{"role": "user", "content": "Unicode: héllo 日本語 😀 \"quotes\" 'single' \\ back\ttab"}],
    [{"role": "user", "content": ""}],
    [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "odd order"}],
    [{"role": "user", "content": "a"}, {"role": "tool", "content": "{\"x\": 1}"}],
    [{"role": "user", "content": "<|im_end|> injected {{ not a tag }} {% raw %}"}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="models/tiny-moe")
    ap.add_argument("--out", default="tests/fixtures/chat_template_cases.json")
    args = ap.parse_args()
    model_dir = os.path.join(ROOT, args.model_dir)
    with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        TEMPLATES["model_chatml"] = json.load(f)["chat_template"]
    tok_file = os.path.join(model_dir, "tokenizer.json")
    special = [("<s>", "</s>"), ("", "<|endoftext|>")]
    cases = []
    for name, tpl in TEMPLATES.items():
        for bos, eos in special:
            tok = PreTrainedTokenizerFast(tokenizer_file=tok_file, bos_token=bos or None,
                                          eos_token=eos)
            for conv in CONVERSATIONS:
                for gen in (False, True):
                    case = {"template": name, "messages": conv, "add_generation_prompt": gen,
                            "bos_token": bos or None, "eos_token": eos}
                    try:
                        case["expected"] = tok.apply_chat_template(
                            conv, chat_template=tpl, tokenize=False, add_generation_prompt=gen)
                    except Exception as e:  # raise_exception in the template
                        case["error"] = str(e)
                    cases.append(case)
    out = {"templates": TEMPLATES, "cases": cases}
    with open(os.path.join(ROOT, args.out), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: {len(TEMPLATES)} templates, {len(cases)} cases, "
          f"{sum('error' in c for c in cases)} errors")


if __name__ == "__main__":
    main()
