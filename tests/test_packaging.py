"""Packaging rules checked in-process (no broker): the pyspark range the ``spark`` extra pins and
the run-time check that refuses another, and the demo's message when its extra is missing."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

from spark_jobs.compat import PYSPARK_SPEC, UnsupportedPySparkError, check_pyspark

ROOT = Path(__file__).resolve().parent.parent


def test_spark_extra_pins_the_checked_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"pyspark{PYSPARK_SPEC}" in project["optional-dependencies"]["spark"]
    assert not [d for d in project["dependencies"] if d.startswith("pulsar-client")]


@pytest.mark.parametrize("version", ["4.1.1", "4.1.9", "4.1.10"])
def test_supported_pyspark_passes(version: str) -> None:
    assert check_pyspark(version) == version


@pytest.mark.parametrize("version", ["4.2.0", "4.1.0", "4.1", "4.0.1", "3.5.3", "5.0.0", "dev"])
def test_unsupported_pyspark_is_refused_naming_both(version: str) -> None:
    with pytest.raises(UnsupportedPySparkError) as err:
        check_pyspark(version)
    assert f"pyspark {version} is installed" in str(err.value)
    assert PYSPARK_SPEC in str(err.value)


def test_installed_pyspark_is_supported() -> None:
    pytest.importorskip("pyspark")
    check_pyspark()


def test_register_and_runtime_refuse_another_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    pyspark = pytest.importorskip("pyspark")
    import spark_jobs
    from spark_jobs.runtime import run_job

    monkeypatch.setattr(pyspark, "__version__", "4.2.0")
    with pytest.raises(UnsupportedPySparkError, match=r"pyspark 4\.2\.0 is installed.*pyspark>=4\.1\.1,<4\.2"):
        spark_jobs.register(object())  # refused before the session is touched
    with pytest.raises(UnsupportedPySparkError, match="4.2.0"):
        run_job(object(), "pulsar://127.0.0.1:1", ["in"], "out", "sub", lambda df: df, progress=None)


def test_demo_without_its_extra_names_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from txn_shell import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pulsar" else real(name, *a))
    assert cli.main(["demo", "--service-url", "pulsar://127.0.0.1:1", "--admin-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'pulsar-txn[demo]'" in err and "pulsar" in err
