"""Ordering guard ("must follow"): hold a message until the message it must follow was committed.

A message names its own business id (property :data:`BUSINESS_ID`, ``pulsar-txn.id``) and the
business id of the message it must follow (property :data:`MUST_FOLLOW`,
``pulsar-txn.must-follow``), or a ``key`` function returns both. A message whose predecessor is
not known to be committed is *held*: kept in memory, not acknowledged, not handed to the
handler. It is released as soon as the predecessor commits (here or in another instance sharing
the scope and store), and parked once a bound is hit:

- ``max_hold_ms``: it waited that long (a follower of a message that is itself held waits for
  that one's fate instead, up to twice the bound);
- ``max_held``: holding one more would exceed the limit, so the oldest held message is parked;
- its predecessor was parked: the follower is parked too (a chain never skips a link).

Nothing held is acknowledged, so a crash loses nothing: the broker redelivers held messages
and the new instance holds them again. Messages without a must-follow pass straight through.

**State.** The business ids that committed (``done``) or were parked (``parked``) are kept in
the dedup receiver's stores (SQLite or PostgreSQL, :mod:`.dedup_store`), per ``scope``; at most
``window`` of them, oldest evicted first. A predecessor evicted from the window counts as
unknown, so its late followers are held and parked: size ``window`` above the number of
business ids that can commit between a message and its follower.

**Processor.** The processor marks a batch's business ids ``pending`` in its transaction before
the commit (with the position of the batch's ``COMMITTED`` ledger record), ``done`` after it,
and drops the marks after a confirmed abort. Pending marks left by a crash (or by another
instance) are settled once their transaction must have ended (marked ``txn_timeout_ms`` + 5 s
ago): every 30 s, and at once when a held message waits for one. All marks of a transaction
become ``done`` if its ledger record is readable (read-committed: it committed), and are dropped
if a reader passes the record's position without it (aborted: the inputs come back). A follower
whose predecessor is in the same batch, earlier, is ready: they commit together, in order;
held followers of a message join its batch right after it. The guard's state belongs to one
processor; give instances that share a subscription the same store and scope.

**Dedup receiver.** The done mark is written in the same database transaction as the handler's
effect, so it is exact. Parking there stores the message and the reason in the database table
``txn_order_parked`` in one transaction with its dedup record, then acknowledges it
(:meth:`~.dedup_store.DedupStore.parked_messages` lists them); ``on_park`` is called too.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import PulsarError, Timeout
from ..message import Message, MessageId
from .dedup_store import DedupStore, OrderState, open_store

if TYPE_CHECKING:
    from ..client import AsyncClient
    from ..producer import AsyncProducer


class _HostConfig(Protocol):
    job: str
    txn_timeout_ms: int


class _HostStats(Protocol):
    parked: int


class OrderingHost(Protocol):
    """What the guard uses of the processor that runs it (:class:`~txn.delivery.processor.AsyncProcessor`).

    Defined here so that the processor depends on the guard and never the reverse: its job and
    transaction timeout, its parked count, its client (to read ledger records) and its parking.
    """

    client: AsyncClient
    config: _HostConfig
    stats: _HostStats

    async def park_message(self, m: Message, why: BaseException, batch_id: str) -> None:
        """Park ``m`` (acknowledged from its input and produced to the parking topic, atomically)."""
        ...

#: The message's own business id.
BUSINESS_ID = "pulsar-txn.id"
#: The business id of the message this one must follow.
MUST_FOLLOW = "pulsar-txn.must-follow"
#: Longest business id accepted; a longer one parks its message.
MAX_ID_LENGTH = 512
#: After a transaction's timeout plus this margin, its outcome is final.
_RESOLVE_MARGIN_S = 5.0
#: How often the processor's guard settles pending marks left by crashed instances.
_SWEEP_INTERVAL_S = 30.0

KeyFn = Callable[[Message], tuple[str | None, str | None]]


class OutOfOrder(Exception):
    """A message was parked because the message it must follow did not commit in time."""

    def __init__(self, reason: str, business_id: str | None, must_follow: str | None, topic: str,
                 message_id: str) -> None:
        super().__init__(f"{reason} (topic {topic}, message {message_id})")
        self.reason = reason
        self.business_id = business_id
        self.must_follow = must_follow
        self.topic = topic
        self.message_id = message_id


@dataclass(slots=True)
class _Held:
    message: Message
    bid: str | None
    pred: str
    since: float


def property_key(id_property: str = BUSINESS_ID, must_follow_property: str = MUST_FOLLOW) -> KeyFn:
    """A ``key`` function reading (business id, must-follow) from two message properties."""

    def key(msg: Message) -> tuple[str | None, str | None]:
        props = msg.properties()
        return props.get(id_property) or None, props.get(must_follow_property) or None

    return key


def _mkey(msg: Message) -> tuple[str, MessageId]:
    return msg.topic_name(), msg.message_id()


class OrderingGuard:
    """Holds followers until their predecessor commits; see the module docs.

    ``store``: a :class:`DedupStore` or a target for :func:`open_store` (the guard then owns it);
    with a dedup receiver it may be None (the receiver's store is used). ``scope`` separates
    independent guards in one database (default: the processor's job or the receiver's scope).
    """

    def __init__(
        self,
        store: DedupStore | str | os.PathLike[str] | None = None,
        scope: str | None = None,
        *,
        key: KeyFn | None = None,
        max_held: int = 1000,
        max_hold_ms: int = 120_000,
        window: int = 100_000,
        poll_interval_ms: int = 200,
    ) -> None:
        if max_held < 1 or max_hold_ms < 1 or window < 1 or poll_interval_ms < 1:
            raise ValueError("max_held, max_hold_ms, window and poll_interval_ms must be positive")
        self._owns_store = store is not None and not isinstance(store, DedupStore)
        self.store: DedupStore | None = open_store(store) if self._owns_store else store  # type: ignore[arg-type]
        self.scope = scope
        self.key = key or property_key()
        self.max_held = max_held
        self.max_hold_ms = max_hold_ms
        self.window = window
        self.poll_interval_ms = poll_interval_ms
        self._lock = threading.RLock()
        self._db_lock = threading.Lock()
        self._held: OrderedDict[tuple[str, MessageId], _Held] = OrderedDict()
        self._waiting: dict[str, list[tuple[str, MessageId]]] = {}
        self._ready: deque[Message] = deque()
        self._parks: deque[tuple[Message, OutOfOrder]] = deque()
        self._own: dict[str, str] = {}  # business id -> txn id of our own pending marks
        self._last_poll = 0.0
        self._retry_at: dict[str, float] = {}
        self._next_sweep = 0.0
        self._txn_timeout_s = 60.0
        self.parked_count = 0

    # ------------------------------------------------------------------ set-up

    def attach(self, store: DedupStore | None, scope: str) -> None:
        """Fill in the store and scope an integration provides, unless given explicitly."""
        if self.store is None:
            if store is None:
                raise ValueError("the ordering guard needs a store (a DedupStore, SQLite path or PostgreSQL URL)")
            self.store = store
        if self.scope is None:
            self.scope = scope

    def close(self) -> None:
        """Close the store if the guard opened it."""
        if self._owns_store and self.store is not None:
            self.store.close()

    @property
    def holding(self) -> int:
        """How many messages are held now."""
        return len(self._held)

    def held_ids(self) -> list[str | None]:
        """Business ids of the held messages, oldest first."""
        with self._lock:
            return [h.bid for h in self._held.values()]

    def _db(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a store transaction of its own, one at a time (the processor calls
        the guard from worker threads; the store has one connection)."""
        store, _ = self._st()
        with self._db_lock:
            return store.run(fn, *args)

    def _st(self) -> tuple[DedupStore, str]:
        assert self.store is not None and self.scope is not None, "attach() the guard first"
        return self.store, self.scope

    # ------------------------------------------------------------- decisions

    def ids(self, msg: Message) -> tuple[str | None, str | None]:
        """(business id, must-follow) of ``msg``."""
        return self.key(msg)

    def _violation(self, h: _Held, reason: str) -> OutOfOrder:
        return OutOfOrder(reason, h.bid, h.pred, h.message.topic_name(), str(h.message.message_id()))

    def _too_long(self, msg: Message, bid: str | None, pred: str | None) -> OutOfOrder | None:
        if (bid and len(bid) > MAX_ID_LENGTH) or (pred and len(pred) > MAX_ID_LENGTH):
            return OutOfOrder(f"business id longer than {MAX_ID_LENGTH} characters", None, None, msg.topic_name(),
                              str(msg.message_id()))
        return None

    def _hold(self, msg: Message, bid: str | None, pred: str, now: float) -> None:
        """Hold ``msg``; at the ``max_held`` limit park the oldest held message first."""
        k = _mkey(msg)
        if k in self._held:
            return  # a redelivered copy of a message already held
        while len(self._held) >= self.max_held:
            ok, old = self._held.popitem(last=False)
            self._unwait(old.pred, ok)
            self._parks.append((old.message, self._violation(
                old, f"message {old.bid} must follow {old.pred}: held-message limit {self.max_held} reached")))
        self._held[k] = _Held(msg, bid, pred, now)
        self._waiting.setdefault(pred, []).append(k)

    def _unwait(self, pred: str, k: tuple[str, MessageId]) -> None:
        ks = self._waiting.get(pred)
        if ks and k in ks:
            ks.remove(k)
            if not ks:
                del self._waiting[pred]

    def _release(self, bid: str) -> list[Message]:
        """Take the followers waiting for ``bid`` out of the held set."""
        out = []
        for k in self._waiting.pop(bid, []):
            h = self._held.pop(k, None)
            if h is not None:
                out.append(h.message)
        return out

    def _cascade_parked(self, bid: str) -> None:
        """Followers of a parked message are parked too (and theirs, transitively)."""
        todo = [bid]
        while todo:
            b = todo.pop()
            for k in self._waiting.pop(b, []):
                h = self._held.pop(k, None)
                if h is not None:
                    self._parks.append((h.message, self._violation(
                        h, f"message {h.bid} must follow {h.pred}, which was parked")))
                    if h.bid:
                        todo.append(h.bid)

    def _expire(self, now: float) -> None:
        """Park held messages that waited ``max_hold_ms``. A follower of a held message waits for
        its predecessor's fate (released with it, or parked as its follower), up to twice the
        bound (so a cycle of must-follows cannot wait forever)."""
        limit = self.max_hold_ms / 1000.0
        held_bids = {h.bid for h in self._held.values() if h.bid}
        for k, h in list(self._held.items()):
            if now - h.since < limit:
                break  # held in arrival order: the rest are younger
            if h.pred in held_bids and now - h.since < 2 * limit:
                continue
            del self._held[k]
            self._unwait(h.pred, k)
            self._parks.append((h.message, self._violation(
                h, f"message {h.bid} must follow {h.pred}, which was not committed within {self.max_hold_ms} ms")))

    def _apply_states(self, states: dict[str, OrderState]) -> None:
        for bid, st in states.items():
            if st.state == "done":
                self._ready.extend(self._release(bid))
            elif st.state == "parked":
                self._cascade_parked(bid)

    def _poll(self, now: float, force: bool = False) -> dict[str, OrderState]:
        """Look the held messages' predecessors up in the store (at most every ``poll_interval_ms``)."""
        if not self._waiting or (not force and (now - self._last_poll) * 1000 < self.poll_interval_ms):
            return {}
        self._last_poll = now
        store, scope = self._st()
        states = self._db(store.order_states, scope, list(self._waiting))
        self._apply_states(states)
        return states

    # ------------------------------------------------- the dedup receiver's side

    def next_action(self) -> tuple[Message, OutOfOrder | None] | None:
        """A released message to process (None reason) or one to park; polls and expires first."""
        with self._lock:
            now = time.monotonic()
            if not self._ready and not self._parks:
                self._poll(now)
                self._expire(now)
            if self._parks:
                return self._parks.popleft()
            if self._ready:
                return self._ready.popleft(), None
            return None

    def wait_cap_ms(self, timeout_millis: int | None) -> int | None:
        """A receive timeout that wakes up in time to poll and expire held messages."""
        if not self._held:
            return timeout_millis
        return self.poll_interval_ms if timeout_millis is None else min(timeout_millis, self.poll_interval_ms)

    def check_in_txn(self, msg: Message) -> OutOfOrder | bool:
        """Inside the caller's store transaction: True if ``msg`` may be processed now, False if it
        must be held (call :meth:`hold` after the rollback), or the reason to park it."""
        bid, pred = self.key(msg)
        bad = self._too_long(msg, bid, pred)
        if bad is not None:
            return bad
        if pred is None:
            return True
        store, scope = self._st()
        st = store.order_states(scope, [pred]).get(pred)
        if st is not None and st.state == "done":
            return True
        if st is not None and st.state == "parked":
            return OutOfOrder(f"message {bid} must follow {pred}, which was parked", bid, pred, msg.topic_name(),
                              str(msg.message_id()))
        return False

    def hold(self, msg: Message) -> None:
        """Hold ``msg`` (its predecessor is not committed yet)."""
        bid, pred = self.key(msg)
        assert pred is not None
        with self._lock:
            self._hold(msg, bid, pred, time.monotonic())

    def mark_in_txn(self, msg: Message, state: str) -> None:
        """Inside the caller's store transaction: record ``msg``'s business id as done or parked."""
        bid, _ = self.key(msg)
        if bid:
            store, scope = self._st()
            store.order_mark(scope, [bid], state, self.window, time.time())

    def after_commit(self, msg: Message, state: str) -> None:
        """After the store committed ``msg`` as done/parked: release (or park) its held followers."""
        bid, _ = self.key(msg)
        if not bid:
            return
        with self._lock:
            if state == "done":
                self._ready.extend(self._release(bid))
            else:
                self._cascade_parked(bid)

    # ---------------------------------------------------------- the processor's side

    def _admit(self, incoming: list[Message]) -> tuple[list[Message], list[str]]:
        """Order a collected batch: (messages to process now, in order; foreign pending
        predecessors old enough to resolve). Held and parked messages stay in the guard."""
        store, scope = self._st()
        now = time.monotonic()
        with self._lock:
            keyed: list[tuple[Message, str | None, str | None, bool]] = []
            for m in incoming:
                bid, pred = self.key(m)
                bad = self._too_long(m, bid, pred)
                if bad is not None:
                    self._parks.append((m, bad))
                elif _mkey(m) not in self._held:  # else: a redelivered copy of a held message
                    keyed.append((m, bid, pred, False))
            wanted = {p for _, _, p, _ in keyed if p}
            if self._waiting and (now - self._last_poll) * 1000 >= self.poll_interval_ms:
                wanted |= set(self._waiting)
                self._last_poll = now
            states = self._db(store.order_states, scope, sorted(wanted)) if wanted else {}
            self._apply_states({b: s for b, s in states.items() if b in self._waiting})
            keyed = [(m, *self.key(m), True) for m in self._ready] + keyed  # released ones first: ready
            self._ready.clear()
            batch: list[Message] = []
            in_batch: set[str] = set()
            taken: set[tuple[str, MessageId]] = set()

            def take(m: Message, bid: str | None) -> None:
                if _mkey(m) in taken:
                    return
                taken.add(_mkey(m))
                batch.append(m)
                if bid:
                    in_batch.add(bid)
                    for f in self._release(bid):  # its held followers join the batch right after it
                        take(f, self.key(f)[0])

            for m, bid, pred, released in keyed:
                st = states.get(pred) if pred else None
                if released or pred is None or pred in in_batch or (st is not None and st.state == "done"):
                    take(m, bid)
                elif st is not None and st.state == "parked":
                    self._parks.append((m, OutOfOrder(f"message {bid} must follow {pred}, which was parked", bid,
                                                      pred, m.topic_name(), str(m.message_id()))))
                elif _mkey(m) not in taken:
                    self._hold(m, bid, pred, now)
            self._expire(now)
            cutoff = time.time() - self._txn_timeout_s - _RESOLVE_MARGIN_S
            pending = []
            for b in self._waiting:
                s = states.get(b)
                if (s is not None and s.state == "pending" and b not in self._own and s.at < cutoff
                        and self._retry_at.get(b, 0.0) <= now):  # a crashed (or other) instance's
                    pending.append(b)
                    self._retry_at[b] = now + _RESOLVE_MARGIN_S
            return batch, pending

    async def gate(self, proc: OrderingHost, batch: list[Message]) -> list[Message]:
        """The processor's hook after collecting a batch: returns what to process now, in order;
        holds the rest; parks what hit a bound (through the processor's parking)."""
        self.attach(None, proc.config.job)
        self._txn_timeout_s = proc.config.txn_timeout_ms / 1000.0
        pending: list[str] = []
        if batch or self._held or self._ready or self._parks:
            batch, pending = await asyncio.to_thread(self._admit, batch)
        now = time.monotonic()
        if pending or now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_INTERVAL_S
            resolved = await self._sweep(proc)
            with self._lock:
                self._apply_states(resolved)  # released followers go into the next batch
        while self._parks:
            m, why = self._parks.popleft()
            before = proc.stats.parked
            await proc.park_message(m, why, f"{proc.config.job}:ordering")
            if proc.stats.parked > before:  # the processor's parking called on_parked
                self.parked_count += 1
        return batch

    async def _sweep(self, proc: OrderingHost) -> dict[str, OrderState]:
        """Settle pending marks of transactions that must have ended (crashed instances): all
        marks of a transaction become done if its COMMITTED ledger record is readable, else go."""
        store, scope = self._st()
        cutoff = time.time() - self._txn_timeout_s - _RESOLVE_MARGIN_S
        rows = await asyncio.to_thread(self._db, store.order_stale_pending, scope, cutoff, 1000)
        own = set(self._own.values())
        by_txn: dict[tuple[str, str], list[str]] = {}
        for bid, st in rows.items():
            if st.txn and st.ref and st.txn not in own:
                by_txn.setdefault((st.txn, st.ref), []).append(bid)
        out: dict[str, OrderState] = {}
        for (txn_id, ref), bids in by_txn.items():
            committed = await _record_committed(proc, ref)
            if committed is None:
                continue  # not told yet: try again at the next sweep
            await asyncio.to_thread(self._db, store.order_settle, scope, txn_id, committed)
            if committed:
                out.update({b: OrderState("done") for b in bids})
        return out

    async def prepare(self, msgs: list[Message], txn_id: Any, ledger: AsyncProducer, record_id: MessageId) -> None:
        """Before the commit: mark the batch's business ids pending in ``txn_id``, with where its
        COMMITTED record (sent by ``ledger``, receipt ``record_id``) is, to settle it after a crash."""
        bids = [b for m in msgs if (b := self.key(m)[0])]
        if not bids:
            return
        parts = ledger.partition_topics()
        p = record_id.partition()
        ref = record_ref(parts[p] if 0 <= p < len(parts) else parts[0], record_id)
        for b in bids:
            self._own[b] = str(txn_id)
        store, scope = self._st()
        await asyncio.to_thread(self._db, store.order_mark, scope, bids, "pending", self.window, time.time(),
                                str(txn_id), ref)

    async def committed(self, msgs: list[Message]) -> None:
        """After the commit: mark the batch's business ids done and release their followers."""
        bids = [b for m in msgs if (b := self.key(m)[0])]
        if not bids:
            return
        store, scope = self._st()
        await asyncio.to_thread(self._db, store.order_mark, scope, bids, "done", self.window, time.time())
        with self._lock:
            for b in bids:
                self._own.pop(b, None)
                self._ready.extend(self._release(b))

    async def aborted(self, msgs: list[Message], txn_id: Any) -> None:
        """After an abort: drop the batch's pending marks (its inputs come back)."""
        bids = [b for m in msgs if (b := self.key(m)[0])]
        if not bids:
            return
        store, scope = self._st()
        await asyncio.to_thread(self._db, store.order_clear_pending, scope, bids, str(txn_id))
        for b in bids:
            self._own.pop(b, None)

    async def on_parked(self, msg: Message) -> None:
        """After the processor parked ``msg``: record its business id parked; park its followers."""
        bid = self.key(msg)[0]
        if not bid:
            return
        store, scope = self._st()
        await asyncio.to_thread(self._db, store.order_mark, scope, [bid], "parked", self.window, time.time())
        with self._lock:
            self._cascade_parked(bid)


def record_ref(topic: str, mid: MessageId) -> str:
    """Where a ledger record is: ``topic|ledger:entry:batch_index``."""
    return f"{topic}|{mid.ledger_id()}:{mid.entry_id()}:{mid.batch_index()}"


async def _record_committed(proc: OrderingHost, ref: str) -> bool | None:
    """True if the ledger record at ``ref`` is readable (its transaction committed), False if the
    reader passed its position without it (aborted), None if that could not be told yet."""
    topic, pos = ref.rsplit("|", 1)
    ledger_id, entry_id, _ = (int(x) for x in pos.split(":"))
    target = (ledger_id, entry_id)  # a batch entry holds one transaction's messages: compare entries
    try:
        start = MessageId(ledger_id=ledger_id, entry_id=entry_id)
        reader = await proc.client.create_reader(topic, start, start_message_id_inclusive=True)
    except PulsarError:
        return None
    try:
        while True:
            try:
                m = await reader.read_next(timeout_millis=5000)
            except Timeout:
                return None
            mid = m.message_id()
            got = (mid.ledger_id(), mid.entry_id())
            if got == target:
                return True
            if got > target:
                return False
    except PulsarError:
        return None
    finally:
        await reader.close()


__all__ = ["BUSINESS_ID", "MAX_ID_LENGTH", "MUST_FOLLOW", "OrderingGuard", "OutOfOrder", "property_key", "record_ref"]
