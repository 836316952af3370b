"""The batch ledger: versioned JSON records in a topic, one stream per namespace by default.

Every batch a processor handles leaves records here:

- ``STARTED``: written outside the transaction when the batch's transaction opens;
- ``COMMITTED``: written *inside* the batch's transaction, so it exists exactly when the
  batch committed;
- ``ABORTED``: written after an abort, with the error;
- ``PARKED``: written inside the transaction that moves poison messages to the parking topic;
- ``REPLAYED``: written inside the transaction that replays a parked batch.

A record names its inputs by id per topic (``inputs``) or, for the distributed Spark runtime's
batches, by one message-id range per partition (``input_ranges``: the record stays small however
large the batch); readers take both (:attr:`LedgerRecord.input_count`).

The topic is the source of truth; the control plane projects it into SQL. Records are keyed
by batch id (the message key), so a compacted view keeps the last record of each batch.

The contract in types: :class:`Kind` names the kinds, :mod:`txn.delivery.batch_ids` builds and
parses every batch id form, :class:`RecordConfig` types what travels in ``config``, and
:class:`LedgerRecord` is built with keywords only. The JSON of a record is what it always was:
the kind is its name as a string, ``config`` the same object (see :class:`RecordConfig` for
unknown keys), so ledger topics written by earlier versions parse unchanged.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from ..topic import parse_topic

SCHEMA = "pulsar-txn.ledger/1"
#: A durable subscription that never acknowledges, so the broker keeps every ledger record.
RETENTION_SUBSCRIPTION = "pulsar-txn-retention"


class Kind(StrEnum):
    """The kind of a ledger record; a ``str`` whose value is what the JSON holds (``"COMMITTED"``...)."""

    STARTED = "STARTED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    PARKED = "PARKED"
    REPLAYED = "REPLAYED"


KINDS = tuple(k.value for k in Kind)
#: Kinds written inside the transaction whose outcome they record: such a record exists exactly
#: when its transaction committed (its inputs are acknowledged in it).
COMMITTING_KINDS = frozenset((Kind.COMMITTED, Kind.PARKED, Kind.REPLAYED))
LEDGER_TOPIC_NAME = "pulsar-txn-ledger"


def default_ledger_topic(topic: str) -> str:
    """The ledger topic of ``topic``'s namespace: ``persistent://<tenant>/<ns>/pulsar-txn-ledger``."""
    t = parse_topic(topic)
    return f"persistent://{t.tenant}/{t.namespace}/{LEDGER_TOPIC_NAME}"


class LedgerSchemaError(ValueError):
    """A ledger message is not a valid record of a schema version we understand.

    The message says which field broke which rule (its type or size), never the field's content."""


#: Bounds of a record (``from_json`` rejects anything outside them). String lengths fit the
#: control plane's columns; the byte size is Pulsar's default maximum message size.
MAX_RECORD_BYTES = 5 * 1024 * 1024
MAX_DEPTH = 16
MAX_JOB = 256
MAX_BATCH_ID = 512
MAX_TXN_ID = 64
MAX_TOPIC = 512
MAX_ERROR = 32_768
MAX_ID = 256
MAX_TOPICS = 10_000
MAX_IDS = 1_000_000
MAX_CONFIG_KEYS = 256
MAX_ATTEMPT = 2**31 - 1
MAX_INT = 2**63 - 1
_TRUNCATED = " [truncated]"

#: Strings (an unterminated one runs to the end, so every byte is scanned once) and runs of bytes
#: that are neither brackets nor quotes: what is left after removing them is the brackets.
_BRACKETS = re.compile(rb'"(?:[^"\\]|\\.)*"?|[^\[\]{}"]+')


def json_depth(data: bytes) -> int:
    """The deepest nesting of arrays/objects in the JSON text ``data`` (strings skipped), computed
    without recursion, so a hostile document is measured before a parser recurses into it."""
    depth = top = 0
    for b in _BRACKETS.sub(b"", data):
        if b in (0x5B, 0x7B):
            depth += 1
            top = max(top, depth)
        else:
            depth -= 1
    return top


def _fail(name: str, rule: str, value: Any) -> LedgerSchemaError:
    return LedgerSchemaError(f"field {name!r} must be {rule}, got {type(value).__name__}")


