"""``txn.asyncio`` against the official ``pulsar.asyncio`` (issue 19): code written for the official
module runs unchanged with ``txn.asyncio`` in its place.

Each scenario of the official ``tests/asyncio_test.py`` (written afresh) is one test body,
parametrised over the two modules: ``side.aio`` is ``pulsar.asyncio`` or ``txn.asyncio`` and
``side.top`` is ``pulsar`` or ``txn``, and both runs assert the same exact outcomes against the
shared broker. Broker-free: the official module's public names, classes, methods and signatures
exist here (the gaps listed with their reasons), and every ``txn`` error is caught as
``PulsarException`` with the matching ``error()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pulsar
import pulsar.asyncio
import pulsar.schema
import pytest

import txn
import txn.asyncio
import txn.schema
from txn import errors
from txn.admin import create_partitioned_topic
from txn.asyncio_compat import as_pulsar_exception

# ============================================================ names and signatures (no broker)

#: Public names of ``pulsar.asyncio`` that are its own imports, not its API.
NOT_API = {"Any", "Callable", "List", "Union", "timedelta", "asyncio", "functools", "pulsar"}

#: Keywords that exist with the official name, position and default, but whose non-default values
#: ``txn`` does not implement: they raise ``TypeError`` naming the keyword. Each with its reason.
ACCEPTED_GAPS = {
    ("subscribe", "replicate_subscription_state_enabled", True): "no geo-replication options",
}


def _official_api() -> set[str]:
    return {n for n in dir(pulsar.asyncio) if not n.startswith("_")} - NOT_API


def test_every_official_name_exists() -> None:
    assert _official_api() == set(txn.asyncio.__all__)
    assert sorted(n for n in _official_api() if not hasattr(txn.asyncio, n)) == []


@pytest.mark.parametrize("name", ["BatchingType", "CompressionType", "ConsumerCryptoFailureAction", "InitialPosition",
                                  "PartitionsRoutingMode", "ProducerAccessMode", "RegexSubscriptionMode"])
def test_enums_have_the_official_members(name: str) -> None:
    theirs = {k: int(v) for k, v in getattr(pulsar.asyncio, name).__members__.items()}
    ours = {k: int(v) for k, v in getattr(txn.asyncio, name).__members__.items()}
    assert theirs.items() <= ours.items()


def _default(value: Any) -> Any:
    """A default comparable across the modules: enums by name and value."""
    if hasattr(value, "name") and hasattr(value, "__int__") and not isinstance(value, bool | int):
        return value.name, int(value)
    if hasattr(value, "name") and isinstance(value, int) and not isinstance(value, bool):
        return value.name, int(value)
    return value


@pytest.mark.parametrize("cls", ["Client", "Producer", "Consumer", "Reader", "PulsarException"])
def test_every_official_method_exists_with_its_signature(cls: str) -> None:
    theirs, ours = getattr(pulsar.asyncio, cls), getattr(txn.asyncio, cls)
    names = sorted(n for n in vars(theirs) if not n.startswith("_"))
    assert names, cls
    for name in [*names, "__init__"] if cls in ("Client", "PulsarException") else names:
        t, o = getattr(theirs, name), getattr(ours, name)
        assert inspect.iscoroutinefunction(t) == inspect.iscoroutinefunction(o), name
        tp, op = inspect.signature(t).parameters, inspect.signature(o).parameters
        assert list(tp) == list(op), name
        for p in tp:
            assert tp[p].kind == op[p].kind, (name, p)
            assert _default(tp[p].default) == _default(op[p].default), (name, p)


def test_exceptions_are_pulsar_exceptions_with_their_result() -> None:
    """Every ``txn`` error class, raised through the module, is caught by ``except PulsarException``
    and by its own class; ``error()`` is its ``Result``. A builtin ``TimeoutError`` is ``Timeout``."""
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.PulsarError)]
    assert len(classes) > 45
    for cls in classes:
        exc = cls("boom", topic="t")
        got = as_pulsar_exception(exc)
        assert isinstance(got, txn.asyncio.PulsarException) and isinstance(got, cls), cls
        assert got.error() is cls.result and str(got) == f"{cls.result.value} {cls.result.name}: boom | topic=t"
        assert got.topic == "t"
    timeout = as_pulsar_exception(TimeoutError())
    assert isinstance(timeout, txn.asyncio.PulsarException) and timeout.error() is txn.Result.Timeout
    theirs = pulsar.asyncio.PulsarException(pulsar.Result.Timeout, "late")
    ours = txn.asyncio.PulsarException(txn.Result.Timeout, "late")
    assert str(ours) == str(theirs) == "3 Timeout: late"
    assert str(txn.asyncio.PulsarException(txn.Result.AlreadyClosed)) == "15 AlreadyClosed"
    assert isinstance(ours, txn.PulsarException)


@pytest.mark.parametrize(("method", "keyword", "value"), list(ACCEPTED_GAPS), ids=lambda v: str(v)[:30])
def test_accepted_gaps_raise_type_error_naming_the_keyword(method: str, keyword: str, value: Any) -> None:
    async def go() -> None:
        client = txn.asyncio.Client("pulsar://127.0.0.1:1")  # never connected: refused before
        args = {"create_producer": ("t",), "subscribe": ("t", "s"), "create_reader": ("t", txn.MessageId.earliest)}
        if keyword == "chunking_enabled":
            await getattr(client, method)(*args[method], batching_enabled=False, **{keyword: value})
        else:
            await getattr(client, method)(*args[method], **{keyword: value})

    with pytest.raises(TypeError, match=keyword):
        asyncio.run(go())


def test_submodule_leaves_the_standard_asyncio_alone() -> None:
    import txn.client
    import txn.producer.async_producer

    assert asyncio.__name__ == "asyncio" and asyncio.get_event_loop_policy is not None
    assert txn.client.asyncio is asyncio and txn.producer.async_producer.asyncio is asyncio
    assert txn.asyncio.__name__ == "txn.asyncio" and txn.asyncio.Client is txn.asyncio_compat.Client


# ============================================================ scenarios on the broker


@dataclass(frozen=True)
class Side:
    """One module under test: ``aio`` (the asyncio module) and ``top`` (its package)."""

    aio: ModuleType
    top: ModuleType
    schema: ModuleType

    @property
    def name(self) -> str:
        return self.top.__name__


SIDES = {"pulsar": Side(pulsar.asyncio, pulsar, pulsar.schema), "txn": Side(txn.asyncio, txn, txn.schema)}


@pytest.fixture(params=list(SIDES))
def side(request: pytest.FixtureRequest) -> Side:
    return SIDES[request.param]


@pytest.fixture
def url(broker: Any) -> str:
    return broker.service_url


def run(side: Side, url: str, scenario: Callable[[Any], Awaitable[Any]]) -> Any:
    """Run ``scenario(client)`` on a fresh client of ``side`` and close the client."""

    async def go() -> Any:
        client = side.aio.Client(url, operation_timeout_seconds=5)
        try:
            return await asyncio.wait_for(scenario(client), 20)
        finally:
            with contextlib.suppress(side.aio.PulsarException):
                await client.close()

    return asyncio.run(go())


async def _send_five(producer: Any) -> list[Any]:
    return [await producer.send(f"msg-{i}".encode()) for i in range(5)]


async def _receive(consumer: Any, n: int) -> list[bytes]:
    return [(await asyncio.wait_for(consumer.receive(), 10)).data() for _ in range(n)]


def test_concurrent_sends_share_one_batch(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic, producer_name=f"{topic.rsplit('/', 1)[1]}-p")
        assert producer.topic() == topic and producer.producer_name() == f"{topic.rsplit('/', 1)[1]}-p"
        ids = await asyncio.gather(*(producer.send(f"msg-{i}".encode()) for i in range(5)))
        assert all(isinstance(i, side.top.MessageId) for i in ids)
        assert {(i.ledger_id(), i.entry_id()) for i in ids} == {(ids[0].ledger_id(), ids[0].entry_id())}
        assert [i.batch_index() for i in ids] == [0, 1, 2, 3, 4]
        assert producer.last_sequence_id() == 4
        consumer = await client.subscribe(topic, "sub", initial_position=side.top.InitialPosition.Earliest)
        assert await _receive(consumer, 5) == [f"msg-{i}".encode() for i in range(5)]
        await consumer.close()
        latest = await client.subscribe(topic, "sub2")  # the default initial position is Latest
        await producer.send(b"final-message")
        assert await _receive(latest, 1) == [b"final-message"]

    run(side, url, scenario)


def test_keyed_message(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "sub")
        await producer.send(b"msg", partition_key="key0", ordering_key="key1", properties={"my-prop": "my-value"})
        msg = await asyncio.wait_for(consumer.receive(), 10)
        assert (msg.data(), msg.partition_key(), msg.ordering_key(), msg.properties()) == \
            (b"msg", "key0", "key1", {"my-prop": "my-value"})

    run(side, url, scenario)


def test_flush_sends_the_open_batch(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic, batching_max_messages=3, batching_max_publish_delay_ms=60000)
        tasks = [asyncio.ensure_future(producer.send(f"msg-{i}".encode())) for i in range(2)]
        done, pending = await asyncio.wait(tasks, timeout=0.3)
        assert (len(done), len(pending)) == (0, 2)
        await producer.flush()
        assert all(t.done() for t in tasks)
        a, b = tasks[0].result(), tasks[1].result()
        assert (a.ledger_id(), a.entry_id()) == (b.ledger_id(), b.entry_id())
        assert (a.batch_index(), b.batch_index()) == (0, 1)

    run(side, url, scenario)


def test_acknowledge_cumulative(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        consumer = await client.subscribe(topic, "sub")
        producer = await client.create_producer(topic)
        await _send_five(producer)
        last = None
        for _ in range(5):
            last = await asyncio.wait_for(consumer.receive(), 10)
        await consumer.acknowledge_cumulative(last)
        await consumer.close()
        consumer = await client.subscribe(topic, "sub")
        await producer.send(b"final-message")
        assert await _receive(consumer, 1) == [b"final-message"]

    run(side, url, scenario)


def test_acknowledge_individual(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        shared = side.top.ConsumerType.Shared
        consumer = await client.subscribe(topic, "sub", consumer_type=shared)
        producer = await client.create_producer(topic)
        await _send_five(producer)
        msgs = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(5)]
        for i in (0, 2, 4):
            await consumer.acknowledge(msgs[i])
        await consumer.close()
        consumer = await client.subscribe(topic, "sub", consumer_type=shared)
        assert await _receive(consumer, 2) == [b"msg-1", b"msg-3"]

    run(side, url, scenario)


def test_negative_acknowledge_redelivers(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        consumer = await client.subscribe(topic, "sub", consumer_type=side.top.ConsumerType.Shared,
                                          negative_ack_redelivery_delay_ms=100)
        producer = await client.create_producer(topic)
        await _send_five(producer)
        msgs = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(5)]
        for i in (1, 3):
            await consumer.acknowledge(msgs[i])
        for i in (0, 2, 4):
            await consumer.negative_acknowledge(msgs[i])
        await asyncio.sleep(0.2)
        again = [await asyncio.wait_for(consumer.receive(), 10) for _ in range(3)]
        assert sorted(m.data() for m in again) == [b"msg-0", b"msg-2", b"msg-4"]
        assert [m.redelivery_count() for m in again] == [1, 1, 1]
        await consumer.close()
        await consumer.negative_acknowledge(msgs[0])  # closed: nothing, as there
        consumer.redeliver_unacknowledged_messages()

    run(side, url, scenario)


def test_list_of_topics_and_names(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        topics = [f"{topic}-1", f"{topic}-2"]
        producers = [await client.create_producer(t) for t in topics]
        single = await client.subscribe(topics[0], "one", consumer_name="me")
        assert (single.topic(), single.subscription_name(), single.consumer_name()) == (topics[0], "one", "me")
        consumer = await client.subscribe(topics, "multi")
        await producers[0].send(b"from-1")
        await producers[1].send(b"from-2")
        got = set()
        for _ in range(2):
            msg = await asyncio.wait_for(consumer.receive(), 10)
            got.add((msg.data(), msg.topic_name()))
            await consumer.acknowledge(msg.message_id())
        assert got == {(b"from-1", topics[0]), (b"from-2", topics[1])}

    run(side, url, scenario)


def test_pattern_topic(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        topics = [f"{topic}-rx-1", f"{topic}-rx-2", f"non-persistent{topic[10:]}-rx-3", f"{topic}-other"]
        producers = [await client.create_producer(t) for t in topics]
        consumer = await client.subscribe(f"{topic}-rx-.*", "sub", is_pattern_topic=True,
                                          regex_subscription_mode=side.aio.RegexSubscriptionMode.AllTopics)
        assert (consumer.topic(), consumer.consumer_name()) == (f"{topic}-rx-.*", "")
        for p in producers:
            await p.send(p.topic().encode())
        got = set()
        for _ in range(3):
            msg = await asyncio.wait_for(consumer.receive(), 10)
            got.add((msg.data().decode(), msg.topic_name()))
            await consumer.acknowledge(msg)
        assert got == {(t, t) for t in topics[:3]}
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(consumer.receive(), 0.5)
        with pytest.raises(ValueError, match="must be a string when 'is_pattern_topic' is True"):
            await client.subscribe(topics, "sub2", is_pattern_topic=True)
        with pytest.raises(ValueError, match="expected to be of type 'str' or 'list'"):
            await client.subscribe(re.compile(topic), "sub2")

    run(side, url, scenario)


def test_get_last_message_id_and_unsubscribe(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        consumer = await client.subscribe(topic, "sub", consumer_type=side.top.ConsumerType.Shared)
        producer = await client.create_producer(topic)
        entries = []
        for i in range(3):
            await producer.send(f"msg-{i}".encode())
            entries.append((await consumer.get_last_message_id()).entry_id())
        assert entries == [0, 1, 2]
        await consumer.unsubscribe()
        with pytest.raises(side.aio.PulsarException) as info:
            await consumer.unsubscribe()
        assert info.value.error() == side.top.Result.AlreadyClosed
        consumer = await client.subscribe(topic, "sub")  # the name is free again
        await consumer.close()
        await consumer.close()  # again: nothing, as there

    run(side, url, scenario)


def test_seek_by_message_id(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        ids = await _send_five(producer)
        earliest = side.top.InitialPosition.Earliest
        consumer = await client.subscribe(topic, "sub", initial_position=earliest)
        await consumer.seek(ids[2])
        assert await _receive(consumer, 1) == [b"msg-3"]
        await consumer.close()
        consumer = await client.subscribe(topic, "sub", initial_position=earliest, start_message_id_inclusive=True)
        await consumer.seek(ids[2])
        assert await _receive(consumer, 1) == [b"msg-2"]
        with pytest.raises(ValueError):
            await consumer.seek("x")

    run(side, url, scenario)


def test_seek_by_publish_time(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        consumer = await client.subscribe(topic, "sub", initial_position=side.top.InitialPosition.Earliest)
        producer = await client.create_producer(topic)
        for i in range(3):
            await producer.send(f"msg-{i}".encode())
        await asyncio.sleep(0.05)
        seek_time = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        for i in range(3, 5):
            await producer.send(f"msg-{i}".encode())
        assert await _receive(consumer, 5) == [f"msg-{i}".encode() for i in range(5)]
        await consumer.seek(seek_time)
        assert await _receive(consumer, 1) == [b"msg-3"]

    run(side, url, scenario)


def test_reader_read_next(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        reader = await client.create_reader(topic, side.top.MessageId.earliest)
        assert reader.is_connected() and reader.topic() == topic
        producer = await client.create_producer(topic)
        await producer.send(b"hello")
        assert (await asyncio.wait_for(reader.read_next(), 10)).data() == b"hello"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.read_next(), 0.5)
        await reader.close()
        assert not reader.is_connected()
        await reader.close()  # again: nothing, as there
        with pytest.raises(side.aio.PulsarException) as info:
            await reader.read_next()
        assert info.value.error() == side.top.Result.AlreadyClosed

    run(side, url, scenario)


def test_reader_from_latest_and_from_an_id(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        ids = [await producer.send(f"hello-{i}".encode()) for i in range(5)]
        latest = await client.create_reader(topic, side.top.MessageId.latest)
        for i in range(5, 8):
            await producer.send(f"hello-{i}".encode())
        assert [(await latest.read_next()).data() for _ in range(3)] == [f"hello-{i}".encode() for i in range(5, 8)]
        after = await client.create_reader(topic, ids[2])
        assert [(await after.read_next()).data() for _ in range(5)] == [f"hello-{i}".encode() for i in range(3, 8)]

    run(side, url, scenario)


def test_reader_has_message_available(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        reader = await client.create_reader(topic, side.top.MessageId.latest)
        assert not await reader.has_message_available()
        for i in range(5):
            await producer.send(f"hello-{i}".encode())
        seen = []
        for _ in range(5):
            seen.append(await reader.has_message_available())
            await reader.read_next()
        assert seen == [True] * 5
        assert not await reader.has_message_available()

    run(side, url, scenario)


def test_reader_seek(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        ids = [await producer.send(f"msg-{i}".encode()) for i in range(5)]
        got = []
        for inclusive in (False, True):
            reader = await client.create_reader(topic, side.top.MessageId.latest,
                                                start_message_id_inclusive=inclusive)
            await reader.seek(ids[2])
            got.append((await asyncio.wait_for(reader.read_next(), 10)).data())
            await reader.close()
        assert got == [b"msg-3", b"msg-2"]

    run(side, url, scenario)


def test_schema(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic, schema=side.schema.StringSchema())
        consumer = await client.subscribe(topic, "sub", schema=side.schema.StringSchema())
        await producer.send("héllo")
        assert (await asyncio.wait_for(consumer.receive(), 10)).value() == "héllo"

    run(side, url, scenario)


@pytest.fixture(scope="module")
def rsa_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    d = tmp_path_factory.mktemp("rsa")
    (d / "private.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    (d / "public.pem").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(d / "public.pem"), str(d / "private.pem")


def test_encryption(side: Side, url: str, topic: str, rsa_pair: tuple[str, str]) -> None:
    async def scenario(client: Any) -> None:
        keys = side.top.CryptoKeyReader(*rsa_pair)
        consumer = await client.subscribe(topic, "sub", crypto_key_reader=keys)
        raw = await client.subscribe(topic, "raw", crypto_failure_action=side.aio.ConsumerCryptoFailureAction.CONSUME)
        producer = await client.create_producer(topic, encryption_key="k", crypto_key_reader=keys)
        reader = await client.create_reader(topic, side.top.MessageId.earliest, crypto_key_reader=keys)
        await producer.send(b"hello")
        msg = await asyncio.wait_for(consumer.receive(), 10)
        assert msg.data() == b"hello" and not msg.encryption_context().is_decryption_failed()
        assert (await asyncio.wait_for(reader.read_next(), 10)).data() == b"hello"
        msg = await asyncio.wait_for(raw.receive(), 10)
        assert msg.data() != b"hello" and msg.encryption_context().is_decryption_failed()

    run(side, url, scenario)


def test_get_topic_partitions(side: Side, url: str, broker: Any, topic: str) -> None:
    partitioned = f"{topic}-p"
    create_partitioned_topic(broker.admin_url, partitioned, 3)

    async def scenario(client: Any) -> None:
        names = [f"{partitioned}-partition-{i}" for i in range(3)]
        assert await client.get_topic_partitions(partitioned) == names
        assert await client.get_topic_partitions(topic) == [topic]
        consumer = await client.subscribe(partitioned, "sub", consumer_type=side.top.ConsumerType.Shared)
        producer = await client.create_producer(partitioned)
        await producer.send(b"hello")
        assert (await asyncio.wait_for(consumer.receive(), 10)).topic_name() in names
        routed = await client.create_producer(partitioned, message_router=lambda msg, n: n - 1)
        await routed.send(b"last")
        assert (await asyncio.wait_for(consumer.receive(), 10)).topic_name() == names[-1]
        with pytest.raises(ValueError):
            await client.get_topic_partitions(5)

    run(side, url, scenario)


def _raises(side: Side, result: str) -> Any:
    """``pytest.raises`` for a ``PulsarException`` whose ``error()`` is ``Result.<result>``."""

    class Check(contextlib.AbstractContextManager):  # type: ignore[type-arg]
        def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
            assert exc is not None, f"no {result} raised"
            assert isinstance(exc, side.aio.PulsarException), repr(exc)
            assert exc.error() == getattr(side.top.Result, result), (str(exc), result)
            return True

    return Check()


def test_errors(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        with _raises(side, "TopicNotFound"):
            await client.create_producer("tenant-missing/ns/asyncio-compat")
        with _raises(side, "InvalidTopicName"):
            await client.subscribe("a//b", "sub")
        with _raises(side, "InvalidConfiguration"):
            await client.subscribe(topic, "")
        producer = await client.create_producer(topic)
        with _raises(side, "MessageTooBig"):
            await producer.send(b"x" * 10 * 1024 * 1024)
        with pytest.raises(TypeError):
            await producer.send("text")
        with pytest.raises(ValueError):
            await client.create_producer(topic, chunking_enabled=True)  # and batching: refused first
        consumer = await client.subscribe(topic, "shared", consumer_type=side.top.ConsumerType.Shared)
        with _raises(side, "CumulativeAcknowledgementNotAllowedError"):
            await consumer.acknowledge_cumulative(await producer.send(b"m"))
        await producer.close()
        assert not producer.is_connected()
        with _raises(side, "AlreadyClosed"):
            await producer.close()
        with _raises(side, "AlreadyClosed"):
            await producer.send(b"late")
        await client.close()
        for call in (client.close, lambda: client.create_producer(topic), lambda: client.subscribe(topic, "s"),
                     lambda: client.create_reader(topic, side.top.MessageId.earliest),
                     lambda: client.get_topic_partitions(topic)):
            with _raises(side, "AlreadyClosed"):
                await call()
        with _raises(side, "AlreadyClosed"):
            await consumer.receive()
        client.shutdown()  # after close: nothing

    run(side, url, scenario)


def test_shutdown(side: Side, url: str, topic: str) -> None:
    async def scenario(client: Any) -> None:
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "sub")
        await producer.send(b"hello")
        assert client.shutdown() is None  # a plain call
        for call in (lambda: producer.send(b"hello"), consumer.receive, producer.close,
                     lambda: client.create_producer(topic)):
            with _raises(side, "AlreadyClosed"):
                await call()
        assert not producer.is_connected()
        client.shutdown()
        await client.close()  # after shutdown: nothing

    run(side, url, scenario)
