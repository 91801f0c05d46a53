#!/usr/bin/env python3
"""Writes common/calibration/calibration.txt, the text pw-quantize calibrates on by default.

Standard library only (run with /usr/bin/python3). Documents of the embedded model's training
split (tools/corpus.py: never a held-out document) from the two domains whose licences allow
shipping them: the King James Bible (bible-kjv-text; public domain) and the Python 3.11
standard library (libpython3.11-stdlib; PSF License Version 2, see
common/calibration/LICENSE-PSF.txt). SEGMENTS documents of each domain at evenly spaced
positions in name order, each cut to its first SEGMENT_CHARS characters at a line boundary,
alternating the domains, joined by a blank line. Deterministic for given package versions;
prints the sha256 of what it wrote.

  /usr/bin/python3 tools/calibration_text.py [--out common/calibration/calibration.txt]
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

SEGMENTS = 8
SEGMENT_CHARS = 1100
DOMAINS = ("bible", "python")


def Segments(domain):
    docs = [d for d in corpus.READERS[domain]() if not corpus.IsHeldOut(d[0])]
    docs.sort(key=lambda d: d[0])
    picked = []
    for i in range(SEGMENTS):
        name, body, _ = docs[(2 * i + 1) * len(docs) // (2 * SEGMENTS)]
        picked.append((name, corpus.CutAtLine(body, SEGMENT_CHARS)))
    return picked


def Main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--out", default=os.path.join(root, "common", "calibration", "calibration.txt"))
    args = ap.parse_args(argv)
    per_domain = [Segments(d) for d in DOMAINS]
    parts = []
    for i in range(SEGMENTS):
        for segs in per_domain:
            parts.append(segs[i])
    text = "\n\n".join(body for _, body in parts) + "\n"
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    for name, body in parts:
        print(f"  {name} ({len(body)} characters)")
    print(f"calibration text: wrote {len(text.encode('utf-8'))} bytes to {args.out} sha256 {corpus.Sha256(text)}")
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
