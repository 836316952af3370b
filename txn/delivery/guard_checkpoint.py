"""Guard checkpoints: where a ledger guard may start reading, instead of the ledger's beginning.

The ledger guard (``ledger_guard``) must know every committed input that the broker could still
deliver. The broker never delivers again an entry at or below the subscription's mark-delete
position: those are acknowledged and the cursor only moves forward (a cursor recovered after a
crash may stand further back, but then every consumer is re-subscribed and the guard checks
again, see below). So a guard needs only the records that name inputs above the mark-delete
positions, and for a job that keeps up those are the last few batches.

A *rung* says of a prefix of the ledger: "every committing record of the job up to ledger
message ``position`` names, on each input partition ``t``, only entries up to ``hi[t]``"
(partitions it does not list: none). A guard whose subscription's mark-delete position ``M[t]``
is at or past ``hi[t]`` for every input partition may start reading right after ``position``:
nothing it skips can be delivered again. A guard computes a rung from what it read: the
position of its last message and the highest entry per partition over every committing record
it applied (plus the ``hi`` of the rung it started from). Read-committed readers never pass a
transaction that is still open, so every transaction with a record before that position was
resolved when the guard read past it; a record aborted then never becomes visible.

Rungs are kept as a *ladder* (the newest rung and a thinned list of older ones, newest last),
written by the processor inside one of its batch transactions to a topic of its own beside the
ledger (:func:`checkpoint_topic`). A guard reads only that topic's last few messages and takes
the newest rung that its subscription's mark-delete positions allow; if none does (the
subscription was rewound, or the job fell far behind), an older one, or the ledger's start.
Trust is the ledger's (docs/reliability.md section 8): a ladder counts only if the broker's
metadata shows it was produced inside the transaction it names, which committed.

When a subscription's cursor is recovered (a broker restart, a topic move), every consumer is
re-subscribed, and before its next batch the processor asks the broker for the mark-delete
positions again (:meth:`LedgerGuard.covers`); if a cursor now stands below the rung the guard
started from, the guard starts again from a rung the new positions allow.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from ..errors import PulsarError
from ..message import EARLIEST, MessageId

log = logging.getLogger("txn.guard_checkpoint")

SCHEMA = "pulsar-txn-guard-checkpoint/1"
#: Rungs a ladder keeps (the newest ones all, older ones thinned out to about double spacing).
MAX_RUNGS = 40
_KEEP_NEWEST = 8
#: Messages at the end of the checkpoint topic looked at for the newest trusted ladder.
TAIL_WINDOW = 64

Entry = tuple[int, int]


def checkpoint_topic(ledger_topic: str, job: str) -> str:
    """The topic holding ``job``'s guard checkpoints, beside ``ledger_topic``."""
    digest = hashlib.sha256(job.encode()).hexdigest()[:16]
    return f"{ledger_topic}-guard-{digest}"


@dataclass(frozen=True, slots=True)
class Rung:
    """A ledger prefix, up to ``position`` (ledger, entry, batch index), and the highest input
    entry each partition's committing records name in it."""

    position: tuple[int, int, int]
    hi: dict[str, Entry] = field(default_factory=dict)
    at_ms: int = 0

    def allows(self, marks: dict[str, Entry | None], ours: Any = None) -> bool:
        """True if every partition this rung names is acknowledged up to its ``hi`` (``marks``: the
        subscription's mark-delete entry per partition; ``ours``: which topics count)."""
        for topic, hi in self.hi.items():
            if ours is not None and not ours(topic):
                continue
            m = marks.get(topic)
            if m is None or m < hi:
                return False
        return True

    def start_id(self) -> MessageId:
        """Where a reader resumes: right after ``position``."""
        return MessageId(ledger_id=self.position[0], entry_id=self.position[1], batch_index=self.position[2])

    def to_dict(self) -> dict[str, Any]:
        return {"p": list(self.position), "hi": {t: list(e) for t, e in self.hi.items()}, "at": self.at_ms}

    @classmethod
    def from_dict(cls, d: Any) -> Rung:
        """Parse one rung; raises ``ValueError`` if it is not one."""
        if not isinstance(d, dict):
            raise ValueError("a rung is an object")
        p, hi, at = d.get("p"), d.get("hi"), d.get("at", 0)
        if not (isinstance(p, list) and len(p) == 3 and all(_is_int(x) for x in p)):
            raise ValueError("a rung's position is [ledger, entry, batch index]")
        if not isinstance(hi, dict) or not isinstance(at, int):
            raise ValueError("a rung's hi is an object of partition -> [ledger, entry]")
        out: dict[str, Entry] = {}
        for t, e in hi.items():
            if not (isinstance(e, list) and len(e) == 2 and all(_is_int(x) for x in e)):
                raise ValueError("a rung's hi is an object of partition -> [ledger, entry]")
            out[t] = (e[0], e[1])
        return cls((p[0], p[1], p[2]), out, at)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**64


