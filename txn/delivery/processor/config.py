"""The processor's settings (:class:`ProcessorConfig`) and counters (:class:`ProcessorStats`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ...consumer import ConsumerType, InitialPosition
from ..ordering import OrderingGuard
from .metrics import MetricsOptions


@dataclass(slots=True)
class ProcessorConfig:
    """Settings of a :class:`Processor`."""

    inputs: list[str]
    output: str
    subscription: str
    job: str = "job"
    batch_max_messages: int = 100
    batch_max_delay_ms: int = 100
    #: A batch also closes before its inputs' payloads would pass this many bytes; a message
    #: larger than the bound goes alone in its batch. 0: no bound by bytes.
    batch_max_bytes: int = 8 * 1024 * 1024
    max_attempts: int = 3
    txn_timeout_ms: int = 60000
    max_inflight_commits: int = 2
    #: Failover (the default) or Exclusive: one instance consumes each input partition at a time.
    #: Shared and Key_Shared hand one partition to several instances and are refused while
    #: ``fencing`` is on (see ``txn.delivery.fencing``).
    consumer_type: ConsumerType = ConsumerType.Failover
    initial_position: InitialPosition = InitialPosition.Earliest
    ledger_topic: str | None = None
    parking_suffix: str = "-parked"
    receiver_queue_size: int = 1000
    max_pending_messages: int | None = None  # output producers' window; default 2 × batch, 1000..50000
    progress_interval_s: float = 5.0
    handler_spec: str | None = None
    #: Check every batch's inputs against the ledger's committed records (see ``ledger_guard``).
    ledger_guard: bool = True
    #: Bound of the guard's state: committed input ids remembered (about 60 bytes each).
    guard_max_ids: int = 1_000_000
    #: Every this many seconds (at most), a commit also writes the ledger guard's checkpoint (where
    #: it has read to, and the highest input each partition's records name), so that the next
    #: start reads the ledger from the newest checkpoint the subscription's cursor allows instead
    #: of from its beginning (``txn.delivery.guard_checkpoint``). 0: no checkpoints, and the guard
    #: reads the whole ledger at every start.
    guard_checkpoint_s: float = 30.0
    #: After a broker restart, check that the batches committed in the last ``commit_audit_keep_s``
    #: seconds before it are still readable once the transaction timeout has passed, and commit
    #: again those the broker rolled back after their commit (``txn.delivery.commit_audit``;
    #: apache/pulsar#20150). Needs the ledger guard.
    commit_audit: bool = True
    commit_audit_keep_s: float = 60.0
    #: How long a batch waits for the ledger to become readable up to its STARTED record after a
    #: re-subscription; default 3 x the transaction timeout, at least 2 minutes.
    guard_sync_timeout_ms: int | None = None
    #: Close batches at batch-entry boundaries: a batch never splits a producer's batch entry across
    #: two transactions (it may exceed ``batch_max_messages`` by up to one entry; see ``batching``).
    batch_entry_boundaries: bool = False
    #: One owner per input partition: every batch's transaction carries a fence marker of each
    #: partition it acknowledges, and an instance that takes a partition over fences the previous
    #: owner out first (``txn.delivery.fencing``). Off only for a single instance that is never
    #: run twice; then a paused or stale instance beside its replacement can commit inputs twice.
    fencing: bool = True
    #: Bound on taking a partition over (waiting for the previous owner's open transactions to be
    #: resolved); default 2 x the transaction timeout + 60 s.
    claim_timeout_ms: int | None = None
    #: Bound on redelivery: after this many seconds without any input, with nothing in flight,
    #: the processor asks the broker to send again whatever its consumers have not acknowledged
    #: (a Failover consumer's request rewinds its partition to the first unacknowledged input).
    #: Inputs the broker dispatched but that never reached a batch (lost in a reconnect, dropped
    #: as stale after a redelivery request raced a dispatch) come back within this bound instead
    #: of waiting for a restart. 0 turns it off.
    redeliver_idle_s: float = 10.0
    #: Bounds on what the handler returns: outputs for one input, and bytes (content, keys and
    #: properties) for the whole batch. Past either the batch fails with ``OutputLimitExceeded``
    #: (a ``ValueError``) and is retried, narrowed and parked like any failing batch; an endless
    #: generator is never iterated further than one item past the bound.
    max_outputs_per_input: int = 10_000
    max_output_bytes_per_batch: int = 256 * 1024 * 1024
    #: How long :meth:`start` keeps retrying while the broker cannot be reached or is not ready
    #: (a broker restarting, a coordinator not yet assigned), with backoff up to 5 s; then the
    #: last error is raised. Authentication, authorization and bad topic names fail at once.
    #: 0: one attempt.
    start_timeout_ms: int = 120_000
    #: The inputs' schema (a :class:`txn.schema.Schema`): the consumer checks it against the input
    #: topics' registered schema (``IncompatibleSchema`` at start), and ``message.value()`` in
    #: the handler decodes by it, by the version each message was written with. A message it cannot
    #: decode fails its batch (retried, then parked), never dropped. None: ``value()`` is the bytes.
    input_schema: Any = None
    #: The outputs' schema: the output producers register it, and a handler may return values
    #: it encodes (records, dicts, str) besides bytes, which are sent as they are.
    output_schema: Any = None
    #: Hold a message until the one it must follow committed (see ``ordering``); None: off.
    ordering: OrderingGuard | None = None
    #: Serve Prometheus metrics while running (see ``metrics``); None: off.
    metrics: MetricsOptions | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessorStats:
    """Counters, updated as batches complete."""

    batches: int = 0
    messages: int = 0
    outputs: int = 0
    aborts: int = 0
    parked: int = 0
    #: Inputs the ledger already showed committed: acknowledged again, nothing produced.
    duplicates_skipped: int = 0
    #: Input partitions taken over (fences acquired) and lost to another instance.
    takeovers: int = 0
    partitions_lost: int = 0
    #: Times the inputs of failed batches were handed back for redelivery.
    redeliveries: int = 0
    #: Committed batches found rolled back by the broker after a restart, and those committed again.
    vanished: int = 0
    redone: int = 0
    #: Partitions told to commit a batch the coordinator had committed without them.
    unstuck: int = 0
    commit_ms_total: float = 0.0
    #: Batches collected, and the time their first input waited for the batch to close (the
    #: batching delay an input sees, before its handler runs).
    batches_collected: int = 0
    batch_wait_ms_total: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def line(self, job: str, inflight: int) -> str:
        el = max(time.monotonic() - self.started, 1e-9)
        avg = self.commit_ms_total / self.batches if self.batches else 0.0
        wait = self.batch_wait_ms_total / self.batches_collected if self.batches_collected else 0.0
        return (
            f"[{job}] batches={self.batches} messages={self.messages} outputs={self.outputs} "
            f"txn/s={self.batches / el:.1f} msg/s={self.messages / el:.0f} aborts={self.aborts} "
            f"parked={self.parked} duplicates_skipped={self.duplicates_skipped} takeovers={self.takeovers} "
            f"partitions_lost={self.partitions_lost} redeliveries={self.redeliveries} inflight={inflight} "
            f"avg_commit_ms={avg:.1f} avg_batch_wait_ms={wait:.1f}"
            + (f" vanished={self.vanished} redone={self.redone}" if self.vanished else "")
            + (f" unstuck={self.unstuck}" if self.unstuck else "")
        )
