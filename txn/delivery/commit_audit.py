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

A record still readable can belong to a commit that never reached one of its output partitions
(the coordinator's END_TXN_ON_PARTITION failed while the partition's bundle was unloading, and it
finished the transaction anyway). That partition's transaction buffer then holds the transaction
open for ever: nothing written there after its first output becomes readable. Each COMMITTED
record names the transaction's first output on every partition (``output_starts``), so any
instance that read it can find such a partition (:meth:`CommitAudit.unstick`): the broker's last
readable position there (GetLastMessageId answers with it) stays before a first output of a
transaction the ledger shows committed. The instance then delivers the commit there itself.
Each instance also keeps where its own recent commits start on every partition, the ledger's
included (:meth:`CommitAudit.committed_here`): a commit that missed the ledger is known to
nobody else.

A commit that missed a partition is aborted there as soon as a later commit of the same
coordinator reaches it (the buffer ends what lies below the coordinator's low watermark): the
outputs vanish under a COMMITTED record that stays. :meth:`CommitAudit.vanished_outputs`
finds them by reading each output partition past the batches' first outputs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptMessage, PulsarError, Timeout
from ..message import MESSAGE_ID_PATTERN, MessageId, TxnID

log = logging.getLogger("txn.commit_audit")

#: Suffix of the batch id of a vanished batch committed again.
REDO_SUFFIX = "+redo"

Position = tuple[int, int, int]

#: The low watermark sent with a commit the audit delivers (read as -1 by the broker: none).
NO_WATERMARK = 2**64 - 1


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
    output_starts: dict[str, Position] = field(default_factory=dict)  # first output per partition
    attempts: int = 0  # checks that could not reach it (an open transaction held the reader back)


@dataclass(slots=True)
class OwnCommit:
    """A batch this instance committed (its coordinator said so): where its transaction's first
    message is on each partition it wrote to, the ledger's included."""

    at: float  # time.monotonic() of the commit
    batch_id: str
    txn_id: str
    output_starts: dict[str, Position]
    attempts: int = 0


async def close_quietly(reader: Any) -> None:
    """Close a reader of the audit's; a failure or a close that hangs is left to the connection."""
    try:
        await asyncio.wait_for(reader.close(), 10)
    except (PulsarError, TimeoutError):
        pass


def output_starts(first: dict[str, MessageId] | None) -> dict[str, str]:
    """The ``output_starts`` of a COMMITTED record: each partition's first output id, as text."""
    return {topic: str(mid) for topic, mid in sorted((first or {}).items())}


def parse_output_starts(value: Any, limit: int = 10_000) -> dict[str, Position]:
    """A record's ``output_starts`` as positions; what is not a ``{topic: id}`` object is left out."""
    if not isinstance(value, dict):
        return {}
    out: dict[str, Position] = {}
    for topic, text in list(value.items())[:limit]:
        m = MESSAGE_ID_PATTERN.fullmatch(text) if isinstance(topic, str) and isinstance(text, str) else None
        if m is not None:
            out[topic] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    return out


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
        #: How long after a reconnect this instance's own commits are checked (no need to wait for
        #: the coordinator's timeout: their outcome is known). Short, so that an instance killed
        #: soon after a restart has still done it.
        self.own_settle_s = 5.0
        #: Commits delivered to a partition that held them open (its readable end moved on).
        self.unstuck = 0
        self.exposures: list[Exposure] = []
        #: Positions already found vanished (each is redone once by this instance).
        self.handled: set[Position] = set()
        #: Positions of records whose outputs were found gone (their outputs are redone once).
        self.handled_outputs: set[Position] = set()
        self.checks = 0
        self.vanished_total = 0

    def seen(self, pos: Position, batch_id: str, txn_id: str, inputs: dict[str, list[str]],
             starts: dict[str, Position] | None = None) -> None:
        """The guard read a COMMITTED record (a redo's too: it can vanish like any other)."""
        now = time.monotonic()
        self.recent.append(SeenCommit(now, pos, batch_id, txn_id, inputs, starts or {}))
        while self.recent and (now - self.recent[0].at > self.keep_s or len(self.recent) > self.max_records):
            self.recent.popleft()

    def committed_here(self, batch_id: str, txn_id: str, starts: dict[str, MessageId]) -> None:
        """This instance committed ``batch_id``: ``starts`` holds its transaction's first message on
        each partition (the ledger's COMMITTED record, the first output on each output partition)."""
        now = time.monotonic()
        pos = {topic: position(mid) for topic, mid in starts.items()}
        if pos:
            self.own.append(OwnCommit(now, batch_id, txn_id, pos))
        while self.own and (now - self.own[0].at > self.keep_s or len(self.own) > self.max_records):
            self.own.popleft()

    def expose(self, now: float | None = None, limit: int | None = None) -> int:
        """A reconnect was seen: check the records kept now (the newest ``limit``) once ``settle_s``
        has passed. Returns how many are to be checked."""
        now = time.monotonic() if now is None else now
        records = [r for r in self.recent if now - r.at <= self.keep_s and r.pos not in self.handled]
        if limit is not None:
            records = records[-limit:]
        if records:
            self.exposures.append(Exposure(now + self.settle_s, records))
        own = [c for c in self.own if now - c.at <= self.keep_s]
        if own:
            self.exposures.append(Exposure(now + self.own_settle_s, own=own))
        return len(records)

    @property
    def pending(self) -> int:
        """Records (and own commits) waiting for a check."""
        return sum(len(e.records) + len(e.own) for e in self.exposures)

    def due_own(self, now: float | None = None) -> list[OwnCommit]:
        """Own commits whose check is due (each once), taken off the waiting list."""
        now = time.monotonic() if now is None else now
        seen: dict[str, OwnCommit] = {}
        for e in self.exposures:
            if e.due <= now and e.own:
                for c in e.own:
                    seen[c.batch_id] = c
                e.own = []
        self.exposures = [e for e in self.exposures if e.records or e.own]
        return list(seen.values())

    def retry_own_later(self, own: list[OwnCommit], delay_s: float, max_attempts: int = 10) -> None:
        """Check own commits again after ``delay_s`` (at most ``max_attempts`` times each)."""
        again = []
        for c in own:
            c.attempts += 1
            if c.attempts < max_attempts:
                again.append(c)
            else:
                log.error("commit audit: batch %s (txn %s) was committed, but a partition it wrote to stays held "
                          "by an open transaction after %d checks", c.batch_id, c.txn_id, c.attempts)
        if again:
            self.exposures.append(Exposure(time.monotonic() + delay_s, own=again))

    async def readable_end(self, topic: str) -> Position:
        """The last position of ``topic`` a read-committed reader can reach: the broker answers
        GetLastMessageId with the transaction buffer's max read position (just before the first
        message of the oldest transaction it holds open)."""
        from ..message import LATEST

        reader = await self.client.create_reader(topic, LATEST, receiver_queue_size=1)
        try:
            return position(await reader.get_last_message_id())
        finally:
            await close_quietly(reader)

    async def unstick(self, committed: Sequence[SeenCommit | OwnCommit],
                      max_rounds: int = 20) -> tuple[list[SeenCommit | OwnCommit], int]:
        """Deliver the commit of transactions known to be committed (``committed``: records the
        ledger still shows after the settle time, or this instance's own commits) to partitions
        that still hold them open. Returns those on partitions still held by a transaction (check
        again later): one not among ``committed``, such as a batch in flight or a paused instance's;
        and how many commits it delivered that freed a partition."""
        by_topic: dict[str, list[tuple[Position, SeenCommit | OwnCommit]]] = {}
        for r in committed:
            for topic, start in r.output_starts.items():
                by_topic.setdefault(topic, []).append((start, r))
        held: list[SeenCommit | OwnCommit] = []
        freed = 0
        # The ledger last: while it is held, resubscribed instances wait on their guard and commit
        # nothing, and a commit reaching an output partition that still holds an earlier
        # transaction would make the broker abort that one there (its low watermark).
        for topic, starts in sorted(by_topic.items(), key=lambda kv: (kv[0].startswith(self.ledger_topic), kv[0])):
            starts.sort(key=lambda s: s[0])
            end = await self.readable_end(topic)
            delivered: set[str] = set()
            for _ in range(max_rounds):
                # A transaction's first output past the readable end is held open; the oldest such
                # one, if the ledger shows it committed, is the one that holds the partition.
                waiting = [(s, r) for s, r in starts if s[:2] > end[:2]]
                if not waiting:
                    break
                start, rec = waiting[0]
                if rec.txn_id in delivered:
                    held += [r for _, r in waiting]  # held by a transaction not in the records
                    break
                log.info("commit audit: %s is readable up to %s only, before batch %s (txn %s, committed); "
                         "delivering its commit there", topic, end, rec.batch_id, rec.txn_id)
                await self.commit_on_partition(topic, TxnID.parse(rec.txn_id))
                delivered.add(rec.txn_id)
                before, end = end, await self.readable_end(topic)
                if end[:2] > before[:2]:
                    self.unstuck += 1
                    freed += 1
                    log.error("commit audit: batch %s (txn %s) was committed, but %s held it open from %s (its "
                              "commit never reached that partition); delivered, readable now up to %s",
                              rec.batch_id, rec.txn_id, topic, start, end)
        unique = {id(r): r for r in held}
        return list(unique.values()), freed

    async def vanished_outputs(self, committed: list[SeenCommit], quiet_s: float = 5.0, timeout_s: float = 60.0,
                               ) -> tuple[list[tuple[SeenCommit, list[str]]], list[SeenCommit]]:
        """Records still on the ledger whose outputs are gone from a partition, with those
        partitions. A commit the coordinator never delivered to a partition is aborted there by
        the partition's transaction buffer as soon as a later commit of the same coordinator
        reaches it (its low watermark has passed the transaction): the outputs vanish while the
        COMMITTED record and the acknowledgements stay. Each partition is read once, from the
        first of the records' first outputs on; a first output the reader passed without getting
        it is gone. Also returns the records with a first output the reader did not reach (within
        ``timeout_s``, or before ``quiet_s`` without a message): to check again. Positions past
        the readable end are held, not gone (:meth:`unstick`)."""
        by_topic: dict[str, list[tuple[Position, SeenCommit]]] = {}
        for r in committed:
            for topic, start in r.output_starts.items():
                by_topic.setdefault(topic, []).append((start, r))
        gone: dict[int, tuple[SeenCommit, list[str]]] = {}
        unknown: dict[int, SeenCommit] = {}
        found = await asyncio.gather(*(self._missing_on(topic, [s for s, _ in starts], quiet_s, timeout_s)
                                       for topic, starts in sorted(by_topic.items())))
        for (topic, starts), (skipped, unreached) in zip(sorted(by_topic.items()), found, strict=True):
            for s, r in starts:
                if s in skipped:
                    gone.setdefault(id(r), (r, []))[1].append(topic)
                elif s in unreached:
                    unknown[id(r)] = r
        return list(gone.values()), [r for k, r in unknown.items() if k not in gone]

    async def _missing_on(self, topic: str, starts: list[Position], quiet_s: float,
                          timeout_s: float) -> tuple[set[Position], set[Position]]:
        """Which of ``starts`` (at or before ``topic``'s readable end) a reader skipped, and which it
        did not reach. A reader gets a topic's messages in order: a position it has passed without
        getting it holds nothing readable (its transaction was aborted). A position not passed
        tells nothing (dispatch can pause for seconds while a restarted broker loads the topic)."""
        end = await self.readable_end(topic)
        wanted = {s for s in starts if s[:2] <= end[:2]}
        if not wanted:
            return set(), set()
        first, last = min(wanted), max(wanted)
        reader = await self.client.create_reader(topic, MessageId(ledger_id=first[0], entry_id=first[1]),
                                                 start_message_id_inclusive=True)
        seen: set[Position] = set()
        passed: Position | None = None
        deadline = time.monotonic() + timeout_s
        quiet_until = time.monotonic() + quiet_s
        try:
            while time.monotonic() < deadline and (passed is None or passed <= last):
                try:
                    m = await reader.read_next(timeout_millis=500)
                except Timeout:
                    if time.monotonic() >= quiet_until:
                        break
                    continue
                except CorruptMessage:
                    continue
                quiet_until = time.monotonic() + quiet_s
                pos = position(m.message_id())
                passed = pos
                if pos in wanted:
                    seen.add(pos)
        finally:
            await close_quietly(reader)
        skipped = {w for w in wanted if w not in seen and passed is not None and passed > w}
        unreached = {w for w in wanted if w not in seen and w not in skipped}
        return skipped, unreached

    async def commit_on_partition(self, topic: str, txn: Any) -> None:
        """Deliver the commit of ``txn`` to ``topic``, as its coordinator should have (the
        partition's END_TXN_ON_PARTITION). Only for a transaction the ledger shows committed."""
        from ..connection import check_error, command, next_request_id
        from ..errors import from_server_error
        from ..protocol import pulsar_wire_pb2 as pb

        conn = await self.client._pool.connection_for(topic)  # noqa: SLF001 - the client's own pool
        rid = next_request_id()
        # The low watermark is 2^64-1, which the broker reads as -1: below every transaction id, so
        # it ends no other transaction of the partition (0 would abort a transaction (n,0) held there).
        resp = await conn.request(command(pb.BaseCommand.END_TXN_ON_PARTITION, request_id=rid, topic=topic,
                                          txnid_least_bits=txn.least, txnid_most_bits=txn.most,
                                          txn_action=pb.COMMIT, txnid_least_bits_of_low_watermark=NO_WATERMARK),
                                  rid)
        check_error(resp, f"commit of {txn} on {topic}", topic=topic)
        r = resp.endTxnOnPartitionResponse
        if r.HasField("error"):
            raise from_server_error(pb.ServerError.Name(r.error), f"commit of {txn} on {topic}: {r.message}",
                                    topic=topic)

    def due(self, now: float | None = None) -> list[SeenCommit]:
        """The records whose check is due (each once, oldest first), taken off the waiting list
        (call :meth:`due_own` first: own commits due are left waiting here)."""
        now = time.monotonic() if now is None else now
        ready = [e for e in self.exposures if e.due <= now and e.records]
        if not ready:
            return []
        self.exposures = [e for e in self.exposures if not (e.due <= now and e.records)]
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
            await close_quietly(reader)
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