def thin(ladder: list[Rung]) -> list[Rung]:
    """At most :data:`MAX_RUNGS` rungs, ordered by position. The newest ones and the oldest are
    kept; past the bound the rung whose removal leaves the smallest gap relative to its age goes,
    so the spacing grows about geometrically going back in time (by ``at_ms``)."""
    rungs = sorted({r.position: r for r in ladder}.values(), key=lambda r: r.position)
    while len(rungs) > MAX_RUNGS:
        newest = rungs[-1].at_ms
        candidates = range(1, len(rungs) - _KEEP_NEWEST)
        drop = min(candidates, key=lambda i: (rungs[i + 1].at_ms - rungs[i - 1].at_ms)
                   / (newest - rungs[i - 1].at_ms + 1))
        del rungs[drop]
    return rungs


def choose(ladder: list[Rung], marks: dict[str, Entry | None], ours: Any = None) -> Rung | None:
    """The newest rung of ``ladder`` that ``marks`` allow (None: read from the ledger's start)."""
    for r in sorted(ladder, key=lambda r: r.position, reverse=True):
        if r.allows(marks, ours):
            return r
    return None


def encode(job: str, ledger_topic: str, txn_id: str, ladder: list[Rung], at_ms: int) -> bytes:
    """A checkpoint message: the job's ladder, naming the transaction it is written in."""
    return json.dumps({"schema": SCHEMA, "job": job, "ledger_topic": ledger_topic, "txn_id": txn_id,
                       "written_at_ms": at_ms, "ladder": [r.to_dict() for r in ladder]},
                      separators=(",", ":")).encode()


def decode(data: bytes, job: str, ledger_topic: str, txn: Any) -> list[Rung] | None:
    """The ladder of a checkpoint message of ``job`` on ``ledger_topic``, if it is one and it was
    produced inside the transaction it names (``txn``, from the broker's metadata); else None."""
    try:
        d = json.loads(data)
    except (RecursionError, ValueError):
        return None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA or d.get("job") != job:
        return None
    if d.get("ledger_topic") != ledger_topic or txn is None or d.get("txn_id") != str(txn):
        return None
    ladder = d.get("ladder")
    if not isinstance(ladder, list) or len(ladder) > 4 * MAX_RUNGS:
        return None
    try:
        return [Rung.from_dict(r) for r in ladder]
    except ValueError:
        return None


async def load_ladder(client: Any, ledger_topic: str, job: str, *, window: int = TAIL_WINDOW,
                      wait_s: float = 3.0) -> tuple[list[Rung], int]:
    """The newest trusted ladder among the last ``window`` messages of the job's checkpoint topic,
    and how many messages were read. An empty list when there is none (or the topic is empty);
    a message that does not decode, or names another transaction, is passed over."""
    topic = checkpoint_topic(ledger_topic, job)
    probe = await client.create_reader(topic, EARLIEST, receiver_queue_size=1)
    try:
        last = await probe.get_last_message_id()
    finally:
        with contextlib.suppress(PulsarError):
            await probe.close()
    if last.ledger_id() < 0 or last.entry_id() < 0:
        return [], 0
    start = MessageId(ledger_id=last.ledger_id(), entry_id=max(last.entry_id() - window, 0))
    reader = await client.create_reader(topic, start, start_message_id_inclusive=True, receiver_queue_size=window)
    best: tuple[tuple[int, int, int], list[Rung]] | None = None
    read = 0
    try:
        while True:
            try:
                m = await asyncio.wait_for(reader.read_next(), wait_s)
            except (TimeoutError, PulsarError):
                break  # an open transaction holds the tail back, or nothing more: use what was read
            read += 1
            mid = m.message_id()
            ladder = decode(m.data(), job, ledger_topic, m.txn_id())
            if ladder is not None:
                key = (mid.ledger_id(), mid.entry_id(), mid.batch_index())
                if best is None or key > best[0]:
                    best = (key, ladder)
            if (mid.ledger_id(), mid.entry_id()) >= (last.ledger_id(), last.entry_id()):
                break
    finally:
        with contextlib.suppress(PulsarError):
            await reader.close()
    return (best[1] if best else []), read


_U64 = (1 << 64) - 1


def mark_delete_entry(resp: Any) -> Entry | None:
    """The subscription's mark-delete entry in a ``GetLastMessageId`` answer (None if it has none)."""
    if not resp.HasField("consumer_mark_delete_position"):
        return None
    m = resp.consumer_mark_delete_position
    if m.ledgerId == _U64:
        return None
    return (int(m.ledgerId), -1 if m.entryId in (_U64, -1) else int(m.entryId))


async def mark_deletes(consumer: Any, timeout_s: float = 10.0) -> dict[str, Entry | None]:
    """The subscription's mark-delete entry of each partition ``consumer`` reads, as the broker
    reports it with ``GetLastMessageId`` (one round trip per partition, concurrently); None for a
    partition whose answer carried none (then no rung naming it fits). A partition that does not
    answer raises (``ConnectError``, ``TimeoutError``): the caller retries rather than take an
    unknown position for a low one and read the whole ledger again."""
    subs = list(consumer.topic_consumers)

    async def one(sub: Any) -> Entry | None:
        return mark_delete_entry(await asyncio.wait_for(sub.last_message_id_response(), timeout_s))

    got = await asyncio.gather(*(one(s) for s in subs))
    return {s.topic: g for s, g in zip(subs, got, strict=True)}
