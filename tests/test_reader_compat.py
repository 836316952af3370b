"""Readers side by side with the official ``pulsar-client`` (issue 19): partitioned topics,
``is_connected()``, and ``MessageId.latest`` with ``start_message_id_inclusive=True``.

Each test body runs on ``pulsar.Client`` and on ``txn.Client`` (``api`` gives the module and a
client) and asserts the same outcomes, except where a comment names a difference."""

from __future__ import annotations

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


#: How long a read that must succeed may wait: a partition's first load can take several seconds
#: on a loaded machine (both clients timed out at 5 s there once, in the same run).
READ_MS = 30000


def _topic(broker: Any, unique_name: Callable[[str], str], partitions: int) -> str:
    name = f"persistent://public/default/{unique_name('rc')}"
    if partitions:
        create_partitioned_topic(broker.admin_url, name, partitions)
    return name


def _drain(reader: Any) -> list[Any]:
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(READ_MS))
    return out


def _read_until(reader: Any, done: Callable[[list[Any]], bool], quiet_ms: int = 1000) -> list[Any]:
    """Read until ``done(read)`` holds (each read waits up to READ_MS), then until a read waits
    ``quiet_ms`` in vain, so that anything extra shows too; at most 200 messages."""
    out: list[Any] = []
    while not done(out) and len(out) < 200:
        out.append(reader.read_next(READ_MS))
    while len(out) < 200:
        try:
            out.append(reader.read_next(quiet_ms))
        except pulsar.Timeout:
            return out
    return out


def _data(msgs: list[Any]) -> list[bytes]:
    return sorted(m.data() for m in msgs)


def test_a_reader_reads_every_partition(api, broker, unique_name):
    """The official test_reader_on_partitioned_topic, and more: each partition in order, nothing
    twice, nothing left at the end, one more message seen once sent; connected until closed."""
    mod, client = api
    topic = _topic(broker, unique_name, 4)
    producer = client.create_producer(topic)
    sent = [b"hello-%d" % i for i in range(100)]
    for data in sent:
        producer.send(data)
    reader = client.create_reader(topic, mod.MessageId.earliest)
    assert reader.topic() == topic
    assert reader.is_connected() is True
    msgs = [reader.read_next(READ_MS) for _ in sent]
    assert _data(msgs) == sorted(sent) and len({m.data() for m in msgs}) == len(sent)
    order: dict[str, list[int]] = defaultdict(list)
    for m in msgs:
        order[m.topic_name()].append(int(m.data().split(b"-")[1]))
    assert sorted(order) == [f"{topic}-partition-{i}" for i in range(4)]
    assert all(seq == sorted(seq) for seq in order.values())
    assert reader.has_message_available() is False
    with pytest.raises(mod.Timeout):
        reader.read_next(300)
    producer.send(b"one-more")
    assert reader.has_message_available() is True
    assert reader.read_next(READ_MS).data() == b"one-more"
    assert reader.has_message_available() is False
    producer.close()
    reader.close()
    assert reader.is_connected() is False


@pytest.mark.parametrize("partitions", [0, 3])
def test_is_connected_until_closed(api, broker, unique_name, partitions):
    mod, client = api
    topic = _topic(broker, unique_name, partitions)
    client.create_producer(topic).close()
    reader = client.create_reader(topic, mod.MessageId.earliest)
    assert reader.is_connected() is True
    reader.close()
    assert reader.is_connected() is False
    with pytest.raises(mod.AlreadyClosed):
        reader.read_next(100)


