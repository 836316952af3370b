"""What a platform team checks before it applies ``deploy/k8s`` (fast: no broker, no cluster).

- Every object validates against the Kubernetes API schemas of :data:`K8S_VERSIONS` (strict:
  unknown fields fail), with the schemas the ``kubernetes-validate`` package ships (no download).
  The Prometheus Operator's PodMonitor is a CRD without a schema there: its structure is checked
  here, minimally (apiVersion, kind, the fields it needs, and that it selects a real port).
- Every pod (workload templates, and the Spark executors' pod template in its ConfigMap) meets
  the "restricted" Pod Security Standard: non-root with a non-root uid, no privilege escalation,
  all capabilities dropped, seccomp ``RuntimeDefault``; containers of this project's images also
  run with a read-only root filesystem and an emptyDir on ``/tmp``, as the user their Dockerfile sets.
- The long-running containers have startup, liveness and readiness probes on paths the process
  serves (the control plane's open ``/livez`` and ``/readyz``; ``/livez`` on the metrics port of a
  processor or a Spark driver).
- No Secret with inline data: secrets are referenced by name, and docs/deploying.md's ``kubectl
  create secret`` command creates each key the manifests use.
- Every object carries the ``app.kubernetes.io`` labels; selectors select pods of the manifests.
- Every workload has a PodDisruptionBudget, every metrics port a PodMonitor.
- Every image has a pinned tag (never ``latest``).

``PULSAR_TXN_K8S_DIR`` and ``PULSAR_TXN_DOCKER_DIR`` point the tests at other directories of
manifests and Dockerfiles (e.g. an older revision's, to see that they fail there).
"""

from __future__ import annotations

import os
import re
import shlex
import urllib.request
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")  # PyYAML: the dev extra
kubernetes_validate = pytest.importorskip("kubernetes_validate")  # the dev extra

from txn.version import __version__  # noqa: E402
from txn_shell.pulsar_version import PULSAR_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
K8S_DIR = Path(os.environ.get("PULSAR_TXN_K8S_DIR") or ROOT / "deploy" / "k8s")
DOCKER_DIR = Path(os.environ.get("PULSAR_TXN_DOCKER_DIR") or ROOT / "deploy" / "docker")
DEPLOYING = ROOT / "docs" / "deploying.md"
#: The Kubernetes versions whose API schemas the manifests must pass (the oldest and the newest
#: that the pinned kubernetes-validate ships and this project states in docs/deploying.md).
K8S_VERSIONS = ("1.30", "1.37")
#: Custom resources checked here by structure (kubernetes-validate has only the core API's schemas).
CRDS = {("monitoring.coreos.com/v1", "PodMonitor")}
#: This project's images (deploy/docker) -> their Dockerfile.
OWN_IMAGES = {"pulsar-txn": "Dockerfile", "pulsar-txn-spark": "Dockerfile.spark"}
LABELS = ("name", "instance", "component", "part-of", "version", "managed-by")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
PodSpec = tuple[str, dict[str, Any], dict[str, Any]]  # (where, pod metadata, pod spec)


def _load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@cache
def objects() -> tuple[tuple[str, dict[str, Any]], ...]:
    """(file, object) of every Kubernetes object (documents with apiVersion and kind; the Helm
    values overlay has neither)."""
    out = []
    for path in sorted(K8S_DIR.glob("*.yaml")):
        for d in _load(path):
            if "apiVersion" in d and "kind" in d:
                items = d.get("items", []) if d["kind"].endswith("List") else [d]
                out += [(path.name, o) for o in items]
    assert out, f"no manifests in {K8S_DIR}"
    return tuple(out)


def where(file: str, obj: dict[str, Any]) -> str:
    return f"{file}: {obj['kind']}/{obj.get('metadata', {}).get('name')}"


def embedded_pods() -> Iterator[tuple[str, dict[str, Any]]]:
    """Pod manifests kept in ConfigMaps (the Spark executors' pod template)."""
    for file, obj in objects():
        if obj["kind"] == "ConfigMap":
            for key, text in (obj.get("data") or {}).items():
                if key.endswith((".yaml", ".yml")):
                    doc = yaml.safe_load(text)
                    if isinstance(doc, dict) and doc.get("kind") == "Pod":
                        yield f"{where(file, obj)}[{key}]", doc


