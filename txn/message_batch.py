"""``MessageBatch``: split a batch payload into messages by hand, as ``pulsar.MessageBatch``."""

from __future__ import annotations

from .message import Message, MessageId
from .protocol import split_batch


class MessageBatch:
    """The messages of one batched entry's payload.

    ``data`` is the entry's (uncompressed, unencrypted) payload after its ``MessageMetadata``:
    ``[u32 size][SingleMessageMetadata][payload]`` repeated, as a producer batches messages.
    Each message gets the id set by :meth:`with_message_id` with its index in the batch
    (ledger, entry and partition ``-1`` without one), no topic and publish time 0; properties,
    partition and ordering keys and event times come from its own metadata.
    """

    def __init__(self) -> None:
        self._id = MessageId()

    def with_message_id(self, msg_id: MessageId) -> MessageBatch:
        """Give the batch's messages ``msg_id``'s ledger, entry and partition."""
        if not isinstance(msg_id, MessageId):
            raise TypeError("unknown message id type")
        self._id = msg_id
        return self

    def parse_from(self, data: bytes, size: int) -> list[Message]:
        """The first ``size`` messages of ``data``. ``TypeError`` for arguments of other types (or a
        negative ``size``), :class:`~txn.errors.ProtocolError` if ``data`` holds fewer messages
        or is malformed."""
        if not isinstance(data, bytes) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise TypeError(f"parse_from() takes bytes and a non-negative int, not {type(data).__name__} and "
                            f"{size!r}")
        base = self._id
        ledger, entry, partition = base.ledger_id(), base.entry_id(), base.partition()
        out = []
        for i, (payload, seq, event_time, key, props, _compacted, okey) in enumerate(split_batch(data, size)):
            mid = MessageId(partition, ledger, entry, i, batch_size=size)
            out.append(Message(payload, dict(props or ()), mid, "", key, 0, event_time, 0, "",
                               -1 if seq is None else seq, None, okey))
        return out
