"""Batches bounded by bytes: ``ProcessorConfig.batch_max_bytes``.

On a real broker: 10 inputs of 100 kB, one of 3 MB, 10 more of 100 kB, with a bound of 512 KiB
and room for 100 messages: the batches hold 5, 5, 1 (the 3 MB input alone), 5 and 5 inputs, in
that order, and every input is processed once. The time a batch's first input waited for the
batch to close is reported.
"""

from __future__ import annotations

import asyncio

import pulsar

import txn
from txn.delivery.processor import AsyncProcessor, ProcessorConfig

SMALL = 100_000
BIG = 3_000_000


def test_batches_close_before_their_payloads_pass_the_bound(broker, unique_name):
    inp, out = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out"))
    sizes = [SMALL] * 10 + [BIG] + [SMALL] * 10
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = official.create_producer(inp, batching_enabled=False)
        for i, n in enumerate(sizes):
            p.send(bytes([i]) * n)
        p.close()

        async def main():
            async with txn.AsyncClient(broker.service_url) as client:
                conf = ProcessorConfig(inputs=[inp], output=out, subscription="s", job=unique_name("job"),
                                       batch_max_messages=100, batch_max_delay_ms=3000,
                                       batch_max_bytes=512 * 1024)
                proc = AsyncProcessor(client, lambda m: b"%d:%d" % (m.data()[0], len(m.data())), conf)
                batches: list[tuple[int, int]] = []  # (sequence number of the batch id, inputs)
                proc.on_commit = lambda b, _t, n, _c, _ms: batches.append((int(b.rsplit(":", 1)[1]), n))
                await proc.start()
                try:
                    await proc.run(idle_exit_ms=4000)
                finally:
                    await proc.close()
                return proc.stats, batches

        stats, batches = asyncio.run(main())
        # In batch order: commits are pipelined, so two may finish (and report) out of order.
        assert [n for _, n in sorted(batches)] == [5, 5, 1, 5, 5]
        assert stats.messages == 21 and stats.batches_collected >= 5  # (+1: the first, dropped at the takeover)
        assert stats.batch_wait_ms_total >= 0 and "avg_batch_wait_ms=" in stats.line("j", 0)
        r = official.create_reader(out, pulsar.MessageId.earliest)
        got = []
        while r.has_message_available():
            got.append(r.read_next(timeout_millis=10000).data())
        r.close()
        assert got == [b"%d:%d" % (i, n) for i, n in enumerate(sizes)]
    finally:
        official.close()
