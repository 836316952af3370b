"""The demo's data: generated sales events, what their windowed aggregates must be, and the check.

Events are ``<key>,<amount>`` messages with an event time, spread over two input topics and a
minute of event time (six 10-second windows, four keys). The Spark job emits, per micro-batch,
one ``{"window_start", "window_end", "key", "count", "sum"}`` row per (window, key) it saw;
:func:`check_outputs` merges those partial aggregates and compares them with the aggregates
computed here from the generated events — they must be equal exactly: an event lost, or
counted twice (a batch committed twice), shows as a wrong count and sum.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: The job's window (``spark_jobs.jobs.windowed_counts.WINDOW``), in seconds.
WINDOW_S = 10
KEYS = ("apples", "pears", "plums", "figs")
#: Property (and value) of the event the transient fault is injected on (see spark_jobs.jobs.demo_job).
INJECT_PROP = "demo.inject"
INJECT_FAULT = "fault"

Aggregates = dict[tuple[str, str], tuple[int, int]]  # (window start, key) -> (count, sum)


@dataclass(frozen=True, slots=True)
class Event:
    """One generated sales event."""

    topic: int  # index into the input topics
    key: str
    amount: int  # negative: a refund (the job's bug makes it a poison message)
    event_ms: int
    fault: bool = False  # the transient fault fires on this event

    def value(self) -> bytes:
        return f"{self.key},{self.amount}".encode()

    def properties(self) -> dict[str, str] | None:
        return {INJECT_PROP: INJECT_FAULT} if self.fault else None


def base_time_ms(now_ms: int | None = None) -> int:
    """The start of the minute before ``now`` (event times are the last minute's)."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return now - now % 60_000 - 60_000


def generate(seed: int, base_ms: int, per_topic: int, topics: int = 2, span_s: int = 60) -> list[Event]:
    """``per_topic`` events per topic, random keys, amounts 1..100 and event times in ``span_s``."""
    rng = random.Random(seed)
    return [Event(t, rng.choice(KEYS), rng.randint(1, 100), base_ms + rng.randrange(span_s * 1000))
            for t in range(topics) for _ in range(per_topic)]


def phase_one(seed: int, base_ms: int, per_topic: int) -> list[Event]:
    """The bulk of the data; one event (a third into the first topic) carries the injected fault."""
    events = generate(seed, base_ms, per_topic)
    i = per_topic // 3
    e = events[i]
    events[i] = Event(e.topic, e.key, e.amount, e.event_ms, fault=True)
    return events


def phase_two(seed: int, base_ms: int) -> list[Event]:
    """A late event and a refund (the poison), published together so they make one batch."""
    late = generate(seed + 1, base_ms, 1)[0]
    return [late, Event(1, "pears", -12, base_ms + 25_500)]


def window_start(ms: int) -> str:
    """The UTC start of the ``WINDOW_S`` window holding ``ms``, formatted as the job formats it."""
    start = ms - ms % (WINDOW_S * 1000)
    return dt.datetime.fromtimestamp(start / 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def expected_aggregates(events: Iterable[Event]) -> Aggregates:
    """Count and sum per (window, key) over ``events``."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for e in events:
        k = (window_start(e.event_ms), e.key)
        n, s = out.get(k, (0, 0))
        out[k] = (n + 1, s + e.amount)
    return out


def publish(service_url: str, topics: list[str], events: list[Event], timeout_s: float = 60) -> None:
    """Produce ``events`` (plain, non-transactional sends) with the project's client."""
    import txn

    errors: list[str] = []

    def done(res: Any, _mid: Any) -> None:
        if res != txn.Result.Ok:
            errors.append(str(res))

    with txn.Client(service_url, operation_timeout_seconds=int(timeout_s)) as client:
        producers = [client.create_producer(t, block_if_queue_full=True) for t in topics]
        for e in events:
            producers[e.topic].send_async(e.value(), done, properties=e.properties(), partition_key=e.key,
                                          event_timestamp=e.event_ms)
        for p in producers:
            p.flush()
            p.close()
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(events)} sends failed: {errors[0]}")


def read_outputs(service_url: str, topic: str, expect: int, timeout_s: float = 60) -> list[bytes]:
    """Every message of ``topic`` read with the official client (read-committed): at least the ``expect``
    the ledger announces, then whatever else is there."""
    import pulsar

    client = pulsar.Client(service_url, operation_timeout_seconds=int(timeout_s),
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    out: list[bytes] = []
    try:
        reader = client.create_reader(topic, pulsar.MessageId.earliest)
        deadline = time.monotonic() + timeout_s
        while len(out) < expect and time.monotonic() < deadline:
            try:
                out.append(reader.read_next(timeout_millis=5000).data())
            except pulsar.Timeout:
                continue
        while reader.has_message_available():  # anything beyond what the ledger says was committed
            try:
                out.append(reader.read_next(timeout_millis=3000).data())
            except pulsar.Timeout:
                break
        reader.close()
    finally:
        client.close()
    return out


@dataclass
class Check:
    """The outcome of :func:`check_outputs`."""

    passed: bool
    output_messages: int
    ledger_outputs: int
    windows_keys: int
    events: int
    events_counted: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    unreadable: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check_outputs(raw: list[bytes], expected: Aggregates, ledger_outputs: int) -> Check:
    """Merge the partial aggregates in ``raw`` and compare with ``expected``; the number of messages must
    also be what the ledger says the committed (and replayed) batches produced."""
    merged: dict[tuple[str, str], tuple[int, int]] = {}
    unreadable = 0
    for data in raw:
        try:
            r = json.loads(data)
            k, n, s = (str(r["window_start"]), str(r["key"])), int(r["count"]), int(r["sum"])
        except (ValueError, KeyError, TypeError):
            unreadable += 1
            continue
        n0, s0 = merged.get(k, (0, 0))
        merged[k] = (n0 + n, s0 + s)
    name = "{0[0]} {0[1]}".format
    missing = [name(k) for k in sorted(expected.keys() - merged.keys())]
    unexpected = [name(k) for k in sorted(merged.keys() - expected.keys())]
    wrong = [f"{name(k)}: count/sum {merged[k][0]}/{merged[k][1]}, expected {expected[k][0]}/{expected[k][1]}"
             for k in sorted(expected.keys() & merged.keys()) if merged[k] != expected[k]]
    events = sum(n for n, _ in expected.values())
    counted = sum(n for n, _ in merged.values())
    passed = (not missing and not unexpected and not wrong and not unreadable and counted == events
              and len(raw) == ledger_outputs)
    return Check(passed, len(raw), ledger_outputs, len(expected), events, counted, missing, unexpected, wrong,
                 unreadable)