@pytest.mark.parametrize("partitions", [0, 4])
def test_latest_inclusive_hands_out_the_last_message(api, broker, unique_name, partitions):
    """The official test_seek_latest_message_id: ``has_message_available()`` puts a reader at the
    last message (of each partition) when nothing was read yet; a ``read_next()`` before it waits
    for a new message, as a plain ``latest`` reader does."""
    mod, client = api
    topic = _topic(broker, unique_name, partitions)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"m%d" % i) for i in range(8)]
    last = {mid.partition(): b"m%d" % i for i, mid in enumerate(ids)}  # partition -> its last message
    reader = client.create_reader(topic, mod.MessageId.latest)
    assert reader.has_message_available() is False
    reader.close()
    reader = client.create_reader(topic, mod.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available() is True
    msgs = [reader.read_next(READ_MS) for _ in last]
    assert _data(msgs) == sorted(last.values())
    if not partitions:
        assert msgs[0].message_id() == ids[-1]
    assert reader.has_message_available() is False
    reader.close()

    reader = client.create_reader(topic, mod.MessageId.latest, start_message_id_inclusive=True)
    with pytest.raises(mod.Timeout):
        reader.read_next(500)
    new_id = producer.send(b"new")
    assert reader.read_next(READ_MS).data() == b"new"
    # The partitions nothing was read from go to their last message at the next check.
    rest = [data for p, data in last.items() if p != new_id.partition()]
    assert _data(_drain(reader)) == sorted(rest)
    reader.close()
    producer.close()


def test_latest_inclusive_in_a_batch_hands_out_its_last_message(api, broker, unique_name):
    mod, client = api
    topic = _topic(broker, unique_name, 0)
    producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=100)
    for i in range(5):
        producer.send_async(b"b%d" % i, lambda *_: None)
    producer.flush()
    reader = client.create_reader(topic, mod.MessageId.latest, start_message_id_inclusive=True)
    assert [m.data() for m in _drain(reader)] == [b"b4"]
    reader.close()
    producer.close()


@pytest.mark.parametrize("partitions", [0, 3])
def test_latest_inclusive_on_an_empty_topic(api, broker, unique_name, partitions):
    mod, client = api
    topic = _topic(broker, unique_name, partitions)
    producer = client.create_producer(topic)
    reader = client.create_reader(topic, mod.MessageId.latest, start_message_id_inclusive=True)
    assert reader.has_message_available() is False
    with pytest.raises(mod.Timeout):
        reader.read_next(300)
    producer.send(b"after")
    if mod is txn or not partitions:
        # The official partitioned reader answers False here now and then (1 run in 10): the
        # message is on its way from a partition's queue to the reader's, counted in neither.
        assert reader.has_message_available() is True
    assert reader.read_next(READ_MS).data() == b"after"
    assert reader.has_message_available() is False
    reader.close()
    producer.close()


@pytest.mark.parametrize(("inclusive", "rebuilt"), [(False, False), (True, True)])
def test_a_message_id_start_on_a_partitioned_topic(api, broker, unique_name, inclusive, rebuilt):
    """The id is every partition's start, as in the official client: a partition whose ledger
    follows the id's is read whole, one whose ledger precedes it from its end (what is sent
    later), the id's own partition from the id. ``rebuilt``: the id made from its ledger and
    entry only (no partition, no topic)."""
    mod, client = api
    topic = _topic(broker, unique_name, 4)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(b"m%d" % i) for i in range(8)]
    ledgers = sorted(mid.ledger_id() for mid in ids[:4])
    start = next(mid for mid in ids if mid.ledger_id() == ledgers[2] and mid.entry_id() == 0)
    if rebuilt:
        start = mod.MessageId(ledger_id=start.ledger_id(), entry_id=start.entry_id())
    key = (start.ledger_id(), start.entry_id())
    expected = [b"m%d" % i for i, mid in enumerate(ids)
                if (mid.ledger_id(), mid.entry_id()) > key or (inclusive and (mid.ledger_id(), mid.entry_id()) == key)]
    reader = client.create_reader(topic, start, start_message_id_inclusive=inclusive)
    assert reader.has_message_available() is True
    assert _data(_drain(reader)) == sorted(expected)
    later = [b"n%d" % i for i in range(8)]
    for data in later:
        producer.send(data)
    assert _data([reader.read_next(READ_MS) for _ in later]) == sorted(later)
    assert reader.has_message_available() is False
    reader.close()
    producer.close()


