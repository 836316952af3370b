""":class:`AsyncConsumer`: the public consumer over topics and partitions (one
:class:`~.topic_consumer.TopicConsumer` each) and its receive queue."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Generator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..args import NUMBER, check_type_or_none
from ..backoff import Backoff
from ..context import ClientContext
from ..errors import AlreadyClosed, CumulativeAcknowledgementNotAllowedError, InvalidConfiguration, PulsarError
from ..message import Message, MessageId, ReceivedMessage
from ..receive_queue import ReceiveQueue
from .ack_timeout import UnackedTracker
from .acks import TXN_ACK_CHUNK, _split_by_entry
from .batch_receive import DEFAULT_POLICY
from .config import ConsumerConfig, ConsumerType
from .dead_letter import DeadLetterSender
from .retry_letter import RetryLetterSender, delay_ms, no_retry
from .topic_consumer import TopicConsumer

if TYPE_CHECKING:
    from ..transaction import AsyncTransaction

log = logging.getLogger("txn.consumer")


class Done:
    """What a call that has already taken effect returns: awaiting it gives None at once.

    ``pulsar.asyncio`` makes some calls coroutines that ours completes on the spot; returning
    this lets code written for either style work: ``await consumer.negative_acknowledge(m)`` as
    there, or a plain call (nothing is left un-awaited)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()

    def __repr__(self) -> str:
        return "<done>"


DONE = Done()


