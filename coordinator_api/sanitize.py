"""Error texts safe to show in /health and to log: never record contents, never SQL parameters.

Database errors are reduced to their class (and SQLSTATE, or SQLite's own message, which holds no
values); ledger schema errors say which rule a field broke; broker errors keep their message, cut
short. Anything else is its class name only.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, StatementError

from txn.delivery.ledger import LedgerSchemaError
from txn.errors import PulsarError

from .live import LiveError

MAX = 300


def describe(exc: BaseException) -> str:
    """A short, content-free description of ``exc``."""
    if isinstance(exc, DBAPIError):
        orig = exc.orig
        code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if type(orig).__module__.startswith("sqlite3"):
            return f"database error {type(orig).__name__}: {str(orig).splitlines()[0][:MAX] if str(orig) else ''}"
        return f"database error {type(orig).__name__}" + (f" (SQLSTATE {code})" if code else "")
    if isinstance(exc, StatementError):
        return f"database error {type(exc.orig).__name__ if exc.orig is not None else type(exc).__name__}"
    if isinstance(exc, (LedgerSchemaError, PulsarError, LiveError, OSError, TimeoutError)):
        return f"{type(exc).__name__}: {str(exc)[:MAX]}"
    return type(exc).__name__
