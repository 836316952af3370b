"""The commit audit on a real broker: a committed batch the broker rolled back is committed again, once.

The broker's rollback of a committed transaction (apache/pulsar#20150) cannot be caused on
demand, so these tests build the state it leaves: inputs acknowledged in a committed transaction
while the batch's outputs and its COMMITTED record are invisible (here: written in a transaction
that was aborted). The audit is then told it had read that record before a reconnect, as the
guard would have; everything after that (the check of the ledger, the mark-delete positions,
reading the inputs by id, the handler, the new transaction with its fence marker) is the real
path.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from types import SimpleNamespace

import pulsar
import pytest

import txn
from txn.delivery.commit_audit import REDO_SUFFIX, position
from txn.delivery.ledger import Kind, LedgerRecord
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.replay import read_ledger

from peer import read_until_sentinel

LOST, LATER = 5, 25


def _handler(m: txn.Message) -> list[bytes]:
    return [m.data() + b".a", m.data() + b".b"]


def _names(unique_name):
    return tuple(f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))


async def _vanished_state(client: txn.AsyncClient, inp: str, ledger: str) -> tuple[tuple[int, int, int], dict]:
    """LOST inputs acknowledged in a committed transaction, and an aborted COMMITTED record naming
    them (where the broker's rollback leaves a batch). Returns the record's position and inputs."""
    p = await client.create_producer(inp, batching_enabled=False)
    for i in range(LOST):
        await p.send(f"lost-{i}".encode())
    consumer = await client.subscribe(inp, "proc", consumer_type=txn.ConsumerType.Failover,
                                      initial_position=txn.InitialPosition.Earliest)
    msgs = [await consumer.receive() for _ in range(LOST)]
    t = await client.new_transaction()
    await consumer.acknowledge_many(msgs, t)
    await t.commit()
    await consumer.close()
    inputs = {inp: [str(m.message_id()) for m in msgs]}
    ledger_p = await client.create_producer(ledger, batching_enabled=False)
    rolled_back = await client.new_transaction()
    rec = LedgerRecord(kind=Kind.COMMITTED, job="audit", batch_id="audit:gone:1", txn_id=str(rolled_back.id),
                       attempt=1, inputs=inputs, outputs={}, started_at_ms=0)
    mid = await ledger_p.send(rec.to_json(), txn=rolled_back)
    await rolled_back.abort()
    for i in range(LATER):
        await p.send(f"later-{i}".encode())
    await p.close()
    await ledger_p.close()
    return position(mid), inputs


async def _until(cond, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.1)


def _leak(proc: AsyncProcessor, topics: tuple[str, ...], when: Callable[[int], bool]) -> SimpleNamespace:
    """Make the transactions ``proc`` opens (the n-th, 1 first, where ``when(n)``) leave ``topics``
    out of their registration, so that their coordinator never tells those topics how they end
    (the broken coordinator's view). Returns ``opened`` (a count) and ``leaked`` (their ids)."""
    state = SimpleNamespace(opened=0, leaked=[])
    new_transaction = proc.batches.new_transaction

    async def leaky() -> txn.AsyncTransaction:
        t = await new_transaction()
        state.opened += 1
        if when(state.opened):
            for topic in topics:
                done = asyncio.get_running_loop().create_future()
                done.set_result(None)
                t._partitions[topic] = done  # noqa: SLF001
            state.leaked.append(str(t.id))
        return t

    proc.batches.new_transaction = leaky  # type: ignore[method-assign]
    return state


def _config(inp, out, ledger):
    return ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="audit", ledger_topic=ledger,
                           batch_max_messages=10, txn_timeout_ms=15000)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("finder", ["owner", "newcomer"])
def test_a_batch_rolled_back_after_its_commit_is_committed_again_once(broker, unique_name, finder):
    """``owner``: the instance that owns the input partition finds the record gone and redoes the
    batch; a second instance finds the redo and does nothing. ``newcomer``: the owner never checks
    (it died before; here it runs without the audit), and an instance that owns nothing finds the
    record gone: it takes the partition over and redoes the batch."""
    inp, out, ledger = _names(unique_name)
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)

    async def instance(gone: tuple[int, int, int], inputs: dict, *, first: bool) -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            config = _config(inp, out, ledger)
            config.commit_audit = not (first and finder == "newcomer")
            proc = AsyncProcessor(client, _handler, config)
            await proc.start()
            runner = asyncio.ensure_future(proc.run())
            try:
                if first:
                    await _until(lambda: proc.stats.messages == LATER)
                if proc.audit is None:
                    return proc
                assert proc.guard is not None
                proc.audit.settle_s = 0.0
                # What the guard would have read before the broker rolled the batch back:
                proc.audit.seen(gone, "audit:gone:1", "(9,9)", inputs)
                # ... and a visible COMMITTED record of the same job, which must stay as it is.
                recs = [r for r in await read_ledger(client, ledger) if r.kind == Kind.COMMITTED
                        and not r.batch_id.endswith(REDO_SUFFIX)]
                proc.audit.expose()
                await _until(lambda: proc.audit.checks >= 1 and not proc.audit.pending)
                await asyncio.sleep(1.0)  # a redo, if any, has committed
            finally:
                proc.stop()
                await runner
                await proc.close()
            assert recs  # the visible records were exposed too (all kept within keep_s)
            return proc

    async def main() -> tuple[AsyncProcessor, AsyncProcessor, list[LedgerRecord]]:
        async with txn.AsyncClient(broker.service_url) as client:
            gone, inputs = await _vanished_state(client, inp, ledger)
        first = await instance(gone, inputs, first=True)
        second = await instance(gone, inputs, first=False)  # another instance finds the same record gone
        async with txn.AsyncClient(broker.service_url) as client:
            records = await read_ledger(client, ledger)
        return first, second, records

    try:
        first, second, records = asyncio.run(main())
        if finder == "owner":
            assert (first.stats.vanished, first.stats.redone) == (1, 1)
            assert (second.stats.vanished, second.stats.redone) == (0, 0)  # it sees the redo on the ledger
        else:
            assert (first.stats.vanished, first.stats.redone) == (0, 0)
            assert (second.stats.vanished, second.stats.redone, second.stats.takeovers) == (1, 1, 1)
        redone = [r for r in records if r.kind == Kind.COMMITTED and r.batch_id == "audit:gone:1" + REDO_SUFFIX]
        assert len(redone) == 1 and sum(len(v) for v in redone[0].inputs.values()) == LOST
        assert redone[0].outputs == {out: 2 * LOST}
        got = Counter(m.data() for m in read_until_sentinel(official, verifier, out))
        want = Counter(f"{k}-{i}.{s}".encode() for k, n in (("lost", LOST), ("later", LATER)) for i in range(n)
                       for s in "ab")
        assert got == want  # every input's outputs exactly once: the lost ones by the redo
    finally:
        official.close()


