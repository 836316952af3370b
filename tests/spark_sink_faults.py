"""Fault injection for the ``pulsar-txn`` sink tests: a sink that fails inside its own writer.

``pulsar-txn-faulty`` is the real sink (batch and streaming) plus a hook after each send: on the
chosen partition and attempt (``fault_attempt=-1``: every attempt), once the row at index
``fault_after`` is stored, it raises (``fault_mode=raise``), kills its own Python worker with
SIGKILL (``kill``), or sleeps ``fault_seconds`` while holding the task's producers (``sleep``).
The module is shipped to executors by value (cloudpickle), so the workers need not import it
from ``tests/``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass
from typing import Any

from spark_jobs.sink import (
    PulsarTxnArrowWriter,
    PulsarTxnDataSource,
    PulsarTxnStreamArrowWriter,
    PulsarTxnStreamWriter,
    PulsarTxnWriter,
    SinkOptions,
)


@dataclass(frozen=True)
class Fault:
    mode: str
    partition: int
    attempt: int
    after: int
    seconds: float


def _fault(options: Any) -> Fault | None:
    o = {str(k).lower(): v for k, v in dict(options).items()}
    if not o.get("fault_mode"):
        return None
    return Fault(o["fault_mode"], int(o.get("fault_partition", 0)), int(o.get("fault_attempt", 0)),
                 int(o.get("fault_after", 0)), float(o.get("fault_seconds", 5)))


class _Faulty:
    fault: Fault | None = None
    _armed: bool | None = None

    async def _after_send(self, index: int, fut: asyncio.Future[Any]) -> None:
        f = self.fault
        if f is None:
            return
        if self._armed is None:
            pid, attempt = self._task_info()  # type: ignore[attr-defined]
            self._armed = pid == f.partition and f.attempt in (attempt, -1)
        if not self._armed or index != f.after:
            return
        await fut  # the row is stored (in the open transaction)
        if f.mode == "raise":
            raise RuntimeError(f"injected failure after {index + 1} rows")
        if f.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.mode == "sleep":
            await asyncio.sleep(f.seconds)


class FaultyWriter(_Faulty, PulsarTxnWriter):
    pass


class FaultyStreamWriter(_Faulty, PulsarTxnStreamWriter):
    pass


class FaultyArrowWriter(_Faulty, PulsarTxnArrowWriter):
    pass


class FaultyStreamArrowWriter(_Faulty, PulsarTxnStreamArrowWriter):
    pass


def _sink_options(options: Any) -> SinkOptions:
    """The sink's options without this module's ``fault_*`` ones (the sink refuses unknown options)."""
    return SinkOptions.parse({k: v for k, v in dict(options).items() if not str(k).lower().startswith("fault_")})


class FaultySink(PulsarTxnDataSource):
    @classmethod
    def name(cls) -> str:
        return "pulsar-txn-faulty"

    def writer(self, schema: Any, overwrite: bool) -> PulsarTxnWriter:
        opts = _sink_options(self.options)
        w = (FaultyArrowWriter if opts.writer == "arrow" else FaultyWriter)(opts, schema)
        w.fault = _fault(self.options)
        return w

    def streamWriter(self, schema: Any, overwrite: bool) -> PulsarTxnStreamWriter:  # noqa: N802
        opts = _sink_options(self.options)
        w = (FaultyStreamArrowWriter if opts.writer == "arrow" else FaultyStreamWriter)(opts, schema)
        w.fault = _fault(self.options)
        return w
