"""The processor's Prometheus exporter, scraped over HTTP while a processor runs on the real broker:
exact counters, the latency histogram, the backlog from the admin API, the CLI's ``--metrics-port``
and the error when ``prometheus_client`` is missing."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pulsar
import pytest

import txn
from txn.admin import create_namespace, create_partitioned_topic
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.delivery.processor.metrics import (
    METRIC_NAMES,
    BacklogProbe,
    MetricsOptions,
    MetricsUnavailable,
    ProcessorMetrics,
)

from peer import read_n


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def _ns(broker) -> str:
    ns = f"public/metrics-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    return f"persistent://{ns}/"


def _fill(official, topic: str, payloads: list[bytes]) -> None:
    p = official.create_producer(topic)
    for d in payloads:
        p.send(d)
    p.close()


def scrape(url: str) -> dict[str, float]:
    """``series{labels}`` -> value of a text exposition."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def _wait_for(probe, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def scrape_when(url: str, **want: float):
    """A probe for :func:`_wait_for`: the scrape once every ``series=value`` of ``want`` holds (the
    series are given without the ``pulsartxn_processor_`` prefix, labelled ``pipeline``/``runtime``)."""

    def probe():
        try:
            s = scrape(url)
        except OSError:
            return None
        ok = all(any(k.startswith(f"pulsartxn_processor_{name}{{") and v == value for k, v in s.items())
                 for name, value in want.items())
        return s if ok else None

    return probe


def twice(m: txn.Message) -> list[bytes]:
    if b"poison" in m.data():
        raise ValueError("poison")
    return [m.data(), m.data().upper()]


def test_exporter_counts_exactly_during_a_run(broker, official, unique_name):
    ns = _ns(broker)
    inp, out, ledger = (ns + unique_name(x) for x in ("in", "out", "ledger"))
    _fill(official, inp, [f"m-{i:02d}".encode() for i in range(30)])
    opts = MetricsOptions(0, "127.0.0.1", admin_url=broker.admin_url, backlog_ttl_s=0)
    conf = ProcessorConfig(inputs=[inp], output=out, subscription="mx", job="metrics-job", ledger_topic=ledger,
                           batch_max_messages=10, batch_max_delay_ms=5000, max_attempts=1, metrics=opts)
    holder: dict = {}
    stop = threading.Event()

    async def main() -> None:
        async with txn.AsyncClient(broker.service_url) as client:
            proc = AsyncProcessor(client, twice, conf)
            holder["proc"] = proc
            await proc.start()
            runner = asyncio.ensure_future(proc.run())
            while not stop.is_set():
                await asyncio.sleep(0.05)
            proc.stop()
            await runner
            await proc.close()

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    proc = _wait_for(lambda: holder.get("proc") if getattr(holder.get("proc"), "metrics", None) else None, "start")
    url = _wait_for(lambda: proc.metrics.url, "the exporter")
    key = '{pipeline="metrics-job",runtime="processor"}'
    try:
        # phase 1: 30 clean inputs, batches close at 10 -> 3 batches, 60 outputs
        m = _wait_for(scrape_when(url, messages_committed_total=30), "30 inputs committed")
        assert m[f"pulsartxn_processor_batches_committed_total{key}"] == 3
        assert m[f"pulsartxn_processor_outputs_total{key}"] == 60
        assert m[f"pulsartxn_processor_batch_aborts_total{key}"] == 0
        assert m[f"pulsartxn_processor_parked_total{key}"] == 0
        assert m[f"pulsartxn_processor_duplicates_skipped_total{key}"] == 0
        assert m[f"pulsartxn_processor_inflight_commits{key}"] == 0
        assert m[f"pulsartxn_processor_commit_latency_seconds_count{key}"] == 3
        assert m['pulsartxn_processor_commit_latency_seconds_bucket{le="+Inf",pipeline="metrics-job",'
                 'runtime="processor"}'] == 3  # labels in name order, as the exposition writes them
        assert m[f"pulsartxn_processor_commit_latency_seconds_sum{key}"] > 0
        assert m[f"pulsartxn_processor_last_commit_timestamp_seconds{key}"] <= time.time()
        assert m[f"pulsartxn_processor_backlog_messages{{pipeline=\"metrics-job\",runtime=\"processor\","
                 f"subscription=\"mx\",topic=\"{inp}\"}}"] == 0
        assert m[f"pulsartxn_processor_backlog_errors_total{key}"] == 0
        # phase 2: 10 more, one poison -> parked alone; the rest commit
        _fill(official, inp, [b"poison-x" if i == 4 else f"n-{i}".encode() for i in range(10)])
        m = _wait_for(scrape_when(url, parked_total=1, messages_committed_total=39), "the poison parked")
        assert m[f"pulsartxn_processor_outputs_total{key}"] == 78
        assert m[f"pulsartxn_processor_batch_aborts_total{key}"] == proc.stats.aborts >= 1
        assert m[f"pulsartxn_processor_batches_committed_total{key}"] == proc.stats.batches
        assert m[f"pulsartxn_processor_commit_latency_seconds_count{key}"] == proc.stats.batches
        exported = {k.split("{", 1)[0] for k in m}
        for name in METRIC_NAMES:  # every documented series is exported (histograms by their parts)
            assert name in exported or f"{name}_count" in exported, name
    finally:
        stop.set()
        t.join(60)
    assert not t.is_alive()
    with pytest.raises(OSError):  # close() stopped the server
        urllib.request.urlopen(url, timeout=5)
    reader = official.subscribe(out, "check", initial_position=pulsar.InitialPosition.Earliest)
    assert len(read_n(reader, 78)) == 78


