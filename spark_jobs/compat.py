"""The pyspark versions ``spark_jobs`` is tested with, and the run-time check against the installed one.

The data sources and the runtime use Spark's Python Data Source API and the driver-side internals
of one Spark minor release; another minor may change them without notice. The ``spark`` extra pins
the same range (``pyproject.toml``; a test keeps the two equal), and :func:`check_pyspark` refuses a
pyspark outside it with a message naming both, instead of failing later inside Spark.
"""

from __future__ import annotations

import re

#: The supported pyspark versions: at least the first, below the second (the tested minor).
PYSPARK_MIN = (4, 1, 1)
PYSPARK_BELOW = (4, 2)
#: The same range as a requirement specifier, as the ``spark`` extra writes it.
PYSPARK_SPEC = ">=4.1.1,<4.2"


class UnsupportedPySparkError(RuntimeError):
    """The installed pyspark is outside :data:`PYSPARK_SPEC`."""


def _release(version: str) -> tuple[int, ...] | None:
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", version)
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def check_pyspark(version: str | None = None) -> str:
    """Return the installed pyspark version (or ``version``) if supported, else raise
    :class:`UnsupportedPySparkError` naming it and the supported range."""
    if version is None:
        import pyspark

        version = str(pyspark.__version__)
    release = _release(version)
    if release is None or not (PYSPARK_MIN <= release < PYSPARK_BELOW):
        raise UnsupportedPySparkError(
            f"pyspark {version} is installed, but spark_jobs supports pyspark{PYSPARK_SPEC} (the tested minor); "
            f"install it with: pip install 'pulsar-txn[spark]'")
    return version
