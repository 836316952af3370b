"""Cluster failover, side by side with the official client: ``AutoClusterFailover``, ``ServiceInfo``
and a ``ServiceInfoProvider`` of the test's own.

Two independent clusters: the shared broker and a second standalone started here (fresh data dir
under /tmp, free ports; stopped at the end). Both clients fail over from the second broker (the
primary) to the shared one when the test stops it, and a provider's callback moves both from the
shared broker to the second one, and to a TLS broker with token authentication (the session's
``authz_broker``) with the new ServiceInfo's token and CA file. Broker-free: the official
``ValueError`` messages.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pulsar
import pytest
from conftest import Broker, _local_broker

import txn

#: Saturates the machine (or starts brokers of its own): `make test` runs it after the parallel part, alone.
pytestmark = pytest.mark.solo

CLIENTS = {"official": pulsar, "ours": txn}


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:12]}"


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _send(producer: Any, data: bytes, timeout: float = 90) -> None:
    """Send, retrying while the producer is between clusters (as the official client's own test)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            producer.send(data)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _receive_all(consumer: Any, n: int, timeout_ms: int = 30000) -> list[bytes]:
    out = []
    for _ in range(n):
        msg = consumer.receive(timeout_millis=timeout_ms)
        consumer.acknowledge(msg)
        out.append(msg.data())
    return out


def _audit(service_url: str, topic: str, **client_args: Any) -> tuple[Any, Any]:
    """A client and a subscription from the earliest that never acks: under Pulsar's default
    retention (none) the broker deletes a ledger once every subscription acked it (seen in a CI run:
    the primary trimmed the ledger of the "back" messages just after both consumers acked them, so
    a reader from the earliest found nothing), so a later check reads through this subscription."""
    client = pulsar.Client(service_url, **client_args)
    return client, client.subscribe(topic, f"audit-{uuid.uuid4().hex[:8]}",
                                    initial_position=pulsar.InitialPosition.Earliest)


def _receive_until(consumer: Any, wanted: set[bytes], timeout_ms: int = 60000) -> list[bytes]:
    """Messages from ``consumer`` (not acked) until all of ``wanted`` arrived."""
    out: list[bytes] = []
    while not wanted <= set(out):
        out.append(consumer.receive(timeout_millis=timeout_ms).data())
    return out


def _contents(consumer: Any, n: int, timeout_ms: int = 30000) -> list[bytes]:
    """The next ``n`` messages of an audit subscription, which must then be drained."""
    out = [consumer.receive(timeout_millis=timeout_ms).data() for _ in range(n)]
    assert _drained(consumer), f"more than the {n} messages {out}"
    return out


def _drained(consumer: Any) -> bool:
    try:
        consumer.receive(timeout_millis=500)
    except Exception:
        return True
    return False


@pytest.fixture(scope="module")
def second(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A second standalone cluster of this module's own."""
    with _local_broker(request, "pulsar-txn-failover-", security=False) as b:
        yield b


# ------------------------------------------------------------------------------ arguments

def _outcome(f: Callable[[], Any]) -> tuple[str, str]:
    try:
        return "ok", repr(f())
    except Exception as exc:  # noqa: BLE001 - the outcome is compared
        return type(exc).__name__, str(exc)


CASES: dict[str, Callable[[ModuleType], Any]] = {
    "service_info": lambda m: m.ServiceInfo("pulsar://127.0.0.1:16650"),
    "service_info_tls": lambda m: (m.ServiceInfo("pulsar+ssl://h:6651,h2:6651", None, "/ca.pem").use_tls,
                                   m.ServiceInfo("pulsar+ssl://h:6651", tls_trust_certs_file_path="/ca.pem")),
    "service_info_no_scheme": lambda m: m.ServiceInfo("bogus"),
    "service_info_url_type": lambda m: m.ServiceInfo(5),
    "service_info_auth_type": lambda m: m.ServiceInfo("pulsar://a:1", authentication="token"),
    "service_info_trust_type": lambda m: m.ServiceInfo("pulsar://a:1", tls_trust_certs_file_path=1),
    "failover": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")]),
    "failover_all": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")],
                                                   check_interval_ms=100, failover_threshold=3,
                                                   switch_back_threshold=2),
    "no_secondary": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), []),
    "secondary_tuple": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"),
                                                      (m.ServiceInfo("pulsar://b:1"),)),
    "secondary_item": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"),
                                                     [m.ServiceInfo("pulsar://b:1"), 3]),
    "primary_type": lambda m: m.AutoClusterFailover("pulsar://a:1", [m.ServiceInfo("pulsar://b:1")]),
    "interval_zero": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")],
                                                    check_interval_ms=0),
    "interval_float": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")],
                                                     check_interval_ms=1.5),
    "failover_threshold": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"),
                                                         [m.ServiceInfo("pulsar://b:1")], failover_threshold=0),
    "switch_back_threshold": lambda m: m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"),
                                                            [m.ServiceInfo("pulsar://b:1")], switch_back_threshold=-1),
    "client_url_type": lambda m: m.Client(5),
    "client_auth": lambda m: m.Client(
        m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")]),
        authentication=m.AuthenticationToken("x")),
    "client_trust": lambda m: m.Client(
        m.AutoClusterFailover(m.ServiceInfo("pulsar://a:1"), [m.ServiceInfo("pulsar://b:1")]),
        tls_trust_certs_file_path="/ca.pem"),
    "provider_base": lambda m: m.Client(m.ServiceInfoProvider()),
    "provider_close": lambda m: m.ServiceInfoProvider().close(),
}


