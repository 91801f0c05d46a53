#!/usr/bin/env python3
"""Writes tests/fixtures/chat_template_real_cases.json: the chat templates real checkpoints ship
(tests/fixtures/chat_templates/*.jinja, sources in the README there) rendered by HF
transformers' `apply_chat_template(..., tokenize=False)` over a set of conversations (system,
user and assistant turns, tools and tool calls, multi-part content, reasoning_content,
add_generation_prompt on and off, continue_final_message, chat_template_kwargs).
tests/common/chat_template_real_test.cc renders the same inputs with common/text/chat_template
and compares byte for byte. Also writes tests/fixtures/chat_tokenize_cases.json: requests for
the router's /tokenize with `messages` and the ids HF's apply_chat_template(..., tokenize=True)
gives with the embedded model's tokenizer, under its own template and under real ones.

transformers renders with jinja2's ImmutableSandboxedEnvironment (trim_blocks, lstrip_blocks,
loopcontrols), tojson = json.dumps(ensure_ascii=False), raise_exception and strftime_now; the
clock behind strftime_now is fixed at NOW so that the fixture is reproducible.

Format: {"now": unix seconds, "bos_token", "eos_token", "templates": {name: file},
"inline_templates": {name: source} (this project's, for features the real ones rarely use),
"conversations": [messages], "tools": [tool schemas], "cases": [{"template", "conversation"
(index), "tools" (index or null), "add_generation_prompt", "continue_final_message", "kwargs"
(extra template variables), and "expected" (the prompt) or "error" (what HF raised)}]}

Usage: .venv/bin/python tools/gen_chat_template_real_cases.py (transformers 5, jinja2 >= 3.1.6)
"""
import argparse
import datetime as dt
import json
import os

import transformers.utils.chat_template_utils as ctu
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEMPLATE_DIR = "tests/fixtures/chat_templates"

# 2025-07-26 09:30:00 UTC: strftime_now renders this instant (naive, as datetime.now()).
NOW = 1753522200


class FixedClock(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return dt.datetime.fromtimestamp(NOW, dt.timezone.utc).replace(tzinfo=None)


ctu.datetime = FixedClock

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "Temperature unit"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "max_results": {"type": "integer", "description": "At most this many"},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [[WEATHER, SEARCH]]

CALL_WEATHER = {"id": "call0abc1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL_SEARCH = {"id": "call1def2", "type": "function",
               "function": {"name": "search", "arguments": {"query": "MoE routing", "max_results": 3}}}

CONVERSATIONS = [
    # 0: one user turn
    [{"role": "user", "content": "Hello!"}],
    # 1: system + user
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"}],
    # 2: several turns
    [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
    # 3: content as a list of parts
    [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                  {"type": "text", "text": " this, briefly."}]}],
    # 4: reasoning_content on an earlier and on the last assistant turn
    [{"role": "user", "content": "Is 7 prime?"},
     {"role": "assistant", "content": "Yes.", "reasoning_content": "7 has no divisors but 1 and 7."},
     {"role": "user", "content": "And 9?"},
     {"role": "assistant", "content": "No.", "reasoning_content": "9 = 3 * 3."}],
    # 5: a tool call, its result, and the answer
    [{"role": "system", "content": "You can call tools."},
     {"role": "user", "content": "Weather in Paris?"},
     {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER]},
     {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather",
      "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
     {"role": "assistant", "content": "It is 21 °C and clear in Paris."}],
    # 6: two parallel tool calls (content None: dropped by HF as a missing key), results pending
    [{"role": "user", "content": "Weather in Paris, and search MoE routing."},
     {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER, CALL_SEARCH]},
     {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather", "content": "sunny"},
     {"role": "tool", "tool_call_id": "call1def2", "name": "search", "content": "3 results"}],
    # 7: text that looks like markup, quotes, unicode, whitespace at the ends
    [{"role": "system", "content": "  Spaces around.\n"},
     {"role": "user", "content": "Unicode: héllo 日本語 😀 \"q\" 'single' \\ back\ttab {{ x }} {% y %}"}],
    # 8: ends with an assistant turn (for continue_final_message)
    [{"role": "user", "content": "Write a haiku."},
     {"role": "assistant", "content": "Autumn moonlight -"}],
    # 9: roles out of order
    [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "odd order"}],
]

