"""What the processor's ledger records say about the job (``_record_config``), and their input ids.

The records themselves are built and written by the batch transaction (``txn.delivery.batch_txn``).
"""

from __future__ import annotations

import asyncio
import logging

from ...message import Message, id_text
from ...producer import AsyncProducer
from ..ledger import RecordConfig
from .config import ProcessorConfig

log = logging.getLogger("txn.processor")


class LedgerRecords:
    """Part of :class:`~txn.delivery.processor.AsyncProcessor`: informative ledger records.

    ``_record_config`` is the hook a subclass overrides to say more about the job in PARKED and
    STARTED records (the Spark runtime adds its transform)."""

    config: ProcessorConfig
    output: str
    inputs: list[str]
    ledger_topic: str
    _ledger: AsyncProducer | None
    _inflight: set[asyncio.Task[None]]

    def _record_config(self) -> RecordConfig:
        c = self.config
        return RecordConfig.of(handler=c.handler_spec, output=self.output, inputs=self.inputs,
                               subscription=c.subscription, parking_suffix=c.parking_suffix,
                               ledger_topic=self.ledger_topic)


def _ids(msgs: list[Message]) -> dict[str, list[str]]:
    """Message ids per topic/partition, as ledger records list them."""
    out: dict[str, list[str]] = {}
    for m in msgs:
        out.setdefault(m.topic_name(), []).append(id_text(m))
    return out
