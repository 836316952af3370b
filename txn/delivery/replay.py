"""Exactly-once replay of a parked batch.

One transaction acknowledges the batch's messages on the parking topic (subscription
``pulsar-txn-replay``), produces the handler's outputs, and writes a ``REPLAYED`` ledger record.
A batch that already has a ``REPLAYED`` record is not replayed again; two concurrent replays
of one batch conflict on the parked messages' acks, so at most one commits.

The code that runs comes from the caller only (``handler``, or a Spark ``transform`` spec), never
from the ledger: a record names its job, nothing else. So does the output topic. A caller that
serves others (the control plane) also passes what the job may touch: ``job``, ``parked_topics``
and ``allowed_outputs`` are checked before anything is written. Any failure of the caller's
code, ``BaseException`` included (``SystemExit``, ``KeyboardInterrupt``), is a
:class:`ReplayError`: it fails the replay, never the process.

Finding the batch's records (see :mod:`txn.delivery.ledger_reader`): a caller that keeps an
index of the ledger (the control plane) passes the batch's ``records`` and the position
``records_until`` up to which they are complete; the replay then reads only the ledger after that
position. Without ``records`` it reads the ledger once from the start, parsing only the records
keyed by this batch id (the CLI).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..bridge import run_blocking
from ..client import AsyncClient
from ..consumer import ConsumerType, InitialPosition
from ..consumer.topic_consumer import get_schema
from ..errors import Timeout
from ..message import Message, MessageId
from ..schema import Schema
from ..topic import parse_topic
from .batch_txn import BatchScope
from .ledger import Kind, LedgerRecord, RecordConfig, now_ms
from .ledger_reader import batch_records, read_records
from .output import Output, normalise
from .processor import PARK_BATCH, PARK_PROPS, PARK_SCHEMA_VERSION, PARK_SOURCE_TOPIC

REPLAY_SUBSCRIPTION = "pulsar-txn-replay"

#: A runtime's ``(transform spec, messages) -> outputs``, e.g. ``spark_jobs.runtime.replay_outputs``.
#: The caller passes it with a ``transform``: the runtime lives in a higher layer, and the library
#: never loads code by a name it did not get from its caller.
Replayer = Callable[[str, list[Message]], list[Output]]


class ReplayError(Exception):
    """The batch cannot be replayed (unknown, not parked, no handler, the handler failed...)."""


def guarded(what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``; any exception it raises, ``BaseException`` included, becomes a
    :class:`ReplayError` naming ``what`` (so a handler's ``sys.exit()`` fails a replay, not the
    process). Cancellation of the calling task is not affected: this runs the call directly."""
    try:
        return fn(*args)
    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt, GeneratorExit too
        raise ReplayError(f"{what} failed: {type(exc).__name__}: {exc}") from exc


@dataclass(slots=True)
class ReplayResult:
    """What a replay did."""

    batch_id: str
    replayed: bool
    message: str
    txn_id: str | None = None
    messages: int = 0
    outputs: dict[str, int] = field(default_factory=dict)


async def read_ledger(client: AsyncClient, ledger_topic: str, idle_ms: int = 1500) -> list[LedgerRecord]:
    """Every record in ``ledger_topic``, oldest first, up to its end as of now (read with a Reader;
    messages that are not records of a schema we understand are skipped)."""
    return await read_records(client, ledger_topic, idle_ms=idle_ms)


