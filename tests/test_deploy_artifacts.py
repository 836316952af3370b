"""The deployment artifacts under ``deploy/`` (container images, Kubernetes manifests, the Helm
values overlay, the single-machine compose file, the Prometheus scrape config, the Grafana
dashboard) cannot run here (no container runtime, no cluster). This parses every one of them
and checks that what they use exists in the code: every ``pulsar-txn`` command and flag (against
the command's ``--help``), every ``PULSAR_TXN_*`` variable (against the settings code), every
``module:function`` (imported), every port (the same on both ends), every broker setting (a key
of the pinned distribution's config), every metric the dashboard queries (exported by the code),
and the pinned versions (Pulsar, Spark, Python)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")  # PyYAML: the dev extra

from coordinator_api import metrics as cp_metrics  # noqa: E402
from coordinator_api.settings import Settings  # noqa: E402
from spark_jobs.compat import check_pyspark  # noqa: E402
from txn.delivery.output import load_handler  # noqa: E402
from txn.delivery.processor import metrics as proc_metrics  # noqa: E402
from txn.version import __version__  # noqa: E402
from txn_shell import localbroker  # noqa: E402
from txn_shell.pulsar_version import PULSAR_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = sorted((DEPLOY / "k8s").glob("*.yaml"))
COMPOSE = DEPLOY / "single-machine" / "compose.yaml"
DOCKERFILES = sorted((DEPLOY / "docker").glob("Dockerfile*"))
DASHBOARD = DEPLOY / "grafana" / "pulsar-txn-dashboard.json"
SCRAPE = DEPLOY / "prometheus" / "scrape-config.yaml"
PACKAGE_IMAGE, SPARK_IMAGE = f"pulsar-txn:{__version__}", f"pulsar-txn-spark:{__version__}"
CONTROL_PLANE_PORT, METRICS_PORT = 8000, 9464


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def k8s_objects() -> list[dict[str, Any]]:
    """The Kubernetes objects of the manifests (not the Helm values overlay)."""
    return [d for p in K8S for d in docs(p) if "apiVersion" in d]


def pods() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, pod template metadata, pod spec) of every workload in the manifests."""
    out = []
    for d in k8s_objects():
        if d["kind"] in ("Deployment", "Job", "StatefulSet"):
            t = d["spec"]["template"]
            out.append((d["metadata"]["name"], t.get("metadata", {}), t["spec"]))
    return out


def pulsar_txn_commands() -> list[tuple[str, list[str], dict[str, str]]]:
    """(where, pulsar-txn argv without the program, env) of every container running the package."""
    out = []
    for name, _, spec in pods():
        for c in spec["containers"]:
            if c["image"] == PACKAGE_IMAGE:
                env = {e["name"]: e.get("value", "<secret>") for e in c.get("env", [])}
                out.append((f"k8s {name}/{c['name']}", [str(a) for a in c.get("command", []) + c.get("args", [])], env))
    for name, svc in docs(COMPOSE)[0]["services"].items():
        if svc.get("image") == PACKAGE_IMAGE:
            cmd = svc["command"]
            out.append((f"compose {name}", [str(a) for a in (shlex.split(cmd) if isinstance(cmd, str) else cmd)],
                        {k: str(v) for k, v in svc.get("environment", {}).items()}))
    return out


