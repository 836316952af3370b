"""The dashboard at ``/`` in headless Chromium, over real data.

The real processor (the ``pulsar-txn process`` CLI) runs a job over 24 messages, one of them
poison, in batches of at most 6 with 2 attempts: batches commit, the poison's batch aborts and
is narrowed (more aborted batches), and the poison is parked. The real API process projects the
ledger. The page must show exactly what the ledger holds (chart, jobs, batches, coordinators),
refuse a replay without a token / with a wrong token / of an aborted batch with a visible error,
and, once the bug is "fixed" (the flag file removed) and the right token entered, replay the
parked batch to ``succeeded`` and show it REPLAYED. The replayed output must be in the output
topic exactly once.

A second test opens a real transaction (producing one message in it), lets the page list it as
slow and open, and aborts it with the Abort button: refused without a token (401) and with a
wrong one (403, the transaction stays open), then aborted with the right token; the API reports
it ABORTED and an official reader never sees its message. A third lists quarantined ledger
messages (markup in them shows as text).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pulsar
import pytest
from playwright.sync_api import Page, expect, sync_playwright

import txn
from txn.admin import create_namespace
from txn.delivery.ledger import LedgerRecord, default_ledger_topic, now_ms
from txn_shell.examples.handlers import POISON_FLAG_ENV

from api_server import TOKEN, ApiServer
from peer import read_until_sentinel

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
HANDLER = "txn_shell.examples.handlers:poison_while_flagged"
FLAG_ENV = POISON_FLAG_ENV
N = 24
POISON_AT = 10
WAIT_MS = 90_000  # the page refreshes every 3 s; the machine may be busy


def payload(i: int) -> bytes:
    return f"poison-{i:02d}".encode() if i == POISON_AT else f"m{i:02d}".encode()


def read_ledger(client: pulsar.Client, topic: str) -> list[dict[str, Any]]:
    """Every committed or non-transactional record of the ledger, oldest first."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    try:
        while reader.has_message_available():
            out.append(json.loads(reader.read_next(timeout_millis=30_000).data()))
    finally:
        reader.close()
    return out


def rows(page: Page, table: str) -> list[dict[str, Any]]:
    """The data rows of a table: key, status pill and replay status."""
    return page.eval_on_selector_all(f"#{table} tbody tr[data-key]", """trs => trs.map(tr => ({
        key: tr.dataset.key,
        status: tr.querySelector('[data-testid=status]')?.dataset.status ?? null,
        replay: tr.querySelector('[data-testid=replay-status]')?.dataset.status ?? null,
        button: !!tr.querySelector('[data-testid=replay-button]'),
    }))""")


def chart_segments(page: Page) -> list[tuple[int, str, int]]:
    return sorted(page.eval_on_selector_all(
        "#txn-chart rect[data-state]",
        "rs => rs.map(r => [Number(r.dataset.t), r.dataset.state, Number(r.dataset.count)])"))


def api_segments(api: ApiServer) -> list[tuple[int, str, int]]:
    ts = api.get("/transactions/timeseries?window_s=600&bucket_s=10")
    return sorted([p["t_ms"], s, p[s]] for p in ts["points"] for s in ("COMMITTED", "ABORTED", "OPEN") if p[s])


@dataclass
class Expected:
    """What the ledger holds (read with the official client), and the test's own bits."""

    job: str
    parked: str
    batch_ids: set[str]
    committed_batches: set[str]
    aborted_batches: set[str]
    committed_txns: set[str]
    aborted_txns: set[str]
    slow_id: str
    flag: Path
    tmp_path: Path
    console: list[tuple[str, str]] = field(default_factory=list)


def wait_until(what: str, fn: Any, timeout_s: float = WAIT_MS / 1000) -> Any:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not so after {timeout_s}s (last: {last!r})")


