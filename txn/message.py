"""Message ids, transaction ids and received messages."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from .protocol import NullPayload, pb

if TYPE_CHECKING:
    from .crypto import EncryptionContext


@total_ordering
class MessageId:
    """Position of a message: partition, ledger, entry and index inside a batch.

    As ``pulsar.MessageId``: built as ``MessageId(partition=-1, ledger_id=-1, entry_id=-1,
    batch_index=-1)``, read with the methods :meth:`ledger_id`, :meth:`entry_id`,
    :meth:`partition` and :meth:`batch_index`. ``MessageId.earliest`` and ``MessageId.latest``
    are :data:`EARLIEST` and :data:`LATEST`.

    Equality compares all four; ordering compares ledger, entry and batch index like the
    official client, with the partition as the last tie-breaker (the official client leaves
    ids that differ only by partition unordered). Unlike the official id, ours is hashable
    (the hash follows equality). Immutable by convention. Two attributes of our own:
    ``batch_size`` (messages in the id's batch entry, 0 if unknown) and ``topic`` (the topic or
    partition it belongs to, ``""`` if unknown); neither takes part in comparisons.
    """

    __slots__ = ("_ledger", "_entry", "_partition", "_batch", "batch_size", "topic")
    earliest: ClassVar[MessageId]
    latest: ClassVar[MessageId]

    def __init__(self, partition: int = -1, ledger_id: int = -1, entry_id: int = -1, batch_index: int = -1,
                 *, batch_size: int = 0, topic: str = "") -> None:
        self._partition = partition
        self._ledger = ledger_id
        self._entry = entry_id
        self._batch = batch_index
        self.batch_size = batch_size
        self.topic = topic

    def ledger_id(self) -> int:
        """The ledger."""
        return self._ledger

    def entry_id(self) -> int:
        """The entry in the ledger."""
        return self._entry

    def partition(self) -> int:
        """The partition index, -1 for a non-partitioned topic (or unknown)."""
        return self._partition

    def batch_index(self) -> int:
        """The index in a batch entry, -1 if the entry is not a batch."""
        return self._batch

    def _order(self) -> tuple[int, int, int, int]:
        return (self._ledger, self._entry, self._batch, self._partition)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._order() < other._order()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageId):
            return NotImplemented
        return self._order() == other._order()

    def __hash__(self) -> int:
        return hash(self._order())

    def __str__(self) -> str:
        return _id_str(self._ledger, self._entry, self._partition, self._batch)

    def __repr__(self) -> str:
        return (f"MessageId(partition={self._partition}, ledger_id={self._ledger}, entry_id={self._entry}, "
                f"batch_index={self._batch}, batch_size={self.batch_size})")

    def to_pb(self) -> pb.MessageIdData:
        """Wire form (without ack set)."""
        d = pb.MessageIdData(ledgerId=self._ledger & _U64, entryId=self._entry & _U64)
        if self._partition >= 0:
            d.partition = self._partition
        if self._batch >= 0:
            d.batch_index = self._batch
        return d

    def serialize(self) -> bytes:
        """Bytes form, readable back with :meth:`deserialize` (and by ``pulsar.MessageId.deserialize``)."""
        d = self.to_pb()
        if self.batch_size:
            d.batch_size = self.batch_size
        return d.SerializeToString()

    @classmethod
    def deserialize(cls, data: bytes, topic: str | None = None) -> MessageId:
        """Inverse of :meth:`serialize`; reads the official client's bytes too. ``topic`` sets
        :attr:`topic`."""
        d = pb.MessageIdData()
        try:
            d.ParseFromString(data)
        except Exception as exc:  # protobuf's DecodeError and friends
            raise ValueError(f"not a serialized message id: {exc}") from exc
        if not d.IsInitialized():
            raise ValueError("not a serialized message id: required fields missing")
        last = cls.from_pb(d, topic=topic or "")
        if d.HasField("first_chunk_message_id"):
            # A chunked message's id, as both clients serialize it: its last chunk and its first.
            return ChunkMessageId([MessageId.from_pb(d.first_chunk_message_id, topic=topic or ""), last])
        return last

    @classmethod
    def from_pb(cls, d: pb.MessageIdData, partition: int | None = None, topic: str = "") -> MessageId:
        """Build from wire form, optionally overriding the partition.

        Ledger and entry are unsigned on the wire and signed here, as in the official client:
        the wire's 2^64-1 is -1 (``earliest``)."""
        return cls(
            d.partition if partition is None else partition,
            signed64(d.ledgerId),
            signed64(d.entryId),
            d.batch_index if d.HasField("batch_index") else -1,
            batch_size=d.batch_size if d.HasField("batch_size") else 0,
            topic=topic,
        )

    @property
    def entry_key(self) -> tuple[int, int, int]:
        """(ledger, entry, partition): identifies the stored entry (the whole batch)."""
        return (self._ledger, self._entry, self._partition)


