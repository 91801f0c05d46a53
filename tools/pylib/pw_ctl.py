"""pw-ctl against a node's broker: a command's output, the plan epoch a width change starts,
waiting until every decode worker has committed it. Standard library only."""
import re
import subprocess
import time


class PwCtl:
    """`binary` (pw-ctl) with the broker's control address and the node's key file (pw-cluster
    writes it into its run_dir). A failing command exits the script (SystemExit with pw-ctl's
    message, prefixed with `label` when one is given)."""

    def __init__(self, binary, broker, control_keys, label=""):
        self.argv = [binary, "--broker", broker, "--control-keys", control_keys]
        self.prefix = f"{label}: " if label else ""

    def __call__(self, *args):
        """The stdout of `pw-ctl ARGS`."""
        r = subprocess.run(self.argv + list(args), capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"{self.prefix}pw-ctl {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def change(self, *args):
        """A command that changes widths (set-bits, apply); returns its plan epoch."""
        return plan_epoch(self(*args))

    def wait_committed(self, epoch, timeout=600):
        """Seconds until every decode worker committed `epoch` (polled every 50 ms); exits on
        timeout."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            m = re.search(r"committed epoch (\d+), 0 change", self("show"))
            if m and int(m.group(1)) >= epoch:
                return time.time() - t0
            time.sleep(0.05)
        raise SystemExit(f"{self.prefix}epoch {epoch} not committed in {timeout} s")


def plan_epoch(out):
    """The plan epoch in the output of a width change (`... plan epoch N ...`)."""
    m = re.search(r"plan epoch (\d+)", out)
    if not m:
        raise SystemExit(f"no plan epoch in pw-ctl's output: {out.strip()!r}")
    return int(m.group(1))