@pytest.mark.timeout(900)
def test_dashboard_shows_the_ledger_and_replays_a_parked_batch(broker: Any, tmp_path: Path) -> None:
    ns = f"public/dash-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    inp, out, scratch = (f"persistent://{ns}/{x}" for x in ("in", "out", "scratch"))
    ledger = default_ledger_topic(out)
    job = "dash<em>&amp;job"  # markup in the data must show as text
    flag = tmp_path / "poison.flag"
    flag.write_text("the handler has a bug\n")
    env_extra = {FLAG_ENV: str(flag),
                 "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)}

    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    ours = txn.Client(broker.service_url)
    api: ApiServer | None = None
    try:
        producer = official.create_producer(inp)
        for i in range(N):
            producer.send(payload(i))
        producer.close()
        r = subprocess.run(
            [sys.executable, "-m", "txn_shell.cli", "process", "--service-url", broker.service_url, "--input", inp,
             "--output", out, "--subscription", "dash", "--handler", HANDLER, "--job", job,
             "--batch-max-messages", "6", "--batch-max-delay-ms", "200", "--max-attempts", "2",
             "--exit-when-idle-ms", "3000"],
            cwd=ROOT, env={**os.environ, **env_extra}, capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        assert "1 parked" in r.stderr, r.stderr

        # What the ledger holds, read with the official client: the truth the page must show.
        records = read_ledger(official, ledger)
        kinds = Counter(rec["kind"] for rec in records)
        assert kinds["PARKED"] == 1 and kinds["ABORTED"] >= 2 and kinds["COMMITTED"] >= 3, kinds
        parked = next(rec["batch_id"] for rec in records if rec["kind"] == "PARKED")
        batch_ids = {rec["batch_id"] for rec in records}
        committed_batches = {rec["batch_id"] for rec in records if rec["kind"] == "COMMITTED"}
        aborted_batches = batch_ids - committed_batches - {parked}
        assert aborted_batches, "the poison's batch should have aborted before it was narrowed"
        committed_txns = {rec["txn_id"] for rec in records if rec["kind"] in ("COMMITTED", "PARKED")}
        aborted_txns = {rec["txn_id"] for rec in records if rec["kind"] == "ABORTED"}

        api = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                        jobs={job: {"handler": HANDLER, "output": out, "parked_topics": [f"{inp}-parked"]}},
                        extra_env=env_extra).start(timeout=120)
        def projected() -> bool:
            status, health = api.request("GET", "/health")
            return status == 200 and any(p["topic"] == ledger and p["records"] == len(records)
                                         for p in health["projection"])
        wait_until("projection caught up", projected)

        # A live transaction left open: the coordinators list it as slow.
        slow = ours.new_transaction(timeout_millis=600_000)
        ours.create_producer(scratch).send(b"never committed", txn=slow)
        slow_id = str(slow.id)

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                console: list[tuple[str, str]] = []
                page.on("console", lambda m: console.append((m.type, m.text)) if m.type == "error" else None)
                page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
                check_page(page, api, Expected(
                    job=job, parked=parked, batch_ids=batch_ids, committed_batches=committed_batches,
                    aborted_batches=aborted_batches, committed_txns=committed_txns, aborted_txns=aborted_txns,
                    slow_id=slow_id, flag=flag, tmp_path=tmp_path, console=console))
            finally:
                browser.close()
        slow.abort()

        # The replay's output is in the output topic exactly once, next to every other output.
        consumer = official.subscribe(out, f"check-{uuid.uuid4().hex[:6]}",
                                      initial_position=pulsar.InitialPosition.Earliest)
        got = Counter(m.data() for m in read_until_sentinel(official, consumer, out, timeout_s=120))
        assert got == Counter(payload(i).upper() for i in range(N)), got
    finally:
        if api is not None:
            api.stop()
        ours.close()
        official.close()


def check_page(page: Page, api: ApiServer, x: Expected) -> None:
    page.goto(f"{api.url}/?slow_after_ms=1000")
    expect(page).to_have_title("pulsar-txn control plane")
    expect(page.locator("#health")).to_have_attribute("data-status", "ok", timeout=WAIT_MS)
    expect(page.locator("body")).to_have_attribute("data-refreshes", re.compile(r"[1-9]"), timeout=WAIT_MS)

    # The chart: one segment per non-empty (bucket, state) of /transactions/timeseries, and the
    # totals are the ledger's transactions.
    def chart_matches() -> bool:
        return chart_segments(page) == api_segments(api)
    wait_until("chart equals /transactions/timeseries", chart_matches)
    segs = chart_segments(page)
    assert sum(c for _, s, c in segs if s == "COMMITTED") == len(x.committed_txns)
    assert sum(c for _, s, c in segs if s == "ABORTED") == len(x.aborted_txns)
    assert sum(c for _, s, c in segs if s == "OPEN") == 0
    assert api.get("/transactions?state=COMMITTED&limit=1")["total"] == len(x.committed_txns)
    expect(page.locator("#total-COMMITTED")).to_have_text(str(len(x.committed_txns)))
    expect(page.locator("#total-ABORTED")).to_have_text(str(len(x.aborted_txns)))
    bars = page.locator("#txn-chart rect[data-state]")
    assert bars.count() == len(segs) > 0
    box = bars.first.bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0

    # Jobs and batches: exactly the ledger's.
    job_row = page.locator(f'#jobs-table tr[data-key="{x.job}"]')
    expect(job_row.locator("[data-testid=job-total]")).to_have_text(str(len(x.batch_ids)))
    expect(job_row.locator("[data-testid=job-inputs]")).to_have_text(str(N - 1))
    assert [r["key"] for r in rows(page, "jobs-table")] == [x.job]
    expect(job_row.locator("[data-testid=job-name]")).to_have_text(x.job)
    assert page.locator("main em").count() == 0  # nothing of the data was parsed as HTML
    want = {b: "COMMITTED" for b in x.committed_batches} | {b: "ABORTED" for b in x.aborted_batches}
    want[x.parked] = "PARKED"
    batches = {r["key"]: r["status"] for r in rows(page, "batches-table")}
    assert batches == want
    api_ids = [b["batch_id"] for b in api.get("/batches?limit=1000")["items"]]
    assert [r["key"] for r in rows(page, "batches-table")] == api_ids  # newest first, as the API lists them
    problems = {r["key"]: (r["status"], r["button"]) for r in rows(page, "problems-table")}
    assert problems == {x.parked: ("PARKED", True)} | {b: ("ABORTED", False) for b in x.aborted_batches}

    # Open and slow transactions, and the coordinators.
    expect(page.locator(f'#slow-table tr[data-key="{x.slow_id}"]')).to_have_count(1, timeout=WAIT_MS)
    assert api.get("/transactions?state=OPEN")["total"] == 0
    assert rows(page, "open-table") == []
    expect(page.locator("#open-table tbody tr.empty")).to_have_text("no open transactions")
    coords = [str(c["coordinator_id"]) for c in api.get("/coordinators")["coordinators"]]
    assert coords and [r["key"] for r in rows(page, "coordinators-table")] == coords
    assert x.console == [], x.console

    # Replay refused: no token (401), a wrong token (403), an aborted batch with the right token (409).
    message = page.locator("#replay-message")
    button = page.locator(f'#problems-table tr[data-key="{x.parked}"] [data-testid=replay-button]')
    button.click()
    expect(message).to_have_attribute("data-status", "401", timeout=WAIT_MS)
    expect(message).to_contain_text("HTTP 401")
    expect(message).to_have_attribute("data-kind", "error")
    page.fill("#token-input", "not-the-token")
    page.click("#token-save")
    expect(page.locator("#token-state")).to_have_attribute("data-set", "yes")
    button.click()
    expect(message).to_have_attribute("data-status", "403", timeout=WAIT_MS)
    expect(message).to_contain_text("invalid API token")
    page.fill("#token-input", TOKEN)
    page.click("#token-save")
    assert page.evaluate("sessionStorage.getItem('pulsar-txn.api-token')") == TOKEN
    aborted = sorted(x.aborted_batches)[0]
    page.evaluate("id => window.pulsarTxnDashboard.replay(id)", aborted)
    expect(message).to_have_attribute("data-status", "409", timeout=WAIT_MS)
    expect(message).to_contain_text("only PARKED batches are replayed")
    expect(page.locator(f'#problems-table tr[data-key="{aborted}"] [data-testid=replay-error]')).to_contain_text(
        "HTTP 409")
    assert api.get(f"/batches/{parked_path(x.parked)}")["replay"] is None  # nothing was accepted

    # The bug is fixed: the right token replays the parked batch.
    x.flag.unlink()
    button.click()
    row = page.locator(f'#problems-table tr[data-key="{x.parked}"]')
    expect(row.locator("[data-testid=replay-status]")).to_have_attribute("data-status", "succeeded",
                                                                          timeout=WAIT_MS)
    trail = row.locator("[data-testid=replay-trail]").inner_text().split(" → ")
    assert trail[0] == "accepted" and trail[-1] == "succeeded" and set(trail) <= {"accepted", "running", "succeeded"}
    expect(message).to_have_attribute("data-kind", "success")
    expect(row.locator("[data-testid=status]")).to_have_attribute("data-status", "REPLAYED", timeout=WAIT_MS)
    expect(page.locator(f'#batches-table tr[data-key="{x.parked}"] [data-testid=status]')).to_have_attribute(
        "data-status", "REPLAYED", timeout=WAIT_MS)
    assert row.locator("[data-testid=replay-button]").count() == 0
    batch = api.get(f"/batches/{parked_path(x.parked)}")
    assert (batch["status"], batch["replay"]["status"], batch["replay"]["messages"]) == ("REPLAYED", "succeeded", 1)
    expect(job_row.locator("[data-testid=job-inputs]")).to_have_text(str(N), timeout=WAIT_MS)
    expect(page.locator("#total-COMMITTED")).to_have_text(str(len(x.committed_txns) + 1), timeout=WAIT_MS)
    wait_until("chart equals /transactions/timeseries after the replay", chart_matches)

    # The only console errors are the browser's notes on the three refused requests.
    refused = [re.search(r"status of (\d+)", text) for _, text in x.console]
    assert [m.group(1) if m else text for m, (_, text) in zip(refused, x.console, strict=True)] == \
        ["401", "403", "409"], x.console
    page.screenshot(path=str(x.tmp_path / "dashboard.png"), full_page=True)
    if os.environ.get("DASHBOARD_SCREENSHOT"):
        shutil.copy(x.tmp_path / "dashboard.png", os.environ["DASHBOARD_SCREENSHOT"])


def parked_path(batch_id: str) -> str:
    return quote(batch_id, safe="")


def read_all(client: pulsar.Client, topic: str) -> list[bytes]:
    """Every message an official Reader delivers from ``topic``, up to a sentinel written now.

    A read-committed Reader cannot pass an open transaction's messages, so this also waits for
    every transaction on the topic to end."""
    tag = uuid.uuid4().hex
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"sentinel", properties={"sentinel": tag})
    producer.close()
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: list[bytes] = []
    try:
        while True:
            m = reader.read_next(timeout_millis=60_000)
            if m.properties().get("sentinel") == tag:
                return out
            out.append(m.data())
    finally:
        reader.close()


