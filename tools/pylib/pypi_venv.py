"""A venv under the build directory with one package from PyPI, for a test whose client is not
a build dependency (the openai client, lm-evaluation-harness)."""
import os
import subprocess


def ensure_venv(venv, requirement, module, timeout):
    """The python of `venv` once `import module` works there; makes the venv with
    /usr/bin/python3 and pip-installs `requirement` (at most `timeout` s) when it does not.
    None when that cannot be done (no PyPI): the caller reports itself skipped."""
    py = os.path.join(venv, "bin", "python")
    if os.path.exists(py) and subprocess.run([py, "-c", f"import {module}"]).returncode == 0:
        return py
    print("creating", venv, "with", requirement, "from PyPI", flush=True)
    if subprocess.run(["/usr/bin/python3", "-m", "venv", venv]).returncode != 0:
        return None
    try:
        r = subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            requirement], timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    return py if r.returncode == 0 else None
