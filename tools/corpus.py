#!/usr/bin/env python3
"""Assembles the multi-domain English corpus of the embedded model from Debian text packages.

Standard library only: `make eval-data` runs it with /usr/bin/python3, without the venv.

Domains (each a fixed list of Debian packages, files taken from `dpkg -L`, never from whatever
else happens to be installed):
  bible    King James Bible, one document per chapter (bible-kjv-text, read through the
           `bible` program of package bible-kjv, which decompresses it).
  fortune  fortune cookies, one document per cookie (fortunes, fortunes-min; not the
           offensive set, not ascii-art).
  man      manual pages of manpages and manpages-dev, troff markup stripped to plain text,
           one document per page.
  c        C headers of libc6-dev and linux-libc-dev, one document per file.
  python   the Python 3.11 standard library (libpython3.11-stdlib, libpython3.11-minimal),
           test packages excluded, one document per file.

Split rule: a document is held out when int(sha256(name)[:16], 16) % HELDOUT_MODULUS == 0,
where name is "<domain>/<id>" (see each reader). Held-out documents never appear in the
training text. The held-out evaluation text is every held-out document, in sorted order of
name, each cut to its first HELDOUT_DOC_CHARS characters at a line boundary, joined by a blank
line.

Output:
  train    documents in sorted order of name, joined by the literal separator
           "<|endoftext|>" (the tokenizer's special token id 0), UTF-8.
  heldout  as described above, UTF-8, no special tokens.
  pin      the held-out manifest (tests/fixtures/heldout_docs.json) from the installed
           packages: every held-out document's name, package, version, sha256 and bytes, and
           the text itself of the documents of PINNED_DOMAINS.
Both texts are deterministic for a given set of package versions; the sha256 of the bytes
written is printed.

Pinned held-out text. The reference figures of the embedded model (tests/fixtures/heldout.json)
were computed on one exact held-out text, so `heldout` rebuilds exactly that text, whatever
versions are installed: it follows the manifest's list of documents, takes the committed text
of the documents of PINNED_DOMAINS (libc6-dev, linux-libc-dev and libpython3.11-* change with
Debian security updates), and extracts the others from their packages (the KJV Bible,
fortunes and manpages, which Debian stable does not change in point releases), checking each
against its recorded sha256. An extracted document that differs is an error naming the
document and both package versions, not a silently different text: the reference would not
apply to it. `heldout --from-packages` ignores the manifest (the rule alone, current packages).
"""

import argparse
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

HELDOUT_MODULUS = 100
HELDOUT_DOC_CHARS = 6000
DOC_SEPARATOR = "<|endoftext|>"

FORTUNE_PACKAGES = ["fortunes", "fortunes-min"]
FORTUNE_EXCLUDE = {"ascii-art"}
MAN_PACKAGES = ["manpages", "manpages-dev"]
C_PACKAGES = ["libc6-dev", "linux-libc-dev"]
PYTHON_PACKAGES = ["libpython3.11-stdlib", "libpython3.11-minimal"]
BIBLE_PROGRAM = "/usr/bin/bible"
BIBLE_RANGE = "gen1:1-rev22:21"
# Documents shorter than this (in characters, after cleaning) are dropped: man page stubs
# that only redirect (.so) and empty package __init__ files carry no text.
MIN_DOC_CHARS = 40
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "tests", "fixtures", "heldout_docs.json")
# Domains whose held-out documents the manifest carries as text: their packages change in
# Debian stable point releases (security updates of glibc, the kernel and Python).
PINNED_DOMAINS = ("c", "python")


class CorpusError(Exception):
    pass


def PackageFiles(package):
    """Returns the sorted list of regular files package installed (dpkg -L)."""
    try:
        out = subprocess.run(["dpkg", "-L", package], check=True, capture_output=True,
                             text=True).stdout
    except FileNotFoundError as e:
        raise CorpusError("dpkg not found: this script needs a Debian system") from e
    except subprocess.CalledProcessError as e:
        raise CorpusError(f"package {package} is not installed (run tools/install_deps.sh): "
                          f"{e.stderr.strip()}") from e
    files = [p for p in out.splitlines() if p.startswith("/") and os.path.isfile(p)
             and not os.path.islink(p)]
    return sorted(set(files))


def DecodeText(data, path):
    """Decodes bytes as UTF-8, falling back to Latin-1 (some fortune files are Latin-1)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def CleanText(text):
    """Normalises line endings, drops trailing spaces on lines and at the end."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return text.strip("\n")


