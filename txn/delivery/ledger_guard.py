"""The ledger guard: never commit an input the ledger already shows committed.

Exactly-once must not rest on the broker's acknowledgement state alone. Pulsar 4.0.8 can
lose committed batch-index acknowledgements when a cursor recovers (a broker restart, a topic
unload): the inputs of a committed batch then come back, and the broker's conflict check
cannot see the earlier commit. The ledger can: a batch's ``COMMITTED`` (or ``PARKED`` /
``REPLAYED``) record is written inside the batch's transaction, so a read-committed reader sees
it exactly when the batch committed.

:class:`LedgerGuard` is the deduplicating receiver of the reference texts applied to the
ledger. A background reader tails the ledger topic from its start and keeps, per input
topic/partition, the ids that the job's committed records name (bounded: the oldest entries are
forgotten past ``max_ids``). Its state is rebuilt from the ledger at every start, so it is
as durable as the ledger.

When to trust it. Lost acknowledgements only come back after the consumer re-subscribed (a
broker restart or topic move closes every consumer). So after a (re)subscription, before a batch
is checked, the processor writes its ``STARTED`` record and waits until the guard has read past
it (:meth:`wait_past`). Every transaction that committed before that record was written has its
records before it, and Pulsar's read-committed dispatch only lets a reader past a position once
every transaction with records before it is resolved; so from then on the guard knows every
commit that could have lost its acknowledgements. Between re-subscriptions the broker's own
state is exact, and the guard is only a second line.

Trust: the guard believes a committing record (COMMITTED, PARKED, REPLAYED) of its job only if
the broker's metadata shows it was produced inside the very transaction it names, which then
committed (a read-committed reader sees nothing else). A record planted outside any transaction,
or inside a transaction other than the one it names, is counted (``untrusted``) and ignored.
A writer who can open transactions and produce to the ledger can still commit a record naming its
own transaction; so only the job's role should be allowed to produce to the ledger topic (Pulsar
authorization), as for any topic whose contents decide what a job skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from itertools import groupby
from operator import itemgetter

from ..errors import CorruptMessage, PulsarError
from ..message import EARLIEST, MESSAGE_ID_PATTERN, Message, MessageId, TxnID, position
from .commit_audit import CommitAudit, parse_output_starts
from .guard_checkpoint import Entry, Rung, choose, load_ladder, thin
from .ledger import COMMITTING_KINDS as _COMMITTING
from .ledger import SCHEMA

log = logging.getLogger("txn.ledger_guard")

#: Record kinds whose inputs are acknowledged in the record's own transaction, as the JSON holds them
#: (plain strings: the guard reads raw JSON, without building records, for speed).
COMMITTING_KINDS = frozenset(k.value for k in _COMMITTING)
#: The batch index of a message stored alone in its entry.
NOT_BATCHED = -1
_ALL = None  # an entry whose every message was committed
_ENTRY = itemgetter(0, 1)
_INDEX = itemgetter(2)


#: ``(ledger,entry,partition,batch_index)`` as ``str(MessageId)`` writes it.
#: A message id as records write it, ``(ledger,entry,partition,batch index)``.
ID_PATTERN = _ID = MESSAGE_ID_PATTERN


class CommittedInputs:
    """Ids of committed inputs per topic/partition, bounded by a number of ids.

    Kept per stored entry (a message or a batch): the entry's committed batch indexes as a set,
    or one marker for an unbatched entry or a batch all of whose ``batch_size`` messages
    committed. Past ``max_ids`` remembered ids the oldest entries are forgotten (``evicted``).
    """

    def __init__(self, max_ids: int = 1_000_000) -> None:
        if max_ids < 1:
            raise ValueError("max_ids must be at least 1")
        self.max_ids = max_ids
        # (topic, ledger, entry) -> committed batch indexes (``None``: all of them)
        self._entries: OrderedDict[tuple[str, int, int], set[int] | None] = OrderedDict()
        self._ids = 0
        self.evicted = 0

    def __len__(self) -> int:
        """Remembered ids (an entry marked whole counts as one)."""
        return self._ids

    def _put(self, key: tuple[str, int, int], indexes: set[int] | None, batch_size: int = 0) -> None:
        entries = self._entries
        got = entries.get(key, False)
        if got is _ALL:
            return
        before = 0 if got is False else len(got)
        if indexes is not _ALL and got is not False:
            got.update(indexes)
            indexes = got
        if indexes is not _ALL and batch_size and len(indexes) >= batch_size:
            indexes = _ALL
        entries[key] = indexes
        self._ids += (1 if indexes is _ALL else len(indexes)) - before
        while self._ids > self.max_ids and len(entries) > 1:
            _, old = entries.popitem(last=False)
            self._ids -= 1 if old is _ALL else len(old)
            self.evicted += 1

    def add(self, topic: str, ledger: int, entry: int, index: int, batch_size: int = 0) -> None:
        """Remember that message ``index`` of entry ``(ledger, entry)`` of ``topic`` committed."""
        self._put((topic, ledger, entry), _ALL if index == NOT_BATCHED else {index}, batch_size)

    def add_ids(self, topic: str, ids: list[str]) -> tuple[int, tuple[int, int] | None]:
        """Add ids written as ``str(MessageId)`` (others are ignored); returns how many were read
        and the highest (ledger, entry) among them."""
        try:
            text = "\n".join(ids)
        except TypeError:
            text = "\n".join(i for i in ids if isinstance(i, str))
        found = _ID.findall(text)
        hi: tuple[int, int] | None = None
        for (ledger, entry), group in groupby(found, _ENTRY):
            key = (int(ledger), int(entry))
            indexes = set(map(int, map(_INDEX, group)))
            self._put((topic, *key), _ALL if NOT_BATCHED in indexes else indexes)
            if hi is None or key > hi:
                hi = key
        return len(found), hi

    def add_message(self, m: Message) -> None:
        """Remember a message this process committed."""
        mid = m.message_id()
        self.add(m.topic_name(), mid.ledger_id(), mid.entry_id(), mid.batch_index(), mid.batch_size)

    def is_whole_entry(self, topic: str, ledger: int, entry: int) -> bool:
        """True when the entry is held whole (one marker), not as a set of batch indexes."""
        return (topic, ledger, entry) in self._entries and self._entries[(topic, ledger, entry)] is None

    def contains(self, m: Message) -> bool:
        """True if ``m``'s id is known to be committed."""
        topic, ledger, entry, _, index = position(m)
        got = self._entries.get((topic, ledger, entry), False)
        if got is False:
            return False
        if got is _ALL:
            return True
        return index in got