class ChunkMessageId(MessageId):
    """Id of a chunked message: the last chunk's position (it compares and hashes as that), with
    every chunk's id in :attr:`chunk_ids` (the first and last only, once deserialized); ``str()`` is
    ``first;last`` and :meth:`serialize` keeps both, as the official client's. ``seek()`` to it
    seeks to its first chunk."""

    __slots__ = ("chunk_ids",)

    def __init__(self, chunk_ids: list[MessageId]) -> None:
        last = chunk_ids[-1]
        MessageId.__init__(self, last.partition(), last.ledger_id(), last.entry_id(), -1, topic=last.topic)
        #: The id of each chunk's entry, first to last.
        self.chunk_ids: tuple[MessageId, ...] = tuple(chunk_ids)

    def __str__(self) -> str:
        return f"{self.chunk_ids[0]};{self.chunk_ids[-1]}"

    def __repr__(self) -> str:
        return f"ChunkMessageId(first={self.chunk_ids[0]!r}, last={self.chunk_ids[-1]!r})"

    def serialize(self) -> bytes:
        """The last chunk's position with the first chunk's (``first_chunk_message_id``), as the
        official client writes it; :meth:`MessageId.deserialize` (and ``pulsar.MessageId.deserialize``)
        reads it back as a chunked message's id, which knows its first and last chunks only."""
        d = self.to_pb()
        first = self.chunk_ids[0]
        d.first_chunk_message_id.ledgerId = first.ledger_id() & _U64
        d.first_chunk_message_id.entryId = first.entry_id() & _U64
        if first.partition() >= 0:
            d.first_chunk_message_id.partition = first.partition()
        return d.SerializeToString()

    def first_chunk_message_id(self) -> MessageId:
        """The first chunk's id."""
        return self.chunk_ids[0]

    def last_chunk_message_id(self) -> MessageId:
        """The last chunk's id."""
        return self.chunk_ids[-1]


def signed64(v: int) -> int:
    """A wire uint64 as the int64 the official client keeps."""
    return v - (1 << 64) if v >= 1 << 63 else v


def more_in_entry(pos: MessageId, last: MessageId) -> bool:
    """Whether messages follow ``pos`` in its batch entry, which is the topic's last (``last``, the
    broker's last message id). The broker names that entry's last batch index; ``pos``'s own batch
    size only counts when it does not (an id rebuilt from its parts has none, and was taken as
    "maybe more", which made a read to the end wait for its time-out)."""
    index = pos.batch_index()
    if index < 0:
        return False
    if last.batch_index() >= 0:
        return index < last.batch_index()
    return pos.batch_size == 0 or index < pos.batch_size - 1


#: The earliest and latest positions, for ``seek`` and readers.
EARLIEST = MessageId()
LATEST = MessageId(ledger_id=0x7FFFFFFFFFFFFFFF, entry_id=0x7FFFFFFFFFFFFFFF)
MessageId.earliest = EARLIEST
MessageId.latest = LATEST

_U64 = 0xFFFFFFFFFFFFFFFF
#: A message id as text, ``(ledger,entry,partition,batch index)`` (``str(MessageId)``): groups
#: ledger, entry and batch index. Ledger records name their inputs this way.
MESSAGE_ID_PATTERN = re.compile(r"\((\d{1,20}),(\d{1,20}),-?\d{1,10},(-?\d{1,10})\)")

_TXN_RE = re.compile(r"\(\s*([0-9]+)\s*,\s*([0-9]+)\s*\)")


