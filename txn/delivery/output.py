"""What a processor handler returns, and how handlers are loaded."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Output:
    """One message to produce: content, and optionally its topic, properties and key.

    ``topic=None`` means the processor's output topic. ``content`` is bytes, sent as they are, or,
    with an output schema (``ProcessorConfig.output_schema``), a value that schema encodes.
    """

    content: Any
    topic: str | None = None
    properties: dict[str, str] | None = None
    partition_key: str | None = None


#: Default bounds of :func:`normalise`, per handler call (one input).
MAX_OUTPUTS = 10_000
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class OutputLimitExceeded(ValueError):
    """A handler's result broke a limit of :func:`normalise`; ``limit`` names it
    (``max_outputs``, ``max_bytes`` or ``deadline``) and ``value`` is the limit's value."""

    def __init__(self, limit: str, value: float, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


def output_size(o: Output) -> int:
    """Bytes an output holds: content, key and properties (as they will be sent)."""
    n = len(o.content) + (len(o.partition_key.encode()) if o.partition_key else 0)
    if o.properties:
        n += sum(len(str(k).encode()) + len(str(v).encode()) for k, v in o.properties.items())
    return n


class OutputEncodingError(TypeError):
    """A handler's output is a value the output schema cannot encode (the batch fails)."""


#: Encodes a value by an output schema (``Schema.encode``).
Encoder = Callable[[Any], bytes]


def _encoded(content: Any, encode: Encoder) -> bytes:
    try:
        data = encode(content)
    except Exception as exc:
        raise OutputEncodingError(f"the output schema cannot encode a {type(content).__name__}: {exc}") from exc
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise OutputEncodingError(f"the output schema encoded a {type(content).__name__} as "
                                  f"{type(data).__name__}, not bytes")
    return bytes(data)


def _one(item: Any, encode: Encoder | None) -> Output:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Output(bytes(item))
    if isinstance(item, Output):
        if encode is None or isinstance(item.content, (bytes, bytearray, memoryview)):
            if not isinstance(item.content, (bytes, bytearray, memoryview)):
                raise TypeError(f"Output.content is a {type(item.content).__name__}; expected bytes "
                                "(or set an output schema to encode values)")
            return item
        return dataclasses.replace(item, content=_encoded(item.content, encode))
    if encode is not None:
        return Output(_encoded(item, encode))
    raise TypeError(f"handler yielded {type(item).__name__}; expected bytes or Output")


def _is_many(result: Any, encode: Encoder | None) -> bool:
    """Whether a handler's result is several outputs (else one). With an output schema only lists,
    tuples and iterators are: a dict, a str or a record is one value to encode."""
    if encode is not None:
        return isinstance(result, (list, tuple, Iterator))
    return isinstance(result, Iterable)


def normalise(result: Any, *, max_outputs: int = MAX_OUTPUTS, max_bytes: int = MAX_OUTPUT_BYTES,
              deadline: float | None = None, encode: Encoder | None = None) -> list[Output]:
    """Turn a handler's return value (None, bytes, Output or an iterable of those) into Outputs.

    With ``encode`` (an output schema's ``encode``), a value that is not bytes (a record, a dict,
    a str, or an ``Output`` holding one) is encoded by it; bytes are taken as already encoded.
    Only lists, tuples and iterators are then several outputs. A value it cannot encode raises
    :class:`OutputEncodingError`.

    Bounded: at most ``max_outputs`` outputs of at most ``max_bytes`` bytes in all (content, key
    and properties), and, with ``deadline`` (a :func:`time.monotonic` time), an iterable is not
    iterated past it. Breaking a bound raises :class:`OutputLimitExceeded` naming it, as soon as
    it is broken: an endless generator is never iterated further than one item past the bound.
    A deadline cannot interrupt a single ``next()`` that never returns: the caller runs the
    handler where that does no harm (another thread) and stops waiting for it."""
    if result is None:
        return []
    if isinstance(result, str) and encode is None:
        raise TypeError("handler returned str; return bytes (encode it) or txn.delivery.Output")
    if isinstance(result, (bytes, bytearray, memoryview, Output)):
        items: Iterable[Any] = (result,)
    elif _is_many(result, encode):
        items = result
    elif encode is not None:
        items = (result,)
    else:
        raise TypeError(f"handler returned {type(result).__name__}; expected None, bytes, Output or an iterable")
    out: list[Output] = []
    total = 0
    for item in items:
        if deadline is not None and time.monotonic() > deadline:
            raise OutputLimitExceeded("deadline", deadline, "the handler's result took too long to produce "
                                      "(past its deadline)")
        o = _one(item, encode)
        if len(out) >= max_outputs:
            raise OutputLimitExceeded("max_outputs", max_outputs,
                                      f"the handler returned more than {max_outputs} outputs for one input")
        total += output_size(o)
        if total > max_bytes:
            raise OutputLimitExceeded("max_bytes", max_bytes,
                                      f"the handler's outputs for one input hold more than {max_bytes} bytes")
        out.append(o)
    return out


def _import_object(spec: str, form: str) -> Any:
    """Import ``module:attr`` (dotted attribute paths allowed after the colon); ``ValueError``
    starting with ``form`` if ``spec`` is not of that shape."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{form}, got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def load_handler(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` (dotted attribute paths allowed after the colon)."""
    obj = _import_object(spec, "handler must be 'module:function'")
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


#: The schema kinds :func:`load_schema` knows.
SCHEMA_KINDS = ("bytes", "string", "json", "avro")


def load_schema(spec: str) -> Any:
    """A :class:`txn.schema.Schema` from a command-line spec: ``bytes``, ``string``, or
    ``json:module:Record`` / ``avro:module:Record`` (a :class:`txn.schema.Record` class to import).
    ``ValueError`` names what is wrong."""
    from .. import schema as ts

    kind, _, record = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in SCHEMA_KINDS:
        raise ValueError(f"schema must be one of bytes, string, json:module:Record, avro:module:Record; got {spec!r}")
    if kind in ("bytes", "string"):
        if record:
            raise ValueError(f"schema {kind!r} takes no record class, got {spec!r}")
        return ts.BytesSchema() if kind == "bytes" else ts.StringSchema()
    obj = _import_object(record, f"schema {kind} needs a record class: '{kind}:module:Record'")
    if not (isinstance(obj, type) and issubclass(obj, ts.Record)):
        raise ValueError(f"{record} is not a txn.schema.Record class")
    return ts.JsonSchema(obj) if kind == "json" else ts.AvroSchema(obj)


def handler_spec(fn: Callable[..., Any]) -> str | None:
    """``module:qualname`` of ``fn`` if it can be imported back, else None."""
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    if not mod or not qual or "<" in qual or mod == "__main__":
        return None
    return f"{mod}:{qual}"


def is_async(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` handlers."""
    return inspect.iscoroutinefunction(fn)
