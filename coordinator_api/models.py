"""Response models of the REST API (they are the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

T = TypeVar("T")

TxnState = Literal["OPEN", "COMMITTED", "ABORTED"]
BatchStatus = Literal["STARTED", "COMMITTED", "ABORTED", "PARKED", "REPLAYED"]
ReplayStatus = Literal["accepted", "running", "succeeded", "noop", "failed"]


class Error(BaseModel):
    """An error: ``detail`` says what was wrong."""

    detail: str


class Page(BaseModel, Generic[T]):
    """One page of a list: ``items`` from ``offset``, ``total`` matching in all."""

    items: list[T]
    total: int
    limit: int
    offset: int


class LiveTxn(BaseModel):
    """What the transaction coordinator says about a transaction that has not ended."""

    txn_id: str | None
    status: str | None
    opened_at_ms: int | None
    timeout_ms: int | None
    age_ms: int | None = None
    produced_partitions: list[str]
    acked_subscriptions: list[str]


class Transaction(BaseModel):
    """A transaction as the ledger shows it."""

    txn_id: str
    job: str
    batch_id: str
    attempt: int
    state: TxnState
    started_at_ms: int
    ended_at_ms: int | None
    duration_ms: int | None
    error: str | None
    ledger_topic: str


class TransactionDetail(BaseModel):
    """A transaction: its ledger view (if any), its records, and live coordinator state."""

    txn_id: str
    state: str
    ledger: Transaction | None
    records: list[dict[str, Any]]
    records_total: int = 0
    records_offset: int = 0
    records_limit: int = 0
    records_truncated: bool = Field(False, description="the page stopped early: its records reached the byte "
                                                       "limit of one answer; ask for the next with records_offset")
    live: LiveTxn | None
    buffers: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    pending_acks: dict[str, dict[str, Any] | None] = Field(default_factory=dict)


class AbortResult(BaseModel):
    """The outcome of an abort request."""

    txn_id: str
    state: str
    message: str


class Coordinator(BaseModel):
    """One transaction coordinator's stats."""

    coordinator_id: int
    state: str | None
    ongoing: int | None
    low_water_mark: int | None
    recover_start_ms: int | None
    recover_end_ms: int | None


class Coordinators(BaseModel):
    """Every coordinator, and the open transactions older than ``slow_after_ms``."""

    coordinators: list[Coordinator]
    slow_after_ms: int
    slow_transactions: list[LiveTxn]


class Replay(BaseModel):
    """A replay of a parked batch."""

    replay_id: str
    batch_id: str
    status: ReplayStatus
    requested_at_ms: int
    started_at_ms: int | None
    finished_at_ms: int | None
    txn_id: str | None
    messages: int | None
    message: str | None
    runs: int


class Batch(BaseModel):
    """A batch, from its ledger records; ``replay`` if one was requested over REST."""

    batch_id: str
    job: str
    status: BatchStatus
    attempts: int
    txn_id: str | None
    inputs: int
    outputs: int
    started_at_ms: int
    ended_at_ms: int | None
    duration_ms: int | None
    error: str | None
    ledger_topic: str
    parked_topic: str | None
    replay: Replay | None = None


class BatchDetail(Batch):
    """A batch with one page of its ledger records, oldest first (``records_offset``,
    ``records_limit``; ``records_total`` in all)."""

    records: list[dict[str, Any]]
    records_total: int = 0
    records_offset: int = 0
    records_limit: int = 0
    records_truncated: bool = Field(False, description="the page stopped early: its records reached the byte "
                                                       "limit of one answer; ask for the next with records_offset")


class Job(BaseModel):
    """A job's batches by status, volumes, throughput and last commit."""

    job: str
    batches: dict[str, int]
    total_batches: int
    inputs_committed: int
    outputs_committed: int
    first_commit_ms: int | None
    last_commit_ms: int | None
    throughput_per_s: float | None = Field(description="committed input messages per second, first to last commit")
    commit_p50_ms: float | None
    commit_p99_ms: float | None


class JobDetail(Job):
    """A job with its latest batches."""

    recent_batches: list[Batch]


class Component(BaseModel):
    """Reachability of one dependency."""

    ok: bool
    detail: str


class TopicProjection(BaseModel):
    """How far the projection of one ledger topic got."""

    topic: str
    records: int
    skipped: int = Field(description="messages quarantined by this process (same as quarantined)")
    quarantined: int = Field(description="messages of the topic quarantined by this process")
    position: str | None
    last_applied_ms: int | None
    error: str | None


class Health(BaseModel):
    """Broker and database reachability, and the projection's progress."""

    status: Literal["ok", "degraded"]
    broker: Component
    database: Component
    projection: list[TopicProjection]


class Alive(BaseModel):
    """The process answers (nothing else is checked)."""

    status: Literal["alive"]


class Ready(BaseModel):
    """Whether this process can serve its API: its database answers (503 if not). The broker is
    not part of readiness (see ``/health``)."""

    status: Literal["ready", "not ready"]
    database: bool


class Quarantined(BaseModel):
    """A ledger message that is not a valid record, or that the database refused: kept raw (its
    first 64 KiB, decoded as UTF-8 with invalid bytes escaped) with the reason."""

    id: int
    topic: str
    message_id: str
    publish_ms: int
    reason: str
    size: int = Field(description="bytes of the message")
    raw: str
    raw_truncated: bool
    quarantined_at_ms: int


class TimePoint(BaseModel):
    """Transactions per state in one time bucket (started, committed, aborted in it; open now)."""

    t_ms: int
    OPEN: int
    COMMITTED: int
    ABORTED: int


class TimeSeries(BaseModel):
    """Transactions by state over time."""

    bucket_ms: int
    points: list[TimePoint]
