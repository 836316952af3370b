"""The ``pulsar-txn`` CLI end to end: process (with a poison message), replay, SIGTERM, broker status."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid

import pulsar
import pytest

from txn.admin import create_namespace

from peer import read_n, read_until_sentinel


def _fresh_ns(broker) -> str:
    """A namespace of the test's own: after a broker restart (the chaos and reconnect tests do
    one) a new topic in an old namespace can wait for that namespace's transaction-buffer
    snapshot topic to recover before it dispatches; a fresh namespace has no such history."""
    ns = f"public/cli-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    return f"persistent://{ns}/"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txn_shell.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def test_process_park_and_replay_from_the_cli(broker, official, unique_name):
    ns = _fresh_ns(broker)
    inp, out, ledger = (ns + unique_name(x) for x in ("in", "out", "ledger"))
    p = official.create_producer(inp)
    for d in [b"a", b"b", b"poison-c", b"d"]:
        p.send(d)
    p.close()
    r = _cli("process", "--service-url", broker.service_url, "--input", inp, "--output", out,
             "--subscription", "cli", "--handler", "txn_shell.examples.handlers:poison_aware", "--job", "clijob",
             "--ledger-topic", ledger, "--max-attempts", "2", "--batch-max-delay-ms", "300",
             "--exit-when-idle-ms", "5000")
    assert r.returncode == 0, r.stderr
    assert "stopped: " in r.stderr and "1 parked" in r.stderr
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    assert sorted(m.data() for m in read_n(reader, 3)) == [b"A", b"B", b"D"]
    # Find the parked batch id from the parking topic.
    # Not acked: once every subscription acked it, the broker (retention none) may delete the ledger the replay reads.
    pr = official.subscribe(inp + "-parked", "peek", initial_position=pulsar.InitialPosition.Earliest)
    pm = pr.receive(timeout_millis=30000)
    batch = pm.properties()["pulsar-txn.batch_id"]
    assert batch.startswith("clijob:")
    r1 = _cli("replay", "--service-url", broker.service_url, "--batch", batch, "--ledger-topic", ledger,
              "--handler", "txn_shell.examples.handlers:upper", "--output", out)
    assert r1.returncode == 0, r1.stderr
    assert f"replayed 1 message(s) of batch {batch}" in r1.stdout
    assert [m.data() for m in read_n(reader, 1)] == [b"POISON-C"]
    code = ("--handler", "txn_shell.examples.handlers:upper", "--output", out)  # never taken from the ledger
    r2 = _cli("replay", "--service-url", broker.service_url, "--batch", batch, "--ledger-topic", ledger, *code)
    assert r2.returncode == 0 and "already replayed" in r2.stdout
    assert read_until_sentinel(official, reader, out) == []
    r3 = _cli("replay", "--service-url", broker.service_url, "--batch", "clijob:nope:1", "--ledger-topic", ledger,
              *code)
    assert r3.returncode == 1 and "not in the ledger" in r3.stderr


def test_sigterm_finishes_the_batch_and_exits_cleanly(broker, official, unique_name):
    ns = _fresh_ns(broker)
    inp, out = ns + unique_name("in"), ns + unique_name("out")
    proc = subprocess.Popen(
        [sys.executable, "-m", "txn_shell.cli", "process", "--service-url", broker.service_url, "--input", inp,
         "--output", out, "--subscription", "term", "--handler", "txn_shell.examples.handlers:upper",
         "--progress-interval", "1"],
        stderr=subprocess.PIPE, text=True,
    )
    try:
        p = official.create_producer(inp)
        for i in range(200):
            p.send(f"m{i}".encode())
        reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
        got = read_n(reader, 200)
        assert sorted(m.data() for m in got) == sorted(f"M{i}".encode() for i in range(200))
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert time.monotonic() - t0 < 30
        assert "stopped: " in err and "200 messages" in err
        assert "batches=" in err  # progress lines were printed
    finally:
        if proc.poll() is None:
            proc.kill()


def test_broker_status_json(broker):
    if broker.local is None:
        pytest.skip("status of a broker this suite did not start")
    r = _cli("broker", "status", "--json", "--data-dir", str(broker.local.data_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    st = json.loads(r.stdout)
    assert st["running"] is True and st["healthy"] is True
    assert st["service_url"] == broker.service_url


def test_cli_usage_errors():
    r = _cli("process", "--service-url", "pulsar://127.0.0.1:1")
    assert r.returncode == 2 and "required" in r.stderr
    r = _cli("replay", "--service-url", "pulsar://127.0.0.1:1", "--batch", "x", "--handler", "nomodule",
             "--output", "out")
    assert r.returncode != 0 and "module:function" in r.stderr


def test_process_with_schemas_from_the_cli(broker, official, unique_name):
    import pulsar.schema as ps

    class Order(ps.Record):  # the same definition as txn_shell.examples.handlers.Order
        _avro_namespace = "pulsar_txn.examples"
        id = ps.Integer(required=True)
        item = ps.String()
        qty = ps.Integer(required=True)

    class OrderLine(ps.Record):
        _avro_namespace = "pulsar_txn.examples"
        order = ps.Integer(required=True)
        n = ps.Integer(required=True)
        item = ps.String()

    ns = _fresh_ns(broker)
    inp, out, ledger = (ns + unique_name(x) for x in ("in", "out", "ledger"))
    p = official.create_producer(inp, schema=ps.JsonSchema(Order))
    for i in range(6):
        p.send(Order(id=i, item=f"item{i}", qty=i % 3))
    p.close()
    reader = official.subscribe(out, "r", schema=ps.AvroSchema(OrderLine),
                                initial_position=pulsar.InitialPosition.Earliest)
    r = _cli("process", "--service-url", broker.service_url, "--input", inp, "--output", out,
             "--subscription", "cli", "--handler", "txn_shell.examples.handlers:order_lines", "--ledger-topic", ledger,
             "--input-schema", "json:txn_shell.examples.handlers:Order",
             "--output-schema", "avro:txn_shell.examples.handlers:OrderLine", "--exit-when-idle-ms", "4000")
    assert r.returncode == 0, r.stderr
    got = sorted((m.value().order, m.value().n, m.value().item) for m in read_n(reader, 6))
    assert got == [(1, 0, "item1"), (2, 0, "item2"), (2, 1, "item2"), (4, 0, "item4"), (5, 0, "item5"),
                   (5, 1, "item5")]
    assert read_until_sentinel(official, reader, out) == []
    bad = _cli("process", "--service-url", broker.service_url, "--input", inp, "--output", out,
               "--subscription", "cli2", "--handler", "txn_shell.examples.handlers:order_lines",
               "--input-schema", "xml:whatever")
    assert bad.returncode != 0 and "--input-schema: schema must be one of bytes, string" in bad.stderr
