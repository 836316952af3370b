"""``create_reader(..., reader_listener=f)`` side by side with the official ``pulsar-client``.

Each test body runs on ``pulsar.Client`` and on ``txn.Client`` (``api`` gives the module and a
client) and asserts the same exact outcomes: every message handed to ``f(reader, message)`` once,
in order (per partition on a partitioned topic), on a thread other than the caller's;
``read_next()`` refused while a listener is set; a listener that raises gets the next message;
no call after ``close()``. One difference, named where it shows: the official client hands the
listener its ``Consumer`` wrapper of the reader, ours the ``Reader`` itself (both have ``topic()``).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pytest

import txn
from txn.admin import create_partitioned_topic


@pytest.fixture(params=["pulsar", "txn"])
def api(request: pytest.FixtureRequest, broker: Any) -> Iterator[tuple[Any, Any]]:
    if request.param == "pulsar":
        mod: Any = pulsar
        client = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    else:
        mod, client = txn, txn.Client(broker.service_url)
    yield mod, client
    client.close()


class _Recorder:
    """A reader listener that records (reader's topic, data, id text, thread) and signals when
    ``want`` messages arrived; ``fail`` makes it raise on the data it names."""

    def __init__(self, want: int, fail: Callable[[bytes], bool] = lambda _d: False) -> None:
        self.want = want
        self.fail = fail
        self.got: list[tuple[str, bytes, str, str]] = []
        self.topics: list[str] = []
        self.done = threading.Event()

    def __call__(self, reader: Any, msg: Any) -> None:
        self.got.append((msg.topic_name(), msg.data(), str(msg.message_id()), threading.current_thread().name))
        self.topics.append(reader.topic())
        if len(self.got) >= self.want:
            self.done.set()
        if self.fail(msg.data()):
            raise RuntimeError(f"listener fails on {msg.data()!r}")

    def wait(self) -> None:
        assert self.done.wait(20), f"only {len(self.got)} of {self.want} messages reached the listener"
        time.sleep(0.5)  # nothing more may follow


def test_listener_reads_a_topic_in_order(api: tuple[Any, Any], broker: Any, unique_name: Callable[[str], str]) -> None:
    """Every message from the start, once, in order, with the producer's ids, on the client's
    thread; ``read_next()`` raises ``InvalidConfiguration``; nothing is left available."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('rl')}"
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [b"m%d" % i for i in range(20)]
    ids = [str(producer.send(d)) for d in sent]
    rec = _Recorder(20)
    reader = client.create_reader(topic, mod.MessageId.earliest, reader_listener=rec)
    rec.wait()
    assert [(t, d, i) for t, d, i, _ in rec.got] == [(topic, d, i) for d, i in zip(sent, ids, strict=True)]
    assert rec.topics == [topic] * 20
    assert {th for *_, th in rec.got} != {threading.current_thread().name}
    assert len({th for *_, th in rec.got}) == 1
    with pytest.raises(mod.InvalidConfiguration):
        reader.read_next(100)
    assert reader.has_message_available() is False
    producer.send(b"late")
    deadline = time.monotonic() + 10
    while len(rec.got) < 21 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [d for _, d, _, _ in rec.got] == [*sent, b"late"]
    reader.close()


def test_listener_starts_after_a_message_id_in_a_batch(api: tuple[Any, Any], broker: Any,
                                                       unique_name: Callable[[str], str]) -> None:
    """A start inside a batch entry, exclusive and inclusive: the listener gets what follows it
    (the start too, inclusive), in order."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('rl')}"
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                      batching_max_messages=10)
    ids: list[Any] = [None] * 10
    done = threading.Event()

    def sent(i: int) -> Callable[[Any, Any], None]:
        def cb(_res: Any, mid: Any) -> None:
            ids[i] = mid
            if all(x is not None for x in ids):
                done.set()
        return cb

    for i in range(10):
        producer.send_async(b"b%d" % i, sent(i))
    producer.flush()
    assert done.wait(10)
    assert [m.batch_index() for m in ids] == list(range(10))  # one batch entry
    for inclusive, first in ((False, 4), (True, 3)):
        rec = _Recorder(10 - first)
        reader = client.create_reader(topic, ids[3], start_message_id_inclusive=inclusive, reader_listener=rec)
        rec.wait()
        assert [d for _, d, _, _ in rec.got] == [b"b%d" % i for i in range(first, 10)]
        assert [i for _, _, i, _ in rec.got] == [str(m) for m in ids[first:]]
        reader.close()


def test_listener_reads_every_partition(api: tuple[Any, Any], broker: Any, unique_name: Callable[[str], str]) -> None:
    """A partitioned topic: every message once, each partition's in order, from earliest; the
    listener's reader names the partitioned topic."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('rlp')}"
    create_partitioned_topic(broker.admin_url, topic, 3)
    sent: dict[str, list[bytes]] = {}
    for p in range(3):
        part = f"{topic}-partition-{p}"
        producer = client.create_producer(part, batching_enabled=False)
        sent[part] = [b"p%d-%d" % (p, i) for i in range(8)]
        for d in sent[part]:
            producer.send(d)
        producer.close()
    rec = _Recorder(24)
    reader = client.create_reader(topic, mod.MessageId.earliest, reader_listener=rec)
    rec.wait()
    by_partition: dict[str, list[bytes]] = defaultdict(list)
    for t, d, _, _ in rec.got:
        by_partition[t].append(d)
    assert dict(by_partition) == sent
    assert len(rec.got) == 24
    assert set(rec.topics) == {topic}
    with pytest.raises(mod.InvalidConfiguration):
        reader.read_next(100)
    reader.close()


def test_listener_that_raises_gets_the_next_message(api: tuple[Any, Any], broker: Any,
                                                    unique_name: Callable[[str], str]) -> None:
    """An exception from the listener is logged; the next message follows, in order, none twice."""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('rl')}"
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [b"m%d" % i for i in range(10)]
    for d in sent:
        producer.send(d)
    rec = _Recorder(10, fail=lambda d: int(d[1:]) % 2 == 1)
    reader = client.create_reader(topic, mod.MessageId.earliest, reader_listener=rec)
    rec.wait()
    assert [d for _, d, _, _ in rec.got] == sent
    reader.close()


