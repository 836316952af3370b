"""The package as users get it: built as an sdist, a wheel built from that sdist, installed into a
fresh virtualenv outside the checkout, and run there.

The editable install used everywhere else hides files that the package reads from the
repository (a module that opens ``deploy/...`` at import works there, and fails with
FileNotFoundError from a wheel). Here the wheel is built from a copy of the project's packages,
installed into a new virtualenv in a temporary directory, and then, from a working directory
outside the checkout, ``pulsar-txn --version``, ``pulsar-txn --help`` and an import of every module
of ``txn``, ``coordinator_api``, ``txn_shell`` and ``spark_jobs`` (when pyspark is there) must work
and load the package from the virtualenv.

The new environment has no pip and downloads nothing: the wheel goes in with ``--no-deps`` (this
interpreter's pip installs it there), and the third-party dependencies are taken read-only from
this interpreter's site-packages through a ``.pth`` line, which adds the directory to ``sys.path``
without running the ``.pth`` files inside it (so the checkout's editable finder stays out).

The sdist must hold what a build needs (pyproject, README, LICENSE, every package with its data
files): the wheel built from it must list the same files as the wheel built from the tree. With
the installed package, ``pulsar-txn process`` then processes messages exactly once against the
test broker (the default suite), and a Spark sink write runs in the virtualenv (``slow``).

``python tests/test_wheel_install.py SRC`` runs the same check on another source tree (an old
commit exported with ``git archive``, say) and prints what failed.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import tempfile
import uuid
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("txn", "spark_jobs", "coordinator_api", "txn_shell")
TOP_FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")

#: Run inside the new virtualenv: imports every module of the installed packages and says where
#: each package was loaded from.
IMPORT_ALL = r"""
import importlib, importlib.util, json, pkgutil, sys
packages = [p for p in ("txn", "coordinator_api", "txn_shell", "spark_jobs")
            if p != "spark_jobs" or importlib.util.find_spec("pyspark") is not None]
done, failed, where = [], {}, {}
for name in packages:
    pkg = importlib.import_module(name)
    where[name] = pkg.__file__
    for info in pkgutil.walk_packages(pkg.__path__, name + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
            done.append(info.name)
        except BaseException as exc:
            failed[info.name] = f"{type(exc).__name__}: {exc}"
from txn.protocol.batch import COMPILED
print(json.dumps({"imported": done, "failed": failed, "where": where, "compiled": COMPILED,
                  "pulsar_client": importlib.util.find_spec("pulsar") is not None}))
"""


def _run(argv: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def build_wheel(src: Path, work: Path) -> Path:
    """Build the wheel from a copy of ``src``'s packages (the checkout gets no build/ or egg-info)."""
    copy = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")  # the build compiles its own
    for pkg in PACKAGES:
        if (src / pkg).is_dir():
            shutil.copytree(src / pkg, copy / pkg, ignore=ignore)
    for name in TOP_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, copy / name)
    out = work / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(copy)],
         cwd=work)
    (wheel,) = out.glob("*.whl")
    return wheel


def build_sdist(src: Path, work: Path) -> Path:
    """Build the sdist of a copy of ``src``'s packages (setuptools' PEP 517 hook, no download)."""
    copy = work / "sdist-src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "*.so")  # the build compiles its own
    for pkg in PACKAGES:
        if (src / pkg).is_dir():
            shutil.copytree(src / pkg, copy / pkg, ignore=ignore)
    for name in TOP_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, copy / name)
    out = work / "sdist"
    out.mkdir()
    _run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))",
          str(out)], cwd=copy)
    (sdist,) = out.glob("*.tar.gz")
    return sdist


def wheel_from_sdist(sdist: Path, work: Path) -> Path:
    """Unpack ``sdist`` and build its wheel (what pip does with an sdist)."""
    unpacked = work / "unpacked"
    with tarfile.open(sdist) as tf:
        tf.extractall(unpacked, filter="data")
    (root,) = unpacked.iterdir()
    out = work / "wheel-from-sdist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(root)],
         cwd=work)
    (wheel,) = out.glob("*.whl")
    return wheel


