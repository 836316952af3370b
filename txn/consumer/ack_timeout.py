"""Ack timeout (``unacked_messages_timeout_ms``): messages handed to the application and not
acknowledged within the timeout are redelivered, as the official client's unacked-message tracker
does.

Messages are tracked by entry (a batch's messages share one), in time slots of one tick (1 s, or
the timeout if shorter): each tick the oldest slot's entries are redelivered, so a message comes
again between ``timeout`` and ``timeout + tick`` after it was handed out. An acknowledgement
(individual, cumulative or transactional) or a negative acknowledgement stops tracking it.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from typing import Any

from ..message import Message, MessageId, ReceivedMessage

#: The official client refuses shorter timeouts (0 turns the ack timeout off).
MIN_UNACKED_MESSAGES_TIMEOUT_MS = 10000
#: The official client's tick (``tickDurationInMs``).
DEFAULT_TICK_MS = 1000

Key = tuple[Any, int, int]  # (topic consumer, ledger, entry)


def check_unacked_messages_timeout(value: int | None) -> None:
    """``ValueError`` for a timeout the official client refuses (below 10 s and not 0)."""
    if value and value < MIN_UNACKED_MESSAGES_TIMEOUT_MS:
        raise ValueError("Consumer Config Exception: Unacknowledged message timeout should be greater than "
                         "10 seconds.")


def _entry(item: Message | MessageId) -> tuple[int, int]:
    if type(item) is ReceivedMessage:
        return item.entry[0], item.entry[1]
    mid = item.message_id() if isinstance(item, Message) else item
    return mid.ledger_id(), mid.entry_id()


class UnackedTracker:
    """The entries handed out and not acknowledged, in time slots (thread-safe)."""

    def __init__(self, timeout_ms: int, tick_ms: int = DEFAULT_TICK_MS) -> None:
        self.timeout_ms = timeout_ms
        self.tick_ms = min(tick_ms, timeout_ms)
        slots = math.ceil(timeout_ms / self.tick_ms) + 1
        self._slots: deque[set[Key]] = deque(set() for _ in range(slots))
        self._where: dict[Key, set[Key]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._where)

    def add(self, msg: Message) -> None:
        """Track ``msg`` (handed to the application now), unless its entry is tracked already."""
        sub = msg.consumer
        if sub is None:
            return
        key = (sub, *_entry(msg))
        with self._lock:
            if key not in self._where:
                slot = self._slots[-1]
                slot.add(key)
                self._where[key] = slot

    def remove(self, sub: Any, item: Message | MessageId) -> None:
        """Stop tracking the entry of ``item`` (acknowledged or negatively acknowledged)."""
        key = (sub, *_entry(item))
        with self._lock:
            slot = self._where.pop(key, None)
            if slot is not None:
                slot.discard(key)

    def remove_until(self, sub: Any, item: Message | MessageId) -> None:
        """Stop tracking ``sub``'s entries up to and including that of ``item`` (a cumulative ack)."""
        upto = _entry(item)
        with self._lock:
            for key in [k for k in self._where if k[0] is sub and k[1:] <= upto]:
                self._where.pop(key).discard(key)

    def clear(self, sub: Any) -> None:
        """Stop tracking ``sub``'s entries (all of them are being redelivered)."""
        with self._lock:
            for key in [k for k in self._where if k[0] is sub]:
                self._where.pop(key).discard(key)

    def tick(self) -> dict[Any, list[tuple[int, int]]]:
        """Start a new slot; return the entries of the oldest one (timed out), by topic consumer."""
        with self._lock:
            expired = self._slots.popleft()
            self._slots.append(set())
            out: dict[Any, list[tuple[int, int]]] = {}
            for key in expired:
                del self._where[key]
                out.setdefault(key[0], []).append((key[1], key[2]))
        return out
