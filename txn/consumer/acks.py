"""Acknowledgements: grouped plain acks, batch-index tracking, transactional acks (their wire ids),
negative acks and redelivery."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from ..connection import Connection, check_error, command, next_request_id
from ..context import ClientContext
from ..errors import AlreadyClosed, ConnectError, from_server_error
from ..message import Message, MessageId, ReceivedMessage
from ..protocol import pb
from .chunks import ChunkMessageId, wire_entries
from .config import ConsumerConfig, ConsumerType
from .parent import ConsumerParent

if TYPE_CHECKING:
    from ..transaction import AsyncTransaction

T = pb.BaseCommand

#: Message ids per transactional ACK command (each may carry a batch-index bitset).
TXN_ACK_CHUNK = 4096


def _ack_set_words(n: int, acked: list[int], acked_upto: int | None = None) -> list[int]:
    """Java ``BitSet.toLongArray`` of the *unacked* indexes of an ``n``-message batch."""
    bits = (1 << n) - 1
    for i in acked:
        bits &= ~(1 << i)
    if acked_upto is not None:
        bits &= ~((1 << (acked_upto + 1)) - 1)
    words = []
    while bits:
        w = bits & 0xFFFFFFFFFFFFFFFF
        words.append(w - (1 << 64) if w >= 1 << 63 else w)
        bits >>= 64
    return words


def _txn_ack_ids(mids: list[MessageId], cumulative: bool) -> list[pb.MessageIdData]:
    """Wire ids for a transactional ACK.

    Individual acks of several messages of one batch entry become one id whose ack set
    clears all of them (the broker reads it as those batch indexes), so a batch of inputs
    costs the broker one position per entry rather than one per message.
    """
    ids: list[pb.MessageIdData] = []
    if cumulative:
        for mid in mids:
            d = pb.MessageIdData(ledgerId=mid.ledger_id(), entryId=mid.entry_id())
            if mid.batch_index() >= 0 and mid.batch_size > 0:
                d.ack_set.extend(_ack_set_words(mid.batch_size, [], acked_upto=mid.batch_index()))
                d.batch_size = mid.batch_size
            ids.append(d)
        return ids
    entries: dict[tuple[int, int], tuple[int, list[int]]] = {}
    for mid in mids:
        if mid.batch_index() >= 0 and mid.batch_size > 0:
            key = (mid.ledger_id(), mid.entry_id())
            e = entries.get(key)
            if e is None:
                entries[key] = (mid.batch_size, [mid.batch_index()])
            else:
                e[1].append(mid.batch_index())
        else:
            ids.append(pb.MessageIdData(ledgerId=mid.ledger_id(), entryId=mid.entry_id()))
    for (ledger, entry), (size, indexes) in entries.items():
        d = pb.MessageIdData(ledgerId=ledger, entryId=entry, batch_size=size)
        d.ack_set.extend(_ack_set_words(size, indexes))
        ids.append(d)
    return ids


def _split_by_entry(mids: list[MessageId]) -> tuple[list[MessageId], list[list[MessageId]]]:
    """(ids of whole entries, the ids of each partly acknowledged batch entry): how
    :meth:`AsyncConsumer.acknowledge_many` lays out its transactional ACK commands.

    A whole entry (an unbatched message, or every message of a batch entry) is fully deleted once
    committed, which the broker's cursor persists itself: whole entries may share a command. A
    partly acknowledged entry goes alone, so that no fully deleted position can make the broker
    skip its command when it replays the pending-ack log.
    """
    whole: list[MessageId] = []
    entries: dict[tuple[int, int], list[MessageId]] = {}
    for mid in mids:
        if mid.batch_index() >= 0 and mid.batch_size > 0:
            entries.setdefault((mid.ledger_id(), mid.entry_id()), []).append(mid)
        else:
            whole.append(mid)
    partial = []
    for ids in entries.values():
        if len({m.batch_index() for m in ids}) == ids[0].batch_size:
            whole.extend(ids)
        else:
            partial.append(ids)
    return whole, partial


class AckTracker:
    """Part of :class:`~.topic_consumer.TopicConsumer`: acknowledgements and redelivery.

    Plain acks are queued (thread-safe) and sent grouped; batch-index acks are tracked per entry
    until the entry is acknowledged whole; transactional acks wait for the broker; negative acks
    and aborted transactions ask for redelivery (returning permits through the flow's ``_skip``).
    """

    parent: ConsumerParent
    ctx: ClientContext
    conf: ConsumerConfig
    topic: str
    consumer_id: int
    ready: asyncio.Event
    _conn: Connection | None
    _closed: bool
    _epoch: int
    stale_entries: set[tuple[int, int]]
    skipped_after_redeliver: bool
    _ack_inbox: deque[tuple[Message | MessageId, bool]]
    _batch_unacked: dict[tuple[int, int, int, int], set[int]]
    _nacks: dict[MessageId, float]

    # --------------------------------------------------------------------- acks

    def ack_local(self, item: Message | MessageId, cumulative: bool) -> None:
        """Queue a non-transactional ack (thread-safe); sent within ``ack_grouping_time_ms``."""
        if self._closed:
            raise AlreadyClosed("consumer is closed", topic=self.topic)
        self._ack_inbox.append((item, cumulative))
        unacked = self.parent.unacked
        if unacked is not None:
            if cumulative:
                unacked.remove_until(self, item)
            else:
                unacked.remove(self, item)

    def flush_acks(self) -> None:
        """Send queued acks now (event-loop thread)."""
        inbox = self._ack_inbox
        if not inbox:
            return
        individual: list[pb.MessageIdData] = []
        cumulative: MessageId | None = None
        pending = self._batch_unacked
        nacks = self._nacks
        last_key: tuple[int, int, int, int] | None = None
        rest: set[int] = set()
        while inbox:
            item, cum = inbox.popleft()
            if type(item) is ReceivedMessage:  # the common case: no MessageId is built
                key = item.entry
                index = item.batch_index
                mid = item.message_id() if nacks or cum else None
            else:
                mid = item.message_id() if isinstance(item, Message) else item
                key = (mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_size)
                index = mid.batch_index()
                if isinstance(mid, ChunkMessageId) and not cum:  # every chunk but the last, here
                    individual.extend(pb.MessageIdData(ledgerId=c.ledger_id(), entryId=c.entry_id())
                                      for c in mid.chunk_ids[:-1])
            if nacks:
                nacks.pop(mid, None)
            if cum:
                cumulative = mid if cumulative is None or mid > cumulative else cumulative
                continue
            if index >= 0 and key[3] > 1:
                if key is not last_key:  # consecutive acks usually share an entry
                    last_key = key
                    rest = pending.get(key)
                    if rest is None:
                        rest = pending[key] = set(range(key[3]))
                rest.discard(index)
                if rest:
                    continue
                del pending[key]
                last_key = None
            individual.append(pb.MessageIdData(ledgerId=key[0], entryId=key[1]))
        conn = self._conn
        if conn is None or conn.closed:
            return  # unacked messages are redelivered after the resubscribe
        try:
            if individual:
                conn.send_command(command(T.ACK, consumer_id=self.consumer_id, ack_type=0, message_id=individual))
            if cumulative is not None:
                target = self._cumulative_target(cumulative)
                if target is not None:
                    conn.send_command(command(T.ACK, consumer_id=self.consumer_id, ack_type=1,
                                              message_id=[target]))
        except ConnectError:
            pass

    def _cumulative_target(self, mid: MessageId) -> pb.MessageIdData | None:
        if mid.batch_index() >= 0 and mid.batch_index() < mid.batch_size - 1:
            # Not the last message of its batch: acknowledge up to the previous entry.
            if mid.entry_id() == 0:
                return None
            return pb.MessageIdData(ledgerId=mid.ledger_id(), entryId=mid.entry_id() - 1)
        for key in [k for k in self._batch_unacked if (k[0], k[1]) <= (mid.ledger_id(), mid.entry_id())]:
            del self._batch_unacked[key]
        return pb.MessageIdData(ledgerId=mid.ledger_id(), entryId=mid.entry_id())

    async def ack_txn(self, mids: list[MessageId], txn: AsyncTransaction, cumulative: bool) -> None:
        """Acknowledge inside ``txn``; waits for the broker's ack response."""
        txn.check_open()
        await txn.register_subscription(self.topic, self.conf.subscription_name)
        if not self.ready.is_set():
            try:
                await asyncio.wait_for(self.ready.wait(), self.ctx.operation_timeout)
            except TimeoutError:
                raise ConnectError("consumer is not connected", topic=self.topic, txn_id=txn.id) from None
        conn = self._conn
        if conn is None:
            raise ConnectError("consumer is not connected", topic=self.topic, txn_id=txn.id)
        ids = _txn_ack_ids(mids if cumulative else wire_entries(mids), cumulative)
        rid = next_request_id()
        resp = await conn.request(
            command(
                T.ACK,
                consumer_id=self.consumer_id,
                ack_type=1 if cumulative else 0,
                message_id=ids,
                txnid_most_bits=txn.id.most,
                txnid_least_bits=txn.id.least,
                request_id=rid,
            ),
            rid,
        )
        check_error(resp, "transactional ack", topic=self.topic, txn_id=txn.id)
        r = resp.ackResponse
        if r.HasField("error"):
            raise from_server_error(
                pb.ServerError.Name(r.error), f"transactional ack failed: {r.message}", topic=self.topic,
                txn_id=txn.id,
            )
        unacked = self.parent.unacked
        for mid in mids:
            self._nacks.pop(mid, None)
            if unacked is not None:
                unacked.remove(self, mid)

    # ---------------------------------------------------------------- redelivery

    def nack(self, mid: MessageId) -> None:
        """Ask for redelivery of ``mid`` after the negative-ack delay (event-loop thread)."""
        self._nacks[mid] = time.monotonic() + self.conf.negative_ack_redelivery_delay_ms / 1000.0
        if self.parent.unacked is not None:
            self.parent.unacked.remove(self, mid)

    def process_nacks(self) -> None:
        if not self._nacks:
            return
        now = time.monotonic()
        due = [m for m, t in self._nacks.items() if t <= now]
        if not due:
            return
        for m in due:
            del self._nacks[m]
        self.redeliver(due)

    def redeliver(self, mids: list[MessageId] | None) -> None:
        """Ask the broker to send ``mids`` again (all unacked if ``None`` or not Shared)."""
        conn = self._conn
        if conn is None or conn.closed:
            return  # a resubscribe redelivers everything unacked anyway
        shared = self.conf.consumer_type in (ConsumerType.Shared, ConsumerType.KeyShared)
        try:
            if shared and mids:
                entries = {(m.ledger_id(), m.entry_id()) for m in wire_entries(mids, getattr(self, "chunks", None))}
                conn.send_command(
                    command(
                        T.REDELIVER_UNACKNOWLEDGED_MESSAGES,
                        consumer_id=self.consumer_id,
                        message_ids=[pb.MessageIdData(ledgerId=lg, entryId=e) for lg, e in sorted(entries)],
                    )
                )
                return
            self._epoch += 1
            self.stale_entries.clear()
            self.skipped_after_redeliver = False
            if self.parent.unacked is not None:
                self.parent.unacked.clear(self)
            removed = self.parent.receive_queue.remove_where(lambda m: m.consumer is self)
            conn.send_command(
                command(T.REDELIVER_UNACKNOWLEDGED_MESSAGES, consumer_id=self.consumer_id,
                        consumer_epoch=self._epoch)
            )
            # The permits of the dropped messages go back after the request, not before: a FLOW
            # ahead of it lets the broker start a read that the request then crosses, and Pulsar
            # 4.0.8 can move the read position past what that read dispatched with the old epoch
            # (``MessageFlow._check_skipped``), which takes another redelivery to recover.
            if removed:
                self._skip(removed)
        except ConnectError:
            pass

    def redeliver_after_abort(self, mids: list[MessageId], cumulative: bool) -> None:
        """Hand back messages whose transactional acks were aborted."""
        self.redeliver(None if cumulative else mids)
