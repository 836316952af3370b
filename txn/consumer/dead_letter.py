"""Dead-letter topic: a message redelivered ``max_redeliver_count`` times is produced to the
dead-letter topic and acknowledged, as the official client (C++ core, Java) does, when it is
negatively acknowledged, when its ack timeout passes (Shared and Key_Shared subscriptions), or on
arrival once redelivered more often than that (e.g. after ``redeliver_unacknowledged_messages()``);
the last never reaches the application."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..message import Message

log = logging.getLogger("txn.consumer")

#: Properties the official client stamps on a dead-lettered message.
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
#: The official default dead-letter topic is ``<topic>-<subscription>`` + this.
DLQ_SUFFIX = "-DLQ"


class ConsumerDeadLetterPolicy:
    """As ``pulsar.ConsumerDeadLetterPolicy``: ``max_redeliver_count`` (> 0), the dead-letter topic
    (default ``<topic>-<subscription>-DLQ``) and a subscription to create on it first (optional).
    ``retry_letter_topic`` (ours, as the Java client's): where ``reconsume_later`` sends messages of a
    consumer subscribed with ``retry_enable=True`` (default ``<topic>-<subscription>-RETRY``)."""

    def __init__(self, max_redeliver_count: int, dead_letter_topic: str | None = None,
                 initial_subscription_name: str | None = None, *, retry_letter_topic: str | None = None) -> None:
        if max_redeliver_count is None or max_redeliver_count < 1:
            raise ValueError("max_redeliver_count must be greater than 0")
        if retry_letter_topic is not None and not isinstance(retry_letter_topic, str):
            raise ValueError("argument retry_letter_topic must be None or of type str, "
                             f"not {type(retry_letter_topic).__name__}")
        self._max = max_redeliver_count
        self._topic = dead_letter_topic or ""
        self._initial = initial_subscription_name or ""
        self._retry = retry_letter_topic or ""

    @property
    def retry_letter_topic(self) -> str:
        """The retry-letter topic (``""``: the default)."""
        return self._retry

    @property
    def max_redeliver_count(self) -> int:
        """Redeliveries before a message goes to the dead-letter topic."""
        return self._max

    @property
    def dead_letter_topic(self) -> str:
        """The dead-letter topic (``""``: the default)."""
        return self._topic

    @property
    def initial_subscription_name(self) -> str:
        """The subscription created on the dead-letter topic (``""``: none)."""
        return self._initial


class DeadLetterSender:
    """Produces a consumer's dead letters (one lazily created producer) and acknowledges them."""

    def __init__(self, consumer: Any, policy: ConsumerDeadLetterPolicy) -> None:
        self._consumer = consumer
        self.policy = policy
        self.topic = policy.dead_letter_topic or (
            f"{consumer.topic()}-{consumer.subscription_name()}{DLQ_SUFFIX}")
        self._producer: Any = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        #: (topic consumer, ledger, entry) -> the messages of an entry that arrived redelivered
        #: ``max_redeliver_count`` times or more (dead-lettered if their ack timeout passes)
        self.candidates: dict[tuple[Any, int, int], list[Message]] = {}
        #: The properties of a message's dead letter (the Java client's, on a retry-enabled consumer)
        self.properties_of: Callable[[Message], dict[str, str]] = official_properties

    def on_arrival(self, sub: Any, msgs: list[Message]) -> list[Message]:
        """The messages of one entry as they arrive: remember them if redelivered the maximum number
        of times; dead-letter them (and return none) if redelivered more often (event-loop thread)."""
        count = msgs[0].redelivery_count()
        limit = self.policy.max_redeliver_count
        if count < limit:
            return msgs
        ledger, entry = _entry_of(msgs[0])
        if count == limit:
            self.candidates[(sub, ledger, entry)] = list(msgs)
            return msgs
        self.candidates.pop((sub, ledger, entry), None)
        for m in msgs:
            self.send(m)
        return []

    def on_timeout(self, sub: Any, entries: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Dead-letter the candidates among ``entries`` (their ack timeout passed); return the others."""
        rest = []
        for ledger, entry in entries:
            msgs = self.candidates.pop((sub, ledger, entry), None)
            if msgs is None:
                rest.append((ledger, entry))
            else:
                for m in msgs:
                    self.send(m)
        return rest

    def forget(self, sub: Any, message_or_id: Any) -> None:
        """``message_or_id`` was acknowledged: no longer a candidate."""
        if self.candidates:
            self.candidates.pop((sub, *_entry_of(message_or_id)), None)

    def wants(self, message: Message) -> bool:
        """True if ``message`` was redelivered ``max_redeliver_count`` times already."""
        return message.redelivery_count() >= self.policy.max_redeliver_count

    def send(self, message: Message) -> None:
        """Dead-letter ``message`` in the background (on failure it is redelivered instead)."""
        task = asyncio.get_running_loop().create_task(self._send(message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def producer(self) -> Any:
        """The dead-letter topic's producer (created, with the initial subscription, on first use)."""
        return await self._get_producer()

    async def _get_producer(self) -> Any:
        async with self._lock:
            if self._producer is None:
                from ..producer import AsyncProducer, ProducerConfig
                from .config import ConsumerConfig, InitialPosition

                ctx = self._consumer.ctx
                if self.policy.initial_subscription_name:
                    # The consumer's own class (no import of it here: it imports this module).
                    sub = type(self._consumer)(ctx, [self.topic], ConsumerConfig(
                        subscription_name=self.policy.initial_subscription_name,
                        initial_position=InitialPosition.Earliest))
                    await sub.start()
                    await sub.close()
                p = AsyncProducer(ctx, self.topic, ProducerConfig(batching_enabled=False, chunking_enabled=True))
                await p.start()
                self._producer = p
            return self._producer

    async def _send(self, message: Message) -> None:
        try:
            producer = await self._get_producer()
            props = self.properties_of(message)
            await producer.send_now(message.data(), properties=props,
                                    partition_key=message.partition_key() or None,
                                    ordering_key=message.ordering_key() or None)
            if not self._consumer.closed:
                self._consumer.acknowledge_nowait(message)
            self.candidates.pop((getattr(message, "consumer", None), *_entry_of(message)), None)
        except Exception as exc:
            log.warning("dead-lettering %s to %s failed (%s); redelivering it",
                        message.message_id(), self.topic, exc)
            sub = getattr(message, "consumer", None)
            if sub is not None and not self._consumer.closed:
                sub.nack(message.message_id())

    async def close(self) -> None:
        """Wait for dead letters on their way, then close the producer."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._producer is not None:
            await self._producer.close()


def official_properties(message: Message) -> dict[str, str]:
    """A dead letter's properties, as the official (C++) client writes them."""
    props = dict(message.properties())
    props[PROPERTY_REAL_TOPIC] = message.topic_name()
    props[PROPERTY_ORIGIN_MESSAGE_ID] = str(message.message_id())
    return props


def _entry_of(item: Any) -> tuple[int, int]:
    mid = item.message_id() if isinstance(item, Message) else item
    return mid.ledger_id(), mid.entry_id()
