"""Retry-letter topic, with the Java client's semantics (``enableRetry``, ``reconsumeLater``).

``subscribe(..., retry_enable=True)`` also subscribes to the retry-letter topic (default
``<topic>-<subscription>-RETRY``, the first topic's full name) with the same subscription.
``reconsume_later(message, delay)`` produces a copy of the message there, delivered after ``delay``,
and acknowledges the original; the copy carries the properties the Java client writes (below).
Once a message was reconsumed more than ``max_redeliver_count`` times (16 without a dead-letter
policy) it goes to the dead-letter topic (default ``<topic>-<subscription>-DLQ``) instead.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from ..connection import check_error, command, next_request_id
from ..errors import InvalidConfiguration, TopicNotFound, from_server_error
from ..message import ChunkMessageId, Message, MessageId
from ..protocol import pb
from ..topic import parse_topic
from .dead_letter import DLQ_SUFFIX, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_TOPIC, ConsumerDeadLetterPolicy

#: Properties of a reconsumed message (names as the Java client's ``RetryMessageUtil``).
PROPERTY_RECONSUME_TIMES = "RECONSUMETIMES"
PROPERTY_DELAY_TIME = "DELAY_TIME"
PROPERTY_REAL_SUBSCRIPTION = "REAL_SUBSCRIPTION"
#: The Java client's older, misspelt name for the origin id, which it still writes too.
PROPERTY_ORIGIN_MESSAGE_ID_LEGACY = "ORIGIN_MESSAGE_IDY_TIME"
RETRY_SUFFIX = "-RETRY"
T = pb.BaseCommand
#: The Java client's ``max_redeliver_count`` when retry is enabled without a dead-letter policy.
DEFAULT_MAX_RECONSUME_TIMES = 16


async def retry_policy(ctx: Any, topic: str, subscription: str,
                       policy: ConsumerDeadLetterPolicy | None) -> ConsumerDeadLetterPolicy:
    """The dead-letter policy of a retry-enabled consumer of ``topic`` (its full name): ``policy``
    (or ``max_redeliver_count`` 16) with the default retry-letter and dead-letter topics filled in:
    ``<topic>-<subscription>-RETRY`` / ``-DLQ``, or, as the Java client, the names of its older
    versions (``<namespace>/<subscription>-RETRY`` / ``-DLQ``) if such a topic exists."""
    retry = policy.retry_letter_topic if policy is not None else ""
    dead = policy.dead_letter_topic if policy is not None else ""
    if not retry or not dead:
        name = parse_topic(topic)
        old = f"{name.domain}://{name.tenant}/{name.namespace}/{subscription}"
        old_retry, old_dead = await asyncio.gather(topic_exists(ctx, old + RETRY_SUFFIX),
                                                   topic_exists(ctx, old + DLQ_SUFFIX))
        retry = retry or (old + RETRY_SUFFIX if old_retry else f"{topic}-{subscription}{RETRY_SUFFIX}")
        dead = dead or (old + DLQ_SUFFIX if old_dead else f"{topic}-{subscription}{DLQ_SUFFIX}")
    return ConsumerDeadLetterPolicy(
        policy.max_redeliver_count if policy is not None else DEFAULT_MAX_RECONSUME_TIMES,
        dead_letter_topic=dead,
        initial_subscription_name=policy.initial_subscription_name if policy is not None else None,
        retry_letter_topic=retry,
    )


async def topic_exists(ctx: Any, topic: str) -> bool:
    """Whether ``topic`` exists (its partition metadata, asked without auto-creating it), as the
    Java client's check of the older default names: a persistent topic exists if the broker knows
    it, a non-persistent one if it is partitioned."""
    conn = await ctx.pool.get()
    rid = next_request_id()
    resp = await conn.request(command(T.PARTITIONED_METADATA, topic=topic, request_id=rid,
                                      metadata_auto_creation_enabled=False), rid)
    try:
        check_error(resp, "partition metadata", topic=topic)
        r = resp.partitionMetadataResponse
        if r.HasField("response") and r.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
            name = pb.ServerError.Name(r.error) if r.HasField("error") else "UnknownError"
            raise from_server_error(name, f"partition metadata failed: {r.message}", topic=topic)
    except TopicNotFound:
        return False
    return parse_topic(topic).domain == "persistent" or r.partitions > 0


def delay_ms(delay: Any) -> int:
    """A delay (``timedelta`` or int ms) in ms; negative ones are 0, as in the Java client."""
    if isinstance(delay, timedelta):
        ms = int(delay / timedelta(milliseconds=1))
    elif isinstance(delay, int) and not isinstance(delay, bool):
        ms = delay
    else:
        raise ValueError(f"argument delay must be of type timedelta or int (ms), not {type(delay).__name__}")
    return max(ms, 0)


def java_message_id(mid: MessageId) -> str:
    """``mid`` as the Java client prints it: ``ledger:entry:partition``, ``:batch`` for a batch's
    message, ``first;last`` (the first and last chunks) for a chunked message."""
    if isinstance(mid, ChunkMessageId):
        ends = (mid.chunk_ids[0], mid.chunk_ids[-1])
        return ";".join(f"{c.ledger_id()}:{c.entry_id()}:{c.partition()}" for c in ends)
    text = f"{mid.ledger_id()}:{mid.entry_id()}:{mid.partition()}"
    return f"{text}:{mid.batch_index()}" if mid.batch_index() >= 0 else text


def owner_topic(topic: str) -> str:
    """The topic a message came from, without its ``-partition-N`` suffix."""
    base, sep, index = topic.rpartition("-partition-")
    return base if sep and index.isdigit() else topic


def origin_properties(message: Message, subscription: str) -> dict[str, str]:
    """``message``'s properties with where it came from added (unless already there), as the Java
    client writes them on a reconsumed message and a dead letter."""
    props = dict(message.properties())
    origin = java_message_id(message.message_id())
    props.setdefault(PROPERTY_REAL_TOPIC, owner_topic(message.topic_name()))
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID_LEGACY, origin)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, origin)
    props.setdefault(PROPERTY_REAL_SUBSCRIPTION, subscription)
    return props


def reconsume_properties(message: Message, subscription: str, custom: dict[str, str] | None,
                         delay: int) -> tuple[dict[str, str], int]:
    """The properties of ``message``'s next copy, and its reconsume count (as the Java client)."""
    props = origin_properties(message, subscription)
    if custom:
        props.update(custom)
    times = int(props[PROPERTY_RECONSUME_TIMES]) + 1 if PROPERTY_RECONSUME_TIMES in props else 1
    props[PROPERTY_RECONSUME_TIMES] = str(times)
    props[PROPERTY_DELAY_TIME] = str(delay)
    return props, times


