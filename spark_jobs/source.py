"""The ``pulsar`` Spark source: batch and streaming reads of Pulsar topics by message-id ranges.

Register it with ``spark.dataSource.register(PulsarDataSource)`` (or ``spark_jobs.register``)::

    df = (spark.read.format("pulsar")
          .option("service_url", "pulsar://127.0.0.1:6650")
          .option("topics", "orders,persistent://public/default/invoices")
          .load())

Each Spark partition reads one topic partition from a start position (exclusive) to an end
position (inclusive) with a non-durable reader (:class:`txn.AsyncReader`, on a client the
task opens and closes itself); see :mod:`spark_jobs.offsets` for
positions and the offsets JSON. Reads are read-committed: the broker never delivers the
messages of open or aborted transactions to readers, and a partition's last message id (which
ends a ``latest`` range) is the last message it can deliver.

Pulsar keeps data only for durable subscriptions, so a streaming query holds one on every
partition it reads (see :mod:`spark_jobs.subscription`): created before the first offset is
returned, at the query's start position, and moved forward in ``commit(end)``. The broker then
keeps everything the query has not committed (and the last committed entry, so that a restart
can check that its start is still stored). A read whose start is no longer stored (a ledger
trimmed, a topic deleted and re-created, a subscription skipped, cleared or removed) raises
:class:`PulsarDataLossError`, or with ``failOnDataLoss=false`` logs the same facts as a warning
and reads what is left.

Options (names are case-insensitive):

- ``service_url`` (required): ``pulsar://host:6650`` or ``pulsar+ssl://...``.
- ``topics``: comma-separated topic names (short names are in ``public/default``); a
  partitioned topic expands to all its partitions, ``<topic>-partition-<n>`` reads one.
- ``topicsPattern``: a regex matched (``re.fullmatch``) against the fully qualified names of the
  topics of one namespace, listed with the admin REST API (needs ``admin_url``). The namespace
  is the pattern's prefix: ``persistent://tenant/ns/orders-.*`` (or ``tenant/ns/orders-.*``);
  a bare pattern (``orders-.*``) is in ``public/default``. Exactly one of ``topics`` and
  ``topicsPattern`` is required.
- ``admin_url``: ``http://host:8080``; needed for ``topicsPattern``; when set, the topics of
  ``topics`` are checked to exist (otherwise the broker's auto topic creation decides).
- ``startingOffsets``: ``earliest`` (batch default), ``latest`` (streaming default) or JSON
  ``{"<topic-partition>": "<ledger>:<entry>:<batchIndex>", ...}``; a start is exclusive,
  partitions missing from the JSON start at ``earliest``. Ignored when a streaming query
  restarts from its checkpoint.
- ``startingTimestamp``: start each partition at its first message published at or after this
  time (milliseconds since the epoch; the broker's seek by publish time, which finds entries, so
  the messages of one batch entry start together); a partition with none starts at its end.
  Instead of ``startingOffsets`` (both are refused); ignored when a streaming query restarts
  from its checkpoint.
- ``endingOffsets`` (batch only): ``latest`` (default) or JSON; an end is inclusive and capped
  at the partition's last message when the query is planned; partitions missing from the
  JSON end at ``latest``.
- ``maxMessagesPerTrigger`` (streaming): at most this many messages per micro-batch, over all
  partitions (shared out evenly, the unused share of exhausted partitions going to the
  others). The driver finds the cap positions by reading the capped range once. Use it with
  the default or a processing-time trigger, *not* with ``Trigger.AvailableNow``: Spark 4.1's
  Python Data Source API has no admission control, so for ``availableNow`` Spark calls
  ``latestOffset()`` once and stops after one micro-batch up to it, i.e. after the first cap.
  (``availableNow`` without the cap is fine: one micro-batch of everything available.)
- ``maxBytesPerTrigger`` (streaming): at most this many bytes of message payload per
  micro-batch, over all partitions (shared out like the message cap); a micro-batch whose first
  message alone is larger takes that message, so the query never stalls. With
  ``maxMessagesPerTrigger`` both caps hold. The same caveat about ``availableNow`` applies.
- ``minPartitions``: at least this many Spark partitions per batch or micro-batch where the
  ranges allow it: a topic partition's range is cut at entry boundaries inside the ledger of its
  end (the ledger ids before it are not known without reading), more cuts in longer ranges.
- ``partitionDiscoveryIntervalMs`` (streaming, default 10000): how often the topics (the
  pattern's matches, partition counts) are resolved again; in between, each trigger only asks
  the known partitions for their last message id.
- ``pollTimeoutMs`` (default 60000): how long a read waits for a message known to be stored
  before failing the task.
- ``subscription`` (streaming; alias ``predefinedSubscription``): the name of the query's durable
  subscription. Default: a new ``spark-pulsar-<32 hex>`` for a new checkpoint, kept in the
  checkpoint's offsets. Drop it when the query is retired: ``pulsar-txn spark drop-subscription``.
- ``failOnDataLoss`` (default ``true``): fail a read whose start is no longer stored by the
  broker (:class:`PulsarDataLossError`, naming the topic, partition and missing range); with
  ``false``, log a warning with the same facts and go on with what is stored.
- ``authToken`` (a token or ``file:///path``), ``tlsTrustCertsFilePath``,
  ``tlsAllowInsecureConnection``, ``tlsValidateHostname``: connection security (the token is
  also sent to the admin API as a bearer token).
- Aliases (:mod:`spark_jobs.options`): ``service.url`` and ``admin.url`` for ``service_url`` and
  ``admin_url``, ``topic`` (one topic) for ``topics``, ``poolTimeoutMs`` for ``pollTimeoutMs``;
  an alias and its canonical name given with different values raise
  :class:`spark_jobs.options.OptionConflict`.

Columns: ``key`` binary (the partition key's UTF-8 bytes, null if none), ``value`` binary,
``topic`` string (without ``-partition-N``), ``partition`` int (-1 if not partitioned),
``message_id`` string (``(ledger,entry,partition,batchIndex)``, :class:`txn.MessageId`'s
``str``), ``message_id_bytes`` binary (``MessageId.serialize()``: the ``MessageIdData``
protobuf, readable by ``txn.MessageId.deserialize`` and ``pulsar.MessageId.deserialize``),
``publish_time`` timestamp, ``event_time`` timestamp (null when unset), ``properties``
map<string,string>.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import txn
from txn.admin import admin_request
from txn.bridge import LoopThread
from txn.settings import BrokerSettings
from txn.topic import parse_topic

from .offsets import (
    EARLIEST,
    EARLIEST_POS,
    LATEST,
    Position,
    canonical_partition,
    format_position,
    last_position,
    offsets_from_json,
    offsets_to_json,
    parse_offsets,
    pos_key,
    position_of,
    to_message_id,
)
from .options import (
    CONNECTION_ALIASES,
    SECURITY_OPTIONS,
    OptionError,
    broker_settings,
    lower_options,
    refuse_unknown,
    resolve_aliases,
)
from .subscription import SUBSCRIPTION_KEY, check_subscription_name, new_subscription_name, split_offset
from .value_schema import TopicValueSchema, ValueSchemaError, registry_get

SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("message_id", StringType()),
    StructField("message_id_bytes", BinaryType()),
    StructField("publish_time", TimestampType()),
    StructField("event_time", TimestampType()),
    StructField("properties", MapType(StringType(), StringType())),
])

_ROWS_PER_BATCH = 4096
_BUSY_WAIT_S = 90.0  # how long a subscription held by another consumer (a dying driver's) is retried
_BEFORE_ENTRY_0 = (1 << 64) - 1  # entry id -1 on the wire: the position before a ledger's first entry
log = logging.getLogger("spark_jobs.source")
_NAME_PART = re.compile(r"[A-Za-z0-9_=:.\-]+")


# --------------------------------------------------------------------------- options


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options of the ``pulsar`` source (see the module docstring)."""

    service_url: str
    topics: tuple[str, ...] | None = None
    pattern: str | None = None
    admin_url: str | None = None
    starting: str | dict[str, Position | str] | None = None
    ending: str | dict[str, Position | str] | None = None
    max_per_trigger: int | None = None
    max_bytes_per_trigger: int | None = None
    starting_timestamp: int | None = None
    min_partitions: int | None = None
    poll_timeout_ms: int = 60000
    discovery_interval_ms: int = 10000
    auth_token: str | None = None
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    subscription: str | None = None
    fail_on_data_loss: bool = True
    tls_validate_hostname: bool = False
    #: Every connection option (URLs, any credentials, TLS) as one settings object; when set, the
    #: clients and admin calls use it.
    broker: BrokerSettings | None = None
    #: ``decodeValue``: the ``value`` column decoded by the topics' registered schema
    #: (:mod:`spark_jobs.value_schema`); ``value_schema`` is that schema, fetched when planning.
    decode_value: bool = False
    value_schema: TopicValueSchema | None = None

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SourceOptions:
        """Validate ``options`` (``ValueError`` naming the option on anything wrong)."""
        o = _source_options(options)
        url = str(o.get("service_url", "")).strip()
        if not url:
            raise ValueError("the pulsar source needs the option service_url (e.g. pulsar://127.0.0.1:6650)")
        if not url.startswith(("pulsar://", "pulsar+ssl://")):
            raise ValueError(f"service_url must start with pulsar:// or pulsar+ssl://, got {url!r}")
        topics_raw = o.get("topics")
        pattern = o.get("topicspattern")
        if topics_raw is not None and pattern is not None:
            raise ValueError("set exactly one of the options topics and topicsPattern, not both")
        if topics_raw is None and pattern is None:
            raise ValueError("the pulsar source needs one of the options topics (comma-separated names) "
                             "or topicsPattern (a regex)")
        topics: tuple[str, ...] | None = None
        if topics_raw is not None:
            names = [t.strip() for t in str(topics_raw).split(",") if t.strip()]
            if not names:
                raise ValueError(f"topics names no topic: {topics_raw!r}")
            topics = tuple(dict.fromkeys(canonical_partition(t, f"topics: {t!r}") for t in names))
            for t in topics:
                if not t.startswith("persistent://"):
                    raise ValueError(f"topics: {t} is not persistent; only persistent topics can be read by "
                                     "message id")
        admin_url = str(o["admin_url"]).strip().rstrip("/") if o.get("admin_url") else None
        if pattern is not None:
            pattern = str(pattern)
            _split_pattern(pattern)  # validates
            if not admin_url:
                raise ValueError("topicsPattern needs the option admin_url (the admin REST API lists the "
                                 "namespace's topics)")
        starting = parse_offsets(o["startingoffsets"], "startingOffsets") if "startingoffsets" in o else None
        ending = (parse_offsets(o["endingoffsets"], "endingOffsets", allow_earliest=False)
                  if "endingoffsets" in o else None)
        max_per_trigger = None
        if "maxmessagespertrigger" in o:
            max_per_trigger = _positive_int(o["maxmessagespertrigger"], "maxMessagesPerTrigger")
        max_bytes = (_positive_int(o["maxbytespertrigger"], "maxBytesPerTrigger")
                     if "maxbytespertrigger" in o else None)
        min_parts = _positive_int(o["minpartitions"], "minPartitions") if "minpartitions" in o else None
        starting_ts = None
        if "startingtimestamp" in o:
            if starting is not None:
                raise ValueError("set one of the options startingOffsets and startingTimestamp, not both")
            starting_ts = _positive_int(o["startingtimestamp"], "startingTimestamp")
        poll = _positive_int(o["polltimeoutms"], "pollTimeoutMs") if "polltimeoutms" in o else 60000
        discovery = (_positive_int(o["partitiondiscoveryintervalms"], "partitionDiscoveryIntervalMs")
                     if "partitiondiscoveryintervalms" in o else 10000)
        insecure = _bool(o.get("tlsallowinsecureconnection", "false"), "tlsAllowInsecureConnection")
        validate_hostname = _bool(o.get("tlsvalidatehostname", "false"), "tlsValidateHostname")
        decode_value = _bool(o.get("decodevalue", "false"), "decodeValue")
        if decode_value and not admin_url:
            raise ValueError("decodeValue needs the option adminUrl (the topics' schemas are read from the "
                             "broker's schema registry)")
        subscription = None
        for key, option in (("subscription", "subscription"), ("predefinedsubscription", "predefinedSubscription")):
            if key in o:
                name = check_subscription_name(o[key], option)
                if subscription is not None and name != subscription:
                    raise ValueError(f"subscription and predefinedSubscription name different subscriptions: "
                                     f"{subscription!r} and {name!r}")
                subscription = name
        return cls(
            service_url=url,
            topics=topics,
            pattern=pattern,
            admin_url=admin_url,
            starting=starting,
            ending=ending,
            max_per_trigger=max_per_trigger,
            max_bytes_per_trigger=max_bytes,
            starting_timestamp=starting_ts,
            min_partitions=min_parts,
            poll_timeout_ms=poll,
            discovery_interval_ms=discovery,
            auth_token=str(o["authtoken"]) if o.get("authtoken") else None,
            tls_trust_certs_file_path=str(o["tlstrustcertsfilepath"]) if o.get("tlstrustcertsfilepath") else None,
            tls_allow_insecure_connection=insecure,
            tls_validate_hostname=validate_hostname,
            subscription=subscription,
            fail_on_data_loss=_bool(o.get("failondataloss", "true"), "failOnDataLoss"),
            broker=broker_settings(o, "pulsar source"),
            decode_value=decode_value,
        )

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`txn.Client` / :class:`txn.AsyncClient`."""
        if self.broker is not None:
            return self.broker.client_kwargs()
        kw: dict[str, Any] = {}
        if self.auth_token:
            kw["authentication"] = txn.AuthenticationToken(self.auth_token)
        if self.tls_trust_certs_file_path:
            kw["tls_trust_certs_file_path"] = self.tls_trust_certs_file_path
        if self.tls_allow_insecure_connection:
            kw["tls_allow_insecure_connection"] = True
        if self.tls_validate_hostname:
            kw["tls_validate_hostname"] = True
        return kw

    def settings(self) -> BrokerSettings:
        """The connection options as :class:`txn.settings.BrokerSettings` (what the sink and the
        runtime take)."""
        if self.broker is not None:
            return self.broker
        tok, tok_file = self.auth_token, None
        if tok and tok.startswith("file://"):
            tok, tok_file = None, tok[len("file://"):]
        return BrokerSettings(
            service_url=self.service_url, admin_url=self.admin_url, auth_token=tok, auth_token_file=tok_file,
            tls_trust_certs_file_path=self.tls_trust_certs_file_path,
            tls_validate_hostname=self.tls_validate_hostname,
            tls_allow_insecure_connection=self.tls_allow_insecure_connection)


#: The source's option aliases (lower case): StreamNative's names, and ``topic`` for one topic.
#: Every option the source reads, as users write them (aliases are folded in first).
SOURCE_OPTIONS = ("serviceUrl", "adminUrl", "topics", "topicsPattern", "startingOffsets", "startingTimestamp",
                  "endingOffsets", "maxMessagesPerTrigger", "maxBytesPerTrigger", "pollTimeoutMs",
                  "partitionDiscoveryIntervalMs", "minPartitions", "subscription", "predefinedSubscription",
                  "failOnDataLoss", "decodeValue", *SECURITY_OPTIONS)

SOURCE_ALIASES: dict[str, tuple[str, ...]] = {
    **CONNECTION_ALIASES,
    "topics": ("topic",),
    "polltimeoutms": ("pooltimeoutms",),
}


def _source_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Lower-case option names with the aliases folded in (:class:`OptionConflict` on a clash)."""
    o = lower_options(options)
    single = o.get("topic")
    if single is not None and "," in str(single):
        raise OptionError(f"option topic names one topic, got {single!r}; use topics for a comma-separated list")
    o = resolve_aliases(o, SOURCE_ALIASES)
    refuse_unknown(o, SOURCE_OPTIONS, "pulsar source", SOURCE_ALIASES)
    return o