@pytest.mark.parametrize("case", CASES)
def test_arguments_as_the_official_client(case: str) -> None:
    official = _outcome(lambda: CASES[case](pulsar))
    ours = _outcome(lambda: CASES[case](txn))
    assert ours == official
    if case == "no_secondary":
        assert official == ("ValueError", "Argument secondary is expected to contain at least one ServiceInfo")


def test_provider_returning_a_url_string() -> None:
    """``initial_service_info`` must return a ServiceInfo: both raise ``ValueError``."""

    def provider(m: ModuleType) -> Any:
        class P(m.ServiceInfoProvider):
            def initial_service_info(self) -> Any:
                return "pulsar://127.0.0.1:6650"

            def initialize(self, on_service_info_update: Any) -> None:
                pass

        return P()

    with pytest.raises(ValueError):
        pulsar.Client(provider(pulsar))
    with pytest.raises(ValueError, match="ServiceInfo"):
        txn.Client(provider(txn))


# ------------------------------------------------------------------------------ switching

def _provider(m: ModuleType, first: str) -> Any:
    class Switchable(m.ServiceInfoProvider):
        def __init__(self) -> None:
            self.update: Callable[[Any], None] | None = None
            self.closed = 0

        def initial_service_info(self) -> Any:
            return m.ServiceInfo(first)

        def initialize(self, on_service_info_update: Callable[[Any], None]) -> None:
            self.update = on_service_info_update

        def close(self) -> None:
            self.closed += 1

    return Switchable()


@pytest.mark.parametrize("side", CLIENTS)
def test_provider_callback_switches_cluster(side: str, broker: Broker, second: Broker) -> None:
    """A provider starts the client on the shared broker and its callback moves it to the second
    one: producer and consumer follow; a transaction opened before the switch is refused after."""
    m = CLIENTS[side]
    topic = _topic(f"provider-{side}")
    audits = [_audit(broker.service_url, topic), _audit(second.service_url, topic)]
    provider = _provider(m, broker.service_url)
    client = m.Client(provider, operation_timeout_seconds=10)
    try:
        assert client.get_service_info().service_url == broker.service_url
        producer = client.create_producer(topic, batching_enabled=False)
        consumer = client.subscribe(topic, "sub", initial_position=m.InitialPosition.Earliest)
        for i in range(3):
            producer.send(f"shared-{i}".encode())
        assert _receive_all(consumer, 3) == [b"shared-0", b"shared-1", b"shared-2"]
        assert provider.update is not None
        provider.update(m.ServiceInfo(second.service_url))
        _wait(lambda: client.get_service_info().service_url == second.service_url, 10, "the switch")
        for i in range(3):
            _send(producer, f"second-{i}".encode())
        assert _receive_all(consumer, 3) == [b"second-0", b"second-1", b"second-2"]
        assert _drained(consumer)
        # What each cluster holds, read through the subscriptions that never ack.
        assert _contents(audits[1][1], 3) == [b"second-0", b"second-1", b"second-2"]
        assert _contents(audits[0][1], 3) == [b"shared-0", b"shared-1", b"shared-2"]
    finally:
        client.close()
        for c, _ in audits:
            c.close()
    assert provider.closed == 1