def pod_specs() -> list[PodSpec]:
    """Every pod this deployment runs: workload templates, Pods, embedded pod templates."""
    out: list[PodSpec] = []
    for file, obj in objects():
        if obj["kind"] in WORKLOADS:
            spec = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
            t = spec["template"]
            out.append((where(file, obj), t.get("metadata", {}), t["spec"]))
        elif obj["kind"] == "Pod":
            out.append((where(file, obj), obj.get("metadata", {}), obj["spec"]))
    out += [(w, pod.get("metadata", {}), pod["spec"]) for w, pod in embedded_pods()]
    assert out
    return out


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def image_repo_tag(image: str) -> tuple[str, str | None]:
    """``repo:tag`` -> (repo, tag); no tag -> (repo, None). Digests count as a tag."""
    if "@" in image:
        return image.split("@", 1)[0], image.split("@", 1)[1]
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # "host:5000/repo" has a port, not a tag
        return image, None
    return name, tag


def own_image(image: str) -> str | None:
    """The Dockerfile of one of this project's images, else None."""
    return OWN_IMAGES.get(image_repo_tag(image)[0].rsplit("/", 1)[-1])


def submit_conf(container: dict[str, Any]) -> dict[str, str]:
    """Spark ``--conf`` settings of a driver container's PYSPARK_SUBMIT_ARGS."""
    env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
    argv = shlex.split(env.get("PYSPARK_SUBMIT_ARGS", ""))
    return dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# ---------------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str) -> None:
    errors, checked = [], 0
    docs = [(where(f, o), o) for f, o in objects()] + list(embedded_pods())
    for w, obj in docs:
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue  # test_pod_monitors_are_well_formed
        try:
            kubernetes_validate.validate(obj, version, strict=True)
            checked += 1
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{w}: no schema for {obj['apiVersion']} {obj['kind']} in Kubernetes {version}")
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{w}: {str(exc).splitlines()[0]}")
    assert not errors, "\n".join(errors)
    assert checked >= 10


def test_pod_monitors_are_well_formed() -> None:
    """PodMonitor (monitoring.coreos.com/v1): the fields the operator needs, nothing it does not
    know, and each endpoint names a container port of pods it selects."""
    spec_keys = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels",
                 "sampleLimit", "targetLimit", "labelLimit", "attachMetadata"}
    endpoint_keys = {"port", "portNumber", "targetPort", "path", "scheme", "interval", "scrapeTimeout", "params",
                     "honorLabels", "honorTimestamps", "relabelings", "metricRelabelings", "tlsConfig",
                     "authorization", "basicAuth", "bearerTokenSecret", "filterRunning", "enableHttp2",
                     "followRedirects", "proxyUrl", "oauth2"}
    monitors = [(f, o) for f, o in objects() if o["kind"] == "PodMonitor"]
    assert monitors, "no PodMonitor"
    for file, pm in monitors:
        w = where(file, pm)
        assert pm["apiVersion"] == "monitoring.coreos.com/v1", w
        assert pm["metadata"]["name"] and pm["metadata"]["namespace"], w
        spec = pm["spec"]
        assert set(spec) <= spec_keys, (w, set(spec) - spec_keys)
        assert set(spec["selector"]) <= {"matchLabels", "matchExpressions"}, w
        match = spec["selector"]["matchLabels"]
        assert match and all(isinstance(v, str) for v in match.values()), w
        pods = [(pw, spec_) for pw, meta, spec_ in pod_specs() if selects(match, meta.get("labels", {}))]
        assert pods, f"{w} selects no pod of the manifests"
        assert spec["podMetricsEndpoints"], w
        for ep in spec["podMetricsEndpoints"]:
            assert set(ep) <= endpoint_keys, (w, set(ep) - endpoint_keys)
            assert isinstance(ep["port"], str) and ep.get("path", "/metrics").startswith("/"), w
            assert not ep.get("honorLabels"), f"{w}: the series need no honor_labels"
            for pw, pod in pods:
                ports = {p.get("name") for c in pod["containers"] for p in c.get("ports", [])}
                assert ep["port"] in ports, f"{w}: {pw} has no port named {ep['port']}"