# Templates of this project that exercise the Jinja features the real ones use less (or not):
# each is rendered over the same conversations.
FEATURES = {
    "features_loops": """{%- set ns = namespace(n=0, roles=[]) -%}
{%- for m in messages if m.role != 'system' -%}
  {%- if loop.first %}[{{ loop.length }}]{% endif -%}
  {{ loop.cycle('a', 'b', 'c') }}{{ loop.index }}:{{ m.role[:1] | upper }}
  {%- if loop.previtem is defined %}<{{ loop.previtem.role }}{% endif -%}
  {%- if loop.nextitem is defined %}>{{ loop.nextitem.role }}{% endif -%}
  {%- if m.role == 'tool' %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  {%- set ns.roles = ns.roles + [m.role] -%}
  {%- if ns.n > 2 %}{% break %}{% endif %};
{%- else -%}
no messages but system
{%- endfor %}
n={{ ns.n }} roles={{ ns.roles | unique | join(',') }} {{ ns.roles | length is divisibleby 2 }}
{% for x in [] %}never{% else %}empty-else{% endfor %}
{{ strftime_now('%Y-%m-%d %H:%M %a %b') }}
""",
    "features_filters": """{%- macro show(v, label='v', sep=': ') -%}
{{ label }}{{ sep }}{{ v | tojson }}
{%- endmacro -%}
{%- set last = messages[-1] -%}
{%- set text = last.content if last.content is string else last.content | map(attribute='text') | join('') -%}
{{ show(text) }}
{{ show(text | wordcount, 'words') }} {{ show(text[2:7], label='slice', sep='=') }} {{ text[-1] }}
{{ text | length }} {{ ('x' ~ text) | replace('e', 'E') }} {{ text.replace('o', '0', 1) }}
{{ '3.7' | float + 1 }} {{ '42' | int * 2 }} {{ 'x' | int }} {{ -3 | abs }} {{ 2.675 | round(2) }} {{ 7.5 | round }} {{ 7.2 | round(0, 'ceil') }}
{{ {'b': 1, 'A': [1, 2.5, none, true], 'c': {'é': 'ü'}} | tojson(indent=2) }}
{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true, ensure_ascii=true) }} {{ [] | tojson(indent=2) }}
{%- for k, v in {'b': 2, 'a': 1, 'C': 3} | dictsort %} {{ k }}={{ v }}{% endfor %}
{%- for k, v in {'x': 1} | items %} {{ k }}{{ v }}{% endfor %}
{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('role', 'in', ['user', 'system']) | map(attribute='role') | list }}
{{ messages | map(attribute='role') | select('ne', 'user') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ ['a', 'B', 'A', 'b'] | unique | list }}
{{ 'user' in messages | map(attribute='role') | list }} {{ 'nobody' not in messages | map(attribute='role') | list }} {{ 'tool_calls' in last }}
{{ "line one\nline two\n\nfour" | indent(3) }}
{{ "a\nb" | indent(2, first=true, blank=true) }}
{%- set block %}
 set block {{ messages | length }} {% endset %}
{% filter upper %}filtered {{ block | trim }}{% endfilter %}
{% if tools is not none %}{% for t in tools %}{{ t.function.name }}({{ t.function.parameters.properties | list | join(', ') }}) {% endfor %}{% endif %}
{% for m in messages %}{% if m.tool_calls is defined %}{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }} {% endfor %}{% endif %}{% if m.reasoning_content is defined %}[{{ m.reasoning_content }}|{{ m.thinking }}]{% endif %}{% endfor %}
{{ (1, 'two') | list }} {{ (messages | first).role.startswith(('us', 'sy')) }} {{ 7 is odd }} {{ none is none }} {{ add_generation_prompt | string | lower }}
{%- if enable_thinking is defined %} thinking={{ enable_thinking }}{% endif %}
""",
    "features_sort_format": """{%- set roles = messages | map(attribute='role') | list -%}
{{ roles | sort | join(',') }} {{ roles | sort(reverse=true) | join(',') }} {{ ['b', 'A', 'a', 'B'] | sort | join }} {{ ['b', 'A', 'a', 'B'] | sort(case_sensitive=true) | join }}
{{ messages | sort(attribute='role') | map(attribute='role') | join(',') }} {{ [{'a': 2, 'b': 'x'}, {'a': 1, 'b': 'y'}, {'a': 2, 'b': 'a'}] | sort(attribute='a,b') | map(attribute='b') | join }}
{{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A', 'c'] | min }} {{ ['b', 'A', 'c'] | max(case_sensitive=true) }} {{ messages | max(attribute='role') | tojson }} {{ [] | min is undefined }}
{{ '{}-{}'.format(roles | length, 'x') }} {{ '{1}{0}{1}'.format('a', 'b') }} {{ '<{name}|{{literal}}>'.format(name=roles[0]) }} {{ '{}'.format(none) }} {{ '{}{}'.format(true, 1.5) }}
{%- if roles | length > 3 %} many: {{ roles[-1] | from_json }}{% endif %}
{{ (roles | no_such_filter) if false else 'inline-if' }}
{%- if roles | length == 2 %}{% set seen = [] %}{% set _ = seen.append(roles[0]) %}{% endif %}
{%- if false %}{{ roles is no_such_test }}{% endif %} end
{%- macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}
{%- macro each(xs) %}{% for x in xs %}{{ caller(x, loop.index) }}{% endfor %}{% endmacro %}
{%- set outer = 'o' %}
{% call wrap('b') %}{{ outer }}{{ roles | length }}{% call wrap('i') %}{{ outer }}{% endcall %}{% endcall %} {% call(r, i) each(roles) %}{{ i }}={{ r }};{% endcall %}
{{ '%s|%r|%d|%i|%%' | format('a', 'b', 3.9, true) }} {{ '%(n)s-%(n)r' | format(n=roles) }}
{{ none is sameas none }} {{ false is sameas false }} {{ 0 is sameas false }} {{ roles is sameas none }} {{ missing is iterable }} {{ missing is sequence }}
""",
}