@dataclass(frozen=True, slots=True)
class TxnID:
    """A transaction id: ``most`` is the coordinator id, ``least`` the sequence in it.

    ``str(txn_id)`` gives ``(most,least)`` and :meth:`parse` reads it back.
    """

    most: int
    least: int

    def __str__(self) -> str:
        return f"({self.most},{self.least})"

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Parse ``(most,least)``; also accepts ``most:least``. Raises ``ValueError``."""
        if not isinstance(text, str):
            raise ValueError(f"not a transaction id: {text!r} (expected '(most,least)')")
        m = _TXN_RE.fullmatch(text.strip())
        if m is None:
            m = re.fullmatch(r"([0-9]+):([0-9]+)", text.strip())
            if m is not None:
                return cls(int(m.group(1)), int(m.group(2)))
            raise ValueError(f"not a transaction id: {text!r} (expected '(most,least)')")
        return cls(int(m.group(1)), int(m.group(2)))


class ConsumerRef(Protocol):
    """The back-reference of a received message (and of a transaction's recorded acks) to the
    consumer of one topic or partition that received it.

    A message only carries it, so that acknowledging it finds its consumer without a lookup; a
    transaction calls it when an abort hands acknowledged messages back. It is defined here,
    below the consumer, so that neither this module nor :mod:`txn.transaction` imports
    :mod:`txn.consumer`.
    """

    def redeliver_after_abort(self, mids: list[MessageId], cumulative: bool) -> None:
        """Hand back messages whose acknowledgements an aborted transaction held (all of them
        from the last acknowledged position on if ``cumulative``)."""
        ...


class Message:
    """A received message. Accessors mirror ``pulsar.Message``."""

    __slots__ = (
        "_data",
        "_properties",
        "_id",
        "_topic",
        "_key",
        "_publish_ts",
        "_event_ts",
        "_redelivery",
        "_producer",
        "_sequence_id",
        "_ordering_key",
        "consumer",
    )

    def __init__(
        self,
        data: bytes,
        properties: dict[str, str],
        message_id: MessageId,
        topic: str,
        partition_key: str | None,
        publish_timestamp: int,
        event_timestamp: int,
        redelivery_count: int,
        producer_name: str,
        sequence_id: int,
        consumer: ConsumerRef | None = None,
        ordering_key: bytes | None = None,
    ) -> None:
        self._data = data
        self._properties = properties
        self._id = message_id
        self._topic = topic
        self._key = partition_key
        self._publish_ts = publish_timestamp
        self._event_ts = event_timestamp
        self._redelivery = redelivery_count
        self._producer = producer_name
        self._sequence_id = sequence_id
        self._ordering_key = ordering_key
        #: The :class:`ConsumerRef` that received this message (None for a message built elsewhere).
        self.consumer = consumer

    def data(self) -> bytes:
        """The payload."""
        return self._data

    def has_null_value(self) -> bool:
        """True for a null-value message (a tombstone, ``producer.send(None)``); its payload is ``b""``."""
        return type(self._data) is NullPayload

    def value(self) -> Any:
        """The payload decoded by the receiving consumer's ``schema`` (the bytes when it has none)."""
        schema = getattr(getattr(self.consumer, "conf", None), "schema", None)
        if schema is None:
            return self._data
        version = getattr(self, "raw_schema_version", None)
        return schema.decode(self._data) if version is None else schema.decode_version(self._data, self._topic, version)

    def schema_version(self) -> str:
        """The version of the topic's schema the message was written with, as ``pulsar.Message.schema_version``:
        the broker's 8 version bytes as a ``str`` (``"\x00" * 8`` for the first), ``""`` for a message
        written without a schema. Bytes above 0x7f come back as surrogate escapes
        (``.encode("utf-8", "surrogateescape")`` gives the wire bytes back)."""
        version = getattr(self, "raw_schema_version", None)
        return "" if version is None else version.decode("utf-8", "surrogateescape")

    def properties(self) -> dict[str, str]:
        """Application properties."""
        p = self._properties
        if p is None:  # none were sent: the dict is made on first use
            p = self._properties = {}
        return p

    def message_id(self) -> MessageId:
        """Where the message is stored."""
        return self._id

    def topic_name(self) -> str:
        """The topic (partition) the message came from."""
        return self._topic

    def partition_key(self) -> str:
        """The key, or ``""`` if none was set (as in the official client)."""
        return self._key or ""

    def has_partition_key(self) -> bool:
        """True if the producer set a key (:meth:`partition_key` is ``""`` for none and for an empty one)."""
        return self._key is not None

    def ordering_key(self) -> str:
        """The ordering key (``""`` if none was set), as in the official client; not the partition key.

        The wire field is bytes: a key that is not UTF-8 comes back with its bytes kept as
        surrogate escapes (``key.encode("utf-8", "surrogateescape")`` gives them back)."""
        okey = self._ordering_key
        return okey.decode("utf-8", "surrogateescape") if okey else ""

    def publish_timestamp(self) -> int:
        """Broker publish time, ms since the epoch."""
        return self._publish_ts

    def event_timestamp(self) -> int:
        """Application event time in ms, 0 if unset."""
        return self._event_ts

    def redelivery_count(self) -> int:
        """How many times the broker redelivered this message."""
        return self._redelivery

    def producer_name(self) -> str:
        """Name of the producer that wrote it."""
        return self._producer

    def sequence_id(self) -> int:
        """The producer's sequence id of this message."""
        return self._sequence_id

    def txn_id(self) -> TxnID | None:
        """The transaction the message was produced in (None: outside any, or not known)."""
        return None

    def encryption_context(self) -> EncryptionContext | None:
        """How the message was encrypted, a :class:`txn.EncryptionContext` (None: it was not), as
        ``pulsar.Message.encryption_context``."""
        return getattr(self, "encryption", None)

    def __repr__(self) -> str:
        return f"Message(topic={self._topic!r}, id={self.message_id()}, {len(self._data)} bytes)"


class ReceivedMessage(Message):
    """A message built by a consumer: its :class:`MessageId` is made on first use.

    ``entry`` is ``(ledger, entry, partition, batch_size)``, shared by every message of
    one stored entry; it is also the key the consumer tracks batch acks under. ``batch_index``
    is the message's index in that entry (-1 when not batched). ``encryption``, set only on an
    encrypted message, is its :class:`txn.EncryptionContext`; ``raw_schema_version``, set only on a
    message written with a schema, is the metadata's version bytes (see :meth:`schema_version`).
    """

    __slots__ = ("entry", "batch_index", "_txn", "raw_schema_version", "encryption")

    def __init__(
        self,
        data: bytes,
        properties: dict[str, str] | None,
        entry: tuple[int, int, int, int],
        index: int,
        topic: str,
        partition_key: str | None,
        publish_timestamp: int,
        event_timestamp: int,
        redelivery_count: int,
        producer_name: str,
        sequence_id: int,
        consumer: ConsumerRef | None,
        txn: TxnID | None = None,
        ordering_key: bytes | None = None,
    ) -> None:
        # Message.__init__'s assignments, inline: this runs once per received message.
        self._data = data
        self._properties = properties  # None: no properties (properties() makes the dict on first use)
        self._id = None  # type: ignore[assignment]  # made on first use by message_id()
        self._topic = topic
        self._key = partition_key
        self._publish_ts = publish_timestamp
        self._event_ts = event_timestamp
        self._redelivery = redelivery_count
        self._producer = producer_name
        self._sequence_id = sequence_id
        self._ordering_key = ordering_key
        self.consumer = consumer
        self.entry = entry
        self.batch_index = index
        self._txn = txn

    def txn_id(self) -> TxnID | None:
        """The transaction the message was produced in, from the broker's stored metadata (None:
        produced outside any transaction). Only a committed transaction's messages are delivered."""
        return self._txn

    def message_id(self) -> MessageId:
        """Where the message is stored."""
        mid = self._id
        if mid is None:
            ledger, entry, partition, size = self.entry
            mid = self._id = MessageId(partition, ledger, entry, self.batch_index, batch_size=size, topic=self._topic)
        return mid


def position(m: Message) -> tuple[str, int, int, int, int]:
    """``(topic, ledger, entry, partition, batch index)``: where ``m`` is stored, as a cheap
    hashable key (a received message's without building its :class:`MessageId`)."""
    if isinstance(m, ReceivedMessage):
        e = m.entry
        return (m.topic_name(), e[0], e[1], e[2], m.batch_index)
    mid = m.message_id()
    return (m.topic_name(), mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())


def id_text(m: Message) -> str:
    """``str(m.message_id())``, the form ledger records list inputs in (without building the id
    of a received message)."""
    if isinstance(m, ReceivedMessage):
        e = m.entry
        return _id_str(e[0], e[1], e[2], m.batch_index)
    return str(m.message_id())


def _id_str(ledger: int, entry: int, partition: int, batch: int) -> str:
    """A message id's text, ``(ledger,entry,partition,batch_index)``: what ``str(MessageId)`` gives."""
    return f"({ledger},{entry},{partition},{batch})"
