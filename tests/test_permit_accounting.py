"""Flow-control permits: what the client believes it granted matches the broker's ``availablePermits``.

The broker takes one permit per message it dispatches, except the batch indexes it marks as
already acknowledged in the entry's ack set (batch-index acknowledgement, transactional acks
pending or committed): an entry of ``n`` messages with ``a`` of them acked costs ``n - a``. The
client must return exactly what the broker took: a permit returned twice grows the broker's count
past the receiver queue (the broker then floods the client), a permit never returned shrinks it
until the broker stops dispatching (the consumer stalls with input left).

At a quiet moment (nothing in flight) the broker's count for a consumer must equal
``queue_size - queued - taken``: the permits of the session minus the messages waiting in the
receive queue and those taken out but not yet reported in a FLOW.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid

import pulsar
import pytest

import txn
from txn.admin import admin_request, topic_path
from txn.receive_queue import ReceiveQueue

N = 6000  # six batch entries of 1000 messages
QUEUE = 1000


def _produce_batched(service_url: str, topic: str, n: int) -> None:
    """``n`` messages ``b"0"``.. in entries of up to 1000 (the official client's batching)."""
    c = pulsar.Client(service_url)
    try:
        p = c.create_producer(topic, batching_enabled=True, batching_max_messages=1000,
                              batching_max_publish_delay_ms=100,
                              batching_max_allowed_size_in_bytes=8 * 1024 * 1024, block_if_queue_full=True)
        for i in range(n):
            p.send_async(str(i).encode(), None)
        p.flush()
        p.close()
    finally:
        c.close()


def _broker_permits(admin_url: str, topic: str, sub: str, name: str) -> int | None:
    status, body = admin_request("GET", admin_url, f"/admin/v2/{topic_path(topic)}/stats")
    if status != 200:
        return None
    for c in body.get("subscriptions", {}).get(sub, {}).get("consumers", []):
        if c.get("consumerName") == name:
            return int(c["availablePermits"])
    return None


def _client_expects(tc) -> tuple[int, int, int]:
    """(permits the broker should hold, messages queued, messages taken but not yet reported)."""
    queued = sum(1 for m in tc.parent.receive_queue.snapshot() if getattr(m, "consumer", None) is tc)
    return tc.queue_size - queued - tc.taken, queued, tc.taken


async def _quiet_compare(admin_url: str, topic: str, sub: str, name: str, tc) -> tuple[int | None, int]:
    """Wait until neither the broker's count nor the client's view changes, then return both."""
    prev = None
    cur: tuple = (None, (0, 0, 0))
    for _ in range(60):
        await asyncio.sleep(0.25)
        if not tc.ready.is_set():
            continue
        cur = (_broker_permits(admin_url, topic, sub, name), _client_expects(tc), getattr(tc, "session", None))
        if cur == prev and cur[0] is not None:
            break
        prev = cur
    return cur[0], cur[1][0]


def _unload(admin_url: str, topic: str) -> None:
    admin_request("PUT", admin_url, f"/admin/v2/{topic_path(topic)}/unload", timeout=30)


def test_permits_match_the_broker_after_redeliveries_partial_acks_and_unloads(broker, topic):
    """A Failover consumer on 1000-message entries: receive some, acknowledge half of them in a
    transaction (batch-index acks), redeliver everything while entries are in flight, and now and
    then unload the topic (a reconnect); after each step the broker's permits equal the client's
    view, and in the end every message was received."""

    async def run() -> tuple[list[tuple[int, int | None, int]], set[int]]:
        sub, name = "permits", f"permits-{uuid.uuid4().hex[:8]}"
        client = txn.AsyncClient(broker.service_url)
        try:
            consumer = await client.subscribe(topic, sub, consumer_type=txn.ConsumerType.Failover,
                                              initial_position=txn.InitialPosition.Earliest,
                                              consumer_name=name, receiver_queue_size=QUEUE)
            tc = consumer.topic_consumers[0]
            await asyncio.get_running_loop().run_in_executor(None, _produce_batched, broker.service_url, topic, N)
            rnd = random.Random(7)
            seen: set[int] = set()
            acked: set[int] = set()
            report: list[tuple[int, int | None, int]] = []
            for step in range(10):
                got = []
                for _ in range(rnd.randint(100, 1500)):
                    try:
                        got.append(await consumer.receive(3000))
                    except txn.Timeout:
                        break
                seen.update(int(m.data()) for m in got)
                chosen = [m for m in got if rnd.random() < 0.5]
                if chosen:
                    t = await client.new_transaction()
                    await consumer.acknowledge_many(chosen, t)
                    await t.commit()
                    acked.update(int(m.data()) for m in chosen)
                if step % 4 == 3:
                    await asyncio.get_running_loop().run_in_executor(None, _unload, broker.admin_url, topic)
                else:
                    tc.redeliver_after_abort([], True)  # redeliver-all, new epoch, entries in flight
                if step % 2 == 1:
                    b, c = await _quiet_compare(broker.admin_url, topic, sub, name, tc)
                    report.append((step, b, c))
            # Drain: every message comes (again) until all are acknowledged.
            deadline = time.monotonic() + 60
            while len(acked) < N and time.monotonic() < deadline:
                got = []
                for _ in range(2000):
                    try:
                        got.append(await consumer.receive(2000))
                    except txn.Timeout:
                        break
                if not got:
                    tc.redeliver_after_abort([], True)
                    continue
                seen.update(int(m.data()) for m in got)
                t = await client.new_transaction()
                await consumer.acknowledge_many(got, t)
                await t.commit()
                acked.update(int(m.data()) for m in got)
            b, c = await _quiet_compare(broker.admin_url, topic, sub, name, tc)
            report.append((99, b, c))
            await consumer.close()
            return report, acked
        finally:
            await client.close()

    report, acked = asyncio.run(run())
    print(f"\n(step, broker permits, client view): {report}")
    diverged = [(step, b, c) for step, b, c in report if b != c]
    assert not diverged, f"broker permits != client view (step, broker, client): {report}"
    assert acked == set(range(N)), f"{N - len(acked)} messages never received"


class _Sub:
    """Stands for a topic consumer in the receive queue (permit counters only)."""

    def __init__(self) -> None:
        self.queue_size = 4
        self.threshold = 2
        self.taken = 0
        self.session = 0


class _Msg:
    def __init__(self, sub: _Sub) -> None:
        self.consumer = sub


def test_a_flow_counted_on_another_thread_is_not_sent_to_the_next_session() -> None:
    """A message taken on another thread before a resubscribe reports its permits to the event loop
    later; if the consumer resubscribed meanwhile (the new session was granted a full queue), that
    FLOW belongs to the old session and must not reach the new one."""
    loop = asyncio.new_event_loop()
    try:
        flows: list[int] = []
        q = ReceiveQueue(loop, lambda sub, n: flows.append(n))
        sub = _Sub()
        q.put_many([_Msg(sub) for _ in range(4)])

        def take(k: int) -> None:
            for _ in range(k):
                q.get_nowait()

        t = threading.Thread(target=take, args=(2,))
        t.start()
        t.join()
        q.reset(sub)  # the resubscribe, before the loop ran the FLOW the thread scheduled
        loop.run_until_complete(asyncio.sleep(0.05))
        assert flows == []
        t = threading.Thread(target=take, args=(2,))  # the new session's messages count as usual
        t.start()
        t.join()
        loop.run_until_complete(asyncio.sleep(0.05))
        assert flows == [2]
    finally:
        loop.close()


@pytest.mark.parametrize("acked", [0, 1, 63, 64, 500, 999])
def test_an_entry_with_acked_indexes_costs_only_its_unacked_messages(acked: int) -> None:
    """The broker charges ``n - acked`` for a batch entry sent with an ack set; the client counts
    exactly that: what it queues plus what it skips."""
    from txn.consumer.acks import _ack_set_words
    from txn.consumer.flow import _charged_permits

    n = 1000
    words = _ack_set_words(n, list(range(acked)))
    assert _charged_permits(n, words) == n - acked
    assert _charged_permits(n, []) == n


def test_an_idle_consumer_keeps_no_waiters_it_gave_up(broker, topic):
    """Receives and batch receives that time out on an empty topic, and a processor batch's wait
    for input, leave nothing behind in the queue's waiters: they had piled up, one per timeout
    (ten per second for a processor idling at ``batch_max_delay_ms=100``), until a message came."""

    async def main() -> tuple[int, int, bytes]:
        async with txn.AsyncClient(broker.service_url) as client:
            consumer = await client.subscribe(topic, "idle", receiver_queue_size=QUEUE)
            q = consumer.receive_queue
            for _ in range(20):
                with pytest.raises(txn.Timeout):
                    await consumer.receive(timeout_millis=5)
            await consumer.receive_queue.get_batch(10, 0, 0.005)
            for _ in range(20):
                w = q.waiter()
                assert w is not None
                await asyncio.wait([w], timeout=0.005)
                q.forget(w)
            left_idle = len(q._async_waiters)  # noqa: SLF001 - what the test is about
            waiting = asyncio.ensure_future(consumer.receive(timeout_millis=30000))
            await asyncio.sleep(0.05)
            producer = await client.create_producer(topic)
            await producer.send(b"after the wait")
            got = await waiting
            return left_idle, len(q._async_waiters), got.data()  # noqa: SLF001

    assert asyncio.run(main()) == (0, 0, b"after the wait")
