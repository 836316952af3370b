"""The processor's ledger guard: inputs the ledger shows committed never produce output again.

The broker is made to forget committed acknowledgements the way an operator (or Pulsar 4.0.8's
cursor recovery, see test_conformance_batch_ack_bug.py) can: the subscription's cursor is reset
to the start of the topic, so every committed input is delivered again. With the guard the
processor acknowledges them again and produces nothing; without it (``ledger_guard=False``) the
same run commits every output a second time, which shows the check can fail.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pulsar
import pytest

import txn
from txn.admin import admin_request, create_partitioned_topic
from txn.delivery.ledger import LedgerRecord
from txn.delivery.ledger_guard import CommittedInputs, LedgerGuard
from txn.delivery.output import Output
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.replay import read_ledger

N = 60


def fan_out(m: txn.Message) -> list[Output]:
    """``id % 3`` outputs per input (0, 1 or 2), each ``<id>.<k>``."""
    i = int(m.data())
    return [Output(f"{i}.{k}".encode()) for k in range(i % 3)]


def _expected() -> Counter[bytes]:
    return Counter(f"{i}.{k}".encode() for i in range(N) for k in range(i % 3))


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _fill(official, topic: str, batched: bool) -> None:
    """N inputs; batched: entries of 7 messages, so committed batches of 10 cut entries in two."""
    p = official.create_producer(topic, batching_enabled=batched, batching_max_messages=7,
                                 batching_max_publish_delay_ms=50, block_if_queue_full=True)
    futs = []
    for i in range(N):
        done = {}
        p.send_async(str(i).encode(), lambda res, mid, d=done: d.setdefault("r", res))
        futs.append(done)
    p.flush()
    p.close()
    assert all(f.get("r") == pulsar.Result.Ok for f in futs)


def _reset_to_start(admin_url: str, topic: str, sub: str, partitions: int) -> None:
    names = [topic] if partitions == 0 else [f"{topic}-partition-{i}" for i in range(partitions)]
    for name in names:
        path = name.replace("persistent://", "/admin/v2/persistent/")
        status, body = admin_request("POST", admin_url, f"{path}/subscription/{sub}/resetcursor/0")
        assert status in (200, 204), (status, body)


def _drain(reader, idle_ms: int = 1500) -> list[bytes]:
    """Everything until ``idle_ms`` of silence. The processor has exited (after its commits) before
    each call, so what it committed is already readable: the silence only proves nothing more."""
    got = []
    while True:
        try:
            m = reader.receive(timeout_millis=idle_ms)
        except pulsar.Timeout:
            return got
        got.append(m.data())
        reader.acknowledge(m)


async def _process(broker, inp, out, ledger, guard: bool) -> AsyncProcessor:
    async with txn.AsyncClient(broker.service_url) as client:
        conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="guarded", ledger_topic=ledger,
                               batch_max_messages=10, ledger_guard=guard)
        proc = AsyncProcessor(client, fan_out, conf)
        await proc.start()
        try:
            await proc.run(idle_exit_ms=2000)
        finally:
            await proc.close()
        return proc


@pytest.mark.parametrize("batched,partitions", [
    pytest.param(True, 0, marks=pytest.mark.slow),  # between the two others: behind --run-slow
    (False, 0),
    (True, 3),
])
def test_restart_after_lost_acks_commits_nothing_twice(broker, official, unique_name, batched, partitions):
    inp, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    if partitions:
        create_partitioned_topic(broker.admin_url, inp, partitions)
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)
    # Never acks: the rewind re-reads inputs "proc" acked, which the broker (retention none) may delete otherwise.
    official.subscribe(inp, "keep", initial_position=pulsar.InitialPosition.Earliest)
    _fill(official, inp, batched)

    first = asyncio.run(_process(broker, inp, out, ledger, guard=True))
    assert (first.stats.messages, first.stats.duplicates_skipped) == (N, 0)
    assert Counter(_drain(verifier)) == _expected()

    _reset_to_start(broker.admin_url, inp, "proc", partitions)  # the broker "forgets" every ack
    second = asyncio.run(_process(broker, inp, out, ledger, guard=True))
    assert (second.stats.messages, second.stats.duplicates_skipped, second.stats.outputs) == (0, N, 0)
    assert _drain(verifier) == []

    records = asyncio.run(_ledger(broker, ledger))
    committed = [r for r in records if r.kind == "COMMITTED"]
    inputs = Counter(i for r in committed for ids in r.inputs.values() for i in ids)
    dups = Counter(i for r in committed for ids in r.duplicates.values() for i in ids)
    assert len(inputs) == N and set(inputs.values()) == {1}  # every input committed once
    assert set(dups) == set(inputs) and set(dups.values()) == {1}  # and acknowledged once more, without output
    assert sum(sum(r.outputs.values()) for r in committed) == sum(_expected().values())

    # The same reset without the guard duplicates every output: the check above can fail.
    _reset_to_start(broker.admin_url, inp, "proc", partitions)
    third = asyncio.run(_process(broker, inp, out, ledger, guard=False))
    assert third.stats.messages == N
    assert Counter(_drain(verifier)) == _expected()
    verifier.close()


async def _ledger(broker, ledger: str) -> list[LedgerRecord]:
    async with txn.AsyncClient(broker.service_url) as client:
        return await read_ledger(client, ledger)


def test_running_processor_resyncs_after_its_consumer_resubscribes(broker, official, unique_name):
    """A reset while the processor runs closes its consumer; after resubscribing it checks the ledger again."""
    inp, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    verifier = official.subscribe(out, "verify", initial_position=pulsar.InitialPosition.Earliest)
    # Never acks: the rewind re-reads inputs "proc" acked, which the broker (retention none) may delete otherwise.
    official.subscribe(inp, "keep", initial_position=pulsar.InitialPosition.Earliest)
    _fill(official, inp, batched=True)

    async def main() -> AsyncProcessor:
        async with txn.AsyncClient(broker.service_url) as client:
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="guarded",
                                   ledger_topic=ledger, batch_max_messages=10)
            proc = AsyncProcessor(client, fan_out, conf)
            await proc.start()
            runner = asyncio.ensure_future(proc.run())
            try:
                deadline = time.monotonic() + 60
                while proc.stats.messages < N and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert proc.stats.messages == N
                made = proc.consumer.subscriptions_made
                await asyncio.to_thread(_reset_to_start, broker.admin_url, inp, "proc", 0)
                while proc.stats.duplicates_skipped < N and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert proc.consumer.subscriptions_made > made
            finally:
                proc.stop()
                await runner
                await proc.close()
            return proc

    proc = asyncio.run(main())
    assert (proc.stats.messages, proc.stats.duplicates_skipped) == (N, N)
    assert Counter(_drain(verifier)) == _expected()
    verifier.close()


def test_guard_ignores_other_jobs_and_uncommitted_records(broker, unique_name):
    """Only committing records (COMMITTED/PARKED/REPLAYED) of the guard's own job and inputs count."""
    ledger = f"persistent://public/default/{unique_name('ledger')}"
    inp = "persistent://public/default/in"
    recs = [
        LedgerRecord(kind="COMMITTED", job="mine", batch_id="b1", txn_id="(0,1)", attempt=1,
                     inputs={inp: ["(5,1,-1,-1)"]}),
        LedgerRecord(kind="STARTED", job="mine", batch_id="b2", txn_id="(0,2)", attempt=1,
                     inputs={inp: ["(5,2,-1,-1)"]}),
        LedgerRecord(kind="ABORTED", job="mine", batch_id="b3", txn_id="(0,3)", attempt=1,
                     inputs={inp: ["(5,3,-1,-1)"]}),
        LedgerRecord(kind="COMMITTED", job="other", batch_id="b4", txn_id="(0,4)", attempt=1,
                     inputs={inp: ["(5,4,-1,-1)"]}),
        LedgerRecord(kind="COMMITTED", job="mine", batch_id="b5", txn_id="(0,5)", attempt=1,
                     inputs={"persistent://public/default/elsewhere": ["(5,5,-1,-1)"]}),
        LedgerRecord(kind="PARKED", job="mine", batch_id="b6", txn_id="(0,6)", attempt=1, inputs={inp: ["(5,6,-1,3)"]}),
        # Committing, of this job and input, but written outside the transaction it names: untrusted.
        LedgerRecord(kind="COMMITTED", job="mine", batch_id="b7", txn_id="(0,7)", attempt=1,
                     inputs={inp: ["(5,7,-1,-1)"]}),
    ]

    async def main() -> tuple[int, set[int], int]:
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(ledger)
            for r in recs:
                if r.kind in ("COMMITTED", "PARKED") and r.batch_id != "b7":
                    # Written the way the job writes them: inside the transaction the record names.
                    t = await client.new_transaction()
                    r.txn_id = str(t.id)
                    await p.send(r.to_json(), txn=t)
                    await t.commit()
                else:
                    await p.send(r.to_json())
            await p.send(b'{"job":"mine","kind":"COMMITTED","inputs":{"x":5}}')  # malformed: ignored
            last = await p.send(b"not json")
            guard = LedgerGuard(client, ledger, "mine", [inp])
            await guard.start()
            await guard.wait_past(last, 30)
            known = {e for e in range(1, 8) if guard.committed.contains(_msg(inp, 5, e, -1 if e != 6 else 3))}
            await guard.close()
            return guard.records_applied, known, guard.untrusted

    applied, known, untrusted = asyncio.run(main())
    assert (applied, known, untrusted) == (2, {1, 6}, 1)  # b7 (the malformed one is counted as malformed)


