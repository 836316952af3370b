"""The demo's child processes: the control plane (uvicorn) and the Spark job, each logging to a file.

Both run in sessions of their own, so a Ctrl-C in the demo's terminal reaches only the demo,
which then stops them (SIGTERM, SIGKILL of the process group if they do not exit in time).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from txn.admin import admin_request

T = TypeVar("T")


class DemoError(Exception):
    """A step of the demo failed; the message says what and where to look."""


def tail(path: Path, lines: int = 25) -> str:
    """The last ``lines`` lines of a log file."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 32 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join("    | " + line for line in text.splitlines()[-lines:])


class Child:
    """A child process in its own session, output to ``log``."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path, cwd: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.log = log
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """DemoError (with the log's tail) if the process has exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise DemoError(f"the {self.name} exited with status {self.proc.returncode}; its log {self.log} ends:\n"
                            f"{tail(self.log)}")

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, then SIGKILL of its process group after ``timeout``; returns the exit status."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)
        return p.returncode


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, *, interval: float = 0.5,
             check: Callable[[], None] | None = None) -> T:
    """Poll ``probe()`` until it returns something other than None; DemoError after ``timeout`` seconds.

    ``check()`` runs before each probe (e.g. to fail fast when a child process died)."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        if check is not None:
            check()
        try:
            got = probe()
            if got is not None:
                return got
        except DemoError:
            raise
        except (OSError, ValueError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_error})" if last_error else ""
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


class ControlPlane(Child):
    """``uvicorn coordinator_api.app:app`` on 127.0.0.1 with ``PULSAR_TXN_*`` settings, and a REST client."""

    def __init__(self, port: int, token: str, settings: dict[str, str], env: dict[str, str], log: Path,
                 cwd: Path, python: str) -> None:
        env = dict(env)
        env.update({f"PULSAR_TXN_{k.upper()}": v for k, v in settings.items()})
        env["PULSAR_TXN_API_TOKEN"] = token
        super().__init__("control plane", [python, "-m", "uvicorn", "coordinator_api.app:app", "--host", "127.0.0.1",
                                           "--port", str(port), "--log-level", "warning"], env, log, cwd)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.token = token

    def wait_ready(self, timeout: float) -> None:
        """Wait until ``/health`` answers (200, or 503 while e.g. the broker is still coming up)."""
        wait_for(f"the control plane at {self.url}", lambda: True if self.request("GET", "/health", timeout=3)[0]
                 in (200, 503) else None, timeout, interval=0.3, check=self.check_alive)

    def request(self, method: str, path: str, *, auth: bool = False, timeout: float = 30) -> tuple[int, Any]:
        """``(status, parsed JSON or text)``; with ``auth`` the API token is sent as a bearer token."""
        return admin_request(method, self.url, path, timeout=timeout, token=self.token if auth else None)

    def get(self, path: str) -> Any:
        """GET; the JSON body of a 200, else DemoError."""
        status, body = self.request("GET", path)
        if status != 200:
            raise DemoError(f"GET {path} answered {status}: {body}")
        return body


def previous_api(pid_file: Path) -> int | None:
    """The pid in ``pid_file`` if that process is still a control plane (a previous ``--keep-running``)."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"coordinator_api.app" in cmdline else None


def stop_pid(pid: int, timeout: float = 30) -> None:
    """SIGTERM ``pid`` and wait (bounded) for it to go; SIGKILL if it does not."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
