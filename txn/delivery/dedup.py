"""A deduplicating receiver: exactly-once effects outside Pulsar (e.g. writes to a database).

For each message, in ONE database transaction: check the message's id against the dedup
record, run ``handler(message, db)`` (``db`` is the store's connection, inside that open
transaction), record the id; commit; then acknowledge the message on Pulsar. Persist, then ack:

- a crash before the commit rolls back the effect and the record together, and the unacked
  message is redelivered and processed;
- a crash between the commit and the ack redelivers a message whose record is committed, so
  it is recognised as a duplicate, acknowledged, and not processed again.

Either way the effect is applied exactly once, as long as the id is still remembered (below).

**Ids.** ``key_by="sequence"`` (default): sender = producer name + topic (partition) —
sequence ids are per producer and per partition, so a producer name alone would collide
across topics and partitions — and id = the message's sequence id. This also drops a
sender's deliberate re-sends of a sequence id. It needs sequence ids that only grow for a
(producer name, topic) across producer restarts: true for broker-named producers, for named
producers with broker deduplication on (the broker resumes them after their last id), or when
the application passes ``sequence_id=``. Otherwise use ``key_by="message_id"``: sender = topic
(partition), id = (ledger, entry, batch index); that catches redeliveries only.

**Window.** Per sender the store keeps the ``window`` highest ids processed and a low-water
mark, the highest id it evicted. An id is a duplicate iff it is at or below the low-water mark,
or among the held ids. So ids may arrive out of order by up to ``window`` positions; an
unprocessed id that falls more than ``window`` processed ids behind its sender is dropped as
seen. Size the window above the reordering you can get (Shared subscriptions, nacks).

**Idle purge.** A sender not seen for ``idle_purge_seconds`` is forgotten (its row and ids),
checked at most every ``min(60, idle_purge_seconds / 4)`` s, before a receive. A forgotten
sender starts afresh, so the idle time must exceed the longest redelivery delay (consumer
restarts, ack timeouts, nack delays).

**Ordering.** With ``ordering=OrderingGuard(...)`` (see :mod:`.ordering`) a message naming a
predecessor (``pulsar-txn.must-follow``) is held, unacknowledged, until its predecessor was
processed (here, or by another receiver on the same scope and store), then processed; the
business id is marked done in the same database transaction as the effect. A held message that
hits the guard's bound is parked: in one database transaction its dedup id is recorded and it
is stored with the reason in ``txn_order_parked`` (``store.parked_messages(scope)``); then
``on_park(message, error)`` runs and the message is acknowledged.

**Errors.** If the handler (or the database) raises, the transaction is rolled back and the
error propagates; the message is neither acknowledged nor nacked. Stop and close the consumer
then: the broker redelivers from the failed message, in order. Do not commit or roll back
``db`` in the handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from ..errors import Timeout
from ..message import Message
from .dedup_store import DedupStore, Key, open_store
from .ordering import OrderingGuard, OutOfOrder


class _Consumer(Protocol):
    def receive(self, timeout_millis: int | None = None) -> Message: ...
    def acknowledge(self, message_or_id: Any, txn: Any = None) -> None: ...
    def subscription_name(self) -> str: ...


class Outcome(StrEnum):
    """What :meth:`DedupReceiver.process_one` did with a message."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    HELD = "held"
    PARKED = "parked"


@dataclass
class DedupStats:
    """Counters of one receiver since it started."""

    processed: int = 0
    duplicates: int = 0
    purged_senders: int = 0
    held: int = 0
    parked: int = 0


