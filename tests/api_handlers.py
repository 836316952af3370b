"""Handlers that misbehave, for the control plane's replay tests (importable by the API process:
``tests/api_server.py`` puts this directory on its ``PYTHONPATH``)."""

from __future__ import annotations

import os
import signal
import sys

from txn.message import Message


def exit_process(message: Message) -> bytes:
    """``sys.exit(3)``: a ``SystemExit``, which ``except Exception`` does not catch."""
    sys.exit(3)


def kill_process(message: Message) -> bytes:
    """SIGKILL the process that runs it (a crash no handler guard can catch)."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
