"""A handler whose failure can be switched off: for replay tests (importable by the API process too)."""

from __future__ import annotations

import os

from txn.message import Message

#: Environment variable naming the flag file.
FLAG_ENV = "CLI_API_TEST_FAIL_FLAG"


def fail_while_flagged(message: Message) -> bytes:
    """Upper-case; raise on payloads containing ``poison`` while the file ``$CLI_API_TEST_FAIL_FLAG`` exists."""
    flag = os.environ.get(FLAG_ENV)
    if b"poison" in message.data() and flag and os.path.exists(flag):
        raise ValueError(f"flagged: {message.data()[:40]!r}")
    return message.data().upper()
