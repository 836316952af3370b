"""The ``spark`` fixture for the Spark tests: one local SparkSession shared by the whole run.

Import it into a test module (``from spark_session import spark  # noqa: F401``). The session
is ``local[2]``, without UI, with 2 shuffle partitions and the UTC session time zone; the
``pulsar`` source is registered, and the ``pulsar-txn`` sink too when ``spark_jobs.sink`` is
importable. Python workers run with this interpreter.

It is created on first use and stopped when the pytest run ends. The fixture is module-scoped
only so that a module which stops the active session (e.g. to get another master) does not
leave later modules with a dead one: each module gets the shared session, re-created if it
was stopped.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

_session: Any = None
_cleanup_registered = False


def _alive(s: Any) -> bool:
    return s is not None and getattr(s.sparkContext, "_jsc", None) is not None


def start_spark() -> Any:
    """The shared SparkSession (created, or re-created if stopped, on use)."""
    global _session
    if not _alive(_session):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        s = (
            SparkSession.builder.master("local[2]")
            .appName("pulsar-txn-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.streaming.stopTimeout", "30s")
            .getOrCreate()
        )
        s.sparkContext.setLogLevel("WARN")
        from spark_jobs.source import PulsarDataSource

        s.dataSource.register(PulsarDataSource)
        try:
            from spark_jobs.sink import PulsarTxnDataSource
        except ImportError:
            pass
        else:
            s.dataSource.register(PulsarTxnDataSource)
        _session = s
    return _session


def stop_spark() -> None:
    """Stop the shared session (if running)."""
    global _session
    if _alive(_session):
        _session.stop()
    _session = None


@pytest.fixture(scope="module")
def spark(request: pytest.FixtureRequest) -> Any:
    """The shared SparkSession."""
    global _cleanup_registered
    s = start_spark()
    if not _cleanup_registered:
        request.config.add_cleanup(stop_spark)
        _cleanup_registered = True
    return s
