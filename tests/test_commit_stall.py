"""A commit stage that never hears back is given up once its transaction has timed out.

On a real broker, the processor's first transactional acknowledgement is made to wait forever
(as when the broker's reply is lost in a restart and never comes): past the transaction's timeout
(3 s) plus ``COMMIT_GRACE_S`` the batch is given up, its inputs are handed back and processed in a
later batch, each once. Before the bound the processor waited for that reply forever (the run
never ended).
"""

from __future__ import annotations

import asyncio
import time

import pulsar

import txn
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.processor.commit import COMMIT_GRACE_S

N = 30


def test_a_commit_that_never_hears_back_is_given_up_and_redone(broker, unique_name):
    inp, out = (f"persistent://public/default/{unique_name(p)}" for p in ("in", "out"))
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = official.create_producer(inp, batching_enabled=False)
        for i in range(N):
            p.send(b"m%d" % i)
        p.close()

        async def main():
            async with txn.AsyncClient(broker.service_url) as client:
                conf = ProcessorConfig(inputs=[inp], output=out, subscription="s", job=unique_name("job"),
                                       batch_max_messages=N, batch_max_delay_ms=500, txn_timeout_ms=3000)
                proc = AsyncProcessor(client, lambda m: m.data().upper(), conf)
                await proc.start()
                real = proc.consumer.acknowledge_many
                stalled: list[float] = []

                async def first_never_answers(msgs, t, **kw):
                    if not stalled:
                        stalled.append(time.monotonic())
                        await asyncio.Event().wait()  # the reply that never comes
                    return await real(msgs, t, **kw)

                proc.consumer.acknowledge_many = first_never_answers
                try:
                    await asyncio.wait_for(proc.run(idle_exit_ms=4000), 120)
                finally:
                    await proc.close()
                return proc.stats, stalled

        stats, stalled = asyncio.run(main())
        assert len(stalled) == 1
        assert stats.aborts >= 1 and stats.messages == N and stats.outputs == N
        r = official.create_reader(out, pulsar.MessageId.earliest)
        got = []
        while r.has_message_available():
            got.append(r.read_next(timeout_millis=10000).data())
        r.close()
        assert sorted(got) == sorted(b"M%d" % i for i in range(N))
        assert COMMIT_GRACE_S <= 30
    finally:
        official.close()
