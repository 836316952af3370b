"""schemathesis against the control plane's OpenAPI spec: every check, no 5xx, no schema violation.

The API runs as a real uvicorn process on the real broker, with a ledger that has committed,
aborted and parked batches (written as records, so the run is quick), and the token, so the
mutating endpoints are exercised past authentication too. Run twice: reads open, and reads
requiring the token (the spec then declares it on them, and schemathesis checks that they refuse
requests without it).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import txn
from txn.admin import create_namespace
from txn.delivery.ledger import LedgerRecord, default_ledger_topic

from api_server import TOKEN, ApiServer


def write_ledger(broker: Any, ledger: str) -> int:
    c = txn.Client(broker.service_url)
    p = c.create_producer(ledger)
    recs = []
    for i in range(5):
        recs += [LedgerRecord(kind="STARTED", job="schema-job", batch_id=f"b{i}", txn_id=f"(0,{100 + i})", attempt=1,
                              inputs={"in": [f"(1,{i},-1,-1)"]}, started_at_ms=1_700_000_000_000 + i),
                 LedgerRecord(kind="COMMITTED" if i != 3 else "ABORTED", job="schema-job", batch_id=f"b{i}",
                              txn_id=f"(0,{100 + i})", attempt=1, inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 1},
                              started_at_ms=1_700_000_000_000 + i, ended_at_ms=1_700_000_000_050 + i,
                              error="boom" if i == 3 else None)]
    recs.append(LedgerRecord(kind="PARKED", job="schema-job", batch_id="b3", txn_id="(1,7)", attempt=2,
                             inputs={"in": ["(1,3,-1,-1)"]}, outputs={"in-parked": 1}, started_at_ms=1_700_000_000_100,
                             ended_at_ms=1_700_000_000_120, error="boom",
                             parked_topic="persistent://public/default/in-parked"))
    for r in recs:
        p.send(r.to_json(), partition_key=r.batch_id)
    c.close()
    return len(recs)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("reads_need_token", [False, True])
def test_schemathesis_finds_nothing(broker: Any, tmp_path: Path, reads_need_token: bool) -> None:
    ns = f"public/schema-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    ledger = default_ledger_topic(f"persistent://{ns}/x")
    n = write_ledger(broker, ledger)
    server = ApiServer(broker, f"sqlite:///{tmp_path}/api.db", tmp_path / "api.log", ledger_topics=[ledger],
                       extra_env={"PULSAR_TXN_READ_REQUIRES_TOKEN": str(reads_need_token).lower()}).start()
    try:
        server.wait_for(lambda: sum(p["records"] for p in server.get("/health")["projection"]) == n)
        st = Path(sys.executable).parent / "st"
        run = subprocess.run(
            [str(st), "run", f"{server.url}/openapi.json", "--checks", "all", "--max-examples", "15", "--seed", "7",
             "--header", f"Authorization: Bearer {TOKEN}", "--request-timeout", "30", "--workers", "1"],
            capture_output=True, text=True, timeout=540)
        out = run.stdout + run.stderr
        (tmp_path / "schemathesis.txt").write_text(out)
        assert run.returncode == 0, out[-6000:]
        assert "Tested: 16" in out, out[-3000:]  # every operation was exercised
    finally:
        server.stop()