def _bool(value: Any, option: str) -> bool:
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{option} must be true or false, got {value!r}")
    return text == "true"


def _positive_int(value: Any, option: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{option} must be a positive integer, got {value!r}") from None
    if n <= 0:
        raise ValueError(f"{option} must be a positive integer, got {value!r}")
    return n


def _split_pattern(pattern: str) -> tuple[str, str, str, re.Pattern[str]]:
    """``topicsPattern`` -> (domain, tenant, namespace, compiled full-name regex)."""
    text = pattern.strip()
    if not text:
        raise ValueError("topicsPattern is empty")
    domain = "persistent"
    if "://" in text:
        domain, _, text = text.partition("://")
    if domain != "persistent":
        raise ValueError(f"topicsPattern: only persistent topics can be read, got domain {domain!r}")
    parts = text.split("/", 2)
    if len(parts) == 3:
        tenant, namespace, local = parts
    elif len(parts) == 1:
        tenant, namespace, local = "public", "default", parts[0]
    else:
        raise ValueError(f"topicsPattern {pattern!r}: expected [persistent://]tenant/namespace/<regex> or a bare "
                         "<regex> (in public/default)")
    if not _NAME_PART.fullmatch(tenant) or not _NAME_PART.fullmatch(namespace):
        raise ValueError(f"topicsPattern {pattern!r}: invalid tenant or namespace {tenant}/{namespace}")
    try:
        regex = re.compile(f"{re.escape(f'{domain}://{tenant}/{namespace}/')}(?:{local})")
    except re.error as exc:
        raise ValueError(f"topicsPattern {pattern!r} is not a valid regex: {exc}") from None
    return domain, tenant, namespace, regex


# ---------------------------------------------------------------- topic partitions


@dataclass(frozen=True, order=True)
class TopicPartition:
    """One partition to read: its full name, base topic name and index (-1: not partitioned)."""

    name: str
    topic: str
    partition: int

    @classmethod
    def of(cls, name: str) -> TopicPartition:
        tn = parse_topic(name)
        idx = tn.partition_index
        return cls(str(tn), tn.base if idx >= 0 else str(tn), idx)


class PulsarInputPartition(InputPartition):
    """Read ``(start, end]`` of one topic partition (positions in text form)."""

    def __init__(self, name: str, topic: str, partition: int, start: str, end: str) -> None:
        super().__init__((name, start, end))
        self.name, self.topic, self.partition, self.start, self.end = name, topic, partition, start, end

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PulsarInputPartition) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((self.name, self.start, self.end))


