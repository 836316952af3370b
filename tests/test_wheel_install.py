"""The package as users get it: built as a wheel and installed into a fresh virtualenv outside the
checkout (no broker needed).

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
import tempfile
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("txn", "spark_jobs", "coordinator_api", "txn_shell")
TOP_FILES = ("pyproject.toml", "README.md", "LICENSE")

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
print(json.dumps({"imported": done, "failed": failed, "where": where,
                  "pulsar_client": importlib.util.find_spec("pulsar") is not None}))
"""


def _run(argv: list[str], cwd: Path, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert r.returncode == 0, f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def build_wheel(src: Path, work: Path) -> Path:
    """Build the wheel from a copy of ``src``'s packages (the checkout gets no build/ or egg-info)."""
    copy = work / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
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


def check_installed(bindir: Path, cwd: Path) -> dict:
    """Run the installed command and import every module from ``cwd``; return the import report."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    version = _run([str(bindir / "pulsar-txn"), "--version"], cwd=cwd, env=env).strip()
    helptext = _run([str(bindir / "pulsar-txn"), "--help"], cwd=cwd, env=env)
    report = json.loads(_run([str(bindir / "python"), "-c", IMPORT_ALL], cwd=cwd, env=env).splitlines()[-1])
    report.update(version=version, help=helptext)
    return report


def wheel_report(src: Path, extras: str | None = None) -> tuple[Path, list[str], dict]:
    """Build ``src``'s wheel, install it, run it; ``(wheel, its file names, report)``."""
    work = Path(tempfile.mkdtemp(prefix="pulsar-txn-wheel-"))
    try:
        wheel = build_wheel(src, work)
        with zipfile.ZipFile(wheel) as zf:
            names = zf.namelist()
            (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
            metadata = zf.read(meta).decode()
        run_dir = work / "elsewhere"
        run_dir.mkdir()
        report = check_installed(install(wheel, work, extras), run_dir)
        report["venv"] = str(work / "venv")
        report["metadata"] = metadata
        return wheel, names, report
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_wheel_installs_and_runs_outside_the_checkout() -> None:
    from txn.version import __version__

    wheel, names, report = wheel_report(ROOT)
    assert wheel.name.startswith(f"pulsar_txn-{__version__}-")
    # what the code needs at run time ships in the wheel
    for needed in ("txn/version.py", "txn/protocol/pulsar_wire.proto", "txn_shell/pulsar_version.py",
                   "txn_shell/__main__.py", "txn_shell/spark_cluster.py", "coordinator_api/static/dashboard.js"):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "deploy/", "docs/"))]
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
