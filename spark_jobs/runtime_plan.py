"""Planning the distributed runtime's micro-batches: message-id ranges per input partition.

The driver of :mod:`spark_jobs.runtime` holds the job's durable subscription on every input
partition (an Exclusive consumer each, which also fences a second driver) and plans each batch
from two facts per partition that the broker gives without any message body: the
subscription's mark-delete position and the partition's last deliverable message id (both in
one ``GetLastMessageId`` round trip). A partition's range is ``(after, last]``: ``after`` is the
last entry the job acknowledged (exclusive), ``last`` the partition's last message when planned.

A range also carries a *cap*: at most that many messages (``batch_max_messages`` shared out over
the partitions with something to read), rounded up to a whole entry so that the batch can be
acknowledged cumulatively up to an entry. Entry ids do not tell how many messages lie between
two positions (batch entries, ledger roll-overs, transaction markers), so where a capped range
really ends is found by the executor that reads it and reported back (see
:mod:`spark_jobs.runtime_batch`). A range whose end is known (a narrowed half of a failing batch)
has no cap.

Positions here are entry positions ``(ledger, entry)``; entry ``-1`` is the position before a
ledger's first entry (where a new subscription starts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import txn
from txn.delivery.guard_checkpoint import mark_delete_entry

from .offsets import last_position

Entry = tuple[int, int]
_U64 = (1 << 64) - 1


def entry_text(e: Entry) -> str:
    """``"L:E"`` (the ledger record's form)."""
    return f"{e[0]}:{e[1]}"


def parse_entry(text: str) -> Entry:
    """Inverse of :func:`entry_text`."""
    a, _, b = str(text).partition(":")
    return int(a), int(b)


def wire_entry(entry: int) -> int:
    """Entry id on the wire (``-1`` is 2^64-1)."""
    return _U64 if entry < 0 else entry


def _signed(entry: int) -> int:
    return -1 if entry in (_U64, -1) else entry


@dataclass(frozen=True, slots=True)
class Range:
    """Read ``(after, to]`` of one topic partition, at most ``cap`` messages (whole entries) if set.

    ``name`` is the partition's full name, ``topic`` its base topic, ``partition`` its index (-1
    if not partitioned): what the ``topic`` and ``partition`` columns show.
    """

    name: str
    topic: str
    partition: int
    after: Entry
    to: Entry
    cap: int | None = None
    #: At most about this many payload bytes: the read ends at the first entry boundary at or
    #: past it (a range always reads at least one entry, however large).
    cap_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "topic": self.topic, "partition": self.partition, "after": entry_text(self.after),
                "to": entry_text(self.to), "cap": self.cap, "cap_bytes": self.cap_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Range:
        return cls(d["name"], d["topic"], int(d["partition"]), parse_entry(d["after"]), parse_entry(d["to"]),
                   None if d.get("cap") is None else int(d["cap"]),
                   None if d.get("cap_bytes") is None else int(d["cap_bytes"]))

    def ended_at(self, to: Entry) -> Range:
        """This range with its real end (as read), uncapped."""
        return replace(self, to=to, cap=None, cap_bytes=None)


@dataclass(frozen=True, slots=True)
class ReadEnd:
    """Where an executor's read of a range ended: the last entry read and how many messages."""

    to: Entry
    count: int


def ranges_json(ranges: list[Range]) -> str:
    return json.dumps([r.to_dict() for r in ranges])


def ranges_from_json(text: str) -> list[Range]:
    return [Range.from_dict(d) for d in json.loads(text)]


def record_ranges(ranges: list[Range], ends: dict[str, ReadEnd]) -> dict[str, dict[str, Any]]:
    """The ledger record's ``input_ranges`` of a batch whose reads ended at ``ends``."""
    out: dict[str, dict[str, Any]] = {}
    for r in ranges:
        e = ends.get(r.name)
        if e is not None and e.count > 0:
            out[r.name] = {"after": entry_text(r.after), "to": entry_text(e.to), "count": e.count}
    return out


async def cursor_and_last(consumer: Any) -> tuple[Entry | None, Entry | None]:
    """(the subscription's mark-delete entry, the partition's last deliverable entry) of a consumer
    on one partition, in one ``GetLastMessageId`` round trip; None where there is none."""
    sub = consumer.topic_consumers[0]  # the one partition this consumer reads
    r = await sub.last_message_id_response()
    d = r.last_message_id
    pos = last_position(txn.MessageId.from_pb(d, partition=-1))
    last = None if pos is None else (pos[0], pos[1])
    return mark_delete_entry(r), last


def plan(positions: dict[str, tuple[str, int, Entry, Entry | None]], budget: int,
         budget_bytes: int = 0) -> list[Range]:
    """The ranges of the next batch: ``positions`` maps each partition to (base topic, index, the
    entry the job acknowledged last, the partition's last entry or None); ``budget`` messages, and
    ``budget_bytes`` payload bytes if positive, are shared out evenly over the partitions with
    something new (each gets at least one message)."""
    active = [(n, p) for n, p in sorted(positions.items()) if p[3] is not None and p[3] > p[2]]
    if not active:
        return []
    share, extra = divmod(max(budget, len(active)), len(active))
    share_bytes = max(1, budget_bytes // len(active)) if budget_bytes > 0 else None
    return [Range(n, topic, idx, after, last, share + (1 if i < extra else 0), share_bytes)  # type: ignore[arg-type]
            for i, (n, (topic, idx, after, last)) in enumerate(active)]


__all__ = ["Entry", "Range", "ReadEnd", "cursor_and_last", "entry_text", "parse_entry", "plan", "ranges_from_json",
           "ranges_json", "record_ranges", "wire_entry"]
