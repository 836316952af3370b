"""Readers: non-durable reads from a position; last message id."""

from __future__ import annotations

import pytest

import txn
from txn.admin import admin_request


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


def _produce(client, topic, n, batching=False):
    p = client.create_producer(topic, batching_enabled=batching, batching_max_publish_delay_ms=100)
    if batching:
        for i in range(n):
            p.send_async(f"m{i}".encode(), None)
        p.flush()
        ids = None
    else:
        ids = [p.send(f"m{i}".encode()) for i in range(n)]
    p.close()
    return ids


def _read_all(reader):
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(30000).data())
    return out


def test_reader_from_earliest_latest_and_an_id(client, broker, topic):
    ids = _produce(client, topic, 10)
    r = client.create_reader(topic, txn.EARLIEST)
    assert _read_all(r) == [f"m{i}".encode() for i in range(10)]
    r.close()
    r = client.create_reader(topic, ids[4])
    assert _read_all(r) == [f"m{i}".encode() for i in range(5, 10)]
    r.close()
    r = client.create_reader(topic, ids[4], start_message_id_inclusive=True)
    assert _read_all(r) == [f"m{i}".encode() for i in range(4, 10)]
    r.close()
    r = client.create_reader(topic, txn.LATEST)
    assert r.has_message_available() is False
    _produce(client, topic, 1)
    assert r.read_next(10000).data() == b"m0"
    r.close()
    # Readers leave no durable subscription behind.
    status, stats = admin_request("GET", broker.admin_url, "/admin/v2/" + topic.replace("://", "/") + "/stats")
    assert status == 200 and stats["subscriptions"] == {}


def test_reader_inside_a_batch(client, topic):
    _produce(client, topic, 6, batching=True)
    r = client.create_reader(topic, txn.EARLIEST)
    msgs = [r.read_next(30000) for _ in range(6)]
    r.close()
    assert len({m.message_id().entry_key for m in msgs}) == 1  # one batch
    r = client.create_reader(topic, msgs[2].message_id())
    assert _read_all(r) == [b"m3", b"m4", b"m5"]
    r.close()
    r = client.create_reader(topic, msgs[2].message_id(), start_message_id_inclusive=True)
    assert _read_all(r) == [b"m2", b"m3", b"m4", b"m5"]
    r.close()


def test_empty_topic_and_partitioned_topic(client, broker, topic, unique_name):
    _produce(client, topic, 0)
    r = client.create_reader(topic, txn.EARLIEST)
    assert r.has_message_available() is False
    with pytest.raises(txn.Timeout):
        r.read_next(300)
    r.close()
    from txn.admin import create_partitioned_topic

    pt = f"persistent://public/default/{unique_name('pt')}"
    create_partitioned_topic(broker.admin_url, pt, 2)
    r = client.create_reader(pt, txn.EARLIEST)  # every partition (tests/test_reader_compat.py)
    assert r.topic() == pt and r.has_message_available() is False
    with pytest.raises(txn.Timeout):
        r.read_next(300)
    r.close()
    r = client.create_reader(pt + "-partition-1", txn.EARLIEST)
    assert r.has_message_available() is False
    r.close()


def test_reader_does_not_see_open_or_aborted_transactions(client, topic):
    p = client.create_producer(topic)
    p.send(b"before")
    t = client.new_transaction()
    p.send(b"in-txn", txn=t)
    r = client.create_reader(topic, txn.EARLIEST)
    assert r.read_next(30000).data() == b"before"
    with pytest.raises(txn.Timeout):
        r.read_next(1000)
    t.abort()
    p.send(b"after")
    assert r.read_next(30000).data() == b"after"
    r.close()


def test_a_start_inside_the_last_batch_knows_what_is_left_without_its_size(client, topic):
    """A start id rebuilt from its parts (ledger, entry, batch index: no batch size, as from a
    record or a string) inside the topic's last batch entry: the broker's last message id names the
    entry's last batch index, so ``has_message_available`` answers from it, at once. Before, it
    answered True at the end of such an entry, and a read to the end waited for its time-out (the
    ledger reads of a replay took 10 s more each)."""
    _produce(client, topic, 3, batching=True)
    r = client.create_reader(topic, txn.EARLIEST)
    ids = [r.read_next(30000).message_id() for _ in range(3)]
    r.close()
    assert len({i.entry_key for i in ids}) == 1 and ids[0].batch_size == 3  # one batch of 3
    bare = [txn.MessageId(ledger_id=i.ledger_id(), entry_id=i.entry_id(), batch_index=i.batch_index()) for i in ids]
    assert [b.batch_size for b in bare] == [0, 0, 0]
    for start, left in ((bare[0], [b"m1", b"m2"]), (bare[1], [b"m2"]), (bare[2], [])):
        r = client.create_reader(topic, start)
        try:
            assert r.has_message_available() is (left != [])
            assert _read_all(r) == left
        finally:
            r.close()
    single = f"{topic}-one"
    _produce(client, single, 1, batching=True)
    r = client.create_reader(single, txn.EARLIEST)
    only = r.read_next(30000).message_id()
    r.close()
    assert only.batch_index() == 0  # a batch entry of one message
    r = client.create_reader(single, txn.MessageId(ledger_id=only.ledger_id(), entry_id=only.entry_id(),
                                                   batch_index=0))
    try:
        assert r.has_message_available() is False
    finally:
        r.close()


def test_a_reader_resubscribed_inside_a_batch_goes_on_after_the_last_message_read(client, broker, topic):
    """The broker closes a reader half-way through a batch entry (a topic unload, as in a restart or
    a rebalance). The reader resubscribes from the last message it handed out; the broker sends the
    entry again whole, and only the messages after that one are handed out: none twice."""
    # Never acks: the unload closes the ledger, and retention none deletes closed ledgers of topics without one.
    client.subscribe(topic, "hold", initial_position=txn.InitialPosition.Earliest)
    _produce(client, topic, 5, batching=True)
    r = client.create_reader(topic, txn.EARLIEST)
    try:
        first = [r.read_next(30000) for _ in range(2)]
        assert [m.data() for m in first] == [b"m0", b"m1"] and first[1].message_id().batch_size == 5
        status, _ = admin_request("PUT", broker.admin_url, "/admin/v2/" + topic.replace("://", "/") + "/unload",
                                  timeout=30)
        assert status in (200, 204)
        assert _read_all(r) == [b"m2", b"m3", b"m4"]
    finally:
        r.close()


@pytest.mark.parametrize("entry", [-1, 2**64 - 1], ids=["signed", "wire"])
def test_a_start_before_a_ledgers_first_entry_reads_the_whole_ledger(client, topic, entry):
    """A start id of entry -1 of a ledger (as the Spark runtime plans "before the first entry", and as
    it writes it on the wire: 2^64-1) hands out every message of the ledger, batched or not."""
    ids = _produce(client, topic, 4)
    _produce(client, topic, 3, batching=True)
    r = client.create_reader(topic, txn.MessageId(ledger_id=ids[0].ledger_id(), entry_id=entry))
    try:
        got = [r.read_next(30000).data() for _ in range(7)]
        assert got == [f"m{i}".encode() for i in range(4)] + [f"m{i}".encode() for i in range(3)]
        assert r.has_message_available() is False
    finally:
        r.close()
    r = client.create_reader(topic, txn.MessageId(ledger_id=ids[0].ledger_id(), entry_id=entry))
    try:
        assert r.has_message_available() is True
    finally:
        r.close()