def _msg(topic: str, ledger: int, entry: int, index: int) -> txn.Message:
    mid = txn.MessageId(ledger_id=ledger, entry_id=entry, batch_index=index)
    return txn.Message(b"", {}, mid, topic, None, 0, 0, 0, "", 0)


def test_committed_inputs_is_bounded_and_collapses_full_entries():
    c = CommittedInputs(max_ids=3)
    for i in range(5):
        c.add("t", 1, i, 0, batch_size=2)
    assert len(c) == 3 and c.evicted == 2
    assert not c.contains(_msg("t", 1, 0, 0)) and c.contains(_msg("t", 1, 4, 0))
    assert not c.contains(_msg("t", 1, 4, 1))
    c.add("t", 1, 4, 1, batch_size=2)
    assert c.is_whole_entry("t", 1, 4)  # both indexes: one marker for the entry
    assert c.contains(_msg("t", 1, 4, 1))
    assert len(c) == 3  # entries 2 and 3 (one index each) and entry 4 (whole)


def test_committed_inputs_reads_record_ids():
    c = CommittedInputs()
    n, hi = c.add_ids("t", ["(9,1,-1,-1)", "(9,2,0,3)", "(9,2,0,5)", "bogus", "(9,3,-1,x)", "(9,1,-1,-1)"])
    assert n == 4 and hi == (9, 2)
    assert c.contains(_msg("t", 9, 1, -1)) and c.contains(_msg("t", 9, 2, 3)) and c.contains(_msg("t", 9, 2, 5))
    assert not c.contains(_msg("t", 9, 2, 4)) and not c.contains(_msg("u", 9, 1, -1))
    assert c.add_ids("t", [5, None, "(9,4,-1,0)"]) == (1, (9, 4))  # non-strings are ignored
    assert len(c) == 4