class LedgerGuard:
    """Tails a ledger topic and answers "was this input already committed by ``job``?"."""

    def __init__(self, client: object, ledger_topic: str, job: str, inputs: Iterable[str],
                 max_ids: int = 1_000_000) -> None:
        self.client = client
        self.ledger_topic = ledger_topic
        self.job = job
        self.inputs = tuple(inputs)  # base topic names; partitions are ``<base>-partition-N``
        self.committed = CommittedInputs(max_ids)
        self.records_read = 0
        self.records_applied = 0
        self.malformed = 0
        #: Committing records of the job that were not written inside the transaction they name
        #: (planted outside any transaction, or inside another one): never trusted.
        self.untrusted = 0
        self._needle = f'"job":{_json_str(job)}'.encode()
        self._reader: object | None = None
        self._task: asyncio.Task[None] | None = None
        self._position: tuple[int, int, int] | None = None
        self._moved = asyncio.Event()
        self._error: BaseException | None = None
        #: Highest input entry per partition named by the committing records read (with the
        #: starting rung's): what a checkpoint rung of this guard's position says.
        self.hi: dict[str, Entry] = {}
        #: The rung the guard started from (None: the ledger's start) and the ladder it knows.
        self.start_rung: Rung | None = None
        self.ladder: list[Rung] = []
        #: Messages of the checkpoint topic read at the last start.
        self.checkpoint_messages_read = 0
        self._last_rung_position: tuple[int, int, int] | None = None
        #: Re-checks recent COMMITTED records after a reconnect (set by the processor).
        self.audit: CommitAudit | None = None

    async def start(self, marks: dict[str, Entry | None] | None = None, *, checkpoints: bool = True) -> None:
        """Begin tailing the ledger: after the newest checkpoint rung that ``marks`` (the
        subscription's mark-delete entry per input partition) allow, or from its start when
        ``marks`` is None, checkpoints are off, or no rung fits (see ``guard_checkpoint``)."""
        self.start_rung = None
        if marks is not None and checkpoints:
            self.ladder, self.checkpoint_messages_read = await load_ladder(self.client, self.ledger_topic, self.job)
            self.start_rung = choose(self.ladder, marks, self._ours)
        self.hi = dict(self.start_rung.hi) if self.start_rung is not None else {}
        start = self.start_rung.start_id() if self.start_rung is not None else EARLIEST
        if self.start_rung is not None:
            self._position = self.start_rung.position
            self._last_rung_position = self.start_rung.position
            log.info("ledger guard on %s: starting after checkpoint %s (of %d rungs)", self.ledger_topic,
                     self.start_rung.position, len(self.ladder))
        self._reader = await self.client.create_reader(self.ledger_topic, start)  # type: ignore[attr-defined]
        self._task = asyncio.get_running_loop().create_task(self._tail())

    def covers(self, marks: dict[str, Entry | None]) -> bool:
        """True if the rung the guard started from is still allowed by ``marks`` (a recovered
        cursor may stand further back than when the guard started)."""
        return self.start_rung is None or self.start_rung.allows(marks, self._ours)

    async def restart(self, marks: dict[str, Entry | None] | None = None, *, checkpoints: bool = True) -> None:
        """Start again with fresh state (after a rung ``marks`` allow, or from the ledger's start)."""
        await self.close()
        self.committed = CommittedInputs(self.committed.max_ids)
        self._position = None
        self._error = None
        self.records_read = self.records_applied = 0
        await self.start(marks, checkpoints=checkpoints)

    async def ensure_running(self, marks: dict[str, Entry | None] | None = None, *, checkpoints: bool = True) -> None:
        """Restart (with fresh state) if the reader stopped on an error, or if ``marks`` no longer
        allow the rung it started from."""
        if self._task is not None and not self._task.done() and (marks is None or self.covers(marks)):
            return
        if self._task is not None and not self._task.done():
            log.warning("ledger guard on %s: a subscription's cursor now stands below the checkpoint the guard "
                        "started from; reading the ledger again from an earlier one", self.ledger_topic)
        await self.restart(marks, checkpoints=checkpoints)

    def rung(self, at_ms: int = 0) -> Rung | None:
        """A rung at the guard's current position (None before it read anything, or if nothing
        was read since the last rung)."""
        pos = self._position
        if pos is None or pos == self._last_rung_position:
            return None
        return Rung(pos, dict(self.hi), at_ms)

    def add_rung(self, rung: Rung) -> list[Rung]:
        """Put ``rung`` on the guard's ladder; returns the ladder (thinned) to write."""
        self.ladder = thin([*self.ladder, rung])
        self._last_rung_position = rung.position
        return self.ladder

    async def close(self) -> None:
        """Stop tailing."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(PulsarError):
                await reader.close()  # type: ignore[attr-defined]

    def _ours(self, topic: str) -> bool:
        return any(topic == t or topic.startswith(t + "-partition-") for t in self.inputs)

    async def _tail(self) -> None:
        reader = self._reader
        assert reader is not None
        try:
            while True:
                try:
                    m = await reader.read_next()  # type: ignore[attr-defined]
                except CorruptMessage as exc:
                    # Quarantined, never a poison pill: a ledger entry that fails its checksum or
                    # does not decode is counted and logged, and the guard reads on.
                    self.malformed += 1
                    log.error("ledger guard on %s: unreadable ledger message %s skipped (%s)", self.ledger_topic,
                              exc.message_id, exc)
                    continue
                mid = m.message_id()
                pos = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                self.apply(m.data(), m.txn_id(), pos)
                self._position = pos
                self._moved.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits on the guard
            self._error = exc
            self._moved.set()
            log.error("ledger guard on %s stopped: %s", self.ledger_topic, exc)

    def apply(self, data: bytes, txn: TxnID | None, pos: tuple[int, int, int] | None = None) -> None:
        """Apply one ledger message: committing records of our job add their inputs, if the
        message was produced inside the transaction the record names (``txn``, from the broker's
        metadata; a read-committed reader only sees it once that transaction committed). A
        COMMITTED record at ``pos`` is also handed to :attr:`audit`, if there is one."""
        self.records_read += 1
        if self._needle not in data:
            return  # another job's record (or not a record): skip it without parsing
        try:
            d = json.loads(data)
        except (RecursionError, ValueError):
            self.malformed += 1
            return
        # Only the fields the guard uses are read, and each is checked (a full
        # LedgerRecord.validate costs ~4x more per record on a large ledger).
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            self.malformed += 1
            return
        if d.get("job") != self.job or d.get("kind") not in COMMITTING_KINDS:
            return
        if txn is None or d.get("txn_id") != str(txn):
            self.untrusted += 1
            if self.untrusted <= 10 or self.untrusted % 1000 == 0:
                log.warning("ledger guard on %s: a %s record of job %s names transaction %r but was written %s; "
                            "not trusted (%d so far)", self.ledger_topic, str(d.get("kind"))[:16], self.job,
                            str(d.get("txn_id"))[:40], "outside any transaction" if txn is None else f"in {txn}",
                            self.untrusted)
            return
        inputs = d.get("inputs")
        if not isinstance(inputs, dict) or not all(isinstance(ids, list) for ids in inputs.values()):
            self.malformed += 1
            return
        if not all(isinstance(t, str) and self._ours(t) for t in inputs):
            return  # a job of the same name on other inputs
        his = self.hi
        for topic, ids in inputs.items():
            _, hi = self.committed.add_ids(topic, ids)
            if hi is not None:
                old = his.get(topic)
                if old is None or hi > old:
                    his[topic] = hi
        self.records_applied += 1
        if self.audit is not None and pos is not None and d.get("kind") == "COMMITTED":
            self.audit.seen(pos, str(d.get("batch_id")), str(d.get("txn_id")), inputs,
                            parse_output_starts(d.get("output_starts")))

    def passed(self, mid: MessageId) -> bool:
        """True once the reader has read the message ``mid`` of the ledger topic."""
        pos = self._position
        return pos is not None and pos >= (mid.ledger_id(), mid.entry_id(), mid.batch_index())

    async def wait_past(self, mid: MessageId, timeout_s: float, on_wait: object = None) -> None:
        """Wait until the guard has read the ledger message ``mid``.

        Raises :class:`TimeoutError` after ``timeout_s`` (a transaction with records before
        ``mid`` is still open: the coordinator resolves it within its timeout), or the error
        that stopped the reader.
        """
        deadline = time.monotonic() + timeout_s
        next_note = time.monotonic() + 10.0
        while not self.passed(mid):
            if self._error is not None:
                raise self._error
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"ledger {self.ledger_topic}: not readable up to {mid} after {timeout_s:.0f}s (an open "
                    "transaction with earlier ledger records holds read-committed readers back)")
            self._moved.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), min(left, 1.0))
            if time.monotonic() >= next_note:
                next_note = time.monotonic() + 10.0
                log.warning("ledger guard: waiting for %s to become readable (an earlier transaction on the "
                            "ledger is still open; its coordinator resolves it within its timeout)", mid)
                if callable(on_wait):
                    on_wait()

    def split(self, msgs: list[Message]) -> tuple[list[Message], list[Message]]:
        """``(fresh, already_committed)``, each in the input order."""
        contains = self.committed.contains
        fresh: list[Message] = []
        dups: list[Message] = []
        for m in msgs:
            (dups if contains(m) else fresh).append(m)
        return fresh, dups


def _json_str(s: str) -> str:
    return json.dumps(s)
