#!/usr/bin/env python3
"""Prints the values reference of the Helm chart (docs/deploy.md, "Values") from its
values.schema.json (type, bounds, description) and values.yaml (defaults):

    python3 tools/helm_values_doc.py > /tmp/values.md      # or --check docs/deploy.md

--check FILE exits 1 when FILE's text between the markers differs (tests/helm runs it)."""
import json
import os
import sys

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CHART = os.path.join(ROOT, "helm", "pagedweight")
BEGIN = "<!-- values reference: tools/helm_values_doc.py -->"
END = "<!-- end of values reference -->"


def kind(s):
    t = s.get("type")
    if "enum" in s:
        return " \\| ".join(f"`{v}`" for v in s["enum"])
    if "oneOf" in s:
        return " or ".join(x.get("type", "?") for x in s["oneOf"])
    if t == "integer" and ("minimum" in s or "maximum" in s):
        return f"integer [{s.get('minimum', '')}, {s.get('maximum', '')}]"
    return t or "any"


def default(values, path):
    v = values
    for p in path:
        if not isinstance(v, dict) or p not in v:
            return ""
        v = v[p]
    if isinstance(v, (dict, list)):
        text = json.dumps(v, separators=(", ", ": "))
        return f"`{text}`" if len(text) <= 40 else "(see values.yaml)"
    return f"`{json.dumps(v)}`"


def rows(schema, values, path=()):
    for key, s in schema.get("properties", {}).items():
        p = path + (key,)
        if s.get("not") == {}:
            continue  # keys the chart sets itself
        leaf = s.get("type") != "object" or "properties" not in s or s.get("additionalProperties") is not False
        if leaf:
            desc = s.get("description", "").replace("|", "\\|").replace("\n", " ")
            yield f"| `{'.'.join(p)}` | {kind(s)} | {default(values, p)} | {desc} |"
        if s.get("type") == "object" and "properties" in s and s.get("additionalProperties") is False:
            yield from rows(s, values, p)


def reference():
    schema = json.load(open(os.path.join(CHART, "values.schema.json")))
    values = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    lines = [BEGIN, "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    lines += list(rows(schema, values))
    return "\n".join(lines + [END])


def main():
    text = reference()
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        doc = open(sys.argv[2]).read()
        have = doc[doc.index(BEGIN):doc.index(END) + len(END)] if BEGIN in doc and END in doc else ""
        if have != text:
            sys.exit(f"{sys.argv[2]}: the values reference is not current; paste the output of "
                     f"`python3 tools/helm_values_doc.py` between its markers")
        return
    print(text)


if __name__ == "__main__":
    main()
