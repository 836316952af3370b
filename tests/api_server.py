"""The control plane as a real uvicorn process on loopback, for tests.

``ApiServer(broker, db_url, ...)`` starts ``uvicorn coordinator_api.app:app`` in a child process
with ``PULSAR_TXN_*`` settings, waits for ``/livez``, and can be stopped or SIGKILLed and started
again on the same port and database. ``jobs`` is the job registry (``PULSAR_TXN_JOBS``); the
``tests`` directory is on the child's ``PYTHONPATH``, so test modules can be named as handlers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from txn_shell.localbroker import free_port

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token-0123456789"


class ApiServer:
    """A uvicorn child process serving ``coordinator_api.app:app``."""

    def __init__(self, broker: Any, db_url: str, log: Path, *, ledger_topics: list[str] | None = None,
                 token: str = TOKEN, extra_env: dict[str, str] | None = None, port: int | None = None,
                 jobs: dict[str, Any] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log = log
        self.env = dict(os.environ)
        self.env.update({
            "PULSAR_TXN_SERVICE_URL": broker.service_url, "PULSAR_TXN_ADMIN_URL": broker.admin_url,
            "PULSAR_TXN_DATABASE_URL": db_url, "PULSAR_TXN_API_TOKEN": token,
            "PULSAR_TXN_DISCOVER_INTERVAL_S": "1", "PULSAR_TXN_LEDGER_TOPICS": ",".join(ledger_topics or []),
            "PULSAR_TXN_JOBS": json.dumps(jobs or {}),
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "tests"), os.environ.get("PYTHONPATH")) if p),
        })
        self.env.update(extra_env or {})
        self.reads_need_token = self.env.get("PULSAR_TXN_READ_REQUIRES_TOKEN", "").lower() in ("1", "true", "yes")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> ApiServer:
        """Start and wait until ``/livez`` answers."""
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "coordinator_api.app:app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"API exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                status, _ = self.request("GET", "/livez", timeout=2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"API not up after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM (graceful shutdown), SIGKILL if it does not exit in 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def request(self, method: str, path: str, body: Any = None, *, token: str | None = None,
                timeout: float = 30) -> tuple[int, Any]:
        """``(status, JSON or text)``; ``token`` is sent as a bearer token."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, raw, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        text = raw.decode()
        return status, json.loads(text) if "json" in ctype and text else text

    def get(self, path: str, **kw: Any) -> Any:
        """GET and assert 200; returns the JSON."""
        kw.setdefault("token", self.token if self.reads_need_token else None)
        status, body = self.request("GET", path, **kw)
        assert status == 200, (path, status, body)
        return body

    def wait_for(self, predicate: Any, timeout: float = 60, interval: float = 0.3) -> Any:
        """Poll ``predicate()`` until it returns a truthy value; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(interval)
        raise AssertionError(f"condition not met in {timeout}s (last: {last!r})")
