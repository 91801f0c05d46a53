"""A process's Prometheus /metrics as samples: {'name{labels}': value}. Standard library only."""
import urllib.request


def parse_metrics(text):
    """The samples of a Prometheus text exposition; ValueError names a line that is not one."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"not a Prometheus sample: {line!r}") from None
    return out


def scrape(port, timeout=10):
    """The samples of http://127.0.0.1:`port`/metrics; raises OSError (urllib.error.URLError,
    HTTPError) when it does not answer 200."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return parse_metrics(r.read().decode())


def scrape_if_up(port, timeout=5):
    """scrape(), or {} when the process does not answer 200 (killed, stopped, not up yet)."""
    try:
        return scrape(port, timeout)
    except OSError:
        return {}


def pick(m, prefix, label=""):
    """Sum of the samples whose name (with labels) starts with `prefix` and contains `label`."""
    return sum(v for k, v in m.items() if k.startswith(prefix) and label in k)
