#!/usr/bin/env python3
"""tools/corpus.py heldout rebuilds the pinned held-out text whatever package versions are
installed, and refuses a text the reference does not describe.

Fake readers stand in for the Debian packages, so the test needs none of them and runs in
milliseconds. Standard library only (run with /usr/bin/python3 by CTest).
"""

import contextlib
import io
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import corpus  # noqa: E402


def HeldOutNames(domain, count):
    """count document names of domain that the split rule holds out."""
    names = []
    i = 0
    while len(names) < count:
        name = f"{domain}/doc{i}"
        if corpus.IsHeldOut(name):
            names.append(name)
        i += 1
    return names


class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.man = HeldOutNames("man", 2)
        self.c = HeldOutNames("c", 2)
        self.trained = "man/trained-only"
        self.assertFalse(corpus.IsHeldOut(self.trained))
        # What the "installed packages" hold: name -> body.
        self.installed = {
            self.man[0]: "first manual page\n" * 3,
            self.man[1]: "second manual page",
            self.c[0]: "#define A 1\n",
            self.c[1]: "#define B 2\n" + "x" * (corpus.HELDOUT_DOC_CHARS + 10),
            self.trained: "not held out",
        }
        self.versions = {"manpages": "6.03-2", "linux-libc-dev": "6.1.187-1"}
        self._saved = (dict(corpus.READERS), corpus.PackageVersions)
        corpus.READERS.clear()
        corpus.READERS.update({"man": lambda: self.Docs("man", "manpages"),
                               "c": lambda: self.Docs("c", "linux-libc-dev")})
        corpus.PackageVersions = lambda packages: {p: self.versions[p] for p in packages}

    def tearDown(self):
        corpus.READERS.clear()
        corpus.READERS.update(self._saved[0])
        corpus.PackageVersions = self._saved[1]

    def Docs(self, domain, package):
        return [(n, b, package) for n, b in sorted(self.installed.items())
                if n.startswith(domain + "/")]

    def Manifest(self):
        return corpus.MakeManifest(corpus.AllDocs(("man", "c")))

    def Rebuild(self, manifest):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            text = corpus.HeldOutFromManifest(manifest, "manifest.json")
        return text, err.getvalue()

    def testPinCarriesTextOfPinnedDomainsOnly(self):
        m = self.Manifest()
        docs = {d["name"]: d for d in m["documents"]}
        self.assertEqual(sorted(docs), sorted(self.man + self.c))
        self.assertNotIn(self.trained, docs)
        for name in self.c:
            self.assertIn("text", docs[name])
            self.assertEqual(docs[name]["version"], "6.1.187-1")
        for name in self.man:
            self.assertNotIn("text", docs[name])
        self.assertEqual(len(docs[self.c[1]]["text"]), len("#define B 2"))  # cut at a line

    def testRebuildEqualsTheRuleOnUnchangedPackages(self):
        m = self.Manifest()
        text, err = self.Rebuild(m)
        self.assertEqual(text, corpus.HeldOutText(corpus.AllDocs(("man", "c"))))
        self.assertEqual(corpus.Sha256(text), m["sha256"])
        self.assertEqual(err, "")

    def testSecurityUpdateOfAPinnedPackageKeepsTheText(self):
        m = self.Manifest()
        want, _ = self.Rebuild(m)
        self.installed[self.c[0]] = "#define A 1\n#define A_NEW 3\n"  # the header changed
        del self.installed[self.c[1]]                                # a header went away
        self.installed[HeldOutNames("c", 3)[2]] = "a new held-out header"  # one was added
        self.versions["linux-libc-dev"] = "6.1.192-3"
        text, err = self.Rebuild(m)
        self.assertEqual(text, want)
        self.assertIn(f"using the pinned copy of {self.c[0]} (linux-libc-dev 6.1.192-3 "
                      f"installed, 6.1.187-1 pinned)", err)

    def testPinnedPackageAbsentKeepsTheText(self):
        m = self.Manifest()
        want, _ = self.Rebuild(m)

        def Missing():
            raise corpus.CorpusError("package linux-libc-dev is not installed")
        corpus.READERS["c"] = Missing
        text, err = self.Rebuild(m)
        self.assertEqual(text, want)
        self.assertIn("not compared", err)

    def testChangedExtractedDocumentIsRefused(self):
        m = self.Manifest()
        self.installed[self.man[1]] = "second manual page, revised"
        self.versions["manpages"] = "6.03-3"
        with self.assertRaises(corpus.CorpusError) as e:
            self.Rebuild(m)
        self.assertIn(self.man[1], str(e.exception))
        self.assertIn("6.03-3 installed, 6.03-2 recorded", str(e.exception))

    def testMissingExtractedDocumentIsRefused(self):
        m = self.Manifest()
        del self.installed[self.man[0]]
        with self.assertRaises(corpus.CorpusError) as e:
            self.Rebuild(m)
        self.assertIn(f"{self.man[0]} not found in manpages", str(e.exception))

    def testCorruptPinnedTextIsRefused(self):
        m = self.Manifest()
        for d in m["documents"]:
            if "text" in d:
                d["text"] += " "
                break
        with self.assertRaises(corpus.CorpusError) as e:
            self.Rebuild(m)
        self.assertIn("does not match its sha256", str(e.exception))

    def testCommittedManifestIsConsistent(self):
        """The committed manifest joins to the reference's sha256 (its pinned part checked
        here; the extracted part by `make eval-data` and the C++ test)."""
        fixtures = os.path.dirname(corpus.MANIFEST)
        with open(corpus.MANIFEST, encoding="utf-8") as f:
            m = json.load(f)
        with open(os.path.join(fixtures, "heldout.json"), encoding="utf-8") as f:
            ref = json.load(f)
        self.assertEqual(m["sha256"], ref["sha256"])
        self.assertEqual(m["bytes"], ref["bytes"])
        names = [d["name"] for d in m["documents"]]
        self.assertEqual(names, sorted(names))
        self.assertTrue(all(corpus.IsHeldOut(n) for n in names))
        for d in m["documents"]:
            pinned = d["name"].split("/", 1)[0] in m["pinned_domains"]
            self.assertEqual("text" in d, pinned, d["name"])
            if pinned:
                self.assertEqual(corpus.Sha256(d["text"]), d["sha256"], d["name"])


if __name__ == "__main__":
    unittest.main()
