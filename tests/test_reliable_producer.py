"""Reliable producer: bounded window, confirms and typed nacks, broker restart, durable outbox under kill -9."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pulsar
import pytest

import txn
from txn.admin import admin_request, create_namespace, enable_namespace_dedup
from txn.delivery.outbox import Outbox
from txn.delivery.reliable_producer import AsyncReliableProducer, MessageNacked, ReliableProducer

from chaos import run_outbox_chaos
from peer import read_until_sentinel

HERE = Path(__file__).resolve().parent


@pytest.fixture
def client(broker):
    c = txn.Client(broker.service_url, operation_timeout_seconds=60)
    yield c
    c.close()


@pytest.fixture
def dedup_ns(broker):
    ns = f"public/rp-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    return ns


def _official_read(broker, topic: str) -> list[pulsar.Message]:
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    r = oc.subscribe(topic, f"check-{uuid.uuid4().hex[:6]}", initial_position=pulsar.InitialPosition.Earliest)
    try:
        return read_until_sentinel(oc, r, topic, timeout_s=60)
    finally:
        oc.close()


def _watch_core(rp: ReliableProducer | AsyncReliableProducer) -> dict[str, int]:
    """Record, at every message the core producer queues, its queued count and the reliable in-flight count."""
    inner = rp.async_producer if isinstance(rp, ReliableProducer) else rp
    part = inner.core.partition_producers[0]
    peak = {"core": 0, "in_flight": 0, "enqueued": 0}
    orig = part.enqueue

    def enqueue(*args, **kwargs):
        fut = orig(*args, **kwargs)
        peak["core"] = max(peak["core"], part.queued)
        peak["in_flight"] = max(peak["in_flight"], inner.in_flight)
        peak["enqueued"] += 1
        return fut

    part.enqueue = enqueue
    return peak


# ------------------------------------------------------------------ 1. window


@pytest.mark.parametrize("with_outbox", [False, True], ids=["memory", "outbox"])
def test_window_backpressure_sync(client, broker, dedup_ns, tmp_path, with_outbox):
    window, n = 50, 3000
    topic = f"persistent://{dedup_ns}/window"
    kwargs = {"outbox_path": tmp_path / "o.db", "producer_name": "w"} if with_outbox else {}
    # 20 ms batches: the sender outruns the confirms, so the window fills and send_async blocks.
    rp = ReliableProducer(client, topic, window=window, batching_max_publish_delay_ms=20, **kwargs)
    peak = _watch_core(rp)
    rows_peak = [0]
    if with_outbox:  # after every outbox commit, count its unconfirmed rows (same thread, same connection)
        outbox = rp.async_producer.outbox
        write = outbox.write

        def counted_write(*args):
            write(*args)
            rows_peak[0] = max(rows_peak[0], outbox.pending_count())

        outbox.write = counted_write
    t0 = time.monotonic()
    futs = [rp.send_async(f"{i}".encode()) for i in range(n)]
    rp.flush()
    elapsed = time.monotonic() - t0
    ids = [f.result(0) for f in futs]
    assert rp.in_flight == 0
    rp.close()
    print(f"\nwindow test ({'outbox' if with_outbox else 'memory'}): n={n} window={window} "
          f"peak core queued={peak['core']} peak in flight={peak['in_flight']} peak outbox rows={rows_peak[0]} "
          f"in {elapsed:.2f}s")
    assert peak["enqueued"] == n
    if with_outbox:
        # Each accept waits for its own fsync, which on a loaded machine can be slower than the
        # confirms: the window is then never filled. The invariant is that it is never exceeded.
        assert 0 < peak["in_flight"] <= window
    else:
        assert peak["in_flight"] == window  # reached, never exceeded
    if with_outbox:
        assert peak["core"] <= window and 0 < rows_peak[0] <= window
    else:
        assert peak["core"] == window
    assert ids == sorted(ids) and len(set(ids)) == n
    assert [m.data() for m in _official_read(broker, topic)] == [f"{i}".encode() for i in range(n)]


def test_window_backpressure_async(broker, topic):
    window, n, senders = 64, 4000, 8

    async def main() -> tuple[dict[str, int], list[txn.MessageId], int]:
        async with txn.AsyncClient(broker.service_url) as c:
            async with AsyncReliableProducer(c, topic, window=window, batching_max_publish_delay_ms=20) as rp:
                peak = _watch_core(rp)
                futs: dict[int, asyncio.Future[txn.MessageId]] = {}

                async def sender(k: int) -> None:
                    for i in range(k, n, senders):
                        futs[i] = await rp.send_async(f"{i}".encode(), properties={"i": str(i)})
                        assert rp.in_flight <= window

                await asyncio.gather(*(sender(k) for k in range(senders)))
                ids = [await futs[i] for i in range(n)]
                return peak, ids, rp.in_flight

    peak, ids, left = asyncio.run(main())
    assert left == 0
    assert peak["core"] == window and peak["in_flight"] == window
    assert len(set(ids)) == n
    got = sorted(int(m.properties()["i"]) for m in _official_read(broker, topic))
    assert got == list(range(n))


# ------------------------------------------------------- 2. confirms and nacks


@pytest.mark.parametrize("with_outbox", [False, True], ids=["memory", "outbox"])
def test_confirms_and_typed_nacks(client, broker, dedup_ns, tmp_path, with_outbox):
    topic = f"persistent://{dedup_ns}/nack"
    n = 1000
    kwargs = {"outbox_path": tmp_path / "o.db", "producer_name": "nacker"} if with_outbox else {}
    rp = ReliableProducer(client, topic, window=100, admin_url=broker.admin_url, require_dedup=True, **kwargs)
    assert rp.dedup_enabled is True
    calls: list[tuple[int, object, object]] = []
    lock = threading.Lock()

    def cb(i):
        def done(mid, err):
            with lock:
                calls.append((i, mid, err))
        return done

    futs = [rp.send_async(f"{i}".encode(), cb(i)) for i in range(n)]
    rp.flush()
    mids = [f.result(0) for f in futs]
    assert sorted(i for i, _, _ in calls) == list(range(n))  # one callback per message
    assert {i: (mid, err) for i, mid, err in calls} == {i: (mids[i], None) for i in range(n)}
    assert mids == sorted(mids) and len(set(mids)) == n

    with pytest.raises(txn.MessageTooBig):  # refused before acceptance: nothing in flight or stored
        rp.send_async(b"x" * (6 * 1024 * 1024))
    assert rp.in_flight == 0 and rp.next_sequence_id == n

    local = topic.rsplit("/", 1)[1]
    status, _ = admin_request("POST", broker.admin_url, f"/admin/v2/persistent/{dedup_ns}/{local}/terminate")
    assert status == 200
    calls.clear()
    bad = [rp.send_async(f"late-{k}".encode(), cb(n + k)) for k in range(5)]
    for k, f in enumerate(bad):
        with pytest.raises(MessageNacked) as ei:
            f.result(30)
        e = ei.value
        assert isinstance(e, txn.PulsarError)
        assert (e.topic, e.sequence_id, e.server_error) == (topic, n + k, "TopicTerminatedError")
        assert f"seq={n + k}" in str(e) and topic in str(e)
    with pytest.raises(MessageNacked) as ei:
        rp.send(b"sync-late")
    assert ei.value.sequence_id == n + 5 and ei.value.server_error == "TopicTerminatedError"
    rp.flush()
    assert sorted((i, mid, type(err)) for i, mid, err in calls) == [(n + k, None, MessageNacked) for k in range(5)]
    assert rp.in_flight == 0
    rp.close()
    if with_outbox:
        o = Outbox(tmp_path / "o.db", topic, "nacker")
        assert o.pending_count() == 0
        nacked = o.nacked()
        o.close()
        assert [s for s, _ in nacked] == list(range(n, n + 6))
        assert all("TopicTerminatedError" in e for _, e in nacked)
    assert [m.data() for m in _official_read_terminated(broker, topic, n)] == [f"{i}".encode() for i in range(n)]


def _official_read_terminated(broker, topic: str, n: int) -> list[pulsar.Message]:
    """Read a terminated topic to its end (no sentinel can be written to it)."""
    oc = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    r = oc.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    try:
        while r.has_message_available():
            out.append(r.read_next(10000))
    finally:
        oc.close()
    return out


def test_outbox_needs_a_fixed_producer_name(client, topic, tmp_path):
    with pytest.raises(ValueError, match="producer_name"):
        ReliableProducer(client, topic, outbox_path=tmp_path / "o.db")


def test_outbox_ids_continue_after_the_brokers_last_id(client, dedup_ns, tmp_path):
    topic = f"persistent://{dedup_ns}/ids"
    rp = ReliableProducer(client, topic, producer_name="ids")
    for i in range(10):
        rp.send(f"{i}".encode())
    rp.close()
    # A fresh outbox (say the file was lost): ids resume after the broker's last one, never below it.
    rp = ReliableProducer(client, topic, outbox_path=tmp_path / "o.db", producer_name="ids")
    assert rp.next_sequence_id == 10
    rp.send(b"10", checkpoint="ten")
    rp.close()
    rp = ReliableProducer(client, topic, outbox_path=tmp_path / "o.db", producer_name="ids")
    assert (rp.next_sequence_id, rp.checkpoint(), rp.recovery["rows"]) == (11, "ten", 0)
    rp.close()
    c = client.subscribe(topic, "ids", initial_position=txn.InitialPosition.Earliest)
    got = []
    for _ in range(11):
        m = c.receive(10000)
        got.append((m.data(), m.sequence_id()))
    assert got == [(f"{i}".encode(), i) for i in range(11)]


def test_dedup_check_warns_or_refuses(client, broker, topic, tmp_path):
    # public/default has deduplication off.
    with pytest.raises(ValueError, match="deduplication is off"):
        ReliableProducer(client, topic, outbox_path=tmp_path / "o.db", producer_name="p",
                         admin_url=broker.admin_url, require_dedup=True)
    with pytest.warns(RuntimeWarning, match="deduplication is off"):
        rp = ReliableProducer(client, topic, outbox_path=tmp_path / "o.db", producer_name="p",
                              admin_url=broker.admin_url)
    assert rp.dedup_enabled is False
    rp.close()
    with pytest.raises(ValueError, match="belongs to topic"):  # an outbox is bound to its topic and name
        ReliableProducer(client, topic + "-other", outbox_path=tmp_path / "o.db", producer_name="p")


# ------------------------------------------------------ 3. outbox under kill -9


def test_outbox_survives_kill_9(broker, dedup_ns, tmp_path):
    res = run_outbox_chaos(broker, f"persistent://{dedup_ns}/outbox", tmp_path / "outbox.db", n=2000,
                           kill_after=[300, 170, 420])
    assert res.lost == 0 and res.duplicated == 0, res.summary()
    assert res.out == res.sent == 2000
    assert res.in_order  # re-sent rows first, in sequence order, then the rest
    assert res.kills == 3
    assert res.outbox_final == (0, [], "1999")
    # The recovery path really ran: rows were left over and each run accounted for all of them.
    assert sum(k["rows_left"] for k in res.kill_details) > 0
    for k, r in zip(res.kill_details, res.recovered, strict=True):
        assert int(r["rows"]) == k["rows_left"] == int(r["already_stored"]) + int(r["resent"])


# --------------------------------------------------------- 4. broker restart


def test_broker_restart_mid_stream_exactly_once(restartable_broker, request):
    # A broker of its own: the session broker is never restarted (see conftest.restartable_broker).
    broker = restartable_broker
    dedup_ns = f"public/rp-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, dedup_ns)
    enable_namespace_dedup(broker.admin_url, dedup_ns)
    client = txn.Client(broker.service_url, operation_timeout_seconds=60)
    request.addfinalizer(client.close)
    n, window = 3000, 300
    topic = f"persistent://{dedup_ns}/restart"
    # Never acks: under the default retention (none) the checks below, which ack, would let the broker delete the
    # ledger the next check reads from the earliest (and the restart closes a ledger).
    audit = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    request.addfinalizer(audit.close)
    audit.subscribe(topic, "audit", initial_position=pulsar.InitialPosition.Earliest)
    rp = ReliableProducer(client, topic, window=window, producer_name="restart-writer",
                          admin_url=broker.admin_url, require_dedup=True)
    peak = _watch_core(rp)
    confirmed: list[int] = []
    lock = threading.Lock()
    futs = []

    def on_confirm(i):
        def done(mid, err):
            if err is None:
                with lock:
                    confirmed.append(i)
        return done

    def send_all():
        for i in range(n):
            futs.append(rp.send_async(f"{i}".encode(), on_confirm(i)))
            if i % 50 == 0:
                time.sleep(0.02)

    sender = threading.Thread(target=send_all)
    sender.start()
    deadline = time.monotonic() + 60
    while len(confirmed) < 500 and time.monotonic() < deadline:
        time.sleep(0.05)
    before = len(confirmed)
    assert before >= 500
    broker.local.stop()
    broker.local.start(timeout=240)
    sender.join(300)
    assert not sender.is_alive()
    rp.flush()
    mids = [f.result(0) for f in futs]
    assert len(mids) == n and sorted(confirmed) == list(range(n))
    assert rp.in_flight == 0 and peak["in_flight"] <= window and peak["core"] <= window
    rp.close()

    got = [int(m.data()) for m in _official_read(broker, topic)]
    seen = Counter(got)
    lost = [i for i in range(n) if seen[i] == 0]
    dup = [i for i, c in seen.items() if c > 1]
    print(f"\nrestart test: in={n} confirmed before restart={before} confirmed={len(confirmed)} "
          f"stored={len(got)} lost={len(lost)} duplicated={len(dup)} peak in flight={peak['in_flight']}")
    assert lost == [] and dup == [] and got == list(range(n))
    # Same sequence ids across the reconnect: message i was stored under sequence id i.
    c = client.subscribe(topic, "seq-check", initial_position=txn.InitialPosition.Earliest)
    seqs = []
    for _ in range(n):
        m = c.receive(10000)
        seqs.append((int(m.data()), m.sequence_id(), m.producer_name()))
        c.acknowledge(m)
    assert seqs == [(i, i, "restart-writer") for i in range(n)]
