#!/usr/bin/env python3
"""Checks the include graph against the documented layers (docs/architecture.md, "Layers").

Every `#include "folder/..."` in the sources is an arrow from the including file's folder to the
included one. The layers, lowest first:

    common  <-  kernels  <-  memory  <-  engine  <-  services
    policies: common only; the engine and the services reach it
    quant (offline drivers): anything up to the engine, plus policies
    tools, bench, fuzz, loadgen, tests: anything
    the broker, router, launcher, pw-ctl, pw serve, transport and pw-sim: no engine (NARROWER below)

An arrow from a folder to one its layer may not include fails the check, as does a loop between
two folders (at the second level too: services/router and services/workers, engine/models and
engine/layers ...). Exit status 0 when the graph is clean, 1 with one line per offending include.

    tools/check_layers.py [--graph] [--root DIR]
      --graph  also prints the folder-level arrows
      --root   the checkout to check (default: the one this script is in)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# What each top-level folder may include besides itself.
ALLOWED = {
    "common": set(),
    "kernels": {"common"},
    "memory": {"common", "kernels"},
    "policies": {"common"},
    "engine": {"common", "kernels", "memory", "policies"},
    "services": {"common", "kernels", "memory", "policies", "engine"},
    "quant": {"common", "kernels", "memory", "policies", "engine"},
}
# Narrower rules inside a layer: processes that must not link the engine (the broker serves the
# checkpoint's experts through common/formats/checkpoint_experts.h; the router tokenizes with
# common/text/). A path prefix -> folders it may not include.
NO_ENGINE = ("engine", "quant")
NARROWER = {
    "services/broker/": NO_ENGINE,
    "services/router/": NO_ENGINE,
    "services/cluster/": NO_ENGINE,
    "services/ctl/": NO_ENGINE,
    "services/serve/": NO_ENGINE,  # pw serve builds a store by running pw-quantize
    "services/transport/": NO_ENGINE,
    "services/proto/": NO_ENGINE,
    "tools/pw_sim.cc": NO_ENGINE,
}
# The top: tools, benchmarks, fuzz targets, the load generator and tests may include anything.
TOP = {"tools", "bench", "fuzz", "loadgen", "tests"}
LAYERED = set(ALLOWED) | TOP
SKIP_DIRS = {"build", ".git", ".venv", "gen"}


def source_files(root):
    for top in sorted(LAYERED):
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def folder_of(path, depth):
    parts = path.split("/")[:-1]
    return "/".join(parts[:depth]) if parts else ""


def find_cycles(edges):
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    nodes = sorted(set(edges) | {d for ds in edges.values() for d in ds})
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def main(argv):
    show_graph = "--graph" in argv
    root = ROOT
    if "--root" in argv:
        root = os.path.abspath(argv[argv.index("--root") + 1])
    errors = []
    # (from folder, to folder) at depth 1 and 2 -> first include that makes the arrow
    arrows = {1: {}, 2: {}}
    for path in source_files(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = m.group(1)
                top = target.split("/")[0]
                if top not in LAYERED or "/" not in target:
                    continue  # generated headers, third-party, same-folder relative includes
                src_top = path.split("/")[0]
                where = f"{path}:{lineno}"
                if src_top != top and src_top not in TOP and top not in ALLOWED[src_top]:
                    errors.append(f"{where}: {src_top}/ may not include {target} "
                                  f"({src_top}/ may include: "
                                  f"{', '.join(sorted(ALLOWED[src_top])) or 'nothing'})")
                for prefix, banned in NARROWER.items():
                    if path.startswith(prefix) and top in banned:
                        errors.append(f"{where}: {prefix} may not include {target} "
                                      f"(it links no {top}/)")
                for depth in (1, 2):
                    a, b = folder_of(path, depth), folder_of(target, depth)
                    if a and b and a != b:
                        arrows[depth].setdefault((a, b), where)
    for depth in (1, 2):
        edges = {}
        for (a, b) in arrows[depth]:
            if a.split("/")[0] in TOP or b.split("/")[0] in TOP:
                continue  # tests and tools sit above everything and may mirror any folder
            edges.setdefault(a, set()).add(b)
        for comp in find_cycles(edges):
            detail = "; ".join(f"{a} -> {b} at {arrows[depth][(a, b)]}"
                               for a in comp for b in comp if (a, b) in arrows[depth])
            errors.append(f"folder loop: {' <-> '.join(comp)} ({detail})")
    if show_graph:
        for (a, b), where in sorted(arrows[1].items()):
            print(f"{a} -> {b}   (first at {where})")
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} arrow(s) the layers forbid "
              f"(docs/architecture.md, \"Layers\")", file=sys.stderr)
        return 1
    print("check_layers: the include graph follows the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
