"""Parking: a poison message, or an input that cannot be read, moves to ``<input>-parked`` atomically with its ack.

One transaction acknowledges the input, produces it (or, for an unreadable one, an empty message
naming the check that failed) to the parking topic with the error, attempt count and batch id in
its properties (``PARK_*``), and writes a PARKED record. A replay reads those properties back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...client import AsyncClient
from ...consumer import AsyncConsumer
from ...errors import CorruptMessage, OwnershipLost, PulsarError, TransactionError
from ...message import Message
from ...producer import AsyncProducer
from ...topic import parse_topic
from ...transaction import AsyncTransaction
from ..batch_txn import BatchScope, BatchTxn
from ..fencing import PartitionFences
from ..ledger import Kind, now_ms
from ..ledger_guard import LedgerGuard
from .config import ProcessorConfig, ProcessorStats
from .failures import BatchFailed, _err

log = logging.getLogger("txn.processor")

#: Property names the processor adds to parked messages.
PARK_ERROR = "pulsar-txn.error"
PARK_ATTEMPTS = "pulsar-txn.attempts"
PARK_BATCH = "pulsar-txn.batch_id"
PARK_JOB = "pulsar-txn.job"
PARK_SOURCE_TOPIC = "pulsar-txn.source_topic"
PARK_SOURCE_ID = "pulsar-txn.source_message_id"
#: On a parked message that could not be read at all (bad checksum, lying sizes): the check that
#: failed. Its payload is empty; the source topic and message id say where the entry is stored.
PARK_CORRUPT = "pulsar-txn.corrupt"
#: The schema version the input was written with (hex of the broker's version bytes), if any: the
#: parked copy is its bytes, so a replay decodes it as the original (``replay_batch(input_schema=)``).
PARK_SCHEMA_VERSION = "pulsar-txn.schema_version"
PARK_PROPS = (PARK_ERROR, PARK_ATTEMPTS, PARK_BATCH, PARK_JOB, PARK_SOURCE_TOPIC, PARK_SOURCE_ID, PARK_CORRUPT,
              PARK_SCHEMA_VERSION)


class Parking:
    """Part of :class:`~txn.delivery.processor.AsyncProcessor`: parking failing and unreadable inputs."""

    client: AsyncClient
    config: ProcessorConfig
    stats: ProcessorStats
    guard: LedgerGuard | None
    _consumer: AsyncConsumer | None
    _ledger: AsyncProducer | None
    fences: PartitionFences | None
    batches: BatchScope
    _handback: set[Any]

    hand_back: Callable[[list[Message]], None]  # CommitPipeline's

    async def park_message(self, m: Message, why: BaseException, batch_id: str) -> None:
        """Park ``m`` for a reason found outside a batch attempt (e.g. the ordering guard's), under ``batch_id``."""
        await self._park(m, BatchFailed(why, m), 0, batch_id)

    async def _park(self, m: Message, failure: BatchFailed, attempts: int, batch_id: str) -> None:
        """Move a poison message to the parking topic, atomically with its ack."""
        c = self.config
        assert self._consumer is not None and self._ledger is not None
        source = parse_topic(m.topic_name()).base
        parked_topic = source + c.parking_suffix
        props = {k: v for k, v in m.properties().items() if k not in PARK_PROPS}
        props.update({
            PARK_ERROR: _err(failure.cause),
            PARK_ATTEMPTS: str(attempts),
            PARK_BATCH: batch_id,
            PARK_JOB: c.job,
            PARK_SOURCE_TOPIC: m.topic_name(),
            PARK_SOURCE_ID: str(m.message_id()),
        })
        version = getattr(m, "raw_schema_version", None)
        if version:
            props[PARK_SCHEMA_VERSION] = version.hex()
        started = now_ms()
        while True:
            bt = await self.batches.open(batch_id, attempts, started_at_ms=started)
            t = bt.t
            try:
                await self._mark(bt, [m.topic_name()])
                p = await self._producer(parked_topic, raw=True)
                # Keep the event time: a replay hands the transform the message as it first saw it.
                await p.send_async(m.data(), properties=props, partition_key=m.partition_key() or None,
                                   event_timestamp=m.event_timestamp() or None, txn=t)
                await self._consumer.acknowledge_many([m], t)
                await bt.write(Kind.PARKED, inputs={m.topic_name(): [str(m.message_id())]},
                               outputs={parked_topic: 1}, error=_err(failure.cause), parked_topic=parked_topic,
                               with_config=True)
                await t.commit()
                if self.guard is not None:
                    self.guard.committed.add_message(m)
                self.stats.parked += 1
                if c.ordering is not None:
                    await c.ordering.on_parked(m)
                log.warning("parked message %s of batch %s on %s: %s", m.message_id(), batch_id, parked_topic,
                            failure)
                return
            except (PulsarError, TransactionError) as exc:
                log.warning("parking %s failed (%s); it is handed back for redelivery", m.message_id(), exc)
                await t.abort_if_open()
                self._park_failed(exc, m)
                return

    async def _mark(self, bt: BatchTxn, partitions: list[str], take_over: bool = False) -> None:
        """The fence markers of ``partitions`` in ``bt``. A partition not held raises
        :class:`~txn.OwnershipLost`, unless ``take_over`` (an input that was just delivered to us):
        then it is taken over first, and its other inputs are handed back to come again."""
        if self.fences is None:
            return
        if take_over:
            for part in self.fences.missing(partitions):
                await self.fences.acquire(part)
                self.stats.takeovers += 1
                assert self._consumer is not None
                self._handback.update(tc for tc in self._consumer.topic_consumers if tc.topic == part)
        await bt.mark(partitions)

    def _park_failed(self, exc: BaseException, m: Message) -> None:
        self._release_if_lost(exc)
        self.hand_back([m])

    def _release_if_lost(self, exc: BaseException) -> None:
        """After :class:`~txn.OwnershipLost`, forget the partition another instance took over."""
        if isinstance(exc, OwnershipLost) and self.fences is not None and exc.topic:
            self.fences.release(exc.topic)
            self.stats.partitions_lost += 1

    async def _park_corrupt(self, exc: CorruptMessage) -> None:
        """Park an input that cannot be read (bad checksum, sizes that lie), never stopping on it.

        One transaction acknowledges the stored entry, produces an empty message to the parking
        topic whose properties name the check that failed, the source topic and message id, and
        writes a PARKED record. If that fails the entry stays unacknowledged and comes back.
        """
        c = self.config
        assert self._consumer is not None and self._ledger is not None
        topic, mid = exc.topic or "", exc.message_id
        parked_topic = parse_topic(topic).base + c.parking_suffix
        batch_id = self._new_batch_id()
        props = {PARK_ERROR: _err(exc), PARK_ATTEMPTS: "0", PARK_BATCH: batch_id, PARK_JOB: c.job,
                 PARK_SOURCE_TOPIC: topic, PARK_SOURCE_ID: str(mid), PARK_CORRUPT: str(exc.reason)}
        started = now_ms()
        log.error("input %s on %s cannot be read (%s); parking it on %s", mid, topic, exc, parked_topic)
        t: AsyncTransaction | None = None
        try:
            bt = await self.batches.open(batch_id, 0, started_at_ms=started)
            t = bt.t
            await self._mark(bt, [topic], take_over=True)
            p = await self._producer(parked_topic, raw=True)
            sent = await p.send_async(b"", properties=props, txn=t)
            await self._consumer.acknowledge(mid, t)
            receipt = await bt.write(Kind.PARKED, inputs={topic: [str(mid)]}, outputs={parked_topic: 1},
                                     error=_err(exc), parked_topic=parked_topic, with_config=True)
            p.flush_now()
            self._ledger.flush_now()
            await sent
            await receipt
            await t.commit()
        except (PulsarError, TransactionError, ValueError) as err:
            log.warning("parking unreadable input %s failed (%s); it stays unacknowledged", mid, err)
            if t is not None:
                await t.abort_if_open()
            self._release_if_lost(err)
            return
        if self.guard is not None:
            self.guard.committed.add(topic, mid.ledger_id(), mid.entry_id(), -1)
        self.stats.parked += 1