@pytest.mark.timeout(600)
def test_dashboard_aborts_an_open_transaction(broker: Any, tmp_path: Path) -> None:
    ns = f"public/dash-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    topic = f"persistent://{ns}/live"
    ledger = default_ledger_topic(f"persistent://{ns}/out")
    official = pulsar.Client(broker.service_url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    ours = txn.Client(broker.service_url)
    api: ApiServer | None = None
    try:
        t = ours.new_transaction(timeout_millis=600_000)
        ours.create_producer(topic).send(b"never visible", txn=t)
        tid = str(t.id)
        # Its STARTED record, as the processor writes one, so the ledger (and the open table) show it.
        rec = LedgerRecord(kind="STARTED", job="dash/abort", batch_id="dash/abort:x:1", txn_id=tid, attempt=1,
                           inputs={}, started_at_ms=now_ms())
        ours.create_producer(ledger).send(rec.to_json(), partition_key=rec.batch_id)
        api = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                        extra_env={"PULSAR_TXN_RESOLVE_AFTER_MS": "1000"}).start(timeout=120)
        path = f"/transactions/{quote(tid, safe='')}"
        before = wait_until("the transaction is projected", lambda: api.request("GET", path)[1]
                            if api.request("GET", "/transactions?state=OPEN")[1]["total"] == 1 else None)
        assert (before["state"], before["ledger"]["state"], before["live"]["status"]) == ("OPEN", "OPEN", "OPEN")

        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                console: list[tuple[str, str]] = []
                page.on("console", lambda m: console.append((m.type, m.text)) if m.type == "error" else None)
                page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
                abort_on_page(page, api, tid, path, console)
            finally:
                browser.close()
        # The aborted message never shows to an official Reader (which would wait at an open transaction).
        assert read_all(official, topic) == []
    finally:
        if api is not None:
            api.stop()
        ours.close()
        official.close()


