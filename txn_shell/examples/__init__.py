"""The demo behind ``pulsar-txn demo`` and the handlers it runs; it needs the ``demo`` extra."""

from __future__ import annotations

import importlib.util

#: What the demo imports beyond the core package: the official client (reads the outputs back),
#: Spark (the job and the replay), and the control plane's web stack.
DEMO_MODULES = ("pulsar", "pyspark", "fastapi", "uvicorn")


def missing_demo_modules() -> list[str]:
    """The modules of :data:`DEMO_MODULES` that are not installed (empty when the demo can run)."""
    return [m for m in DEMO_MODULES if importlib.util.find_spec(m) is None]