@cache
def cli_help(*command: str) -> str:
    r = subprocess.run([sys.executable, "-m", "txn_shell.cli", *command, "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _subcommand(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split an argv into its subcommand path (``spark submit``) and the rest."""
    path = [argv[0]]
    if argv[0] == "spark":
        path.append(argv[1])
    return path, argv[len(path):]


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------------------------- everything parses


def test_every_artifact_parses() -> None:
    assert len(K8S) >= 4 and COMPOSE.is_file() and len(DOCKERFILES) == 2
    kinds = {d["kind"] for d in k8s_objects()}
    assert {"Namespace", "Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "Job",
            "PodDisruptionBudget", "PodMonitor"} <= kinds
    assert "Secret" not in kinds  # referenced by name, created by the command in docs/deploying.md
    for d in k8s_objects():
        assert d["metadata"]["name"] and d["metadata"].get("namespace", "pulsar-txn") == "pulsar-txn", d
    assert json.loads(DASHBOARD.read_text())["panels"]
    assert docs(SCRAPE)[0]["scrape_configs"]


# ---------------------------------------------------------------------------------- commands and flags


def test_every_pulsar_txn_command_and_flag_exists() -> None:
    commands = pulsar_txn_commands()
    assert {tuple(_subcommand(argv)[0]) for _, argv, _ in commands} >= {("api",), ("process",), ("spark", "submit")}
    for where, argv, _ in commands:
        path, rest = _subcommand(argv)
        helptext = cli_help(*path)
        for flag in (a for a in rest if a.startswith("--")):
            assert re.search(rf"(^|[\s\[,]){re.escape(flag)}(?=[\s\],=]|$)", helptext, re.M), \
                f"{where}: {' '.join(path)} has no {flag}"


def test_every_handler_and_job_imports() -> None:
    seen = 0
    for where, argv, env in pulsar_txn_commands():
        if "--handler" in argv:
            assert callable(load_handler(_flag(argv, "--handler"))), where
            seen += 1
        if argv[:2] == ["spark", "submit"]:
            job = argv[2]
            assert job in cli_help("spark", "submit") or callable(load_handler(job)), where
        if "PULSAR_TXN_JOBS" in env:
            registry = json.loads(env["PULSAR_TXN_JOBS"])
            for spec in registry.values():
                assert callable(load_handler(spec["handler"])), where
    jobs = next(d for d in k8s_objects() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pulsar-txn-jobs")
    for spec in json.loads(jobs["data"]["jobs.json"]).values():
        assert callable(load_handler(spec["handler"]))
        seen += 1
    assert seen >= 3


def test_the_registry_and_settings_parse_with_the_control_plane_model() -> None:
    jobs = next(d for d in k8s_objects() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "pulsar-txn-jobs")
    api = docs(COMPOSE)[0]["services"]["api"]["environment"]
    s = Settings(jobs=jobs["data"]["jobs.json"], database_url=api["PULSAR_TXN_DATABASE_URL"],
                 service_url=api["PULSAR_TXN_SERVICE_URL"], admin_url=api["PULSAR_TXN_ADMIN_URL"],
                 discover_namespaces=api["PULSAR_TXN_DISCOVER_NAMESPACES"])
    assert list(s.job_registry) == ["orders/enrich"]
    assert Settings(jobs=api["PULSAR_TXN_JOBS"]).job_registry["enrich"].handler == "txn_shell.examples.handlers:upper"
    # the Secret's database URL, as docs/deploying.md tells to create it: psycopg 3, the api extra
    assert "`postgresql+psycopg://USER:PASSWORD@HOST:5432/DB`" in (ROOT / "docs" / "deploying.md").read_text()


# ---------------------------------------------------------------------------------- environment variables


def known_env() -> set[str]:
    """Every PULSAR_TXN_* variable the settings code reads."""
    names = {f"PULSAR_TXN_{f.upper()}" for f in Settings.model_fields}
    text = (ROOT / "txn" / "settings.py").read_text()
    names |= set(re.findall(r"PULSAR_TXN_[A-Z0-9_]+", text))
    prefix_keys = re.findall(r'"([a-z_]+)":\s*"([A-Z0-9_]+)"', text)  # field -> suffix table, if any
    names |= {f"PULSAR_TXN_{suffix}" for _, suffix in prefix_keys}
    return names


def used_env() -> dict[str, str]:
    """PULSAR_TXN_* variable -> where it is set."""
    found = {}
    for where, _, env in pulsar_txn_commands():
        for k in env:
            found.setdefault(k, where)
    for p in [*K8S, COMPOSE, *DOCKERFILES]:
        for k in re.findall(r"\bPULSAR_TXN_[A-Z0-9_]+", p.read_text()):
            found.setdefault(k, str(p.relative_to(ROOT)))
    return {k: v for k, v in found.items() if k.startswith("PULSAR_TXN_")}


def test_every_pulsar_txn_variable_is_read_by_the_settings_code() -> None:
    used = used_env()
    assert {"PULSAR_TXN_SERVICE_URL", "PULSAR_TXN_DATABASE_URL", "PULSAR_TXN_API_TOKEN", "PULSAR_TXN_AUTH_TOKEN",
            "PULSAR_TXN_AUTH_TOKEN_FILE", "PULSAR_TXN_JOBS_FILE"} <= set(used)
    unknown = {k: where for k, where in used.items() if k not in known_env()}
    assert not unknown, unknown


# ---------------------------------------------------------------------------------- ports and probes


def test_control_plane_ports_and_probes() -> None:
    from coordinator_api.app import create_app

    routes = set(create_app(Settings(project=False)).openapi()["paths"])  # the served paths
    (dep,) = [d for d in k8s_objects() if d["kind"] == "Deployment" and d["metadata"]["name"] == "pulsar-txn-api"]
    tmpl = dep["spec"]["template"]
    (c,) = tmpl["spec"]["containers"]
    assert c["image"] == PACKAGE_IMAGE and c["args"][0] == "api"
    assert int(_flag(c["args"], "--port")) == CONTROL_PLANE_PORT and _flag(c["args"], "--host") == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": CONTROL_PLANE_PORT}
    assert (c["livenessProbe"]["httpGet"]["path"], c["readinessProbe"]["httpGet"]["path"]) == ("/livez", "/readyz")
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"]["path"] in routes and probe["httpGet"]["port"] in ports
    assert {"/livez", "/readyz", "/metrics"} <= routes
    ann = tmpl["metadata"]["annotations"]
    assert int(ann["prometheus.io/port"]) == CONTROL_PLANE_PORT and ann["prometheus.io/path"] in routes
    (svc,) = [d for d in k8s_objects() if d["kind"] == "Service" and d["metadata"]["name"] == "pulsar-txn-api"]
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= tmpl["metadata"]["labels"].items()
    assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])
    # the secrets it reads come from one Secret, by name (test_deploy_manifests checks its keys
    # against docs/deploying.md); the mounted file is the registry file
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"pulsar-txn-tokens"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "jobs"]
    assert env["PULSAR_TXN_JOBS_FILE"] == f"{mount['mountPath']}/jobs.json"


