"""The Helm chart helm/pagedweight, rendered by Helm's own engine (helm-python-sdk: Helm v4's
Go SDK) over the values files of tests/helm/values/, then checked: `helm lint --strict`, every
object against Kubernetes' OpenAPI schemas of two versions (kubernetes-validate --strict), the
prometheus-operator and KEDA objects against their CRDs' schemas (check-jsonschema), the
objects' wiring (selectors, ports, probes, resources, labels), the node file and command lines
through the real binaries (--print-config), and bad values refused at render with a message.

Run by run_chart_tests.py (ctest helm_chart) in the venv it makes; PW_BUILD is the build
directory (the binaries, the embedded model's store)."""
import base64
import copy
import glob
import json
import os
import re
import stat
import signal
import subprocess
import sys
import threading

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "helm", "pagedweight")
VALUES_DIR = os.path.join(os.path.dirname(__file__), "values")
CRDS = os.path.join(os.path.dirname(__file__), "crds")
BUILD = os.environ.get("PW_BUILD", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "bin")
MATRIX = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(VALUES_DIR, "*.yaml")))
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion; native sidecars) and the
# newest kubernetes-validate knows.
KUBE_VERSIONS = ["1.29.0", "1.37.0"]
CRD_KINDS = {"ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml",
             "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
             "ScaledObject": "keda.sh_scaledobjects.yaml"}
CHECK_JSONSCHEMA = os.path.join(os.path.dirname(sys.executable), "check-jsonschema")  # the venv's
NAMESPACE = "serving"
RELEASE = "pw"


def values_of(name):
    with open(os.path.join(VALUES_DIR, name + ".yaml")) as f:
        return yaml.safe_load(f) or {}


