"""Flow control and decoding: permits (FLOW), MESSAGE frames to messages, corrupt entries."""

from __future__ import annotations

import logging
import time
from typing import Any

from ..connection import Connection, command
from ..context import ClientContext
from ..crypto import ConsumerCryptoFailureAction, EncryptionContext
from ..errors import (
    AlreadyClosed,
    ChecksumMismatch,
    ConnectError,
    CorruptMessage,
    EncryptedMessage,
    PayloadTooLarge,
    ProtocolError,
    SizeLimitExceeded,
)
from ..message import MessageId, ReceivedMessage, TxnID, signed64
from ..protocol import NULL_PAYLOAD, Frame, decompress, pb, split_batch
from .chunks import CHUNKED_MESSAGE_LIMIT, ChunkBuffer, ChunkedMessage
from .config import ConsumerConfig, ConsumerType
from .parent import ConsumerParent

log = logging.getLogger("txn.consumer")
T = pb.BaseCommand


def _is_acked(ack_set: Any, i: int) -> bool:
    """In a broker-sent ack set, a cleared bit means that batch index is already acked."""
    w = i // 64
    if w >= len(ack_set):
        return True
    return not (ack_set[w] & (1 << (i % 64)))


def _charged_permits(n: int, ack_set: Any) -> int:
    """The permits the broker took for an entry of ``n`` messages sent with ``ack_set``.

    The broker charges a batch entry its message count less the indexes already acknowledged
    (those cleared in the ack set it sends along: batch-index acks, committed or pending in a
    transaction), i.e. the bits still set; without an ack set, all ``n``. The client returns
    exactly this much for the entry, whether it queues, skips or drops its messages: returning
    the acknowledged indexes too would grant permits the broker never took.
    """
    if not ack_set:
        return max(n, 0)
    return sum((w & 0xFFFFFFFFFFFFFFFF).bit_count() for w in ack_set)