def test_close_while_the_listener_runs(api: tuple[Any, Any], broker: Any, unique_name: Callable[[str], str]) -> None:
    """``close()`` while the listener is busy with a message: no call follows, and ``read_next``
    raises ``AlreadyClosed``. (The official ``close()`` returns at once; ours waits for the call in
    progress, as our consumer's does.)"""
    mod, client = api
    topic = f"persistent://public/default/{unique_name('rl')}"
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(b"m%d" % i)
    at_m2, release = threading.Event(), threading.Event()
    got: list[bytes] = []

    def listener(_reader: Any, msg: Any) -> None:
        got.append(msg.data())
        if msg.data() == b"m2":
            at_m2.set()
            release.wait(5)

    reader = client.create_reader(topic, mod.MessageId.earliest, reader_listener=listener)
    assert at_m2.wait(10)
    threading.Timer(0.5, release.set).start()
    reader.close()
    release.wait(5)
    time.sleep(1)
    assert got == [b"m0", b"m1", b"m2"]
    with pytest.raises(mod.AlreadyClosed):
        reader.read_next(100)


def test_a_reader_listener_must_be_callable(broker: Any) -> None:
    """Ours only: a listener that is not callable is a ``ValueError`` at once (as ``message_listener``;
    the official client takes it and logs a ``TypeError`` for each message)."""
    client = txn.Client(broker.service_url)
    try:
        with pytest.raises(ValueError, match="reader_listener must be callable"):
            client.create_reader("persistent://public/default/never-created", txn.MessageId.earliest,
                                 reader_listener=5)
    finally:
        client.close()


def test_async_client_reader_listener(broker: Any, unique_name: Callable[[str], str]) -> None:
    """Ours only (``pulsar.asyncio`` has no reader listener): ``AsyncClient.create_reader``'s
    listener runs on the event loop with the reader; a coroutine it returns is awaited before the
    next message."""
    import asyncio

    topic = f"persistent://public/default/{unique_name('rla')}"

    async def run() -> tuple[list[bytes], list[bool]]:
        client = txn.AsyncClient(broker.service_url)
        try:
            producer = await client.create_producer(topic, batching_enabled=False)
            for i in range(5):
                await producer.send(b"a%d" % i)
            got: list[bytes] = []
            same: list[bool] = []
            done = asyncio.Event()
            holder: dict[str, Any] = {}

            async def listener(reader: Any, msg: Any) -> None:
                await asyncio.sleep(0.01)
                got.append(msg.data())
                same.append(reader is holder["reader"])
                if len(got) == 5:
                    done.set()

            holder["reader"] = await client.create_reader(topic, txn.MessageId.earliest, reader_listener=listener)
            await asyncio.wait_for(done.wait(), 20)
            with pytest.raises(txn.InvalidConfiguration):
                await holder["reader"].read_next(100)
            await holder["reader"].close()
            return got, same
        finally:
            await client.close()

    got, same = asyncio.run(run())
    assert got == [b"a%d" % i for i in range(5)]
    assert same == [True] * 5