def render(values, name=RELEASE):
    """{template path: [objects]} (NOTES.txt left out) as `helm install --dry-run` would make."""
    chart = helm.Chart.load(CHART)
    try:
        out = chart.render(values, name=name, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    objs = {}
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        docs = [d for d in yaml.safe_load_all(text) if d]
        if docs:
            objs[path] = docs
    return objs


_cache = {}


def objects(name):
    if name not in _cache:
        _cache[name] = [o for docs in render(values_of(name)).values() for o in docs]
    return _cache[name]


def of_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


def merged_values(name):
    chart = helm.Chart.load(CHART)
    try:
        return chart.merge_values(values_of(name))
    finally:
        chart.close()


def pod_containers(spec):
    """Every container of a pod spec, init containers (native sidecars) included."""
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def test_matrix_is_there():
    assert {"minimal", "production", "autoscaling", "monitoring", "two-nodes"} <= set(MATRIX)


@pytest.mark.parametrize("name", MATRIX)
def test_lint_strict(name):
    for kube in KUBE_VERSIONS:
        report = helm.lint(CHART, values_of(name), strict=True, namespace=NAMESPACE, kube_version="v" + kube)
        assert report["errors"] == [], report
        bad = [m for m in report["messages"] if m["severity"] >= 2]  # warnings fail under --strict
        assert bad == [], bad


@pytest.mark.parametrize("name", MATRIX)
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_objects_valid_for_kubernetes(name, kube):
    checked = 0
    for o in objects(name):
        if o["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(o, kube, strict=True)
        except Exception as e:  # noqa: BLE001 -- jsonschema's ValidationError or the library's own
            pytest.fail(f"{o['kind']}/{o['metadata']['name']} (Kubernetes {kube}): "
                        f"{getattr(e, 'message', e)} at {list(getattr(e, 'path', []))}")
        checked += 1
    assert checked >= 8  # ConfigMap, Secret(s), ServiceAccount, 3 Deployments, 2 Services, PDBs


def crd_schema(kind, dest):
    with open(os.path.join(CRDS, CRD_KINDS[kind])) as f:
        crd = yaml.safe_load(f)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    path = os.path.join(dest, kind + ".schema.json")
    with open(path, "w") as f:
        json.dump(schema, f)
    return path, f"{crd['spec']['group']}/{version['name']}"


@pytest.mark.parametrize("name", MATRIX)
def test_crd_objects_valid(name, tmp_path):
    found = {k: of_kind(objects(name), k) for k in CRD_KINDS}
    for kind, objs in found.items():
        if not objs:
            continue
        schema, api_version = crd_schema(kind, tmp_path)
        files = []
        for i, o in enumerate(objs):
            assert o["apiVersion"] == api_version, (kind, o["apiVersion"])
            p = tmp_path / f"{kind}-{i}.yaml"
            p.write_text(yaml.safe_dump(o))
            files.append(str(p))
        r = subprocess.run([CHECK_JSONSCHEMA, "--schemafile", schema] + files, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    # The values that turn them on do render them (the checks above are not vacuous).
    if name == "monitoring":
        assert len(found["ServiceMonitor"]) == 1 and len(found["PodMonitor"]) == 2
    if name == "autoscaling":
        assert len(found["ScaledObject"]) == 1
    if name == "minimal":
        assert not any(found.values())


def test_crd_schemas_refuse_a_wrong_object(tmp_path):
    """The CRD check fails on what the CRD forbids (a scrape endpoint's interval not a duration)."""
    sm = copy.deepcopy(of_kind(objects("monitoring"), "ServiceMonitor")[0])
    sm["spec"]["endpoints"][0]["interval"] = "every minute"
    schema, _ = crd_schema("ServiceMonitor", tmp_path)
    p = tmp_path / "sm.yaml"
    p.write_text(yaml.safe_dump(sm))
    r = subprocess.run([CHECK_JSONSCHEMA, "--schemafile", schema, str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "interval" in r.stdout + r.stderr


def matches(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("name", MATRIX)
def test_labels_and_selectors(name):
    objs = objects(name)
    for o in objs:
        labels = o["metadata"].get("labels", {})
        for k in ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "helm.sh/chart"]:
            assert k in labels, (o["kind"], o["metadata"]["name"], k)
    deployments = of_kind(objs, "Deployment")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in deployments} == {"router", "prefill", "decode"}
    pods = {}
    for d in deployments:
        sel = d["spec"]["selector"]["matchLabels"]
        tmpl = d["spec"]["template"]["metadata"]["labels"]
        assert matches(sel, tmpl), d["metadata"]["name"]
        # No other Deployment's pods fall under this selector.
        for other in deployments:
            if other is not d:
                assert not matches(sel, other["spec"]["template"]["metadata"]["labels"])
        pods[d["metadata"]["labels"]["app.kubernetes.io/component"]] = d["spec"]["template"]
    for s in of_kind(objs, "Service"):
        hit = [c for c, t in pods.items() if matches(s["spec"]["selector"], t["metadata"]["labels"])]
        assert hit == ["router"], s["metadata"]["name"]
        names = {p["name"] for c in pod_containers(pods["router"]["spec"]) for p in c.get("ports", [])}
        for p in s["spec"]["ports"]:
            assert p["targetPort"] in names, (s["metadata"]["name"], p)
    for pdb in of_kind(objs, "PodDisruptionBudget"):
        hit = [c for c, t in pods.items() if matches(pdb["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])]
        assert len(hit) == 1, pdb["metadata"]["name"]
    services = of_kind(objs, "Service")
    for sm in of_kind(objs, "ServiceMonitor"):
        hit = [s for s in services if matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert hit, sm["metadata"]["name"]
        ports = {p["name"] for s in hit for p in s["spec"]["ports"]}
        assert all(e["port"] in ports for e in sm["spec"]["endpoints"])
    for pm in of_kind(objs, "PodMonitor"):
        hit = [t for t in pods.values() if matches(pm["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])]
        assert len(hit) == 1, pm["metadata"]["name"]
        ports = {p["name"] for c in pod_containers(hit[0]["spec"]) for p in c.get("ports", [])}
        assert all(e["port"] in ports for e in pm["spec"]["podMetricsEndpoints"])
    for scaler in of_kind(objs, "ScaledObject") + of_kind(objs, "HorizontalPodAutoscaler"):
        target = scaler["spec"]["scaleTargetRef"]["name"]
        decode = [d for d in deployments if d["metadata"]["name"] == target]
        assert decode and decode[0]["metadata"]["labels"]["app.kubernetes.io/component"] == "decode"
        assert "replicas" not in decode[0]["spec"]  # the scaler owns it


@pytest.mark.parametrize("name", MATRIX)
def test_pods_reference_what_exists(name):
    """Every volume a container mounts is a pod volume; every ConfigMap/Secret/claim a pod names
    is rendered or given in the values; every probe's port is a container port."""
    objs = objects(name)
    v = merged_values(name)
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objs}
    external = {("Secret", v["controlPlane"]["existingSecret"]), ("Secret", v["apiKeys"]["existingSecret"]),
                ("PersistentVolumeClaim", v["model"]["pvc"]["existingClaim"])}
    for o in of_kind(objs, "Deployment") + of_kind(objs, "Job"):
        spec = o["spec"]["template"]["spec"]
        vols = {vol["name"]: vol for vol in spec.get("volumes", [])}
        for c in pod_containers(spec):
            for m in c.get("volumeMounts", []):
                assert m["name"] in vols, (o["metadata"]["name"], c["name"], m["name"])
            ports = {p["name"] for p in c.get("ports", [])}
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
                if probe in c and "httpGet" in c[probe]:
                    assert c[probe]["httpGet"]["port"] in ports, (c["name"], probe)
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ("Secret", ref["name"]) in rendered | external
        for vol in vols.values():
            if "configMap" in vol:
                assert ("ConfigMap", vol["configMap"]["name"]) in rendered
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in rendered | external
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in rendered | external


def deployment(objs, component):
    return next(d for d in of_kind(objs, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == component)


def container(spec, name):
    return next(c for c in pod_containers(spec) if c["name"] == name)


@pytest.mark.parametrize("name", MATRIX)
def test_probes_resources_security(name):
    objs = objects(name)
    v = merged_values(name)
    for component in ["router", "prefill", "decode"]:
        spec = deployment(objs, component)["spec"]["template"]["spec"]
        main = container(spec, component)
        for probe in ["startupProbe", "readinessProbe", "livenessProbe"]:
            assert probe in main, (component, probe)
        # SIGTERM drains for drainTimeoutMs; the pod is not killed before that.
        assert spec["terminationGracePeriodSeconds"] * 1000 > v["drainTimeoutMs"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for c in pod_containers(spec):
            assert c["resources"].get("requests"), (component, c["name"])
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            assert not c["securityContext"].get("privileged")
            assert c["image"].startswith(v["image"]["repository"] + ":")
        assert not spec.get("hostNetwork") and not spec.get("hostIPC") and not spec.get("hostPID")
        if component != "router":
            # Model load fits in the startup window (10 minutes by default).
            s = main["startupProbe"]
            assert s["failureThreshold"] * s["periodSeconds"] >= 600
    for component in ["prefill", "decode"]:
        main = container(deployment(objs, component)["spec"]["template"]["spec"], component)
        # Ready: registered, weights resident (/ready); started and alive: the main loop comes
        # round (/live; /metrics answers while the loop is stuck).
        assert main["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
        assert main["startupProbe"]["httpGet"] == {"path": "/live", "port": "metrics"}
        assert main["livenessProbe"]["httpGet"] == {"path": "/live", "port": "metrics"}
        # The pod's address and node from the downward API, given as flags.
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in main["env"] if "valueFrom" in e}
        assert env["POD_IP"] == "status.podIP" and env["NODE_NAME"] == "spec.nodeName"
        args = main["args"]
        assert args[args.index("--advertise-host") + 1] == "$(POD_IP)"
        assert args[args.index("--node") + 1] == "$(NODE_NAME)"
    router = container(deployment(objs, "router")["spec"]["template"]["spec"], "router")
    # Ready means "can serve" (/health: a live prefill and decode worker, not draining);
    # alive must not depend on the workers (a restart would not bring them back).
    assert router["readinessProbe"]["httpGet"]["path"] == "/health"
    assert router["livenessProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    assert router["startupProbe"]["httpGet"] == {"path": "/live", "port": "http"}
    decode = deployment(objs, "decode")["spec"]["template"]["spec"]
    broker = container(decode, "broker")
    assert decode["shareProcessNamespace"] is True
    assert "--bind" in broker["args"] and broker["args"][broker["args"].index("--bind") + 1].startswith("tcp://127.0.0.1:")
    in_init = any(c["name"] == "broker" for c in decode.get("initContainers", []))
    assert in_init == v["broker"]["nativeSidecar"]
    if in_init:
        assert broker["restartPolicy"] == "Always"
    assert broker["startupProbe"]["httpGet"] == {"path": "/live", "port": "broker-metrics"}
    assert broker["livenessProbe"]["httpGet"] == {"path": "/live", "port": "broker-metrics"}


def node_file(objs):
    cm = next(o for o in of_kind(objs, "ConfigMap") if "cluster.yaml" in o.get("data", {}))
    return yaml.safe_load(cm["data"]["cluster.yaml"])


@pytest.mark.parametrize("name", MATRIX)
def test_node_file_schema(name):
    """The ConfigMap's node file has deploy/local.yaml's layout, one entry per role."""
    node = node_file(objects(name))
    with open(os.path.join(ROOT, "deploy", "local.yaml")) as f:
        local = yaml.safe_load(f)
    assert set(node) <= set(local) | {"kv_dtype"}, set(node) - set(local)
    assert [w["id"] for w in node["prefill"]] == ["prefill"] and [w["id"] for w in node["decode"]] == ["decode"]
    assert node["host"] == "0.0.0.0"


def host_node_file(objs, tmp_path):
    """The rendered node file with the model and store paths of this checkout."""
    node = node_file(objs)
    node["model_dir"] = os.path.join(ROOT, "models", "tiny-moe")
    if "store" in node["broker"]:
        node["broker"]["store"] = os.path.join(BUILD, "tiny-moe.apw")
    p = tmp_path / "cluster.yaml"
    p.write_text(yaml.safe_dump(node))
    return str(p)


def key_file(objs, tmp_path):
    """The control keys the pods get: the rendered Secret's file, else fresh ones (a Secret the
    user makes with `pw-cluster keys`)."""
    p = tmp_path / "control.keys"
    secret = [o for o in of_kind(objs, "Secret") if "control.keys" in o.get("stringData", {})]
    if secret:
        p.write_text(secret[0]["stringData"]["control.keys"])
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    else:
        subprocess.run([os.path.join(BIN, "pw-cluster"), "keys", "--out", str(p)], check=True)
    return str(p)


def argv_of(c, objs, tmp_path):
    """A container's command line as the kubelet runs it ($(VAR) from its env), with the node
    file and the key file of this machine."""
    # This machine as the pod: its loopback address as the pod IP.
    env = {"POD_NAME": "pw-pod-0", "POD_IP": "127.0.0.1", "NODE_NAME": "node-0"}
    argv = [os.path.join(BIN, c["command"][0])] + [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
    subst = {"/etc/pagedweight/cluster.yaml": host_node_file(objs, tmp_path)}
    if "--control-keys" in argv:
        subst[argv[argv.index("--control-keys") + 1]] = key_file(objs, tmp_path)
    return [subst.get(a, a) for a in argv]


def print_config(argv):
    r = subprocess.run(argv + ["--print-config"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{' '.join(argv)}\n{r.stdout}{r.stderr}"
    return yaml.safe_load(r.stdout)


@pytest.mark.parametrize("name", MATRIX)
def test_router_and_broker_accept_their_command_lines(name, tmp_path):
    """The router's and the broker's containers, run as rendered, accept the node file (the
    processes' own schemas) and the key file."""
    objs = objects(name)
    router = container(deployment(objs, "router")["spec"]["template"]["spec"], "router")
    cfg = print_config(argv_of(router, objs, tmp_path))
    assert cfg["port"] == merged_values(name)["router"]["port"]
    assert cfg["host"] == "0.0.0.0"
    broker = container(deployment(objs, "decode")["spec"]["template"]["spec"], "broker")
    cfg = print_config(argv_of(broker, objs, tmp_path))
    assert cfg["bind"].startswith("tcp://127.0.0.1:")


# What a worker logs once its transports are set up and it runs (before it has a router).
RUNNING = {"prefill": ": serving, routers ", "decode": "waiting for the broker's expert weights"}


@pytest.mark.parametrize("component", ["prefill", "decode"])
def test_workers_start_with_their_command_lines(component, tmp_path):
    """A worker container's command line, as rendered, starts the worker: it runs until it has
    set up its transports (no router is there; metrics off in this copy of the node file)."""
    objs = objects("minimal")
    c = container(deployment(objs, component)["spec"]["template"]["spec"], component)
    _start_worker(component, argv_of(c, objs, tmp_path))


def _start_worker(component, argv):
    node = yaml.safe_load(open(argv[argv.index("--config") + 1]))
    node[component][0]["metrics_port"] = 0
    with open(argv[argv.index("--config") + 1], "w") as f:
        yaml.safe_dump(node, f)
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # A worker that neither gets there nor exits is stopped after a generous while.
    watchdog = threading.Timer(120, p.kill)
    watchdog.start()
    log = []
    try:
        for line in p.stderr:  # ends when the process exits
            log.append(line)
            if RUNNING[component] in line:
                break
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    assert any(RUNNING[component] in line for line in log), "".join(log[-5:])


@pytest.mark.parametrize("component", ["prefill", "decode"])
def test_workers_accept_their_options(component, tmp_path):
    """The worker containers' node file entry and flags, with the router endpoint as an address
    of this machine."""
    objs = objects("production")
    c = container(deployment(objs, component)["spec"]["template"]["spec"], component)
    argv = argv_of(c, objs, tmp_path)
    router = argv.index("--router") + 1
    assert argv[router].startswith("tcp://pw-pagedweight-router-pods:")
    argv[router] = "tcp://127.0.0.1:" + argv[router].rsplit(":", 1)[1]
    cfg = print_config(argv)
    assert cfg["router"] == [argv[router]]
    assert cfg["router_resolve_ms"] == values_of("production")["router"]["resolveMs"]
    assert cfg["id"] == "pw-pod-0"
    assert cfg["advertise_host"] == "127.0.0.1" and cfg["node"] == "node-0"
    assert cfg["broker"] == ("" if component == "prefill" else "tcp://127.0.0.1:5556")
    assert cfg["kv_blocks"] == values_of("production")[component]["config"]["kv_blocks"]
    if component == "decode":
        assert cfg["misses"]["policy"] == "quality-first"


def test_several_routers_reach_every_worker():
    """router.replicas > 1: the router pods behind the router Service, and every worker told the
    headless Service of the router pods, whose name resolves to each router pod's address, and
    to resolve it again (services/workers/common/router_links.h)."""
    objs = objects("production")
    assert values_of("production")["router"]["replicas"] > 1
    router = deployment(objs, "router")
    assert router["spec"]["replicas"] == values_of("production")["router"]["replicas"]
    labels = router["spec"]["template"]["metadata"]["labels"]
    pods = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == "pw-pagedweight-router-pods"]
    assert len(pods) == 1
    spec = pods[0]["spec"]
    assert spec["clusterIP"] == "None"  # headless: one address per router pod
    assert spec["publishNotReadyAddresses"] is True  # a router is ready only once workers register
    assert matches(spec["selector"], labels)
    assert [p["targetPort"] for p in spec["ports"]] == ["control"]
    port = spec["ports"][0]["port"]
    for component in ("prefill", "decode"):
        args = container(deployment(objs, component)["spec"]["template"]["spec"], component)["args"]
        assert args.count("--router") == 1, args
        assert args[args.index("--router") + 1] == f"tcp://pw-pagedweight-router-pods:{port}"
        assert args[args.index("--router-resolve-ms") + 1] == str(values_of("production")["router"]["resolveMs"])
    # The clients' Service still has one address, over every router pod.
    api = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == "pw-pagedweight-router"]
    assert api and api[0]["spec"].get("clusterIP") != "None" and matches(api[0]["spec"]["selector"], labels)


def test_generated_api_key():
    """No API key given: one is generated into the Secret the router reads PW_API_KEY from."""
    objs = objects("minimal")
    secret = next(o for o in of_kind(objs, "Secret") if "api-keys" in o.get("stringData", {}))
    assert re.fullmatch(r"pw-[A-Za-z0-9]{40}", secret["stringData"]["api-keys"])
    router = container(deployment(objs, "router")["spec"]["template"]["spec"], "router")
    ref = next(e for e in router["env"] if e["name"] == "PW_API_KEY")["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "api-keys"}
    given = next(o for o in of_kind(objects("production"), "Secret") if "api-keys" in o.get("stringData", {}))
    assert given["stringData"]["api-keys"] == "pw-test-key-one,pw-test-key-two"


def test_generated_control_keys_start_a_worker(tmp_path):
    """No control keys given: the chart generates the two secrets (32 random bytes each, base64)
    and no public key; a worker reads that file, derives the public keys and starts."""
    values = deep_merge(values_of("minimal"), {"controlPlane": {"existingSecret": ""}})
    objs = [o for docs in render(values).values() for o in docs]
    secret = next(o for o in of_kind(objs, "Secret") if "control.keys" in o.get("stringData", {}))
    text = secret["stringData"]["control.keys"]
    keys = dict(line.split(": ", 1) for line in text.splitlines())
    assert sorted(keys) == ["client_secret", "server_secret"]
    for v in keys.values():
        assert len(base64.b64decode(v, validate=True)) == 32
    assert keys["client_secret"] != keys["server_secret"]
    c = container(deployment(objs, "prefill")["spec"]["template"]["spec"], "prefill")
    argv = argv_of(c, objs, tmp_path)
    assert open(argv[argv.index("--control-keys") + 1]).read() == text
    _start_worker("prefill", argv)


def test_dashboards_are_deploy_grafana():
    objs = objects("monitoring")
    data = {}
    for cm in of_kind(objs, "ConfigMap"):
        if cm["metadata"]["labels"].get("grafana_dashboard") == "1":
            data.update(cm["data"])
    files = sorted(glob.glob(os.path.join(ROOT, "deploy", "grafana", "dashboards", "*.json")))
    assert sorted(data) == [os.path.basename(f) for f in files]
    for f in files:
        assert json.loads(data[os.path.basename(f)]) == json.load(open(f))


def test_store_built_once_per_model():
    objs = objects("production")
    jobs = of_kind(objs, "Job")
    assert len(jobs) == 1  # one Job per release, whatever the number of decode pods
    decode = deployment(objs, "decode")["spec"]["template"]["spec"]
    assert any(c["name"] == "wait-store" for c in decode["initContainers"])
    assert of_kind(objs, "PersistentVolumeClaim")[0]["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


BAD = [
    ("negative replicas", {"decode": {"replicas": -1}}, "at '/decode/replicas': minimum: got -1, want 1"),
    ("unknown key", {"routr": {"replicas": 2}}, "additional properties 'routr' not allowed"),
    ("unknown nested key", {"router": {"replica": 2}}, "additional properties 'replica' not allowed"),
    ("wiring key in a section", {"router": {"config": {"port": 9000}}}, "at '/router/config/port': 'not' failed"),
    ("router resolved too often", {"router": {"resolveMs": 10}}, "at '/router/resolveMs': minimum: got 10, want 100"),
    ("bad storage", {"model": {"storage": "s3"}}, "at '/model/storage'"),
    ("short control key", {"controlPlane": {"existingSecret": "", "keys": {"server_public": "x", "server_secret": "x",
                                                                          "client_public": "x", "client_secret": "x"}}},
     "/controlPlane/keys/server_public"),
    ("pool smaller than one expert at the lowest width",
     {"decode": {"poolMb": 16}, "model": {"geometry": {"hiddenSize": 4096, "moeIntermediateSize": 14336}}},
     "decode.poolMb: 16 MiB is smaller than one expert at 3 bits (66060288 bytes: 3 matrices of 4096 x 14336; model.geometry)"),
    ("store build without a shared volume", {"model": {"store": {"build": True}}},
     "model.store.build: the store is built once into a shared volume; model.storage must be pvc, not image"),
    ("autoscaling bounds", {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
     "autoscaling: minReplicas 5 is above maxReplicas 2"),
]


def deep_merge(a, b):
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.parametrize("what,values,message", BAD, ids=[b[0] for b in BAD])
def test_bad_values_fail_at_render(what, values, message):
    with pytest.raises(helm.HelmError) as e:
        render(deep_merge(values_of("minimal"), values))
    assert message in str(e.value), str(e.value)


def test_pool_of_one_expert_renders():
    """The pool check's boundary: one expert of 4096 x 14336 at 3 bits is 63 MiB."""
    ok = deep_merge(values_of("minimal"), {"decode": {"poolMb": 63}, "model": {"geometry": {"hiddenSize": 4096, "moeIntermediateSize": 14336}}})
    node = node_file([o for docs in render(ok).values() for o in docs])
    assert node["decode"][0]["pool_mb"] == 63


def test_values_reference_is_current():
    """docs/deploy.md's values reference is what tools/helm_values_doc.py makes of the schema."""
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "helm_values_doc.py"), "--check",
                        os.path.join(ROOT, "docs", "deploy.md")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_network_policy():
    """production.yaml turns it on: it covers every pod of the release, lets the given peers
    reach only the router's API port, and lets the release's pods reach each other."""
    objs = objects("production")
    [policy] = of_kind(objs, "NetworkPolicy")
    sel = policy["spec"]["podSelector"]["matchLabels"]
    for d in of_kind(objs, "Deployment") + of_kind(objs, "Job"):
        assert matches(sel, d["spec"]["template"]["metadata"]["labels"]), d["metadata"]["name"]
    api, internal, metrics = policy["spec"]["ingress"]
    router = container(deployment(objs, "router")["spec"]["template"]["spec"], "router")
    http = next(p["containerPort"] for p in router["ports"] if p["name"] == "http")
    assert api["ports"] == [{"port": http, "protocol": "TCP"}]
    assert api["from"] == values_of("production")["networkPolicy"]["apiFrom"]
    assert internal == {"from": [{"podSelector": {"matchLabels": sel}}]}
    assert {p["port"] for p in metrics["ports"]} == {9100, 9101, 9102}
    assert not of_kind(objects("minimal"), "NetworkPolicy")


def test_default_geometry_is_the_embedded_model():
    """The pool check's default expert shape is the embedded model's config.json."""
    with open(os.path.join(ROOT, "models", "tiny-moe", "config.json")) as f:
        cfg = json.load(f)
    g = merged_values("minimal")["model"]["geometry"]
    assert (g["hiddenSize"], g["moeIntermediateSize"]) == (cfg["hidden_size"], cfg["moe_intermediate_size"])
