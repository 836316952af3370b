"""Argument checks made up front, with the exception the official client raises (``ValueError``).

The official ``pulsar`` package checks the type of each argument before it calls into its C++
core; a wrong type raises ``ValueError`` there, not a ``TypeError`` from deep inside. These
helpers do the same for the arguments ``txn`` shares with it.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

_Kind = type | tuple[type, ...]


def _name(kind: _Kind) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def check_type(kind: _Kind, value: Any, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is an instance of ``kind``."""
    if not isinstance(value, kind):
        raise ValueError(f"argument {name} must be of type {_name(kind)}, not {type(value).__name__}")


def check_type_or_none(kind: _Kind, value: Any, name: str) -> None:
    """Raise ``ValueError`` unless ``value`` is None or an instance of ``kind``."""
    if value is not None and not isinstance(value, kind):
        raise ValueError(f"argument {name} must be None or of type {_name(kind)}, not {type(value).__name__}")


def check_send(properties: Any, partition_key: Any, ordering_key: Any, sequence_id: Any,
               event_timestamp: Any) -> None:
    """The checks of ``Producer.send``'s message arguments."""
    check_type_or_none(dict, properties, "properties")
    check_type_or_none(str, partition_key, "partition_key")
    check_type_or_none(str, ordering_key, "ordering_key")
    check_type_or_none(int, sequence_id, "sequence_id")
    check_type_or_none(int, event_timestamp, "event_timestamp")


def deliver_time(deliver_at: Any, deliver_after: Any) -> int | None:
    """Check ``send``'s ``deliver_at`` (ms since the epoch) and ``deliver_after`` (a ``timedelta``)
    as the official client does; the delivery time in ms, or None (``deliver_after`` wins)."""
    check_type_or_none(int, deliver_at, "deliver_at")
    check_type_or_none(timedelta, deliver_after, "deliver_after")
    if deliver_after:
        return int(time.time() * 1000) + deliver_after // timedelta(milliseconds=1)
    return deliver_at or None


#: A number of seconds or milliseconds: the official client wants an int; ``txn`` also takes a float.
NUMBER = (int, float)