def _text(name: str, value: Any, hi: int, *, optional: bool = False, lo: int = 1) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or not lo <= len(value) <= hi:
        size = f" of {len(value)}" if isinstance(value, str) else ""
        raise LedgerSchemaError(f"field {name!r} must be a string of {lo}..{hi} characters, got "
                                f"{type(value).__name__}{size}")
    if "\x00" in value or not value.isprintable() and not _encodable(value):
        raise LedgerSchemaError(f"field {name!r} holds a NUL or an unpaired surrogate")


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _int(name: str, value: Any, lo: int, hi: int, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not int:
        raise _fail(name, f"an integer in {lo}..{hi}", value)
    if not lo <= value <= hi:
        raise LedgerSchemaError(f"field {name!r} must be an integer in {lo}..{hi}, got one out of range")


def _check_config(config: Any) -> None:
    if not isinstance(config, dict) or len(config) > MAX_CONFIG_KEYS:
        raise _fail("config", f"an object of at most {MAX_CONFIG_KEYS} keys", config)


def _ids_per_topic(name: str, value: Any) -> None:
    """``{topic: [message id, ...]}`` within the bounds."""
    if not isinstance(value, dict) or len(value) > MAX_TOPICS:
        raise _fail(name, f"an object of at most {MAX_TOPICS} topics", value)
    for topic, ids in value.items():
        _text(f"{name} (topic)", topic, MAX_TOPIC)
        if not isinstance(ids, list) or len(ids) > MAX_IDS:
            raise _fail(name, f"an object of lists of at most {MAX_IDS} message ids", ids)
        for i in ids:
            _text(f"{name} (message id)", i, MAX_ID)


def _id_per_topic(name: str, value: Any) -> None:
    """``{topic: message id}`` within the bounds."""
    if not isinstance(value, dict) or len(value) > MAX_TOPICS:
        raise _fail(name, f"an object of at most {MAX_TOPICS} topics", value)
    for topic, i in value.items():
        _text(f"{name} (topic)", topic, MAX_TOPIC)
        _text(f"{name} (message id)", i, MAX_ID)


def _ranges_per_partition(name: str, value: Any) -> None:
    """``{topic partition: {"after": "L:E", "to": "L:E", "count": n}}`` within the bounds."""
    if not isinstance(value, dict) or len(value) > MAX_TOPICS:
        raise _fail(name, f"an object of at most {MAX_TOPICS} topic partitions", value)
    for topic, r in value.items():
        _text(f"{name} (topic)", topic, MAX_TOPIC)
        if not isinstance(r, dict) or set(r) != {"after", "to", "count"}:
            raise _fail(name, 'an object of {"after", "to", "count"} ranges', r)
        _text(f"{name} (after)", r["after"], MAX_ID)
        _text(f"{name} (to)", r["to"], MAX_ID)
        _int(f"{name} (count)", r["count"], 0, MAX_INT)


def validate(rec: LedgerRecord) -> None:
    """Check every field's type and bounds; raises :class:`LedgerSchemaError`."""
    if rec.kind not in KINDS:
        raise LedgerSchemaError(f"field 'kind' must be one of {', '.join(KINDS)}")
    _text("job", rec.job, MAX_JOB)
    _text("batch_id", rec.batch_id, MAX_BATCH_ID)
    _text("txn_id", rec.txn_id, MAX_TXN_ID, optional=True)
    _int("attempt", rec.attempt, 0, MAX_ATTEMPT)
    _int("started_at_ms", rec.started_at_ms, 0, MAX_INT)
    _int("ended_at_ms", rec.ended_at_ms, 0, MAX_INT, optional=True)
    _text("error", rec.error, MAX_ERROR, optional=True, lo=0)
    _text("parked_topic", rec.parked_topic, MAX_TOPIC, optional=True)
    _text("replay_of", rec.replay_of, MAX_BATCH_ID, optional=True)
    _ids_per_topic("inputs", rec.inputs)
    _ids_per_topic("duplicates", rec.duplicates)
    _ranges_per_partition("input_ranges", rec.input_ranges)
    _id_per_topic("output_starts", rec.output_starts)
    if not isinstance(rec.outputs, dict) or len(rec.outputs) > MAX_TOPICS:
        raise _fail("outputs", f"an object of at most {MAX_TOPICS} topics", rec.outputs)
    for topic, n in rec.outputs.items():
        _text("outputs (topic)", topic, MAX_TOPIC)
        _int("outputs (count)", n, 0, MAX_INT)
    _check_config(rec.config.to_dict() if isinstance(rec.config, RecordConfig) else rec.config)
    if rec.schema != SCHEMA:
        raise LedgerSchemaError(f"not a {SCHEMA} record")


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordConfig:
    """What a record says about the code and topics behind it (the JSON ``config`` object), typed.

    Informative only: nothing runs or routes by it (invariant 7: a replay takes the code and the
    topics from its caller). Writers set the fields that apply to them:

    - the processor: ``handler``, ``output``, ``inputs``, ``subscription``, ``parking_suffix``,
      ``ledger_topic``; the Spark runtime also ``runtime`` (``"spark"``) and ``transform``;
    - a replay: ``handler`` (the handler's name) or ``transform``;
    - the Spark sink: ``sink``, ``topic``, ``ledger_topic``, ``tasks``, ``rows``,
      ``duplicates_dropped``, ``deterministic_order``, ``batch_max_rows``, ``task_attempts``,
      ``write_id``; a micro-batch also ``stream_key``, ``query_id`` and ``spark_batch_id``.

    JSON: a field that is None is left out, unless it is named in ``nulls`` (then it is written
    as ``null``: :meth:`of` does that for every None it is given, as writers always did). Keys
    this version does not know, and known keys whose value has another type than the field's,
    are **preserved**: they stay in ``extra`` as they came (the typed field then reads None) and
    are written back unchanged. So ``from_dict(d).to_dict() == d`` for any JSON object ``d``,
    and a record re-serialised by this version (the control plane stores what it projects) keeps
    what a newer writer put there.

    For code written against the plain dict, ``config["rows"]``, ``config.get(...)``, ``in`` and
    ``len`` read the JSON object.
    """

    handler: str | None = None
    transform: str | None = None
    runtime: str | None = None
    output: str | None = None
    inputs: tuple[str, ...] | None = None
    subscription: str | None = None
    parking_suffix: str | None = None
    ledger_topic: str | None = None
    sink: str | None = None
    topic: str | None = None
    write_id: str | None = None
    stream_key: str | None = None
    query_id: str | None = None
    spark_batch_id: int | None = None
    tasks: int | None = None
    rows: int | None = None
    duplicates_dropped: int | None = None
    deterministic_order: bool | None = None
    batch_max_rows: int | None = None
    task_attempts: Mapping[str, int] | None = None
    #: Unknown keys (and known keys holding another type), as they came.
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Known keys written as JSON ``null``.
    nulls: frozenset[str] = frozenset()

    @classmethod
    def of(cls, **values: Any) -> RecordConfig:
        """A config from typed fields where a None is written as ``null`` (not left out), as the
        writers of earlier versions wrote it; lists are accepted for ``inputs``."""
        return cls(**_typed(values), nulls=frozenset(k for k, v in values.items() if v is None))

    def updated(self, **values: Any) -> RecordConfig:
        """A copy with ``values`` set (a None written as ``null``, as with :meth:`of`)."""
        return replace(self, **_typed(values),
                       nulls=self.nulls | frozenset(k for k, v in values.items() if v is None))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RecordConfig:
        """The typed view of a JSON ``config`` object (never fails: see the class docs)."""
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        nulls = set()
        for k, v in d.items():
            kind = _CONFIG_TYPES.get(k) if isinstance(k, str) else None
            if kind is None:
                extra[k] = v
            elif v is None:
                nulls.add(k)
            elif (kind == "str" and isinstance(v, str)) or (kind == "bool" and type(v) is bool) \
                    or (kind == "int" and type(v) is int):
                known[k] = v
            elif kind == "strs" and isinstance(v, list) and all(isinstance(x, str) for x in v):
                known[k] = tuple(v)
            elif kind == "counts" and isinstance(v, dict) and all(
                    isinstance(a, str) and type(b) is int for a, b in v.items()):
                known[k] = dict(v)
            else:
                extra[k] = v
        return cls(**known, extra=extra, nulls=frozenset(nulls))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object (see the class docs for what is left out)."""
        d: dict[str, Any] = {}
        for name, kind in _CONFIG_TYPES.items():
            v = getattr(self, name)
            if v is None:
                if name in self.nulls:
                    d[name] = None
            elif kind == "strs":
                d[name] = list(v)
            elif kind == "counts":
                d[name] = dict(v)
            else:
                d[name] = v
        for k, v in self.extra.items():
            d.setdefault(k, v)
        return d

    # Read access by JSON key, for code written against the dict.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The JSON object's value of ``key``, or ``default``."""
        return self.to_dict().get(key, default)

    def keys(self) -> Any:
        """The JSON object's keys."""
        return self.to_dict().keys()

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(_CONFIG_TYPES))
    if unknown:
        raise TypeError(f"RecordConfig has no field(s) {unknown}; put other keys in extra")
    return {k: tuple(v) if _CONFIG_TYPES[k] == "strs" and v is not None else
            dict(v) if _CONFIG_TYPES[k] == "counts" and v is not None else v for k, v in values.items()}


