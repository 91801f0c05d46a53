#!/usr/bin/env python3
"""tools/pylib: free_port, rss_kib, the /metrics samples, POST /v1/completions and the PyPI venv,
against a real HTTP server on loopback, real processes and a real venv. The venv's installs
are of a local path that does not exist, so nothing reaches PyPI."""
import http.server
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from completions import post_completion  # noqa: E402
from localhost import free_port, rss_kib  # noqa: E402
from prom_samples import parse_metrics, pick, scrape, scrape_if_up  # noqa: E402
from pw_ctl import plan_epoch  # noqa: E402
from pypi_venv import ensure_venv  # noqa: E402

METRICS = """# HELP pagedweight_kv_blocks KV blocks by state
# TYPE pagedweight_kv_blocks gauge
pagedweight_kv_blocks{state="used"} 3
pagedweight_kv_blocks{state="free"} 509
pagedweight_x_seconds_bucket{le="+Inf",what="a b"} 7
pagedweight_up 1.5e+09

"""


class Server(http.server.ThreadingHTTPServer):
    """GET /metrics answers `metrics` (status `metrics_status`); POST /v1/completions answers
    `reply` (bytes) with `status`, after recording the request body in `bodies`."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.metrics, self.metrics_status = METRICS, 200
        self.reply, self.status, self.bodies = b"{}", 200, []
        self.port = self.server_address[1]
        threading.Thread(target=self.serve_forever, daemon=True).start()


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status, body, ctype):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "2")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path != "/metrics":
            return self.answer(404, b"", "text/plain")
        self.answer(self.server.metrics_status, self.server.metrics.encode(), "text/plain")

    def do_POST(self):
        n = int(self.headers["Content-Length"])
        self.server.bodies.append((self.path, self.headers["Content-Type"],
                                   json.loads(self.rfile.read(n))))
        self.answer(self.server.status, self.server.reply, "application/json")


def closed_port():
    """A loopback port nothing listens on (bound, never listened, then closed)."""
    return free_port()


class LocalhostTest(unittest.TestCase):
    def test_free_port_can_be_listened_on(self):
        port = free_port()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()

    def test_rss_of_a_live_process_and_of_one_that_is_gone(self):
        self.assertGreater(rss_kib(os.getpid()), 0)
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()  # reaped: its pid names no process
        self.assertIsNone(rss_kib(child.pid))


class PromSamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def setUp(self):
        self.server.metrics, self.server.metrics_status = METRICS, 200

    def test_parse_reads_every_sample_with_its_labels(self):
        self.assertEqual(parse_metrics(METRICS), {
            'pagedweight_kv_blocks{state="used"}': 3.0,
            'pagedweight_kv_blocks{state="free"}': 509.0,
            'pagedweight_x_seconds_bucket{le="+Inf",what="a b"}': 7.0,
            "pagedweight_up": 1.5e9})

    def test_a_line_that_is_not_a_sample_is_an_error_naming_it(self):
        with self.assertRaisesRegex(ValueError, "pagedweight_broken 1,5"):
            parse_metrics(METRICS + "pagedweight_broken 1,5\n")

    def test_pick_sums_by_prefix_and_label(self):
        m = parse_metrics(METRICS)
        self.assertEqual(pick(m, "pagedweight_kv_blocks"), 512.0)
        self.assertEqual(pick(m, "pagedweight_kv_blocks", 'state="used"'), 3.0)
        self.assertEqual(pick(m, "pagedweight_none"), 0)

    def test_scrape_of_a_process_that_answers(self):
        self.assertEqual(scrape(self.server.port), parse_metrics(METRICS))
        self.assertEqual(scrape_if_up(self.server.port), parse_metrics(METRICS))

    def test_scrape_of_a_process_that_does_not_answer(self):
        port = closed_port()
        with self.assertRaises(OSError):
            scrape(port)
        self.assertEqual(scrape_if_up(port), {})

    def test_scrape_of_a_process_that_answers_an_error(self):
        self.server.metrics_status = 503
        with self.assertRaises(OSError):
            scrape(self.server.port)
        self.assertEqual(scrape_if_up(self.server.port), {})


class CompletionsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.shutdown()

    def test_posts_the_body_as_json_and_parses_the_reply(self):
        self.server.reply, self.server.status = b'{"choices": [{"text": "hi"}]}', 200
        body = {"model": "m", "prompt": [1, 2], "max_tokens": 1}
        status, headers, reply = post_completion(self.server.port, body, timeout=30)
        self.assertEqual((status, reply), (200, {"choices": [{"text": "hi"}]}))
        self.assertEqual(headers["retry-after"], "2")  # names lower-cased
        self.assertEqual(self.server.bodies[-1], ("/v1/completions", "application/json", body))

    def test_an_error_status_with_a_text_reply(self):
        self.server.reply, self.server.status = b"overloaded", 429
        self.assertEqual(post_completion(self.server.port, {}, timeout=30)[::2],
                         (429, "overloaded"))

    def test_no_answer_is_status_0_with_the_error(self):
        status, headers, reply = post_completion(closed_port(), {}, timeout=30)
        self.assertEqual((status, headers), (0, {}))
        self.assertIn("ConnectionRefusedError", reply)


class PwCtlTest(unittest.TestCase):
    def test_plan_epoch_of_a_width_change(self):
        self.assertEqual(plan_epoch("set-bits: 128 block(s) to 4 bits, plan epoch 12\n"), 12)

    def test_output_without_an_epoch_exits_showing_it(self):
        with self.assertRaisesRegex(SystemExit, "no plan epoch.*nothing changed"):
            plan_epoch("nothing changed\n")


class PypiVenvTest(unittest.TestCase):
    def test_an_install_that_cannot_be_done_gives_none_then_an_importable_module_the_python(self):
        with tempfile.TemporaryDirectory() as tmp:
            venv = os.path.join(tmp, "venv")
            missing = os.path.join(tmp, "no-such-package")  # a local path: pip fails locally
            self.assertIsNone(ensure_venv(venv, missing, "pw_no_such_module", timeout=600))
            # An install past its timeout (pip cannot start in 1 ms) is a skip, not a crash.
            self.assertIsNone(ensure_venv(venv, missing, "pw_no_such_module", timeout=0.001))
            # The venv is there now; a module it can import needs no install.
            py = ensure_venv(venv, missing, "json", timeout=0.001)
            self.assertEqual(py, os.path.join(venv, "bin", "python"))


if __name__ == "__main__":
    unittest.main()
