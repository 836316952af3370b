"""``pulsar-txn demo`` end to end, against the session's broker.

The demo runs as the README runs it (the CLI, in a process of its own) with ``--service-url``;
its ``--json`` summary must show exactly one batch committed after the injected fault, one
parked and replayed, and the exactly-once check passed. The test then checks the outcome on its
own: it regenerates the demo's events from the seed and reads the output and parking topics
with the official client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pulsar
import pytest

from txn.admin import admin_request
from txn_shell.examples import demo_data
from txn_shell.examples.demo import DEMO_RETENTION_MB, DEMO_RETENTION_MINUTES, MAX_ATTEMPTS
from txn_shell.localbroker import free_port

#: Saturates the machine (or starts brokers of its own): `make test` runs it after the parallel part, alone.
pytestmark = pytest.mark.solo

ROOT = Path(__file__).resolve().parent.parent


def _demo(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "txn_shell.cli", "demo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _read_all(service_url: str, topic: str, want: int) -> list[pulsar.Message]:
    """At least ``want`` messages of ``topic`` (fewer if they are not there), then whatever else is there."""
    client = pulsar.Client(service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        out = []
        misses = 0
        while len(out) < want and misses < 6:
            try:
                out.append(reader.read_next(timeout_millis=5000))
            except pulsar.Timeout:
                misses += 1
        while reader.has_message_available():
            try:
                out.append(reader.read_next(timeout_millis=3000))
            except pulsar.Timeout:
                break
        return out
    finally:
        client.close()


def _alive(pid: int) -> bool:
    try:
        return b"coordinator_api" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.timeout(900)
def test_demo_end_to_end(broker: Any, tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    res = _demo("--service-url", broker.service_url, "--admin-url", broker.admin_url, "--work-dir",
                str(tmp_path / "work"), "--json", str(summary_file), "--api-port", str(free_port()), timeout=840)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    s = json.loads(summary_file.read_text())

    # One line per step, eleven steps, and the verdict.
    steps = [line for line in res.stdout.splitlines() if line.startswith("[") and "/11 " in line]
    assert [line.split("/11 ")[0].split()[-1] for line in steps] == [str(i) for i in range(1, 12)], out
    assert res.stdout.rstrip().endswith("result: OK"), out

    # The API's view of the job (the demo read it from /jobs, /batches and /transactions).
    events = demo_data.phase_one(s["seed"], s["base_ms"], s["per_topic"]) + demo_data.phase_two(s["seed"], s["base_ms"])
    b = s["batches"]
    assert s["ok"] is True
    assert s["events"] == len(events) == 2 * s["per_topic"] + 2
    assert s["inputs_committed"] == len(events)
    assert b["parked"] == 1 and b["replayed"] == 1
    assert b["committed_after_retry"] == 1
    assert b["committed"] >= 2  # phase 1, and the poison's companion
    assert b["total"] == b["committed"] + b["aborted"] + b["replayed"]
    assert s["jobs_batches_by_status"] == {k: v for k, v in (("COMMITTED", b["committed"]), ("ABORTED", b["aborted"]),
                                                             ("REPLAYED", b["replayed"])) if v}
    # The fault aborted one attempt; the poison's batch and each sub-batch holding it failed MAX_ATTEMPTS times.
    assert s["max_attempts"] == MAX_ATTEMPTS
    assert s["aborted_transactions"] == 1 + MAX_ATTEMPTS * (b["aborted"] + 1)
    assert s["replay"]["status"] == "succeeded" and s["replay"]["messages"] == 1
    eo = s["exactly_once"]
    assert eo["passed"] is True
    assert (eo["missing"], eo["unexpected"], eo["wrong"], eo["unreadable"]) == ([], [], [], 0)
    assert eo["events_counted"] == eo["events"] == len(events)
    assert eo["output_messages"] == eo["ledger_outputs"] == s["outputs_committed"]
    assert not _alive(s["api_pid"])  # stopped without --keep-running

    # The run's namespace keeps its data whatever was acknowledged (the parking topic below was
    # acknowledged by the replay): under the default retention the broker could delete it.
    status, policy = admin_request("GET", broker.admin_url, f"/admin/v2/namespaces/{s['namespace']}/retention")
    assert (status, policy) == (200, {"retentionTimeInMinutes": DEMO_RETENTION_MINUTES,
                                      "retentionSizeInMB": DEMO_RETENTION_MB})

    # On our own: the output topic, merged per window and key, equals the generator's aggregates.
    expected = demo_data.expected_aggregates(events)
    assert sum(n for n, _ in expected.values()) == len(events)
    msgs = _read_all(broker.service_url, s["output"], s["outputs_committed"])
    assert len(msgs) == s["outputs_committed"]
    merged: dict[tuple[str, str], tuple[int, int]] = {}
    for m in msgs:
        r = json.loads(m.data())
        k = (r["window_start"], r["key"])
        n, total = merged.get(k, (0, 0))
        merged[k] = (n + r["count"], total + r["sum"])
    assert merged == expected
    refund = next(e for e in events if e.amount < 0)
    assert merged != demo_data.expected_aggregates(e for e in events if e is not refund)  # the replay counted it
    # The refund went through the parking topic: exactly one parked message, the refund itself.
    parked = _read_all(broker.service_url, s["inputs"][refund.topic] + "-parked", 1)
    assert [m.data() for m in parked] == [refund.value()]
    assert parked[0].event_timestamp() == refund.event_ms  # kept when parked: the replay windows it by event time
    assert parked[0].properties()["pulsar-txn.batch_id"] == s["replay"]["batch_id"]


def test_demo_fails_clearly_without_a_broker(tmp_path: Path) -> None:
    summary_file = tmp_path / "summary.json"
    port = free_port()
    res = _demo("--service-url", f"pulsar://127.0.0.1:{port}", "--admin-url", f"http://127.0.0.1:{port}",
                "--work-dir", str(tmp_path / "work"), "--json", str(summary_file), timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"error: the broker's admin API at http://127.0.0.1:{port} is not reachable" in res.stderr
    assert " 1/11 broker: FAILED" in res.stdout
    assert res.stdout.rstrip().endswith("result: FAILED")
    s = json.loads(summary_file.read_text())
    assert s["ok"] is False and "not reachable" in s["error"]


def test_demo_needs_admin_url_with_service_url() -> None:
    res = _demo("--service-url", "pulsar://127.0.0.1:1", timeout=60)
    assert res.returncode == 2 and "--admin-url is required" in res.stderr
