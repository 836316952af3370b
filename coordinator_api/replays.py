"""Replays requested over REST: one row per batch, run in the background, exactly once.

``POST /batches/{id}/replay`` inserts a ``replays`` row unique by (ledger topic, batch id), so a
repeated POST (from any replica) finds the existing row and starts nothing new; only a failed
replay can be retried. The run itself is :func:`txn.delivery.replay.replay_batch`, which commits
at most once per batch (a REPLAYED record in the ledger, written inside the replay's transaction,
and conflicting acks on the parked messages), so even a replay resumed after a crash cannot
replay a batch twice.

Only jobs of the settings' job registry are replayed, with the registry's code and topics (a
ledger record only names its job). Whatever the job's code does, ``BaseException`` included,
fails the replay, not the process; it runs off the event loop, iterating a returned generator
included, with a time limit and output limits (:class:`~coordinator_api.handlers.HandlerRunner`).
A replay found ``running`` at start-up (the process died during it) is resumed once; found
``running`` again, it is marked failed with the reason.

The replay finds the batch's records by key in the projection (``ledger_records`` is indexed by
batch id), complete up to the projection's position in the ledger topic; it reads the ledger only
after that position (records not projected yet, usually none), never the whole topic.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.exc import IntegrityError

from txn.client import AsyncClient
from txn.delivery.ledger import Kind, LedgerRecord, LedgerSchemaError, now_ms
from txn.delivery.output import MAX_OUTPUT_BYTES, MAX_OUTPUTS, load_handler
from txn.delivery.replay import ReplayError, guarded, replay_batch
from txn.message import MessageId

from . import db
from .handlers import HandlerRunner
from .projection import load_position
from .sanitize import describe
from .settings import JobSpec

log = logging.getLogger("coordinator_api.replays")

#: Batch statuses that can be replayed (a REPLAYED batch gives a no-op replay).
REPLAYABLE = (Kind.PARKED.value, Kind.REPLAYED.value)
ACTIVE = ("accepted", "running")
#: Start-ups that may resume a replay they find running.
MAX_RESUMES = 1
CRASHED = ("not resumed again: the control plane stopped {n} time(s) while this replay was running (a crash or a "
           "kill, e.g. by the job's code); fix the cause, then request the replay again")


class NotReplayable(Exception):
    """The batch exists but cannot be replayed (e.g. it committed, or its job is not registered)."""


class ReplayService:
    """Accepts replay requests and runs them on the app's Pulsar client."""

    def __init__(self, engine: Engine, client: AsyncClient, jobs: dict[str, JobSpec] | None = None,
                 runner: HandlerRunner | None = None) -> None:
        self.engine = engine
        self.client = client
        self.jobs = jobs or {}
        #: Runs the jobs' code off the event loop, with a time limit and output limits.
        self.runner = runner or HandlerRunner(timeout_s=60.0, max_outputs=MAX_OUTPUTS, max_bytes=MAX_OUTPUT_BYTES)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def job_of(self, batch: dict[str, Any]) -> JobSpec:
        """The registered job of ``batch`` (a ``batches`` row); NotReplayable if there is none, or if
        the batch's parking topic is not the job's."""
        spec = self.jobs.get(batch["job"])
        if spec is None:
            raise NotReplayable(
                f"job {batch['job']!r} is not registered in this control plane's job registry (PULSAR_TXN_JOBS / "
                "PULSAR_TXN_JOBS_FILE): it replays only jobs it was configured with")
        if batch.get("parked_topic") and batch["parked_topic"] not in spec.parked_topics:
            raise NotReplayable(f"batch {batch['batch_id']} is parked on {batch['parked_topic']}, which is not a "
                                f"parking topic of job {batch['job']!r} in the registry")
        return spec

    def request(self, batch: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Accept a replay of ``batch`` (a ``batches`` row): (replay row, whether a run should start)."""
        if batch["status"] not in REPLAYABLE:
            raise NotReplayable(
                f"batch {batch['batch_id']} is {batch['status']}: only PARKED batches are replayed (an ABORTED batch's "
                "inputs go back to its subscription and are processed again automatically)")
        self.job_of(batch)
        r = db.replays
        key = (batch["ledger_topic"], batch["batch_id"])
        row = {"replay_id": uuid.uuid4().hex, "batch_id": batch["batch_id"], "ledger_topic": batch["ledger_topic"],
               "status": "accepted", "requested_at_ms": now_ms(), "runs": 0, "resumes": 0}
        try:
            with self.engine.begin() as conn:
                conn.execute(r.insert().values(**row))
            return self.get_by_batch(*key) or row, True
        except IntegrityError:
            pass
        with self.engine.begin() as conn:  # only a failed replay may run again
            retried = conn.execute(update(r).where(r.c.ledger_topic == key[0]).where(r.c.batch_id == key[1])
                                   .where(r.c.status == "failed")
                                   .values(status="accepted", requested_at_ms=now_ms(), message=None,
                                           resumes=0)).rowcount
        existing = self.get_by_batch(*key)
        assert existing is not None
        return existing, bool(retried)

    def get(self, replay_id: str) -> dict[str, Any] | None:
        """A replay row by id."""
        with self.engine.connect() as conn:
            row = conn.execute(select(db.replays).where(db.replays.c.replay_id == replay_id)).first()
        return None if row is None else _public(dict(row._mapping))

    def get_by_batch(self, ledger_topic: str, batch_id: str) -> dict[str, Any] | None:
        """The replay row of a batch, if any."""
        r = db.replays
        with self.engine.connect() as conn:
            row = conn.execute(select(r).where(r.c.ledger_topic == ledger_topic)
                               .where(r.c.batch_id == batch_id)).first()
        return None if row is None else _public(dict(row._mapping))

    def launch(self, replay_id: str) -> None:
        """Run the replay in the background (no-op if it is already running here)."""
        task = self._tasks.get(replay_id)
        if task is None or task.done():
            self._tasks[replay_id] = asyncio.create_task(self._run(replay_id), name=f"replay {replay_id}")

    def resume(self) -> int:
        """Launch replays left accepted or running by a previous process; returns how many.

        One left ``running`` was interrupted by the end of that process: it is resumed at most
        ``MAX_RESUMES`` times, then marked failed (a job's code that kills the process must not
        kill every start-up after it)."""
        r = db.replays
        with self.engine.begin() as conn:
            rows = conn.execute(select(r.c.replay_id, r.c.status, r.c.resumes).where(r.c.status.in_(ACTIVE))).all()
            launch = []
            for rid, status, resumes in rows:
                if status == "running" and (resumes or 0) >= MAX_RESUMES:
                    conn.execute(update(r).where(r.c.replay_id == rid).values(
                        status="failed", finished_at_ms=now_ms(), message=CRASHED.format(n=(resumes or 0) + 1)))
                    log.warning("replay %s: %s", rid, CRASHED.format(n=(resumes or 0) + 1))
                    continue
                if status == "running":
                    conn.execute(update(r).where(r.c.replay_id == rid).values(resumes=(resumes or 0) + 1))
                launch.append(rid)
        for rid in launch:
            self.launch(rid)
        return len(launch)

    async def wait(self) -> None:
        """Wait for every running replay (tests, shutdown)."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel running replays; they go back to ``accepted`` (an orderly stop is not a crash)
        and are resumed next start."""
        cancelled = [rid for rid, t in self._tasks.items() if not t.done()]
        for t in self._tasks.values():
            t.cancel()
        await self.wait()
        self.runner.close()
        if cancelled:
            r = db.replays
            with self.engine.begin() as conn:
                conn.execute(update(r).where(r.c.replay_id.in_(cancelled)).where(r.c.status == "running")
                             .values(status="accepted"))

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
            res = await self._replay(row)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - recorded on the replay (retryable); never ends the process
            msg = str(exc) if isinstance(exc, ReplayError) else f"{type(exc).__name__}: {exc}"
            log.warning("replay %s of batch %s failed: %s", replay_id, row["batch_id"], describe(exc))
            await asyncio.to_thread(self._set, replay_id, status="failed", finished_at_ms=now_ms(),
                                    message=_failure(exc, msg))
            return
        await asyncio.to_thread(
            self._set, replay_id, status="succeeded" if res.replayed else "noop", finished_at_ms=now_ms(),
            txn_id=res.txn_id, messages=res.messages, message=res.message)
        log.info("replay %s: %s", replay_id, res.message)

    def _batch(self, ledger_topic: str, batch_id: str) -> dict[str, Any] | None:
        b = db.batches
        with self.engine.connect() as conn:
            row = conn.execute(select(b).where(b.c.ledger_topic == ledger_topic)
                               .where(b.c.batch_id == batch_id)).first()
        return None if row is None else dict(row._mapping)

    def _known_records(self, ledger_topic: str, batch_id: str) -> tuple[list[LedgerRecord] | None, MessageId | None]:
        """The batch's projected records, complete up to the projection's position in ``ledger_topic``
        (records stored past it are left out: the replay reads the ledger from there on), and that
        position; ``(None, None)`` if nothing of the topic was projected yet (the replay reads it all)."""
        until = load_position(self.engine, ledger_topic)
        if until is None:
            return None, None
        t = db.ledger_records
        with self.engine.connect() as conn:
            rows = conn.execute(select(t.c.record, t.c.msg_ledger, t.c.msg_entry, t.c.msg_partition, t.c.msg_batch)
                                .where(t.c.topic == ledger_topic).where(t.c.batch_id == batch_id)
                                .order_by(t.c.id)).all()
        records = []
        for r in rows:
            if MessageId(r.msg_partition, r.msg_ledger, r.msg_entry, r.msg_batch) > until:
                continue
            try:
                records.append(LedgerRecord.from_json(r.record))
            except LedgerSchemaError:  # stored by an older, laxer version: as a scan of the topic would skip it
                continue
        return records, until

    async def _replay(self, row: dict[str, Any]) -> Any:
        """Run the replay of ``row`` with its job's registered code and topics."""
        batch = await asyncio.to_thread(self._batch, row["ledger_topic"], row["batch_id"])
        if batch is None:
            raise ReplayError(f"batch {row['batch_id']} is no longer in the projection of {row['ledger_topic']}")
        try:
            spec = self.job_of(batch)
        except NotReplayable as exc:
            raise ReplayError(str(exc)) from None
        handler = None
        if spec.handler is not None:
            handler = self.runner.wrap(
                await asyncio.to_thread(guarded, f"loading handler {spec.handler}", load_handler, spec.handler))
        replayer = None
        if spec.transform is not None:
            replayer = self.runner.wrap_replayer(
                await asyncio.to_thread(guarded, "loading the Spark runtime", _spark_replayer))
        records, until = await asyncio.to_thread(self._known_records, row["ledger_topic"], row["batch_id"])
        return await replay_batch(self.client, row["batch_id"], row["ledger_topic"], handler, spec.output,
                                  transform=spec.transform, replayer=replayer, job=batch["job"],
                                  parked_topics=spec.parked_topics,
                                  allowed_outputs=spec.allowed_outputs, records=records, records_until=until)


def _spark_replayer() -> Any:
    """The Spark runtime's replayer (imported only when a registered job has a transform)."""
    from spark_jobs.runtime import replay_outputs

    return replay_outputs


def _failure(exc: BaseException, msg: str) -> str:
    """The replay's failure message: the handler's own error, as the caller sees it."""
    cause = exc.__cause__
    if isinstance(exc, ReplayError) and cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return msg if not isinstance(exc, ReplayError) else f"ReplayError: {exc}"


def _public(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("resumes", None)
    return row