# ---------------------------------------------------------------------------------------------
# bible

BIBLE_LINE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def BibleDocs():
    if not os.path.exists(BIBLE_PROGRAM):
        raise CorpusError(f"{BIBLE_PROGRAM} not found (install bible-kjv and bible-kjv-text)")
    out = subprocess.run([BIBLE_PROGRAM, "-f", BIBLE_RANGE], check=True, capture_output=True,
                         env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}).stdout
    text = DecodeText(out, BIBLE_PROGRAM)
    chapters = {}
    order = []
    for line in text.split("\n"):
        m = BIBLE_LINE.match(line)
        if not m:
            continue
        book, chapter, verse, body = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        key = (book, chapter)
        if key not in chapters:
            chapters[key] = []
            order.append(key)
        chapters[key].append(f"{verse} {body.strip()}")
    if len(order) < 1000:
        raise CorpusError(f"{BIBLE_PROGRAM} printed only {len(order)} chapters; expected 1189")
    docs = []
    for book_index, (book, chapter) in enumerate(order):
        body = f"{book} {chapter}\n\n" + "\n".join(chapters[(book, chapter)])
        # Book index keeps the canonical order inside the domain after sorting by name.
        docs.append((f"bible/{book_index:04d}-{book}-{chapter:03d}", body, "bible-kjv-text"))
    return docs


# ---------------------------------------------------------------------------------------------
# fortune


def FortuneDocs():
    docs = []
    for package in FORTUNE_PACKAGES:
        for path in PackageFiles(package):
            if not path.startswith("/usr/share/games/fortunes/"):
                continue
            rel = path[len("/usr/share/games/fortunes/"):]
            if "/" in rel or "." in rel or rel in FORTUNE_EXCLUDE:
                continue
            with open(path, "rb") as f:
                text = DecodeText(f.read(), path)
            cookies = re.split(r"(?m)^%\s*$", text)
            for i, cookie in enumerate(cookies):
                body = CleanText(cookie)
                if len(body) >= MIN_DOC_CHARS:
                    docs.append((f"fortune/{rel}/{i:05d}", body, package))
    return docs


# ---------------------------------------------------------------------------------------------
# man: a small troff-to-text converter for the man(7) macro set

TROFF_NAMED = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "aq": "'", "dq": '"', "bu": "\u2022",
    "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "co": "\u00a9",
    "rg": "\u00ae", "tm": "\u2122", "mu": "\u00d7", "di": "\u00f7", "+-": "\u00b1",
    "<=": "\u2264", ">=": "\u2265", "!=": "\u2260", "->": "\u2192", "<-": "\u2190",
    "ti": "~", "ha": "^", "rs": "\\", "ga": "`", "aa": "\u00b4", "de": "\u00b0",
    "sc": "\u00a7", "dg": "\u2020", "ua": "\u2191", "da": "\u2193", "pl": "+", "mi": "-",
    "eq": "=", "sl": "/", "ba": "|", "br": "|", "or": "|", "ul": "_", "ru": "_", "fm": "'",
    "Fo": "\u00ab", "Fc": "\u00bb", "ss": "\u00df", "'e": "\u00e9", "`e": "\u00e8",
    ":u": "\u00fc", ":o": "\u00f6", ":a": "\u00e4", "~n": "\u00f1", "if": "\u221e",
    "ca": "\u2229", "cu": "\u222a", "Sd": "\u00f0", "ps": "\u00b6", "ct": "\u00a2",
}
TROFF_STRINGS = {"lq": "\u201c", "rq": "\u201d", "R": "\u00ae", "Tm": "\u2122", "aq": "'"}

ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"      # font change
    r"|s[+-]?(?:\(\d\d|\[\d+\]|\d)"  # size change
    r"|\((..)"                       # \(xx named char
    r"|\[([^\]]*)\]"                 # \[name] named char
    r"|\*(?:\((..)|\[([^\]]*)\]|(.))"  # \*x string
    r"|[\"#].*$"                     # comment to end of line
    r"|([-e\\~ 0|^&c:%)/,!?{}'`.aAdrtup])"  # single-char escapes
    r"|[nkgwhvlLoxbDNXYZzVH]\S?(?:'[^']*'|\[[^\]]*\]|\(..)?"
    r")")

