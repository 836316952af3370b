"""Entry file for ``spark-submit``: run a job given as ``module:function``.

.. code-block:: shell

    spark-submit --master spark://host:7077 \\
        --conf spark.pyspark.python=/path/to/venv/bin/python \\
        [--py-files jobs.zip] \\
        "$(python -c 'import spark_jobs.submit as s; print(s.__file__)')" \\
        mypackage.jobs:enrich --input orders --output invoices

    python -m spark_jobs.submit mypackage.jobs:enrich ...   # the same without spark-submit (local[*])

The file takes the job as ``module:function``; the module is imported (from the installed
packages, or from the ``--py-files`` that spark-submit puts on the driver's path) and the
function is called as ``function(spark, *args)`` with the remaining arguments. Before that the
``pulsar`` source and the ``pulsar-txn`` sink are registered (:func:`spark_jobs.register`, which
also checks the workers' interpreter). The function's return value, if an int, is the exit
status. Options such as ``--master`` and ``--conf`` belong to spark-submit; without it, the
session is whatever ``SparkSession.builder.getOrCreate()`` gives (``local[*]``, or the
``PYSPARK_SUBMIT_ARGS`` of the environment).

The executors need the project too: either every worker's interpreter has ``pulsar-txn``
installed (``spark.pyspark.python`` or ``PYSPARK_PYTHON`` naming it), or ship the code with
``--py-files`` (a zip of ``txn`` and ``spark_jobs``; their dependencies, protobuf and the
codecs, must still be installed on the workers).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a file (spark-submit): this directory is sys.path[0]
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]  # no shadowing by our modules
    try:
        import spark_jobs  # noqa: F401 - installed, or from --py-files
    except ImportError:
        sys.path.insert(0, os.path.dirname(_here))  # a source checkout: the project root

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["load_job", "main"]

USAGE = "usage: spark-submit [spark options] spark_jobs/submit.py module:function [job arguments...]"


def load_job(target: str) -> Callable[..., Any]:
    """The function named by ``module:function`` (``ValueError`` naming what is wrong)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"the job must be given as module:function, got {target!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import the job's module {module_name!r}: {exc} (install it, or ship it with "
                         "spark-submit --py-files)") from exc
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ValueError(f"module {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"{target} is not callable")
    return fn  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    """Register the formats, run ``function(spark, *args)`` and stop the session."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if args else 2
    try:
        job = load_job(args[0])
    except ValueError as exc:
        print(f"spark_jobs.submit: {exc}", file=sys.stderr)
        return 2
    from pyspark.sql import SparkSession

    import spark_jobs

    spark = SparkSession.builder.appName(f"pulsar-txn {args[0]}").getOrCreate()
    try:
        spark_jobs.register(spark)
        result = job(spark, *args[1:])
    finally:
        spark.stop()
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


if __name__ == "__main__":
    sys.exit(main())
