"""Replays requested over REST: one row per batch, run in the background, exactly once.

``POST /batches/{id}/replay`` inserts a ``replays`` row unique by batch id, so a repeated POST
(from any replica) finds the existing row and starts nothing new; only a failed replay can be
retried. The run itself is :func:`txn.delivery.replay.replay_batch`, which commits at most once
per batch (a REPLAYED record in the ledger, written inside the replay's transaction, and
conflicting acks on the parked messages), so even a replay resumed after a crash cannot
replay a batch twice.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError

from txn.client import AsyncClient
from txn.delivery.ledger import now_ms
from txn.delivery.replay import ReplayError, replay_batch

from . import db

log = logging.getLogger("coordinator_api.replays")

#: Batch statuses that can be replayed (a REPLAYED batch gives a no-op replay).
REPLAYABLE = ("PARKED", "REPLAYED")
ACTIVE = ("accepted", "running")


class NotReplayable(Exception):
    """The batch exists but has nothing to replay (e.g. it committed, or its inputs were retried)."""


class ReplayService:
    """Accepts replay requests and runs them on the app's Pulsar client."""

    def __init__(self, engine: Engine, client: AsyncClient) -> None:
        self.engine = engine
        self.client = client
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def request(self, batch: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Accept a replay of ``batch`` (a ``batches`` row): (replay row, whether a run should start)."""
        if batch["status"] not in REPLAYABLE:
            raise NotReplayable(
                f"batch {batch['batch_id']} is {batch['status']}: only PARKED batches are replayed (an ABORTED batch's "
                "inputs go back to its subscription and are processed again automatically)")
        r = db.replays
        row = {"replay_id": uuid.uuid4().hex, "batch_id": batch["batch_id"], "ledger_topic": batch["ledger_topic"],
               "status": "accepted", "requested_at_ms": now_ms(), "runs": 0}
        try:
            with self.engine.begin() as conn:
                conn.execute(r.insert().values(**row))
            return self.get_by_batch(batch["batch_id"]) or row, True
        except IntegrityError:
            pass
        with self.engine.begin() as conn:  # only a failed replay may run again
            retried = conn.execute(update(r).where(r.c.batch_id == batch["batch_id"]).where(r.c.status == "failed")
                                   .values(status="accepted", requested_at_ms=now_ms(), message=None)).rowcount
        existing = self.get_by_batch(batch["batch_id"])
        assert existing is not None
        return existing, bool(retried)

    def get(self, replay_id: str) -> dict[str, Any] | None:
        """A replay row by id."""
        with self.engine.connect() as conn:
            row = conn.execute(select(db.replays).where(db.replays.c.replay_id == replay_id)).first()
        return None if row is None else dict(row._mapping)

    def get_by_batch(self, batch_id: str) -> dict[str, Any] | None:
        """The replay row of a batch, if any."""
        with self.engine.connect() as conn:
            row = conn.execute(select(db.replays).where(db.replays.c.batch_id == batch_id)).first()
        return None if row is None else dict(row._mapping)

    def launch(self, replay_id: str) -> None:
        """Run the replay in the background (no-op if it is already running here)."""
        task = self._tasks.get(replay_id)
        if task is None or task.done():
            self._tasks[replay_id] = asyncio.create_task(self._run(replay_id), name=f"replay {replay_id}")

    def resume(self) -> int:
        """Launch replays left accepted or running by a previous process; returns how many."""
        with self.engine.connect() as conn:
            ids = conn.execute(select(db.replays.c.replay_id).where(db.replays.c.status.in_(ACTIVE))).scalars().all()
        for rid in ids:
            self.launch(rid)
        return len(ids)

    async def wait(self) -> None:
        """Wait for every running replay (tests, shutdown)."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel running replays; their rows stay ``running`` and are resumed next start."""
        for t in self._tasks.values():
            t.cancel()
        await self.wait()

    def _set(self, replay_id: str, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(db.replays).where(db.replays.c.replay_id == replay_id).values(**values))

    async def _run(self, replay_id: str) -> None:
        row = await asyncio.to_thread(self.get, replay_id)
        if row is None or row["status"] not in ACTIVE:
            return
        await asyncio.to_thread(self._set, replay_id, status="running", started_at_ms=now_ms(),
                                runs=(row["runs"] or 0) + 1)
        try:
            res = await replay_batch(self.client, row["batch_id"], row["ledger_topic"])
        except asyncio.CancelledError:
            raise
        except (ReplayError, Exception) as exc:  # noqa: BLE001 - recorded on the replay, retryable
            log.warning("replay %s of batch %s failed: %s", replay_id, row["batch_id"], exc)
            await asyncio.to_thread(self._set, replay_id, status="failed", finished_at_ms=now_ms(),
                                    message=f"{type(exc).__name__}: {exc}")
            return
        await asyncio.to_thread(
            self._set, replay_id, status="succeeded" if res.replayed else "noop", finished_at_ms=now_ms(),
            txn_id=res.txn_id, messages=res.messages, message=res.message)
        log.info("replay %s: %s", replay_id, res.message)
