"""Transactions on a real multi-broker cluster (``cluster`` fixture: ZooKeeper, 3 bookies, 3 brokers).

What a standalone broker never exercises:

- the transaction conformance tests of ``test_conformance_txn.py``, rerun with the client
  connected to broker 0 only while every topic lives on another broker and 3 of the 4
  coordinators too; the client's lookup counters prove it went elsewhere;
- lookups answered with a redirect (``authoritative``) for bundles nobody owns yet;
- coordinator failover: SIGKILL of the broker owning a coordinator while transactions on it are
  open and committing; the official client is the independent reader;
- loss of one bookie (ensemble 2, write and ack quorum 2 on 3 bookies);
- behind ``--run-slow``: the processor's chaos run with SIGKILLs of brokers and of a bookie, and
  repeated failovers for a median failover time.

Timings are printed (``-s``), never asserted.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from dataclasses import dataclass

import pulsar
import pytest
import test_conformance_txn as conformance

import txn
from txn.admin import admin_request, create_namespace, topic_path
from txn.errors import PulsarError

from chaos import Shape, run_chaos

#: Saturates the machine (or starts brokers of its own): `make test` runs it after the parallel part, alone.
pytestmark = pytest.mark.solo

#: The official client's log (connection-refused lines while a broker is dead) goes to pytest's log capture.
_OFFICIAL_LOG = logging.getLogger("official-client")


@dataclass(frozen=True)
class Broker:
    """What the conformance tests and the chaos harness use of a broker."""

    service_url: str
    admin_url: str
    local: object | None = None


# The conformance tests, collected here again: their ``broker``, ``client`` and ``topic``
# fixtures resolve to this module's (the cluster, a client of broker 0, a topic elsewhere).
for _name in dir(conformance):
    if _name.startswith("test_"):
        globals()[_name] = getattr(conformance, _name)
official = conformance.official


def _pool_of(c: txn.Client):  # noqa: ANN202
    """The sync client's connection pool, whose lookup counters the tests read."""
    return c.async_client.context.pool


