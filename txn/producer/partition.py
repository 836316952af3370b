""":class:`PartitionProducer`: the producer of one partition, assembled from the accumulator and the sender."""

from __future__ import annotations

import asyncio
from collections import deque

from ..connection import Connection
from ..context import ClientContext
from ..errors import PulsarError
from .accumulator import Accumulator, _Batch, _Op
from .config import ProducerConfig
from .sender import Sender


class PartitionProducer(Accumulator, Sender):
    """Producer for one (non-partitioned topic or) partition; :class:`AsyncProducer` routes to it.

    Package-internal, public for the facades and tests: ``window`` (its share of the pending
    window), ``queued`` (messages in the open batch plus those awaiting receipts), ``ready``
    (created on a live connection) and ``conn`` (that connection, or None).
    """

    def __init__(self, ctx: ClientContext, topic: str, partition: int, conf: ProducerConfig, window: int) -> None:
        self._ctx = ctx
        self.topic = topic
        self.partition = partition
        self.conf = conf
        self.producer_id = ctx.next_id()
        self.producer_name = conf.producer_name or ""
        self._user_named = conf.producer_name is not None
        self.window = window
        self.queued = 0  # messages in batch + pending ops
        self._pending: deque[_Op] = deque()
        self._batch: _Batch | None = None
        self._batch_timer: asyncio.TimerHandle | None = None
        self._seq = -1
        self.conn: Connection | None = None
        self.ready = False
        self._closed = False
        self._fatal: PulsarError | None = None
        self._space_waiters: deque[asyncio.Future[None]] = deque()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._creating = False  # a create request is under way (see Sender._create)
        self._timeout_task: asyncio.Task[None] | None = None
        self._epoch = 0
        self.reconnects = 0  # re-creations after the first: a resend may have happened
        self._topic_epoch: int | None = None
        self.schema_version: bytes | None = None  # from PRODUCER_SUCCESS when a schema is set
        self.max_message_size = 5 * 1024 * 1024
        self.last_sequence_id_published = -1
