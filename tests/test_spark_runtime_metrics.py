"""The distributed Spark runtime's Prometheus exporter (``run_job(metrics=...)``), scraped over HTTP
while a real run commits on the broker: exact counters (batches, inputs, outputs), the commit
histogram's count, no commit in flight and the subscription's backlog drained."""

from __future__ import annotations

import socket
import threading
import time
import uuid

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("prometheus_client")
pulsar = pytest.importorskip("pulsar")

from test_processor_metrics import scrape, scrape_when  # noqa: E402

from spark_jobs.runtime import run_job  # noqa: E402
from txn.admin import create_namespace, enable_namespace_dedup  # noqa: E402
from txn.delivery.processor.metrics import MetricsOptions  # noqa: E402

from peer import read_n  # noqa: E402
from spark_session import spark  # noqa: E402, F401


def _upper(df):  # noqa: ANN001, ANN202
    from pyspark.sql import functions as F

    return df.select(F.col("key"), F.upper(F.col("value").cast("string")).alias("value"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runtime_metrics_count_exactly_during_a_run(broker, spark, unique_name) -> None:  # noqa: ANN001, F811
    ns = f"public/rt-mx-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    inp, out = (f"persistent://{ns}/{unique_name(x)}" for x in ("in", "out"))
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        p = official.create_producer(inp, batching_enabled=False)
        for i in range(60):
            p.send(f"m{i}".encode(), partition_key=f"k{i % 3}")
        p.close()
        port = _free_port()
        result: dict[str, object] = {}

        def run() -> None:
            try:  # 60 messages, one per entry, 20 per batch: exactly 3 batches
                result["stats"] = run_job(
                    spark, broker.service_url, [inp], out, "rt-mx", _upper, job="rt-metrics", batch_max_messages=20,
                    idle_exit_ms=6000, admin_url=broker.admin_url, progress=None,
                    metrics=MetricsOptions(port, "127.0.0.1", backlog_ttl_s=0.0))
            except BaseException as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        th = threading.Thread(target=run, daemon=True)
        th.start()
        url = f"http://127.0.0.1:{port}/metrics"
        key = '{pipeline="rt-metrics",runtime="spark"}'
        deadline = time.monotonic() + 300
        m = None
        while m is None and th.is_alive() and time.monotonic() < deadline:
            m = scrape_when(url, batches_committed_total=3)()
            time.sleep(0.2)
        assert m is not None, f"no scrape with 3 batches committed: {result.get('error')!r}"
        m = scrape(url)  # after the third commit: the run idles (6 s) before it exits
        assert m[f"pulsartxn_processor_batches_committed_total{key}"] == 3
        assert m[f"pulsartxn_processor_messages_committed_total{key}"] == 60
        assert m[f"pulsartxn_processor_outputs_total{key}"] == 60
        assert m[f"pulsartxn_processor_batch_aborts_total{key}"] == 0
        assert m[f"pulsartxn_processor_parked_total{key}"] == 0
        assert m[f"pulsartxn_processor_commit_latency_seconds_count{key}"] == 3
        assert m[f"pulsartxn_processor_inflight_commits{key}"] == 0
        backlog = {k: v for k, v in m.items() if k.startswith("pulsartxn_processor_backlog_messages{")}
        assert backlog == {'pulsartxn_processor_backlog_messages{pipeline="rt-metrics",runtime="spark",'
                           f'subscription="rt-mx",topic="{inp}"}}': 0}
        th.join(120)
        assert not th.is_alive() and "error" not in result, result
        st = result["stats"]
        assert (st.batches, st.messages, st.outputs) == (3, 60, 60)  # type: ignore[attr-defined]
        with pytest.raises(OSError):
            scrape(url)  # the exporter stopped with the run
        c = official.subscribe(out, "check", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(x.data() for x in read_n(c, 60)) == sorted(f"M{i}".encode() for i in range(60))
    finally:
        official.close()