class RetryLetterSender:
    """Produces a consumer's reconsumed messages (one lazily created producer on the retry topic)."""

    def __init__(self, consumer: Any, policy: ConsumerDeadLetterPolicy, dead_letters: Any) -> None:
        self._consumer = consumer
        self.policy = policy
        self._dead_letters = dead_letters
        subscription = consumer.subscription_name()
        # A retry-enabled consumer is the Java client's: its dead letters carry the Java properties.
        dead_letters.properties_of = lambda m: origin_properties(m, subscription)
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def _get_producer(self) -> Any:
        async with self._lock:
            if self._producer is None:
                from ..producer import AsyncProducer, ProducerConfig

                p = AsyncProducer(self._consumer.ctx, self.policy.retry_letter_topic,
                                  ProducerConfig(batching_enabled=False, chunking_enabled=True))
                await p.start()
                self._producer = p
            return self._producer

    async def reconsume_later(self, message: Message, delay: int, properties: dict[str, str] | None) -> None:
        """Send ``message`` to the retry topic (or, past the limit, the dead-letter topic), then acknowledge it."""
        props, times = reconsume_properties(message, self._consumer.subscription_name(), properties, delay)
        dead = times > self.policy.max_redeliver_count and bool(self.policy.dead_letter_topic)
        producer = await (self._dead_letters.producer() if dead else self._get_producer())
        event_time = message.event_timestamp()
        await producer.send_now(
            message.data(), properties=props, partition_key=message.partition_key() or None,
            ordering_key=message.ordering_key() or None, event_timestamp=event_time or None,
            deliver_after=timedelta(milliseconds=delay) if delay > 0 and not dead else None)
        self._consumer.acknowledge_nowait(message)

    async def close(self) -> None:
        """Close the producer."""
        if self._producer is not None:
            await self._producer.close()


def no_retry(topic: str) -> InvalidConfiguration:
    """The error of ``reconsume_later`` on a consumer subscribed without ``retry_enable``."""
    return InvalidConfiguration("reconsume_later needs a consumer subscribed with retry_enable=True", topic=topic)
