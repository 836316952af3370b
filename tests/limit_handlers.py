"""Handlers that try to stall or flood the control plane during a replay (importable by the API
process: ``tests/api_server.py`` puts this directory on its ``PYTHONPATH``)."""

from __future__ import annotations

import time
from collections.abc import Iterator

from txn.message import Message


def endless(message: Message) -> Iterator[bytes]:
    """A generator that never ends, yielding small outputs as fast as it can."""
    while True:
        yield b"x"


def slow_generator(message: Message) -> Iterator[bytes]:
    """A generator that computes for a long time (busy, holding the GIL in bursts) before each output."""
    while True:
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        yield b"y"


def huge(message: Message) -> Iterator[bytes]:
    """Outputs of 8 MiB each, without end."""
    while True:
        yield b"z" * (8 * 1024 * 1024)


def sleeper(message: Message) -> bytes:
    """Blocks for an hour before answering."""
    time.sleep(3600)
    return b"late"
