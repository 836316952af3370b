"""Accumulating messages: the pending window (backpressure), batching, compression and the frames
awaiting their receipts."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..connection import Connection, command
from ..crypto import IV_BYTES, TAG_BYTES
from ..errors import AlreadyClosed, ConnectError, MessageTooBig, PulsarError
from ..message import MessageId, TxnID
from ..protocol import NULL_PAYLOAD, CompressionType, compress, encode_entry, encode_payload_frame, pb
from .config import _NO_TXN, BatchEntry, BatchingType, ProducerConfig, _kv

T = pb.BaseCommand


@dataclass(slots=True)
class _Op:
    """A frame awaiting its receipt: one message or one batch."""

    seq: int
    highest: int
    frame: bytes
    futures: list[asyncio.Future[MessageId]]
    batched: bool
    created: float
    txn: TxnID
    #: a chunk of a chunked message: the ids of its chunks received so far (shared by its chunks)
    chunks: list[MessageId] | None = None


class _Batch:
    __slots__ = ("entries", "futures", "size", "txn", "first_seq", "last_seq", "key", "shared")

    def __init__(self, txn: TxnID, first_seq: int, key: bytes | None = None) -> None:
        self.entries: list[bytes] = []
        #: one future per message; the quiet ones (:meth:`Accumulator.enqueue_quiet`) share ``shared``
        self.futures: list[asyncio.Future[MessageId]] = []
        self.shared: asyncio.Future[MessageId] | None = None
        self.size = 0
        self.txn = txn
        self.first_seq = first_seq
        self.last_seq = first_seq
        self.key = key  # BatchingType.KeyBased: the key of every message in the batch


class Accumulator:
    """Part of :class:`~.partition.PartitionProducer`: the pending window and the frames.

    Messages are checked, given sequence ids and metadata, gathered into batches (closed by
    count, size, transaction or the publish delay), compressed and framed; each frame waits in
    the ordered ``_pending`` deque for its receipt. ``queued`` counts the messages in the open
    batch and in ``_pending``; it never passes ``window`` without the caller waiting (backpressure).
    """

    conf: ProducerConfig
    topic: str
    partition: int
    producer_id: int
    producer_name: str
    window: int
    queued: int
    conn: Connection | None
    ready: bool
    schema_version: bytes | None
    _pending: deque[_Op]
    _batch: _Batch | None
    _batch_timer: asyncio.TimerHandle | None
    _seq: int
    _closed: bool
    _fatal: PulsarError | None
    _space_waiters: deque[asyncio.Future[None]]

    # ------------------------------------------------------------------ window

    def has_space(self) -> bool:
        return self.queued < self.window

    def has_open_batch(self) -> bool:
        """True while a batch is open (messages queued for it, not yet framed)."""
        return self._batch is not None

    async def wait_space(self) -> None:
        """Wait until the pending window has room (backpressure)."""
        while self.queued >= self.window and not self._closed:
            fut = asyncio.get_running_loop().create_future()
            self._space_waiters.append(fut)
            await fut

    def _release(self, n: int) -> None:
        self.queued -= n
        while self._space_waiters and self.queued < self.window:
            w = self._space_waiters.popleft()
            if not w.done():
                w.set_result(None)

    # ------------------------------------------------------------------ sending

    @property
    def chunking(self) -> bool:
        """Whether a message over the broker's limit goes in chunks: ``chunking_enabled`` on a
        persistent topic only (the official clients turn it off on a non-persistent one, where such
        a message is :class:`MessageTooBig`)."""
        return self.conf.chunking_enabled and not self.topic.startswith("non-persistent://")

    def check_size(self, content: bytes) -> None:
        """Raise :class:`MessageTooBig` if ``content`` (compressed, if a codec is set) exceeds the broker's limit."""
        limit = self.max_message_size
        if len(content) > limit:
            codec = self.conf.compression_type
            if codec == CompressionType.NONE or len(compress(codec, content)) > limit:
                raise MessageTooBig(f"message of {len(content)} bytes exceeds the broker's limit of {limit}",
                                    topic=self.topic)

    def check_usable(self) -> None:
        if self._closed:
            raise AlreadyClosed("producer is closed", topic=self.topic)
        if self._fatal is not None:
            raise self._fatal

    def enqueue(
        self,
        content: bytes,
        properties: dict[str, str] | None,
        partition_key: str | None,
        event_timestamp: int | None,
        sequence_id: int | None,
        txn: TxnID,
        ordering_key: bytes | None = None,
        deliver_at: int | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message; returns a future resolved with its id on receipt.

        The caller checked the window. Raises on a closed producer or an oversize message. A
        message with a delivery time (ms since the epoch) is never batched, as in the official
        client: the open batch goes first, then the message as an entry of its own. With
        ``BatchingType.KeyBased`` a message whose key differs from the open batch's closes it, so
        each batch holds one key.
        """
        self.check_usable()
        if not self.chunking:
            self.check_size(content)
        if self.conf.encryptor is not None:
            self.conf.encryptor.check()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[MessageId] = loop.create_future()
        if sequence_id is None:
            seq = self._seq
            self._seq += 1
        else:
            seq = sequence_id
            self._seq = max(self._seq, seq + 1)
        self.queued += 1
        conf = self.conf
        if not conf.batching_enabled or deliver_at is not None:
            meta = pb.MessageMetadata(
                producer_name=self.producer_name,
                sequence_id=seq,
                publish_time=int(time.time() * 1000),
                properties=_kv(properties),
            )
            if partition_key is not None:
                meta.partition_key = partition_key
            if ordering_key is not None:
                meta.ordering_key = ordering_key
            if event_timestamp:
                meta.event_time = event_timestamp
            if deliver_at is not None:
                meta.deliver_at_time = deliver_at
                self._flush_batch()
            if content is NULL_PAYLOAD:
                meta.null_value = True
            if self.chunking and self._push_chunks(seq, meta, content, fut, txn):
                return fut
            self._push(seq, seq, meta, content, [fut], False, txn)
            return fut
        smm = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=seq, properties=_kv(properties))
        if partition_key is not None:
            smm.partition_key = partition_key
        if ordering_key is not None:
            smm.ordering_key = ordering_key
        if event_timestamp:
            smm.event_time = event_timestamp
        if content is NULL_PAYLOAD:
            smm.null_value = True
        entry = encode_entry(smm, content)
        key: bytes | None = None
        if conf.batching_type == BatchingType.KeyBased:
            # the official key-based container's key: the ordering key, else the partition key
            key = ordering_key if ordering_key is not None else (
                None if partition_key is None else partition_key.encode())
        self._add_to_batch(entry, fut, seq, txn, key, loop)
        return fut

    def enqueue_quiet(
        self,
        content: bytes,
        properties: dict[str, str] | None,
        partition_key: str | None,
        txn: TxnID,
    ) -> asyncio.Future[MessageId]:
        """Queue one message without a future of its own: it shares one with the other quiet
        messages of its batch, resolved with the id of the first of them (or failed) when the
        batch's receipt comes. Saves a future and a :class:`MessageId` per message where only the
        batch's outcome matters. A message that cannot join a batch (batching off or key-based,
        encryption, over the broker's limit) is queued by :meth:`enqueue`, with its own future."""
        conf = self.conf
        if (not conf.batching_enabled or conf.batching_type == BatchingType.KeyBased or conf.encryptor is not None
                or len(content) > self.max_message_size):
            return self.enqueue(content, properties, partition_key, None, None, txn)
        self.check_usable()
        seq = self._seq
        self._seq += 1
        self.queued += 1
        smm = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=seq, properties=_kv(properties))
        if partition_key is not None:
            smm.partition_key = partition_key
        if content is NULL_PAYLOAD:
            smm.null_value = True
        entry = encode_entry(smm, content)
        b = self._batch
        if (b is not None and b.shared is not None and (b.txn is txn or b.txn == txn)
                and len(b.entries) < conf.batching_max_messages
                and b.size + len(entry) <= conf.batching_max_allowed_size_in_bytes):
            # the common case, inline: the open batch already holds quiet messages of this transaction
            fut = b.shared
            b.entries.append(entry)
            b.futures.append(fut)
            b.size += len(entry)
            b.last_seq = seq
        else:
            loop = asyncio.get_running_loop()
            b = self._add_to_batch(entry, None, seq, txn, None, loop, flush_full=False)
            if b.shared is None:
                b.shared = loop.create_future()
            fut = b.futures[-1] = b.shared
        if len(b.entries) >= conf.batching_max_messages or b.size >= conf.batching_max_allowed_size_in_bytes:
            self._flush_batch()
        return fut

    def _add_to_batch(self, entry: bytes, fut: asyncio.Future[MessageId] | None, seq: int, txn: TxnID,
                      key: bytes | None, loop: asyncio.AbstractEventLoop, flush_full: bool = True) -> _Batch:
        """Add an encoded message to the open batch, first sending that batch if the message cannot
        join it (another transaction or key, full); the batch it joined, sent already if that
        filled it (``flush_full``)."""
        conf = self.conf
        b = self._batch
        if b is not None and (
            b.txn != txn
            or b.key != key
            or len(b.entries) >= conf.batching_max_messages
            or b.size + len(entry) > conf.batching_max_allowed_size_in_bytes
        ):
            self._flush_batch()
            b = None
        if b is None:
            b = self._batch = _Batch(txn, seq, key)
            self._batch_timer = loop.call_later(conf.batching_max_publish_delay_ms / 1000.0, self._flush_batch)
        b.entries.append(entry)
        b.futures.append(fut)  # type: ignore[arg-type]  # None: the quiet caller puts the shared future there
        b.size += len(entry)
        b.last_seq = seq
        if flush_full and (len(b.entries) >= conf.batching_max_messages
                           or b.size >= conf.batching_max_allowed_size_in_bytes):
            self._flush_batch()
        return b

    def enqueue_batch(
        self,
        entries: Sequence[BatchEntry],
        first_sequence_id: int,
        txn: TxnID,
    ) -> list[asyncio.Future[MessageId]]:
        """Queue ``entries`` as one batch message with sequence ids ``first_sequence_id``, ``+1``, ...

        The frame carries ``sequence_id`` = the first id and ``highest_sequence_id`` = the last, so
        broker deduplication stores or drops the batch as a whole. An open batch of single sends
        goes out first (order). The caller checked the window. Raises on a closed producer, an
        empty batch or an oversize one.
        """
        self.check_usable()
        if not entries:
            raise ValueError("a batch needs at least one message")
        if first_sequence_id < 0:
            raise ValueError(f"sequence ids are non-negative, got {first_sequence_id}")
        parts: list[bytes] = []
        for i, entry in enumerate(entries):
            content, properties, partition_key = entry[0], entry[1], entry[2]
            smm = pb.SingleMessageMetadata(payload_size=len(content), sequence_id=first_sequence_id + i,
                                           properties=_kv(properties))
            if partition_key is not None:
                smm.partition_key = partition_key
            if len(entry) > 3 and entry[3]:
                smm.event_time = entry[3]  # type: ignore[misc]
            if content is NULL_PAYLOAD:
                smm.null_value = True
            parts.append(encode_entry(smm, content))
        payload = b"".join(parts)
        self.check_size(payload)
        if self.conf.encryptor is not None:
            self.conf.encryptor.check()
        self._flush_batch()
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[MessageId]] = [loop.create_future() for _ in entries]
        last = first_sequence_id + len(entries) - 1
        self._seq = max(self._seq, last + 1)
        self.queued += len(entries)
        meta = pb.MessageMetadata(
            producer_name=self.producer_name,
            sequence_id=first_sequence_id,
            publish_time=int(time.time() * 1000),
            num_messages_in_batch=len(entries),
            highest_sequence_id=last,
        )
        self._push(first_sequence_id, last, meta, payload, futures, True, txn)
        return futures

    def _flush_batch(self) -> None:
        b = self._batch
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if b is None:
            return
        self._batch = None
        payload = b"".join(b.entries)
        meta = pb.MessageMetadata(
            producer_name=self.producer_name,
            sequence_id=b.first_seq,
            publish_time=int(time.time() * 1000),
            num_messages_in_batch=len(b.entries),
            highest_sequence_id=b.last_seq,
        )
        self._push(b.first_seq, b.last_seq, meta, payload, b.futures, True, b.txn)

    def _push(
        self,
        seq: int,
        highest: int,
        meta: pb.MessageMetadata,
        payload: bytes,
        futures: list[asyncio.Future[MessageId]],
        batched: bool,
        txn: TxnID,
    ) -> None:
        if self.schema_version is not None:
            meta.schema_version = self.schema_version
        codec = self.conf.compression_type
        if codec != CompressionType.NONE:
            meta.compression = int(codec)
            meta.uncompressed_size = len(payload)
            payload = compress(codec, payload)
        if self.conf.encryptor is not None:
            payload = self.conf.encryptor.encrypt(meta, payload)
        send = {"producer_id": self.producer_id, "sequence_id": seq, "num_messages": len(futures)}
        if highest != seq:
            send["highest_sequence_id"] = highest
        if txn is not _NO_TXN:
            meta.txnid_most_bits = txn.most
            meta.txnid_least_bits = txn.least
            send["txnid_most_bits"] = txn.most
            send["txnid_least_bits"] = txn.least
        frame = encode_payload_frame(command(T.SEND, **send), meta, payload)
        self._queue(_Op(seq, highest, frame, futures, batched, time.monotonic(), txn))

    def _queue(self, op: _Op) -> None:
        """Add ``op`` to the pending window and write its frame if connected (else the reconnect resends it)."""
        self._pending.append(op)
        if self.ready and self.conn is not None:
            try:
                self.conn.write(op.frame)
            except ConnectError:
                pass  # resent after reconnect

    def _push_chunks(self, seq: int, meta: pb.MessageMetadata, content: bytes, fut: asyncio.Future[MessageId],
                     txn: TxnID) -> bool:
        """``chunking_enabled``: send a message whose (compressed) payload exceeds the broker's
        ``max_message_size`` as chunks, each an entry with the message's sequence id, the uuid
        ``<producer name>-<sequence id>``, its ``chunk_id``, ``num_chunks_from_msg`` and
        ``total_chunk_msg_size`` (as the official clients; with encryption, each chunk is encrypted on
        its own, as there); ``fut`` gets the last chunk's receipt,
        as a :class:`~txn.message.ChunkMessageId`. False (nothing sent) if it fits in one entry."""
        codec = self.conf.compression_type
        payload = content if codec == CompressionType.NONE else compress(codec, content)
        limit = self.max_message_size
        if len(payload) <= limit:
            return False
        if self.schema_version is not None:
            meta.schema_version = self.schema_version
        if codec != CompressionType.NONE:
            meta.compression = int(codec)
            meta.uncompressed_size = len(content)
        if txn is not _NO_TXN:
            meta.txnid_most_bits = txn.most
            meta.txnid_least_bits = txn.least
        meta.uuid = f"{self.producer_name}-{seq}"
        meta.total_chunk_msg_size = len(payload)
        meta.num_chunks_from_msg = meta.chunk_id = 1 << 30  # the widest these fields get, to size the metadata
        encryptor = self.conf.encryptor
        if encryptor is not None:  # each chunk is encrypted on its own, as the official producer does
            encryptor.add_keys(meta)
            meta.encryption_param = bytes(IV_BYTES)
        size = limit - meta.ByteSize() - (TAG_BYTES if encryptor is not None else 0)
        if size <= 0:
            raise MessageTooBig(f"message metadata of {meta.ByteSize()} bytes leaves no room under the broker's "
                                f"limit of {limit}", topic=self.topic)
        n = -(-len(payload) // size)
        meta.num_chunks_from_msg = n
        received: list[MessageId] = []
        send = {"producer_id": self.producer_id, "sequence_id": seq, "num_messages": 1, "is_chunk": True}
        if txn is not _NO_TXN:
            send["txnid_most_bits"] = txn.most
            send["txnid_least_bits"] = txn.least
        for i in range(n):
            meta.chunk_id = i
            part = payload[i * size:(i + 1) * size]
            if encryptor is not None:
                part = encryptor.seal(meta, part)
            frame = encode_payload_frame(command(T.SEND, **send), meta, part)
            self._queue(_Op(seq, seq, frame, [fut] if i == n - 1 else [], False, time.monotonic(), txn, received))
        return True

    def flush_now(self) -> None:
        """Send the open batch immediately."""
        self._flush_batch()

    async def flush(self) -> None:
        """Send the open batch and wait for every pending receipt."""
        self._flush_batch()
        futs = [f for op in list(self._pending) for f in op.futures]
        if futs:
            await asyncio.gather(*futs, return_exceptions=True)
