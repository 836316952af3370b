"""Publisher confirms: a bounded window, a confirm or a typed nack per message, an optional durable outbox.

:class:`AsyncReliableProducer` (asyncio) and :class:`ReliableProducer` (blocking, run on the
client's loop thread) wrap a ``txn`` producer:

- **Window.** At most ``window`` messages are unconfirmed at any time; ``send_async`` awaits
  (blocks, in the sync facade) for room. Memory stays bounded whatever the broker does.
- **Confirms.** Every accepted message gets a future (and, if given, a callback) that resolves
  to its :class:`~txn.MessageId` once the broker stored it, or fails with :class:`MessageNacked`
  (topic, sequence id, the broker's error) when the broker rejected it. Sends never time out:
  across reconnects the pending messages are re-sent with the same sequence ids.
- **Outbox** (``outbox_path=``, requires a fixed ``producer_name``). ``send_async`` returns only
  once the message is fsynced in a SQLite file (:mod:`.outbox`) under its sequence id; the row
  is deleted on confirm. After a crash, the next start re-sends the rows left over, in order,
  with their ids, before anything new. **Requires broker deduplication on the namespace**
  (``pulsar-admin namespaces set-deduplication --enable``): the broker remembers the highest
  sequence id stored per producer name and reports it when the producer connects; rows at or
  below it are already stored and are dropped without re-sending (the broker's own duplicate
  rule), the rest are re-sent. Without deduplication the outbox is only at-least-once. Resume
  within the broker's ``brokerDeduplicationProducerInactivityTimeoutMinutes`` (default 6 h),
  after which the broker forgets an idle producer name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import urllib.parse
import warnings
from collections import deque
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ..admin import admin_request
from ..backoff import Backoff
from ..errors import AlreadyClosed, ProducerBusy, PulsarError
from ..message import MessageId
from ..topic import parse_topic
from .outbox import Outbox, OutboxRow

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..producer import AsyncProducer
    from ..sync import Client

log = logging.getLogger("txn.delivery.reliable_producer")
R = TypeVar("R")

#: ``callback(message_id, error)``: exactly one of them is ``None``. Runs on the client's loop thread.
Callback = Callable[[MessageId | None, PulsarError | None], Any]

_PASSED_OPTIONS = frozenset({
    "compression_type", "batching_enabled", "batching_max_messages", "batching_max_allowed_size_in_bytes",
    "batching_max_publish_delay_ms", "properties", "access_mode",
})


class MessageNacked(PulsarError):
    """The broker rejected an accepted message, or the producer failed for good before a confirm.

    ``topic``, ``sequence_id``, ``server_error`` (the broker's code, e.g. ``TopicTerminatedError``)
    say which message and why; ``__cause__`` is the underlying typed error.
    """

    def __init__(self, topic: str, sequence_id: int, cause: BaseException) -> None:
        self.sequence_id = sequence_id
        text = cause.message if isinstance(cause, PulsarError) else repr(cause)
        super().__init__(f"message seq={sequence_id} rejected: {text}", topic=topic,
                         server_error=getattr(cause, "server_error", None))
        if isinstance(cause, PulsarError):
            self.result = cause.result
        self.__cause__ = cause


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class AsyncReliableProducer:
    """A producer with publisher confirms on ``topic``; see the module docstring.

    ``producer_options`` pass through to :meth:`AsyncClient.create_producer` (compression, batching,
    ``properties``, ``access_mode``); the send timeout (none), window and queue policy are set here.
    ``admin_url`` lets :meth:`start` check that the broker deduplicates the topic (it warns if not,
    or raises ``ValueError`` with ``require_dedup=True``). Use ``async with`` or :meth:`start` /
    :meth:`close`.
    """

    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        *,
        window: int = 1000,
        outbox_path: str | os.PathLike[str] | None = None,
        producer_name: str | None = None,
        admin_url: str | None = None,
        require_dedup: bool = False,
        **producer_options: Any,
    ) -> None:
        if window <= 0:
            raise ValueError("window must be positive")
        if outbox_path is not None and not producer_name:
            raise ValueError("an outbox needs a fixed producer_name: the broker deduplicates re-sent rows "
                             "by producer name and sequence id")
        unknown = set(producer_options) - _PASSED_OPTIONS
        if unknown:
            raise TypeError(f"unsupported producer options {sorted(unknown)}; allowed: {sorted(_PASSED_OPTIONS)}")
        self._client = client
        self._topic = str(parse_topic(topic))
        self.window = window
        self._outbox_path = outbox_path
        self._name = producer_name
        self._admin_url = admin_url
        self._require_dedup = require_dedup
        self._options = producer_options
        self._core: AsyncProducer | None = None
        self._outbox: Outbox | None = None
        self._exec: ThreadPoolExecutor | None = None
        self._next_seq = 0
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._unconfirmed: dict[int, asyncio.Future[MessageId]] = {}
        self._to_store: list[tuple[OutboxRow, str | None, asyncio.Future[None], Callback | None,
                                   asyncio.Future[MessageId]]] = []
        self._confirmed: list[int] = []
        self._nacked: list[tuple[int, str]] = []
        self._barriers: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._stop_writer = False
        self._closed = False
        self._checkpoint: str | None = None
        #: Set by :meth:`start` from the outbox: rows found, how many the broker already had, how many re-sent.
        self.recovery: dict[str, int] = {"rows": 0, "already_stored": 0, "resent": 0}
        #: The broker's effective deduplication setting for the topic (``None`` if not checked).
        self.dedup_enabled: bool | None = None

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> AsyncReliableProducer:
        """Open the outbox, create the producer, re-send leftover rows; returns ``self``."""
        loop = asyncio.get_running_loop()
        try:
            parts = len(await self._client.get_topic_partitions(self._topic))
            rows: list[OutboxRow] = []
            stored_last = -1
            if self._outbox_path is not None:
                if parts > 1:
                    raise ValueError("an outbox needs a non-partitioned topic: a re-sent row could be routed to "
                                     "another partition, whose deduplication would not know it")
                self._exec = ThreadPoolExecutor(1, thread_name_prefix="txn-outbox")
                self._outbox = await self._run(Outbox, self._outbox_path, self._topic, self._name)
                stored_last = await self._run(self._outbox.last_seq)
                rows = await self._run(self._outbox.pending)
                self._checkpoint = await self._run(self._outbox.checkpoint)
            self._core = await self._create_core(self.window + len(rows), parts)
            self.dedup_enabled = await self._check_dedup()
            broker_last = self._core.last_sequence_id()
            self._next_seq = max(stored_last, broker_last) + 1
            if rows:
                done = [r.seq for r in rows if r.seq <= broker_last]
                resend = [r for r in rows if r.seq > broker_last]
                if done:
                    await self._run(self._outbox.write, (), done)
                self.recovery = {"rows": len(rows), "already_stored": len(done), "resent": len(resend)}
                log.info("outbox %s: %d rows left over, %d already stored by the broker, re-sending %d",
                         self._outbox_path, len(rows), len(done), len(resend))
                self._in_flight = len(resend)
                for r in resend:
                    fut: asyncio.Future[MessageId] = loop.create_future()
                    fut.add_done_callback(self._log_recovered)
                    self._dispatch(r, None, fut)
            if self._outbox is not None:
                self._writer = loop.create_task(self._write_loop())
            self._client.context.register(self)  # client.close() closes us
        except BaseException:
            await self._teardown()
            raise
        return self

    async def _create_core(self, cap: int, parts: int) -> AsyncProducer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                return await self._client.create_producer(
                    self._topic, producer_name=self._name, send_timeout_millis=0, block_if_queue_full=True,
                    max_pending_messages=cap, max_pending_messages_across_partitions=cap * max(parts, 1),
                    **self._options,
                )
            except ProducerBusy:
                # A crashed predecessor with the same name may not be gone from the broker yet.
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(backoff.next())

    async def _check_dedup(self) -> bool | None:
        if self._admin_url is None:
            if self._outbox is not None:
                log.warning("outbox on %s: pass admin_url to check that broker deduplication is on; "
                            "without it re-sent rows can be duplicated", self._topic)
            return None
        t = parse_topic(self._topic)
        path = (f"/admin/v2/{t.domain}/{t.tenant}/{t.namespace}/{urllib.parse.quote(t.local, safe='')}"
                "/deduplicationEnabled?applied=true")
        try:
            status, body = await asyncio.get_running_loop().run_in_executor(
                None, admin_request, "GET", self._admin_url, path)
        except OSError as exc:
            log.warning("cannot check deduplication of %s: %s", self._topic, exc)
            return None
        if status != 200 or not isinstance(body, bool):
            log.warning("cannot check deduplication of %s: HTTP %s %r", self._topic, status, body)
            return None
        if not body:
            msg = (f"broker deduplication is off for {self._topic}: messages re-sent after a reconnect or "
                   f"from the outbox may be stored twice (enable it on namespace {t.tenant}/{t.namespace})")
            if self._require_dedup:
                raise ValueError(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return body

    async def close(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` s (``None``: no limit) for the pending confirms, then close.

        Messages still unconfirmed fail with :class:`~txn.AlreadyClosed`; with an outbox their rows
        stay stored and are re-sent by the next start.
        """
        if self._closed:
            return
        self._closed = True
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_exception(AlreadyClosed("reliable producer closed", topic=self._topic))
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            log.warning("closing %s with %d messages unconfirmed", self._topic, len(self._unconfirmed))
        await self._teardown()

    async def _teardown(self) -> None:
        self._closed = True
        self._client.context.forget(self)
        if self._core is not None:
            await self._core.close()
        if self._writer is not None:
            self._stop_writer = True
            self._wake.set()
            await self._writer
        if self._outbox is not None:
            await self._run(self._outbox.close)
            self._outbox = None
        if self._exec is not None:
            self._exec.shutdown(wait=False)

    def abandon(self) -> None:
        """Release the outbox file when the client's loop is already gone (no async close possible)."""
        self._closed = True
        if self._outbox is not None:
            self._outbox.close()
            self._outbox = None
        if self._exec is not None:
            self._exec.shutdown(wait=False)

    async def __aenter__(self) -> AsyncReliableProducer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -------------------------------------------------------------------- sending

    async def send_async(
        self,
        content: bytes,
        callback: Callback | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        checkpoint: str | None = None,
    ) -> asyncio.Future[MessageId]:
        """Accept a message; returns its confirm future (a :class:`~txn.MessageId`, or :class:`MessageNacked`).

        Awaits room in the window and, with an outbox, the fsync of its row. ``checkpoint`` (outbox
        only) is an application string stored atomically with the row; :meth:`checkpoint` reads it
        back, also after a crash. Raises at once, storing nothing, on a closed producer, bad content
        or properties, or :class:`~txn.MessageTooBig`.
        """
        data = self.check_content(content, properties)
        if checkpoint is not None and self._outbox is None:
            raise ValueError("checkpoint needs an outbox")
        await self._acquire()
        if self._closed:
            self._release(1)
            raise AlreadyClosed("reliable producer is closed", topic=self._topic)
        row, fut = self._new_message(data, callback, properties, partition_key, event_timestamp)
        if self._outbox is None:
            self._dispatch(row, callback, fut)
            return fut
        stored: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._to_store.append((row, checkpoint, stored, callback, fut))
        self._wake.set()
        await asyncio.shield(stored)
        return fut

    def send_nowait(
        self,
        data: bytes,
        callback: Callback | None,
        properties: dict[str, str] | None,
        partition_key: str | None,
        event_timestamp: int | None,
    ) -> asyncio.Future[MessageId]:
        """``send_async`` without awaiting, for the sync facade's fast path (no outbox; it bounds the window)."""
        if self._closed:
            raise AlreadyClosed("reliable producer is closed", topic=self._topic)
        if self._outbox is not None or self._in_flight >= self.window or self._waiters:
            raise PulsarError("internal error: no room for a non-waiting send", topic=self._topic)
        self._in_flight += 1
        row, fut = self._new_message(data, callback, properties, partition_key, event_timestamp)
        self._dispatch(row, callback, fut)
        return fut

    def _new_message(
        self,
        data: bytes,
        callback: Callback | None,
        properties: dict[str, str] | None,
        partition_key: str | None,
        event_timestamp: int | None,
    ) -> tuple[OutboxRow, asyncio.Future[MessageId]]:
        seq = self._next_seq
        self._next_seq += 1
        row = OutboxRow(seq, data, dict(properties) if properties else None, partition_key, event_timestamp)
        fut: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        if callback is not None:
            fut.add_done_callback(_retrieve)  # failures go to the callback
        return row, fut

    async def send(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        checkpoint: str | None = None,
    ) -> MessageId:
        """Send and wait for the confirm; raises :class:`MessageNacked` if the broker rejects it."""
        fut = await self.send_async(content, None, properties, partition_key, event_timestamp, checkpoint)
        self._core.flush_now()  # type: ignore[union-attr]
        return await fut

    async def flush(self) -> None:
        """Wait until every message accepted so far is confirmed or nacked (and recorded in the outbox)."""
        storing = [s for _, _, s, _, _ in self._to_store]
        if storing:
            await asyncio.gather(*storing, return_exceptions=True)
        futs = list(self._unconfirmed.values())
        if self._core is not None:
            self._core.flush_now()
        if futs:
            await asyncio.gather(*futs, return_exceptions=True)
        if self._writer is not None and not self._writer.done():
            barrier: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._barriers.append(barrier)
            self._wake.set()
            await barrier

    # ------------------------------------------------------------------ accessors

    def topic(self) -> str:
        """The topic."""
        return self._topic

    def producer_name(self) -> str:
        """The producer name (given, or assigned by the broker)."""
        return self._core.producer_name() if self._core is not None else (self._name or "")

    @property
    def closed(self) -> bool:
        """True once closing started."""
        return self._closed

    @property
    def outbox(self) -> Outbox | None:
        """The durable outbox (None without ``outbox_path``, and after close)."""
        return self._outbox

    @property
    def core(self) -> AsyncProducer | None:
        """The underlying :class:`~txn.producer.AsyncProducer` (None before :meth:`start`)."""
        return self._core

    @property
    def in_flight(self) -> int:
        """Accepted messages not yet confirmed or nacked (never more than ``window`` once recovery is done)."""
        return self._in_flight

    @property
    def next_sequence_id(self) -> int:
        """The sequence id the next accepted message gets."""
        return self._next_seq

    def checkpoint(self) -> str | None:
        """The last ``checkpoint`` stored in the outbox (survives restarts)."""
        return self._checkpoint

    # ------------------------------------------------------------------ internals

    async def _run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    def check_content(self, content: Any, properties: dict[str, str] | None) -> bytes:
        """``content`` as bytes, checked (type, properties, size); raises if closed or not started."""
        if self._closed:
            raise AlreadyClosed("reliable producer is closed", topic=self._topic)
        if self._core is None:
            raise RuntimeError("start() the reliable producer first")
        if not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError(f"content must be bytes, not {type(content).__name__}")
        data = bytes(content)
        for k, v in (properties or {}).items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"message properties must be str -> str, got {k!r}: {v!r}")
        self._core.check_size(data)
        return data

    async def _acquire(self) -> None:
        if self._in_flight < self.window and not self._waiters:
            self._in_flight += 1
            return
        w: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(w)
        try:
            await w  # on success the slot was handed over by _release
        except asyncio.CancelledError:
            if w.done() and not w.cancelled() and w.exception() is None:
                self._release(1)
            elif w in self._waiters:
                self._waiters.remove(w)
            raise

    def _release(self, n: int) -> None:
        self._in_flight -= n
        while self._waiters and self._in_flight < self.window:
            w = self._waiters.popleft()
            if not w.done():
                self._in_flight += 1
                w.set_result(None)

    def _dispatch(self, row: OutboxRow, callback: Callback | None, fut: asyncio.Future[MessageId]) -> None:
        """Hand one message to the core producer (in sequence order) and wire its receipt."""
        self._unconfirmed[row.seq] = fut
        assert self._core is not None
        try:
            core_fut = self._core.send_nowait(row.payload, row.properties, row.partition_key, row.event_timestamp,
                                              row.seq)
            if core_fut is None:
                raise PulsarError("internal error: core producer window full", topic=self._topic)
        except Exception as exc:  # closed/failed producer: nack (or AlreadyClosed) at once
            self._settle(row.seq, fut, callback, None, exc)
            return
        core_fut.add_done_callback(partial(self._on_receipt, row.seq, fut, callback))

    def _on_receipt(self, seq: int, fut: asyncio.Future[MessageId], callback: Callback | None,
                    core_fut: asyncio.Future[MessageId]) -> None:
        if core_fut.cancelled():
            self._settle(seq, fut, callback, None, AlreadyClosed("send cancelled", topic=self._topic))
        elif (exc := core_fut.exception()) is not None:
            self._settle(seq, fut, callback, None, exc)
        else:
            self._settle(seq, fut, callback, core_fut.result(), None)

    def _settle(self, seq: int, fut: asyncio.Future[MessageId], callback: Callback | None,
                mid: MessageId | None, exc: BaseException | None) -> None:
        """Record a confirm or failure. AlreadyClosed (we stopped first) is not a nack: the row stays."""
        self._unconfirmed.pop(seq, None)
        err: PulsarError | None = None
        if exc is not None:
            err = exc if isinstance(exc, AlreadyClosed) else MessageNacked(self._topic, seq, exc)
        if self._outbox is None or self._stop_writer:
            self._release(1)
        elif err is None:
            self._confirmed.append(seq)  # slot released once the delete is committed
            self._wake.set()
        elif isinstance(err, MessageNacked):
            self._nacked.append((seq, str(err)))
            self._wake.set()
        else:
            self._release(1)
        if not fut.done():
            if err is None:
                fut.set_result(mid)  # type: ignore[arg-type]
            else:
                fut.set_exception(err)
        if callback is not None:
            try:
                callback(mid, err)
            except Exception:
                log.exception("confirm callback raised")

    def _log_recovered(self, fut: asyncio.Future[MessageId]) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), MessageNacked):
            log.error("re-sent outbox row nacked: %s", fut.exception())

    async def _write_loop(self) -> None:
        """The outbox's single writer: group-commits new rows, deletes and nacks, then sends new rows in order."""
        assert self._outbox is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._to_store = self._to_store, []
            confirmed, self._confirmed = self._confirmed, []
            nacked, self._nacked = self._nacked, []
            barriers, self._barriers = self._barriers, []
            if batch or confirmed or nacked:
                ckpt = next((c for _, c, _, _, _ in reversed(batch) if c is not None), None)
                try:
                    await self._run(self._outbox.write, [b[0] for b in batch], confirmed, nacked, ckpt)
                except Exception as exc:
                    log.error("outbox %s: write failed: %s", self._outbox_path, exc)
                    self._confirmed[:0], self._nacked[:0] = confirmed, nacked  # retried with the next write
                    for _, _, stored, _, _ in batch:
                        self._release(1)  # never stored: the sequence id is skipped, harmlessly
                        if not stored.done():
                            stored.set_exception(exc)
                else:
                    if ckpt is not None:
                        self._checkpoint = ckpt
                    self._release(len(confirmed) + len(nacked))
                    for row, _, stored, callback, fut in batch:
                        self._dispatch(row, callback, fut)
                        if not stored.done():
                            stored.set_result(None)
            for b in barriers:
                if not b.done():
                    b.set_result(None)
            if self._stop_writer and not (self._to_store or self._confirmed or self._nacked):
                return


