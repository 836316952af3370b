"""``ConsumerParent``: what a topic consumer uses of the :class:`~.async_consumer.AsyncConsumer` holding it.

A Protocol, so that the parts of a topic consumer (:mod:`.flow`, :mod:`.acks`,
:mod:`.topic_consumer`) never import the face that assembles them.
"""

from __future__ import annotations

from typing import Protocol

from ..context import ClientContext
from ..receive_queue import ReceiveQueue
from .ack_timeout import UnackedTracker
from .config import ConsumerConfig


class ConsumerParent(Protocol):
    """The consumer's context, settings, shared receive queue, subscription counter and ack-timeout
    tracker (None without ``unacked_messages_timeout_ms``)."""

    ctx: ClientContext
    conf: ConsumerConfig
    receive_queue: ReceiveQueue
    subscriptions_made: int
    unacked: UnackedTracker | None
