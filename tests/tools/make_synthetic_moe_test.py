#!/usr/bin/env python3
"""make_synthetic_moe (argv[1]) with --expert-ffn on the families whose shared experts are counted
in routed experts' widths (deepseek_v3, glm4_moe): the checkpoint is written and its shared
experts keep their count (n_shared_experts) at the new width."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

BINARY = None


def Header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


class ExpertFfn(unittest.TestCase):
    def Write(self, family, ffn):
        out = tempfile.mkdtemp()
        r = subprocess.run([BINARY, "--type", family, "--layers", "2", "--experts", "8", "--hidden", "64",
                            "--vocab", "64", "--expert-ffn", str(ffn), "--n-group", "1", "--topk-group", "1",
                            "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return json.load(open(os.path.join(out, "config.json"))), Header(os.path.join(out, "model.safetensors"))

    def test_shared_experts_keep_their_count_at_the_new_width(self):
        for family in ("deepseek_v3", "glm4_moe"):
            for ffn in (24, 96):
                config, header = self.Write(family, ffn)
                shared = config["n_shared_experts"]
                self.assertGreaterEqual(shared, 1, family)
                self.assertEqual(config["moe_intermediate_size"], ffn, family)
                gate = [v["shape"] for k, v in header.items() if k.endswith("mlp.shared_experts.gate_proj.weight")]
                self.assertTrue(gate, family)
                self.assertEqual(gate[0], [shared * ffn, 64], family)


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main()
