"""`pw SUBCOMMAND ARGS...` runs the binary beside `pw` with the same arguments, as scripts call
those binaries: for each forwarded subcommand, `pw SUB --help` and `pw SUB --no-such-flag` give
the same exit status and the same output as the binary run directly (real processes).

    pw_subcommands_test.py BUILD_DIR
Exit 0 on success, 1 on failure.
"""
import os
import subprocess
import sys

# pw subcommand -> the binary and the arguments it puts first (services/serve/main.cc).
FORWARDS = {
    "quantize": ("pw-quantize", []),
    "ctl": ("pw-ctl", []),
    "cluster": ("pw-cluster", []),
    "status": ("pw-cluster", ["status"]),
    "config": ("pw-cluster", ["config"]),
    "eval": ("pw-eval", []),
    "sim": ("pw-sim", []),
    "loadgen": ("pw-loadgen", []),
}


def run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def main():
    # The path `pw` finds its neighbours under (/proc/self/exe: links resolved), so that usage
    # lines naming argv[0] read the same.
    bindir = os.path.realpath(os.path.join(sys.argv[1], "bin"))
    pw = os.path.join(bindir, "pw")
    failures = []
    for sub, (binary, first) in FORWARDS.items():
        exe = os.path.join(bindir, binary)
        if not os.access(exe, os.X_OK):
            failures.append(f"{binary}: not built in {bindir}")
            continue
        for args in (["--help"], ["--no-such-flag"]):
            direct = run([exe] + first + args)
            via = run([pw, sub] + args)
            if not (direct[1] + direct[2]).strip():
                failures.append(f"{binary} {' '.join(first + args)}: printed nothing")
            if via != direct:
                failures.append(f"pw {sub} {' '.join(args)}: exit {via[0]}, output\n{via[1]}{via[2]}\n"
                                f"but {binary} {' '.join(first + args)}: exit {direct[0]}, output\n"
                                f"{direct[1]}{direct[2]}")
        print(f"pw {sub} = {binary} {' '.join(first)}".rstrip())
    if failures:
        print("FAIL:\n" + "\n".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
