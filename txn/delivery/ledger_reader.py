"""Reading a ledger topic: the one reader that replay, the Spark sink and the control plane share.

Three ways to read, one parser (:meth:`LedgerRecord.from_json`, through :func:`entry_of`):

- :meth:`LedgerReader.to_end`: from a position to the end of the topic as of now (replay, the
  CLI, tests). With ``key``, messages keyed by another batch id are skipped before they are
  parsed (records are keyed by batch id); messages without a key are parsed and filtered.
- :meth:`LedgerReader.to_probe`: up to a probe message written just before (the Spark sink's
  marker topics): the end as of now even when a transaction still open holds back dispatch,
  which then shows as a failure, never as a short read. :func:`read_tail` reads only the last
  entries that way.
- :meth:`LedgerReader.chunk`: what has arrived, in bounded chunks, for ever (the control
  plane's projection); unreadable messages come back as entries with the reason, to quarantine.

Finding a batch's records: records are keyed by batch id, but Pulsar has no lookup by key, and
a compacted view would not do either: it keeps the *last* record per key, while a batch narrowed
down to several poison messages has one ``PARKED`` record per message under the same id. So
:func:`batch_records` reads from a position onwards, keeping the batch's records: from the start
(one scan of the topic: its cost grows with the ledger, parsing only the batch's own records),
or from the position up to which the caller already holds them (the control plane's index of
projected records: then only the records newer than its projection are read, usually none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CorruptMessage, Timeout
from ..message import EARLIEST, Message, MessageId
from .ledger import COMMITTING_KINDS, LedgerRecord, LedgerSchemaError

#: Property of the probe messages written by :func:`write_probe`.
PROBE_PROP = "pulsar-txn.probe"


class LedgerEndUnknown(RuntimeError):
    """The end of a ledger topic could not be reached (a transaction still open holds it back)."""


@dataclass(slots=True)
class LedgerEntry:
    """One ledger message: its position, publish time and record (None if invalid, with ``reason``)."""

    msg_id: MessageId
    publish_ms: int
    record: LedgerRecord | None
    raw: bytes = b""
    reason: str | None = None


def entry_of(m: Message, verify_txn: bool = False) -> LedgerEntry:
    """Parse a ledger message; an invalid one gets ``record=None`` and the reason.

    With ``verify_txn`` a committing record (COMMITTED, PARKED, REPLAYED) counts only if the
    broker's metadata shows it was produced inside the transaction it names (so it exists exactly
    when that transaction committed); one written outside any transaction, or in another, is
    invalid ("untrusted")."""
    raw = m.data()
    try:
        rec = LedgerRecord.from_json(raw)
        if verify_txn and rec.kind in COMMITTING_KINDS:
            txn = m.txn_id()
            if txn is None or str(txn) != rec.txn_id:
                where = "outside any transaction" if txn is None else "in another transaction"
                return LedgerEntry(m.message_id(), m.publish_timestamp(), None, raw,
                                   f"untrusted {rec.kind} record: written {where} than the one it names")
        return LedgerEntry(m.message_id(), m.publish_timestamp(), rec, raw)
    except LedgerSchemaError as exc:
        reason = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever a hostile record does, it is quarantined
        reason = f"unreadable record ({type(exc).__name__})"
    return LedgerEntry(m.message_id(), m.publish_timestamp(), None, raw, reason)


class LedgerReader:
    """A Reader over one ledger (or marker) topic that hands out :class:`LedgerEntry`.

    ``async with await LedgerReader.open(client, topic, start) as r: ...``"""

    def __init__(self, reader: Any, verify_txn: bool = False) -> None:
        self._reader = reader
        self.verify_txn = verify_txn

    @classmethod
    async def open(cls, client: Any, topic: str, start: MessageId = EARLIEST, *, inclusive: bool = False,
                   receiver_queue_size: int = 1000, verify_txn: bool = False) -> LedgerReader:
        """A reader of ``topic`` from ``start`` (exclusive unless ``inclusive``); ``verify_txn``: see
        :func:`entry_of`."""
        return cls(await client.create_reader(topic, start, start_message_id_inclusive=inclusive,
                                              receiver_queue_size=receiver_queue_size), verify_txn)

    async def close(self) -> None:
        """Close the underlying Reader."""
        await self._reader.close()

    async def __aenter__(self) -> LedgerReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def to_end(self, idle_ms: int = 1500, key: str | None = None) -> list[LedgerEntry]:
        """Every entry up to the end of the topic as of now (with ``key``: the entries of that key
        and those without a key)."""
        out: list[LedgerEntry] = []
        while await self._reader.has_message_available():
            try:
                m = await self._reader.read_next(timeout_millis=max(idle_ms, 10000))
            except Timeout:
                break
            if key is not None and m.partition_key() not in ("", key):
                continue
            out.append(entry_of(m, self.verify_txn))
        return out

    async def to_probe(self, probe: str, idle_ms: int) -> list[LedgerEntry]:
        """The entries up to the probe message ``probe`` (probes themselves left out); raises
        :class:`LedgerEndUnknown` if nothing arrives for ``idle_ms`` before it."""
        out: list[LedgerEntry] = []
        while True:
            try:
                m = await self._reader.read_next(timeout_millis=idle_ms)
            except Timeout:
                raise LedgerEndUnknown(f"an unresolved transaction on {self._reader.topic()} holds back its "
                                       "end") from None
            if m.properties().get(PROBE_PROP) == probe:
                return out
            e = entry_of(m, self.verify_txn)
            if e.record is not None:  # older probes are not records
                out.append(e)

    async def chunk(self, max_entries: int, wait_ms: int = 1000, more_ms: int = 20) -> list[LedgerEntry]:
        """The next entries: waits up to ``wait_ms`` for one, then takes what else arrives within
        ``more_ms`` each, up to ``max_entries``. A message that fails its checksum or size checks
        is an entry without a record (never retried)."""
        entries: list[LedgerEntry] = []
        try:
            entries.append(entry_of(await self._reader.read_next(timeout_millis=wait_ms)))
            while len(entries) < max_entries:  # whatever else is already here, briefly
                entries.append(entry_of(await self._reader.read_next(timeout_millis=more_ms)))
        except Timeout:
            pass
        except CorruptMessage as exc:
            entries.append(LedgerEntry(exc.message_id, 0, None, b"", f"corrupt message ({exc.reason}): {exc.message}"))
        return entries


def records_of(entries: list[LedgerEntry]) -> list[LedgerRecord]:
    """The valid records of ``entries`` (invalid ones, of other schemas or versions, skipped)."""
    return [e.record for e in entries if e.record is not None]


async def read_records(client: Any, topic: str, *, start: MessageId = EARLIEST, key: str | None = None,
                       idle_ms: int = 1500, verify_txn: bool = False) -> list[LedgerRecord]:
    """The valid records of ``topic`` after ``start`` up to its end as of now, oldest first (with
    ``key``: only that batch id's; with ``verify_txn``: committing records only if written inside
    their own transaction, see :func:`entry_of`)."""
    async with await LedgerReader.open(client, topic, start, verify_txn=verify_txn) as r:
        records = records_of(await r.to_end(idle_ms, key))
    return records if key is None else [x for x in records if x.batch_id == key]


async def batch_records(client: Any, topic: str, batch_id: str, *, after: MessageId | None = None,
                        idle_ms: int = 1500, verify_txn: bool = False) -> list[LedgerRecord]:
    """The records of ``batch_id`` in ``topic`` after position ``after`` (from the start if None):
    see the module docs for the cost."""
    return await read_records(client, topic, start=after or EARLIEST, key=batch_id, idle_ms=idle_ms,
                              verify_txn=verify_txn)


async def write_probe(client: Any, topic: str) -> tuple[str, MessageId]:
    """Write a probe message (outside any transaction) marking the end of ``topic`` as of now."""
    import uuid

    probe = uuid.uuid4().hex
    p = await client.create_producer(topic, batching_enabled=False)
    try:
        return probe, await p.send(b"probe", properties={PROBE_PROP: probe})
    finally:
        await p.close()


async def read_tail(client: Any, topic: str, last_entries: int, idle_ms: int,
                    full: bool = False, verify_txn: bool = False) -> list[LedgerRecord]:
    """The records of the last ``last_entries`` entries of ``topic`` (all of them with ``full``), up
    to a probe written first; raises :class:`LedgerEndUnknown` (see :meth:`LedgerReader.to_probe`)."""
    probe, end = await write_probe(client, topic)
    start, inclusive = EARLIEST, False
    if not full and end.entry_id() > last_entries:
        start, inclusive = MessageId(ledger_id=end.ledger_id(), entry_id=end.entry_id() - last_entries), True
    async with await LedgerReader.open(client, topic, start, inclusive=inclusive, verify_txn=verify_txn) as r:
        return records_of(await r.to_probe(probe, idle_ms))
