#!/usr/bin/env python3
"""tools/check_layers.py on small made-up trees: it passes a tree that follows the layers and
fails, naming the file and line, on an upward include, a policy that includes the engine, the
broker including the engine, and a loop between two engine rooms."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                      "check_layers.py")


def make_tree(root, files):
    for path, includes in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            for inc in includes:
                f.write(f'#include "{inc}"\n')


def check(files):
    with tempfile.TemporaryDirectory() as root:
        make_tree(root, files)
        r = subprocess.run([sys.executable, SCRIPT, "--root", root], capture_output=True,
                           text=True)
        return r.returncode, r.stdout + r.stderr


GOOD = {
    "common/status.h": [],
    "kernels/cpu/dense.h": ["common/status.h"],
    "memory/page_pool.h": ["common/status.h", "kernels/cpu/dense.h"],
    "policies/lynx/lynx.h": ["common/status.h"],
    "engine/models/model.h": ["common/status.h"],
    "engine/experts/moe.h": ["engine/models/model.h", "policies/lynx/lynx.h"],
    "engine/engine.h": ["engine/experts/moe.h", "memory/page_pool.h"],
    "services/workers/decode.cc": ["engine/engine.h"],
    "services/broker/broker.cc": ["common/status.h", "policies/lynx/lynx.h"],
    "tests/engine/engine_test.cc": ["engine/engine.h", "services/broker/broker.cc"],
}


class CheckLayersTest(unittest.TestCase):
    def test_a_tree_that_follows_the_layers_passes(self):
        rc, out = check(GOOD)
        self.assertEqual(rc, 0, out)

    def test_an_upward_include_fails_naming_file_and_line(self):
        rc, out = check({**GOOD, "kernels/cpu/dense.h": ["common/status.h", "memory/page_pool.h"]})
        self.assertEqual(rc, 1)
        self.assertIn("kernels/cpu/dense.h:2: kernels/ may not include memory/page_pool.h", out)

    def test_a_policy_including_the_engine_fails(self):
        rc, out = check({**GOOD, "policies/lynx/lynx.h": ["engine/models/model.h"]})
        self.assertEqual(rc, 1)
        self.assertIn("policies/lynx/lynx.h:1: policies/ may not include engine/models/model.h",
                      out)

    def test_the_broker_including_the_engine_fails(self):
        rc, out = check({**GOOD, "services/broker/broker.cc": ["engine/models/model.h"]})
        self.assertEqual(rc, 1)
        self.assertIn("services/broker/ may not include engine/models/model.h", out)

    def test_a_loop_between_two_rooms_fails(self):
        rc, out = check({**GOOD, "engine/models/model.h": ["engine/experts/moe.h"]})
        self.assertEqual(rc, 1)
        self.assertIn("folder loop: engine/experts <-> engine/models", out)

    def test_the_repository_follows_the_layers(self):
        r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