class MessageFlow:
    """Part of :class:`~.topic_consumer.TopicConsumer`: flow permits and decoding.

    Each MESSAGE frame is checked (epoch, checksum, marker), decompressed within the size bound,
    split into messages (batch entries, skipping acknowledged or compacted-away indexes) and
    queued; what is dropped returns its permits, and a corrupt entry is queued as an error in its
    place.

    Permits are returned exactly as the broker took them (:func:`_charged_permits`): each queued
    message returns one when taken (or when a redelivery drops it), and the rest of what the
    entry cost is returned on arrival. An acknowledged batch index cost nothing, so it returns
    nothing.
    """

    parent: ConsumerParent
    topic: str
    partition: int
    consumer_id: int
    payload_limit: int
    seek_skip: MessageId | None
    seek_inclusive: bool
    seek_entry_only: bool
    zero_queue: bool
    zero_requested: bool
    zero_permits: int
    conf: ConsumerConfig
    ctx: ClientContext
    _conn: Connection | None
    _epoch: int
    stale_entries: set[tuple[int, int]]
    skipped_after_redeliver: bool
    last_arrival: float
    queue_size: int
    taken: int

    # ----------------------------------------------------------------- messages

    def send_flow(self, n: int) -> None:
        conn = self._conn
        if conn is not None and not conn.closed and n > 0:
            try:
                conn.send_command(command(T.FLOW, consumer_id=self.consumer_id, messagePermits=n))
            except ConnectError:
                pass

    def ask_one(self) -> None:
        """Zero queue: grant what makes the broker hold exactly one permit (it sends one entry)."""
        self.zero_requested = True
        if self.zero_permits < 1:
            n, self.zero_permits = 1 - self.zero_permits, 1
            self.send_flow(n)

    def _skip(self, n: int) -> None:
        """Return ``n`` permits of messages that are not queued (dropped, or dropped from the queue)."""
        if n <= 0:
            return
        if self.zero_queue:
            if self.zero_requested:  # what was asked for is not coming: ask again
                self.ask_one()
            return
        granted = self.parent.receive_queue.count(self, n)
        if granted:
            self.send_flow(granted)

    def dispatch_settled(self, quiet_s: float = 0.05) -> bool:
        """Whether the broker can have no read of its own in progress for this consumer: it holds
        no permits for it (the queue holds or has handed out all it granted), or nothing came for
        ``quiet_s``. A redeliver-all is best sent then (see :meth:`AckTracker.redeliver`)."""
        if self.zero_queue:
            return True
        if time.monotonic() - self.last_arrival >= quiet_s:
            return True
        return self.queue_size - self.parent.receive_queue.queued_for(self) - self.taken <= 0

    def on_message(self, cmd: pb.CommandMessage, frame: Frame) -> None:
        self.last_arrival = time.monotonic()
        meta = frame.metadata
        if meta is None:
            raise ProtocolError("MESSAGE command without payload", topic=self.topic)
        batched = meta.HasField("num_messages_in_batch")
        n = meta.num_messages_in_batch if batched else 1
        ack_set = cmd.ack_set
        charged = _charged_permits(n, ack_set)  # what this entry cost the broker's count for us
        if self.zero_queue:
            self.zero_permits -= charged
        mid = cmd.message_id
        if cmd.HasField("consumer_epoch") and cmd.consumer_epoch < self._epoch:
            self._skip(charged)  # sent before a redeliver-all; it comes again
            self.stale_entries.add((mid.ledgerId, mid.entryId))
            return
        if self.stale_entries:
            self._check_skipped((mid.ledgerId, mid.entryId))
        if not frame.checksum_ok:
            self._reject(ChecksumMismatch, "checksum mismatch", mid, charged)
            return
        if meta.HasField("marker_type"):
            self._skip(charged)
            return
        body = frame.payload or b""
        encryption: EncryptionContext | None = None
        if len(meta.encryption_keys):
            opened = self._decrypt(cmd, meta, body, charged)
            if opened is None:
                return  # raised, discarded or handed over still encrypted (crypto_failure_action)
            body, encryption = opened
        if meta.num_chunks_from_msg > 1:
            self._on_chunk(cmd, meta, body, charged, encryption)
            return
        try:
            if n < 1:
                raise ProtocolError(f"batch entry declares {n} messages")
            payload = decompress(meta.compression, body, meta.uncompressed_size, self.payload_limit)
            msgs = self._build(cmd, meta, payload, batched, n)
            if encryption is not None:
                for m in msgs:
                    m.encryption = encryption
        except ProtocolError as exc:
            self._reject(PayloadTooLarge if isinstance(exc, SizeLimitExceeded) else CorruptMessage,
                         f"undecodable payload: {exc.message}", mid, charged)
            return
        self._hand_out(msgs, charged)

    def _check_skipped(self, at: tuple[int, int]) -> None:
        """After a redeliver-all, the broker re-sends from its cursor; but a read it had in flight
        may still be dispatched with the old epoch (dropped here) and move its read position past
        those entries (Pulsar 4.0.8, single-active-consumer dispatch). In order delivery (Exclusive,
        Failover) an entry of the new epoch beyond a dropped one shows the broker skipped it: then
        ``skipped_after_redeliver`` is set, for the owner to redeliver again (a consumer that
        stays connected is sent nothing again otherwise)."""
        self.stale_entries.discard(at)
        if self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared):
            self.stale_entries.clear()
            return
        if self.stale_entries and min(self.stale_entries) < at:
            log.info("%s: the broker skipped %d entr(ies) from %s after a redelivery request (a read it had in "
                     "flight); they need another", self.topic, len(self.stale_entries), min(self.stale_entries))
            self.stale_entries.clear()
            self.skipped_after_redeliver = True

    def _hand_out(self, msgs: list[ReceivedMessage], charged: int) -> None:
        """Queue an entry's messages (those a seek or a reader's start leaves), returning the permits
        of the ones not queued."""
        if self.seek_skip is not None and msgs:
            msgs = self._after_seek(msgs)
        if msgs and self.conf.dead_letter_policy is not None:
            msgs = self.parent.on_arrival(self, msgs)  # type: ignore[attr-defined]
        # Acknowledged indexes were not charged; compacted-away ones were, and come back here.
        if not self.zero_queue:
            self._skip(charged - len(msgs))
        elif not msgs and self.zero_requested:
            self.ask_one()  # nothing of it is handed out: ask for the next entry
        if msgs:
            self.parent.receive_queue.put_many(msgs)

    def _decrypt(self, cmd: pb.CommandMessage, meta: pb.MessageMetadata, body: bytes,
                 charged: int) -> tuple[bytes, EncryptionContext] | None:
        """An encrypted entry (a chunk: on its own, as the official producer encrypts each): its
        payload decrypted and its context; None when it cannot be decrypted (no key reader, or no key
        of it opens it) and ``crypto_failure_action`` took it: ``FAIL`` queues
        :class:`EncryptedMessage` in its place (left unacknowledged), ``DISCARD`` acknowledges the
        entry, ``CONSUME`` queues it as one message still encrypted (a chunk: as ``FAIL``)."""
        decryptor = self.conf.decryptor
        plain = None if decryptor is None else decryptor.decrypt(meta, body)
        if plain is not None:
            return plain, EncryptionContext(meta, False)
        mid = cmd.message_id
        why = "no crypto_key_reader to decrypt it" if decryptor is None else "no key of it could be decrypted"
        action = self.conf.crypto_failure_action
        if action == ConsumerCryptoFailureAction.DISCARD:
            log.warning("discarding an encrypted message of %s (%s:%s): %s", self.topic, mid.ledgerId, mid.entryId,
                        why)
            here = MessageId(self.partition, signed64(mid.ledgerId), signed64(mid.entryId), topic=self.topic)
            try:
                self.ack_local(here, False)  # type: ignore[attr-defined]  # AckTracker, in TopicConsumer
            except AlreadyClosed:
                pass
            self._skip(charged)
            return None
        if action != ConsumerCryptoFailureAction.CONSUME or meta.num_chunks_from_msg > 1:
            self._reject(EncryptedMessage, f"encrypted payload ({why})", mid, charged)
            return None
        msg = self._build(cmd, meta, body, False, 1)[0]
        msg.encryption = EncryptionContext(meta, True)
        self._hand_out([msg], charged)
        return None

    def _on_chunk(self, cmd: pb.CommandMessage, meta: pb.MessageMetadata, payload: bytes, charged: int,
                  encryption: EncryptionContext | None = None) -> None:
        """One chunk of a chunked message (:mod:`.chunks`): kept until its message is complete, which
        is then queued as one message. Each chunk's entry returns its permit now, but the one that
        completes a message (it returns one when taken)."""
        chunks: ChunkBuffer | None = getattr(self, "chunks", None)
        if chunks is None:
            conf = self.conf
            chunks = self.chunks = ChunkBuffer(conf.max_pending_chunked_message,
                                               conf.auto_ack_oldest_chunked_message_on_queue_full,
                                               conf.expire_time_of_incomplete_chunked_message_ms)
        mid = cmd.message_id
        here = MessageId(self.partition, signed64(mid.ledgerId), signed64(mid.entryId), topic=self.topic)
        res = chunks.add(here, meta, payload)
        for done in res.to_ack:
            self.ack_local(done, False)  # type: ignore[attr-defined]  # AckTracker, in TopicConsumer
        if res.error is not None:
            self._reject(CorruptMessage, res.error, mid, charged)
            return
        msg: ReceivedMessage | None = None
        if res.message_id is not None and res.payload is not None:
            try:
                whole = decompress(meta.compression, res.payload, meta.uncompressed_size,
                                   self.ctx.pool.max_uncompressed_message_size or CHUNKED_MESSAGE_LIMIT)
            except ProtocolError as exc:
                self._reject(PayloadTooLarge if isinstance(exc, SizeLimitExceeded) else CorruptMessage,
                             f"undecodable chunked message {meta.uuid!r}: {exc.message}", mid, charged)
                return
            msg = self._build(cmd, meta, whole, False, 1)[0]
            msg.__class__ = ChunkedMessage
            msg._id = res.message_id  # noqa: SLF001 - a message it built
            if encryption is not None:
                msg.encryption = encryption
            if self.seek_skip is not None and not self._after_seek([msg]):
                msg = None
        if msg is None:
            self._skip(charged)  # (zero queue: asks for the next entry)
            return
        if not self.zero_queue:
            self._skip(charged - 1)
        self.parent.receive_queue.put_many([msg])

    def _after_seek(self, msgs: list[ReceivedMessage]) -> list[ReceivedMessage]:
        """Drop the messages before the target of a seek, and the target too unless the seek is inclusive.

        A reader's start (``seek_entry_only``) drops only within the start's own entry: the broker
        starts a reader there, or after it, and what it sends from elsewhere is handed out (a start
        naming an entry the topic no longer holds, or entry -1 of a ledger)."""
        target = self.seek_skip
        assert target is not None
        pos = (signed64(target.ledger_id()), signed64(target.entry_id()))
        index = target.batch_index()
        first = msgs[0].message_id()
        here = (first.ledger_id(), first.entry_id())
        if here > pos or (here < pos and self.seek_entry_only):
            self.seek_skip = None
            return msgs
        if here < pos:
            return []
        first_kept = index if self.seek_inclusive else index + 1
        kept = [m for m in msgs if index >= 0 and m.message_id().batch_index() >= first_kept]
        if kept or index < 0 or msgs[-1].message_id().batch_index() >= index:
            self.seek_skip = None
        return kept

    def _reject(self, kind: type[CorruptMessage], what: str, mid: pb.MessageIdData, permits: int) -> None:
        """Report a corrupt entry in the receive queue, in its place; it stays unacknowledged.

        Its ``permits`` (what the broker charged for it) are returned now: the queued error counts
        none when taken."""
        err = kind(f"{what}; the entry is left unacknowledged", topic=self.topic,
                   message_id=MessageId(self.partition, signed64(mid.ledgerId), signed64(mid.entryId),
                                        topic=self.topic))
        log.error("%s", err)
        self._skip(permits)
        self.parent.receive_queue.put_error(err, self)

    def _build(self, cmd: pb.CommandMessage, meta: pb.MessageMetadata, payload: bytes, batched: bool,
               n: int) -> list[ReceivedMessage]:
        mid = cmd.message_id
        topic = self.topic
        redeliveries = cmd.redelivery_count
        publish_time = meta.publish_time
        event_time = meta.event_time
        producer = meta.producer_name
        props = {kv.key: kv.value for kv in meta.properties} if len(meta.properties) else None
        txn = TxnID(meta.txnid_most_bits, meta.txnid_least_bits) if meta.HasField("txnid_least_bits") else None
        if not batched:
            key = meta.partition_key if meta.HasField("partition_key") else None
            okey = meta.ordering_key if meta.HasField("ordering_key") else None
            entry = (mid.ledgerId, mid.entryId, self.partition, 0)
            if meta.null_value:
                payload = NULL_PAYLOAD
            single = [
                ReceivedMessage(payload, props, entry, -1, topic, key, publish_time, event_time, redeliveries,
                                producer, meta.sequence_id, self, txn, okey)
            ]
            if meta.HasField("schema_version"):
                single[0].raw_schema_version = meta.schema_version
            return single
        entry = (mid.ledgerId, mid.entryId, self.partition, n)
        out: list[ReceivedMessage] = []
        append = out.append
        ack_set = cmd.ack_set
        base_seq = meta.sequence_id
        i = -1
        for data, seq, ev, key, own_props, compacted, okey in split_batch(payload, n):
            i += 1
            if compacted or (ack_set and _is_acked(ack_set, i)):
                continue
            if own_props is None:
                p = dict(props) if props else None  # None: ReceivedMessage makes the dict on first use
            elif props:
                p = dict(props)
                p.update(own_props)
            else:
                p = dict(own_props)
            append(
                ReceivedMessage(data, p, entry, i, topic, key, publish_time, ev or event_time, redeliveries, producer,
                                base_seq + i if seq is None else seq, self, txn, okey)
            )
        if meta.HasField("schema_version"):
            version = meta.schema_version
            for m in out:
                m.raw_schema_version = version
        return out
