"""The dashboard test's handler, imported by the processor and by the API process (for replay).

Both run with this directory on ``PYTHONPATH``, so the job's handler spec in the ledger is
``dashboard_handlers:upper_unless_flagged``.
"""

from __future__ import annotations

import os

from txn.message import Message

#: Environment variable naming the flag file; while the file exists, poison payloads fail.
FLAG_ENV = "DASHBOARD_POISON_FLAG"


def upper_unless_flagged(message: Message) -> bytes:
    """Upper-case the payload; raise on payloads containing ``poison`` while the flag file exists."""
    flag = os.environ.get(FLAG_ENV)
    if b"poison" in message.data() and flag and os.path.exists(flag):
        raise ValueError(f"refusing {message.data()[:40]!r} while {flag} exists")
    return message.data().upper()