def install(wheel: Path, work: Path, extras: str | None = None) -> Path:
    """A new virtualenv under ``work`` with the wheel installed; returns its ``bin`` directory.

    With ``extras`` (e.g. ``"api"``) pip resolves the wheel's dependencies and extras from the
    package index, as a user's install does; without, they are borrowed (see the module docs)."""
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    py = env_dir / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(py), "install", "-q"]
    if extras is not None:
        _run([*pip, f"{wheel}[{extras}]"], cwd=work, timeout=600)
        return env_dir / "bin"
    _run([*pip, "--no-deps", "--no-index", str(wheel)], cwd=work)
    purelib = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work).strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    Path(purelib, "_borrowed_deps.pth").write_text("".join(p + "\n" for p in deps))
    return env_dir / "bin"


def venv_env() -> dict[str, str]:
    """This process's environment without what would point the virtualenv back at the checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("PULSAR_TXN_")}


def check_installed(bindir: Path, cwd: Path) -> dict:
    """Run the installed command and import every module from ``cwd``; return the import report."""
    env = venv_env()
    version = _run([str(bindir / "pulsar-txn"), "--version"], cwd=cwd, env=env).strip()
    helptext = _run([str(bindir / "pulsar-txn"), "--help"], cwd=cwd, env=env)
    report = json.loads(_run([str(bindir / "python"), "-c", IMPORT_ALL], cwd=cwd, env=env).splitlines()[-1])
    report.update(version=version, help=helptext)
    return report


def _metadata(wheel: Path) -> tuple[list[str], str]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, zf.read(meta).decode()


def wheel_report(src: Path, extras: str | None = None) -> tuple[Path, list[str], dict]:
    """Build ``src``'s wheel, install it, run it; ``(wheel, its file names, report)``."""
    work = Path(tempfile.mkdtemp(prefix="pulsar-txn-wheel-"))
    try:
        wheel = build_wheel(src, work)
        names, metadata = _metadata(wheel)
        run_dir = work / "elsewhere"
        run_dir.mkdir()
        report = check_installed(install(wheel, work, extras), run_dir)
        report["venv"] = str(work / "venv")
        report["metadata"] = metadata
        return wheel, names, report
    finally:
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Installed:
    """The sdist, the wheel built from it (installed in ``bindir``'s virtualenv) and the report."""

    sdist: Path
    sdist_names: list[str]
    wheel: Path
    names: list[str]
    tree_names: list[str]
    report: dict
    bindir: Path
    run_dir: Path