async def replay_batch(
    client: AsyncClient,
    batch_id: str,
    ledger_topic: str,
    handler: Callable[[Message], Any] | None = None,
    output: str | None = None,
    txn_timeout_ms: int = 60000,
    idle_ms: int = 2000,
    *,
    transform: str | None = None,
    replayer: Replayer | None = None,
    job: str | None = None,
    parked_topics: Collection[str] | None = None,
    allowed_outputs: Collection[str] | None = None,
    timeout_ms: int | None = None,
    records: Sequence[LedgerRecord] | None = None,
    records_until: MessageId | None = None,
    input_schema: Schema | None = None,
    output_schema: Schema | None = None,
) -> ReplayResult:
    """Replay the parked messages of ``batch_id`` exactly once (see the module docs).

    Give ``handler`` (called per message) or ``transform`` (a Spark transform's ``module:function``,
    run by ``replayer``, e.g. ``spark_jobs.runtime.replay_outputs``),
    and ``output`` for outputs that name no topic. ``job``: the batch must be that job's;
    ``parked_topics``: its parked messages must be on these; ``allowed_outputs``: its outputs may go
    only there (each a :class:`ReplayError` otherwise, before anything is written). ``txn_timeout_ms``
    bounds the wait for the parked messages and is the transaction's timeout; ``timeout_ms``, its
    earlier name, is still accepted and wins when given.

    ``records``: the batch's records as far as the caller knows them, complete up to ledger
    position ``records_until`` (the ledger is read only after it; without ``records_until`` they
    are taken as complete). Without ``records`` the ledger is read from the start.

    ``input_schema`` and ``output_schema``: the processor's (``ProcessorConfig``); the handler's
    ``message.value()`` decodes by the input schema, by the version the input was first written
    with, and values it returns are encoded by the output schema."""
    if timeout_ms is not None:
        txn_timeout_ms = timeout_ms
    if handler is None and transform is None:
        raise ReplayError(f"batch {batch_id}: no handler given (a replay runs only the code its caller names, "
                          "never code named by a ledger record)")
    if transform is not None and replayer is None:
        raise ReplayError(f"batch {batch_id}: a transform replay needs its runtime's replayer (e.g. "
                          "replayer=spark_jobs.runtime.replay_outputs)")
    if records is None:
        records = await batch_records(client, ledger_topic, batch_id, idle_ms=idle_ms, verify_txn=True)
    else:
        records = [r for r in records if r.batch_id == batch_id]
        if records_until is not None:
            records += await batch_records(client, ledger_topic, batch_id, after=records_until, idle_ms=idle_ms,
                                           verify_txn=True)
    if not records:
        raise ReplayError(f"batch {batch_id!r} is not in the ledger {ledger_topic}")
    done = [r for r in records if r.kind == Kind.REPLAYED]
    if done:
        return ReplayResult(batch_id, False, f"batch {batch_id} was already replayed in transaction {done[0].txn_id}; "
                            "nothing to do", done[0].txn_id)
    parked = [r for r in records if r.kind == Kind.PARKED]
    if not parked:
        kinds = ",".join(sorted({r.kind for r in records}))
        raise ReplayError(f"batch {batch_id} has no parked messages (its records: {kinds}); aborted inputs go back "
                          "to the subscription and are reprocessed automatically")
    if job is not None and any(r.job != job for r in records):
        raise ReplayError(f"batch {batch_id} in {ledger_topic} is not a batch of job {job!r}")
    topics = sorted({r.parked_topic for r in parked if r.parked_topic})
    if parked_topics is not None and not set(topics) <= set(parked_topics):
        raise ReplayError(f"batch {batch_id}: its parking topic(s) {topics} are not among the job's "
                          f"{sorted(parked_topics)}")
    if not topics:
        raise ReplayError(f"batch {batch_id}: its PARKED record names no parking topic")
    out_topic = str(parse_topic(output)) if output else None
    batch_outputs = None
    if transform is not None:
        run = replayer
        assert run is not None
        batch_outputs = lambda msgs: guarded(f"transform {transform}", run, transform, msgs)  # noqa: E731
    want = sum(sum(r.outputs.values()) for r in parked)
    consumer = await client.subscribe(topics, REPLAY_SUBSCRIPTION, consumer_type=ConsumerType.Shared,
                                      initial_position=InitialPosition.Earliest)
    try:
        msgs: list[Message] = []
        deadline = time.monotonic() + txn_timeout_ms / 1000
        while len(msgs) < want and time.monotonic() < deadline:
            try:
                m = await consumer.receive(timeout_millis=idle_ms)
            except Timeout:
                break
            if m.properties().get(PARK_BATCH) == batch_id:
                msgs.append(m)
        if not msgs:
            raise ReplayError(f"batch {batch_id}: its parked messages are not on {topics} (already replayed?)")
        started = now_ms()
        # The transform runs before the transaction opens: it may be slow (a Spark runtime
        # starting up), and the transaction's timeout should only cover the writes.
        loop = asyncio.get_running_loop()
        originals = [_as_original(m) for m in msgs]
        if input_schema is not None:
            originals = [await _with_schema(client, o, m, input_schema) for o, m in zip(originals, msgs, strict=True)]
        encode = None if output_schema is None else output_schema.encode
        if batch_outputs is not None:
            outputs = await loop.run_in_executor(None, batch_outputs, originals)
        else:
            outputs = []
            for original in originals:
                got = await loop.run_in_executor(None, guarded, "the handler", handler, original)
                # Iterating the result runs the handler's generator, if it returned one: off the loop too.
                outputs.extend(await loop.run_in_executor(None, guarded, "the handler's result",
                                                          functools.partial(normalise, encode=encode), got))
        for o in outputs:
            topic = o.topic or out_topic
            if topic is None:
                raise ReplayError(f"batch {batch_id}: an output names no topic and no output topic was given")
            if allowed_outputs is not None and str(parse_topic(topic)) not in allowed_outputs:
                raise ReplayError(f"batch {batch_id}: an output goes to {topic}, which the job may not write to")
        cfg = RecordConfig(transform=transform) if transform is not None else RecordConfig(
            handler=getattr(handler, "__qualname__", "?"))
        ledger = await client.create_producer(ledger_topic)
        scope = BatchScope(client, parked[-1].job, ledger, txn_timeout_ms, record_config=lambda: cfg)
        counts: dict[str, int] = {}
        producers: dict[str, Any] = {}
        try:
            bt = await scope.open(batch_id, 1, started_at_ms=started)
            t = bt.t
            try:
                for o in outputs:
                    topic = o.topic or out_topic
                    if topic not in producers:
                        producers[topic] = await client.create_producer(topic, block_if_queue_full=True,
                                                                        schema=output_schema)
                    await producers[topic].send_async(o.content, properties=o.properties,
                                                      partition_key=o.partition_key, txn=t, encoded=True)
                    counts[topic] = counts.get(topic, 0) + 1
                await consumer.acknowledge_many(msgs, t)
                inputs: dict[str, list[str]] = {}
                for m in msgs:
                    inputs.setdefault(m.topic_name(), []).append(str(m.message_id()))
                await bt.write(Kind.REPLAYED, inputs=inputs, outputs=counts, replay_of=batch_id, with_config=True)
                await bt.commit()
            except BaseException:
                await t.abort_if_open()
                raise
        finally:
            for p in producers.values():
                await p.close()
            await ledger.close()
        return ReplayResult(batch_id, True, f"replayed {len(msgs)} message(s) of batch {batch_id} in transaction "
                            f"{t.id}", str(t.id), len(msgs), counts)
    finally:
        await consumer.close()