@pytest.mark.parametrize("side", CLIENTS)
def test_switch_uses_the_service_infos_credentials_and_trust(side: str, broker: Broker, authz_broker: Broker) -> None:
    """From the shared broker (no authentication) to a TLS broker that refuses anonymous clients:
    the new ServiceInfo's token and CA file are what the client connects with there."""
    m = CLIENTS[side]
    topic = _topic(f"provider-auth-{side}")
    assert authz_broker.service_url_tls and authz_broker.token and authz_broker.ca_cert
    audits = [_audit(broker.service_url, topic),
              _audit(authz_broker.service_url_tls, topic, tls_trust_certs_file_path=authz_broker.ca_cert,
                     authentication=pulsar.AuthenticationToken(authz_broker.token))]
    provider = _provider(m, broker.service_url)
    client = m.Client(provider, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"plain")
        assert provider.update is not None
        provider.update(m.ServiceInfo(authz_broker.service_url_tls, m.AuthenticationToken(authz_broker.token),
                                      authz_broker.ca_cert))
        _wait(lambda: client.get_service_info().service_url == authz_broker.service_url_tls, 10, "the switch")
        assert client.get_service_info().tls_trust_certs_file_path == authz_broker.ca_cert
        assert client.get_service_info().use_tls
        _send(producer, b"secured")
        assert _contents(audits[0][1], 1) == [b"plain"]
        assert _contents(audits[1][1], 1) == [b"secured"]
    finally:
        client.close()
        for c, _ in audits:
            c.close()


def test_transaction_open_during_a_switch_fails_typed(broker: Broker, second: Broker) -> None:
    """Ours only: a transaction cannot follow the client to another cluster."""
    topic = _topic("provider-txn")
    audits = [_audit(broker.service_url, topic), _audit(second.service_url, topic)]
    provider = _provider(txn, broker.service_url)
    client = txn.Client(provider, operation_timeout_seconds=10)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        t = client.new_transaction()
        producer.send(b"in-txn", txn=t)
        assert provider.update is not None
        provider.update(txn.ServiceInfo(second.service_url))
        _wait(lambda: client.get_service_info().service_url == second.service_url, 10, "the switch")
        with pytest.raises(txn.ClusterSwitched, match="cannot move between clusters") as info:
            producer.send(b"after-switch", txn=t)
        assert isinstance(info.value, txn.TransactionError)
        assert info.value.txn_id == t.id
        with pytest.raises(txn.ClusterSwitched, match="cannot move between clusters"):
            t.commit()
        sibling = client.async_client.sibling()
        assert sibling.get_service_info().service_url == second.service_url
        client.bridge.run(sibling.close())
        t2 = client.new_transaction()
        _send(producer, b"second-cluster")
        producer.send(b"in-new-txn", txn=t2)
        t2.commit()
        assert _contents(audits[1][1], 2) == [b"second-cluster", b"in-new-txn"]
        assert _contents(audits[0][1], 0) == []
    finally:
        client.close()
        for c, _ in audits:
            c.close()


