"""A durable outbox: the unconfirmed messages of one named producer, in a SQLite file.

One row per accepted message, keyed by its producer sequence id. A row is written
(and fsynced: WAL journal, ``synchronous=FULL``) before the message is sent, and
deleted once the broker confirms it; a row the broker rejected is kept, marked
with the broker's error. Alongside the rows the file keeps the highest sequence
id ever assigned (so ids never go backwards, even once every row is deleted) and
an optional application *checkpoint* string, committed in the same transaction as
the rows it came with (e.g. "source records up to here are in the outbox").

The file is opened with an exclusive lock: one producer process per outbox.
It is bound to one topic and producer name on first use; opening it for another
raises ``ValueError`` (re-sending its rows under another name would duplicate them).
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS outbox (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL, properties TEXT,"
    " partition_key TEXT, event_timestamp INTEGER, nacked TEXT)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One stored message."""

    seq: int
    payload: bytes
    properties: dict[str, str] | None = None
    partition_key: str | None = None
    event_timestamp: int | None = None


class Outbox:
    """The SQLite outbox file (blocking; the reliable producer calls it from one worker thread)."""

    def __init__(self, path: str | os.PathLike[str], topic: str, producer_name: str) -> None:
        self.path = os.fspath(path)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=5.0)
        try:
            self._db.execute("PRAGMA locking_mode=EXCLUSIVE")
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch {self.path} to WAL (journal_mode={mode})")
            self._db.execute("PRAGMA synchronous=FULL")  # fsync the WAL on every commit
            self._db.execute("PRAGMA fullfsync=ON")  # macOS: really flush; no-op elsewhere
            self._db.execute("BEGIN EXCLUSIVE")  # take the file lock now, not at the first write
        except sqlite3.OperationalError as exc:
            self._db.close()
            if "locked" in str(exc):
                raise RuntimeError(f"outbox {self.path} is in use by another producer") from exc
            raise
        try:
            for stmt in _SCHEMA:
                self._db.execute(stmt)
            self._bind("topic", topic)
            self._bind("producer_name", producer_name)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.close()
            raise

    def _bind(self, key: str, value: str) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (key, value))
        elif row[0] != value:
            raise ValueError(f"outbox {self.path} belongs to {key} {row[0]!r}, not {value!r}")

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else row[0]

    def last_seq(self) -> int:
        """Highest sequence id ever stored (-1 for a new outbox)."""
        v = self._meta("last_seq")
        return -1 if v is None else int(v)

    def checkpoint(self) -> str | None:
        """The application checkpoint stored with the latest accepted message."""
        return self._meta("checkpoint")

    def pending(self) -> list[OutboxRow]:
        """Unconfirmed, not rejected rows, in sequence order."""
        cur = self._db.execute(
            "SELECT seq, payload, properties, partition_key, event_timestamp FROM outbox"
            " WHERE nacked IS NULL ORDER BY seq"
        )
        return [OutboxRow(s, bytes(p), json.loads(pr) if pr else None, k, ts) for s, p, pr, k, ts in cur]

    def pending_count(self) -> int:
        """Number of unconfirmed rows."""
        return self._db.execute("SELECT count(*) FROM outbox WHERE nacked IS NULL").fetchone()[0]

    def nacked(self) -> list[tuple[int, str]]:
        """``(sequence id, broker error)`` of the rows the broker rejected."""
        return list(self._db.execute("SELECT seq, nacked FROM outbox WHERE nacked IS NOT NULL ORDER BY seq"))

    def write(
        self,
        inserts: Sequence[OutboxRow] = (),
        confirmed: Sequence[int] = (),
        nacked: Sequence[tuple[int, str]] = (),
        checkpoint: str | None = None,
    ) -> None:
        """Apply one group of changes in a single durable transaction (all or nothing)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if inserts:
                db.executemany(
                    "INSERT INTO outbox(seq, payload, properties, partition_key, event_timestamp)"
                    " VALUES (?, ?, ?, ?, ?)",
                    [(r.seq, r.payload, json.dumps(r.properties) if r.properties else None, r.partition_key,
                      r.event_timestamp) for r in inserts],
                )
                top = max(r.seq for r in inserts)
                db.execute(
                    "INSERT INTO meta(key, value) VALUES ('last_seq', ?) ON CONFLICT(key) DO UPDATE"
                    " SET value = CAST(max(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER)) AS TEXT)",
                    (str(top),),
                )
            if checkpoint is not None:
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('checkpoint', ?)", (checkpoint,))
            if confirmed:
                db.executemany("DELETE FROM outbox WHERE seq=?", [(s,) for s in confirmed])
            if nacked:
                db.executemany("UPDATE outbox SET nacked=? WHERE seq=?", [(e, s) for s, e in nacked])
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        """Close the file (releases the lock)."""
        self._db.close()