def _as_original(m: Message) -> Message:
    """The parked message as the handler first saw it: source topic, original properties."""
    props = {k: v for k, v in m.properties().items() if k not in PARK_PROPS}
    return Message(m.data(), props, m.message_id(), m.properties().get(PARK_SOURCE_TOPIC, m.topic_name()),
                   m.partition_key() or None, m.publish_timestamp(), m.event_timestamp(), m.redelivery_count(),
                   m.producer_name(), m.sequence_id(), None)


class _Decoded(Message):
    """A replayed input whose ``value()`` decodes by the processor's input schema."""

    __slots__ = ("_schema", "_version")

    def __init__(self, original: Message, schema: Schema, version: bytes | None) -> None:
        super().__init__(original.data(), original.properties(), original.message_id(), original.topic_name(),
                         original.partition_key() or None, original.publish_timestamp(),
                         original.event_timestamp(), original.redelivery_count(), original.producer_name(),
                         original.sequence_id(), None)
        self._schema, self._version = schema, version

    def value(self) -> Any:
        if self._version is None:
            return self._schema.decode(self.data())
        return self._schema.decode_version(self.data(), self.topic_name(), self._version)

    def schema_version(self) -> str:
        return "" if self._version is None else self._version.decode("utf-8", "surrogateescape")


async def _with_schema(client: AsyncClient, original: Message, parked: Message, schema: Schema) -> Message:
    """``original`` decoding by ``schema``, by the version the parked input was written with."""
    text = parked.properties().get(PARK_SCHEMA_VERSION)
    try:
        version = bytes.fromhex(text) if text else None
    except ValueError:
        raise ReplayError(f"parked message {parked.message_id()}: {PARK_SCHEMA_VERSION}={text!r} is not hex") from None
    topic = original.topic_name()
    if version is not None and schema.needs_writer(topic, version):
        wire = await get_schema(client.context, topic, version)
        if wire is not None:
            schema.add_writer(topic, version, int(wire.type), wire.schema_data.decode())
    return _Decoded(original, schema, version)


def replay(service_url: str, batch_id: str, ledger_topic: str, handler: Callable[[Message], Any] | None = None,
           output: str | None = None, *, transform: str | None = None, replayer: Replayer | None = None,
           input_schema: Schema | None = None, output_schema: Schema | None = None,
           **client_kwargs: Any) -> ReplayResult:
    """Blocking form of :func:`replay_batch`."""

    async def main() -> ReplayResult:
        async with AsyncClient(service_url, **client_kwargs) as client:
            return await replay_batch(client, batch_id, ledger_topic, handler, output, transform=transform,
                                      replayer=replayer, input_schema=input_schema, output_schema=output_schema)

    return run_blocking(main(), "replay()")