def test_auto_failover_when_the_primary_stops(broker: Broker, second: Broker) -> None:
    """Both clients on AutoClusterFailover(primary=second broker, secondary=[shared]): the second
    broker stops, both switch to the shared one and their sends land there, received in order; it
    starts again and both switch back to it."""
    topic = _topic("auto-failover")
    audit_clients = []
    shared_audit_client, shared_audit = _audit(broker.service_url, topic)
    audit_clients.append(shared_audit_client)
    clients, producers, consumers = {}, {}, {}
    for side, m in CLIENTS.items():
        config = m.AutoClusterFailover(m.ServiceInfo(second.service_url), [m.ServiceInfo(broker.service_url)],
                                       check_interval_ms=200, failover_threshold=2, switch_back_threshold=1)
        clients[side] = m.Client(config, operation_timeout_seconds=10)
        producers[side] = clients[side].create_producer(topic, producer_name=f"{side}-{uuid.uuid4().hex[:6]}",
                                                        batching_enabled=False, send_timeout_millis=5000)
        consumers[side] = clients[side].subscribe(topic, f"sub-{side}", initial_position=m.InitialPosition.Earliest)
    try:
        for side in CLIENTS:
            assert clients[side].get_service_info().service_url == second.service_url
            producers[side].send(f"before-{side}".encode())
        for side in CLIENTS:
            assert sorted(_receive_all(consumers[side], 2)) == [b"before-official", b"before-ours"]
        assert second.local is not None
        t0 = time.monotonic()
        second.local.stop()
        for side in CLIENTS:
            _wait(lambda s=side: clients[s].get_service_info().service_url == broker.service_url, 60,
                  f"the {side} client's switch to the secondary")
        for side in CLIENTS:
            for i in range(2):
                _send(producers[side], f"after-{side}-{i}".encode())
            print(f"{side}: sent on the secondary at {time.monotonic() - t0:.1f}s")
        expected = sorted(f"after-{s}-{i}".encode() for s in CLIENTS for i in range(2))
        for side in CLIENTS:
            got = _receive_all(consumers[side], 4)
            assert sorted(got) == expected
            assert [g for g in got if b"ours" in g] == [b"after-ours-0", b"after-ours-1"]
            assert _drained(consumers[side])
        # The primary comes back: both clients switch back (switch_back_threshold=1) and send there.
        second.local.start(timeout=240)
        print(f"primary restarted at {time.monotonic() - t0:.1f}s")
        primary_audit_client, primary_audit = _audit(second.service_url, topic)
        audit_clients.append(primary_audit_client)
        for side in CLIENTS:
            _wait(lambda s=side: clients[s].get_service_info().service_url == second.service_url, 60,
                  f"the {side} client's switch back to the primary")
        for side in CLIENTS:
            _send(producers[side], f"back-{side}".encode())
            print(f"{side}: sent on the primary again at {time.monotonic() - t0:.1f}s")
        for side in CLIENTS:
            # The restarted broker may hand back the "before" messages (their acks were not yet
            # persisted when it stopped): those are allowed, the new ones must come exactly once.
            got = []
            # A consumer may meet the primary still starting and back off (the official C++ core
            # for up to a minute): a long timeout.
            while len([g for g in got if g.startswith(b"back-")]) < 2:
                got += _receive_all(consumers[side], 1, timeout_ms=90000)
            print(f"{side}: switched back and received at {time.monotonic() - t0:.1f}s")
            assert sorted(g for g in got if g.startswith(b"back-")) == [b"back-official", b"back-ours"]
            assert set(got) - {b"back-official", b"back-ours"} <= {b"before-official", b"before-ours"}
        # What each cluster holds, read through the subscriptions that never ack.
        on_shared = _receive_until(shared_audit, set(expected))
        assert sorted(on_shared) == expected
        assert _drained(shared_audit)
        # The standalone stopped at once may have lost its last entries (the "before" ones): only
        # the messages sent after the switch back are certain to be there.
        on_primary = _receive_until(primary_audit, {b"back-official", b"back-ours"})
        assert sorted(g for g in on_primary if g.startswith(b"back-")) == [b"back-official", b"back-ours"]
        assert set(on_primary) - {b"back-official", b"back-ours"} <= {b"before-official", b"before-ours"}
    finally:
        for c in [*clients.values(), *audit_clients]:
            c.close()