# ---------------------------------------------------------------------------------- pod security


def test_every_pod_meets_the_restricted_pod_security_standard() -> None:
    problems = []
    for w, _, spec in pod_specs():
        psc = spec.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True:
            problems.append(f"{w}: pod securityContext.runAsNonRoot is not true")
        if not (isinstance(psc.get("runAsUser"), int) and psc["runAsUser"] > 0):
            problems.append(f"{w}: pod securityContext.runAsUser is not a non-root uid")
        if (psc.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{w}: pod seccompProfile is not RuntimeDefault")
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key):
                problems.append(f"{w}: {key}")
        problems += [f"{w}: hostPath volume {v['name']}" for v in spec.get("volumes", []) if "hostPath" in v]
        for c in containers(spec):
            cw = f"{w} container {c['name']}"
            sc = c.get("securityContext") or {}
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{cw}: allowPrivilegeEscalation is not false")
            if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
                problems.append(f"{cw}: capabilities do not drop ALL")
            if set((sc.get("capabilities") or {}).get("add", [])) - {"NET_BIND_SERVICE"}:
                problems.append(f"{cw}: adds capabilities")
            if sc.get("privileged") or sc.get("runAsNonRoot") is False or sc.get("runAsUser") == 0:
                problems.append(f"{cw}: privileged or root")
            if own_image(c["image"]) and "executor" not in c["name"]:
                # the project's processes write only to /tmp (the Spark driver also to its home)
                if sc.get("readOnlyRootFilesystem") is not True:
                    problems.append(f"{cw}: readOnlyRootFilesystem is not true")
                tmp = [m["name"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
                if not (tmp and tmp[0] in empty):
                    problems.append(f"{cw}: no emptyDir on /tmp")
    assert not problems, "\n".join(problems)


def dockerfile_user(name: str) -> int:
    """The uid of a Dockerfile's last USER (it must be numeric, for runAsNonRoot to be checkable)."""
    users = re.findall(r"^USER\s+(\S+)", (DOCKER_DIR / name).read_text(), re.M)
    assert users, f"{name} has no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, f"{name}: USER {users[-1]} is not a numeric non-root uid"
    return int(uid)


def test_pods_of_the_projects_images_run_as_the_dockerfiles_user() -> None:
    seen = set()
    for w, _, spec in pod_specs():
        for c in containers(spec):
            dockerfile = own_image(c["image"])
            if dockerfile:
                uid = (c.get("securityContext") or {}).get("runAsUser", (spec.get("securityContext") or {})
                                                           .get("runAsUser"))
                assert uid == dockerfile_user(dockerfile), (w, c["name"], uid)
                seen.add(dockerfile)
    assert seen == set(OWN_IMAGES.values())  # both images run somewhere (the executors: the Spark image)


# ---------------------------------------------------------------------------------- probes


def _args(c: dict[str, Any]) -> list[str]:
    return [str(a) for a in c.get("command", []) + c.get("args", [])]


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def long_running() -> list[tuple[str, dict[str, Any]]]:
    """(where, container) of the project's long-running processes: control plane, processors,
    Spark runtime drivers (Deployments and StatefulSets; a Job's container runs to its end)."""
    out = []
    for file, obj in objects():
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                if own_image(c["image"]):
                    out.append((f"{where(file, obj)} container {c['name']}", c))
    return out


@cache
def api_routes() -> dict[str, bool]:
    """Path -> open (no token even with READ_REQUIRES_TOKEN) of the control plane's GET operations,
    as its OpenAPI spec declares them (test_api checks that the server behaves as declared)."""
    from coordinator_api.app import create_app
    from coordinator_api.settings import Settings

    spec = create_app(Settings(project=False, read_requires_token=True)).openapi()
    return {path: "security" not in item["get"] for path, item in spec["paths"].items() if "get" in item}


@cache
def metrics_port_paths() -> dict[str, int]:
    """Status of GET on the processor's metrics server, per probe path the manifests use."""
    from txn.delivery.processor.metrics import ProcessorMetrics

    class Stats:
        batches = aborts = messages = outputs = parked = duplicates_skipped = 0

    paths = {p["httpGet"]["path"] for _, c in long_running() for p in _probes(c) if "httpGet" in p}
    m = ProcessorMetrics("probe", lambda: Stats)
    port = m.serve(0, "127.0.0.1")
    try:
        out = {}
        for path in sorted(paths):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                    out[path] = resp.status
                    body = resp.read()
            except OSError:
                out[path] = 0
                continue
            if path != "/metrics" and b"pulsartxn_" in body:
                out[path] = -1  # served by the exporter's catch-all, not by a probe endpoint
        return out
    finally:
        m.close()


def _probes(c: dict[str, Any]) -> list[dict[str, Any]]:
    return [c[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in c]


def test_long_running_containers_have_truthful_probes() -> None:
    found = {"api": 0, "process": 0, "spark": 0}
    problems = []
    for w, c in long_running():
        argv = _args(c)
        command = argv[0] if argv else ""
        found[command] = found.get(command, 0) + 1
        missing = [k for k in ("startupProbe", "livenessProbe", "readinessProbe") if k not in c]
        if missing:
            problems.append(f"{w}: no {', '.join(missing)}")
            continue
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            get = c[kind].get("httpGet")
            if get is None or get["port"] not in ports:
                problems.append(f"{w}: {kind} is not an httpGet on a named container port")
                continue
            if command == "api":
                want = "/readyz" if kind == "readinessProbe" else "/livez"
                if get["path"] != want or not api_routes().get(get["path"]):
                    problems.append(f"{w}: {kind} on {get['path']} (want the open {want})")
                if ports[get["port"]] != int(_flag(argv, "--port") or 0):
                    problems.append(f"{w}: {kind} port is not the API's --port")
            else:  # processor or Spark driver: the metrics port's /livez
                if ports[get["port"]] != int(_flag(argv, "--metrics-port") or -1):
                    problems.append(f"{w}: {kind} is not on the --metrics-port")
                elif metrics_port_paths().get(get["path"]) != 200:
                    problems.append(f"{w}: {kind} path {get['path']} is not served by the metrics port")
    assert not problems, "\n".join(problems)
    assert found["api"] and found["process"] and found["spark"], found  # all three kinds were checked


# ---------------------------------------------------------------------------------- secrets


def documented_secrets() -> dict[str, set[str]]:
    """Secret name -> keys, from the ``kubectl create secret generic`` commands of docs/deploying.md."""
    text = DEPLOYING.read_text().replace("\\\n", " ")
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if "create secret generic" in line:
            argv = shlex.split(line)
            name = argv[argv.index("generic") + 1]
            keys = {m.group(1) for a in argv if (m := re.match(r"--from-(?:file|literal)=([\w.-]+)=", a))}
            out.setdefault(name, set()).update(keys)
    return out


def secret_refs() -> list[tuple[str, str, str]]:
    """(where, secret name, key) of every secret a pod reads."""
    out = []
    for w, _, spec in pod_specs():
        for c in containers(spec):
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    out.append((f"{w} env {e['name']}", ref["name"], ref["key"]))
            for src in c.get("envFrom", []):
                if "secretRef" in src:
                    out.append((f"{w} envFrom", src["secretRef"]["name"], "*"))
        for v in spec.get("volumes", []):
            if "secret" in v:
                for item in v["secret"].get("items") or [{"key": "*"}]:
                    out.append((f"{w} volume {v['name']}", v["secret"]["secretName"], item["key"]))
    return out


def test_no_inline_secrets_and_every_referenced_secret_is_documented() -> None:
    inline = [where(f, o) for f, o in objects() if o["kind"] == "Secret" and (o.get("data") or o.get("stringData"))]
    assert not inline, f"Secrets with inline values (create them by name instead): {inline}"
    refs = secret_refs()
    assert refs
    created = documented_secrets()
    for w, name, key in refs:
        assert name in created, f"{w}: secret {name} is created by no command in docs/deploying.md"
        assert key == "*" or key in created[name], f"{w}: docs/deploying.md's command gives {name} no key {key}"
    for w, _, spec in pod_specs():  # no placeholder credential in plain env values either
        for c in containers(spec):
            for e in c.get("env", []):
                assert "change-me" not in str(e.get("value", "")), (w, e["name"])


# ---------------------------------------------------------------------------------- labels


def test_every_object_has_the_standard_labels() -> None:
    problems = []
    metas = [(where(f, o), o.get("metadata", {})) for f, o in objects()]
    metas += [(f"{w} pod template", meta) for w, meta, _ in pod_specs()]
    for w, meta in metas:
        labels = meta.get("labels") or {}
        missing = [k for k in LABELS if not labels.get(f"app.kubernetes.io/{k}")]
        if missing:
            problems.append(f"{w}: no app.kubernetes.io/{', '.join(missing)}")
            continue
        if labels["app.kubernetes.io/part-of"] != "pulsar-txn" or labels["app.kubernetes.io/version"] != __version__:
            problems.append(f"{w}: part-of/version are not pulsar-txn/{__version__}")
    assert not problems, "\n".join(problems)


def test_selectors_select_pods_of_the_manifests() -> None:
    """Selectors name stable labels (never the version, which changes with every release) and
    each selects pods of the manifests."""
    templates = [(w, meta.get("labels", {})) for w, meta, _ in pod_specs()]
    for file, obj in objects():
        kind, spec = obj["kind"], obj.get("spec", {})
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "PodDisruptionBudget", "PodMonitor"):
            selector = spec["selector"]["matchLabels"]
        elif kind == "Service" and spec.get("selector"):
            selector = spec["selector"]
        else:
            continue
        w = where(file, obj)
        assert "app.kubernetes.io/version" not in selector, w
        assert any(selects(selector, labels) for _, labels in templates), f"{w} selects no pod"
        if kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
            assert selects(selector, spec["template"]["metadata"]["labels"]), w


def test_every_workload_has_a_disruption_budget_and_every_metrics_port_a_pod_monitor() -> None:
    pdbs = [o["spec"]["selector"]["matchLabels"] for _, o in objects() if o["kind"] == "PodDisruptionBudget"]
    monitors = [o for _, o in objects() if o["kind"] == "PodMonitor"]
    for file, obj in objects():
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        w = where(file, obj)
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert any(selects(s, labels) for s in pdbs), f"{w} has no PodDisruptionBudget"
        for c in obj["spec"]["template"]["spec"]["containers"]:
            if any(p.get("name") == "metrics" or p["containerPort"] == 8000 for p in c.get("ports", [])):
                assert any(selects(m["spec"]["selector"]["matchLabels"], labels) for m in monitors), \
                    f"{w} has metrics but no PodMonitor"
    for _, obj in objects():
        if obj["kind"] == "PodDisruptionBudget":  # never one that blocks every drain
            assert obj["spec"].get("maxUnavailable", 1) != 0, obj["metadata"]["name"]


# ---------------------------------------------------------------------------------- images


def test_every_image_has_a_pinned_tag() -> None:
    images = []
    for w, _, spec in pod_specs():
        for c in containers(spec):
            images.append((f"{w} container {c['name']}", c["image"]))
            conf = submit_conf(c)
            for key in ("spark.kubernetes.container.image", "spark.kubernetes.executor.container.image"):
                if key in conf:
                    images.append((f"{w} {key}", conf[key]))
    problems = []
    for w, image in images:
        repo, tag = image_repo_tag(image)
        if tag is None or tag == "latest":
            problems.append(f"{w}: {image} has no pinned tag")
        elif own_image(image) and tag != __version__:
            problems.append(f"{w}: {image} is not tagged with the package version {__version__}")
        elif repo.endswith("apachepulsar/pulsar") and tag != PULSAR_VERSION:
            problems.append(f"{w}: {image} is not the pinned Pulsar {PULSAR_VERSION}")
    assert not problems, "\n".join(problems)
    assert {own_image(i) for _, i in images} >= set(OWN_IMAGES.values())


def test_dockerfile_base_images_have_tags() -> None:
    for name in sorted(set(OWN_IMAGES.values())):
        text = (DOCKER_DIR / name).read_text()
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
        for base in re.findall(r"^FROM\s+(\S+)", text, re.M):
            resolved = base
            for arg, value in args.items():
                resolved = resolved.replace(f"${{{arg}}}", value)
            assert image_repo_tag(resolved)[1] not in (None, "latest"), (name, base)