def _admin_get(opts: SourceOptions, path: str) -> Any:
    assert opts.admin_url
    try:
        status, body = admin_request("GET", opts.admin_url, path, timeout=30, **opts.settings().admin_kwargs())
    except OSError as exc:
        raise RuntimeError(f"admin_url {opts.admin_url} is unreachable: {exc}") from None
    if 200 <= status < 300:
        return body
    text = (body if isinstance(body, str) else json.dumps(body))[:300]
    if status == 404:
        raise ValueError(f"admin_url {opts.admin_url}: GET {path} -> 404 (namespace not found?) {text}")
    raise RuntimeError(f"admin_url {opts.admin_url}: GET {path} -> HTTP {status} {text}")


def _namespace_topics(opts: SourceOptions, domain: str, tenant: str, namespace: str) -> tuple[set[str], set[str]]:
    """(non-partitioned topics and partitions, partitioned topics) of a namespace."""
    base = f"/admin/v2/{domain}/{urllib.parse.quote(tenant)}/{urllib.parse.quote(namespace)}"
    plain = set(_admin_get(opts, base) or [])
    partitioned = set(_admin_get(opts, base + "/partitioned") or [])
    return plain, partitioned


class _Pulsar:
    """An :class:`txn.AsyncClient` on an event-loop thread of its own; on the driver also topic
    resolution, last message ids and the ``maxMessagesPerTrigger`` scan."""

    def __init__(self, opts: SourceOptions) -> None:
        self._opts = opts
        self._bridge = LoopThread("pulsar-source")
        self._probes: dict[str, Any] = {}
        self._held: dict[str, Any] = {}  # partition -> consumer on the query's durable subscription
        try:
            self.client: txn.AsyncClient = self.run(self._make())
        except BaseException:
            self._bridge.close()
            raise

    async def _make(self) -> txn.AsyncClient:
        return txn.AsyncClient(self._opts.service_url, **self._opts.client_kwargs())

    def run(self, coro: Any) -> Any:
        """Run ``coro`` on the client's loop and return its result."""
        return self._bridge.run(coro)

    def close(self) -> None:
        try:
            self.run(self.client.close())
        finally:
            self._bridge.close()

    @property
    def held(self) -> dict[str, Any]:
        """Partition name -> the consumer holding the query's durable subscription on it (see :meth:`hold`)."""
        return self._held

    # -- topics

    def resolve(self) -> list[TopicPartition]:
        """The topic partitions to read, sorted by name."""
        opts = self._opts
        if opts.pattern is not None:
            domain, tenant, namespace, regex = _split_pattern(opts.pattern)
            plain, partitioned = _namespace_topics(opts, domain, tenant, namespace)
            # Partitions of partitioned topics are listed too: match the partitioned topic instead.
            candidates = {t for t in plain if TopicPartition.of(t).topic not in partitioned} | partitioned
            names = sorted(t for t in candidates if regex.fullmatch(t))
            if not names:
                raise ValueError(f"topicsPattern {opts.pattern!r} matches no topic of {tenant}/{namespace}")
        else:
            assert opts.topics is not None
            names = list(opts.topics)
            if opts.admin_url:
                self._check_exist(names)
        out: set[TopicPartition] = set()
        for name in names:
            tp = TopicPartition.of(name)
            if tp.partition >= 0:
                out.add(tp)
                continue
            for p in self.run(self.client.get_topic_partitions(name)):
                out.add(TopicPartition.of(p) if p != name else TopicPartition(name, name, -1))
        return sorted(out)

    def _check_exist(self, names: list[str]) -> None:
        listed: dict[tuple[str, str, str], tuple[set[str], set[str]]] = {}
        for name in names:
            tn = parse_topic(name)
            ns = (tn.domain, tn.tenant, tn.namespace)
            if ns not in listed:
                listed[ns] = _namespace_topics(self._opts, *ns)
            plain, partitioned = listed[ns]
            tp = TopicPartition.of(name)
            if name in plain or name in partitioned or (tp.partition >= 0 and tp.topic in partitioned):
                continue
            raise ValueError(f"topics: unknown topic {name} (not listed by the admin API at {self._opts.admin_url})")

    # -- positions

    async def _last(self, name: str) -> Position | None:
        r = self._probes.get(name)
        if r is None:
            r = await self.client.create_reader(name, txn.LATEST, receiver_queue_size=1)
            self._probes[name] = r
        return last_position(await r.get_last_message_id())

    async def _time_start(self, name: str, ts: int, last: Position | None) -> Position:
        """The start (exclusive) before ``name``'s first message published at or after ``ts``."""
        if last is None:
            return EARLIEST_POS
        poll = self._opts.poll_timeout_ms
        r = await self.client.create_reader(name, to_message_id(last), start_message_id_inclusive=True,
                                            receiver_queue_size=1)
        try:
            if (await r.read_next(poll)).publish_timestamp() < ts:
                return last  # nothing published since: start at the end
        finally:
            await r.close()
        r = await self.client.create_reader(name, txn.EARLIEST, receiver_queue_size=1)
        try:
            if (await r.read_next(poll)).publish_timestamp() >= ts:
                return EARLIEST_POS  # everything stored is as late (the broker's seek needs an entry before)
            # The broker resumes after the last entry it timed at or before ts - 1. It may time
            # entries by its own clock (broker entry metadata), a little after the publish time:
            # read on past what was published before ts.
            await r.seek(ts - 1)
            prev, m = None, await r.read_next(poll)
            while m.publish_timestamp() < ts:
                prev, m = m, await r.read_next(poll)
        finally:
            await r.close()
        if prev is not None:
            return position_of(prev.message_id())
        ledger, entry, batch = position_of(m.message_id())
        if batch > 0:
            return (ledger, entry, batch - 1)
        return (ledger, entry - 1, -1)  # the end of the entry before (entry -1: before the ledger's first)

    def time_starts(self, names: list[str], ts: int, lasts: dict[str, Position | None]) -> dict[str, Position]:
        """Each partition's start for ``startingTimestamp=ts``."""

        async def all_() -> list[Position]:
            return await asyncio.gather(*(self._time_start(n, ts, lasts[n]) for n in names))

        return dict(zip(names, self.run(all_()), strict=True))

    def last_positions(self, names: list[str]) -> dict[str, Position | None]:
        """Each partition's last deliverable message (None if it has none)."""

        async def all_() -> list[Position | None]:
            return await asyncio.gather(*(self._last(n) for n in names))

        return dict(zip(names, self.run(all_()), strict=True))

    # -- the streaming query's durable subscription

    def hold(self, subscription: str, names: list[str]) -> list[str]:
        """Hold ``subscription`` on each of ``names`` not held yet (an exclusive consumer, created
        at the earliest stored message if new); returns the partitions newly held."""
        new = [n for n in names if n not in self._held]
        if new:

            async def all_() -> None:
                await asyncio.gather(*(self._hold_one(subscription, n) for n in new))

            self.run(all_())
        return new

    async def _hold_one(self, subscription: str, name: str) -> None:
        deadline = time.monotonic() + _BUSY_WAIT_S
        while True:
            try:
                self._held[name] = await self.client.subscribe(
                    name, subscription, consumer_type=txn.ConsumerType.Exclusive,
                    initial_position=txn.InitialPosition.Earliest, receiver_queue_size=1)
                return
            except txn.ConsumerBusy:
                # A driver that just died may still be connected until the broker notices.
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"pulsar source: the subscription {subscription!r} on {name} is held by another consumer "
                        f"for over {_BUSY_WAIT_S:.0f} s: is another query with this checkpoint (or this "
                        "subscription option) running?") from None
                await asyncio.sleep(1.0)

    def mark(self, positions: dict[str, Position]) -> None:
        """Move the held subscription's cursor up to (not including) the entry of each position.

        The broker then keeps that entry and everything after it; moving a cursor back is a no-op.
        """

        async def ack() -> None:
            for name, pos in positions.items():
                consumer = self._held.get(name)
                if consumer is None or pos == EARLIEST_POS:
                    continue
                ledger, entry, _ = pos
                target = txn.MessageId(ledger_id=ledger, entry_id=entry - 1 if entry > 0 else _BEFORE_ENTRY_0)
                consumer.acknowledge_nowait(target, cumulative=True)
                for sub in consumer.topic_consumers:  # send now rather than at the next grouping tick
                    sub.flush_acks()

        self.run(ack())

    def scan(self, starts: dict[str, Position], ends: dict[str, Position], budget: int | None,
             byte_budget: int | None = None) -> dict[str, Position]:
        """Positions at most ``budget`` messages (None: no count cap) and ``byte_budget`` payload
        bytes (None: no byte cap; the first message is taken whatever its size) after ``starts``
        (in total), not beyond ``ends``."""
        return self.run(self._scan(starts, ends, budget, self._opts.poll_timeout_ms, byte_budget))

    async def _scan(self, starts: dict[str, Position], ends: dict[str, Position], budget: int | None,
                    poll_ms: int, byte_budget: int | None = None) -> dict[str, Position]:
        result = dict(starts)
        active = [n for n in sorted(ends) if pos_key(starts[n]) < pos_key(ends[n])]
        readers: dict[str, Any] = {}
        opened: list[Any] = []
        left = budget if budget is not None else 1 << 62
        bytes_left, taken = byte_budget, False
        try:
            while left > 0 and active:
                share, extra = divmod(left, len(active))
                bshare, bextra = divmod(bytes_left, len(active)) if bytes_left is not None else (0, 0)
                still: list[str] = []
                progressed = False
                for i, name in enumerate(active):
                    quota = share + (1 if i < extra else 0)
                    if quota == 0:
                        still.append(name)
                        continue
                    if name not in readers:
                        readers[name] = await self.client.create_reader(
                            name, _start_id(starts[name]), receiver_queue_size=min(max(quota, 10), 1000))
                        opened.append(readers[name])
                    room = None if bytes_left is None else _Room(bshare + (1 if i < bextra else 0), not taken)
                    result[name], done, n = await _take(readers[name], name, result[name], ends[name], quota,
                                                        poll_ms, room=room)
                    left -= n
                    if n:
                        progressed = taken = True
                    if room is not None and bytes_left is not None:
                        bytes_left -= room.spent
                        if room.held is not None:  # did not fit: read again when the budget is shared out anew
                            readers[name] = _Prefixed(readers[name], room.held)
                    if not done:
                        still.append(name)
                active = still
                if bytes_left is not None and not progressed:
                    break  # no partition's next message fits what is left of the byte cap
        finally:
            await asyncio.gather(*(r.close() for r in opened), return_exceptions=True)
        return result


