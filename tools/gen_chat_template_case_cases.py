#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_case_cases.json: jinja2's case filters and Python's str
case methods on text beyond ASCII (Latin-1, Latin Extended, Greek with final sigma, Cyrillic,
Cherokee, Georgian, Deseret, Adlam, ligatures, titlecase digraphs, Unicode whitespace), rendered
as HF renders chat templates (jinja2's ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks). tests/common/chat_template_real_test.cc renders the same template and compares.

Format: {"python": version, "template": source (variable `s`), "cases": [[s, expected], ...]}
Usage: /work/venv-hf/bin/python tools/gen_chat_template_case_cases.py
"""
import json
import os
import sys

from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE = ("{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s.title() }}|"
            "{{ s.capitalize() }}|{{ s.upper() }}|{{ s.lower() }}|{{ s is lower }}|{{ s is upper }}")
STRINGS = [
    "straße ﬁx", "ΣΊΣΥΦΟΣ ΟΔΥΣΣΕΥΣ", "ὈΔΥΣΣΕΎΣ", "İstanbul ıi", "ǅemal ǉubljana ǈ", "Привет, МИР ёЁ ґЄ",
    "àÉîõü ÿŸ", "hello-world (foo)[bar]<baz>{qux} x_y", "o'neil mcdonald's", "ﬃ ŉ ǰ ΐ", "Σ", "aΣ", "aΣb",
    "a.Σ", "ÀΣ'", "ΑΣ ΑΣ. ΑΣ1", "123", "abc1", "ABC1", "ǅ", "ß", "\u1e9e", "ʰΣ",
    " a\u00a0b\u2003c\x1cd\u3000e", "ꭰꭱ Ꭰ", "ა ᲐᲑ", "Ⅻ ⅻ ⓐⒶ", "ŉ-ŉ", "𐐨𐐀 𞤢", "",
]


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    t = env.from_string(TEMPLATE)
    out = {"python": sys.version.split()[0], "template": TEMPLATE,
           "cases": [[s, t.render(s=s)] for s in STRINGS]}
    path = os.path.join(ROOT, "tests", "fixtures", "chat_template_case_cases.json")
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(STRINGS)} cases")


if __name__ == "__main__":
    main()