SINGLE_ESCAPE = {"-": "-", "e": "\\", "\\": "\\", "~": " ", " ": " ", "0": " ", "|": "",
                 "^": "", "&": "", "c": "", ":": "", "%": "", ")": "", "/": "", ",": "",
                 "!": "", "?": "", "{": "", "}": "", "'": "\u00b4", "`": "`", ".": ".",
                 "a": "", "A": "", "d": "", "r": "", "t": "\t", "u": "", "p": ""}


def _ReplaceEscape(m):
    named2, named_long, str2, str_long, str1, single = m.groups()
    if named2 is not None:
        return TROFF_NAMED.get(named2, "")
    if named_long is not None:
        if named_long.startswith("u") and re.fullmatch(r"u[0-9A-Fa-f]{4,6}", named_long):
            return chr(int(named_long[1:], 16))
        return TROFF_NAMED.get(named_long, "")
    if str2 is not None or str_long is not None or str1 is not None:
        return TROFF_STRINGS.get(str2 or str_long or str1, "")
    if single is not None:
        return SINGLE_ESCAPE.get(single, "")
    return ""


def TroffInline(text):
    return ESCAPE.sub(_ReplaceEscape, text)


def SplitMacroArgs(rest):
    """Splits troff macro arguments: whitespace-separated, double quotes group."""
    args = []
    cur = []
    in_quote = False
    i = 0
    while i < len(rest):
        ch = rest[i]
        if in_quote:
            if ch == '"':
                if i + 1 < len(rest) and rest[i + 1] == '"':
                    cur.append('"')
                    i += 1
                else:
                    in_quote = False
            else:
                cur.append(ch)
        elif ch == '"':
            in_quote = True
        elif ch in " \t":
            if cur:
                args.append("".join(cur))
                cur = []
        else:
            cur.append(ch)
        i += 1
    if cur:
        args.append("".join(cur))
    return args


FONT_MACROS_JOINED = {"BR", "RB", "BI", "IB", "IR", "RI"}
FONT_MACROS_SPACED = {"B", "I", "SM", "SB"}

def StripMan(troff):
    """Converts man(7) troff source to readable plain text.

    Filled text (the default) is joined into one line per paragraph; no-fill regions
    (.nf/.EX ... .fi/.EE) keep their lines as written.
    """
    out = []
    para = []
    fill = True
    skipping_ig = False

    def Flush():
        if para:
            out.append(" ".join(w for w in para if w))
            para.clear()

    def Text(text):
        if fill:
            para.append(text.strip())
        else:
            out.append(text)

    def Break():
        Flush()
        out.append("")

    for line in troff.replace("\r\n", "\n").split("\n"):
        if skipping_ig:
            if line.startswith(".."):
                skipping_ig = False
            continue
        if line.startswith(".\\\"") or line.startswith("'\\\"") or line.startswith("\\\""):
            continue
        if not line.startswith(".") and not line.startswith("'"):
            if not line.strip():
                Break()
            else:
                Text(TroffInline(line))
            continue
        name, _, rest = line[1:].lstrip().partition(" ")
        name = name.strip()
        rest = rest.strip()
        if name == "ig":
            skipping_ig = True
        elif name == "TH":
            args = SplitMacroArgs(rest)
            Flush()
            if args:
                out.append(" ".join(TroffInline(a) for a in args[:2]))
                out.append("")
        elif name in ("SH", "SS"):
            Break()
            out.append(TroffInline(" ".join(SplitMacroArgs(rest))))
        elif name in FONT_MACROS_JOINED:
            Text(TroffInline("".join(SplitMacroArgs(rest))))
        elif name in FONT_MACROS_SPACED:
            if rest:
                Text(TroffInline(" ".join(SplitMacroArgs(rest))))
        elif name == "IP":
            Break()
            args = SplitMacroArgs(rest)
            if args:
                out.append(TroffInline(args[0]))
        elif name in ("TP", "TQ", "PP", "LP", "P", "sp", "HP"):
            Break()
        elif name in ("br", "RS", "RE", "in", "ti"):
            Flush()
        elif name in ("nf", "EX", "TS"):
            Flush()
            fill = False
        elif name in ("fi", "EE", "TE"):
            fill = True
        elif name in ("UR", "MT"):
            if rest:
                Text(TroffInline(rest))
        # Any other request or macro is layout only: dropped.
    Flush()
    text = "\n".join(l.rstrip() for l in out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip("\n")


def ManDocs():
    docs = []
    for package in MAN_PACKAGES:
        for path in PackageFiles(package):
            m = re.match(r"^/usr/share/man/man(\d)[a-z]*/([^/]+)\.gz$", path)
            if not m:
                continue
            with gzip.open(path, "rb") as f:
                troff = DecodeText(f.read(), path)
            first = troff.lstrip().split("\n", 1)[0]
            if first.startswith(".so "):
                continue
            body = CleanText(StripMan(troff))
            if len(body) >= MIN_DOC_CHARS:
                docs.append((f"man/{m.group(1)}/{m.group(2)}", body, package))
    return docs


# ---------------------------------------------------------------------------------------------
# c and python sources


def SourceDocs(domain, packages, suffix, root_prefixes, exclude=None):
    docs = []
    seen = set()
    for package in packages:
        for path in PackageFiles(package):
            if not path.endswith(suffix) or path in seen:
                continue
            if exclude is not None and exclude(path):
                continue
            seen.add(path)
            rel = path
            for prefix in root_prefixes:
                if path.startswith(prefix):
                    rel = path[len(prefix):]
                    break
            with open(path, "rb") as f:
                body = CleanText(DecodeText(f.read(), path))
            if len(body) >= MIN_DOC_CHARS:
                docs.append((f"{domain}/{rel}", body, package))
    return docs


def CDocs():
    return SourceDocs("c", C_PACKAGES, ".h", ["/usr/include/"])


def PythonDocs():
    def Exclude(path):
        parts = path.split("/")
        return ("test" in parts or "tests" in parts or "idle_test" in parts
                or "__pycache__" in parts)
    return SourceDocs("python", PYTHON_PACKAGES, ".py", ["/usr/lib/python3.11/"], Exclude)


# ---------------------------------------------------------------------------------------------


READERS = {"bible": BibleDocs, "fortune": FortuneDocs, "man": ManDocs, "c": CDocs,
           "python": PythonDocs}


def AllDocs(domains=tuple(READERS)):
    """Returns (name, body, package) of every document of domains, sorted by name."""
    docs = []
    for domain in domains:
        docs.extend(READERS[domain]())
    names = [d[0] for d in docs]
    if len(set(names)) != len(names):
        raise CorpusError("duplicate document names")
    docs.sort(key=lambda d: d[0])
    for name, body, _ in docs:
        if DOC_SEPARATOR in body:
            raise CorpusError(f"document {name} contains the separator {DOC_SEPARATOR}")
    return docs


def PackageVersions(packages):
    """Installed version of each package ("" when not installed)."""
    out = {}
    for package in sorted(set(packages)):
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                           text=True)
        out[package] = r.stdout.strip() if r.returncode == 0 else ""
    return out