def _stored(text: str, name: str) -> Position:
    return offsets_from_json({name: text}, "range")[name]


def _start_id(pos: Position) -> txn.MessageId:
    return txn.EARLIEST if pos == EARLIEST_POS else to_message_id(pos)


class _Room:
    """What a byte cap leaves one :func:`_take` call: ``bytes`` of payload (``first``: the first
    message is taken even if larger); ``spent`` counts what was taken, ``held`` keeps the message
    that did not fit (already read from the reader)."""

    def __init__(self, size: int, first: bool) -> None:
        self.bytes, self.first, self.spent = size, first, 0
        self.held: txn.Message | None = None

    def admits(self, m: txn.Message) -> bool:
        size = len(m.data())
        if self.spent + size > self.bytes and not (self.first and self.spent == 0):
            self.held = m
            return False
        self.spent += size
        self.first = False
        return True


async def _take(reader: Any, name: str, at: Position, end: Position, limit: int, poll_ms: int,
                sink: list[txn.Message] | None = None, room: _Room | None = None) -> tuple[Position, bool, int]:
    """Read up to ``limit`` messages after ``at`` and not beyond ``end`` (appended to ``sink``),
    and with ``room`` only as many payload bytes as it admits.

    Returns (the position of the last one, whether ``end`` was reached, how many).
    """
    n = 0
    while n < limit:
        try:
            m = await reader.read_next(poll_ms)
        except txn.Timeout:
            raise RuntimeError(
                f"pulsar source: no message from {name} within pollTimeoutMs={poll_ms} ms after position "
                f"{format_position(at)} while reading up to {format_position(end)}") from None
        mid = m.message_id()
        pos = position_of(mid)
        if pos_key(pos) <= pos_key(at):
            continue  # at or before where we are: a redelivery
        if pos_key(pos) > pos_key(end):
            return at, True, n
        if room is not None and not room.admits(m):
            return at, False, n
        at = pos
        n += 1
        if sink is not None:
            sink.append(m)
        if _reached(pos, mid.batch_size, end):
            return at, True, n
    return at, False, n