@pytest.fixture(scope="module")
def installed() -> Iterator[Installed]:
    """sdist -> wheel (from the unpacked sdist) -> fresh virtualenv, shared by this module's tests."""
    work = Path(tempfile.mkdtemp(prefix="pulsar-txn-wheel-"))
    try:
        sdist = build_sdist(ROOT, work)
        with tarfile.open(sdist) as tf:
            sdist_names = [n.split("/", 1)[1] for n in tf.getnames() if "/" in n]
        wheel = wheel_from_sdist(sdist, work)
        names, metadata = _metadata(wheel)
        tree_names, _ = _metadata(build_wheel(ROOT, work))
        run_dir = work / "elsewhere"
        run_dir.mkdir()
        bindir = install(wheel, work)
        report = check_installed(bindir, run_dir)
        report.update(venv=str(work / "venv"), metadata=metadata)
        yield Installed(sdist, sdist_names, wheel, names, tree_names, report, bindir, run_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_sdist_holds_what_the_build_needs(installed: Installed) -> None:
    from txn.version import __version__

    assert installed.sdist.name == f"pulsar_txn-{__version__}.tar.gz"
    for needed in ("pyproject.toml", "setup.py", "txn/protocol/_speedups.c", "README.md", "LICENSE", "txn/py.typed",
                   "txn/protocol/pulsar_wire.proto",
                   "txn/protocol/pulsar_wire_pb2.py", "coordinator_api/static/dashboard.js",
                   "txn_shell/pulsar_version.py", "spark_jobs/sink.py", "txn/delivery/processor/metrics.py"):
        assert needed in installed.sdist_names, needed
    # every module of the checkout is in the sdist
    sources = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert sources <= set(installed.sdist_names), sorted(sources - set(installed.sdist_names))
    # the wheel built from the sdist is the wheel built from the tree
    assert sorted(n for n in installed.names if ".dist-info/" not in n) == \
        sorted(n for n in installed.tree_names if ".dist-info/" not in n)


def test_wheel_installs_and_runs_outside_the_checkout(installed: Installed) -> None:
    from txn.version import __version__

    wheel, names, report = installed.wheel, installed.names, installed.report
    assert wheel.name.startswith(f"pulsar_txn-{__version__}-")
    # what the code needs at run time ships in the wheel
    for needed in ("txn/version.py", "txn/protocol/pulsar_wire.proto", "txn_shell/pulsar_version.py",
                   "txn_shell/__main__.py", "txn_shell/spark_cluster.py", "coordinator_api/static/dashboard.js"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "deploy/", "docs/"))]
    # the compiled hot path, built from the sdist's C source, and in use in the virtualenv
    assert [n for n in names if n.startswith("txn/protocol/_speedups.") and n.endswith(".so")], names
    assert report["compiled"] is True
    # the typing marker, and the license file the metadata declares
    assert "txn/py.typed" in names
    assert f"pulsar_txn-{__version__}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: Apache-2.0" in report["metadata"].splitlines()
    # pulsar-client (the official client) is for tests, benchmarks and the demo: an extra, never a core dependency
    requires = {line.split(":", 1)[1].strip() for line in report["metadata"].splitlines()
                if line.startswith("Requires-Dist:")}
    core = {r for r in requires if "extra ==" not in r}
    assert core and not [r for r in core if r.lower().startswith(("pulsar-client", "pulsar_client"))], core
    client_in = {r.split("extra ==", 1)[1].strip().strip("'\"") for r in requires
                 if r.lower().startswith("pulsar-client") and "extra ==" in r}
    assert {"dev", "demo"} <= client_in, requires
    # prometheus-client: only with the metrics extra (and the api extra, which includes it)
    assert not [r for r in core if r.lower().startswith(("prometheus-client", "prometheus_client"))], core
    prom_in = {r.split("extra ==", 1)[1].strip().strip("'\"") for r in requires
               if r.lower().startswith("prometheus-client") and "extra ==" in r}
    assert {"metrics", "api"} <= prom_in, requires
    assert report["version"] == f"pulsar-txn {__version__}"
    assert "usage: pulsar-txn" in report["help"] and "broker" in report["help"]
    assert report["failed"] == {}
    # every module of the checkout was imported, and from the virtualenv, not from the checkout
    for pkg, file in report["where"].items():
        assert file.startswith(report["venv"]) and not file.startswith(str(ROOT)), (pkg, file)
    expected = set()
    for pkg in report["where"]:
        for path in (ROOT / pkg).rglob("*.py"):
            mod = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if not mod.endswith(("__init__", "__main__")) and "__pycache__" not in path.parts:
                expected.add(mod)
    assert expected <= set(report["imported"]), sorted(expected - set(report["imported"]))


#: Run by the virtualenv's interpreter: sends argv[3:] to topic argv[2] with the installed client.
PRODUCE = r"""
import sys, txn
from txn.sync import Client
assert txn.__file__.startswith(sys.prefix), txn.__file__
c = Client(sys.argv[1])
p = c.create_producer(sys.argv[2])
for v in sys.argv[3:]:
    p.send(v.encode())
c.close()
"""


def _fresh_namespace(admin_url: str) -> str:
    from txn.admin import create_namespace

    ns = f"public/wheel-{uuid.uuid4().hex[:8]}"
    create_namespace(admin_url, ns)
    return f"persistent://{ns}/"


