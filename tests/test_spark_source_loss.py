"""The ``pulsar`` source keeps what a stopped query has not committed, and says so when data is gone.

Pulsar defaults throughout: retention 0 and no other subscription on the topic, so the broker
deletes a closed ledger as soon as no durable subscription needs it. ``unload`` closes the
topic's ledger, ``trim`` runs the retention check at once.
"""

from __future__ import annotations

import json
import pathlib
import time
import urllib.parse

import pytest
from pyspark.errors import StreamingQueryException

import txn
from spark_jobs.subscription import checkpoint_subscriptions
from txn.admin import admin_request

from spark_session import spark  # noqa: F401


@pytest.fixture(scope="module")
def client(broker):
    c = txn.Client(broker.service_url)
    yield c
    c.close()


def _admin(broker, method: str, topic: str, suffix: str, ok=(200, 204)):
    path = "/admin/v2/" + topic.replace("://", "/") + suffix
    status, body = admin_request(method, broker.admin_url, path)
    assert status in ok, (method, path, status, body)
    return body


def _ledgers(broker, topic: str) -> list[int]:
    return [lg["ledgerId"] for lg in _admin(broker, "GET", topic, "/internalStats")["ledgers"]]


def _close_and_trim(broker, producer, topic: str, tail: str):
    """Unload (the ledger closes), write ``tail`` into the next ledger, trim. Returns the ledgers before."""
    before = _ledgers(broker, topic)
    _admin(broker, "PUT", topic, "/unload")
    mid = producer.send(tail.encode())
    assert mid.ledger_id() not in before
    _admin(broker, "POST", topic, "/trim")
    return before


