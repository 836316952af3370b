"""Record fields never reach the terminal raw (issue "No record and no handler can exhaust, mislead
or stall the control plane or the processor", item 7).

Anyone who can write a ledger topic chooses the job name, batch id, error and topics the CLI
prints. Records carrying ESC sequences (colour, cursor movement, an OSC that sets the window
title), other C0/C1 controls, bidirectional overrides and line breaks are projected by a real
control plane on the real broker; every table and detail view of ``pulsar-txn`` prints them
escaped, so its output holds no control character but the newlines between its own lines.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from test_api_hostile import fresh_namespace, send, wait_projected

from txn.delivery.ledger import LedgerRecord, default_ledger_topic

from api_server import ROOT, ApiServer

TITLE = "\x1b]0;pwned\x07"
NASTY = f"{TITLE}\x1b[31mred\x1b[0m\x1b[2J\r\x08\x9b31m\u202egnp.exe\x7f\nnext"


def _cli(api: ApiServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSAR_TXN_")}
    return subprocess.run([sys.executable, "-m", "txn_shell.cli", *args, "--api-url", api.url], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def _controls(text: str) -> list[str]:
    """The control characters of ``text`` other than newline (C0, DEL, C1, bidi overrides)."""
    return sorted({c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0
                                                     or 0x202a <= ord(c) <= 0x202e or 0x2066 <= ord(c) <= 0x2069)})


def test_escape() -> None:
    from txn_shell.cli_api import escape

    assert escape("plain text: é, 中文") == "plain text: é, 中文"
    assert escape(TITLE) == "\\x1b]0;pwned\\x07"
    assert escape("a\nb\tc\u202ed\x9b") == "a\\nb\\tc\\u202ed\\x9b"
    assert escape(None) == "None"


def test_the_cli_escapes_control_characters_in_every_field(broker: Any, tmp_path: Path) -> None:
    ledger = default_ledger_topic(f"persistent://{fresh_namespace(broker)}/x")
    tag = uuid.uuid4().hex[:8]
    # Job and batch id without the line break: a path parameter cannot hold one (Starlette's ``path``
    # converter), so ``jobs JOB`` and ``batches show`` could not name them.
    one_line = NASTY.replace("\n", "")
    job, bid = f"job{one_line}{tag}", f"batch{one_line}{tag}:1"
    parked = f"persistent://public/default/p-{tag}"
    recs = [LedgerRecord(kind="STARTED", job=job, batch_id=bid, txn_id="(0,77)", attempt=1,
                         inputs={f"in{NASTY}": ["(1,1,-1,-1)"]}, started_at_ms=1000),
            LedgerRecord(kind="PARKED", job=job, batch_id=bid, txn_id="(0,77)", attempt=2,
                         inputs={f"in{NASTY}": ["(1,1,-1,-1)"]}, outputs={parked: 1}, started_at_ms=1000,
                         ended_at_ms=1050, error=f"boom{NASTY}", parked_topic=parked)]
    send(broker, ledger, [(tag, r.to_json()) for r in recs])
    api = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger]).start()
    try:
        wait_projected(api, ledger, len(recs))
        runs = {
            "batches list": _cli(api, "batches", "list", "--job", job),
            "batches show": _cli(api, "batches", "show", bid),
            "txns list": _cli(api, "txns", "list", "--job", job),
            "txns show": _cli(api, "txns", "show", "(0,77)", "--ledger-topic", ledger),
            "jobs": _cli(api, "jobs"),
            "jobs JOB": _cli(api, "jobs", job),
        }
        for name, r in runs.items():
            assert r.returncode == 0, (name, r.stdout, r.stderr)
            assert _controls(r.stdout + r.stderr) == [], (name, r.stdout)
            assert "\\x1b]0;pwned\\x07" in r.stdout, (name, r.stdout)  # shown, escaped
        assert "boom\\x1b]0;pwned" in runs["batches show"].stdout
        # An error the API answers carries the id back: escaped too.
        r = _cli(api, "batches", "show", f"missing{one_line}", "--ledger-topic", quote(ledger, safe=""))
        assert r.returncode == 1 and _controls(r.stdout + r.stderr) == [], r.stderr
    finally:
        api.stop()
