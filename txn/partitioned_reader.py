"""``AsyncPartitionedReader``: a reader of every partition of a partitioned topic.

One non-durable, exclusive subscription per partition (one consumer over them all, as the
official client's multi-topic reader): each partition is handed out in order, the partitions
interleaved as their messages arrive. Each partition keeps its own position: where it started,
and the last message read from it, where it resumes after a reconnect.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .consumer import AsyncConsumer, ConsumerConfig
from .consumer.async_consumer import seek_target
from .consumer.topic_consumer import TopicConsumer
from .context import ClientContext
from .errors import OperationNotSupported
from .message import EARLIEST, LATEST, Message, MessageId, more_in_entry
from .reader_listener import reader_delivery


@dataclass
class _Position:
    """One partition's reading: its start (or last seek target), the last message read, and whether
    what precedes the start in the start's entry is still to be dropped (a start id other than
    ``EARLIEST``/``LATEST``, until the partition is sought)."""

    start: MessageId
    inclusive: bool
    trim: bool
    last: MessageId | None = None

    def before_start(self, mid: MessageId) -> bool:
        """Whether ``mid`` is in the start's entry and precedes the start (or is it, exclusive)."""
        if not self.trim or self.last is not None or _key(mid) != _key(self.start):
            return False
        index, start = mid.batch_index(), self.start.batch_index()
        return index < start if self.inclusive else index <= start


def _key(mid: MessageId) -> tuple[int, int]:
    return mid.ledger_id(), mid.entry_id()


def _special(mid: MessageId) -> bool:
    return mid.entry_key[:2] in (EARLIEST.entry_key[:2], LATEST.entry_key[:2])