# Conversations that use tools get the tool list; #1 also gets it without using it.
WITH_TOOLS = {1: 0, 5: 0, 6: 0}


def render(tok, tpl, conv, tools, gen, cont, kwargs):
    try:
        return {"expected": tok.apply_chat_template(
            conv, tools=tools, chat_template=tpl, tokenize=False, add_generation_prompt=gen,
            continue_final_message=cont, **kwargs)}
    except Exception as e:  # raise_exception in the template, a type error, ...
        return {"error": f"{type(e).__name__}: {e}"}


DOCUMENTS = [{"title": "Tides", "text": "The moon pulls the sea twice a day."},
             {"title": "Paris", "text": "Paris is the capital of France."}]
COHERE_TOOLS = [{"name": "internet_search", "description": "Returns a list of relevant document snippets.",
                 "parameter_definitions": {"query": {"description": "Query to search the internet with",
                                                     "type": "str", "required": True}}},
                {"name": "directly_answer", "description": "Answers without any tool.",
                 "parameter_definitions": {}}]

TOOLS.append(COHERE_TOOLS)
COHERE_TOOLS_INDEX = len(TOOLS) - 1

# Real templates /tokenize is also checked with (the embedded model's tokenizer, the template
# given as the checkpoint's chat_template.jinja): ones that need no bos/eos token or clock.
TOKENIZE_TEMPLATES = [None, "llama.cpp-Qwen-Qwen2.5-7B-Instruct", "llama.cpp-Qwen-Qwen3-0.6B",
                      "llama.cpp-moonshotai-Kimi-K2"]