def abort_on_page(page: Page, api: ApiServer, tid: str, path: str, console: list[tuple[str, str]]) -> None:
    dialogs: list[str] = []

    def answer(accept: bool) -> None:
        def handle(dialog: Any) -> None:
            dialogs.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()
        page.once("dialog", handle)

    page.goto(f"{api.url}/?slow_after_ms=1000")
    expect(page.locator("#health")).to_have_attribute("data-status", "ok", timeout=WAIT_MS)
    slow_row = page.locator(f'#slow-table tr[data-key="{tid}"]')
    open_row = page.locator(f'#open-table tr[data-key="{tid}"]')
    expect(slow_row).to_have_count(1, timeout=WAIT_MS)
    expect(open_row).to_have_count(1, timeout=WAIT_MS)
    expect(open_row.locator("[data-testid=abort-button]")).to_have_text("Abort")
    button = slow_row.locator("[data-testid=abort-button]")
    expect(button).to_have_text("Abort")
    message = page.locator("#txn-message")

    # Dismissing the confirmation sends nothing.
    answer(False)
    button.click()
    wait_until("the confirmation was asked", lambda: dialogs)
    assert tid in dialogs[0] and "cannot be undone" in dialogs[0], dialogs
    expect(message).to_be_hidden()

    # No token: 401; a wrong token: 403. The transaction stays open either way.
    answer(True)
    button.click()
    expect(message).to_have_attribute("data-status", "401", timeout=WAIT_MS)
    expect(message).to_have_attribute("data-kind", "error")
    expect(message).to_contain_text("HTTP 401")
    page.fill("#token-input", "not-the-token")
    page.click("#token-save")
    expect(page.locator("#token-state")).to_have_attribute("data-set", "yes")
    answer(True)
    button.click()
    expect(message).to_have_attribute("data-status", "403", timeout=WAIT_MS)
    expect(message).to_contain_text("invalid API token")
    expect(slow_row.locator("[data-testid=abort-error]")).to_have_text("HTTP 403: the API token was refused")
    still = api.get(path)
    assert (still["state"], still["live"]["status"]) == ("OPEN", "OPEN"), still
    assert len(dialogs) == 3

    # The right token aborts it; the tables refresh without it.
    page.fill("#token-input", TOKEN)
    page.click("#token-save")
    answer(True)
    button.click()
    expect(message).to_have_attribute("data-status", "200", timeout=WAIT_MS)
    expect(message).to_have_attribute("data-kind", "success")
    expect(message).to_contain_text(f"Transaction {tid} is ABORTED")
    expect(slow_row).to_have_count(0, timeout=WAIT_MS)
    done = wait_until("the API shows the transaction ABORTED", lambda: (r := api.get(path))["state"] == "ABORTED" and r)
    assert (done["ledger"]["state"], done["live"]) == ("ABORTED", None), done
    assert "no longer knows" in done["ledger"]["error"]
    expect(open_row).to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("#open-table tbody tr.empty")).to_have_text("no open transactions")

    # Once it has ended, another abort is refused (409), and says so.
    answer(True)
    page.evaluate("id => window.pulsarTxnDashboard.abort(id)", tid)
    expect(message).to_have_attribute("data-status", "409", timeout=WAIT_MS)
    expect(message).to_contain_text("the transaction has already ended")
    assert len(dialogs) == 5

    # The only console errors are the browser's notes on the three refused requests.
    refused = [re.search(r"status of (\d+)", text) for _, text in console]
    assert [m.group(1) if m else text for m, (_, text) in zip(refused, console, strict=True)] == \
        ["401", "403", "409"], console