def IsHeldOut(name):
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()
    return int(digest[:16], 16) % HELDOUT_MODULUS == 0


def CutAtLine(text, limit):
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    if cut <= 0:
        cut = limit
    return text[:cut]


def Sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def HeldOutText(docs):
    """The held-out evaluation text of docs by the rule (held-out documents, cut, joined)."""
    return "\n\n".join(CutAtLine(body, HELDOUT_DOC_CHARS) for name, body, _ in docs
                        if IsHeldOut(name)) + "\n"


def MakeManifest(docs):
    """The manifest `pin` writes: the held-out documents of docs, with the text of those of
    PINNED_DOMAINS."""
    held = [d for d in docs if IsHeldOut(d[0])]
    versions = PackageVersions(p for _, _, p in held)
    entries = []
    for name, body, package in held:
        cut = CutAtLine(body, HELDOUT_DOC_CHARS)
        entry = {"name": name, "package": package, "version": versions[package],
                 "sha256": Sha256(cut), "bytes": len(cut.encode("utf-8"))}
        if name.split("/", 1)[0] in PINNED_DOMAINS:
            entry["text"] = cut
        entries.append(entry)
    text = HeldOutText(docs)
    return {
        "about": "Held-out documents of the evaluation text (tools/corpus.py pin). Documents "
                 "with a text are taken from here; the others are extracted from their "
                 "package and must match their sha256 (tools/corpus.py heldout).",
        "pinned_domains": list(PINNED_DOMAINS),
        "sha256": Sha256(text),
        "bytes": len(text.encode("utf-8")),
        "documents": entries,
    }


