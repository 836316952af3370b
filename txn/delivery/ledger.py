"""The batch ledger: versioned JSON records in a topic, one stream per namespace by default.

Every batch a processor handles leaves records here:

- ``STARTED``: written outside the transaction when the batch's transaction opens;
- ``COMMITTED``: written *inside* the batch's transaction, so it exists exactly when the
  batch committed;
- ``ABORTED``: written after an abort, with the error;
- ``PARKED``: written inside the transaction that moves poison messages to the parking topic;
- ``REPLAYED``: written inside the transaction that replays a parked batch.

The topic is the source of truth; the control plane projects it into SQL. Records are keyed
by batch id (the message key), so a compacted view keeps the last record of each batch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from typing import Any

from ..topic import parse_topic

SCHEMA = "pulsar-txn.ledger/1"
#: A durable subscription that never acknowledges, so the broker keeps every ledger record.
RETENTION_SUBSCRIPTION = "pulsar-txn-retention"
KINDS = ("STARTED", "COMMITTED", "ABORTED", "PARKED", "REPLAYED")
LEDGER_TOPIC_NAME = "pulsar-txn-ledger"


def default_ledger_topic(topic: str) -> str:
    """The ledger topic of ``topic``'s namespace: ``persistent://<tenant>/<ns>/pulsar-txn-ledger``."""
    t = parse_topic(topic)
    return f"persistent://{t.tenant}/{t.namespace}/{LEDGER_TOPIC_NAME}"


class LedgerSchemaError(ValueError):
    """A ledger message is not a record of a schema version we understand."""


@dataclass(slots=True)
class LedgerRecord:
    """One ledger record (schema ``pulsar-txn.ledger/1``)."""

    kind: str
    job: str
    batch_id: str
    txn_id: str | None = None
    attempt: int = 1
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=dict)
    started_at_ms: int = 0
    ended_at_ms: int | None = None
    error: str | None = None
    parked_topic: str | None = None
    replay_of: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA
    #: Inputs acknowledged in this transaction without output because the ledger already showed
    #: them committed (acknowledgements the broker lost; see ``txn.delivery.ledger_guard``).
    duplicates: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LedgerSchemaError(f"unknown ledger record kind {self.kind!r}")

    @property
    def duration_ms(self) -> int | None:
        """Milliseconds from start to end, if ended."""
        return None if self.ended_at_ms is None else self.ended_at_ms - self.started_at_ms

    def to_json(self) -> bytes:
        """Serialise (compact JSON, keys sorted)."""
        d = {name: getattr(self, name) for name in _FIELDS}
        d["duration_ms"] = self.duration_ms
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> LedgerRecord:
        """Parse; raises :class:`LedgerSchemaError` for other schemas or malformed records."""
        try:
            d = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise LedgerSchemaError(f"ledger record is not JSON: {exc}") from exc
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise LedgerSchemaError(f"not a {SCHEMA} record: schema={d.get('schema') if isinstance(d, dict) else d!r}")
        d.pop("duration_ms", None)
        known = {f for f in cls.__dataclass_fields__}
        try:
            return cls(**{k: v for k, v in d.items() if k in known})
        except TypeError as exc:
            raise LedgerSchemaError(f"malformed ledger record: {exc}") from exc


async def ensure_ledger_retained(client: Any, ledger_topic: str) -> None:
    """Make sure the broker never deletes ``ledger_topic``'s records.

    With the default retention a broker deletes a topic's data once every subscription has
    acknowledged it, and keeps nothing of a topic without subscriptions once its ledger rolls
    over (e.g. at a restart). The ledger is the source of truth, so we hold a durable
    subscription on it that never acknowledges. (A retention policy on the namespace is the
    alternative; then this subscription may be deleted.)
    """
    from ..consumer import ConsumerType, InitialPosition

    c = await client.subscribe(ledger_topic, RETENTION_SUBSCRIPTION, consumer_type=ConsumerType.Shared,
                               initial_position=InitialPosition.Earliest, receiver_queue_size=1)
    await c.close()


_FIELDS = tuple(f.name for f in fields(LedgerRecord))


def now_ms() -> int:
    """Wall-clock milliseconds since the epoch."""
    return int(time.time() * 1000)
