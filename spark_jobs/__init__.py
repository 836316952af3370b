"""Spark as the exactly-once function runtime: a ``pulsar`` source and a ``pulsar-txn`` sink
through Spark's Python Data Source API, and a micro-batch runtime.

``spark_jobs.register(spark)`` registers both formats with a SparkSession, after checking that
the Python interpreter Spark starts for its workers can import this project.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from typing import Any

__all__ = ["WorkerPythonError", "check_worker_python", "register", "worker_python"]

log = logging.getLogger("spark_jobs")

#: What a worker must be able to import (``txn`` pulls in protobuf and the codecs).
_PROBE = "import txn, spark_jobs"
_checked: dict[str, str | None] = {}


class WorkerPythonError(RuntimeError):
    """The interpreter Spark starts for its Python workers cannot import this project."""


def worker_python(spark: Any) -> str:
    """The interpreter Spark starts for Python workers: ``spark.pyspark.python``, else
    ``$PYSPARK_PYTHON``, else ``python3`` from ``PATH`` (Spark's own order)."""
    exe = None
    try:
        exe = spark.conf.get("spark.pyspark.python", None)
    except Exception:  # noqa: BLE001 - a session without the key (or a stub) falls through
        exe = None
    return exe or os.environ.get("PYSPARK_PYTHON") or "python3"


def check_worker_python(spark: Any, timeout: float = 60.0) -> str | None:
    """None if the workers' interpreter imports this project, else a one-line explanation with
    the fix. Checked once per interpreter (cached); the check runs that interpreter here, so on
    a cluster it tells about this machine's copy of the path only."""
    exe = worker_python(spark)
    if exe in _checked:
        return _checked[exe]
    resolved = shutil.which(exe) or exe
    problem: str | None = None
    try:
        proc = subprocess.run([resolved, "-c", _PROBE], capture_output=True, text=True, timeout=timeout,
                              check=False)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            problem = f"cannot import the project ({last})"
    except FileNotFoundError:
        problem = "does not exist"
    except (OSError, subprocess.TimeoutExpired) as exc:
        problem = f"could not be run ({exc})"
    msg = None
    if problem is not None:
        import sys

        msg = (f"Spark's Python workers run {exe!r} ({resolved}), which {problem}: set PYSPARK_PYTHON={sys.executable} "
               f"(or spark.pyspark.python) before the SparkSession starts, or activate the environment that has "
               f"pulsar-txn installed")
    _checked[exe] = msg
    return msg


def _local_master(spark: Any) -> bool:
    try:
        master = str(spark.sparkContext.master)
    except Exception:  # noqa: BLE001
        return False
    return master.startswith("local")


def register(spark: Any, check_workers: bool = True) -> None:
    """Register the ``pulsar`` source and the ``pulsar-txn`` sink with ``spark``.

    Raises :class:`spark_jobs.compat.UnsupportedPySparkError` when the installed pyspark is
    outside the tested range. With ``check_workers``, checks the workers' interpreter
    (:func:`check_worker_python`): on a ``local`` master a bad one raises
    :class:`WorkerPythonError` (every task would fail); on a cluster it is logged as a warning
    (the workers' machines may have their own interpreter at that path)."""
    from .compat import check_pyspark

    check_pyspark()
    if check_workers:
        problem = check_worker_python(spark)
        if problem is not None:
            if _local_master(spark):
                raise WorkerPythonError(problem)
            log.warning("%s", problem)
    from .sink import PulsarTxnDataSource
    from .source import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)
    spark.dataSource.register(PulsarTxnDataSource)
