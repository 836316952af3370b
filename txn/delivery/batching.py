"""Closing a processor's batches at batch-entry boundaries.

A producer that batches stores many messages in one entry. When a processor batch ends in the
middle of an entry, the entry's messages are acknowledged by two transactions, as partial
batch-index acks; Pulsar 4.0.8 can lose such acks at a broker restart (see
tests/test_conformance_batch_ack_bug.py). With ``ProcessorConfig.batch_entry_boundaries`` a batch
that reaches its size or delay limit inside an entry takes the rest of that entry first (the
batch may exceed ``batch_max_messages`` by up to an entry's size), and a message of another entry
that was received to find that out is held for the next batch.
"""

from __future__ import annotations

from collections.abc import Callable

from ..message import Message, ReceivedMessage, position

EntryKey = tuple[str, int, int]


def entry_of(m: Message) -> tuple[EntryKey, bool] | None:
    """((topic, ledger, entry), whether more of the entry can follow ``m``), or None if unbatched."""
    if type(m) is ReceivedMessage:
        ledger, entry, _partition, size = m.entry
        index = m.batch_index
    else:
        mid = m.message_id()
        ledger, entry, size, index = mid.ledger_id(), mid.entry_id(), mid.batch_size, mid.batch_index()
    if index < 0 or size <= 0:
        return None
    return (m.topic_name(), ledger, entry), index < size - 1


class EntryBoundaries:
    """Per-processor state of entry-boundary batching: at most one held-back message."""

    def __init__(self) -> None:
        self._held: Message | None = None
        self._held_at = 0

    def take(self, subscriptions_made: int) -> Message | None:
        """The message held back by the previous batch, unless the consumer re-subscribed since
        (``subscriptions_made`` changed: the broker then delivers it again)."""
        m, self._held = self._held, None
        return m if m is not None and self._held_at == subscriptions_made else None

    def drop(self) -> None:
        """Forget the held message (its consumer's inputs were handed back: it comes again)."""
        self._held = None

    def complete(self, batch: list[Message], seen: set[tuple[str, int, int, int, int]],
                 receive_nowait: Callable[[], Message | None], subscriptions_made: int) -> None:
        """Extend a closed ``batch`` with the queued rest of its last entry; hold the first message
        of another entry for the next batch. ``seen`` holds the batch's (topic, message id) keys."""
        if not batch:
            return
        info = entry_of(batch[-1])
        while info is not None and info[1]:
            m = receive_nowait()
            if m is None:
                return  # the rest of the entry was acknowledged before (entries arrive whole)
            key = position(m)
            if key in seen:
                continue
            nxt = entry_of(m)
            if nxt is None or nxt[0] != info[0]:
                self._held, self._held_at = m, subscriptions_made
                return
            seen.add(key)
            batch.append(m)
            info = nxt
