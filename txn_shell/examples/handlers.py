"""Example handlers for ``pulsar-txn process`` (and the tests' chaos harness)."""

from __future__ import annotations

import os

from txn.message import Message


def upper(message: Message) -> bytes:
    """Upper-case the payload."""
    return message.data().upper()


def poison_aware(message: Message) -> bytes:
    """Upper-case, but raise on payloads containing ``poison`` (to demonstrate parking)."""
    if b"poison" in message.data():
        raise ValueError(f"cannot process {message.data()[:40]!r}")
    return message.data().upper()


#: Environment variable naming a flag file: while it exists, :func:`poison_while_flagged` fails.
POISON_FLAG_ENV = "PULSAR_TXN_POISON_FLAG"


def poison_while_flagged(message: Message) -> bytes:
    """Upper-case; fail on ``poison`` payloads while the file named by ``$PULSAR_TXN_POISON_FLAG``
    exists (a bug that gets fixed: park the poison, remove the flag, replay it)."""
    flag = os.environ.get(POISON_FLAG_ENV)
    if b"poison" in message.data() and flag and os.path.exists(flag):
        raise ValueError(f"cannot process {message.data()[:40]!r} (flag {flag} is set)")
    return message.data().upper()


def mod3(message: Message) -> list[bytes]:
    """``id % 3`` outputs (0, 1 or 2) for a payload holding a decimal id, each ``<id>:<index>``:
    a handler that filters and fans out, every output unique (the chaos harness checks them)."""
    i = int(message.data())
    return [b"%d:%d" % (i, k) for k in range(i % 3)]
