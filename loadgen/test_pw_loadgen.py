#!/usr/bin/env python3
"""Tests of pw-loadgen's arrival schedule, trace replay and statistics (no server needed)."""
import argparse
import os
import random
import statistics
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pw_loadgen  # noqa: E402

TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data",
                     "traces", "AzureLLMInferenceTrace_conv.csv")


def make_args(**kw):
    d = dict(trace=None, num_requests=20000, rate=10.0, burstiness=1.0, prompt_tokens=64,
             prompt_jitter=0.0, max_tokens=32, trace_offset=0, trace_speedup=1.0,
             max_prompt_tokens=1024, max_output_tokens=256)
    d.update(kw)
    return argparse.Namespace(**d)


def gaps(sched):
    return [b[0] - a[0] for a, b in zip(sched, sched[1:])]


class ScheduleTest(unittest.TestCase):
    def test_poisson_gaps(self):
        g = gaps(pw_loadgen.build_schedule(make_args(), random.Random(1)))
        mean = statistics.fmean(g)
        cv2 = statistics.pvariance(g) / mean ** 2
        self.assertAlmostEqual(mean, 0.1, delta=0.005)   # mean 1/rate
        self.assertAlmostEqual(cv2, 1.0, delta=0.08)     # exponential: CV^2 = 1

    def test_gamma_burstiness(self):
        g = gaps(pw_loadgen.build_schedule(make_args(burstiness=0.25), random.Random(2)))
        mean = statistics.fmean(g)
        cv2 = statistics.pvariance(g) / mean ** 2
        self.assertAlmostEqual(mean, 0.1, delta=0.008)
        self.assertAlmostEqual(cv2, 4.0, delta=0.5)      # gamma shape k: CV^2 = 1/k

    def test_infinite_rate_starts_everything_at_once(self):
        s = pw_loadgen.build_schedule(make_args(rate=float("inf"), num_requests=50),
                                      random.Random(3))
        self.assertEqual(len(s), 50)
        self.assertTrue(all(t == 0.0 for t, _, _ in s))
        self.assertTrue(all(p == 64 and o == 32 for _, p, o in s))

    def test_trace_replay(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,3960,109\n"
                    "2023-11-16 18:15:51.2224670,0,999\n")
            path = f.name
        try:
            s = pw_loadgen.build_schedule(
                make_args(trace=path, trace_speedup=2.0, max_prompt_tokens=1000,
                          max_output_tokens=100), random.Random(0))
        finally:
            os.unlink(path)
        self.assertEqual(len(s), 3)
        self.assertAlmostEqual(s[1][0], (50.9951690 - 46.6805900) / 2, places=5)
        self.assertEqual(s[1][1], 1000)   # clipped prompt
        self.assertEqual(s[2][1], 1)      # at least one prompt token
        self.assertEqual(s[2][2], 100)    # clipped output

    @unittest.skipUnless(os.path.exists(TRACE), "shared trace not present")
    def test_shared_trace_parses(self):
        s = pw_loadgen.build_schedule(make_args(trace=TRACE, num_requests=500), random.Random(0))
        self.assertEqual(len(s), 500)
        self.assertTrue(all(b[0] >= a[0] for a, b in zip(s, s[1:])))


class StatsTest(unittest.TestCase):
    def test_percentile(self):
        v = list(range(1, 101))
        self.assertEqual(pw_loadgen.percentile(v, 50), 50.5)
        self.assertEqual(pw_loadgen.percentile(v, 0), 1)
        self.assertEqual(pw_loadgen.percentile(v, 100), 100)
        self.assertTrue(pw_loadgen.percentile([], 50) != pw_loadgen.percentile([], 50))  # nan

    def test_summary_formulas(self):
        r = pw_loadgen.RequestResult()
        r.ok, r.ttft, r.latency, r.output_tokens, r.itl = True, 0.1, 1.1, 11, [0.1] * 10
        bad = pw_loadgen.RequestResult()
        bad.status, bad.error = 429, "busy"
        s = pw_loadgen.summarize(argparse.Namespace(slo_ttft_ms=200, slo_tpot_ms=50), [r, bad], 2.0,
                                 2)
        self.assertEqual(s["completed"], 1)
        self.assertEqual(s["failed"], 1)
        self.assertAlmostEqual(s["tpot"]["p50_ms"], 100.0)  # (1.1 - 0.1) / (11 - 1)
        self.assertAlmostEqual(s["ttft"]["mean_ms"], 100.0)
        self.assertEqual(s["goodput_per_s"], 0.0)            # TPOT 100 ms > SLO 50 ms
        self.assertEqual(s["errors"], {"429 busy": 1})


if __name__ == "__main__":
    unittest.main()
