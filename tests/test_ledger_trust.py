"""Trust only what committed: a planted COMMITTED record never makes a job skip its inputs.

A COMMITTED (or PARKED, REPLAYED) record counts only if the broker's metadata shows it was
written inside the very transaction it names. The attacks: one record written outside any
transaction naming the inputs' message ids, and one written (and committed) inside the attacker's
own transaction but naming another transaction id. Before this check the first one made the
processor acknowledge all 10 inputs with no output (``duplicates_skipped=10``).
"""

from __future__ import annotations

import asyncio

import pulsar
import pytest

import txn
from txn.delivery.ledger import Kind, LedgerRecord
from txn.delivery.ledger_reader import read_records
from txn.delivery.processor import AsyncProcessor, ProcessorConfig

N = 10


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _names(unique_name):
    return tuple(f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))


@pytest.mark.parametrize("how", ["outside-any-transaction", "inside-another-transaction"])
def test_a_planted_committed_record_skips_nothing(broker, official, unique_name, how):
    inp, out, ledger = _names(unique_name)
    p = official.create_producer(inp, batching_enabled=False)
    ids = [str(p.send(b"%d" % i)) for i in range(N)]
    p.close()

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            # The ids as our client writes them in records: (ledger,entry,partition,batch index).
            r = await client.create_reader(inp, txn.EARLIEST)
            mids = [str((await r.read_next(timeout_millis=10000)).message_id()) for _ in range(N)]
            await r.close()
            planted = LedgerRecord(kind=Kind.COMMITTED, job="victim", batch_id="victim:evil:1", txn_id="(0,1)",
                                   inputs={inp: mids}, outputs={out: N})
            lp = await client.create_producer(ledger)
            if how == "outside-any-transaction":
                await lp.send(planted.to_json())
            else:
                t = await client.new_transaction()
                await lp.send(planted.to_json(), txn=t)
                await t.commit()
            await lp.close()
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="victim", ledger_topic=ledger,
                                   batch_max_messages=50)
            proc = AsyncProcessor(client, lambda m: m.data(), conf)
            await proc.start()
            try:
                await proc.run(idle_exit_ms=2500)
            finally:
                await proc.close()
            trusted = await read_records(client, ledger, verify_txn=True)
            everything = await read_records(client, ledger)
            return proc.stats, proc.guard.untrusted, trusted, everything

    stats, untrusted, trusted, everything = asyncio.run(main())
    assert len(ids) == N
    assert (stats.messages, stats.outputs, stats.duplicates_skipped) == (N, N, 0), stats.line("victim", 0)
    assert untrusted == 1
    got = []
    r = official.create_reader(out, pulsar.MessageId.earliest)
    while r.has_message_available():
        got.append(r.read_next(timeout_millis=10000).data())
    r.close()
    assert sorted(got) == sorted(b"%d" % i for i in range(N))
    # The shared reader drops the planted record when asked to verify, and keeps the real one.
    assert [x.batch_id for x in everything if x.kind == Kind.COMMITTED][0] == "victim:evil:1"
    assert [x.batch_id for x in trusted if x.kind == Kind.COMMITTED] == [
        x.batch_id for x in everything if x.kind == Kind.COMMITTED and x.batch_id != "victim:evil:1"]
