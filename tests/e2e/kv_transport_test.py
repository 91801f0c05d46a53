#!/usr/bin/env python3
"""The KV transfer's UCX transport, as a prefill worker reports it (the label `transport` of
pagedweight_kv_transfer_bytes_total and its log line "KV transfers to DECODE over UCX transport
T"), with real processes on loopback:
  1. the default deployment on one host: the prefill worker's endpoint asks for no peer failure
     detection, so UCX takes shared memory: the label names shared-memory transports (sysv,
     posix, cma), not tcp, and counts every byte of the completion's KV;
  2. PW_UCX_ERR_MODE=peer: UCX 1.13 then takes only transports that detect a dead peer, which
     is tcp over loopback: the label is exactly "tcp".
The kube e2e (kube_play_test.py) asserts "tcp" between pods, each in its own network namespace.

Usage: kv_transport_test.py BUILD_DIR MODEL_DIR
"""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from cluster import SKIP, LocalCluster, model_present  # noqa: E402
from completions import post_completion  # noqa: E402

SHARED_MEMORY = {"sysv", "posix", "cma", "knem", "xpmem"}
METRIC = "pagedweight_kv_transfer_bytes_total"


def transfer_labels(c):
    """{transport: bytes} of the prefill worker's KV transfers."""
    out = {}
    for key, value in c.worker_metrics("prefill-0").items():
        if key.startswith(METRIC + "{"):
            m = re.search(r'transport="([^"]*)"', key)
            assert m, key
            out[m.group(1)] = value
    return out


def run(build_dir, model_dir, log_dir):
    with LocalCluster(build_dir, model_dir, log_dir, kv_blocks=64) as c:
        status, _, reply = post_completion(
            c.port, {"model": c.model_name, "prompt": "The Lord said unto Moses, " * 4,
                     "max_tokens": 4, "temperature": 0})
        assert status == 200, (status, reply)
        labels = transfer_labels(c)
        ucx_put = sum(v for k, v in c.worker_metrics("prefill-0").items()
                      if k.startswith("pagedweight_ucx_bytes_total{") and 'op="put"' in k)
        with open(os.path.join(log_dir, "prefill-0.log")) as f:
            logged = re.findall(r"KV transfers to decode-0 over UCX transport (\S+)", f.read())
    assert len(labels) == 1, labels
    (transport, sent), = labels.items()
    assert sent > 0 and sent == ucx_put, (labels, ucx_put)
    assert logged == [transport], (logged, transport)
    return transport


def main():
    build_dir, model_dir = sys.argv[1], sys.argv[2]
    if not model_present(model_dir):
        return SKIP
    os.environ.pop("PW_UCX_ERR_MODE", None)
    with tempfile.TemporaryDirectory(prefix="pw-kvtl-") as log_dir:
        transport = run(build_dir, model_dir, log_dir)
        names = set(transport.split("+"))
        assert names and names <= SHARED_MEMORY, transport
        print(f"one host, default: KV over {transport!r} (shared memory)")
    os.environ["PW_UCX_ERR_MODE"] = "peer"
    with tempfile.TemporaryDirectory(prefix="pw-kvtl-") as log_dir:
        transport = run(build_dir, model_dir, log_dir)
        assert transport == "tcp", transport
        print(f"PW_UCX_ERR_MODE=peer: KV over {transport!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