def _reached(pos: Position, batch_size: int, end: Position) -> bool:
    """True if the message at ``pos`` is the last one of the range ending at ``end``."""
    if pos[:2] != end[:2]:
        return pos_key(pos) >= pos_key(end)
    if end[2] >= 0:
        return pos[2] >= end[2]
    return pos[2] < 0 or (batch_size > 0 and pos[2] >= batch_size - 1)


# ------------------------------------------------------------------------- reading


def _arrow_schema(vs: TopicValueSchema | None = None) -> Any:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema([
        ("key", pa.binary()),
        ("value", pa.binary() if vs is None else vs.arrow_type()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("message_id", pa.string()),
        ("message_id_bytes", pa.binary()),
        ("publish_time", ts),
        ("event_time", ts),
        ("properties", pa.map_(pa.string(), pa.string())),
    ])


class PulsarDataLossError(RuntimeError):
    """The start of a range to read is no longer stored by the broker.

    Attributes: ``topic`` (the partition's full name), ``partition`` (-1 if not partitioned),
    ``start`` and ``end`` (the range ``(start, end]`` in offsets-JSON form) and ``first_stored``
    (the first message still stored after ``start``, or None if there is none).
    """

    def __init__(self, topic: str, partition: int, start: str, end: str, first_stored: str | None) -> None:
        self.topic, self.partition, self.start, self.end, self.first_stored = topic, partition, start, end, first_stored
        super().__init__(data_loss_message(topic, partition, start, end, first_stored))


def data_loss_message(topic: str, partition: int, start: str, end: str, first_stored: str | None) -> str:
    """The facts of a data loss, as :class:`PulsarDataLossError` and the warning state them."""
    if first_stored is None:
        missing = f"every message after {start} is gone (the topic stores nothing from there on)"
    else:
        missing = f"the messages after {start} and before {first_stored} are gone"
    return (f"pulsar source: data loss on {topic} (partition {partition}): {missing}; the range to read was "
            f"({start}, {end}]. The broker no longer stores the start of the range (a ledger trimmed by retention, "
            "the topic deleted and re-created, or the query's subscription skipped, cleared or removed). "
            "Set failOnDataLoss=false to read what is left with a warning instead.")


class _Prefixed:
    """A reader that hands out ``first`` before its own next message."""

    def __init__(self, reader: Any, first: txn.Message | None) -> None:
        self._reader, self._first = reader, first

    async def read_next(self, timeout_millis: int | None = None) -> txn.Message:
        if self._first is not None:
            m, self._first = self._first, None
            return m
        return await self._reader.read_next(timeout_millis)


async def _open_checked(client: txn.AsyncClient, opts: SourceOptions, part: PulsarInputPartition, start: Position,
                        end: Position) -> Any:
    """A reader of ``(start, end]`` that has checked that ``start``'s entry is still stored.

    It reads from ``start``'s entry inclusive: the first message must be in that entry. (Every
    start the source plans is a message it delivered or a partition's last message, and a
    streaming query's subscription holds that entry.) If it is not, the messages between it and
    the first one stored are gone: :class:`PulsarDataLossError`, or a warning with
    ``failOnDataLoss=false`` and the read goes on from the first stored message.
    Returns None if nothing at all is left to read.
    """
    if start == EARLIEST_POS:
        return await client.create_reader(part.name, txn.EARLIEST, receiver_queue_size=1000)
    entry = start[:2]
    reader = await client.create_reader(part.name, txn.MessageId(ledger_id=entry[0], entry_id=entry[1]),
                                        start_message_id_inclusive=True,
                                        receiver_queue_size=1000)
    first: txn.Message | None = None
    last = last_position(await reader.get_last_message_id())
    if last is not None and last[:2] >= entry:
        try:
            first = await reader.read_next(opts.poll_timeout_ms)
        except txn.Timeout:
            await reader.close()
            raise RuntimeError(
                f"pulsar source: no message from {part.name} within pollTimeoutMs={opts.poll_timeout_ms} ms from "
                f"position {format_position(start)} while reading up to {format_position(end)}") from None
        got = position_of(first.message_id())[:2]
        if got == entry or (entry[1] == -1 and got == (entry[0], 0)):  # entry -1: before the ledger's first
            return _Prefixed(reader, first)
    stored = format_position(position_of(first.message_id())) if first is not None else None
    facts = (part.name, part.partition, format_position(start), format_position(end), stored)
    if opts.fail_on_data_loss:
        await reader.close()
        raise PulsarDataLossError(*facts)
    log.warning("%s (failOnDataLoss=false: reading on)", data_loss_message(*facts))
    if first is None:
        await reader.close()
        return None
    return _Prefixed(reader, first)


def read_partition(opts: SourceOptions, part: PulsarInputPartition | None) -> Iterator[Any]:
    """Yield the messages of ``(part.start, part.end]`` as Arrow record batches (runs on executors).

    The task has its own client, on an event-loop thread of its own (one thread hop per
    record batch rather than one per message, as :class:`txn.Client` would); closed at the end.
    A start that is no longer stored raises :class:`PulsarDataLossError` (see ``failOnDataLoss``).
    """
    if part is None:
        return
    start, end = _stored(part.start, part.name), _stored(part.end, part.name)
    if pos_key(start) >= pos_key(end):
        return
    schema = _arrow_schema(opts.value_schema)
    decode = None if opts.value_schema is None else _value_decoder(opts, part.topic)
    conn = _Pulsar(opts)
    try:
        reader = conn.run(_open_checked(conn.client, opts, part, start, end))
        at, done = start, reader is None
        while not done:
            msgs: list[txn.Message] = []
            at, done, _ = conn.run(_take(reader, part.name, at, end, _ROWS_PER_BATCH, opts.poll_timeout_ms, msgs))
            if msgs:
                yield _to_arrow(msgs, part, schema, decode)
    finally:
        conn.close()


def _value_decoder(opts: SourceOptions, topic: str) -> Callable[[txn.Message], Any]:
    """``decode(message)`` -> the ``value`` cell, by the planned schema (``decodeValue``); a message
    that does not decode raises :class:`ValueSchemaError` naming it (the task fails: nothing is skipped)."""
    vs = opts.value_schema
    assert vs is not None

    def writer_definition(version: int) -> str | None:
        got = _registry_get(opts, topic, version)
        return None if got is None else str(got.get("data", ""))

    decode = vs.decoder(writer_definition)

    def decode_message(m: txn.Message) -> Any:
        if m.has_null_value():
            return None
        try:
            return decode(m.data(), _schema_version(m))
        except ValueSchemaError as exc:
            raise ValueSchemaError(f"pulsar source: message {m.message_id()} of {topic} does not decode by the "
                                   f"topic's {vs.kind} schema (decodeValue=true): {exc}") from None
    return decode_message


def _schema_version(m: txn.Message) -> bytes | None:
    return getattr(m, "raw_schema_version", None)  # the metadata's version bytes, None without a schema


def _registry_get(opts: SourceOptions, topic: str, version: int | None = None) -> dict[str, Any] | None:
    """The registry's answer for ``topic``'s schema (latest, or ``version``); None if it has none."""
    assert opts.admin_url
    return registry_get(opts.admin_url, topic, opts.settings().admin_kwargs(), version)


def plan_value_schema(opts: SourceOptions, topics: list[str]) -> TopicValueSchema:
    """The one registered schema of ``topics`` (``decodeValue``); :class:`ValueSchemaError` if one has
    none, its type is not handled, or two differ."""
    found: TopicValueSchema | None = None
    first = ""
    for topic in sorted(set(topics)):
        got = _registry_get(opts, topic)
        if got is None:
            raise ValueSchemaError(f"decodeValue: {topic} has no schema in the broker's registry (produce to it with "
                                   "a schema first, or read the bytes with decodeValue=false)")
        vs = TopicValueSchema.from_registry(topic, got)
        if found is None:
            found, first = vs, topic
        elif not found.same_as(vs):
            raise ValueSchemaError(f"decodeValue: {first} and {topic} have different schemas; one value column "
                                   "needs one schema (read them in separate queries)")
    if found is None:
        raise ValueSchemaError("decodeValue: the query matches no topic")
    return found


def _to_arrow(msgs: list[txn.Message], part: PulsarInputPartition, schema: Any,
              decode: Callable[[txn.Message], Any] | None = None) -> Any:
    import pyarrow as pa

    cols: list[list[Any]] = [[] for _ in range(len(schema))]
    key, value, topic, partition, mid_s, mid_b, publish, event, props = cols
    for m in msgs:
        mid = m.message_id()
        full = txn.MessageId(part.partition, mid.ledger_id(), mid.entry_id(), mid.batch_index(),
                             batch_size=mid.batch_size)
        k = m.partition_key() if m.has_partition_key() else None  # partition_key() is "" for none
        et = m.event_timestamp()
        key.append(k.encode() if k is not None else None)
        value.append(m.data() if decode is None else decode(m))
        mid_s.append(str(full))
        mid_b.append(full.serialize())
        publish.append(m.publish_timestamp() * 1000)
        event.append(et * 1000 if et else None)
        props.append(list(m.properties().items()))
    topic.extend([part.topic] * len(msgs))
    partition.extend([part.partition] * len(msgs))
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                                      schema=schema)


