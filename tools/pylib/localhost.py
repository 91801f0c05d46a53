"""This machine as the tests and benchmarks use it: a free loopback port for a process to
bind, the resident memory of a process. Standard library only."""

import socket


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's pick; two calls may
    return the same port once the first is given up)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
