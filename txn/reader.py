"""``Reader``: read a topic from a given position, without a durable subscription.

A reader is a consumer on a non-durable, exclusive subscription that starts at a message
id; nothing it reads is ever acknowledged on the broker, and after a reconnect it resumes
right after the last message it handed out.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from .consumer import AsyncConsumer, ConsumerConfig, ConsumerType, InitialPosition
from .consumer.async_consumer import seek_target
from .context import ClientContext
from .crypto import MessageDecryptor
from .message import EARLIEST, LATEST, Message, MessageId, signed64
from .message import more_in_entry as _more_in_entry
from .partitioned_reader import AsyncPartitionedReader, open_partitioned_reader
from .reader_listener import reader_delivery
from .schema import Schema
from .topic import parse_topic


class AsyncReader:
    """Reads one (non-partitioned) topic or one partition from ``start_message_id`` onwards."""

    def __init__(self, consumer: AsyncConsumer, start: MessageId, inclusive: bool) -> None:
        self._consumer = consumer
        self._sub = consumer.topic_consumers[0]
        self._start = start
        self._inclusive = inclusive
        self._last: MessageId | None = None

    @property
    def async_consumer(self) -> AsyncConsumer:
        """The consumer this reader reads with."""
        return self._consumer

    def topic(self) -> str:
        """The topic read."""
        return self._consumer.topic()

    @property
    def closed(self) -> bool:
        """True once closed (by :meth:`close` or by its client)."""
        return self._consumer.closed

    def is_connected(self) -> bool:
        """True while the reader's subscription is live (False once closed)."""
        return self._consumer.is_connected()

    async def read_next(self, timeout_millis: int | None = None) -> Message:
        """The next message; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        # What precedes the start (or the last message read, after a resubscribe) in its batch entry
        # never reaches the queue (the consumer drops it as it arrives).
        m = await self._consumer.receive(timeout_millis)
        self.admit(m)
        return m

    def admit(self, msg: Message) -> bool:
        """Record ``msg`` as read: a reconnect resumes after it. Always True (this reader's consumer
        drops what precedes its start itself)."""
        mid = msg.message_id()
        self._last = mid
        self._sub.resume_from, self._sub.resume_inclusive = mid, False
        return True

    def start_listener(self, listener: Callable[[AsyncReader, Message], Any]) -> None:
        """Hand each message to ``listener(self, message)`` from now on, one at a time, on the event
        loop (a coroutine it returns is awaited first); :meth:`read_next` is refused meanwhile."""
        self._consumer.start_listener(reader_delivery(self, self, listener))

    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the reader to a message id or a publish time (int, ms since the epoch)."""
        self._consumer.check_open()
        target = seek_target(messageid)
        await self._sub.seek(target, exclusive=not self._inclusive)
        self._last = None
        self._start = target if isinstance(target, MessageId) else EARLIEST

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the topic (ledger -1 if it is empty)."""
        return await self._sub.get_last_message_id()

    async def has_message_available(self) -> bool:
        """True if a message after the last one read is stored on the topic."""
        if len(self._consumer.receive_queue):
            return True
        last = await self._sub.get_last_message_id()
        if last.entry_id() < 0 or last.ledger_id() < 0:
            return False  # empty topic
        if self._last is None:
            start = self._start
            if start == LATEST and self._inclusive:
                # As the official client: latest, inclusive, nothing read yet: hand out the last message.
                await self._sub.seek(last, exclusive=False)
                self._start = last
                return True
            if start == EARLIEST:
                return True
            at = (signed64(start.ledger_id()), signed64(start.entry_id()))  # the wire's 2^64-1 is -1
            if (last.ledger_id(), last.entry_id()) > at:
                return True
            if (last.ledger_id(), last.entry_id()) == at:
                # The start is the last entry: only it (inclusive) or the rest of its batch remains.
                return self._inclusive or _more_in_entry(start, last)
            return False
        return (last.ledger_id(), last.entry_id()) > (self._last.ledger_id(), self._last.entry_id()) or (
            (last.ledger_id(), last.entry_id()) == (self._last.ledger_id(), self._last.entry_id())
            and _more_in_entry(self._last, last)
        )

    async def close(self) -> None:
        """Close the reader."""
        await self._consumer.close()


async def create_reader(
    ctx: ClientContext,
    topic: str,
    start_message_id: MessageId,
    start_message_id_inclusive: bool = False,
    receiver_queue_size: int = 1000,
    reader_name: str | None = None,
    subscription_role_prefix: str | None = None,
    is_read_compacted: bool = False,
    decryptor: MessageDecryptor | None = None,
    crypto_failure_action: int = 0,
    schema: Schema | None = None,
) -> AsyncReader | AsyncPartitionedReader:
    """Open a reader on ``topic``: an :class:`AsyncReader` on a non-partitioned topic or a single
    partition, an :class:`~txn.partitioned_reader.AsyncPartitionedReader` on a partitioned topic.

    As the official client, ``reader_name`` names the consumer, and the (non-durable) subscription
    is ``reader-<10 random hex digits>``, prefixed by ``<subscription_role_prefix>-`` if one is
    given. ``ctx`` is the context of the client that opens it (:meth:`AsyncClient.create_reader`);
    ``decryptor``, ``crypto_failure_action`` and ``schema`` (None for bytes) as in
    :class:`~txn.consumer.ConsumerConfig`."""
    name = str(parse_topic(topic))
    partitioned = await ctx.pool.partitions(name) > 0
    subscription = f"reader-{secrets.token_hex(5)}"
    if subscription_role_prefix:
        subscription = f"{subscription_role_prefix}-{subscription}"
    conf = ConsumerConfig(
        subscription_name=subscription,
        consumer_name=reader_name or None,
        read_compacted=is_read_compacted,
        consumer_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest if start_message_id == EARLIEST else InitialPosition.Latest,
        receiver_queue_size=receiver_queue_size,
        durable=False,
        start_message_id=start_message_id,
        start_message_id_inclusive=start_message_id_inclusive,
        decryptor=decryptor,
        crypto_failure_action=crypto_failure_action,
        schema=schema,
    )
    if partitioned:
        return await open_partitioned_reader(ctx, name, conf)
    c = AsyncConsumer(ctx, [name], conf)
    await c.start()
    ctx.register(c)
    return AsyncReader(c, start_message_id, start_message_id_inclusive)