#: RecordConfig's typed fields: name -> "str" | "int" | "bool" | "strs" (a list of strings) | "counts".
_CONFIG_TYPES: dict[str, str] = {
    f.name: {"str | None": "str", "int | None": "int", "bool | None": "bool", "tuple[str, ...] | None": "strs",
             "Mapping[str, int] | None": "counts"}[str(f.type)]
    for f in fields(RecordConfig) if f.name not in ("extra", "nulls")
}


@dataclass(slots=True, kw_only=True)
class LedgerRecord:
    """One ledger record (schema ``pulsar-txn.ledger/1``), built with keywords only.

    The constructor checks the kind only (writers build records freely), and takes a kind's
    name as well as a :class:`Kind` and a plain dict for ``config`` (both converted);
    :meth:`from_json` checks every field (:func:`validate`), as does :meth:`validate`."""

    kind: Kind
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
    config: RecordConfig = field(default_factory=RecordConfig)
    schema: str = SCHEMA
    #: Inputs acknowledged in this transaction without output because the ledger already showed
    #: them committed (acknowledgements the broker lost; see ``txn.delivery.ledger_guard``).
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    #: The range form of the inputs, for batches too large to list every id (the distributed Spark
    #: runtime): ``{topic partition: {"after": "L:E", "to": "L:E", "count": n}}``, the entries after
    #: ``after`` (exclusive; entry ``-1`` is before a ledger's first) up to ``to`` (inclusive), all
    #: acknowledged cumulatively in the record's transaction. Left out of the JSON when empty.
    input_ranges: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The id of the transaction's first output on each output partition (COMMITTED records of the
    #: processor): where the commit audit looks for a commit that never reached a partition
    #: (``txn.delivery.commit_audit``). Left out of the JSON when empty.
    output_starts: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, Kind):
            if not isinstance(self.kind, str) or self.kind not in KINDS:
                raise LedgerSchemaError(f"unknown ledger record kind {str(self.kind)[:16]!r}")
            self.kind = Kind(self.kind)
        if isinstance(self.config, Mapping) and not isinstance(self.config, RecordConfig):
            self.config = RecordConfig.from_dict(self.config)

    @property
    def input_count(self) -> int:
        """How many inputs the record covers: its listed ids, plus the counts of its ranges on
        partitions whose ids it does not list (a PARKED record has both forms)."""
        return sum(len(v) for v in self.inputs.values()) + sum(
            int(r.get("count", 0)) for n, r in self.input_ranges.items()
            if isinstance(r, dict) and n not in self.inputs)

    @property
    def duration_ms(self) -> int | None:
        """Milliseconds from start to end, if ended."""
        return None if self.ended_at_ms is None else self.ended_at_ms - self.started_at_ms

    def validate(self) -> LedgerRecord:
        """Check every field's type and bounds (raises :class:`LedgerSchemaError`); returns self."""
        validate(self)
        return self

    def to_json(self) -> bytes:
        """Serialise (compact JSON, keys sorted); an error longer than ``MAX_ERROR`` is cut there."""
        d = {name: getattr(self, name) for name in _FIELDS}
        d["kind"] = str(self.kind)
        if not self.input_ranges:
            del d["input_ranges"]  # the id form's JSON stays what it always was
        if not self.output_starts:
            del d["output_starts"]
        if isinstance(self.config, RecordConfig):
            d["config"] = self.config.to_dict()
        if isinstance(self.error, str) and len(self.error) > MAX_ERROR:
            d["error"] = self.error[:MAX_ERROR - len(_TRUNCATED)] + _TRUNCATED
        d["duration_ms"] = self.duration_ms
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> LedgerRecord:
        """Parse and validate; raises :class:`LedgerSchemaError` for other schemas or records that
        break a rule of :func:`validate` (size and nesting are checked before parsing)."""
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
        if len(raw) > MAX_RECORD_BYTES:
            raise LedgerSchemaError(f"ledger record of {len(raw)} bytes exceeds {MAX_RECORD_BYTES}")
        if (depth := json_depth(raw)) > MAX_DEPTH:
            raise LedgerSchemaError(f"ledger record nests {depth} levels deep (at most {MAX_DEPTH})")
        try:
            d = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise LedgerSchemaError(f"ledger record is not JSON ({type(exc).__name__})") from None
        if not isinstance(d, dict) or d.get("schema") != SCHEMA:
            raise LedgerSchemaError(f"not a {SCHEMA} record")
        d.pop("duration_ms", None)
        if not isinstance(d.get("kind"), str) or d["kind"] not in KINDS:
            raise LedgerSchemaError(f"field 'kind' must be one of {', '.join(KINDS)}")
        if "config" in d:
            _check_config(d["config"])
            d["config"] = RecordConfig.from_dict(d["config"])
        try:
            rec = cls(**{k: v for k, v in d.items() if k in _FIELDS})
        except TypeError:
            raise LedgerSchemaError("malformed ledger record: a required field is missing") from None
        return rec.validate()


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