def _owner_port(admin_url: str, topic: str) -> int:
    status, body = admin_request("GET", admin_url, f"/lookup/v2/topic/{topic_path(topic)}")
    assert status == 200, (status, body)
    return int(body["brokerUrl"].rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def broker(cluster) -> Broker:
    """Broker 0 of the cluster: the only one the clients of this module are given."""
    return Broker(cluster.broker_url(0), cluster.admin_url_of(0))


@pytest.fixture
def topic(cluster, unique_name) -> str:
    """A fresh topic whose bundle is owned by a broker other than broker 0 (asserted)."""
    b0 = cluster.brokers[0].ports["broker"]
    for _ in range(50):
        t = f"persistent://public/default/{unique_name('t')}"
        if _owner_port(cluster.admin_url_of(0), t) != b0:
            return t
    raise AssertionError("50 fresh topics all landed on broker 0")


@pytest.fixture
def client(broker, request):
    """A client of broker 0; a test with the ``topic`` fixture must have looked up elsewhere."""
    c = txn.Client(broker.service_url, operation_timeout_seconds=60)
    yield c
    pool = _pool_of(c)
    lookups, elsewhere = pool.lookups, pool.lookups_elsewhere
    c.close()
    print(f"\nlookups {lookups}, ended at another broker {elsewhere}, redirects {pool.lookup_redirects}")
    if "topic" in request.fixturenames:
        assert elsewhere >= 1, f"{lookups} lookups, none sent the client to another broker"


def test_cluster_shape(cluster):
    st = cluster.status()
    assert st["healthy"], st
    assert [n["name"] for n in st["nodes"]] == ["zookeeper", "bookie-0", "bookie-1", "bookie-2",
                                                 "broker-0", "broker-1", "broker-2"]
    owners = cluster.coordinator_owners()
    assert sorted(owners) == [0, 1, 2, 3]
    assert len(set(owners.values())) >= 2, owners  # spread over the brokers
    ports = [p for n in st["nodes"] for p in n["ports"].values()]
    assert len(ports) == len(set(ports)) == 10
    print(f"\ncluster RSS {st['rss_mb']} MB; coordinators {st['coordinators']}")


def test_lookup_redirects_for_unowned_bundles(cluster, unique_name):
    """A fresh namespace has no owner: the asked broker redirects (to the leader, which assigns).

    Which broker the leader gives a bundle to is its choice: in one CI run, and in about half the
    fresh namespaces here, every lookup was answered without a redirect. Up to 8 fresh namespaces
    are tried until a lookup was redirected (and followed: every message is then read back)."""
    ok = 0
    for attempt in range(8):
        ns = f"public/{unique_name(f'redir{attempt}')}"
        create_namespace(cluster.admin_url_of(0), ns)
        topics = [f"persistent://{ns}/t{i}" for i in range(8)]
        for i in range(3):  # the client of each broker in turn: at least one is not the leader
            c = txn.Client(cluster.broker_url(i), operation_timeout_seconds=60)
            try:
                with c.new_transaction() as t:
                    for tp in topics[i::3]:
                        c.create_producer(tp).send(f"{i}".encode(), txn=t)
                pool = _pool_of(c)
                print(f"\nnamespace {attempt}, client of broker-{i}: lookups {pool.lookups}, redirects "
                      f"{pool.lookup_redirects}, elsewhere {pool.lookups_elsewhere}")
                ok += pool.lookup_redirects > 0
            finally:
                c.close()
        if ok:
            break
    assert ok >= 1, "no lookup was ever redirected, in 8 fresh namespaces"
    off = pulsar.Client(cluster.service_url, operation_timeout_seconds=60)
    try:
        for i, tp in enumerate(topics):
            r = off.create_reader(tp, pulsar.MessageId.earliest)
            assert r.read_next(timeout_millis=30000).data() == f"{i % 3}".encode()
            r.close()
    finally:
        off.close()


# --------------------------------------------------------------------------- failover


@dataclass
class FailoverResult:
    victim: str
    coordinator: int
    first_new_txn_s: float  # SIGKILL -> first NEW_TXN answered by the failed-over coordinator
    outcomes: dict[int, str]
    errors: list[str]


def _stored(off: pulsar.Client, topic: str, timeout_s: float = 90) -> list[bytes]:
    """Every message stored on ``topic`` (read-committed), in order, one per message id.

    A reader created after the failover, up to a sentinel written now: a consumer that was
    connected during the kill may be handed a message twice (its ack lost with the broker),
    which is not a second copy in the topic; two message ids with one payload would be.
    """
    tag = uuid.uuid4().hex
    p = off.create_producer(topic, batching_enabled=False)
    p.send(b"sentinel", properties={"sentinel": tag})
    p.close()
    reader = off.create_reader(topic, pulsar.MessageId.earliest)
    seen: dict[str, bytes] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                m = reader.read_next(timeout_millis=2000)
            except pulsar.Timeout:
                continue
            if m.properties().get("sentinel") == tag:
                return list(seen.values())
            seen.setdefault(str(m.message_id()), m.data())
    finally:
        reader.close()
    raise AssertionError(f"sentinel not read back from {topic} in {timeout_s}s")


async def _failover_once(cluster, tag: str, n_committing: int = 3, n_late_commit: int = 2,
                         n_abort: int = 2) -> FailoverResult:
    """Kill the owner of one coordinator with transactions on it open and committing; verify all."""
    owners = cluster.coordinator_owners()
    # A coordinator on a broker that is not broker 0, so the official reader's first host stays up.
    tc, victim = next((t, b) for t, b in sorted(owners.items()) if b != 0)
    n_before = 2
    n = n_before + n_committing + n_late_commit + n_abort
    topics = [f"persistent://public/default/fo-{tag}-{i}" for i in range(n)]
    # Subscriptions that never ack (they outlive their consumers, closed here so nothing reconnects across the kill):
    # the kill closes the victim's ledgers, and retention none deletes closed ledgers of topics without one.
    hold = pulsar.Client(cluster.service_url, operation_timeout_seconds=120, logger=_OFFICIAL_LOG)
    try:
        for tp in topics:
            hold.subscribe(tp, "hold", initial_position=pulsar.InitialPosition.Earliest).close()
    finally:
        hold.close()
    outcomes: dict[int, str] = {}
    errors: list[str] = []
    async with txn.AsyncClient(cluster.service_url, operation_timeout_seconds=90) as c:
        txns = []
        while len(txns) < n:  # the client round-robins the coordinators: keep those on ``tc``
            t = await c.new_transaction(timeout_millis=180_000)
            if t.id.most == tc:
                txns.append(t)
            else:
                await t.abort()
        for i, (t, tp) in enumerate(zip(txns, topics, strict=True)):
            p = await c.create_producer(tp)
            for k in range(5):
                await p.send(f"{i}-{k}".encode(), txn=t)
        for i in range(n_before):  # committed before the kill: must survive it
            await txns[i].commit()
            outcomes[i] = "committed"
        committing = [asyncio.ensure_future(txns[i].commit()) for i in range(n_before, n_before + n_committing)]
        await asyncio.sleep(0)  # the END_TXN requests are on the wire
        t0 = time.monotonic()
        cluster.kill(f"broker-{victim}")
        first_new = None
        while first_new is None:
            try:
                t = await c.new_transaction(timeout_millis=60_000)
            except PulsarError as exc:  # typed; keep trying (the bound is the client's operation timeout)
                errors.append(f"new_transaction: {type(exc).__name__}: {exc}")
                continue
            if t.id.most == tc:
                first_new = time.monotonic() - t0
            await t.abort()
        for j, fut in enumerate(await asyncio.gather(*committing, return_exceptions=True)):
            i = n_before + j
            if isinstance(fut, BaseException):
                assert isinstance(fut, PulsarError), repr(fut)  # typed, never a bare exception
                errors.append(f"commit {txns[i].id}: {type(fut).__name__}: {fut}")
                outcomes[i] = "unknown"
            else:
                outcomes[i] = "committed"
        for i in range(n_before + n_committing, n_before + n_committing + n_late_commit):
            try:
                await txns[i].commit()
                outcomes[i] = "committed"
            except PulsarError as exc:
                errors.append(f"late commit {txns[i].id}: {type(exc).__name__}: {exc}")
                outcomes[i] = "unknown"
        for i in range(n - n_abort, n):
            try:
                await txns[i].abort()
                outcomes[i] = "aborted"
            except PulsarError as exc:
                errors.append(f"abort {txns[i].id}: {type(exc).__name__}: {exc}")
                outcomes[i] = "aborted?"  # never committed: must stay invisible either way
    off = pulsar.Client(cluster.service_url, operation_timeout_seconds=120, logger=_OFFICIAL_LOG)
    try:
        for i, tp in enumerate(topics):
            got = _stored(off, tp)
            want = [f"{i}-{k}".encode() for k in range(5)]
            if outcomes[i] == "committed":
                assert got == want, (i, outcomes[i], got)
            elif outcomes[i].startswith("aborted"):
                assert got == [], (i, outcomes[i], got)
            else:  # the client could not tell: all or nothing, never half
                assert got in (want, []), (i, got)
                outcomes[i] = "committed (seen)" if got else "aborted (seen)"
    finally:
        off.close()
    cluster.restart_node(f"broker-{victim}")
    return FailoverResult(f"broker-{victim}", tc, first_new, outcomes, errors)


@pytest.mark.timeout(600)
def test_coordinator_failover_sigkill(cluster):
    res = asyncio.run(_failover_once(cluster, uuid.uuid4().hex[:8]))
    print(f"\nSIGKILL {res.victim} (owner of coordinator {res.coordinator}): first new transaction on the "
          f"failed-over coordinator after {res.first_new_txn_s:.1f}s; outcomes {res.outcomes}; "
          f"typed errors {res.errors}")
    assert list(res.outcomes.values())[:2] == ["committed", "committed"]
    assert list(res.outcomes.values())[-2:] in (["aborted", "aborted"], ["aborted?", "aborted?"],
                                                ["aborted", "aborted?"], ["aborted?", "aborted"])
    cluster.load_coordinators()  # every coordinator serves again before the next test


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_coordinator_failover_repeated(cluster):
    """Five kills of coordinator owners: the median time to the first new transaction."""
    times = []
    for _ in range(5):
        res = asyncio.run(_failover_once(cluster, uuid.uuid4().hex[:8]))
        times.append(res.first_new_txn_s)
        print(f"\n{res.victim} tc{res.coordinator}: {res.first_new_txn_s:.1f}s {res.outcomes} {res.errors}")
        cluster.load_coordinators()
    print(f"\nfailover: median {statistics.median(times):.1f}s, all {[round(t, 1) for t in times]}")
    assert len(times) == 5


@pytest.mark.timeout(600)
def test_one_bookie_lost(cluster, unique_name):
    """SIGKILL one bookie: transactions go on (ensemble 2 of the 2 left); restart it afterwards."""
    tp = f"persistent://public/default/{unique_name('bk')}"
    off = pulsar.Client(cluster.service_url, operation_timeout_seconds=120,
                        logger=_OFFICIAL_LOG)
    c = txn.Client(cluster.service_url, operation_timeout_seconds=90)
    try:
        p = c.create_producer(tp)
        with c.new_transaction() as t:
            p.send(b"before", txn=t)
        cluster.kill("bookie-1")
        t0 = time.monotonic()
        for i in range(3):
            with c.new_transaction() as t:
                p.send(f"during-{i}".encode(), txn=t)
        print(f"\n3 transactions committed in {time.monotonic() - t0:.1f}s with bookie-1 dead")
        t = c.new_transaction()
        p.send(b"aborted", txn=t)
        t.abort()
        got = _stored(off, tp)
        assert got == [b"before", b"during-0", b"during-1", b"during-2"]
    finally:
        c.close()
        off.close()
        cluster.restart_node("bookie-1")


# --------------------------------------------------------------------------- chaos


class _ClusterKills:
    """What the chaos harness calls ``broker.local``: each kill SIGKILLs the next node of ``plan``.

    ``start()`` brings the killed node back (a bookie after ``bookie_down_s``, so that writes run
    on the two left for a while).
    """

    def __init__(self, cluster, plan: list[str], bookie_down_s: float = 20.0) -> None:  # noqa: ANN001
        self.cluster = cluster
        self.plan = plan
        self.bookie_down_s = bookie_down_s
        self.killed: list[str] = []
        self._down: str | None = None

    def kill(self) -> bool:
        name = self.plan[len(self.killed) % len(self.plan)]
        self.cluster.kill(name)
        self.killed.append(name)
        self._down = name
        return True

    stop = kill  # the chaos run below asks only for SIGKILLs

    def start(self, timeout: float = 300) -> bool:
        if self._down is None:
            return False
        if self._down.startswith("bookie"):
            time.sleep(self.bookie_down_s)
        self.cluster.restart_node(self._down, timeout=timeout)
        self._down = None
        self.cluster.load_coordinators()
        return True


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chaos_on_cluster(cluster, tmp_path):
    """The processor's chaos run on the cluster: processor kills, a zombie, and SIGKILLs of brokers
    (coordinator and topic owners among them) and of one bookie. Zero lost, zero duplicated."""
    kills = _ClusterKills(cluster, ["broker-1", "bookie-2", "broker-2", "broker-0"])
    target = Broker(cluster.service_url, cluster.admin_url_of(0), local=kills)
    shape = Shape(batched=True, partitions=4, handler="mod3", out_dedup=False)
    res = run_chaos(target, tmp_path / "chaos", shape=shape, n=20000, rate=0, kills=8, broker_restarts=0,
                    broker_kills=4, zombies=1, seed=41, time_limit_s=1200)
    print(f"\nnodes SIGKILLed: {kills.killed}\n{res.summary()}")
    assert (res.kills, res.broker_kills, res.zombies) == (8, 4, 1)
    assert kills.killed == ["broker-1", "bookie-2", "broker-2", "broker-0"]
    assert res.sent > 0 and res.send_failed == 0, res.summary()
    # The processor's side, always: every input the input topic holds is processed exactly once.
    assert (res.duplicated, res.unexpected, res.lost_with_input_stored) == (0, 0, 0), res.summary()
    assert res.inputs_committed_twice == 0 and res.lost_inputs_in_ledger == 0, res.summary()
    assert res.committed_outputs == res.out and res.distinct == res.out, res.summary()
    if res.inputs_missing:
        # Publishes the official client confirmed (receipt (-1,-1): "a duplicate of a stored
        # message") that the input topic does not hold, after a broker SIGKILL with deduplication
        # on: 4 of 6 runs (docs/cluster.md). The official client's bug, not the broker's: a
        # producer that reconnects before its first receipt resets its sequence counter to the
        # broker's lastSequenceId + 1 while its first messages wait to be re-sent, so the next ones
        # reuse their ids (tests/test_sequence_ids.py: 5 of 5 lost, every run). The generator's
        # producer needs initial_sequence_id=1. Reported, not hidden: every other loss fails.
        assert res.lost > 0 and res.committed_inputs == res.sent - res.inputs_missing, res.summary()
        pytest.xfail(f"the official client (pulsar-client 3.13.0) confirmed {res.inputs_missing} input publishes "
                     f"that deduplication dropped: after a broker SIGKILL before a partition producer's first "
                     f"receipt it reused sequence ids (tests/test_sequence_ids.py, docs/cluster.md); the "
                     f"processor handled every stored input once: {res.summary()}")
    assert not res.timed_out, res.summary()  # (with inputs missing, the harness waits for them until its limit)
    assert (res.lost, res.distinct, res.committed_inputs) == (0, res.expected, res.sent), res.summary()