class AsyncConsumer:
    """A consumer over one or more topics (and all partitions of partitioned ones)."""

    def __init__(self, ctx: ClientContext, topics: list[str], conf: ConsumerConfig) -> None:
        #: The context of the client that made it (pool, ids, registry).
        self.ctx = ctx
        self._topics = topics
        self.conf = conf
        #: One :class:`TopicConsumer` per topic or partition.
        self.topic_consumers: list[TopicConsumer] = []
        self._by_topic: dict[str, TopicConsumer] = {}
        #: Received messages waiting for :meth:`receive` (thread-safe; the sync facade pops from it).
        self.receive_queue = ReceiveQueue(asyncio.get_running_loop(), lambda sub, n: sub.send_flow(n))
        self._closed = False
        self._ticker: asyncio.Task[None] | None = None
        #: Partitioned topic -> the partition count subscribed to (see :meth:`update_partitions`).
        self._partition_counts: dict[str, int] = {}
        self._per_partition_queue = conf.receiver_queue_size
        self._discoverer: asyncio.Task[None] | None = None
        self._discover_soon = asyncio.Event()
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._done.set_result(None)
        #: Successful (re)subscriptions of any topic/partition: a change means the broker may
        #: have recovered the subscription's cursor (and, on Pulsar 4.0.x, lost batch-index acks).
        self.subscriptions_made = 0
        policy = conf.dead_letter_policy
        self._dead_letters = None if policy is None else DeadLetterSender(self, policy)  # type: ignore[arg-type]
        self._retry_letters = RetryLetterSender(self, policy, self._dead_letters) if conf.retry_enable else None  # type: ignore[arg-type]
        #: The ``message_listener`` given at subscribe; while one is set, ``receive()`` is refused.
        self.message_listener: Callable[..., Any] | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._listener_resumed = asyncio.Event()
        self._listener_resumed.set()
        #: Messages handed out and not acknowledged yet (with ``unacked_messages_timeout_ms`` only).
        self.unacked = UnackedTracker(conf.unacked_messages_timeout_ms) if conf.unacked_messages_timeout_ms else None
        self._ack_timer: asyncio.Task[None] | None = None
        #: The limits of :meth:`batch_receive` (the count capped at ``receiver_queue_size``, as there).
        self.batch_policy = (conf.batch_receive_policy or DEFAULT_POLICY).capped(max(conf.receiver_queue_size, 1))
        #: ``receiver_queue_size=0`` on one topic: no prefetch, each receive asks for one message
        self.zero_queue = conf.receiver_queue_size == 0 and len(topics) == 1 and not conf.multi_topic

    async def start(self) -> None:
        """Subscribe on every topic and partition (the client calls it; raises the broker's error)."""
        counts = await asyncio.gather(*(self.ctx.pool.partitions(t) for t in self._topics))
        total_parts = sum(max(c, 1) for c in counts)
        per = self.conf.receiver_queue_size
        if self.zero_queue and total_parts > 1:
            raise InvalidConfiguration("Can't use partitioned topic if the queue size is 0", topic=self.topic())
        if total_parts > 1:
            per = max(1, min(per, self.conf.max_total_receiver_queue_size_across_partitions // total_parts))
        elif not self.zero_queue:
            per = max(per, 1)  # a list of topics with a queue of 0 prefetches one per topic
        self._per_partition_queue = per
        for t, n in zip(self._topics, counts, strict=True):
            if n > 0:
                self._partition_counts[t] = n
            names = [(t, -1)] if n == 0 else [(f"{t}-partition-{i}", i) for i in range(n)]
            for name, idx in names:
                sub = TopicConsumer(self, name, idx, per)
                self.topic_consumers.append(sub)
                self._by_topic[name] = sub
        try:
            await asyncio.gather(*(s.start() for s in self.topic_consumers))
        except BaseException:
            await asyncio.gather(*(s.close() for s in self.topic_consumers), return_exceptions=True)
            raise
        loop = asyncio.get_running_loop()
        self._ticker = loop.create_task(self._tick())
        if self.unacked is not None:
            self._ack_timer = loop.create_task(self._redeliver_timed_out(self.unacked))
        if self._partition_counts:
            self._discoverer = loop.create_task(self._discover())

    async def _tick(self) -> None:
        """Flush grouped acks and send due negative-ack redeliveries, for every topic consumer. A
        failure in one is logged and the loop goes on: a ticker that died would leave every later
        ack and nack of the consumer unsent."""
        interval = max(self.conf.ack_grouping_time_ms, 10) / 1000.0
        while not self._closed:
            await asyncio.sleep(interval)
            for s in self.topic_consumers:
                try:
                    s.flush_acks()
                    s.process_nacks()
                except Exception:  # noqa: BLE001 - logged; the next tick tries again
                    log.exception("%s: flushing acks or negative acks failed; trying again next tick", s.topic)

    async def _redeliver_timed_out(self, unacked: UnackedTracker) -> None:
        """Each tick, ask for the redelivery of what was handed out a timeout ago and not acknowledged
        (by id on Shared and Key_Shared subscriptions, else everything unacknowledged, as there)."""
        while not self._closed:
            await asyncio.sleep(unacked.tick_ms / 1000.0)
            shared = self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared)
            for sub, entries in unacked.tick().items():
                if sub.parent is not self or sub not in self.topic_consumers:
                    continue
                if shared and self._dead_letters is not None:
                    # As the official client: redelivered the maximum number of times, it is dead-lettered.
                    entries = self._dead_letters.on_timeout(sub, entries)
                    if not entries:
                        continue
                log.warning("%d messages of %s not acknowledged within %d ms; redelivering them",
                            len(entries), sub.topic, unacked.timeout_ms)
                sub.redeliver([MessageId(sub.partition, ledger, entry) for ledger, entry in entries])

    def on_arrival(self, sub: TopicConsumer, msgs: list[Message]) -> list[Message]:
        """An entry's messages as they arrive (with a dead-letter policy): those redelivered more
        often than ``max_redeliver_count`` go to the dead-letter topic instead (see :mod:`.dead_letter`)."""
        dead = self._dead_letters
        return msgs if dead is None or self._closed else dead.on_arrival(sub, msgs)

    def handed_out(self, msg: Message) -> None:
        """``msg`` goes to the application now: start its ack timeout (if there is one). Thread-safe."""
        if self.unacked is not None:
            self.unacked.add(msg)

    # ------------------------------------------------------ partition discovery

    def on_topic_consumer_lost(self, sub: TopicConsumer) -> None:
        """A partition's consumer was closed by the broker or lost its connection (it resubscribes)."""
        if sub.partition >= 0:
            self._discover_soon.set()

    def on_topic_consumer_resubscribed(self, sub: TopicConsumer) -> None:
        """A partition's consumer subscribed again, maybe to a topic deleted and re-created meanwhile."""
        if sub.partition >= 0:
            self._discover_soon.set()

    async def _discover(self) -> None:
        """Check the partition counts every ``partitions_update_interval_ms``, and soon after any
        partition consumer was closed or resubscribed (a topic deleted and re-created with more
        partitions closes the old ones first); while a check finds no count or fails, check again
        with backoff."""
        interval = max(self.conf.partitions_update_interval_ms, 100) / 1000.0
        retry = Backoff(0.2, min(interval, 5.0))
        wait = interval
        while not self._closed:
            try:
                await asyncio.wait_for(self._discover_soon.wait(), wait)
            except TimeoutError:
                pass
            if self._closed:
                return
            self._discover_soon.clear()
            try:
                complete = await self.update_partitions()
            except Exception:
                log.exception("checking the partitions of %s failed", list(self._partition_counts))
                complete = False
            if complete:
                retry = Backoff(0.2, min(interval, 5.0))
                wait = interval
            else:
                wait = retry.next()

    async def update_partitions(self) -> bool:
        """Subscribe to the partitions of the subscribed partitioned topics that have no consumer yet
        (e.g. a topic deleted and re-created with more partitions, or partitions added with the admin
        API). Returns False when a count could not be read or a partition not subscribed (check again
        soon). A partition count that went down is left alone: the missing partitions' consumers keep
        trying to resubscribe (the topic may come back)."""
        topics = list(self._partition_counts)
        counts = await asyncio.gather(*(self.ctx.pool.partitions(t) for t in topics), return_exceptions=True)
        complete = True
        new: list[tuple[str, TopicConsumer]] = []
        for t, n in zip(topics, counts, strict=True):
            if isinstance(n, BaseException):
                if not isinstance(n, PulsarError | OSError | TimeoutError):
                    raise n
                log.debug("partition count of %s not read (%s); checking again soon", t, n)
                complete = False
                continue
            if n == 0:
                # Deleted and not (yet) re-created, or re-created non-partitioned: no count to act on.
                complete = False
                continue
            if n < self._partition_counts[t]:
                log.warning("%s has %d partitions now, fewer than the %d subscribed; keeping them all",
                            t, n, self._partition_counts[t])
            for i in range(n):
                name = f"{t}-partition-{i}"
                if name not in self._by_topic:
                    new.append((t, TopicConsumer(self, name, i, self._per_partition_queue)))
        if not new:
            return complete
        results = await asyncio.gather(*(sub.start() for _, sub in new), return_exceptions=True)
        for (t, sub), r in zip(new, results, strict=True):
            if isinstance(r, BaseException):
                log.info("subscribe to new partition %s failed (%s); retrying soon", sub.topic, r)
                await sub.close()
                complete = False
            elif self._closed:
                await sub.close()
            else:
                log.info("subscribed to new partition %s", sub.topic)
                self.topic_consumers.append(sub)
                self._by_topic[sub.topic] = sub
                self._partition_counts[t] = max(self._partition_counts[t], sub.partition + 1)
        return complete

    async def add_topics(self, topics: list[str]) -> list[str]:
        """Subscribe to more topics (all partitions of partitioned ones) while running; returns those
        now subscribed. A topic whose partition count or subscription fails is left out (log only)."""
        counts = await asyncio.gather(*(self.ctx.pool.partitions(t) for t in topics), return_exceptions=True)
        added: list[str] = []
        for t, n in zip(topics, counts, strict=True):
            if isinstance(n, BaseException) or self._closed:
                log.info("not subscribing to %s now (%s)", t, n)
                continue
            names = [(t, -1)] if n == 0 else [(f"{t}-partition-{i}", i) for i in range(n)]
            subs = [TopicConsumer(self, name, idx, self._per_partition_queue) for name, idx in names]
            results = await asyncio.gather(*(s.start() for s in subs), return_exceptions=True)
            failed = next((r for r in results if isinstance(r, BaseException)), None)
            if failed is not None or self._closed:
                log.info("subscribe to %s failed (%s)", t, failed)
                await asyncio.gather(*(s.close() for s in subs), return_exceptions=True)
                continue
            self.topic_consumers.extend(subs)
            self._by_topic.update((s.topic, s) for s in subs)
            self._topics.append(t)
            if n > 0:
                self._partition_counts[t] = n
            added.append(t)
        if self._partition_counts and self._discoverer is None and not self._closed:
            self._discoverer = asyncio.get_running_loop().create_task(self._discover())
        return added

    async def remove_topics(self, topics: list[str]) -> None:
        """Close the consumers of ``topics`` (and their partitions), e.g. topics deleted meanwhile."""
        gone = set(topics)
        subs = [s for s in self.topic_consumers if s.topic in gone or s.topic.rpartition("-partition-")[0] in gone]
        self.topic_consumers[:] = [s for s in self.topic_consumers if s not in subs]
        for s in subs:
            self._by_topic.pop(s.topic, None)
        self._topics[:] = [t for t in self._topics if t not in gone]
        for t in gone:
            self._partition_counts.pop(t, None)
        await asyncio.gather(*(s.close() for s in subs), return_exceptions=True)

    # -------------------------------------------------------------------- API

    def topic(self) -> str:
        """The subscribed topic (the first one for multi-topic consumers)."""
        return self._topics[0]

    def subscription_name(self) -> str:
        """The subscription's name."""
        return self.conf.subscription_name

    def consumer_name(self) -> str:
        """The consumer's name, sent in SUBSCRIBE (``""`` for a consumer of a list of topics given none)."""
        return self.conf.consumer_name or ""

    @property
    def closed(self) -> bool:
        """True once closed (or unsubscribed)."""
        return self._closed

    def partition_topics(self) -> list[str]:
        """The topics (partitions) this consumer is subscribed to."""
        return [s.topic for s in self.topic_consumers]

    def receive_nowait(self) -> Message | None:
        """A queued message, or ``None`` without waiting."""
        self.check_receive()
        msg = self.receive_queue.get_nowait()
        if msg is not None and self.unacked is not None:
            self.unacked.add(msg)
        return msg

    def check_open(self) -> None:
        """Raise :class:`AlreadyClosed` once the consumer is closed."""
        if self._closed:
            raise AlreadyClosed("consumer is closed", topic=self.topic())

    def check_receive(self) -> None:
        """Raise :class:`AlreadyClosed` once closed, :class:`InvalidConfiguration` while a listener is set."""
        self.check_open()
        if self.message_listener is not None:
            raise InvalidConfiguration("Can not receive when a listener has been set", topic=self.topic())

    def want_one(self) -> None:
        """Zero queue: ask the broker for one message unless one is asked for or queued (any thread)."""
        loop = self.receive_queue.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._want_one()
        else:
            loop.call_soon_threadsafe(self._want_one)

    def _want_one(self) -> None:
        sub = self.topic_consumers[0]
        if not self._closed and not sub.zero_requested and not len(self.receive_queue):
            sub.ask_one()

    def got_one(self) -> None:
        """Zero queue: the message asked for was taken (any thread)."""
        self.topic_consumers[0].zero_requested = False

    def check_zero_queue_timeout(self, timeout_millis: object) -> None:
        """A zero-queue consumer cannot receive with a timeout: :class:`InvalidConfiguration`, as there."""
        if self.zero_queue and timeout_millis is not None:
            raise InvalidConfiguration("Can't use receive with a timeout if the queue size is 0", topic=self.topic())

    # -------------------------------------------------------- message listener

    def start_listener(self, listener: Callable[..., Any]) -> None:
        """Hand every message to ``listener(self, message)`` from now on, one at a time, on the event
        loop; a coroutine it returns is awaited before the next message (event-loop thread)."""
        self.message_listener = listener
        self._listener_task = asyncio.get_running_loop().create_task(self._run_listener(listener))

    async def _run_listener(self, listener: Callable[..., Any]) -> None:
        while not self._closed:
            await self._listener_resumed.wait()
            try:
                if self.zero_queue:
                    self._want_one()
                msg = await self.receive_queue.get(None)
                if self.zero_queue:
                    self.got_one()
                if self.conf.schema is not None:
                    await self.learn_writer_schema(msg)
            except AlreadyClosed:
                return
            except PulsarError as exc:  # a corrupt entry's error, at its place in the stream
                log.error("message listener of %s skipped: %s", self.topic(), exc)
                continue
            await self._listener_resumed.wait()  # paused while this one was awaited: hold it until resumed
            if self._closed:
                return
            self.handed_out(msg)
            try:
                result = listener(self, msg)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("message listener of %s raised", self.topic())

    def pause_message_listener(self) -> None:
        """Stop handing messages to the listener (they stay queued) until :meth:`resume_message_listener`."""
        self.check_listener()
        self._listener_resumed.clear()

    def resume_message_listener(self) -> None:
        """Hand messages to the listener again, those queued meanwhile first."""
        self.check_listener()
        self._listener_resumed.set()

    def check_listener(self) -> None:
        """Raise :class:`InvalidConfiguration` if the consumer has no message listener (as the official client)."""
        if self.message_listener is None:
            raise InvalidConfiguration("the consumer has no message listener", topic=self.topic())

    async def receive(self, timeout_millis: int | None = None) -> Message:
        """Next message; raises :class:`~txn.Timeout` after ``timeout_millis``."""
        check_type_or_none(NUMBER, timeout_millis, "timeout_millis")
        self.check_zero_queue_timeout(timeout_millis)
        self.check_receive()
        if self.zero_queue:
            self._want_one()
        msg = await self.receive_queue.get(None if timeout_millis is None else timeout_millis / 1000.0)
        if self.zero_queue:
            self.got_one()
        if self.conf.schema is not None:
            await self.learn_writer_schema(msg)
        if self.unacked is not None:
            self.unacked.add(msg)
        return msg

    async def batch_receive(self) -> list[Message]:
        """The messages received, as a list, once ``batch_receive_policy`` says the batch is complete:
        its message count or byte size is reached, or its timeout passed (then maybe an empty list)."""
        self.check_open()
        p = self.batch_policy
        msgs = await self.receive_queue.get_batch(p.max_num_message, p.max_num_bytes,
                                                  p.timeout_ms / 1000.0 if p.timeout_ms > 0 else None)
        for m in msgs:
            if self.conf.schema is not None:
                await self.learn_writer_schema(m)
            self.handed_out(m)
        return msgs

    async def learn_writer_schema(self, msg: Message) -> None:
        """Fetch (once) the definition ``msg`` was written with, so that ``value()`` decodes by it."""
        version = getattr(msg, "raw_schema_version", None)
        sub = msg.consumer
        schema = self.conf.schema
        if version is None or not isinstance(sub, TopicConsumer) or not schema.needs_writer(sub.topic, version):
            return
        wire = await sub.get_schema(version)
        if wire is not None:
            schema.add_writer(sub.topic, version, int(wire.type), wire.schema_data.decode())

    def _sub_for(self, message_or_id: Message | MessageId) -> tuple[TopicConsumer, MessageId]:
        if isinstance(message_or_id, Message):
            mid = message_or_id.message_id()
            sub = message_or_id.consumer
            if sub is not None and sub.parent is self:
                return sub, mid
        elif isinstance(message_or_id, MessageId):
            mid = message_or_id
        else:
            raise TypeError(f"expected a Message or MessageId, got {type(message_or_id).__name__}")
        subs = self.topic_consumers
        sub = self._by_topic.get(mid.topic) if mid.topic else (subs[0] if len(subs) == 1 else None)
        if sub is None:
            raise ValueError(f"message id {mid} does not belong to this consumer's topics")
        return sub, mid

    def acknowledge_nowait(self, message_or_id: Message | MessageId, cumulative: bool = False) -> None:
        """Non-transactional ack, queued and grouped; thread-safe."""
        self.check_open()
        if cumulative and self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                "cumulative acknowledgement is not allowed on Shared or Key_Shared subscriptions", topic=self.topic())
        if type(message_or_id) is ReceivedMessage:
            sub = message_or_id.consumer
            if sub is not None and sub.parent is self:
                sub.ack_local(message_or_id, cumulative)
                if self._dead_letters is not None:
                    self._dead_letters.forget(sub, message_or_id)
                return
        sub, mid = self._sub_for(message_or_id)
        sub.ack_local(mid, cumulative)
        if self._dead_letters is not None:
            self._dead_letters.forget(sub, mid)

    def acknowledge(self, message_or_id: Message | MessageId, txn: AsyncTransaction | None = None) -> Awaitable[None]:
        """Acknowledge one message; await the result. Inside ``txn`` it waits for the broker.

        Without a transaction the ack is queued and grouped, and the returned awaitable is
        already complete.
        """
        if txn is None:
            self.acknowledge_nowait(message_or_id)
            return self._done
        self.check_open()
        sub, mid = self._sub_for(message_or_id)
        return self._txn_ack(sub, [mid], txn, False)

    async def acknowledge_cumulative(
        self, message_or_id: Message | MessageId, txn: AsyncTransaction | None = None
    ) -> None:
        """Acknowledge everything up to and including this message (Exclusive/Failover only)."""
        self.check_open()
        if txn is None:
            self.acknowledge_nowait(message_or_id, cumulative=True)
            return
        if self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            raise CumulativeAcknowledgementNotAllowedError(
                "cumulative acknowledgement is not allowed on Shared or Key_Shared subscriptions", topic=self.topic())
        sub, mid = self._sub_for(message_or_id)
        await self._txn_ack(sub, [mid], txn, True)

    async def _txn_ack(self, sub: TopicConsumer, mids: list[MessageId], txn: AsyncTransaction,
                       cumulative: bool) -> None:
        fut = asyncio.ensure_future(sub.ack_txn(mids, txn, cumulative))
        txn.add_op(fut)
        txn.record_ack(sub, mids, cumulative)
        await fut

    async def acknowledge_many(self, messages: list[Message], txn: AsyncTransaction, *,
                               per_entry: bool = True) -> None:
        """Acknowledge ``messages`` inside ``txn``; the ACK commands are sent concurrently.

        With ``per_entry`` (the default) the messages of each partly acknowledged batch entry go in
        an ACK command of their own, and whole entries (unbatched messages, batch entries acked in
        full) of a topic/partition share one (chunked). Pulsar 4.0.8 replays its pending-ack log one
        command at a time and skips a command when one of its positions is already fully deleted,
        so a command that also carried a partial batch entry loses that entry's batch-index acks at
        a broker restart and its messages come again (tests/test_conformance_batch_ack_bug.py).
        ``per_entry=False`` sends one command per topic/partition (chunked), as before; the
        conformance test uses it to show the broker bug.
        """
        self.check_open()
        groups: dict[TopicConsumer, list[MessageId]] = {}
        seen: set[MessageId] = set()
        for m in messages:
            sub, mid = self._sub_for(m)
            if mid in seen:
                continue  # one transaction must never carry the same ack twice
            seen.add(mid)
            groups.setdefault(sub, []).append(mid)
        # Bounded commands: one ACK carrying ~100k batch-index ids would pass the broker's 5 MB
        # frame limit (the broker then resets the connection).
        n = TXN_ACK_CHUNK
        commands: list[tuple[TopicConsumer, list[MessageId]]] = []
        for sub, mids in groups.items():
            if per_entry:
                whole, entries = _split_by_entry(mids)
                commands.extend((sub, e) for e in entries)
            else:
                whole = mids
            commands.extend((sub, whole[i:i + n]) for i in range(0, len(whole), n))
        await asyncio.gather(*(self._txn_ack(sub, mids, txn, False) for sub, mids in commands))

    def negative_acknowledge(self, message_or_id: Message | MessageId) -> Done:
        """Redeliver this message after ``negative_ack_redelivery_delay_ms``.

        Takes effect at once; the result may be awaited, as ``pulsar.asyncio``'s coroutine is."""
        self.check_open()
        dead = self._dead_letters
        if dead is not None and isinstance(message_or_id, Message) and dead.wants(message_or_id):
            self._sub_for(message_or_id)
            dead.send(message_or_id)  # produced to the dead-letter topic, then acknowledged
            return DONE
        sub, mid = self._sub_for(message_or_id)
        sub.nack(mid)
        return DONE

    async def reconsume_later(self, message: Message, delay: timedelta | int,
                              properties: dict[str, str] | None = None) -> None:
        """Consume ``message`` again after ``delay`` (a ``timedelta`` or ms), as the Java client's
        ``reconsumeLater``: a copy goes to the retry-letter topic (delivered after the delay, with
        ``properties`` added), or to the dead-letter topic once reconsumed more than
        ``max_redeliver_count`` times; then ``message`` is acknowledged. Needs ``retry_enable=True``
        at subscribe (else :class:`~txn.InvalidConfiguration`)."""
        self.check_open()
        if self._retry_letters is None:
            raise no_retry(self.topic())
        if not isinstance(message, Message):
            raise ValueError(f"argument message must be of type Message, not {type(message).__name__}")
        ms = delay_ms(delay)
        check_type_or_none(dict, properties, "properties")
        if properties and not all(isinstance(k, str) and isinstance(v, str) for k, v in properties.items()):
            raise ValueError("properties must map str to str")
        self._sub_for(message)
        await self._retry_letters.reconsume_later(message, ms, properties)

    def redeliver_unacknowledged_messages(self) -> None:
        """Ask the broker to redeliver every unacknowledged message now."""
        self.check_open()
        for s in self.topic_consumers:
            s.redeliver(None)

    async def get_last_message_id(self) -> MessageId:
        """The id of the last message stored on the (single, non-partitioned) topic or partition."""
        self.check_open()
        if len(self.topic_consumers) != 1:
            raise ValueError("get_last_message_id is only supported on a non-partitioned topic or a single partition")
        return await self.topic_consumers[0].get_last_message_id()

    async def seek(self, messageid: MessageId | int) -> None:
        """Reset the subscription to a message id or a publish time (int, ms since the epoch).

        As in ``pulsar-client``, only on a single (non-partitioned) topic or one partition; messages
        received before the seek are dropped and never handed out."""
        self.check_open()
        target = seek_target(messageid)
        if len(self.topic_consumers) != 1:
            raise ValueError("seek is only supported on a non-partitioned topic or a single partition")
        await self.topic_consumers[0].seek(target, exclusive=not self.conf.start_message_id_inclusive)

    def is_connected(self) -> bool:
        """True when every topic/partition has a live subscription (False once closed)."""
        return not self._closed and all(s.ready.is_set() for s in self.topic_consumers)

    async def close(self) -> None:
        """Flush acks and close. Further calls raise :class:`AlreadyClosed`."""
        if self._closed:
            return
        if self._dead_letters is not None:
            await self._dead_letters.close()
        if self._retry_letters is not None:
            await self._retry_letters.close()
        self._closed = True
        self._stop_tasks()
        self.receive_queue.close()
        await asyncio.gather(*(s.close() for s in self.topic_consumers), return_exceptions=True)
        self.ctx.forget(self)

    async def unsubscribe(self) -> None:
        """Delete the subscription on the broker and close."""
        self.check_open()
        if self._dead_letters is not None:
            await self._dead_letters.close()
        if self._retry_letters is not None:
            await self._retry_letters.close()
        self._closed = True
        self._stop_tasks()
        self.receive_queue.close()
        await asyncio.gather(*(s.close(unsubscribe=True) for s in self.topic_consumers))
        self.ctx.forget(self)

    def _stop_tasks(self) -> None:
        current = asyncio.current_task()
        for task in (self._ticker, self._discoverer, self._listener_task, self._ack_timer):
            if task is not None and task is not current:  # a listener may close its own consumer
                task.cancel()


def seek_target(messageid: object) -> MessageId | int:
    """Check a seek argument: a :class:`MessageId` or a non-negative int timestamp (ms)."""
    if isinstance(messageid, MessageId):
        return messageid
    if isinstance(messageid, int) and not isinstance(messageid, bool):
        if messageid < 0:
            raise ValueError(f"seek timestamp must be >= 0, got {messageid}")
        return messageid
    raise ValueError(f"seek expects a MessageId or an int timestamp, got {type(messageid).__name__}")
