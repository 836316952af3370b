"""The state one API process shares between requests: settings, database, broker views."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from functools import cached_property

from sqlalchemy import Engine

from txn.client import AsyncClient

from .engine import make_engine
from .handlers import HandlerRunner
from .live import Live
from .metrics import MetricsService
from .projection import Projector
from .replays import ReplayService
from .settings import Settings

log = logging.getLogger("coordinator_api")


@dataclass
class Core:
    """Everything a request handler needs."""

    settings: Settings
    engine: Engine
    live: Live
    client: AsyncClient
    replays: ReplayService
    projector: Projector | None = None
    metrics: MetricsService | None = None
    projection_client: AsyncClient | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def open(cls, settings: Settings) -> Core:
        """Connect the database (creating the schema) and set up the broker clients."""
        engine = make_engine(settings.database_url)
        broker = settings.broker()
        live = Live(settings.admin_url, timeout=settings.admin_timeout_s, **broker.admin_kwargs())
        client = AsyncClient(settings.service_url, **broker.client_kwargs())
        runner = HandlerRunner(timeout_s=settings.replay_handler_timeout_s, max_outputs=settings.replay_max_outputs,
                               max_bytes=settings.replay_max_bytes, threads=settings.replay_handler_threads,
                               transform_timeout_s=settings.replay_transform_timeout_s)
        core = cls(settings, engine, live, client, ReplayService(engine, client, settings.job_registry, runner))
        core.metrics = MetricsService(core.reader, None, live, scrape_budget_s=settings.metrics_scrape_budget_s,
                                      backlog_interval_s=settings.metrics_backlog_interval_s,
                                      backlog_calls=settings.metrics_backlog_calls,
                                      backlog_budget_s=settings.metrics_backlog_budget_s)
        if settings.project:
            # A client of its own: it refuses (before decompressing) any entry larger than a record may be.
            core.projection_client = AsyncClient(settings.service_url, **broker.client_kwargs(),
                                                 max_uncompressed_message_size=settings.projection_max_record_bytes)
            core.projector = Projector(engine, core.projection_client, live, topics=settings.ledger_topic_list,
                                       namespaces=settings.discover_namespace_list,
                                       chunk=settings.projection_batch, chunk_bytes=settings.projection_chunk_bytes,
                                       max_record_bytes=settings.projection_max_record_bytes,
                                       discover_interval_s=settings.discover_interval_s,
                                       resolve_after_ms=settings.resolve_after_ms)
            core.metrics.projector = core.projector
        return core

    @cached_property
    def reader(self) -> Engine:
        """The engine for the read queries: on PostgreSQL the same pool in autocommit mode.

        No BEGIN and ROLLBACK around a request's statements (two round trips). It reads the same:
        under READ COMMITTED (PostgreSQL's default) each statement sees the data committed when it
        starts either way. SQLite (pysqlite) runs a SELECT outside a transaction already, and
        switching its mode per checkout costs a PRAGMA: there it is the engine itself."""
        if self.engine.dialect.name == "sqlite":
            return self.engine
        return self.engine.execution_options(isolation_level="AUTOCOMMIT")

    def start(self) -> None:
        """Start the projection and resume replays a previous process left unfinished."""
        if self.projector is not None:
            self.projector.start()
        if self.metrics is not None:
            self._tasks.append(asyncio.create_task(self.metrics.run(), name="metrics-backlogs"))
        resumed = self.replays.resume()
        if resumed:
            log.info("resumed %d unfinished replay(s)", resumed)

    async def close(self) -> None:
        """Stop background work and release connections."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.projector is not None:
            await self.projector.stop()
        await self.replays.stop()
        await self.client.close()
        if self.projection_client is not None:
            await self.projection_client.close()
        self.engine.dispose()