# -------------------------------------------------------------------------- Spark


def _spec_for(spec: str | dict[str, Position | str] | None, name: str, unset: str, missing: str) -> Position | str:
    """``name``'s position in an offsets option: ``unset`` without the option, ``missing`` when
    its JSON does not name the partition."""
    if spec is None:
        return unset
    if isinstance(spec, str):
        return spec
    return spec.get(name, missing)


def _check_keys(spec: str | dict[str, Position | str] | None, option: str, tps: list[TopicPartition]) -> None:
    if not isinstance(spec, dict):
        return
    known = {tp.name for tp in tps}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise ValueError(f"{option} names {', '.join(unknown)}, not among the topic partitions read: "
                         f"{', '.join(sorted(known))}")


def _start_position(spec: Position | str, last: Position | None) -> Position:
    if spec == EARLIEST:
        return EARLIEST_POS
    if spec == LATEST:
        return last if last is not None else EARLIEST_POS
    return spec  # type: ignore[return-value]


def _cuts(part: PulsarInputPartition) -> list[Position]:
    """Where ``part``'s range can be cut: the ends of the entries inside it, in its end's ledger
    (and the position before that ledger's first entry when the range starts in an earlier one)."""
    start, end = _stored(part.start, part.name), _stored(part.end, part.name)
    ledger = end[0]
    if start[0] == ledger:
        first = start[1]
    elif start == EARLIEST_POS:
        first = 0  # whether earlier ledgers hold anything is not known: no cut before this one's first entry
    else:
        first = -1
    cuts = [(ledger, k, -1) for k in range(first, end[1])]
    return [c for c in cuts if pos_key(start) < pos_key(c) < pos_key(end)]