def test_seek_on_a_partitioned_topic(api, broker, unique_name):
    """Earliest, latest and a publish time move every partition; an id without a topic is refused
    with OperationNotSupported; the id of a message read moves its partition. Difference: the
    official client then drops the messages of the other partitions it had received and not
    handed out; ours hands them out still."""
    mod, client = api
    topic = _topic(broker, unique_name, 4)
    producer = client.create_producer(topic, batching_enabled=False)
    sent = [b"m%02d" % i for i in range(20)]
    for data in sent:
        producer.send(data)
    reader = client.create_reader(topic, mod.MessageId.earliest)
    assert _data(_drain(reader)) == sent
    reader.seek(mod.MessageId.earliest)
    assert _data(_drain(reader)) == sent
    reader.seek(mod.MessageId.latest)
    assert reader.has_message_available() is False
    reader.seek(0)
    msgs = [reader.read_next(READ_MS) for _ in sent]
    assert _data(msgs) == sent
    bare = mod.MessageId(ledger_id=msgs[0].message_id().ledger_id(), entry_id=msgs[0].message_id().entry_id())
    with pytest.raises(mod.OperationNotSupported):
        reader.seek(bare)

    reader.seek(mod.MessageId.earliest)
    first = [reader.read_next(READ_MS) for _ in range(6)]
    target = first[0]
    reader.seek(target.message_id())
    after = sorted(d for d in sent if d > target.data() and d in _partition_data(msgs, target.topic_name()))
    if mod is txn:
        rest = _drain(reader)
    else:
        # The official client drops what the other partitions deliver while the seek is under way,
        # and their has_message_available() can then stay True with nothing left to come (CI hung
        # here once, 30 s in read_next): read until the sought partition's messages are in.
        rest = _read_until(reader, lambda got: sorted(d for d in _partition_data(got, target.topic_name())
                                                      if d > target.data()) == after)
    in_partition = [m.data() for m in rest if m.topic_name() == target.topic_name()]
    assert in_partition == after
    if mod is txn:
        read = {m.data() for m in first if m.topic_name() != target.topic_name()}
        assert _data(rest) == sorted(after + [d for d in sent if d not in read and
                                              d not in _partition_data(msgs, target.topic_name())])
    reader.close()
    producer.close()


def _partition_data(msgs: list[Any], partition: str) -> list[bytes]:
    return [m.data() for m in msgs if m.topic_name() == partition]


def test_a_partitioned_reader_unloaded_half_way_resumes_each_partition(broker, unique_name):
    """Ours only: the broker closes every partition's reader half-way (a topic unload); each
    partition resubscribes after the last message read from it: nothing twice, nothing lost."""
    from txn.admin import admin_request

    topic = _topic(broker, unique_name, 3)
    client = txn.Client(broker.service_url)
    try:
        # Never acks: the unload closes the ledgers, and retention none deletes closed ledgers of topics without one.
        client.subscribe(topic, "hold", initial_position=txn.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=50)
        sent = [b"m%02d" % i for i in range(30)]
        for data in sent:
            producer.send_async(data, lambda *_: None)
        producer.flush()
        reader = client.create_reader(topic, txn.MessageId.earliest)
        got = [reader.read_next(READ_MS) for _ in range(10)]
        made = reader.async_reader._consumer.subscriptions_made  # noqa: SLF001 - a look inside, for the test
        status, _ = admin_request("PUT", broker.admin_url, "/admin/v2/" + topic.replace("://", "/") + "/unload",
                                  timeout=30)
        assert status in (200, 204)
        got += _drain(reader)
        assert reader.async_reader._consumer.subscriptions_made > made  # noqa: SLF001 - resubscribed
        assert sorted(m.data() for m in got) == sent
        reader.close()
    finally:
        client.close()
