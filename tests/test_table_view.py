"""``create_table_view`` (issue 19): a topic's latest value per key, on ``txn.Client`` and
``txn.AsyncClient``, against the shared broker, and side by side with the official ``pulsar-client``.

What is asserted: the view holds exactly the topic's last value per key once created (keyless
messages skipped, an empty or null payload removing its key); later updates reach ``get()`` and a
``for_each_and_listen`` listener once each and in order; a partitioned topic is read on every
partition under one subscription name; values are decoded with the view's schema; and the
official client's view of the same topic holds the same entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pulsar
import pulsar.schema
import pytest

import txn
import txn.schema
from txn.admin import admin_request, create_partitioned_topic, topic_path


@pytest.fixture
def client(broker: Any) -> Iterator[txn.Client]:
    c = txn.Client(broker.service_url)
    try:
        yield c
    finally:
        c.close()


def _wait(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def _entries(view: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    view.for_each(out.__setitem__)
    return out


def _subscriptions(broker: Any, topic: str) -> set[str]:
    status, body = admin_request("GET", broker.admin_url, f"/admin/v2/{topic_path(topic)}/stats")
    assert status == 200, body
    return set(body["subscriptions"])


#: (partition key or None, payload or None): what each table view test publishes before the view
#: is created, and the entries it must end with.
HISTORY: list[tuple[str | None, bytes | None]] = [
    ("k0", b"v0"), (None, b"keyless"), ("k1", b"v1"), ("k1", b""), ("k2", b"v2"), ("k2", None),
    ("k0", b"v0-new"), ("k3", b"\xba\xd0\xba\xd0"), ("k4", b"v4"),
]
HISTORY_ENTRIES = {"k0": b"v0-new", "k3": b"\xba\xd0\xba\xd0", "k4": b"v4"}


def _publish(producer: Any, items: list[tuple[str | None, bytes | None]]) -> list[Any]:
    return [producer.send(value, partition_key=key) for key, value in items]


def test_creation_reads_the_topic_to_its_end(client: txn.Client, topic: str) -> None:
    p = client.create_producer(topic)
    _publish(p, HISTORY)
    view = client.create_table_view(topic)
    assert _entries(view) == HISTORY_ENTRIES and len(view) == 3
    assert [view.get(k) for k in ("k0", "k1", "k2", "k3", "k4", "nokey")] == [
        b"v0-new", None, None, b"\xba\xd0\xba\xd0", b"v4", None]
    assert str(view) == repr(view) == f"TableView(topic={topic})"
    view.close()
    with pytest.raises(txn.ConsumerNotInitialized):
        view.close()
    p.send(b"after", partition_key="k5")
    time.sleep(0.3)
    assert _entries(view) == HISTORY_ENTRIES  # closed: still readable, no longer updated


def test_updates_reach_get_and_each_listener_once_in_order(client: txn.Client, broker: Any, topic: str) -> None:
    p = client.create_producer(topic)
    p.send(b"1", partition_key="a")
    view = client.create_table_view(topic, subscription_name="tv-sub")
    assert str(view) == f"TableView(topic={topic}, subscription=tv-sub)"
    assert _subscriptions(broker, topic) == {"tv-sub"}
    heard: list[tuple[str, bytes]] = []
    view.for_each_and_listen(lambda k, v: heard.append((k, v)))
    assert heard == [("a", b"1")]
    _publish(p, [("a", b"2"), ("b", b"1"), (None, b"x"), ("a", None), ("c", b"3"), ("b", b"")])
    _wait(lambda: len(heard) == 6)
    assert heard == [("a", b"1"), ("a", b"2"), ("b", b"1"), ("a", b""), ("c", b"3"), ("b", b"")]
    assert _entries(view) == {"c": b"3"} and view.get("a") is None
    p.send(b"4", partition_key="c")
    _wait(lambda: view.get("c") == b"4")
    assert heard[-1] == ("c", b"4")
    client.close()  # closing the client stops the view; its entries stay, close() still succeeds once
    assert _entries(view) == {"c": b"4"}
    view.close()
    with pytest.raises(txn.ConsumerNotInitialized):
        view.close()


def test_partitioned_topic_is_read_on_every_partition(client: txn.Client, broker: Any, topic: str) -> None:
    create_partitioned_topic(broker.admin_url, topic, 3)
    p = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(12)]
    ids = _publish(p, [(k, f"old-{k}".encode()) for k in keys] + [("key-0", None), ("key-1", b"")])
    assert {mid.partition() for mid in ids} == {0, 1, 2}
    view = client.create_table_view(topic, "tv-parts")
    expected = {k: f"old-{k}".encode() for k in keys[2:]}
    assert _entries(view) == expected
    assert all(_subscriptions(broker, part) == {"tv-parts"} for part in client.get_topic_partitions(topic))
    _publish(p, [(k, f"new-{k}".encode()) for k in keys[:6]])
    _wait(lambda: all(view.get(k) == f"new-{k}".encode() for k in keys[:6]))
    assert _entries(view) == {**expected, **{k: f"new-{k}".encode() for k in keys[:6]}}
    view.close()


class Point(txn.schema.Record):
    x = txn.schema.Integer()
    name = txn.schema.String()


def test_values_are_decoded_with_the_schema(client: txn.Client, topic: str) -> None:
    sp = client.create_producer(f"{topic}-str", schema=txn.schema.StringSchema())
    sp.send("first", partition_key="s")
    strings = client.create_table_view(f"{topic}-str", schema=txn.schema.StringSchema())
    assert strings.get("s") == "first" and strings.get("missed") is None
    heard: list[tuple[str, str]] = []
    strings.for_each_and_listen(lambda k, v: heard.append((k, v)))
    sp.send("second", partition_key="s")
    sp.send(None, partition_key="s")
    _wait(lambda: len(heard) == 3)
    assert heard == [("s", "first"), ("s", "second"), ("s", "")] and len(strings) == 0
    strings.close()

    jp = client.create_producer(topic, schema=txn.schema.JsonSchema(Point))
    jp.send(Point(x=1, name="a"), partition_key="p")
    points = client.create_table_view(topic, schema=txn.schema.JsonSchema(Point))
    got = points.get("p")
    assert isinstance(got, Point) and (got.x, got.name) == (1, "a")
    heard_points: list[tuple[str, int]] = []
    points.for_each_and_listen(lambda k, v: heard_points.append((k, v.x)))
    jp.send(Point(x=2, name="b"), partition_key="p")
    jp.send(Point(x=3, name="c"), partition_key="q")
    jp.send(None, partition_key="p")  # removes p; b"" is no JSON, so the listener is not told (as there)
    _wait(lambda: len(heard_points) == 3 and len(points) == 1)
    assert heard_points == [("p", 1), ("p", 2), ("q", 3)]
    assert points.get("p") is None and points.get("q").x == 3
    points.close()
    with pytest.raises(txn.IncompatibleSchema):
        client.create_table_view(topic, schema=txn.schema.StringSchema())


def test_async_client_table_view(broker: Any, topic: str) -> None:
    async def main() -> tuple[Any, ...]:
        async with txn.AsyncClient(broker.service_url) as c:
            p = await c.create_producer(topic, schema=txn.schema.StringSchema())
            await p.send("v1", partition_key="k")
            view = await c.create_table_view(topic, schema=txn.schema.StringSchema())
            assert isinstance(view, txn.AsyncTableView)
            first = (view.get("k"), len(view), str(view))
            heard: list[tuple[str, str]] = []
            view.for_each_and_listen(lambda k, v: heard.append((k, v)))
            await p.send("v2", partition_key="k")
            await p.send("w", partition_key="j")
            for _ in range(250):
                if len(heard) == 3:
                    break
                await asyncio.sleep(0.02)
            await view.close()
            return first, heard, view.get("k"), view.get("j")

    first, heard, k, j = asyncio.run(main())
    assert first == ("v1", 1, f"TableView(topic={topic})")
    assert heard == [("k", "v1"), ("k", "v2"), ("j", "w")]
    assert (k, j) == ("v2", "w")


# ====================================================================== side by side with the official client


@pytest.mark.parametrize("partitions", [0, 2])
def test_same_entries_as_the_official_table_view(broker: Any, topic: str, partitions: int) -> None:
    if partitions:
        create_partitioned_topic(broker.admin_url, topic, partitions)
    theirs_c, ours_c = pulsar.Client(broker.service_url), txn.Client(broker.service_url)
    try:
        theirs_p = theirs_c.create_producer(topic, batching_enabled=False)
        ours_p = ours_c.create_producer(topic, batching_enabled=False)
        _publish(theirs_p, [(k, v) for k, v in HISTORY if v is not None])
        _publish(ours_p, [("k2", None), ("k4", None), ("k5", b"v5")])  # our null-value tombstones
        theirs, ours = theirs_c.create_table_view(topic), ours_c.create_table_view(topic)
        expected = {"k0": b"v0-new", "k3": b"\xba\xd0\xba\xd0", "k5": b"v5"}
        assert _entries(theirs) == _entries(ours) == expected
        assert len(theirs) == len(ours) == 3 and str(theirs) == str(ours)
        heard: dict[str, list[tuple[str, bytes]]] = {"pulsar": [], "txn": []}
        theirs.for_each_and_listen(lambda k, v: heard["pulsar"].append((k, v)))
        ours.for_each_and_listen(lambda k, v: heard["txn"].append((k, v)))
        _publish(theirs_p, [("k0", b"x0"), ("k3", b""), (None, b"keyless"), ("k6", b"v6")])
        _wait(lambda: len(heard["pulsar"]) == len(heard["txn"]) == 6)
        assert sorted(heard["txn"]) == sorted(heard["pulsar"])  # the partitions' order may interleave
        assert _entries(theirs) == _entries(ours) == {"k0": b"x0", "k5": b"v5", "k6": b"v6"}
        for view in (theirs, ours):
            view.close()
        assert type(_raised(theirs.close)).__name__ == type(_raised(ours.close)).__name__ == "ConsumerNotInitialized"
        for kwargs in ({"topic": 1}, {"topic": topic, "subscription_name": 3}, {"topic": topic, "schema": "x"}):
            assert isinstance(_raised(lambda kw=kwargs: theirs_c.create_table_view(**kw)), ValueError)
            assert isinstance(_raised(lambda kw=kwargs: ours_c.create_table_view(**kw)), ValueError)
    finally:
        theirs_c.close()
        ours_c.close()


def _raised(call: Callable[[], Any]) -> BaseException | None:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception is the result
        return exc
    return None