def HeldOutFromManifest(manifest, manifest_path):
    """Rebuilds the held-out text the manifest describes. Raises CorpusError when an extracted
    document differs from its record; notes (stderr) pinned documents that the installed
    packages no longer match."""
    entries = manifest["documents"]
    domains = sorted({e["name"].split("/", 1)[0] for e in entries})
    installed = {}
    for domain in domains:
        try:
            for name, body, package in READERS[domain]():
                if IsHeldOut(name):
                    installed[name] = (CutAtLine(body, HELDOUT_DOC_CHARS), package)
        except (CorpusError, OSError, subprocess.CalledProcessError) as e:
            if domain not in PINNED_DOMAINS:
                raise
            print(f"corpus.py: note: {domain}: not compared with the installed packages ({e})",
                  file=sys.stderr)
    versions = PackageVersions(e["package"] for e in entries)
    parts = []
    differing = []
    for e in entries:
        name, package = e["name"], e["package"]
        got = installed.get(name)
        if "text" in e:
            text = e["text"]
            if Sha256(text) != e["sha256"]:
                raise CorpusError(f"{manifest_path}: the text of {name} does not match its "
                                  f"sha256")
            if got is not None and got[0] != text:
                differing.append(f"{name} ({package} {versions[package]} installed, "
                                 f"{e['version']} pinned)")
        else:
            if got is None:
                raise CorpusError(
                    f"held-out document {name} not found in {package} (installed: "
                    f"{versions[package] or 'none'}, recorded: {e['version']}); the reference "
                    f"figures of tests/fixtures/heldout.json need exactly the recorded text")
            text = got[0]
            if Sha256(text) != e["sha256"]:
                raise CorpusError(
                    f"held-out document {name} differs from its record in {manifest_path} "
                    f"({package} {versions[package]} installed, {e['version']} recorded); the "
                    f"reference figures of tests/fixtures/heldout.json need exactly the "
                    f"recorded text: add the domain to PINNED_DOMAINS and run `corpus.py pin` "
                    f"on a machine with the recorded version, or regenerate the fixtures")
        parts.append(text)
    for d in differing:
        print(f"corpus.py: note: using the pinned copy of {d}", file=sys.stderr)
    text = "\n\n".join(parts) + "\n"
    if Sha256(text) != manifest["sha256"]:
        raise CorpusError(f"{manifest_path}: the documents do not join to its sha256")
    return text


def Write(path, text):
    data = text.encode("utf-8")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest(), len(data)


def Main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("split", choices=["train", "heldout", "stats", "pin"])
    parser.add_argument("--out", help="output file (train, heldout, pin)")
    parser.add_argument("--manifest", default=MANIFEST,
                        help="held-out manifest that heldout follows (default: %(default)s)")
    parser.add_argument("--from-packages", action="store_true",
                        help="heldout: apply the rule to the installed packages, no manifest")
    args = parser.parse_args(argv)
    if args.split != "stats" and not args.out:
        parser.error("--out is required")
    try:
        if args.split == "heldout" and not args.from_packages:
            with open(args.manifest, "r", encoding="utf-8") as f:
                manifest = json.load(f)
            text = HeldOutFromManifest(manifest, args.manifest)
            digest, size = Write(args.out, text)
            print(f"heldout: wrote {size} bytes to {args.out} sha256 {digest} "
                  f"({len(manifest['documents'])} documents by {args.manifest})")
            return 0
        docs = AllDocs()
    except (CorpusError, OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"corpus.py: error: {e}", file=sys.stderr)
        return 1
    if args.split == "stats":
        stats = {}
        for name, body, _ in docs:
            domain = name.split("/", 1)[0]
            s = stats.setdefault(domain, [0, 0, 0, 0])
            held = IsHeldOut(name)
            s[0 if not held else 2] += 1
            s[1 if not held else 3] += len(body.encode("utf-8")) if not held else len(
                CutAtLine(body, HELDOUT_DOC_CHARS).encode("utf-8"))
        print("domain   train_docs  train_bytes  heldout_docs  heldout_bytes")
        for domain, s in sorted(stats.items()):
            print(f"{domain:8s} {s[0]:10d} {s[1]:12d} {s[2]:13d} {s[3]:14d}")
        return 0
    if args.split == "pin":
        manifest = MakeManifest(docs)
        data = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
        digest, size = Write(args.out, data)
        print(f"pin: wrote {len(manifest['documents'])} documents ({size} bytes) to {args.out}; "
              f"held-out text sha256 {manifest['sha256']}")
        return 0
    if args.split == "train":
        text = DOC_SEPARATOR.join(body for name, body, _ in docs if not IsHeldOut(name))
    else:
        text = HeldOutText(docs)
    digest, size = Write(args.out, text)
    print(f"{args.split}: wrote {size} bytes to {args.out} sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(Main(sys.argv[1:]))
