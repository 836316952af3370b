"""Conformance: partial batch-index acks of a transaction lost at a clean broker restart.

Pulsar 4.0.8 does not restore a cursor's partial batch-index acks from the metadata store
(upstream issues 20585 and 26475, fixed by pull request 26474); the pending-ack log replay then
restores most of them, but skips a whole transactional ACK command when one of its positions is
already fully deleted. A command that acked the end of entry A (completing it) and the start of
entry B therefore loses B's acks: after the restart B[0..4] are delivered again and a new
transaction's ack of them commits (a batch's inputs processed twice).

THIS TEST ASSERTS THE BROKER BUG (``per_entry=False``). When it fails on a new broker release,
the broker fixed it: update the expectation, note the version, and consider moving to it.
With one ACK command per partly acknowledged entry (``per_entry=True``, what ``acknowledge_many``
does by default; entries acknowledged whole share one), only the messages no transaction
acknowledged come back.

Set PULSAR_TXN_CONFORMANCE_HOME to an unpacked Pulsar distribution to run it against that one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

import txn
from txn_shell.localbroker import LocalBroker, free_port

BATCH = 10  # messages per batch entry
TIMEOUT_MS = 60_000


@pytest.fixture
def broker_to_restart(request: pytest.FixtureRequest) -> Iterator[LocalBroker]:
    """``restartable_broker``'s LocalBroker, or one from PULSAR_TXN_CONFORMANCE_HOME."""
    home = os.environ.get("PULSAR_TXN_CONFORMANCE_HOME")
    if not home:
        yield request.getfixturevalue("restartable_broker").local
        return
    data_dir = tempfile.mkdtemp(prefix="pulsar-txn-conformance-", dir="/tmp")
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    b, w, k = ports
    local = LocalBroker(data_dir, broker_port=b, web_port=w, bookie_port=k, transaction_coordinators=2,
                        pulsar_home=home)
    try:
        local.start(timeout=240)
        yield local
    finally:
        local.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


async def _setup(url: str, topic: str, per_entry: bool) -> None:
    """Entries A..D of 10 messages; t1 acks A[0..4], t2 A[5..9] + B[0..4] + C + D, t3 B[5..6]; all commit."""
    async with txn.AsyncClient(url, operation_timeout_seconds=60) as c:
        cons = await c.subscribe(topic, "sub", consumer_type=txn.ConsumerType.Shared,
                                 initial_position=txn.InitialPosition.Earliest)
        p = await c.create_producer(topic, batching_enabled=False)
        for e, name in enumerate("ABCD"):
            futs = await p.send_batch_async([(f"{name}{i}".encode(), None, None) for i in range(BATCH)],
                                            first_sequence_id=e * BATCH)
            await futs[-1]
        msgs = {}
        for _ in range(4 * BATCH):
            m = await cons.receive(timeout_millis=TIMEOUT_MS)
            msgs[m.data().decode()] = m
        ids = {k: m.message_id() for k, m in msgs.items()}
        # Exactly two entries of 10, each holding its own name's messages in order.
        for name in "ABCD":
            entry = {(ids[f"{name}{i}"].ledger_id(), ids[f"{name}{i}"].entry_id()) for i in range(BATCH)}
            assert len(entry) == 1
            assert [(ids[f"{name}{i}"].batch_index(), ids[f"{name}{i}"].batch_size) for i in range(BATCH)] == [
                (i, BATCH) for i in range(BATCH)]
        assert len({(ids[f"{name}0"].ledger_id(), ids[f"{name}0"].entry_id()) for name in "ABCD"}) == 4

        def pick(name: str, lo: int, hi: int) -> list[txn.Message]:
            return [msgs[f"{name}{i}"] for i in range(lo, hi + 1)]

        t2 = pick("A", 5, 9) + pick("B", 0, 4) + pick("C", 0, 9) + pick("D", 0, 9)
        for batch in (pick("A", 0, 4), t2, pick("B", 5, 6)):
            t = await c.new_transaction(timeout_millis=TIMEOUT_MS)
            await cons.acknowledge_many(batch, t, per_entry=per_entry)
            await t.commit()
        await cons.close()


async def _after_restart(url: str, topic: str) -> list[str]:
    """What the subscription delivers again (up to a sentinel); acks it all in a transaction that commits."""
    async with txn.AsyncClient(url, operation_timeout_seconds=60) as c:
        cons = await c.subscribe(topic, "sub", consumer_type=txn.ConsumerType.Shared)
        p = await c.create_producer(topic, batching_enabled=False)
        await p.send(b"sentinel")
        again: list[txn.Message] = []
        while True:
            m = await cons.receive(timeout_millis=TIMEOUT_MS)
            again.append(m)
            if m.data() == b"sentinel":
                break
        t = await c.new_transaction(timeout_millis=TIMEOUT_MS)
        await cons.acknowledge_many(again, t)
        await t.commit()  # the broker's conflict check does not see the first commits
        assert t.state is txn.TxnState.COMMITTED
        await cons.close()
        return sorted(m.data().decode() for m in again[:-1])


def test_batch_acks_spanning_entries_survive_a_restart_only_per_entry(broker_to_restart):
    local = broker_to_restart
    base = f"persistent://public/default/batch-ack-{os.getpid()}-{free_port()}"
    one_command, per_entry = f"{base}-one", f"{base}-per-entry"
    asyncio.run(_setup(local.service_url, one_command, per_entry=False))
    asyncio.run(_setup(local.service_url, per_entry, per_entry=True))
    local.stop()
    local.start(timeout=240)
    # The broker bug (Pulsar 4.0.8): t2's acks of B[0..4] are gone and B0..B4 come again.
    assert asyncio.run(_after_restart(local.service_url, one_command)) == [
        "B0", "B1", "B2", "B3", "B4", "B7", "B8", "B9"]
    # One command per partly acknowledged entry (C and D, acked whole, share one): only what no
    # transaction acknowledged.
    assert asyncio.run(_after_restart(local.service_url, per_entry)) == ["B7", "B8", "B9"]


def test_ack_command_layout():
    """The layout the restart test relies on: each partly acked entry alone, whole entries together."""
    from txn.consumer import _split_by_entry

    def ids(entry: int, lo: int, hi: int) -> list[txn.MessageId]:
        return [txn.MessageId(ledger_id=1, entry_id=entry, batch_index=i, batch_size=BATCH) for i in range(lo, hi + 1)]

    plain = txn.MessageId(ledger_id=1, entry_id=9)
    whole, partial = _split_by_entry(ids(0, 5, 9) + ids(1, 0, 4) + ids(2, 0, 9) + [plain] + ids(3, 0, 9))
    assert sorted(whole) == sorted(ids(2, 0, 9) + ids(3, 0, 9) + [plain])
    assert partial == [ids(0, 5, 9), ids(1, 0, 4)]