def test_audit_keeps_recent_records_and_checks_each_once() -> None:
    """Broker-free: what a reconnect exposes, when it is due, and that a handled record is not exposed again."""
    from txn.delivery.commit_audit import CommitAudit

    audit = CommitAudit(None, "ledger", keep_s=60, settle_s=25, max_records=3)
    for k in range(5):
        audit.seen((1, k, -1), f"b:{k}", f"(0,{k})", {"t": [f"(1,{k},-1,-1)"]})
    assert [r.batch_id for r in audit.recent] == ["b:2", "b:3", "b:4"]  # bounded by max_records
    now = audit.recent[-1].at
    assert audit.expose(now) == 3 and audit.pending == 3
    assert audit.expose(now, limit=1) == 1 and audit.pending == 4
    assert audit.due(now + 24) == []
    due = audit.due(now + 25)
    assert [r.pos for r in due] == [(1, 2, -1), (1, 3, -1), (1, 4, -1)]  # each once, oldest first
    assert audit.pending == 0
    audit.handled.add((1, 3, -1))
    assert audit.expose(now) == 2  # the handled record is not checked again
    assert audit.expose(now + 61) == 0  # past keep_s: nothing of it is at risk any more
    audit.retry_later(due[:1], 0.0, max_attempts=1)  # out of attempts: dropped with an error
    assert audit.pending == 2


