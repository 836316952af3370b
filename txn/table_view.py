"""``TableView``: the latest value of each key of a topic, kept up to date (``create_table_view``).

As the official client's table view: the topic's compacted view is read from the earliest message
to its end before the view is handed out, then a background task keeps reading. A message with a
key sets that key's value; one with an empty payload (a tombstone, ``send(None)``) removes the key;
a message without a key is skipped. Values are kept as received and decoded with the view's schema
when asked for. A partitioned topic is read with one reader per partition, all on one subscription
name (the given one, or ``reader-<10 random hex digits>``).

:class:`AsyncTableView` lives on the event loop (:meth:`txn.AsyncClient.create_table_view`);
:class:`TableView` wraps it for the blocking :class:`txn.Client`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any

from .bridge import LoopThread
from .consumer import AsyncConsumer, ConsumerConfig, ConsumerType, InitialPosition
from .context import ClientContext
from .errors import AlreadyClosed, ConsumerNotInitialized, PulsarError
from .message import EARLIEST, Message
from .reader import AsyncReader
from .schema import BytesSchema, Schema
from .topic import parse_topic

log = logging.getLogger("txn.table_view")

Listener = Callable[[str, Any], Any]


class AsyncTableView:
    """A topic's latest value per key (asyncio API); build it with :meth:`txn.AsyncClient.create_table_view`.

    ``get``, ``for_each``, ``for_each_and_listen`` and ``len()`` need no broker round trip and are
    plain methods; call them on the client's event loop. Listeners run there too, one update at a
    time, and must not block."""

    def __init__(self, ctx: ClientContext, topic: str, subscription_name: str | None, schema: Schema,
                 readers: list[AsyncReader]) -> None:
        self._ctx = ctx
        self._topic = topic
        self._subscription = subscription_name
        self._schema = schema
        self._readers = readers
        self._data: dict[str, Message] = {}
        self._listeners: list[Listener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._on_client_close = _Stopper(self)

    async def start(self) -> None:
        """Read every partition to its end, then keep reading in the background (called once, on creation)."""
        await asyncio.gather(*(self._replay(r) for r in self._readers))
        self._tasks = [asyncio.create_task(self._tail(r), name=f"table-view {r.topic()}") for r in self._readers]
        self._ctx.register(self._on_client_close)

    async def _replay(self, reader: AsyncReader) -> None:
        while await reader.has_message_available():
            self._apply(await reader.read_next())

    async def _tail(self, reader: AsyncReader) -> None:
        while True:
            try:
                msg = await reader.read_next()
            except AlreadyClosed:
                return
            except PulsarError as exc:  # an entry that could not be read, at its place in the stream
                log.warning("table view of %s skipped a message: %s", reader.topic(), exc)
                continue
            self._apply(msg)

    def _apply(self, msg: Message) -> None:
        if not msg.has_partition_key():
            return
        key = msg.partition_key()
        if len(msg.data()):
            self._data[key] = msg
        else:
            self._data.pop(key, None)
        if not self._listeners:
            return
        try:
            value = self.decode(msg)
        except Exception:  # as there: a value the schema cannot decode (a tombstone's b"" as JSON) is logged
            log.exception("table view of %s could not decode the value of key %r", self._topic, key)
            return
        for listener in list(self._listeners):
            try:
                listener(key, value)
            except Exception:
                log.exception("table view listener of %s raised", self._topic)

    def get(self, key: str) -> Any | None:
        """The value of ``key``, decoded with the view's schema, or None if the view has no such key."""
        msg = self._data.get(key)
        return None if msg is None else self.decode(msg)

    def decode(self, msg: Message) -> Any:
        """``msg``'s value with the view's schema (a tombstone's: the schema's decoding of ``b""``)."""
        return msg.value() if len(msg.data()) else self._schema.decode(b"")

    def snapshot(self) -> dict[str, Message]:
        """A copy of the view: each key's last message (what :meth:`get` decodes)."""
        return self._data.copy()

    def listen(self, callback: Listener) -> None:
        """Call ``callback(key, value)`` for every later update (a removed key's value is the schema's
        decoding of ``b""``), without the current entries (see :meth:`for_each_and_listen`)."""
        self._listeners.append(callback)

    def for_each(self, callback: Listener) -> None:
        """Call ``callback(key, value)`` for each entry."""
        for key, msg in self.snapshot().items():
            callback(key, self.decode(msg))

    def for_each_and_listen(self, callback: Listener) -> None:
        """:meth:`for_each`, then call ``callback`` for every later update too (a removal included)."""
        self.for_each(callback)
        self.listen(callback)

    async def close(self) -> None:
        """Stop reading and close the readers; the entries stay readable. A second call raises
        :class:`~txn.ConsumerNotInitialized` (as the official client)."""
        self.mark_closed()
        self._ctx.forget(self._on_client_close)
        await self.stop()

    def mark_closed(self) -> None:
        """Mark the view closed, raising :class:`~txn.ConsumerNotInitialized` if it already was (what
        :meth:`close` does first; alone, once the client is closed and so the view stopped)."""
        if self._closed:
            raise ConsumerNotInitialized("table view is closed", topic=self._topic)
        self._closed = True

    async def stop(self) -> None:
        """Stop reading and close the readers, as closing the client does (then :meth:`close`
        still succeeds once, as there)."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *(r.close() for r in self._readers), return_exceptions=True)

    def __len__(self) -> int:
        return len(self._data)

    def __str__(self) -> str:
        if self._subscription is None:
            return f"TableView(topic={self._topic})"
        return f"TableView(topic={self._topic}, subscription={self._subscription})"

    __repr__ = __str__


class _Stopper:
    """What the client closes for a table view (``ClientContext.register``): it stops the view."""

    def __init__(self, view: AsyncTableView) -> None:
        self._view = view

    async def close(self) -> None:
        await self._view.stop()


async def _open_reader(ctx: ClientContext, topic: str, subscription: str, schema: Schema | None) -> AsyncReader:
    conf = ConsumerConfig(
        subscription_name=subscription,
        read_compacted=True,
        consumer_type=ConsumerType.Exclusive,
        initial_position=InitialPosition.Earliest,
        durable=False,
        start_message_id=EARLIEST,
        schema=schema,
    )
    c = AsyncConsumer(ctx, [topic], conf)
    await c.start()
    ctx.register(c)
    return AsyncReader(c, EARLIEST, False)


async def create_table_view(ctx: ClientContext, topic: str, subscription_name: str | None,
                            schema: Schema) -> AsyncTableView:
    """Open a table view on ``topic`` (arguments checked by the caller) once it has read the topic to its end.

    ``ctx`` is the context of the client that opens it (:meth:`txn.AsyncClient.create_table_view`)."""
    name = str(parse_topic(topic))
    n = await ctx.pool.partitions(name)
    parts = [name] if n == 0 else [f"{name}-partition-{i}" for i in range(n)]
    subscription = subscription_name or f"reader-{secrets.token_hex(5)}"
    wire_schema = None if isinstance(schema, BytesSchema) else schema
    opened = await asyncio.gather(*(_open_reader(ctx, p, subscription, wire_schema) for p in parts),
                                  return_exceptions=True)
    readers = [r for r in opened if isinstance(r, AsyncReader)]
    failed = [e for e in opened if isinstance(e, BaseException)]
    view = AsyncTableView(ctx, topic, subscription_name, schema, readers)
    try:
        if failed:
            raise failed[0]
        await view.start()
    except BaseException:
        await asyncio.gather(*(r.close() for r in readers), return_exceptions=True)
        raise
    return view


class _Gate:
    """A listener that holds back the updates that arrive while the caller's thread still replays
    the entries (blocking :meth:`TableView.for_each_and_listen`), so ``callback`` sees every change
    once and in order."""

    def __init__(self, callback: Listener) -> None:
        self._callback = callback
        self._lock = threading.Lock()
        self._held: list[tuple[str, Any]] = []
        self._open = False

    def __call__(self, key: str, value: Any) -> None:  # on the event loop
        with self._lock:
            if not self._open:
                self._held.append((key, value))
                return
        self._callback(key, value)

    def open(self) -> None:
        """Hand over what was held back (on the caller's thread), then let updates straight through."""
        while True:
            with self._lock:
                held, self._held = self._held, []
                if not held:
                    self._open = True
                    return
            for key, value in held:
                self._callback(key, value)


class TableView:
    """A topic's latest value per key (blocking API); see :class:`AsyncTableView`.

    ``get``, ``for_each`` and ``len()`` read the view in the caller's thread; listeners of
    :meth:`for_each_and_listen` get later updates on the client's event loop thread, where a
    blocking ``txn`` call raises :class:`~txn.bridge.BlockingCallInEventLoop`."""

    def __init__(self, inner: AsyncTableView, lt: LoopThread) -> None:
        self._inner = inner
        self._lt = lt

    @property
    def async_table_view(self) -> AsyncTableView:
        """The asyncio table view this one wraps."""
        return self._inner

    def get(self, key: str) -> Any | None:
        """The value of ``key``, or None."""
        return self._inner.get(key)

    def for_each(self, callback: Listener) -> None:
        """Call ``callback(key, value)`` for each entry, in this thread."""
        self._inner.for_each(callback)

    def for_each_and_listen(self, callback: Listener) -> None:
        """Call ``callback(key, value)`` for each entry (in this thread, before returning), then for
        every later update (on the client's thread), a removed key included."""
        gate = _Gate(callback)

        async def snapshot_and_listen() -> dict[str, Message]:
            snap = self._inner.snapshot()
            self._inner.listen(gate)
            return snap

        for key, msg in self._lt.run(snapshot_and_listen()).items():
            callback(key, self._inner.decode(msg))
        gate.open()

    def close(self) -> None:
        """Stop reading; a second call raises :class:`~txn.ConsumerNotInitialized`."""
        if not self._lt.loop.is_running():  # the client is closed, which stopped the view
            self._inner.mark_closed()
            return
        self._lt.run(self._inner.close())

    def __len__(self) -> int:
        return len(self._inner)

    def __str__(self) -> str:
        return str(self._inner)

    __repr__ = __str__


__all__ = ["AsyncTableView", "TableView", "create_table_view"]
