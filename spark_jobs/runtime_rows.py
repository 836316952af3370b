"""Rows of the runtime on the driver: input messages as the ``pulsar`` source's rows, result rows as outputs.

Shared by the in-driver runtime (:class:`spark_jobs.runtime.SparkProcessor`), replay
(:func:`spark_jobs.runtime.replay_outputs`) and the distributed driver's narrowing of a batch
entry (:mod:`spark_jobs.runtime_driver`); below all three, so none imports another for them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from txn import Message
from txn.delivery.output import Output
from txn.topic import parse_topic

__all__ = ["message_row", "messages_schema", "to_outputs"]

_UTC = dt.UTC


def messages_schema() -> Any:
    """The Spark schema of a micro-batch's input DataFrame: the ``pulsar`` source's columns."""
    from .source import SCHEMA

    return SCHEMA


def message_row(m: Message) -> tuple[Any, ...]:
    """One message as a row of :func:`messages_schema` (key, value, topic, partition, message_id,
    publish_time, event_time, properties)."""
    t = parse_topic(m.topic_name())
    mid = m.message_id()
    key = m.partition_key() if m.has_partition_key() else None
    et = m.event_timestamp()
    return (
        key.encode() if key is not None else None,
        m.data(),
        t.base,
        t.partition_index,
        str(mid),
        mid.serialize(),
        dt.datetime.fromtimestamp(m.publish_timestamp() / 1000, _UTC),
        dt.datetime.fromtimestamp(et / 1000, _UTC) if et else None,
        dict(m.properties()),
    )


def to_outputs(rows: list[Any]) -> list[Output]:
    """Turn result rows into :class:`Output` (``value`` required; ``key``, ``topic``, ``properties`` optional)."""
    out: list[Output] = []
    for r in rows:
        d = r.asDict() if hasattr(r, "asDict") else dict(r)
        if "value" not in d:
            raise ValueError("the transform's result needs a 'value' column (binary or string)")
        v = d["value"]
        content = v.encode() if isinstance(v, str) else bytes(v) if v is not None else b""
        k = d.get("key")
        key = k.decode() if isinstance(k, (bytes, bytearray)) else (str(k) if k is not None else None)
        props = d.get("properties")
        out.append(Output(content, topic=d.get("topic") or None,
                          properties={str(a): str(b) for a, b in props.items()} if props else None,
                          partition_key=key))
    return out