@pytest.mark.timeout(300)
def test_a_commit_that_never_reached_a_partition_is_delivered_there_by_any_instance(broker, unique_name):
    """The coordinator finished a batch's commit without delivering it to the output partition (in
    the loop: its END_TXN_ON_PARTITION failed while the bundle was unloading). The state is built
    by keeping the output partition out of the batches' transactions' registration, so that the
    coordinator never tells it: the partition then holds the transaction open and no later output
    is readable. The instance that committed is gone (here: it ran without the audit and closed);
    a new instance reads the COMMITTED records at its start, finds the partition's readable end
    before a committed transaction's first output, and delivers the commit there."""
    inp, out, ledger = _names(unique_name)
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    p = official.create_producer(inp, batching_enabled=False)
    for i in range(LATER):
        p.send(f"m-{i}".encode())
    p.close()
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)

    async def first_instance(client: txn.AsyncClient) -> tuple[int, int]:
        config = _config(inp, out, ledger)
        config.commit_audit = False
        proc = AsyncProcessor(client, _handler, config)
        await proc.start()
        leak = _leak(proc, (out,), lambda n: n >= 2)  # after the first: the output partition is left out
        runner = asyncio.ensure_future(proc.run())
        try:
            await _until(lambda: proc.stats.messages == LATER)
        finally:
            proc.stop()
            await runner
            await proc.close()
        return proc.stats.batches, leak.opened

    async def main() -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            batches, opened = await first_instance(client)
            assert batches == LATER // 10 + (LATER % 10 > 0) and opened >= 2
            proc = AsyncProcessor(client, _handler, _config(inp, out, ledger))
            await proc.start()
            assert proc.audit is not None
            proc.audit.settle_s = 0.0  # what the start exposes is checked at once
            runner = asyncio.ensure_future(proc.run())
            try:
                await _until(lambda: proc.audit.checks >= 1 and proc.stats.unstuck >= 1, 90)
                await asyncio.sleep(1.0)
            finally:
                proc.stop()
                await runner
                await proc.close()
            return proc

    try:
        proc = asyncio.run(main())
        assert proc.stats.unstuck >= 1 and proc.stats.vanished == 0 and proc.stats.batches == 0, \
            proc.stats.line("t", 0)
        got = Counter(m.data() for m in read_until_sentinel(official, verifier, out))
        assert got == Counter(f"m-{i}.{s}".encode() for i in range(LATER) for s in "ab")
    finally:
        official.close()


def test_output_starts_round_trip_and_hostile_values() -> None:
    """Broker-free: the COMMITTED record's ``output_starts`` is written sorted and read back as
    positions; what is not a topic-to-id object is dropped, and the record's validation bounds it."""
    from txn.delivery.commit_audit import output_starts, parse_output_starts
    from txn.delivery.ledger import LedgerSchemaError

    ids = {"t-partition-1": txn.MessageId(ledger_id=3, entry_id=7, batch_index=1, partition=1),
           "t-partition-0": txn.MessageId(ledger_id=5, entry_id=2, partition=0)}
    text = output_starts(ids)
    assert list(text) == ["t-partition-0", "t-partition-1"]
    rec = LedgerRecord(kind=Kind.COMMITTED, job="j", batch_id="b", txn_id="(0,1)", output_starts=text)
    back = LedgerRecord.from_json(rec.to_json())
    assert parse_output_starts(back.output_starts) == {"t-partition-0": (5, 2, -1), "t-partition-1": (3, 7, 1)}
    assert b"output_starts" not in LedgerRecord(kind=Kind.COMMITTED, job="j", batch_id="b").to_json()
    assert parse_output_starts(["x"]) == {} and parse_output_starts({"t": 5, 7: "(1,2,-1,-1)", "u": "(1,x)"}) == {}
    with pytest.raises(LedgerSchemaError, match="output_starts"):
        LedgerRecord.from_json(rec.to_json().replace(b'"(3,7,1,1)"', b"[1]"))