class AsyncPartitionedReader:
    """Reads all partitions of a partitioned topic from a start message id onwards.

    Made by :meth:`txn.AsyncClient.create_reader` for a partitioned topic; its API is that of
    :class:`~txn.AsyncReader`. A start id other than ``EARLIEST``/``LATEST`` is the start of every
    partition, as in the official client: the broker starts a partition whose ledgers all precede
    the id's at its end, one whose ledgers follow it at its beginning."""

    def __init__(self, consumer: AsyncConsumer, start: MessageId, inclusive: bool) -> None:
        self._consumer = consumer
        self._start = start
        self._inclusive = inclusive
        self._positions: dict[TopicConsumer, _Position] = {}

    def _position(self, sub: TopicConsumer) -> _Position:
        # Partitions added later (partition discovery) start where the reader started.
        pos = self._positions.get(sub)
        if pos is None:
            pos = self._positions[sub] = _Position(self._start, self._inclusive, not _special(self._start))
        return pos

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The consumer (of every partition) this reader reads with."""
        return self._consumer

    def topic(self) -> str:
        """The (partitioned) topic read."""
        return self._consumer.topic()

    def partition_topics(self) -> list[str]:
        """The partitions read."""
        return self._consumer.partition_topics()

    @property
    def closed(self) -> bool:
        """True once closed (by :meth:`close` or by its client)."""
        return self._consumer.closed

    def is_connected(self) -> bool:
        """True while every partition's subscription is live (False once closed)."""
        return self._consumer.is_connected()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message of any partition; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_millis is None else loop.time() + timeout_millis / 1000.0
        while True:
            left = None if deadline is None else max(0, round((deadline - loop.time()) * 1000))
            m = await self._consumer.receive(left)
            if self.admit(m):
                return m

    def admit(self, msg: Message) -> bool:
        """Record ``msg`` as read from its partition (a reconnect resumes after it); False if it
        precedes the start in the start's entry, which the reader skips."""
        sub = msg.consumer
        if not isinstance(sub, TopicConsumer):
            return True
        pos = self._position(sub)
        mid = msg.message_id()
        if pos.before_start(mid):
            return False
        pos.last = mid
        sub.resume_from, sub.resume_inclusive = mid, False
        return True

    def start_listener(self, listener: Callable[[AsyncPartitionedReader, Message], Any]) -> None:
        """Hand each message to ``listener(self, message)`` from now on, one at a time, on the event
        loop (a coroutine it returns is awaited first); :meth:`read_next` is refused meanwhile."""
        self._consumer.start_listener(reader_delivery(self, self, listener))

    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the reader: every partition to ``EARLIEST``, ``LATEST`` or a publish time (int, ms
        since the epoch), or one partition to a message id of it (the others keep their place).

        An id that names no partition of this topic (its ``topic`` empty or another one) raises
        :class:`~txn.OperationNotSupported`, as in the official client."""
        self._consumer.check_open()
        target = seek_target(messageid)
        subs = list(self._consumer.topic_consumers)
        if isinstance(target, MessageId) and not _special(target):
            subs = [s for s in subs if s.topic == target.topic]
            if not subs:
                raise OperationNotSupported(
                    f"cannot seek to {target}: its topic {target.topic!r} is not a partition of this reader",
                    topic=self.topic())
        await asyncio.gather(*(s.seek(target, exclusive=not self._inclusive) for s in subs))
        for s in subs:
            pos = self._position(s)
            pos.start = target if isinstance(target, MessageId) else EARLIEST
            pos.last, pos.trim = None, False

    async def has_message_available(self) -> bool:
        """True if some partition stores a message after the last one read from it."""
        self._consumer.check_open()
        self._drop_before_start()
        if len(self._consumer.receive_queue):
            return True
        answers = await asyncio.gather(*(self._available(s) for s in list(self._consumer.topic_consumers)))
        self._drop_before_start()  # what arrived meanwhile
        return any(answers) or len(self._consumer.receive_queue) > 0

    def _drop_before_start(self) -> None:
        """Take out of the queue what :meth:`read_next` would skip, so that it does not count as
        available (its permits go back to the broker, as those of messages taken)."""
        positions = [self._position(s) for s in self._consumer.topic_consumers]
        if not any(p.trim and p.last is None for p in positions):
            return
        dropped: Counter[TopicConsumer] = Counter()

        def before_start(m: Any) -> bool:
            sub = getattr(m, "consumer", None)
            if isinstance(sub, TopicConsumer) and self._position(sub).before_start(m.message_id()):
                dropped[sub] += 1
                return True
            return False

        queue = self._consumer.receive_queue
        queue.remove_where(before_start)
        for sub, n in dropped.items():
            sub.send_flow(queue.count(sub, n))

    async def _available(self, sub: TopicConsumer) -> bool:
        pos = self._position(sub)
        last = await sub.get_last_message_id()
        if last.entry_id() < 0 or last.ledger_id() < 0:
            return False  # empty partition
        if pos.last is not None:
            return _key(last) > _key(pos.last) or (_key(last) == _key(pos.last) and more_in_entry(pos.last, last))
        start = pos.start
        if start == LATEST and pos.inclusive:
            # As the official client: latest, inclusive, nothing read yet: hand out the last message.
            await sub.seek(last, exclusive=False)
            pos.start = last
            return True
        if start == EARLIEST or _key(last) > _key(start):
            return True
        if _key(last) == _key(start):
            return pos.inclusive or more_in_entry(start, last)
        return False

    async def close(self) -> None:
        """Close the reader (every partition)."""
        await self._consumer.close()


async def open_partitioned_reader(ctx: ClientContext, topic: str, conf: ConsumerConfig) -> AsyncPartitionedReader:
    """Subscribe to every partition of ``topic`` with the reader settings ``conf`` (made by
    :func:`txn.reader.create_reader`, which calls it for a partitioned topic).

    A start id other than ``EARLIEST``/``LATEST`` goes to the broker as its entry, inclusive, and
    the reader drops what precedes the start in that entry itself: the consumer's own filter drops
    everything before the start, which would also drop a partition's messages whose ledger
    precedes the start's (the official client reads those)."""
    start = conf.start_message_id if conf.start_message_id is not None else EARLIEST
    inclusive = conf.start_message_id_inclusive
    if not _special(start):
        conf = dataclasses.replace(conf, start_message_id=MessageId(ledger_id=start.ledger_id(),
                                                                    entry_id=start.entry_id()),
                                   start_message_id_inclusive=True)
    c = AsyncConsumer(ctx, [topic], conf)
    await c.start()
    ctx.register(c)
    return AsyncPartitionedReader(c, start, inclusive)
