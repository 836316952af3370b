"""Positions and the offsets JSON of the ``pulsar`` Spark source.

A *position* names one message of a topic partition: ``(ledger, entry, batch_index)``.
``batch_index`` is the message's index inside a batch entry, or ``-1`` for "the whole entry"
(a message that is not batched, or every message of a batch entry). Positions order by
ledger, then entry, then batch index, with ``-1`` after every index of its entry: the
position ``L:E:-1`` is the last message of entry ``L:E``, and ``L:-1:-1`` the position before
ledger ``L``'s first entry.

Text forms (what ``startingOffsets`` / ``endingOffsets`` JSON values and the streaming
checkpoint hold):

- ``"<ledger>:<entry>:<batchIndex>"`` (canonical, e.g. ``"18:7:-1"``, ``"18:8:3"``);
  ``"<ledger>:<entry>"`` means batch index ``-1``;
- ``"(<ledger>,<entry>,<partition>,<batchIndex>)"``: the ``message_id`` column's form (the
  partition part is ignored, the JSON key says which partition);
- ``"earliest"`` (before the first message; canonical for an empty start) and ``"latest"``
  (the partition's last message when the query is planned).

A range ``(start, end]`` holds the messages after ``start`` up to and including ``end``: a
starting position is exclusive (reading resumes *after* it), an ending position inclusive.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from txn.errors import InvalidTopicName
from txn.message import MessageId
from txn.topic import parse_topic

Position = tuple[int, int, int]

EARLIEST = "earliest"
LATEST = "latest"
#: Before the first message of a partition.
EARLIEST_POS: Position = (-1, -1, -1)

_WHOLE_ENTRY = 1 << 62  # sort key of batch index -1: after every index of its entry
_U64 = 0xFFFFFFFFFFFFFFFF
_COLON = re.compile(r"(-?\d+):(-?\d+)(?::(-?\d+))?")
_TUPLE = re.compile(r"\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(-?\d+)\s*,\s*(-?\d+)\s*\)")


def pos_key(pos: Position) -> tuple[int, int, int]:
    """Sort key of a position (batch index -1 sorts after every index of its entry)."""
    ledger, entry, batch = pos
    return (ledger, entry, batch if batch >= 0 else _WHOLE_ENTRY)


def format_position(pos: Position) -> str:
    """Canonical text: ``"earliest"`` or ``"<ledger>:<entry>:<batchIndex>"``."""
    if pos == EARLIEST_POS:
        return EARLIEST
    return f"{pos[0]}:{pos[1]}:{pos[2]}"


def position_of(mid: MessageId) -> Position:
    """The position of a received message."""
    return (mid.ledger_id(), mid.entry_id(), mid.batch_index() if mid.batch_index() >= 0 else -1)


def last_position(mid: MessageId) -> Position | None:
    """The position of a partition's last message id (``get_last_message_id``); None if empty."""
    if mid.ledger_id() in (_U64, -1) or mid.entry_id() in (_U64, -1) or mid.ledger_id() < 0 or mid.entry_id() < 0:
        return None
    return position_of(mid)


def to_message_id(pos: Position) -> MessageId:
    """The message id a reader starts from (exclusive) for ``pos``."""
    return MessageId(ledger_id=pos[0], entry_id=pos[1], batch_index=pos[2])


def parse_position(text: Any, what: str) -> Position | str:
    """Parse one position: a :data:`Position`, ``"earliest"`` or ``"latest"``.

    ``what`` names the option (and key) in the ``ValueError`` raised on bad input.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what}: a position must be a string like \"18:7:-1\", \"earliest\" or \"latest\", "
                         f"got {text!r}")
    t = text.strip()
    if t.lower() in (EARLIEST, LATEST):
        return t.lower()
    m = _COLON.fullmatch(t)
    if m is not None:
        ledger, entry, batch = int(m.group(1)), int(m.group(2)), int(m.group(3) or -1)
    else:
        m = _TUPLE.fullmatch(t)
        if m is None:
            raise ValueError(f"{what}: invalid position {text!r}; expected \"<ledger>:<entry>:<batchIndex>\", "
                             "\"(<ledger>,<entry>,<partition>,<batchIndex>)\", \"earliest\" or \"latest\"")
        ledger, entry, batch = int(m.group(1)), int(m.group(2)), int(m.group(4))
    if (ledger, entry, batch) == EARLIEST_POS:
        return EARLIEST
    if ledger < 0 or entry < -1 or (entry == -1 and batch != -1):
        # entry -1 (batch -1): before ledger ``ledger``'s first entry (a startingTimestamp start)
        raise ValueError(f"{what}: invalid position {text!r}: ledger and entry ids are not negative")
    if batch < -1:
        raise ValueError(f"{what}: invalid batch index {batch} in {text!r} (-1 means the whole entry)")
    return (ledger, entry, batch)


def canonical_partition(name: Any, what: str) -> str:
    """Fully qualified name of a topic or topic partition (``ValueError`` naming ``what``)."""
    try:
        return str(parse_topic(name))
    except InvalidTopicName as exc:
        raise ValueError(f"{what}: {exc}") from None


def parse_offsets(value: Any, option: str, *, allow_earliest: bool = True,
                  allow_latest: bool = True) -> str | dict[str, Position | str]:
    """Parse a ``startingOffsets`` / ``endingOffsets`` option.

    Returns ``"earliest"``, ``"latest"`` or ``{topic partition: position}`` with fully
    qualified keys. Raises ``ValueError`` naming ``option``.
    """
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{option} must be \"earliest\", \"latest\" or a JSON object, got {value!r}")
    text = value.strip()
    if text.lower() in (EARLIEST, LATEST):
        spec: str | dict[str, Position | str] = text.lower()
        values = [spec]
    else:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{option} is neither \"earliest\", \"latest\" nor valid JSON: {exc.msg} "
                             f"(at char {exc.pos}) in {text!r}") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{option}: the JSON must be an object "
                             "{\"<topic-partition>\": \"<ledger>:<entry>:<batchIndex>\", ...}, "
                             f"got {type(raw).__name__}")
        spec = {}
        for k, v in raw.items():
            key = canonical_partition(k, f"{option} key {k!r}")
            if key in spec:
                raise ValueError(f"{option}: {k!r} names the partition {key} twice")
            spec[key] = parse_position(v, f"{option}[{k!r}]")
        values = list(spec.values())
    for v in values:
        if v == EARLIEST and not allow_earliest:
            raise ValueError(f"{option}: \"earliest\" is not allowed here")
        if v == LATEST and not allow_latest:
            raise ValueError(f"{option}: \"latest\" is not allowed here")
    return spec


def offsets_to_json(offsets: Mapping[str, Position]) -> dict[str, str]:
    """The streaming offset dict (sorted keys, canonical positions)."""
    return {k: format_position(offsets[k]) for k in sorted(offsets)}


def offsets_from_json(offsets: Mapping[str, Any], what: str = "offset") -> dict[str, Position]:
    """Inverse of :func:`offsets_to_json` (``"earliest"`` becomes :data:`EARLIEST_POS`)."""
    out: dict[str, Position] = {}
    for k, v in offsets.items():
        p = parse_position(v, f"{what}[{k!r}]")
        if p == LATEST:
            raise ValueError(f"{what}[{k!r}]: \"latest\" is not a stored position")
        out[k] = EARLIEST_POS if p == EARLIEST else p  # type: ignore[assignment]
    return out
