"""Renders helm/pagedweight with Helm's engine (helm-python-sdk), as `helm template` would:
the manifests as one multi-document YAML on stdout (NOTES.txt left out).

    BUILD/helm-venv/bin/python tests/helm/render_chart.py RELEASE NAMESPACE VALUES.yaml... """
import os
import sys

import helm_python as helm
import yaml

CHART = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "helm", "pagedweight"))


def main():
    release, namespace, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    values = {}
    for f in files:
        with open(f) as fh:
            values.update(yaml.safe_load(fh) or {})
    chart = helm.Chart.load(CHART)
    try:
        out = chart.render(values, name=release, namespace=namespace, is_install=True)
    except helm.HelmError as e:
        sys.exit(f"render_chart: {e}")
    finally:
        chart.close()
    for path in sorted(out):
        if path.endswith("NOTES.txt") or not out[path].strip():
            continue
        print(f"---\n# Source: {path}\n{out[path].strip()}")


if __name__ == "__main__":
    main()