def _copy(fut: asyncio.Future[MessageId], cf: concurrent.futures.Future[MessageId]) -> None:
    if fut.cancelled():
        cf.set_exception(AlreadyClosed("confirm cancelled"))
    elif (exc := fut.exception()) is not None:
        cf.set_exception(exc)
    else:
        cf.set_result(fut.result())


def _to_concurrent(fut: asyncio.Future[MessageId]) -> concurrent.futures.Future[MessageId]:
    cf: concurrent.futures.Future[MessageId] = concurrent.futures.Future()
    cf.set_running_or_notify_cancel()
    fut.add_done_callback(lambda f: _copy(f, cf))
    return cf


class ReliableProducer:
    """Blocking facade of :class:`AsyncReliableProducer` (same parameters), run on ``client``'s loop thread.

    Callbacks run on the client's thread; they must not make blocking ``txn`` calls.
    """

    def __init__(
        self,
        client: Client,
        topic: str,
        *,
        window: int = 1000,
        outbox_path: str | os.PathLike[str] | None = None,
        producer_name: str | None = None,
        admin_url: str | None = None,
        require_dedup: bool = False,
        **producer_options: Any,
    ) -> None:
        self._client = client
        self._lt = client.bridge
        self._inner = AsyncReliableProducer(
            client.async_client, topic, window=window, outbox_path=outbox_path,
            producer_name=producer_name, admin_url=admin_url, require_dedup=require_dedup, **producer_options,
        )
        self._lt.run(self._inner.start())
        # Without an outbox, send_async skips the round trip to the loop thread: a semaphore bounds the
        # window in the caller's thread (released after the core's slot, so the core always has room)
        # and an inbox drained on the loop keeps the call order.
        self._slots = threading.Semaphore(window)
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._lock = threading.Lock()
        self._drain_scheduled = False

    def send_async(
        self,
        content: bytes,
        callback: Callback | None = None,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        checkpoint: str | None = None,
    ) -> concurrent.futures.Future[MessageId]:
        """Accept a message (blocks while the window is full; with an outbox, until it is fsynced).

        Returns the confirm future: a :class:`~txn.MessageId`, or :class:`MessageNacked`.
        """

        inner = self._inner
        if inner.outbox is not None or checkpoint is not None:

            async def go() -> concurrent.futures.Future[MessageId]:
                return _to_concurrent(await inner.send_async(
                    content, callback, properties, partition_key, event_timestamp, checkpoint))

            return self._lt.run(go())
        data = inner.check_content(content, properties)
        self._slots.acquire()
        if inner.closed:
            self._slots.release()
            raise AlreadyClosed("reliable producer is closed", topic=inner.topic())
        cf: concurrent.futures.Future[MessageId] = concurrent.futures.Future()
        cf.set_running_or_notify_cancel()
        self._inbox.append((data, callback, properties, partition_key, event_timestamp, cf))
        with self._lock:
            if self._drain_scheduled:
                return cf
            self._drain_scheduled = True
        self._lt.call_soon(self._drain)
        return cf

    def _drain(self) -> None:
        """On the loop: hand the inbox to the core, in call order."""
        with self._lock:
            self._drain_scheduled = False
        while self._inbox:
            data, callback, properties, key, ts, cf = self._inbox.popleft()
            try:
                fut = self._inner.send_nowait(data, callback, properties, key, ts)
            except PulsarError as exc:
                self._slots.release()
                cf.set_exception(exc)
                continue
            fut.add_done_callback(lambda f, cf=cf: self._done(f, cf))

    def _done(self, fut: asyncio.Future[MessageId], cf: concurrent.futures.Future[MessageId]) -> None:
        self._slots.release()
        _copy(fut, cf)

    def _run_after_inbox(self, coro_fn: Callable[[], Coroutine[Any, Any, R]]) -> R:
        async def go() -> R:
            self._drain()
            return await coro_fn()

        return self._lt.run(go())

    def send(
        self,
        content: bytes,
        properties: dict[str, str] | None = None,
        partition_key: str | None = None,
        event_timestamp: int | None = None,
        checkpoint: str | None = None,
    ) -> MessageId:
        """Send and block for the confirm; raises :class:`MessageNacked` on a broker rejection."""
        return self._run_after_inbox(
            lambda: self._inner.send(content, properties, partition_key, event_timestamp, checkpoint))

    def flush(self) -> None:
        """Block until everything accepted so far is confirmed or nacked."""
        self._run_after_inbox(self._inner.flush)

    def close(self, timeout: float | None = None) -> None:
        """Flush (up to ``timeout`` s) and close; see :meth:`AsyncReliableProducer.close`."""
        if self._client.closed:  # its loop is gone: just release the outbox
            self._inner.abandon()
            return
        self._run_after_inbox(lambda: self._inner.close(timeout))

    def __enter__(self) -> ReliableProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def async_producer(self) -> AsyncReliableProducer:
        """The :class:`AsyncReliableProducer` this one wraps (run on the client's :attr:`~txn.Client.bridge`)."""
        return self._inner

    def topic(self) -> str:
        """The topic."""
        return self._inner.topic()

    def producer_name(self) -> str:
        """The producer name."""
        return self._inner.producer_name()

    @property
    def window(self) -> int:
        """Maximum unconfirmed messages."""
        return self._inner.window

    @property
    def in_flight(self) -> int:
        """Accepted, not yet confirmed or nacked."""
        return self._inner.in_flight

    @property
    def next_sequence_id(self) -> int:
        """The sequence id the next accepted message gets."""
        return self._inner.next_sequence_id

    @property
    def recovery(self) -> dict[str, int]:
        """What :meth:`AsyncReliableProducer.start` found in the outbox."""
        return self._inner.recovery

    @property
    def dedup_enabled(self) -> bool | None:
        """The broker's deduplication setting for the topic, if ``admin_url`` was given."""
        return self._inner.dedup_enabled

    def checkpoint(self) -> str | None:
        """The last checkpoint stored in the outbox."""
        return self._inner.checkpoint()


__all__ = ["AsyncReliableProducer", "Callback", "MessageNacked", "ReliableProducer"]
