"""What a processor handler returns, and how handlers are loaded."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Output:
    """One message to produce: content, and optionally its topic, properties and key.

    ``topic=None`` means the processor's output topic.
    """

    content: bytes
    topic: str | None = None
    properties: dict[str, str] | None = None
    partition_key: str | None = None


def normalise(result: Any) -> list[Output]:
    """Turn a handler's return value (None, bytes, Output or an iterable of those) into Outputs."""
    if result is None:
        return []
    if isinstance(result, (bytes, bytearray, memoryview)):
        return [Output(bytes(result))]
    if isinstance(result, Output):
        return [result]
    if isinstance(result, str):
        raise TypeError("handler returned str; return bytes (encode it) or txn.delivery.Output")
    if isinstance(result, Iterable):
        out: list[Output] = []
        for item in result:
            if isinstance(item, (bytes, bytearray, memoryview)):
                out.append(Output(bytes(item)))
            elif isinstance(item, Output):
                out.append(item)
            else:
                raise TypeError(f"handler yielded {type(item).__name__}; expected bytes or Output")
        return out
    raise TypeError(f"handler returned {type(result).__name__}; expected None, bytes, Output or an iterable")


def load_handler(spec: str) -> Callable[..., Any]:
    """Import ``module:function`` (dotted attribute paths allowed after the colon)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"handler must be 'module:function', got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not callable")
    return obj


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
