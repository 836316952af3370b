"""Guard checkpoints: a restart reads the ledger's tail, never less than its subscription needs.

The ledger guard starts after the newest checkpoint rung whose partitions the subscription's
cursor has acknowledged past (``txn.delivery.guard_checkpoint``). What these prove, on a real
broker:
- a restart of a job whose ledger holds thousands of records reads a few dozen of them, and
  goes on exactly once;
- a subscription rewound to its start (before a start, or while the processor runs) makes the
  guard read from the ledger's start again: every input the ledger shows committed is skipped,
  none is processed twice. Ignoring the cursor (starting from the newest rung regardless)
  reprocesses all of them; this test was run against such a variant and failed.
"""

from __future__ import annotations

import asyncio
import json

import pulsar
import pytest

import txn
from txn.admin import admin_request, topic_path
from txn.delivery.guard_checkpoint import (
    MAX_RUNGS,
    Rung,
    checkpoint_topic,
    choose,
    decode,
    encode,
    thin,
)
from txn.delivery.processor import AsyncProcessor, ProcessorConfig

# ------------------------------------------------------------------ rungs and ladders (no broker)


def test_a_rung_fits_only_when_every_named_partition_is_acknowledged_past_it():
    r = Rung((5, 10, -1), {"a": (3, 7), "b": (4, 1)})
    assert r.allows({"a": (3, 7), "b": (4, 2)})
    assert not r.allows({"a": (3, 6), "b": (4, 2)})  # a's cursor stands below the rung
    assert not r.allows({"a": (3, 7)})  # b's position unknown
    assert not r.allows({"a": (3, 7), "b": None})
    assert r.allows({"a": (3, 7)}, ours=lambda t: t == "a")  # b is no input of this job any more
    assert Rung((5, 10, -1)).allows({})  # no records: fits anything


def test_choose_takes_the_newest_rung_the_cursor_allows():
    ladder = [Rung((1, i, -1), {"a": (9, i * 10)}) for i in range(10)]
    assert choose(ladder, {"a": (9, 95)}).position == (1, 9, -1)
    assert choose(ladder, {"a": (9, 42)}).position == (1, 4, -1)
    assert choose(ladder, {"a": (8, 999)}) is None
    assert choose(ladder, {}) is None


def test_thin_keeps_the_newest_and_spaces_out_the_rest():
    ladder: list[Rung] = []
    for i in range(1000):
        ladder = thin([*ladder, Rung((1, i, -1), at_ms=i)])
    entries = [r.position[1] for r in ladder]
    assert len(ladder) <= MAX_RUNGS
    assert entries == sorted(entries)
    assert entries[-8:] == list(range(992, 1000))
    assert entries[0] == 0  # the oldest rung stays
    gaps = [b - a for a, b in zip(entries, entries[1:], strict=False)]
    assert max(gaps) < 1000 // 4  # still a ladder, not two ends
    assert gaps[-9] < gaps[0]  # denser near the newest end


def test_decode_trusts_only_the_job_ledger_and_transaction_named():
    ladder = [Rung((1, 2, 0), {"persistent://public/default/in": (3, 4)}, 5)]
    data = encode("job", "L", "(1,2)", ladder, 7)
    assert decode(data, "job", "L", "(1,2)") == ladder
    assert decode(data, "job", "L", None) is None  # written outside any transaction
    assert decode(data, "job", "L", "(1,3)") is None  # inside another one
    assert decode(data, "other", "L", "(1,2)") is None
    assert decode(data, "job", "M", "(1,2)") is None
    bad = json.loads(data)
    bad["ladder"][0]["hi"]["x"] = [1, "2"]
    assert decode(json.dumps(bad).encode(), "job", "L", "(1,2)") is None
    assert decode(b"\xff" * 10, "job", "L", "(1,2)") is None
    assert decode(b"[" * 100000, "job", "L", "(1,2)") is None
    assert checkpoint_topic("L", "job") != checkpoint_topic("L", "job2")


# ------------------------------------------------------------------ on a broker