def tokenize_cases(model_dir):
    """HF's apply_chat_template(..., tokenize=True) ids with the model's own tokenizer and
    its template (template null) or a real one (TOKENIZE_TEMPLATES), for the router's
    /tokenize with messages (tests/services/router)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    cases = []
    for name in TOKENIZE_TEMPLATES:
        source = None
        if name is not None:
            with open(os.path.join(ROOT, TEMPLATE_DIR, name + ".jinja"), encoding="utf-8") as f:
                source = f.read()
        cases += tokenize_cases_of(tok, name, source)
    return cases


def tokenize_cases_of(tok, name, source):
    cases = []
    for ci in (0, 2, 3, 5, 7, 8):
        for gen, cont in ((True, False), (False, False), (False, True)):
            if cont and ci != 8:
                continue
            tools = TOOLS[0] if ci == 5 else None
            request = {"messages": CONVERSATIONS[ci], "add_generation_prompt": gen}
            case = {"template": name}
            if cont:
                request["continue_final_message"] = True
            if tools is not None:
                request["tools"] = tools
            try:
                out = tok.apply_chat_template(CONVERSATIONS[ci], tools=tools, tokenize=True,
                                              add_generation_prompt=gen,
                                              continue_final_message=cont, chat_template=source)
                ids = out["input_ids"] if hasattr(out, "keys") else out
                case.update({"request": request, "tokens": list(ids)})
            except Exception as e:  # e.g. content parts the template concatenates as text
                case.update({"request": request, "error": f"{type(e).__name__}: {e}"})
            cases.append(case)
    return cases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="models/tiny-moe")
    ap.add_argument("--out", default="tests/fixtures/chat_template_real_cases.json")
    ap.add_argument("--tokenize-out", default="tests/fixtures/chat_tokenize_cases.json")
    args = ap.parse_args()
    bos, eos = "<s>", "</s>"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(ROOT, args.model_dir, "tokenizer.json"),
        bos_token=bos, eos_token=eos)
    names = sorted(f for f in os.listdir(os.path.join(ROOT, TEMPLATE_DIR)) if f.endswith(".jinja"))
    templates, sources, cases = {}, {}, []
    for fname in names:
        name = fname[:-len(".jinja")]
        templates[name] = f"{TEMPLATE_DIR}/{fname}"
        with open(os.path.join(ROOT, TEMPLATE_DIR, fname), encoding="utf-8") as f:
            sources[name] = f.read()
    sources.update(FEATURES)
    for name, tpl in sources.items():
        variants = [{}]
        if "enable_thinking" in tpl:
            variants.append({"enable_thinking": False})
        # Variables some templates need besides messages and tools, given as extra variables
        # (chat_template_kwargs): RAG documents, firefunction's `functions` string and date;
        # templates of Cohere's own tool format also get tools in that format (below).
        if "documents" in tpl:
            variants.append({"documents": DOCUMENTS})
        if "+ functions" in tpl:
            variants.append({"functions": json.dumps([WEATHER["function"]], indent=2), "datetime": "2025-07-26"})
        for ci, conv in enumerate(CONVERSATIONS):
            tool_sets = [None] + ([WITH_TOOLS[ci]] if ci in WITH_TOOLS else [])
            if "parameter_definitions" in tpl and ci in WITH_TOOLS:
                tool_sets.append(COHERE_TOOLS_INDEX)  # Cohere's own tool format
            for ti in tool_sets:
                tools = TOOLS[ti] if ti is not None else None
                runs = [(False, False), (True, False)]
                if ci == 8:
                    runs.append((False, True))
                for kw in variants:
                    for gen, cont in runs:
                        case = {"template": name, "conversation": ci, "tools": ti,
                                "add_generation_prompt": gen, "continue_final_message": cont,
                                "kwargs": kw}
                        case.update(render(tok, tpl, conv, tools, gen, cont, kw))
                        cases.append(case)
    out = {"now": NOW, "bos_token": bos, "eos_token": eos, "templates": templates,
           "inline_templates": FEATURES,
           "conversations": CONVERSATIONS, "tools": TOOLS, "cases": cases}
    with open(os.path.join(ROOT, args.out), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {args.out}: {len(templates)} templates, {len(cases)} cases, "
          f"{sum('error' in c for c in cases)} errors")
    tcases = tokenize_cases(os.path.join(ROOT, args.model_dir))
    with open(os.path.join(ROOT, args.tokenize_out), "w", encoding="utf-8") as f:
        json.dump({"model_dir": args.model_dir, "cases": tcases}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"wrote {args.tokenize_out}: {len(tcases)} cases")


if __name__ == "__main__":
    main()
