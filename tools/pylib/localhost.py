"""This machine as the tests and benchmarks use it: a free loopback port for a process to
bind, the resident memory of a process. Standard library only."""

import socket


_handed_out = set()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick), never one this
    process was given before: the kernel may pick a port again once the first caller gave it
    up, and a cluster's processes bind theirs only later (a broker's control port and a
    worker's metrics port were once the same)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("free_port: the kernel offered only ports handed out already")


def rss_kib(pid):
    """Resident memory of process `pid` in KiB (VmRSS), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None
