"""The ledger records the processor writes outside a transaction (STARTED, ABORTED) and what they carry.

The records written inside a transaction (COMMITTED, PARKED) are sent by the commit pipeline and
by parking, in the same transaction as the outputs and acknowledgements.
"""

from __future__ import annotations

import asyncio
import logging

from ...errors import PulsarError
from ...message import Message
from ...producer import AsyncProducer
from ..ledger import LedgerRecord, RecordConfig
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

    def _record_nowait(self, rec: LedgerRecord) -> None:
        """Queue an informative record (STARTED) without waiting for its receipt."""
        assert self._ledger is not None

        async def go() -> None:
            try:
                fut = await self._ledger.send_async(rec.to_json(), partition_key=rec.batch_id)
                await fut
            except PulsarError as exc:
                log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)

        task = asyncio.get_running_loop().create_task(go())
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _record(self, rec: LedgerRecord) -> None:
        assert self._ledger is not None
        try:
            await self._ledger.send(rec.to_json(), partition_key=rec.batch_id)
        except PulsarError as exc:  # STARTED/ABORTED are informative; the outcome does not depend on them
            log.warning("ledger record %s for %s not written: %s", rec.kind, rec.batch_id, exc)

    def _record_config(self) -> RecordConfig:
        c = self.config
        return RecordConfig.of(handler=c.handler_spec, output=self.output, inputs=self.inputs,
                               subscription=c.subscription, parking_suffix=c.parking_suffix,
                               ledger_topic=self.ledger_topic)


def _ids(msgs: list[Message]) -> dict[str, list[str]]:
    """Message ids per topic/partition, as ledger records list them."""
    out: dict[str, list[str]] = {}
    for m in msgs:
        out.setdefault(m.topic_name(), []).append(str(m.message_id()))
    return out