@pytest.mark.parametrize("path", ["compiled", "pure"])
def test_installed_processor_processes_exactly_once(installed: Installed, broker, unique_name, path: str) -> None:
    """``pulsar-txn process`` of the installed package: 12 inputs -> 12 outputs, each once; a second
    run over the same subscription finds nothing left to do. On the compiled path and on the pure
    Python one (``TXN_PURE_PYTHON=1``), which a machine without a C compiler runs."""
    import pulsar

    from peer import assert_nothing, read_n

    ns = _fresh_namespace(broker.admin_url)
    inp, out, ledger = (ns + unique_name(x) for x in ("in", "out", "ledger"))
    values = [f"m-{i:02d}" for i in range(12)]
    env = venv_env() | ({"TXN_PURE_PYTHON": "1"} if path == "pure" else {})
    mode = _run([str(installed.bindir / "python"), "-c", "from txn.protocol.batch import COMPILED; print(COMPILED)"],
                cwd=installed.run_dir, env=env).strip()
    assert mode == str(path == "compiled")
    _run([str(installed.bindir / "python"), "-c", PRODUCE, broker.service_url, inp, *values],
         cwd=installed.run_dir, env=env)
    cmd = [str(installed.bindir / "pulsar-txn"), "process", "--service-url", broker.service_url, "--input", inp,
           "--output", out, "--subscription", "wheel", "--job", "wheeljob", "--ledger-topic", ledger,
           "--handler", "txn_shell.examples.handlers:upper", "--batch-max-messages", "5",
           "--exit-when-idle-ms", "3000"]
    first = subprocess.run(cmd, cwd=installed.run_dir, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr[-3000:]
    assert ", 12 messages, 0 aborts, 0 parked, 0 already committed" in first.stderr, first.stderr[-2000:]
    second = subprocess.run(cmd, cwd=installed.run_dir, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "stopped: 0 batches, 0 messages, 0 aborts" in second.stderr, second.stderr[-2000:]
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        reader = official.subscribe(out, "check", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(m.data() for m in read_n(reader, 12)) == [v.upper().encode() for v in values]
        assert_nothing(reader)
    finally:
        official.close()


#: Run by the virtualenv's interpreter: a Spark batch write of argv[4] rows through the installed sink.
SPARK_WRITE = r"""
import sys
import spark_jobs
assert spark_jobs.__file__.startswith(sys.prefix), spark_jobs.__file__
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").appName("wheel-sink").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "1").getOrCreate())
spark_jobs.register(spark)
rows = [(f"row-{i:02d}".encode(),) for i in range(int(sys.argv[4]))]
(spark.createDataFrame(rows, "value binary").write.format("pulsar-txn").mode("append")
 .option("service_url", sys.argv[1]).option("admin_url", sys.argv[2]).option("topic", sys.argv[3]).save())
spark.stop()
print("written")
"""


@pytest.mark.slow
def test_installed_spark_sink_writes_once(installed: Installed, broker, unique_name) -> None:
    """A Spark batch write through the installed ``pulsar-txn`` sink (the executors' Python is the
    virtualenv's): 8 rows -> 8 messages."""
    pytest.importorskip("pyspark")
    import pulsar

    from txn.admin import enable_namespace_dedup

    from peer import assert_nothing, read_n

    ns = _fresh_namespace(broker.admin_url)
    enable_namespace_dedup(broker.admin_url, ns.removeprefix("persistent://").rstrip("/"))  # the sink requires it
    out = ns + unique_name("sink")
    py = str(installed.bindir / "python")
    env = {**venv_env(), "PYSPARK_PYTHON": py, "PYSPARK_DRIVER_PYTHON": py}
    stdout = _run([py, "-c", SPARK_WRITE, broker.service_url, broker.admin_url, out, "8"], cwd=installed.run_dir,
                  env=env, timeout=300)
    assert stdout.strip().endswith("written")
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        reader = official.subscribe(out, "check", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(m.data() for m in read_n(reader, 8)) == [f"row-{i:02d}".encode() for i in range(8)]
        assert_nothing(reader)
    finally:
        official.close()


@pytest.mark.slow
def test_wheel_with_api_extra_resolves_its_own_dependencies() -> None:
    """The wheel with the ``api`` extra, every dependency resolved by pip into a virtualenv that
    borrows nothing (from the package index; pip's cache makes a repeat quick). Without the
    ``spark`` extra pyspark is absent, so ``spark_jobs`` is not imported."""
    from txn.version import __version__

    _, _, report = wheel_report(ROOT, extras="api")
    assert report["version"] == f"pulsar-txn {__version__}"
    assert report["failed"] == {}
    assert set(report["where"]) == {"txn", "coordinator_api", "txn_shell"}
    assert {"txn_shell.cli", "coordinator_api.app", "txn.delivery.processor"} <= set(report["imported"])
    assert not report["pulsar_client"]  # the official client comes only with the dev and demo extras


if __name__ == "__main__":  # python tests/test_wheel_install.py [SRC]
    _, _, rep = wheel_report(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print(rep["version"])
    print(json.dumps(rep["failed"], indent=2) if rep["failed"] else f"{len(rep['imported'])} modules imported")
    sys.exit(1 if rep["failed"] else 0)