def test_backlog_probe_reads_the_subscription_backlog(broker, official, unique_name):
    ns = _ns(broker)
    plain, parted = ns + unique_name("plain"), ns + unique_name("parted")
    create_partitioned_topic(broker.admin_url, parted, 2)
    for t in (plain, parted):
        official.subscribe(t, "lagging").close()  # a durable subscription that acknowledges nothing
    _fill(official, plain, [b"x"] * 7)
    p = official.create_producer(parted, message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
                                 batching_enabled=False)
    for _ in range(5):
        p.send(b"y")
    p.close()
    probe = BacklogProbe(broker.admin_url, "lagging", [plain, parted, ns + unique_name("absent")], ttl_s=3600)
    assert probe.backlog() == {plain: 7, parted: 5}
    _fill(official, plain, [b"x"])
    assert probe.backlog() == {plain: 7, parted: 5}  # cached for ttl_s
    assert probe.errors == 0
    down = BacklogProbe("http://127.0.0.1:1", "lagging", [plain], ttl_s=0, timeout_s=2)
    assert down.backlog() == {} and down.errors == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_metrics_port(broker, official, unique_name):
    ns = _ns(broker)
    inp, out, ledger = (ns + unique_name(x) for x in ("in", "out", "ledger"))
    _fill(official, inp, [f"c-{i}".encode() for i in range(12)])
    port = _free_port()
    cmd = [sys.executable, "-m", "txn_shell.cli", "process", "--service-url", broker.service_url, "--input", inp,
           "--output", out, "--subscription", "cli-mx", "--job", "cli-metrics", "--ledger-topic", ledger,
           "--handler", "txn_shell.examples.handlers:upper", "--batch-max-messages", "4",
           "--batch-max-delay-ms", "5000", "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
           "--metrics-admin-url", broker.admin_url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    key = '{pipeline="cli-metrics",runtime="processor"}'
    url = f"http://127.0.0.1:{port}/metrics"

    try:
        m = _wait_for(scrape_when(url, messages_committed_total=12), "12 inputs committed by the CLI")
        assert m[f"pulsartxn_processor_batches_committed_total{key}"] == 3
        assert m[f"pulsartxn_processor_outputs_total{key}"] == 12
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert "stopped: 3 batches, 12 messages" in err


def test_without_prometheus_client_the_extra_is_named(monkeypatch):
    from txn_shell import cli

    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    m = ProcessorMetrics("j", lambda: None)
    with pytest.raises(MetricsUnavailable, match=r"pip install 'pulsar-txn\[metrics\]'"):
        m.serve(0, "127.0.0.1")
    with pytest.raises(SystemExit, match=r"pulsar-txn\[metrics\]"):
        cli.main(["process", "--service-url", "pulsar://127.0.0.1:1", "--input", "a", "--output", "b",
                  "--subscription", "s", "--handler", "txn_shell.examples.handlers:upper", "--metrics-port", "0"])


def test_livez_answers_while_a_scrape_waits_for_the_broker():
    """No broker: ``GET /livez`` on the metrics port (the pod probe) answers at once while a scrape
    is stuck on an admin API that accepts connections and never answers; the scrape then reports
    the failed backlog read, with the ``pipeline`` label (formerly ``job``)."""

    class Stats:
        batches = aborts = messages = outputs = parked = duplicates_skipped = 0

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        probe = BacklogProbe(f"http://127.0.0.1:{silent.getsockname()[1]}", "s", ["persistent://public/default/t"],
                             ttl_s=0, timeout_s=8)
        m = ProcessorMetrics("orders/enrich", lambda: Stats, backlog=probe)
        port = m.serve(0, "127.0.0.1")
        try:
            scraped: dict = {}
            scraper = threading.Thread(target=lambda: scraped.update(scrape(m.url)), daemon=True)
            scraper.start()
            time.sleep(0.5)  # the scrape now waits on the silent admin port
            assert scraper.is_alive()
            t0 = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=10) as resp:
                assert (resp.status, resp.read()) == (200, b'{"status": "alive"}')
            assert time.monotonic() - t0 < 4
            scraper.join(30)
            key = '{pipeline="orders/enrich",runtime="processor"}'
            assert scraped[f"pulsartxn_processor_backlog_errors_total{key}"] == 1
            assert scraped[f"pulsartxn_processor_batches_committed_total{key}"] == 0
            assert not [k for k in scraped if "job=" in k]
        finally:
            m.close()