NOISE = 3000  # other jobs' records in the ledger before this one starts
FIRST = 400
MORE = 100


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _read_all(official, topic: str) -> list[bytes]:
    out: list[bytes] = []
    r = official.create_reader(topic, pulsar.MessageId.earliest)
    while r.has_message_available():
        out.append(r.read_next(timeout_millis=10000).data())
    r.close()
    return out


def _rewind(broker, topic: str, subscription: str) -> None:
    """Reset the subscription's cursor to the topic's start (the broker disconnects its consumers)."""
    status, body = admin_request("POST", broker.admin_url,
                                 f"/admin/v2/{topic_path(topic)}/subscription/{subscription}/resetcursor/0")
    assert status in (200, 204), (status, body)


def test_restart_reads_from_a_checkpoint_and_a_rewound_cursor_reads_from_the_start(broker, official, unique_name):
    inp, out, ledger = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out", "ledger"))
    job = unique_name("job")
    # Never acks: the rewind re-reads inputs "proc" acked, which the broker (retention none) may delete otherwise.
    official.subscribe(inp, "keep", initial_position=pulsar.InitialPosition.Earliest)
    p = official.create_producer(inp, batching_enabled=True, batching_max_messages=10,
                                 batching_max_publish_delay_ms=5)
    for i in range(FIRST):
        p.send_async(b"a%d" % i, None)
    p.flush()

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            noise = await client.create_producer(ledger, block_if_queue_full=True)
            sent = [await noise.send_async(json.dumps({"schema": "x", "job": "another", "n": i}).encode())
                    for i in range(NOISE)]
            await asyncio.gather(*sent)
            await noise.close()

            def config(**kw):
                return ProcessorConfig(inputs=[inp], output=out, subscription="proc", job=job, ledger_topic=ledger,
                                       batch_max_messages=20, guard_checkpoint_s=0.001, **kw)

            async def run(idle_ms=2500, during=None):
                proc = AsyncProcessor(client, lambda m: m.data().upper(), config())
                await proc.start()
                try:
                    if during is None:
                        await proc.run(idle_exit_ms=idle_ms)
                    else:
                        running = asyncio.ensure_future(proc.run(idle_exit_ms=idle_ms))
                        await during(proc)
                        await running
                finally:
                    await proc.close()
                return proc

            a = await run()
            # The restart: after the newest checkpoint; then MORE new inputs, exactly once.
            for i in range(MORE):
                p.send_async(b"b%d" % i, None)
            p.flush()
            b = await run()

            # The cursor is rewound while the processor runs: every input comes again and is skipped.
            async def rewind_soon(proc):
                await asyncio.sleep(3)
                await asyncio.to_thread(_rewind, broker, inp, "proc")

            c = await run(idle_ms=8000, during=rewind_soon)
            # Rewound before a start: the guard must not start from the newest checkpoint.
            await asyncio.to_thread(_rewind, broker, inp, "proc")
            d = await run()
            return a, b, c, d

    a, b, c, d = asyncio.run(main())
    p.close()
    assert a.guard.start_rung is None and a.guard.records_read >= NOISE
    assert (a.stats.messages, a.stats.duplicates_skipped) == (FIRST, 0)
    assert b.guard.start_rung is not None
    assert b.guard.records_read < 100, b.guard.records_read  # the tail only, not the NOISE + a's records
    assert (b.stats.messages, b.stats.duplicates_skipped) == (MORE, 0)
    assert (c.stats.messages, c.stats.duplicates_skipped) == (0, FIRST + MORE), c.stats.line("c", 0)
    # Read again from a rung before any of the job's records (or the ledger's start).
    assert c.guard.start_rung is None or c.guard.start_rung.hi == {}, c.guard.start_rung
    assert d.guard.start_rung is None or d.guard.start_rung.hi == {}, d.guard.start_rung
    assert (d.stats.messages, d.stats.duplicates_skipped) == (0, FIRST + MORE), d.stats.line("d", 0)
    got = _read_all(official, out)
    expected = sorted([b"A%d" % i for i in range(FIRST)] + [b"B%d" % i for i in range(MORE)])
    assert sorted(got) == expected  # each once