@pytest.mark.timeout(600)
def test_dashboard_lists_quarantined_ledger_messages(broker: Any, tmp_path: Path) -> None:
    """Two invalid ledger messages (one holding markup) between valid records: the page lists them
    with their reasons, the markup as text; the valid records are projected."""
    ns = f"public/dash-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/out")
    ok = LedgerRecord(kind="STARTED", job="dash/q", batch_id="dash/q:1", txn_id="(0,1)", attempt=1, inputs={},
                      started_at_ms=now_ms())
    bad_job = json.dumps({**json.loads(ok.to_json()), "job": ["<b>list</b>"]}).encode()
    markup = b"<img src=x onerror=alert(1)> not a record"
    ours = txn.Client(broker.service_url)
    try:
        p = ours.create_producer(ledger)
        for data in (ok.to_json(), bad_job, markup, ok.to_json()):
            p.send(data, partition_key="q")
    finally:
        ours.close()
    api = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger]).start()
    try:
        wait_until("projected", lambda: any(p["topic"] == ledger and (p["records"], p["quarantined"]) == (2, 2)
                                            for p in api.get("/health")["projection"]))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                dialogs: list[str] = []
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                page.goto(api.url + "/")
                section = page.locator("#quarantine-section")
                expect(section).to_have_attribute("data-total", "2", timeout=WAIT_MS)
                expect(page.locator("#quarantine-total")).to_have_text("2 quarantined")
                rows = page.locator("#quarantine-table [data-testid=quarantine-row]")
                expect(rows).to_have_count(2)
                expect(rows.nth(0)).to_contain_text("ledger record is not JSON")
                expect(rows.nth(0)).to_contain_text(markup.decode())  # shown as text, never as markup
                expect(rows.nth(1)).to_contain_text("field 'job' must be a string of 1..256 characters, got list")
                assert page.locator("#quarantine-table img").count() == 0 and dialogs == []
            finally:
                browser.close()
    finally:
        api.stop()