def test_processor_metrics_port_and_token_file() -> None:
    (dep,) = [d for d in k8s_objects() if d["kind"] == "Deployment" and d["metadata"]["name"] == "orders-enrich"]
    tmpl = dep["spec"]["template"]
    (c,) = tmpl["spec"]["containers"]
    assert c["args"][0] == "process"
    assert int(_flag(c["args"], "--metrics-port")) == METRICS_PORT == c["ports"][0]["containerPort"]
    assert int(tmpl["metadata"]["annotations"]["prometheus.io/port"]) == METRICS_PORT
    env = {e["name"]: e.get("value") for e in c["env"]}
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "tokens"]
    (item,) = next(v for v in tmpl["spec"]["volumes"] if v["name"] == "tokens")["secret"]["items"]
    assert env["PULSAR_TXN_AUTH_TOKEN_FILE"] == f"{mount['mountPath']}/{item['path']}"
    compose = docs(COMPOSE)[0]["services"]["processor"]
    assert int(_flag(compose["command"], "--metrics-port")) == METRICS_PORT
    assert compose["ports"] == [f"127.0.0.1:{METRICS_PORT}:{METRICS_PORT}"]


def test_spark_runtime_on_kubernetes() -> None:
    (dep,) = [d for d in k8s_objects() if d["kind"] == "Deployment" and d["metadata"]["name"] == "orders-counts"]
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert c["args"][:2] == ["spark", "submit"] and _flag(c["args"], "--master").startswith("k8s://https://")
    env = {e["name"]: e["value"] for e in c["env"]}
    submit = env["PYSPARK_SUBMIT_ARGS"].split()
    assert submit[-1] == "pyspark-shell"  # what pyspark's gateway launcher expects last
    conf = dict(submit[i + 1].split("=", 1) for i, a in enumerate(submit) if a == "--conf")
    assert conf["spark.kubernetes.container.image"] == SPARK_IMAGE
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == spec["serviceAccountName"]
    (svc,) = [d for d in k8s_objects() if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"]
    assert conf["spark.driver.host"] == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    svc_ports = {p["port"] for p in svc["spec"]["ports"]}
    assert {int(conf["spark.driver.port"]), int(conf["spark.driver.blockManager.port"])} == svc_ports
    assert svc_ports <= {p["containerPort"] for p in c["ports"]}
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert int(_flag(c["args"], "--metrics-port")) == METRICS_PORT  # its metrics and /livez probe
    role = next(d for d in k8s_objects() if d["kind"] == "Role")
    assert {"pods", "services", "configmaps"} <= set(role["rules"][0]["resources"])
    assert "create" in role["rules"][0]["verbs"] and "delete" in role["rules"][0]["verbs"]


# ---------------------------------------------------------------------------------- images


def dockerfile(path: Path) -> tuple[dict[str, str], list[str]]:
    """ARG defaults and the instructions (continuation lines joined, comments dropped)."""
    lines, cur = [], ""
    for raw in path.read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        cur += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(cur.strip())
            cur = ""
    args = dict(re.findall(r"^ARG (\w+)=(\S+)", "\n".join(lines), re.M))
    return args, lines


def test_images_install_the_package_with_existing_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    floor = tuple(int(x) for x in project["requires-python"].removeprefix(">=").split("."))
    for path in DOCKERFILES:
        args, lines = dockerfile(path)
        assert tuple(int(x) for x in args["PYTHON_VERSION"].split(".")) >= floor, path
        for line in lines:
            if line.startswith("COPY ") and "--from" not in line:
                for src in line.split()[1:-1]:
                    assert (ROOT / src).exists(), (path.name, src)
        installs = [m for line in lines for m in re.findall(r'"\$\{whl\}\[([a-z,]+)\]"', line)]
        assert installs, path
        for group in installs:
            assert set(group.split(",")) <= extras, (path.name, group)
        # the wheel stage compiles the hot path: a compiler, setup.py, and a check that the wheel holds it
        stage = lines[[i for i, line in enumerate(lines) if line.endswith("AS wheel")][0]:]
        assert any("apt-get install" in line and " gcc " in f"{line} " for line in stage), path.name
        assert any(line.startswith("COPY ") and " setup.py " in line for line in stage), path.name
        assert any(line.startswith("RUN pip wheel") and "_speedups" in line for line in stage), path.name
    args, lines = dockerfile(DEPLOY / "docker" / "Dockerfile")
    assert 'ENTRYPOINT ["/usr/bin/tini", "--", "pulsar-txn"]' in lines
    assert "pulsar-txn" in project["scripts"]
    assert f"EXPOSE {CONTROL_PLANE_PORT} {METRICS_PORT}" in lines
    assert "openjdk-17-jre-headless" in " ".join(lines)  # the runtime driver's JVM


def test_spark_image_matches_the_supported_pyspark() -> None:
    args, lines = dockerfile(DEPLOY / "docker" / "Dockerfile.spark")
    version = args["SPARK_VERSION"]
    assert check_pyspark(version) == version  # inside the spark extra's range
    assert "FROM spark:${SPARK_VERSION}-scala2.13-java17-ubuntu AS spark" in lines
    assert any('"pyspark==${SPARK_VERSION}"' in line for line in lines)
    assert lines[-1] == 'ENTRYPOINT ["/opt/entrypoint.sh"]'  # Spark's: executors start through it


# ---------------------------------------------------------------------------------- Pulsar


@cache
def broker_conf_keys() -> set[str]:
    """Keys of the pinned distribution's conf/broker.conf (or, without it, what the local broker sets)."""
    conf = localbroker.cache_dir() / f"apache-pulsar-{PULSAR_VERSION}" / "conf" / "broker.conf"
    if not conf.is_file():  # the test suite's broker fetches it; deploy/bootstrap.sh too
        localbroker.ensure_distribution()
    return {line.split("=", 1)[0].strip() for line in conf.read_text().splitlines()
            if "=" in line and not line.lstrip().startswith("#")}


def test_helm_values_turn_on_what_transactions_need() -> None:
    (values,) = docs(DEPLOY / "k8s" / "pulsar-values.yaml")
    assert values["defaultPulsarImageTag"] == PULSAR_VERSION
    conf = values["broker"]["configData"]
    for key in ("transactionCoordinatorEnabled", "systemTopicEnabled", "topicLevelPoliciesEnabled",
                "acknowledgmentAtBatchIndexLevelEnabled", "brokerDeduplicationEnabled"):
        assert conf[key] == localbroker.CONFIG_OVERRIDES[key], key  # what the tests run with
    assert conf["transactionCoordinatorEnabled"] == conf["systemTopicEnabled"] == "true"
    assert all(isinstance(v, str) for v in conf.values())  # the chart renders them into a ConfigMap
    assert set(conf) <= broker_conf_keys(), set(conf) - broker_conf_keys()
    assert int(conf["managedLedgerDefaultAckQuorum"]) <= int(conf["managedLedgerDefaultWriteQuorum"]) \
        <= int(conf["managedLedgerDefaultEnsembleSize"]) <= values["bookkeeper"]["replicaCount"]


def test_compose_broker_and_namespaces() -> None:
    services = docs(COMPOSE)[0]["services"]
    assert services["pulsar"]["image"] == services["pulsar-init"]["image"] == f"apachepulsar/pulsar:{PULSAR_VERSION}"
    env = services["pulsar"]["environment"]
    keys = {k.removeprefix("PULSAR_PREFIX_"): v for k, v in env.items() if k.startswith("PULSAR_PREFIX_")}
    for key, value in keys.items():
        assert localbroker.CONFIG_OVERRIDES.get(key) == value, key
    assert set(keys) <= broker_conf_keys()
    assert "set-deduplication public/sink --enable" in services["pulsar-init"]["command"]
    pg = services["postgres"]["environment"]
    url = services["api"]["environment"]["PULSAR_TXN_DATABASE_URL"]
    assert url == (f"postgresql+psycopg://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/"
                   f"{pg['POSTGRES_DB']}")
    assert services["api"]["build"]["dockerfile"] == "deploy/docker/Dockerfile"
    assert (COMPOSE.parent / services["api"]["build"]["context"] / "deploy" / "docker" / "Dockerfile").is_file()
    job = next(d for d in k8s_objects() if d["kind"] == "Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == f"apachepulsar/pulsar:{PULSAR_VERSION}"
    assert "set-deduplication" in " ".join(job["spec"]["template"]["spec"]["containers"][0]["args"])


# ---------------------------------------------------------------------------------- metrics


def queried_metrics() -> set[str]:
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
    assert exprs
    return {n for e in exprs for n in re.findall(r"\b(pulsartxn_[a-z0-9_]+)", e)}


def test_dashboard_queries_only_exported_metrics() -> None:
    exported = set(cp_metrics.METRIC_NAMES) | set(proc_metrics.METRIC_NAMES)
    histograms = {n for n in exported if n.endswith("_seconds") and "latency" in n}
    expanded = exported | {f"{h}_{s}" for h in histograms for s in ("bucket", "count", "sum")}
    used = queried_metrics()
    assert used - expanded == set()
    # it shows both faces: every control-plane and processor series but the projection's is used
    base = {re.sub(r"_(bucket|count|sum)$", "", n) for n in used}
    assert set(proc_metrics.METRIC_NAMES) <= base
    assert set(cp_metrics.METRIC_NAMES) <= base
    assert not [n for n in exported if n.startswith("pulsar_txn_")]  # the broker's own namespace


def test_exporters_label_the_job_pipeline(tmp_path: Path) -> None:
    """Both exporters, rendered without a broker, name the pulsar-txn job ``pipeline``, never ``job``."""
    prom = pytest.importorskip("prometheus_client")
    from coordinator_api.engine import make_engine
    from coordinator_api.projection import Entry, apply_chunk
    from txn.delivery.ledger import LedgerRecord
    from txn.message import MessageId

    class Stats:
        batches = aborts = messages = outputs = parked = duplicates_skipped = 0

    processor = proc_metrics.ProcessorMetrics("orders/enrich", lambda: Stats).render().decode()
    engine = make_engine(f"sqlite:///{tmp_path}/m.db")
    try:
        rec = LedgerRecord(kind="COMMITTED", job="orders/enrich", batch_id="b:1", txn_id="(0,1)", attempt=1,
                           inputs={}, started_at_ms=1)
        apply_chunk(engine, "persistent://public/default/ledger", [Entry(MessageId(ledger_id=1, entry_id=0), 5, rec,
                                                                          rec.to_json())])
        reg = prom.CollectorRegistry(auto_describe=False)
        reg.register(cp_metrics.StateCollector(engine))
        control_plane = prom.generate_latest(reg).decode()
    finally:
        engine.dispose()
    assert 'pulsartxn_processor_batches_committed_total{pipeline="orders/enrich",runtime="processor"} 0.0' in processor
    assert 'pulsartxn_transactions_total{pipeline="orders/enrich",state="COMMITTED"} 1.0' in control_plane
    for text in (processor, control_plane):
        assert not re.search(r"[{,]job=", text)


def test_series_need_no_honor_labels() -> None:
    """The exporters label the pulsar-txn job ``pipeline`` (formerly ``job``, which Prometheus
    reserves for the scrape job): no scrape config keeps exported labels, and the dashboard
    filters and groups by ``pipeline``."""
    (cfg,) = docs(SCRAPE)
    for job in cfg["scrape_configs"]:
        assert not job.get("honor_labels"), job["job_name"]
    d = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    assert any('pipeline=~"$pipeline"' in e for e in exprs)
    assert not [e for e in exprs if re.search(r"\bjob\b", e)]
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "pipeline"]
