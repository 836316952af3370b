"""Partition fences: one owner per input partition, and a new owner fences the old one out.

Exactly-once with several instances of a job cannot rest on the broker refusing a second
transactional ack of a message (Pulsar 4.0.8 does not always refuse one for batch indexes), nor
on an instance checking that it still owns a partition before it commits (it can pause right
after the check). So every transaction that acknowledges inputs of a partition carries a proof
of ownership that the broker checks at the moment it accepts it, and a new owner can revoke:

* Each (subscription, input partition) has a **fence topic** next to the job's ledger. Its owner
  holds the topic's only producer, created in ``ExclusiveWithFencing`` mode: creating it makes
  the broker close the previous owner's producer and raise the topic's epoch, after which the
  old producer can never send again (a reconnect with its older epoch gets ``ProducerFenced``;
  see the producer's sender for why a reconnect asks for ``Exclusive`` mode).
* Every transaction that acknowledges inputs of a partition first sends, with that producer,
  an *intent* (outside the transaction, naming it) and a *marker* inside it, and only then
  acknowledges (:meth:`PartitionFences.mark`). A fenced owner's marker fails, so its transaction
  fails to commit; nothing of it becomes visible.
* A new owner (:meth:`PartitionFences.acquire`) takes the producer, writes a *claim*, and reads
  the fence topic until its claim is readable. Pulsar's read-committed dispatch holds a reader
  at the first message of a transaction that is still open, so reaching the claim means every
  transaction of an earlier owner that carried a marker is resolved: committed (and then its
  ledger records are visible too, once the ledger is read past a later record) or aborted. While
  it waits it aborts the transactions named by unresolved intents, so a dead owner's open
  transaction costs seconds, not the transaction timeout.

An old owner's transaction that sent no marker before the fence can never get one; one that did
is resolved before the new owner processes anything. Together with the ledger guard (which the
new owner syncs after acquiring) no input is committed twice, whatever the pause, kill or
partition. ``docs/reliability.md`` has the whole argument.

Fence topics hold a durable subscription that never acknowledges (as the ledger does), so the
broker never deletes them and their epoch; readers only read their last entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from ..errors import (
    AlreadyClosed,
    InvalidTxnStatus,
    OwnershipLost,
    ProducerFenced,
    PulsarError,
    Timeout,
    TransactionNotFound,
)
from ..message import MessageId, TxnID
from ..producer import AsyncProducer, ProducerAccessMode
from ..topic import parse_topic
from ..transaction import AsyncTransaction
from .ledger import ensure_ledger_retained

log = logging.getLogger("txn.fencing")

#: How many entries before its claim a new owner reads for intents (open transactions of an
#: instance are at most its ``max_inflight_commits`` + 1 batches, each two entries).
LOOKBACK_ENTRIES = 64
#: How long a claim read waits for progress before aborting the transactions it knows open.
STALL_S = 1.0

_SAFE = re.compile(r"[^A-Za-z0-9_-]+")


def fence_topic(ledger_topic: str, input_partition: str, subscription: str) -> str:
    """The fence topic of one input partition (or non-partitioned input) of one subscription.

    It sits beside the ledger topic (same tenant and namespace): ``<ledger>-fence-<name>-<hash>``,
    the hash over the input partition's full name and the subscription, so two jobs reading one
    input, or inputs with the same local name in other namespaces, never share a fence.
    """
    ledger = parse_topic(ledger_topic)
    inp = parse_topic(input_partition)
    digest = hashlib.sha256(f"{inp}\0{subscription}".encode()).hexdigest()[:16]
    local = _SAFE.sub("-", inp.local)[-60:]
    return f"{ledger}-fence-{local}-{digest}"


@dataclass
class Acquired:
    """What taking one partition over found: the transactions it aborted and how long it waited."""

    partition: str
    fence_topic: str
    aborted: list[str]
    waited_s: float


class PartitionFences:
    """The fences one instance holds, one per input partition it owns (asyncio).

    ``acquire`` takes a partition over (fencing the previous owner and waiting until its open
    transactions are resolved); ``mark`` puts the proof of ownership into a transaction;
    ``release`` lets a partition go after :class:`~txn.OwnershipLost`.
    """

    def __init__(self, client: Any, ledger_topic: str, subscription: str, owner: str,
                 txn_timeout_ms: int, claim_timeout_s: float | None = None) -> None:
        self.client = client
        #: The fence producers' client: a fenced-out producer's last sends make the broker close
        #: their connection, which must not take the instance's consumers and commits with it.
        self._own: Any = client.sibling() if hasattr(client, "sibling") else client
        self.ledger_topic = ledger_topic
        self.subscription = subscription
        self.owner = owner
        self.txn_timeout_ms = txn_timeout_ms
        #: Bound on one claim read: past it ``acquire`` raises :class:`~txn.Timeout`.
        self.claim_timeout_s = claim_timeout_s or 2 * txn_timeout_ms / 1000 + 60
        self._held: dict[str, AsyncProducer] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        #: Partitions taken over, and transactions of earlier owners aborted while doing it.
        self.acquisitions = 0
        self.aborted_for_claims = 0

    # ------------------------------------------------------------------ queries

    def holds(self, partition: str) -> bool:
        """True while this instance holds ``partition``'s fence (as far as it knows)."""
        p = self._held.get(partition)
        return p is not None and not p.closed

    def missing(self, partitions: set[str] | list[str]) -> list[str]:
        """The partitions among ``partitions`` whose fence this instance does not hold."""
        return sorted(p for p in set(partitions) if not self.holds(p))

    @property
    def held(self) -> list[str]:
        return sorted(p for p in self._held if self.holds(p))

    # ------------------------------------------------------------------ acquire

    async def acquire(self, partition: str) -> Acquired:
        """Take ``partition`` over: fence the previous owner, then wait until every transaction it
        may still commit is resolved (aborting the ones it left open). Raises
        :class:`~txn.Timeout` past ``claim_timeout_s`` and the broker's typed errors."""
        lock = self._locks.setdefault(partition, asyncio.Lock())
        async with lock:
            topic = fence_topic(self.ledger_topic, partition, self.subscription)
            if self.holds(partition):
                return Acquired(partition, topic, [], 0.0)
            t0 = time.monotonic()
            old = self._held.pop(partition, None)
            if old is not None:
                with contextlib.suppress(PulsarError):
                    await old.close()
            await ensure_ledger_retained(self.client, topic)
            producer = await self._own.create_producer(
                topic, access_mode=ProducerAccessMode.ExclusiveWithFencing, batching_enabled=False,
                block_if_queue_full=True, send_timeout_millis=0,
                properties={"pulsar-txn.owner": self.owner, "pulsar-txn.partition": partition},
            )
            try:
                nonce = uuid.uuid4().hex
                claim = await producer.send(_body("claim", owner=self.owner, nonce=nonce, partition=partition))
                aborted = await self._read_to_claim(topic, claim, nonce)
            except BaseException:
                with contextlib.suppress(PulsarError):
                    await producer.close()
                raise
            self._held[partition] = producer
            self.acquisitions += 1
            self.aborted_for_claims += len(aborted)
            waited = time.monotonic() - t0
            log.info("[%s] took over %s in %.2fs (fence %s; aborted %d open transaction(s) of earlier owners%s)",
                     self.owner, partition, waited, topic, len(aborted), f": {', '.join(aborted)}" if aborted else "")
            return Acquired(partition, topic, aborted, waited)

    async def _read_to_claim(self, topic: str, claim: MessageId, nonce: str) -> list[str]:
        """Read ``topic`` until our claim is readable; abort transactions whose intents stay open."""
        # The last entries before the claim, in the claim's ledger (intents in an older ledger are
        # not looked for: their transactions then end by the broker's timeout, still before we go on).
        start = MessageId(ledger_id=claim.ledger_id(), entry_id=max(claim.entry_id() - LOOKBACK_ENTRIES, 0))
        reader = await self.client.create_reader(topic, start, start_message_id_inclusive=True)
        open_txns: dict[str, None] = {}
        aborted: list[str] = []
        deadline = time.monotonic() + self.claim_timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(
                        f"fence claim not readable after {self.claim_timeout_s:.0f}s: a transaction of an earlier "
                        f"owner is still open (open intents: {list(open_txns) or 'none seen'})", topic=topic)
                try:
                    m = await reader.read_next(timeout_millis=int(min(STALL_S, left) * 1000) or 1)
                except Timeout:
                    for tid in list(open_txns):
                        if await self._abort(tid):
                            aborted.append(tid)
                        open_txns.pop(tid, None)
                    continue
                body = _parse(m.data())
                kind = body.get("kind")
                if kind == "intent":
                    open_txns[str(body.get("txn"))] = None
                elif kind == "marker":
                    open_txns.pop(str(body.get("txn")), None)
                elif kind == "claim":
                    open_txns.clear()  # everything before a readable claim is resolved
                    if body.get("nonce") == nonce:
                        return aborted
        finally:
            with contextlib.suppress(PulsarError):
                await reader.close()

    async def _abort(self, tid: str) -> bool:
        """Abort another owner's transaction by id; False if it was already ended."""
        try:
            t = self.client.transaction_from_id(TxnID.parse(tid), timeout_millis=self.txn_timeout_ms)
        except ValueError:
            return False
        try:
            await t.abort()
        except (TransactionNotFound, InvalidTxnStatus):
            return False  # committed, committing, or already aborted: the claim read sees which
        except PulsarError as exc:
            log.warning("[%s] could not abort %s of an earlier owner (%s); waiting for the broker's timeout",
                        self.owner, tid, exc)
            return False
        return True

    # --------------------------------------------------------------------- mark

    async def mark(self, t: AsyncTransaction, partitions: list[str] | set[str]) -> None:
        """Put the proof of ownership of ``partitions`` into ``t``; call before acknowledging in it.

        Raises :class:`~txn.OwnershipLost` (naming the partition) if another owner fenced this
        one out, or if a partition is not held; other broker errors as they are.
        """
        futs: list[tuple[str, asyncio.Future[MessageId]]] = []
        tid = str(t.id)
        for part in sorted(set(partitions)):
            producer = self._held.get(part)
            if producer is None or producer.closed:
                raise OwnershipLost(f"this instance does not hold {part}", topic=part, txn_id=t.id)
            try:
                futs.append((part, await producer.send_async(_body("intent", txn=tid, owner=self.owner))))
                futs.append((part, await producer.send_async(_body("marker", txn=tid, owner=self.owner), txn=t)))
            except (ProducerFenced, AlreadyClosed) as exc:
                self._drop(part)
                raise OwnershipLost(f"another instance took over {part}", topic=part, txn_id=t.id) from exc
        results = await asyncio.gather(*(f for _, f in futs), return_exceptions=True)
        failure: BaseException | None = None
        for (part, _), res in zip(futs, results, strict=True):
            if not isinstance(res, BaseException):
                continue
            if isinstance(res, (ProducerFenced, AlreadyClosed)) or getattr(res, "server_error", "") == "ProducerFenced":
                self._drop(part)
                raise OwnershipLost(f"another instance took over {part}", topic=part, txn_id=t.id) from res
            failure = failure or res
        if failure is not None:
            raise failure

    def fence_topics(self, partitions: list[str] | set[str]) -> list[str]:
        """The fence topics :meth:`mark` writes to for ``partitions`` (to register them in a transaction early)."""
        return [fence_topic(self.ledger_topic, p, self.subscription) for p in sorted(set(partitions))]

    # ------------------------------------------------------------------ release

    def _drop(self, partition: str) -> None:
        p = self._held.pop(partition, None)
        if p is not None and not p.closed:
            asyncio.get_running_loop().create_task(_close_quietly(p))

    def release(self, partition: str) -> None:
        """Forget ``partition`` (after :class:`~txn.OwnershipLost`); taking it again fences the holder."""
        self._drop(partition)

    async def close(self) -> None:
        held, self._held = self._held, {}
        await asyncio.gather(*(_close_quietly(p) for p in held.values()))
        if self._own is not self.client:
            with contextlib.suppress(PulsarError):
                await self._own.close()


async def _close_quietly(p: AsyncProducer) -> None:
    with contextlib.suppress(PulsarError, asyncio.CancelledError):
        await p.close()


def _body(kind: str, **fields: str) -> bytes:
    return json.dumps({"kind": kind, **fields}, separators=(",", ":")).encode()


def _parse(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data[:4096])
    except (ValueError, UnicodeDecodeError):
        return {}
    return body if isinstance(body, dict) else {}