def _stream(spark, broker, topic, out, checkpoint, **options):  # noqa: F811
    r = (spark.readStream.format("pulsar").option("service_url", broker.service_url).option("topics", topic)
         .option("startingOffsets", "earliest"))
    for k, v in options.items():
        r = r.option(k, v)
    q = (r.load().selectExpr("CAST(value AS STRING) AS value", "message_id").writeStream.format("parquet")
         .option("path", out).option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        q.awaitTermination(180)
    except StreamingQueryException:
        pass  # the test reads q.exception()
    assert not q.isActive
    return q


def _values(spark, out) -> list[str]:  # noqa: F811
    return sorted(r.value for r in spark.read.parquet(out).collect())


def _send(producer, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        producer.send(f"m{i:03d}".encode())


def test_stopped_query_keeps_its_data_through_rollover_and_trim(spark, broker, client, topic, tmp_path):  # noqa: F811
    """The issue's reproduction: with the old non-durable readers the restart delivered 1 row of 51."""
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    producer = client.create_producer(topic, batching_enabled=False)
    _send(producer, 0, 50)
    q = _stream(spark, broker, topic, out, checkpoint)
    assert q.exception() is None
    assert _values(spark, out) == [f"m{i:03d}" for i in range(50)]

    # The query is stopped; its subscription (named in the checkpoint) holds the topic's data.
    subs = checkpoint_subscriptions(checkpoint)
    [name] = subs
    assert name.startswith("spark-pulsar-") and subs[name] == [topic]
    stats = _admin(broker, "GET", topic, "/stats")
    assert list(stats["subscriptions"]) == [name]

    _send(producer, 50, 100)
    first_ledger = _ledgers(broker, topic)[0]
    _close_and_trim(broker, producer, topic, "m100")
    assert first_ledger in _ledgers(broker, topic)  # kept for the subscription

    q = _stream(spark, broker, topic, out, checkpoint)
    assert q.exception() is None
    assert _values(spark, out) == [f"m{i:03d}" for i in range(101)]

    # Spark commits a micro-batch's end when it plans the next one (or restarts): then the cursor
    # moves past the first ledger, the broker may free it, and nothing is lost.
    _send(producer, 101, 103)
    _close_and_trim(broker, producer, topic, "m103")
    q = _stream(spark, broker, topic, out, checkpoint)
    assert q.exception() is None
    assert _values(spark, out) == [f"m{i:03d}" for i in range(104)]
    for _ in range(40):  # the broker applies the ack asynchronously: trim until it frees the ledger
        _admin(broker, "POST", topic, "/trim")
        if first_ledger not in _ledgers(broker, topic):
            break
        time.sleep(0.25)
    assert first_ledger not in _ledgers(broker, topic)
    producer.close()


@pytest.mark.parametrize("how", ["skip_all", "delete"])
def test_restart_after_data_deleted_fails_or_warns(spark, broker, client, unique_name, tmp_path, how):  # noqa: F811
    """The subscription skipped to its end (or removed), then trimmed: the restart names the lost range."""
    topic = f"persistent://public/default/{unique_name('loss')}"
    sub = unique_name("q")
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")
    producer = client.create_producer(topic, batching_enabled=False)
    _send(producer, 0, 20)
    q = _stream(spark, broker, topic, out, checkpoint, subscription=sub)
    assert q.exception() is None
    assert _values(spark, out) == [f"m{i:03d}" for i in range(20)]
    assert checkpoint_subscriptions(checkpoint) == {sub: [topic]}

    ids = [producer.send(f"m{i:03d}".encode()) for i in range(20, 30)]
    if how == "skip_all":
        _admin(broker, "POST", topic, f"/subscription/{urllib.parse.quote(sub)}/skip_all")
    else:
        _admin(broker, "DELETE", topic, f"/subscription/{urllib.parse.quote(sub)}")
    first_ledger = _ledgers(broker, topic)[0]
    _close_and_trim(broker, producer, topic, "m030")
    assert first_ledger not in _ledgers(broker, topic)

    q = _stream(spark, broker, topic, out, checkpoint, subscription=sub)
    err = str(q.exception())
    assert "PulsarDataLossError" in err, err
    last_read = f"{ids[0].ledger_id()}:{ids[0].entry_id() - 1}:-1"
    assert f"{topic} (partition -1)" in err and f"after {last_read}" in err, err
    assert _values(spark, out) == [f"m{i:03d}" for i in range(20)]  # nothing written by the failed batch

    # failOnDataLoss=false: the same facts as a warning, then what the broker still has.
    q = _stream(spark, broker, topic, out, checkpoint, subscription=sub, failOnDataLoss="false")
    assert q.exception() is None
    assert _values(spark, out) == [f"m{i:03d}" for i in range(20)] + ["m030"]
    producer.close()


def test_batch_read_from_a_trimmed_start_fails_or_warns(spark, broker, client, topic):  # noqa: F811
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(f"m{i:03d}".encode()) for i in range(5)]
    _close_and_trim(broker, producer, topic, "m005")
    start = json.dumps({topic: f"{ids[1].ledger_id()}:{ids[1].entry_id()}"})

    def read(**options):
        r = (spark.read.format("pulsar").option("service_url", broker.service_url).option("topics", topic)
             .option("startingOffsets", start))
        for k, v in options.items():
            r = r.option(k, v)
        return sorted(r.value.decode() for r in r.load().collect())

    with pytest.raises(Exception, match="PulsarDataLossError") as info:
        read()
    msg = str(info.value)
    assert f"{topic} (partition -1)" in msg and f"after {ids[1].ledger_id()}:{ids[1].entry_id()}:-1" in msg, msg
    assert read(failOnDataLoss="false") == ["m005"]
    # A start that is still stored reads on as before.
    producer.send(b"m006")
    assert read(startingOffsets="earliest") == ["m005", "m006"]
    producer.close()


def test_checkpoint_subscriptions_reader(tmp_path):
    log = pathlib.Path(tmp_path, "offsets")
    log.mkdir()
    (log / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"persistent://a/b/c": "1:2:-1", "subscription": "s"}')
    (log / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"persistent://a/b/c": "1:3:-1", "subscription": "s"}')
    (log / ".1.crc").write_text("x")
    assert checkpoint_subscriptions(str(tmp_path)) == {"s": ["persistent://a/b/c"]}
    (log / "2").write_text('v1\n{"batchWatermarkMs":0}\n{"persistent://a/b/c": "1:4:-1"}\n-\n'
                           '{"persistent://a/b/d-partition-1": "earliest", "subscription": "t"}')
    assert checkpoint_subscriptions(str(tmp_path)) == {"t": ["persistent://a/b/d-partition-1"]}


def test_drop_subscription_cli(broker, client, topic, tmp_path, capsys):
    from txn_shell import cli

    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    held = client.subscribe(topic, "retired-query", initial_position=txn.InitialPosition.Earliest)
    log = pathlib.Path(tmp_path, "offsets")
    log.mkdir()
    (log / "3").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"{topic}": "1:2:-1", "subscription": "retired-query"}}')
    args = ["spark", "drop-subscription", "--admin-url", broker.admin_url, "--checkpoint", str(tmp_path)]
    assert cli.main(args) == 1  # a consumer is connected: refused
    assert "stop the query first" in capsys.readouterr().err
    held.close()
    assert cli.main(args) == 0
    assert capsys.readouterr().out == f"dropped subscription retired-query on {topic}\n"
    assert "retired-query" not in _admin(broker, "GET", topic, "/stats")["subscriptions"]
    assert cli.main(["spark", "drop-subscription", "--admin-url", broker.admin_url, "--topic", topic,
                     "--subscription", "retired-query"]) == 0
    assert capsys.readouterr().out == f"no subscription retired-query on {topic}\n"
    assert cli.main(["spark", "drop-subscription", "--admin-url", broker.admin_url, "--topic", topic]) == 2
    producer.close()