@pytest.mark.timeout(300)
def test_a_commit_that_never_reached_the_ledger_is_delivered_by_the_instance_that_committed(broker, unique_name):
    """As in loop 7, run 0: a batch's commit reached neither the ledger topic nor the output
    topic (both END_TXN_ON_PARTITION failed while a restart unloaded their bundle). The ledger then
    holds the transaction open: its COMMITTED record, and every record after it, stay unreadable,
    so after the restart every instance's guard waits and no batch commits any more. (Here the
    batches' commits leave out both topics until the restart: a later commit from the same
    coordinator would instead make the broker abort the held transaction there, by its low
    watermark.) No record shows the commit, but
    the instance that committed knows it: after a reconnect, beside its batch loop (which waits on
    the guard), it compares the readable end of each partition its recent commits wrote to with
    their first messages there, and delivers the commit where it is held."""
    inp, out, ledger = _names(unique_name)
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    p = official.create_producer(inp, batching_enabled=False)
    for i in range(LATER):
        p.send(f"m-{i}".encode())
    p.close()
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)

    async def main() -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            proc = AsyncProcessor(client, _handler, _config(inp, out, ledger))
            await proc.start()
            assert proc.audit is not None
            proc.audit.own_settle_s = proc.audit.settle_s = 0.0
            leaking = [True]  # these commits never reach the ledger nor the output
            _leak(proc, (ledger, out), lambda n: n >= 2 and leaking[0])
            runner = asyncio.ensure_future(proc.run())
            try:
                await _until(lambda: proc.stats.messages == LATER)
                leaking[0] = False
                # The transaction opened ahead for the next batch left the two topics out too: drop it.
                ahead, proc._next_txn = proc._next_txn, None  # noqa: SLF001
                if ahead is not None:
                    await (await ahead).abort()
                # A restart: the consumer subscribes again, so the next batch first waits until the
                # guard has read the ledger past its STARTED record, which the held ledger hides.
                proc._guard_synced = -1  # noqa: SLF001 - what a resubscription leaves
                await asyncio.to_thread(_publish, official, inp, range(LATER, LATER + MORE))
                await asyncio.sleep(3.0)
                assert proc.stats.messages == LATER  # the guard waits on the held ledger
                proc.audit.expose()  # the reconnect that came with the restart
                await _until(lambda: proc.stats.messages == LATER + MORE, 90)
            finally:
                proc.stop()
                await runner
                await proc.close()
            return proc

    try:
        proc = asyncio.run(main())
        assert proc.stats.unstuck >= 2 and proc.stats.vanished == 0, proc.stats.line("t", 0)
        got = Counter(m.data() for m in read_until_sentinel(official, verifier, out))
        assert got == Counter(f"m-{i}.{s}".encode() for i in range(LATER + MORE) for s in "ab")
    finally:
        official.close()