class DedupReceiver:
    """Receive from ``consumer``; apply ``handler(message, db)`` once per message id; ack after commit.

    ``store``: a :class:`DedupStore`, or a target for :func:`open_store` (a SQLite path or a
    ``postgresql://`` URL; then the receiver owns and closes it). ``scope`` separates the records
    of independent receivers sharing a database (default: the subscription name); receivers
    that must not both apply the same effect share a scope. ``after_commit(message)`` runs
    between the commit and the ack. ``on_duplicate(message)`` runs for each dropped duplicate.
    ``ordering``: an :class:`OrderingGuard` (its store is this receiver's; its scope defaults to
    ``scope``); ``on_park(message, error)`` runs for each message it parks, after the commit.
    """

    def __init__(
        self,
        consumer: _Consumer,
        store: DedupStore | str | os.PathLike[str],
        handler: Callable[[Message, Any], None],
        window: int = 1000,
        idle_purge_seconds: float = 1800.0,
        key_by: Literal["sequence", "message_id"] = "sequence",
        scope: str | None = None,
        after_commit: Callable[[Message], None] | None = None,
        on_duplicate: Callable[[Message], None] | None = None,
        ordering: OrderingGuard | None = None,
        on_park: Callable[[Message, OutOfOrder], None] | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        if idle_purge_seconds <= 0:
            raise ValueError("idle_purge_seconds must be > 0")
        if key_by not in ("sequence", "message_id"):
            raise ValueError("key_by must be 'sequence' or 'message_id'")
        self.consumer = consumer
        self._owns_store = not isinstance(store, DedupStore)
        self.store: DedupStore = store if isinstance(store, DedupStore) else open_store(store)
        self.handler = handler
        self.window = window
        self.idle_purge_seconds = idle_purge_seconds
        self.key_by = key_by
        self.scope = scope if scope is not None else consumer.subscription_name()
        self.after_commit = after_commit
        self.on_duplicate = on_duplicate
        self.ordering = ordering
        self.on_park = on_park
        if ordering is not None:
            if ordering.store is not None and ordering.store is not self.store:
                raise ValueError("the ordering guard must use the receiver's store (one transaction for both)")
            ordering.attach(self.store, self.scope)
        self._stats = DedupStats()
        self._purge_every = min(60.0, idle_purge_seconds / 4)
        self._last_purge = time.monotonic()

    @property
    def stats(self) -> DedupStats:
        """A snapshot of the counters."""
        return dataclasses.replace(self._stats)

    def key_of(self, msg: Message) -> tuple[str, Key]:
        """(sender, id) of a message under this receiver's ``key_by``."""
        if self.key_by == "sequence":
            return f"{msg.producer_name()}@{msg.topic_name()}", (msg.sequence_id(), 0, 0)
        mid = msg.message_id()
        return msg.topic_name(), (mid.ledger_id(), mid.entry_id(), mid.batch_index())

    def process_one(self, timeout_millis: int | None = None) -> Outcome | None:
        """Handle one message: a held one whose predecessor is now done (or which must be parked)
        first, else the next received; None if none came within ``timeout_millis``, which, while
        the ordering guard holds messages, is capped at its ``poll_interval_ms`` (so that held
        messages expire on time): a None then does not mean the input is idle."""
        if time.monotonic() - self._last_purge >= self._purge_every:
            self.purge_idle()
        g = self.ordering
        if g is not None:
            action = g.next_action()
            if action is not None:
                msg, why = action
                return self._handle(msg) if why is None else self._park(msg, why)
            timeout_millis = g.wait_cap_ms(timeout_millis)
        try:
            msg = self.consumer.receive(timeout_millis)
        except Timeout:
            return None
        return self._handle(msg)

    def _handle(self, msg: Message) -> Outcome:
        sender, key = self.key_of(msg)
        store = self.store
        g = self.ordering
        conflict = False
        verdict: OutOfOrder | bool = True
        store.begin()
        try:
            dup = store.seen(self.scope, sender, key, time.time())
            if not dup and g is not None:
                verdict = g.check_in_txn(msg)
            if not dup and verdict is True:
                self.handler(msg, store.connection)
                try:
                    store.record(self.scope, sender, key, self.window)
                    if g is not None:
                        g.mark_in_txn(msg, "done")
                except Exception as exc:
                    if not store.is_key_conflict(exc):
                        raise
                    conflict = True  # recorded concurrently by another receiver: undo our effect
            if conflict or verdict is not True:
                store.rollback()
            else:
                store.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                store.rollback()
            raise
        if not dup and verdict is False:
            assert g is not None
            g.hold(msg)  # not acknowledged: a crash redelivers it
            self._stats.held += 1
            return Outcome.HELD
        if not dup and isinstance(verdict, OutOfOrder):
            return self._park(msg, verdict)
        dup = dup or conflict
        if dup:
            return self._duplicate(msg)
        if g is not None:
            g.after_commit(msg, "done")
        if self.after_commit is not None:
            self.after_commit(msg)
        self.consumer.acknowledge(msg)
        self._stats.processed += 1
        return Outcome.PROCESSED

    def _duplicate(self, msg: Message) -> Outcome:
        """A message whose id was already recorded: acknowledge it again, apply nothing."""
        self.consumer.acknowledge(msg)
        self._stats.duplicates += 1
        if self.on_duplicate is not None:
            self.on_duplicate(msg)
        return Outcome.DUPLICATE

    def _park(self, msg: Message, why: OutOfOrder) -> Outcome:
        """Store ``msg`` with the reason and record its id (one transaction), then acknowledge it."""
        g = self.ordering
        assert g is not None
        sender, key = self.key_of(msg)
        store = self.store
        store.begin()
        try:
            dup = store.seen(self.scope, sender, key, time.time())
            if not dup:
                store.record(self.scope, sender, key, self.window)
                store.order_park(self.scope, msg.topic_name(), str(msg.message_id()), why.business_id, str(why),
                                 msg.data(), msg.properties(), time.time())
                g.mark_in_txn(msg, "parked")
            store.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                store.rollback()
            raise
        if dup:
            return self._duplicate(msg)
        g.after_commit(msg, "parked")
        if self.on_park is not None:
            self.on_park(msg, why)
        self.consumer.acknowledge(msg)
        self._stats.parked += 1
        return Outcome.PARKED

    def run(self, max_messages: int | None = None, timeout_millis: int | None = None) -> DedupStats:
        """Process messages until ``max_messages`` were handled (processed, dropped or parked; held
        ones count when they are) or, with ``timeout_millis``, until none arrived for that long and
        none is held; forever if both are None."""
        handled = 0
        slice_ms = timeout_millis if timeout_millis is not None else max(int(self._purge_every * 1000), 1)
        while max_messages is None or handled < max_messages:
            out = self.process_one(slice_ms)
            if out is None:
                if timeout_millis is not None and not (self.ordering is not None and self.ordering.holding):
                    break
                continue
            if out is not Outcome.HELD:
                handled += 1
        return self.stats

    def purge_idle(self) -> list[str]:
        """Forget the senders idle for ``idle_purge_seconds`` now; returns them."""
        self._last_purge = time.monotonic()
        gone = self.store.purge_idle(self.scope, time.time() - self.idle_purge_seconds)
        self._stats.purged_senders += len(gone)
        return gone

    def close(self) -> None:
        """Close the store if the receiver opened it (the consumer stays the caller's)."""
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> DedupReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DedupReceiver", "DedupStats", "Outcome"]