def split_ranges(parts: list[PulsarInputPartition], want: int | None) -> list[PulsarInputPartition]:
    """``parts`` cut into at least ``want`` ranges where :func:`_cuts` allows (``minPartitions``),
    each range into pieces of about the same number of entries, longer ranges into more."""
    if want is None or len(parts) >= want:
        return parts
    cuts = [_cuts(p) for p in parts]
    total = sum(len(c) for c in cuts)
    if total == 0:
        return parts
    extra = min(want - len(parts), total)
    share = [extra * len(c) // total for c in cuts]
    for i in sorted(range(len(parts)), key=lambda i: -(extra * len(cuts[i]) % total))[:extra - sum(share)]:
        share[i] += 1
    out: list[PulsarInputPartition] = []
    for p, c, n in zip(parts, cuts, share, strict=True):
        chosen = [c[(j * (len(c) + 1)) // (n + 1) - 1] for j in range(1, n + 1)] if n else []
        bounds = [p.start, *(format_position(x) for x in chosen), p.end]
        out += [PulsarInputPartition(p.name, p.topic, p.partition, a, b)
                for a, b in zip(bounds, bounds[1:], strict=False)]
    return out


class PulsarBatchReader(DataSourceReader):
    """Batch reads: the ranges are fixed when the query is planned."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        planner = _Pulsar(opts)
        try:
            tps = planner.resolve()
            _check_keys(opts.starting, "startingOffsets", tps)
            _check_keys(opts.ending, "endingOffsets", tps)
            lasts = planner.last_positions([tp.name for tp in tps])
            timed = (planner.time_starts([tp.name for tp in tps], opts.starting_timestamp, lasts)
                     if opts.starting_timestamp is not None else {})
        finally:
            planner.close()
        out: list[InputPartition] = []
        for tp in tps:
            last = lasts[tp.name]
            if last is None:
                continue
            start = timed.get(tp.name) or _start_position(_spec_for(opts.starting, tp.name, EARLIEST, EARLIEST), last)
            end_spec = _spec_for(opts.ending, tp.name, LATEST, LATEST)
            end = last if end_spec == LATEST else min(end_spec, last, key=pos_key)  # type: ignore[arg-type]
            if pos_key(start) < pos_key(end):
                out.append(PulsarInputPartition(tp.name, tp.topic, tp.partition, format_position(start),
                                                format_position(end)))
        return split_ranges(out, opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)  # type: ignore[arg-type]


class PulsarStreamReader(DataSourceStreamReader):
    """Micro-batch reads. An offset is ``{topic partition: position}`` (the offsets JSON form),
    the position of the last message a micro-batch includes; new partitions (a partitioned
    topic grown, a new topic matching ``topicsPattern``) are picked up every
    ``partitionDiscoveryIntervalMs`` and read from ``earliest``.

    ``latestOffset()`` gets no start offset from Spark, so the reader remembers where the next
    micro-batch starts: the end of the last planned range (``partitions(start, end)``; Spark
    also calls it with ``(latest, latest)`` when a query restarts from its checkpoint), else
    the initial offset.

    Every offset also names the query's durable subscription (``"subscription"``): it is held
    on every partition from ``initialOffset()`` (or from discovery, for a new partition; or from
    the first ``partitions()`` after a restart), and ``commit(end)`` moves its cursor to ``end``.
    """

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._planner: _Pulsar | None = None
        self._initial: dict[str, str] | None = None
        self._next_start: dict[str, str] | None = None
        self._tps: list[TopicPartition] = []
        self._tps_at = float("-inf")
        self._subscription: str | None = opts.subscription

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_planner": None, "_initial": None, "_next_start": None, "_tps": [],
                "_tps_at": float("-inf"), "_subscription": None}

    def _positions(self, offset: dict, what: str) -> dict[str, Position]:
        """The partition positions of a Spark offset; learns the subscription's name from it."""
        name, rest = split_offset(offset)
        if self._subscription is None:
            self._subscription = name  # None for a checkpoint written before subscriptions
        return offsets_from_json(rest, what)

    def _offset(self, positions: Mapping[str, Position]) -> dict[str, str]:
        out = offsets_to_json(positions)
        out[SUBSCRIPTION_KEY] = self._sub_name()
        return out

    def _sub_name(self) -> str:
        if self._subscription is None:
            self._subscription = new_subscription_name()
        return self._subscription

    def _resolve(self) -> list[TopicPartition]:
        now = time.monotonic()
        if now - self._tps_at >= self.opts.discovery_interval_ms / 1000:
            self._tps, self._tps_at = self._p().resolve(), now
        return self._tps

    def _p(self) -> _Pulsar:
        if self._planner is None:
            self._planner = _Pulsar(self.opts)
        return self._planner

    def initialOffset(self) -> dict:
        if self._initial is None:
            planner = self._p()
            tps = self._resolve()
            _check_keys(self.opts.starting, "startingOffsets", tps)
            # Subscribe first: from then on the broker keeps everything the query may read.
            planner.hold(self._sub_name(), [tp.name for tp in tps])
            lasts = planner.last_positions([tp.name for tp in tps])
            starts = {
                tp.name: _start_position(_spec_for(self.opts.starting, tp.name, LATEST, EARLIEST), lasts[tp.name])
                for tp in tps
            }
            if self.opts.starting_timestamp is not None:
                starts = planner.time_starts([tp.name for tp in tps], self.opts.starting_timestamp, lasts)
            planner.mark(starts)
            self._initial = self._offset(starts)
        return dict(self._initial)

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        # ``start``/``limit``: the admission-control form of later Spark versions (SPARK-55304);
        # Spark 4.1 calls latestOffset() without arguments.
        if start is None:
            start = self._next_start if self._next_start is not None else self.initialOffset()
        start = self._positions(start, "start offset")
        read_all = type(limit).__name__ == "ReadAllAvailable"
        cap = None if read_all else self.opts.max_per_trigger
        byte_cap = None if read_all else self.opts.max_bytes_per_trigger
        planner = self._p()
        tps = self._resolve()
        planner.hold(self._sub_name(), [tp.name for tp in tps])  # a new partition is held from discovery on
        lasts = planner.last_positions([tp.name for tp in tps])
        grown: dict[str, Position] = {}
        for tp in tps:
            last = lasts[tp.name]
            if last is not None and pos_key(last) > pos_key(start.get(tp.name, EARLIEST_POS)):
                grown[tp.name] = last
        if grown and (cap is not None or byte_cap is not None):
            grown = planner.scan({n: start.get(n, EARLIEST_POS) for n in grown}, grown, cap, byte_cap)
        ends = dict(start)
        for n, p in grown.items():
            if n in start or p != EARLIEST_POS:  # a new partition joins once it has something to read
                ends[n] = p
        return self._offset(ends)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        s = self._positions(start, "start offset")
        e = self._positions(end, "end offset")
        self._next_start = self._offset(e)
        # After a restart: hold the subscription again (re-created if it was dropped) and move
        # it up to the committed start (a no-op for a cursor that is already there).
        held = self._p().hold(self._sub_name(), sorted(e))
        if held:
            self._p().mark({n: s.get(n, EARLIEST_POS) for n in held})
        out: list[InputPartition] = []
        for name in sorted(e):
            a = s.get(name, EARLIEST_POS)
            if pos_key(a) < pos_key(e[name]):
                tp = TopicPartition.of(name)
                out.append(PulsarInputPartition(name, tp.topic, tp.partition, format_position(a),
                                                format_position(e[name])))
        return split_ranges(out, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.opts, partition)  # type: ignore[arg-type]

    def commit(self, end: dict) -> None:
        """Move the subscription's cursor to ``end``: the broker may free what the query committed.

        A failure here only delays that (the next commit moves the cursor further), so it is
        logged, not raised.
        """
        e = self._positions(end, "end offset")
        try:
            self._p().hold(self._sub_name(), sorted(e))
            self._p().mark(e)
        except (txn.PulsarError, TimeoutError, OSError, RuntimeError) as exc:
            log.warning("pulsar source: could not move subscription %r to the committed offsets %s: %s; the broker "
                        "keeps their data until a later commit", self._subscription, offsets_to_json(e), exc)

    def stop(self) -> None:
        if self._planner is not None:
            planner, self._planner = self._planner, None
            planner.close()


class PulsarDataSource(DataSource):
    """``spark.read.format("pulsar")`` / ``spark.readStream.format("pulsar")``."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed = SourceOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "pulsar"

    def _planned(self) -> SourceOptions:
        """The options with the topics' value schema fetched (``decodeValue``; once per instance)."""
        opts = self.parsed
        if opts.decode_value and opts.value_schema is None:
            conn = _Pulsar(opts)
            try:
                topics = [tp.topic for tp in conn.resolve()]
            finally:
                conn.close()
            opts = self.parsed = dataclasses.replace(opts, value_schema=plan_value_schema(opts, topics))
        return opts

    def schema(self) -> StructType:
        vs = self._planned().value_schema
        if vs is None:
            return SCHEMA
        return StructType([StructField("value", vs.spark_type()) if f.name == "value" else f for f in SCHEMA.fields])

    def _checked(self, schema: StructType) -> SourceOptions:
        opts = self._planned()
        if opts.value_schema is not None and schema["value"].dataType != opts.value_schema.spark_type():
            raise ValueSchemaError("decodeValue: the topics' schema changed since the query was planned; "
                                   "plan the query again")
        return opts

    def reader(self, schema: StructType) -> DataSourceReader:
        return PulsarBatchReader(self._checked(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.parsed.ending is not None:
            raise ValueError("endingOffsets is for batch queries only; a streaming query reads on and on")
        return PulsarStreamReader(self._checked(schema))


__all__ = ["SCHEMA", "PulsarDataLossError", "PulsarDataSource", "PulsarInputPartition", "SourceOptions",
           "TopicPartition", "data_loss_message"]
