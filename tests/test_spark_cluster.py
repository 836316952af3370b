"""``pulsar-txn spark submit`` against a real Spark standalone cluster (master + 1 worker on loopback).

The cluster comes from txn_shell/spark_cluster.py; the job code is the same as in local mode
(tests/test_spark_runtime.py::test_spark_submit_cli), only ``--master`` differs, so the executors'
Python workers import ``spark_jobs``/``txn`` from the venv and talk to the broker themselves.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pulsar
import pytest

from peer import read_n

ROOT = Path(__file__).resolve().parent.parent


def _standalone():
    return importlib.import_module("txn_shell.spark_cluster")


@pytest.fixture(scope="module")
def cluster(request):
    """The cluster, started with the worker's first port already taken (by a socket held here):
    the worker's first attempt must exit on the bind failure and the start-up retry it on fresh
    ports, as it would when another process grabs a chosen port before Spark binds it."""
    sa = _standalone()
    d = tempfile.mkdtemp(prefix="spark-cluster-test-", dir="/tmp")
    failed_before = request.session.testsfailed
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    calls = []
    free_port = sa._free_port

    def free_port_first_worker_busy() -> int:  # calls: master rpc, master ui, worker rpc, worker ui, ...
        calls.append(1)
        return busy if len(calls) == 3 else free_port()

    sa._free_port = free_port_first_worker_busy
    try:
        url = sa.start_cluster(d, cores=1, memory="1g", timeout=180)
    except BaseException:
        print(f"\nspark cluster did not start; logs kept in {d}")
        raise
    finally:
        sa._free_port = free_port
        taken.close()
    try:
        yield url, sa, d, busy
    finally:
        sa.stop_cluster(d)
        if request.session.testsfailed == failed_before:
            shutil.rmtree(d, ignore_errors=True)
        else:
            print(f"\nspark cluster logs kept in {d}")


@pytest.fixture
def official(broker):
    c = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def test_cluster_status(cluster):
    master_url, sa, d, busy = cluster
    st = sa.cluster_status(d)
    assert st["running"] and st["master_url"] == master_url and master_url.startswith("spark://127.0.0.1:")
    alive = [(w["state"], w["cores"], w["memory"]) for w in st["workers"] if w["state"] == "ALIVE"]
    assert alive == [("ALIVE", 1, 1024)]
    assert [w["port"] for w in st["workers"] if w["state"] == "ALIVE"] == [st["worker_port"]] != [busy]
    # the first worker attempt hit the taken port and exited; the second, on fresh ports, came up
    registered = f"Successfully registered with master {master_url}"
    deadline = time.monotonic() + 30
    while True:
        # The master lists the worker ALIVE a moment before the worker's log says it registered.
        attempts = (Path(d) / "worker.log").read_text(errors="replace").split("=== attempt ")[1:]
        if (len(attempts) == 2 and registered in attempts[1]) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [a.split()[0] for a in attempts] == ["1", "2"], attempts
    assert f"--port {busy} " in attempts[0] and f"failed after 0 retries (starting from {busy})" in attempts[0]
    assert registered in attempts[1]
    assert (Path(d) / "master.log").read_text(errors="replace").count("=== attempt ") == 1
    # status from another process (the CLI) agrees, and identifies the daemons by pid + start time
    r = subprocess.run([sys.executable, "-m", "txn_shell.spark_cluster", "status", "--dir", d],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"running: {master_url} "), r.stdout + r.stderr
    for role in ("master", "worker"):
        assert sa._alive(st["pids"][role], role, st["start_times"][role])
        assert not sa._alive(st["pids"][role], role, st["start_times"][role] + 1)  # another process's start time


def test_spark_submit_on_standalone_cluster(cluster, broker, official, unique_name):
    master_url, sa, d, _ = cluster
    inp, out = (f"persistent://public/default/{unique_name(x)}" for x in ("in", "out"))
    p = official.create_producer(inp, batching_enabled=False)
    for payload in (b"sku=A,qty=3", b"sku=B,qty=2", b"sku=C,qty=5"):
        p.send(payload)
    p.close()
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    r = subprocess.run(
        [sys.executable, "-m", "txn_shell.cli", "spark", "submit", "enrich", "--service-url", broker.service_url,
         "--input", inp, "--output", out, "--subscription", "cluster", "--master", master_url,
         "--exit-when-idle-ms", "5000", "--batch-max-delay-ms", "1500"],
        capture_output=True, text=True, timeout=240, env=env, cwd=str(ROOT),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"on {master_url}" in r.stderr
    assert "committed: rows in=3 out=3" in r.stderr and "txn (" in r.stderr, r.stderr[-3000:]
    reader = official.subscribe(out, "r", initial_position=pulsar.InitialPosition.Earliest)
    rows = sorted((json.loads(m.data()) for m in read_n(reader, 3)), key=lambda x: x["sku"])
    assert [(x["sku"], x["qty"], x["total"], x["tier"]) for x in rows] == [
        ("A", 3, 7.5, "bronze"), ("B", 2, 20.0, "silver"), ("C", 5, 495.0, "gold")]
    # the work really ran on the cluster: the worker launched an executor for this application
    assert any((Path(d) / "work").glob("app-*/*/stderr")), "no executor ran on the standalone worker"
