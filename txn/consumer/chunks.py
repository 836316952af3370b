"""Chunked messages: the consumer's reassembly of a message its producer split into chunks.

A producer with ``chunking_enabled`` stores a message larger than the broker's
``max_message_size`` as several entries, each carrying the message's ``uuid``, its ``chunk_id``,
``num_chunks_from_msg`` and ``total_chunk_msg_size``. :class:`ChunkBuffer` collects the chunks of
each uuid in order; the last one completes the message, handed out with a :class:`ChunkMessageId`
(the last chunk's position, holding every chunk's id: acknowledging it acknowledges every chunk
entry, a negative ack redelivers them all), as the official client does.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from ..message import ChunkMessageId, MessageId, ReceivedMessage
from ..protocol import pb

log = logging.getLogger("txn.consumer")
#: What a compressed chunked message may decompress to, unless the client's ``max_uncompressed_message_size``
#: says otherwise (a chunked message is larger than ``max_message_size``, the bound of other entries).
CHUNKED_MESSAGE_LIMIT = 1 << 30
#: How many completed chunked messages' ids :attr:`ChunkBuffer.completed` keeps.
COMPLETED_KEPT = 10000

__all__ = ["CHUNKED_MESSAGE_LIMIT", "ChunkBuffer", "ChunkMessageId", "ChunkedMessage", "entry_ids", "wire_entries"]


def entry_ids(mid: MessageId) -> list[MessageId]:
    """The entries ``mid`` stands for: every chunk of a chunked message, else ``mid`` itself."""
    return list(mid.chunk_ids) if isinstance(mid, ChunkMessageId) else [mid]


def wire_entries(mids: list[MessageId], buffer: ChunkBuffer | None = None) -> list[MessageId]:
    """``mids`` with each chunked message's id replaced by its chunks' ids; with ``buffer``, a plain
    id of a chunked message's last chunk (the ack timeout's) too."""
    if buffer is not None and buffer.completed:
        done = buffer.completed
        mids = [done.get((m.ledger_id(), m.entry_id()), m) if type(m) is MessageId else m for m in mids]
    if not any(isinstance(m, ChunkMessageId) for m in mids):
        return mids
    return [e for m in mids for e in entry_ids(m)]


class ChunkedMessage(ReceivedMessage):
    """A message reassembled from chunks; :meth:`message_id` is its :class:`ChunkMessageId`."""

    __slots__ = ()


@dataclass(slots=True)
class _Pending:
    """The chunks of one uuid received so far."""

    num_chunks: int
    total_size: int
    received_at: float
    ids: list[MessageId] = field(default_factory=list)
    parts: list[bytes] = field(default_factory=list)
    size: int = 0


@dataclass(slots=True)
class ChunkResult:
    """What :meth:`ChunkBuffer.add` made of a chunk: the whole payload and id when it completed a
    message, and the chunk entries to acknowledge (dropped chunks no message will hold)."""

    payload: bytes | None = None
    message_id: ChunkMessageId | None = None
    to_ack: list[MessageId] = field(default_factory=list)
    error: str | None = None


class ChunkBuffer:
    """Incomplete chunked messages of one topic consumer, by uuid, oldest first.

    At most ``max_pending`` uuids are kept (0: no limit); a new message beyond that drops the
    oldest, whose chunks are acknowledged if ``auto_ack_oldest`` and otherwise left unacknowledged
    (redelivered when the consumer reconnects or redelivers all). A message incomplete for
    ``expire_ms`` is dropped and its chunks acknowledged, as the official client does."""

    def __init__(self, max_pending: int = 10, auto_ack_oldest: bool = False, expire_ms: int = 60000) -> None:
        self.max_pending = max_pending
        self.auto_ack_oldest = auto_ack_oldest
        self.expire_ms = expire_ms
        self.pending: dict[str, _Pending] = {}
        #: the ids of the last chunked messages completed, by their last chunk's (ledger, entry): an
        #: ack timeout names that entry only, and redelivers every chunk through this
        self.completed: dict[tuple[int, int], ChunkMessageId] = {}

    def clear(self) -> None:
        """Forget every incomplete message (their chunks come again)."""
        self.pending.clear()

    def _expired(self, publish_time: int) -> bool:
        return self.expire_ms > 0 and time.time() * 1000 > publish_time + self.expire_ms

    def _expire(self, now: float, out: ChunkResult) -> None:
        if self.expire_ms <= 0:
            return
        limit = now - self.expire_ms / 1000.0
        for uuid in [u for u, p in self.pending.items() if p.received_at < limit]:
            log.info("dropping the incomplete chunked message %r: not completed within %d ms", uuid, self.expire_ms)
            out.to_ack.extend(self.pending.pop(uuid).ids)

    def add(self, mid: MessageId, meta: pb.MessageMetadata, payload: bytes) -> ChunkResult:
        """Take one chunk (``mid``: its entry's id, ``payload``: its bytes)."""
        out = ChunkResult()
        now = time.monotonic()
        self._expire(now, out)
        uuid, chunk_id, num = meta.uuid, meta.chunk_id, meta.num_chunks_from_msg
        ctx = self.pending.get(uuid)
        here = mid.entry_key
        if chunk_id == 0:
            if ctx is not None:
                if all(i.entry_key != here for i in ctx.ids):
                    out.to_ack.extend(ctx.ids)  # another message under this uuid: its chunks are lost
                del self.pending[uuid]
            if self.max_pending > 0:
                while len(self.pending) >= self.max_pending:
                    oldest = next(iter(self.pending))
                    dropped = self.pending.pop(oldest)
                    log.warning("dropping the incomplete chunked message %r: max_pending_chunked_message (%d) reached",
                                oldest, self.max_pending)
                    if self.auto_ack_oldest:
                        out.to_ack.extend(dropped.ids)
            ctx = self.pending[uuid] = _Pending(num, meta.total_chunk_msg_size, now)
        elif ctx is None:
            log.warning("chunk %d of %r at %s without its first chunk: dropped", chunk_id, uuid, mid)
            if self._expired(meta.publish_time):
                out.to_ack.append(mid)
            return out
        elif chunk_id != len(ctx.ids):
            if chunk_id < len(ctx.ids):  # a duplicate: ack it unless it is one of ours redelivered
                if all(i.entry_key != here for i in ctx.ids):
                    out.to_ack.append(mid)
                return out
            log.warning("chunk %d of %r at %s after chunk %d: the message is dropped", chunk_id, uuid, mid,
                        len(ctx.ids) - 1)
            del self.pending[uuid]
            if self._expired(meta.publish_time):
                out.to_ack.append(mid)
            return out
        ctx.ids.append(mid)
        ctx.parts.append(payload)
        ctx.size += len(payload)
        if ctx.size > ctx.total_size or num != ctx.num_chunks:
            del self.pending[uuid]
            out.error = (f"chunked message {uuid!r}: chunk {chunk_id} brings {ctx.size} bytes of a declared "
                         f"{ctx.total_size} in {ctx.num_chunks} chunks")
            return out
        if len(ctx.ids) < ctx.num_chunks:
            return out
        del self.pending[uuid]
        out.payload = b"".join(ctx.parts)
        out.message_id = ChunkMessageId(ctx.ids)
        self.completed[(mid.ledger_id(), mid.entry_id())] = out.message_id
        if len(self.completed) > COMPLETED_KEPT:
            del self.completed[next(iter(self.completed))]
        return out
