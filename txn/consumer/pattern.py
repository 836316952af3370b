""":class:`AsyncPatternConsumer`: a consumer of every topic of a namespace whose name matches a regex,
as the official client's ``subscribe(re.compile(...), ...)``, re-listing the namespace every
``pattern_auto_discovery_period`` seconds to subscribe to new matching topics and drop deleted ones.

Matching is the official client's: the pattern loses any ``persistent://`` / ``non-persistent://``
prefix (the :class:`~.config.RegexSubscriptionMode` picks the domains), its namespace is that of the
pattern read as a topic name (``public/default`` for a bare one), and it must match the whole
``tenant/namespace/topic`` name of a topic (partitions count as their partitioned topic).
"""

from __future__ import annotations

import asyncio
import logging
import re

from ..connection import T, check_error, command, next_request_id
from ..context import ClientContext
from ..errors import InvalidTopicName, OperationNotSupported
from ..message import MessageId
from ..protocol import pulsar_wire_pb2 as pb
from ..topic import PARTITION_SUFFIX
from .async_consumer import AsyncConsumer
from .config import ConsumerConfig, RegexSubscriptionMode

log = logging.getLogger("txn.consumer")

_MODES = {
    RegexSubscriptionMode.PersistentOnly: pb.CommandGetTopicsOfNamespace.PERSISTENT,
    RegexSubscriptionMode.NonPersistentOnly: pb.CommandGetTopicsOfNamespace.NON_PERSISTENT,
    RegexSubscriptionMode.AllTopics: pb.CommandGetTopicsOfNamespace.ALL,
}


def split_pattern(pattern: str) -> tuple[str, str, str]:
    """``(topic, namespace, regex)`` of a topics pattern: ``topic`` is what ``consumer.topic()``
    returns (the pattern as a full topic name), ``regex`` the pattern without its domain."""
    domain, sep, rest = pattern.partition("://")
    if not sep:
        domain, rest = "persistent", pattern
    elif domain not in ("persistent", "non-persistent"):
        raise InvalidTopicName(f"invalid topic domain {domain!r} in pattern {pattern!r}", topic=pattern)
    parts = rest.split("/")
    if len(parts) == 1 and rest:
        return f"{domain}://public/default/{rest}", "public/default", rest
    if len(parts) != 3 or not all(parts):
        raise InvalidTopicName(f"invalid topics pattern {pattern!r}: expected [domain://]tenant/namespace/regex "
                               "or a bare regex", topic=pattern)
    return f"{domain}://{rest}", f"{parts[0]}/{parts[1]}", rest


class AsyncPatternConsumer(AsyncConsumer):
    """An :class:`AsyncConsumer` over the topics matching a regex, kept up to date."""

    def __init__(self, ctx: ClientContext, pattern: str, mode: RegexSubscriptionMode, period_s: float,
                 conf: ConsumerConfig) -> None:
        super().__init__(ctx, [], conf)
        self._pattern_topic, self.namespace, regex = split_pattern(pattern)
        self.regex = re.compile(regex)
        self.mode = RegexSubscriptionMode(mode)
        self.period_s = period_s
        self._watcher: asyncio.Task[None] | None = None

    def topic(self) -> str:
        """The pattern as a topic name (``persistent://tenant/ns/<regex>``), as the official client."""
        return self._pattern_topic

    async def list_matching(self) -> list[str]:
        """The topics of the namespace (partitioned ones once, not their partitions) that match."""

        async def once() -> list[str]:
            conn = await self.ctx.pool.get()
            rid = next_request_id()
            resp = await conn.request(command(T.GET_TOPICS_OF_NAMESPACE, request_id=rid, namespace=self.namespace,
                                              mode=_MODES[self.mode]), rid)
            check_error(resp, f"listing the topics of {self.namespace}", topic=self._pattern_topic)
            return list(resp.getTopicsOfNamespaceResponse.topics)

        names = await self.ctx.pool.retrying(f"topics of {self.namespace}", once, topic=self._pattern_topic)
        found: dict[str, None] = {}
        for name in names:
            head, sep, tail = name.rpartition(PARTITION_SUFFIX)
            base = head if sep and head and tail.isdigit() else name
            if self.regex.fullmatch(base.partition("://")[2]):
                found[base] = None
        return list(found)

    async def start(self) -> None:
        """Subscribe to the matching topics (maybe none yet), then watch the namespace."""
        self._topics = await self.list_matching()
        await super().start()
        if self.period_s > 0:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.period_s)
            try:
                await self.recheck()
            except Exception as exc:  # listed again next period
                log.warning("topic discovery for %s failed: %s", self._pattern_topic, exc)

    async def recheck(self) -> None:
        """List the namespace once: subscribe to new matching topics, close the consumers of gone ones."""
        matching = await self.list_matching()
        if self.closed:
            return
        current = set(self._topics)
        gone = [t for t in self._topics if t not in set(matching)]
        new = [t for t in matching if t not in current]
        if gone:
            log.info("%s: topics gone: %s", self._pattern_topic, gone)
            await self.remove_topics(gone)
        if new:
            added = await self.add_topics(new)
            log.info("%s: subscribed to new topics %s", self._pattern_topic, added)

    async def get_last_message_id(self) -> MessageId:
        """Not on a pattern consumer: :class:`~txn.OperationNotSupported`, as the official client."""
        self.check_open()
        raise OperationNotSupported("get_last_message_id is not supported on a pattern consumer",
                                    topic=self._pattern_topic)

    def _stop_tasks(self) -> None:
        super()._stop_tasks()
        if self._watcher is not None and self._watcher is not asyncio.current_task():
            self._watcher.cancel()
