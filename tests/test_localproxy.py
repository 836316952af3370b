"""txn_shell.localproxy: the real Apache Pulsar Proxy (``bin/pulsar proxy``) in front of the session
broker, configured by URL (no metadata store), as Kubernetes users connect.

Through the proxy, with txn's client: produce and consume, then a transaction that produces and
acknowledges (commit), read back by the official client, also through the proxy. Every
connection txn's client opened goes to the proxy's port (naming the broker it stands for). The
proxy's web port forwards the admin REST API. About 30-60 s, most of it the proxy's start.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pulsar
import pytest

import txn
from txn.admin import admin_request, create_namespace
from txn_shell.localbroker import HOST
from txn_shell.localproxy import LocalProxy, proxy_overrides


@pytest.fixture(scope="module")
def proxy(broker, tmp_path_factory) -> Iterator[LocalProxy]:  # noqa: ANN001
    p = LocalProxy(broker.service_url, broker.admin_url, data_dir=tmp_path_factory.mktemp("proxy"))
    p.start(timeout=150)
    try:
        yield p
    finally:
        p.stop()


def test_proxy_overrides_allow_only_the_broker() -> None:
    o = proxy_overrides("pulsar://127.0.0.1:41234", "http://127.0.0.1:41235", 50000, 50001)
    assert o["brokerProxyAllowedTargetPorts"] == "41234"
    assert o["brokerProxyAllowedHostNames"] == o["brokerProxyAllowedIPAddresses"] == HOST
    assert (o["bindAddress"], o["advertisedAddress"]) == (HOST, HOST)
    assert (o["servicePort"], o["webServicePort"]) == ("50000", "50001")
    assert o["metadataStoreUrl"] == "" and o["clusterName"]


@pytest.mark.timeout(90)
def test_produce_consume_and_commit_through_the_proxy(broker, proxy) -> None:  # noqa: ANN001
    assert proxy.is_running() and urlsplit(proxy.service_url).hostname == HOST
    # The admin REST API through the proxy's web port.
    status, clusters = admin_request("GET", proxy.admin_url, "/admin/v2/clusters")
    assert status == 200 and clusters
    ns = f"public/proxy-{uuid.uuid4().hex[:8]}"
    create_namespace(proxy.admin_url, ns)
    src, dst = f"persistent://{ns}/src", f"persistent://{ns}/dst"

    with txn.Client(proxy.service_url, operation_timeout_seconds=60) as client:
        consumer = client.subscribe(src, "s", initial_position=txn.InitialPosition.Earliest)
        producer = client.create_producer(src, batching_enabled=False)
        for i in range(5):
            producer.send(b"m%d" % i)
        got = [consumer.receive(timeout_millis=20000) for _ in range(5)]
        assert [m.data() for m in got] == [b"m%d" % i for i in range(5)]
        for m in got[:3]:
            consumer.acknowledge(m)

        # A transaction through the proxy: its coordinator is found by a lookup the proxy forwards.
        out = client.create_producer(dst, batching_enabled=False)
        with client.new_transaction(timeout_millis=30000) as t:
            for m in got[3:]:
                out.send(m.data().upper(), txn=t)
                consumer.acknowledge(m, txn=t)
        assert t.state == txn.TxnState.COMMITTED

        # An aborted one leaves nothing behind.
        consumer2 = client.subscribe(dst, "check", initial_position=txn.InitialPosition.Earliest)
        t2 = client.new_transaction(timeout_millis=30000)
        out.send(b"never", txn=t2)
        t2.abort()

        keys = client.async_client.context.pool.connection_keys()  # (logical URL, physical URL) each
        assert keys and all(phys == proxy.service_url for _, phys in keys), keys
        assert any(logical == broker.service_url for logical, _ in keys), keys
        assert [consumer2.receive(timeout_millis=20000).data() for _ in range(2)] == [b"M3", b"M4"]
        with pytest.raises(txn.Timeout):
            consumer2.receive(timeout_millis=1500)
        consumer.close()
        consumer2.close()

    # The committed output and the acknowledgements, seen by the official client through the proxy.
    official = pulsar.Client(proxy.service_url, operation_timeout_seconds=60,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = official.create_reader(dst, pulsar.MessageId.earliest)
        seen = []
        while reader.has_message_available():
            seen.append(reader.read_next(timeout_millis=10000).data())
        reader.close()
        assert seen == [b"M3", b"M4"]
        again = official.subscribe(src, "s")
        with pytest.raises(pulsar.Timeout):  # every input was acknowledged (plainly or in the transaction)
            again.receive(timeout_millis=2000)
        again.close()
    finally:
        official.close()
