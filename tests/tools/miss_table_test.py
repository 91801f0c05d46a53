#!/usr/bin/env python3
"""tools/miss_table.py on a misses.csv written here: the rows it prints and Pearson's r, against
values computed by hand; a CSV without its all-resident row first is refused."""
import os
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "miss_table.py")
HEADER = ("residency,preset,eviction,ppl,ppl_change_pct,mass_mean,substitution_rate,"
          "first_choice_substitutions,fetches_per_token,admissions_per_token,sim_us_per_token,"
          "sim_fetches_per_token,sim_us_all_resident\n")


def Run(text):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, TOOL, f.name], capture_output=True, text=True)
    finally:
        os.remove(f.name)


class MissTable(unittest.TestCase):
    def test_rows_and_correlations(self):
        rows = [
            "1,all-resident,-,10.0,0,0,0,0,0,0,,,",
            "0.25,fetch-every-miss,lfu,10.0,0.000,0,0,0,4.5,0,400.0,4.5,100.0",
            "0.25,rule-0.15,lfu,10.1,1.000,0.05,0.10,0,1.9,0,250.0,1.9,100.0",
            "0.25,weight-blind,lfu,10.3,3.000,0.15,0.10,0,1.9,0,250.0,1.9,100.0",
            "0.25,first-choice,lfu,10.2,2.000,0.10,0.30,0,0.4,0,160.0,0.4,100.0",
        ]
        out = Run(HEADER + "\n".join(rows) + "\n")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("| 100 % | all resident | — | 10.0000 | — | 0 | 0 | 0 | 0 | 100.0 |", out.stdout)
        self.assertIn("| 25 % | 0.15 rule | lfu | 10.1000 | +1.00 % | 0.0500 | 10.0 % | 1.900 "
                      "| 0.000 | 250.0 |", out.stdout)
        # m = 0, .05, .15, .10 against 0, 1, 3, 2: exactly linear (r = 1). The share of calls,
        # 0, .1, .1, .3 (mean .125; d's mean 1.5): sxy = .25, sxx = .0475, syy = 5, so
        # r = .25 / sqrt(.2375) = 0.513. Of the three that substitute, .1, .1, .3 against 1, 3, 2:
        # sxy = 0, r = 0.
        self.assertIn("| 25 %, all 4 | 1.000 | 0.513 |", out.stdout)
        self.assertIn("| 25 %, the 3 that substitute | 1.000 | 0.000 |", out.stdout)

    def test_refuses_csv_without_baseline_first(self):
        out = Run(HEADER + "0.25,rule-0.15,lfu,10.1,1.0,0.05,0.1,0,1.9,0,250,1.9,100\n")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("all-resident row first", out.stderr)


if __name__ == "__main__":
    unittest.main()
