"""The commit audit: after a broker restart, find committed batches the broker rolled back since.

Pulsar 4.0.8 can bring a transaction that committed a few seconds before a clean restart back as
open, time it out and abort it on every topic it wrote to (apache/pulsar#20150): the transaction
buffers then hide its messages, while the subscription keeps the acknowledgements it had already
applied. The batch's outputs and its ``COMMITTED`` record vanish and its inputs never come again.

The ledger guard reads every committing record of the job as it becomes visible and hands each
``COMMITTED`` record to :meth:`CommitAudit.seen`, which keeps the recent ones (``keep_s``). When
the processor sees its coordinator or a producer reconnect (a restart or a move), it calls
:meth:`CommitAudit.expose`: the records kept then are read again once the transaction timeout
(plus a grace) has passed, when every transaction the coordinator could have brought back has
been resolved. A record no longer readable (:meth:`CommitAudit.check`) belongs to a vanished
batch, which the processor commits again (``CommitPipeline._redo``); records of redone batches
(``<batch>+redo``) already on the ledger are reported so that a batch is redone once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptMessage, PulsarError, Timeout
from ..message import MessageId

log = logging.getLogger("txn.commit_audit")

#: Suffix of the batch id of a vanished batch committed again.
REDO_SUFFIX = "+redo"

Position = tuple[int, int, int]


def position(mid: MessageId) -> Position:
    """(ledger, entry, batch index) of ``mid``: the order of messages on one topic."""
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index())


@dataclass(slots=True)
class SeenCommit:
    """A ``COMMITTED`` record the guard read: where it is and what its transaction acknowledged."""

    at: float  # time.monotonic() when read
    pos: Position
    batch_id: str
    txn_id: str
    inputs: dict[str, list[str]]
    attempts: int = 0  # checks that could not reach it (an open transaction held the reader back)


@dataclass(slots=True)
class OwnCommit:
    """A batch this instance committed: its transaction and its last output per partition."""

    at: float
    batch_id: str
    txn: Any  # TxnID
    last_outputs: dict[str, MessageId]


@dataclass(slots=True)
class Exposure:
    """Records kept when a reconnect was seen, to be checked from ``due`` on."""

    due: float
    records: list[SeenCommit] = field(default_factory=list)
    own: list[OwnCommit] = field(default_factory=list)


@dataclass(slots=True)
class CheckResult:
    """What a check found: records gone, records not reached in time, and batches already redone."""

    vanished: list[SeenCommit]
    unreached: list[SeenCommit]
    redone: set[str]


class CommitAudit:
    """Keeps recent ``COMMITTED`` records and checks them again after a reconnect; see the module."""

    def __init__(self, client: Any, ledger_topic: str, *, keep_s: float, settle_s: float,
                 read_timeout_s: float = 30.0, max_records: int = 10_000) -> None:
        self.client = client
        self.ledger_topic = ledger_topic
        self.keep_s = keep_s
        self.settle_s = settle_s
        self.read_timeout_s = read_timeout_s
        self.max_records = max_records
        self.recent: deque[SeenCommit] = deque()
        self.own: deque[OwnCommit] = deque()
        #: Partitions told to commit a transaction the coordinator had finished without them.
        self.unstuck = 0
        self.exposures: list[Exposure] = []
        #: Positions already found vanished (each is redone once by this instance).
        self.handled: set[Position] = set()
        self.checks = 0
        self.vanished_total = 0

    def seen(self, pos: Position, batch_id: str, txn_id: str, inputs: dict[str, list[str]]) -> None:
        """The guard read a COMMITTED record (a redo's too: it can vanish like any other)."""
        now = time.monotonic()
        self.recent.append(SeenCommit(now, pos, batch_id, txn_id, inputs))
        while self.recent and (now - self.recent[0].at > self.keep_s or len(self.recent) > self.max_records):
            self.recent.popleft()

    def committed_here(self, batch_id: str, txn: Any, last_outputs: dict[str, MessageId]) -> None:
        """This instance committed ``batch_id``: where its last output on each partition is."""
        now = time.monotonic()
        if last_outputs:
            self.own.append(OwnCommit(now, batch_id, txn, last_outputs))
        while self.own and (now - self.own[0].at > self.keep_s or len(self.own) > self.max_records):
            self.own.popleft()

    def expose(self, now: float | None = None, limit: int | None = None) -> int:
        """A reconnect was seen: check the records kept now (the newest ``limit``) once ``settle_s``
        has passed. Returns how many are to be checked."""
        now = time.monotonic() if now is None else now
        records = [r for r in self.recent if now - r.at <= self.keep_s and r.pos not in self.handled]
        if limit is not None:
            records = records[-limit:]
        own = [c for c in self.own if now - c.at <= self.keep_s]
        if records or own:
            self.exposures.append(Exposure(now + self.settle_s, records, own))
        return len(records)

    @property
    def pending(self) -> int:
        """Records (and own commits) waiting for a check."""
        return sum(len(e.records) + len(e.own) for e in self.exposures)

    def due_own(self, now: float | None = None) -> list[OwnCommit]:
        """Own commits whose check is due (call before :meth:`due`, which takes the exposures off)."""
        now = time.monotonic() if now is None else now
        seen: dict[str, OwnCommit] = {}
        for e in self.exposures:
            if e.due <= now:
                for c in e.own:
                    seen[c.batch_id] = c
                e.own = []
        return list(seen.values())

    async def stuck_partitions(self, commit: OwnCommit, wait_s: float = 3.0) -> list[str]:
        """The partitions where ``commit``'s last output is still not readable: a read-committed
        reader started at it gets nothing (an open transaction holds the partition's readable end
        before it). Only asked once every transaction from before the reconnect is resolved."""
        stuck = []
        for topic, mid in commit.last_outputs.items():
            reader = await self.client.create_reader(topic, mid, start_message_id_inclusive=True)
            try:
                try:
                    await reader.read_next(timeout_millis=int(wait_s * 1000))
                except Timeout:
                    stuck.append(topic)
            finally:
                try:
                    await asyncio.wait_for(reader.close(), 10)
                except (PulsarError, TimeoutError):
                    pass
        return stuck

    async def commit_on_partition(self, topic: str, txn: Any) -> None:
        """Deliver the commit of ``txn`` to ``topic``, as its coordinator should have (the
        partition's END_TXN_ON_PARTITION). Only for a transaction the ledger shows committed."""
        from ..connection import check_error, command, next_request_id
        from ..errors import from_server_error
        from ..protocol import pulsar_wire_pb2 as pb

        conn = await self.client._pool.connection_for(topic)  # noqa: SLF001 - the client's own pool
        rid = next_request_id()
        # The low watermark stays 0: it ends no other transaction of the partition.
        resp = await conn.request(command(pb.BaseCommand.END_TXN_ON_PARTITION, request_id=rid, topic=topic,
                                          txnid_least_bits=txn.least, txnid_most_bits=txn.most,
                                          txn_action=pb.COMMIT, txnid_least_bits_of_low_watermark=0), rid)
        check_error(resp, f"commit of {txn} on {topic}", topic=topic)
        r = resp.endTxnOnPartitionResponse
        if r.HasField("error"):
            raise from_server_error(pb.ServerError.Name(r.error), f"commit of {txn} on {topic}: {r.message}",
                                    topic=topic)
        self.unstuck += 1

    def due(self, now: float | None = None) -> list[SeenCommit]:
        """The records whose check is due (each once, oldest first), taken off the waiting list."""
        now = time.monotonic() if now is None else now
        ready = [e for e in self.exposures if e.due <= now]
        if not ready:
            return []
        self.exposures = [e for e in self.exposures if e.due > now]
        by_pos = {r.pos: r for e in ready for r in e.records if r.pos not in self.handled}
        return [by_pos[p] for p in sorted(by_pos)]

    def retry_later(self, records: list[SeenCommit], delay_s: float, max_attempts: int = 10) -> None:
        """Check ``records`` again after ``delay_s`` (at most ``max_attempts`` times each)."""
        again = []
        for r in records:
            r.attempts += 1
            if r.attempts < max_attempts:
                again.append(r)
            else:
                log.error("commit audit on %s: batch %s (txn %s) could not be checked after %d tries; its COMMITTED "
                          "record at %s stays unverified", self.ledger_topic, r.batch_id, r.txn_id, r.attempts, r.pos)
        if again:
            self.exposures.append(Exposure(time.monotonic() + delay_s, again))

    async def check(self, records: list[SeenCommit]) -> CheckResult:
        """Read the ledger from the first of ``records`` to its end: which are no longer readable,
        which could not be reached within ``read_timeout_s``, and which batches were redone."""
        self.checks += 1
        first = min(r.pos for r in records)
        last = max(r.pos for r in records)
        start = MessageId(ledger_id=first[0], entry_id=first[1])  # the whole entry (a record may be batched)
        reader = await self.client.create_reader(self.ledger_topic, start, start_message_id_inclusive=True)
        present: set[Position] = set()
        redone: set[str] = set()
        reached: Position | None = None
        deadline = time.monotonic() + self.read_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if reached is not None and reached >= last and not await reader.has_message_available():
                    break
                try:
                    m = await reader.read_next(timeout_millis=int(min(left, 1.0) * 1000))
                except Timeout:
                    continue
                except CorruptMessage as exc:
                    # Unreadable, but there: never taken for a record the broker rolled back.
                    if isinstance(exc.message_id, MessageId):
                        reached = position(exc.message_id)
                        present.add(reached)
                    continue
                pos = position(m.message_id())
                reached = pos
                present.add(pos)
                data = m.data()
                if REDO_SUFFIX.encode() in data and m.txn_id() is not None:
                    redone.update(_redone_batch(data))
        finally:
            try:
                await asyncio.wait_for(reader.close(), 10)
            except (PulsarError, TimeoutError):
                pass
        if reached is None or reached < last:
            unreached = [r for r in records if reached is None or r.pos > reached]
            checked = [r for r in records if reached is not None and r.pos <= reached]
        else:
            unreached, checked = [], records
        vanished = [r for r in checked if r.pos not in present]
        self.vanished_total += len(vanished)
        return CheckResult(vanished, unreached, redone)


def _redone_batch(data: bytes) -> list[str]:
    """The vanished batch a redo's COMMITTED record names (``<batch>+redo``), if it is one."""
    try:
        d = json.loads(data)
    except ValueError:
        return []
    if not isinstance(d, dict) or d.get("kind") != "COMMITTED":
        return []
    bid = d.get("batch_id")
    if isinstance(bid, str) and bid.endswith(REDO_SUFFIX):
        return [bid[: -len(REDO_SUFFIX)]]
    return []