@pytest.mark.timeout(300)
def test_outputs_the_broker_aborted_after_a_commit_are_sent_again(broker, unique_name):
    """As in loop 8, run 0: a batch's commit never reached the output topic (its END_TXN_ON_PARTITION
    failed during a restart), and the next commit of the same coordinator that reached the topic
    carried a low watermark past the batch's transaction: the topic's transaction buffer then
    aborted it there. The COMMITTED record and the acknowledgements stay; the outputs are gone.
    Built here by keeping the output topic out of one batch's registration, then sending the topic
    the abort that such a later commit makes the broker apply (the later batches' transactions may
    come from the other coordinator, whose low watermark does not cover this one). After a
    reconnect, the audit reads the output topic from the batch's first output, finds it gone, and
    sends the batch's outputs again in a ``+redo`` transaction whose record names no input (the
    batch's own record still names them)."""
    inp, out, ledger = _names(unique_name)
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    _publish(official, inp, range(LATER))
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)
    leaked: list[str] = []

    async def main() -> tuple[AsyncProcessor, list[LedgerRecord]]:
        async with txn.AsyncClient(broker.service_url) as client:
            proc = AsyncProcessor(client, _handler, _config(inp, out, ledger))
            await proc.start()
            assert proc.audit is not None
            proc.audit.settle_s = 0.0
            leak = _leak(proc, (out,), lambda n: n == 2)  # this commit never reaches the output topic
            leak.leaked = leaked
            runner = asyncio.ensure_future(proc.run())
            try:
                await _until(lambda: proc.stats.messages == LATER)
                # The broker aborts the held transaction there when a later commit of the same
                # coordinator arrives with its low watermark; the batches' transactions may come
                # from either coordinator, so the abort is delivered here as that commit would.
                await _end_on_partition(client, out, txn.TxnID.parse(leaked[0]), commit=False)
                await asyncio.sleep(1.0)  # the guard has read every record
                proc.audit.expose()  # the reconnect that came with the restart
                await _until(lambda: proc.audit.checks >= 1 and not proc.audit.pending, 90)
                await _until(lambda: proc.stats.redone >= 1, 60)
            finally:
                proc.stop()
                await runner
                await proc.close()
            return proc, await read_ledger(client, ledger)

    try:
        proc, records = asyncio.run(main())
        assert (proc.stats.vanished, proc.stats.redone) == (1, 1), proc.stats.line("t", 0)
        committed = [r for r in records if r.kind == Kind.COMMITTED]
        hit = [r for r in committed if r.txn_id in leaked]
        assert len(hit) == 1 and sum(hit[0].outputs.values()) > 0  # its record stayed
        redo = [r for r in committed if r.batch_id == hit[0].batch_id + REDO_SUFFIX]
        assert len(redo) == 1 and redo[0].inputs == {} and redo[0].outputs == hit[0].outputs
        got = Counter(m.data() for m in read_until_sentinel(official, verifier, out))
        assert got == Counter(f"m-{i}.{s}".encode() for i in range(LATER) for s in "ab")
    finally:
        official.close()


async def _end_on_partition(client: txn.AsyncClient, topic: str, tid: txn.TxnID, *, commit: bool) -> None:
    """What a coordinator sends a partition to end a transaction there (END_TXN_ON_PARTITION)."""
    from txn.connection import check_error, command, next_request_id
    from txn.delivery.commit_audit import NO_WATERMARK
    from txn.protocol import pulsar_wire_pb2 as pb

    conn = await client._pool.connection_for(topic)  # noqa: SLF001
    rid = next_request_id()
    resp = await conn.request(command(pb.BaseCommand.END_TXN_ON_PARTITION, request_id=rid, topic=topic,
                                      txnid_least_bits=tid.least, txnid_most_bits=tid.most,
                                      txn_action=pb.COMMIT if commit else pb.ABORT,
                                      txnid_least_bits_of_low_watermark=NO_WATERMARK), rid)
    check_error(resp, "end of the transaction", topic=topic)
    assert not resp.endTxnOnPartitionResponse.HasField("error"), resp


MORE = 5


def _publish(client: pulsar.Client, topic: str, ids: range) -> None:
    p = client.create_producer(topic, batching_enabled=False)
    for i in ids:
        p.send(f"m-{i}".encode())
    p.close()
