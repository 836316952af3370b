"""The base of every schema: the wire type ids, ``SchemaInfo`` (what the broker registers) and ``Schema``.

Re-exported by :mod:`txn.schema`, where the concrete schemas live (``ProtobufNativeSchema`` in
:mod:`txn.schema_protobuf`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Schema", "SchemaInfo", "SchemaType"]


class SchemaType:
    """Wire type ids of ``Schema.Type`` (PulsarApi.proto); BYTES is the client-side "no schema"."""

    BYTES = -1
    NONE = 0
    STRING = 1
    JSON = 2
    PROTOBUF = 3
    AVRO = 4
    PROTOBUF_NATIVE = 20


@dataclass(frozen=True)
class SchemaInfo:
    """What is registered with the broker: type id, name and definition text ("" for none)."""

    type_id: int
    schema_name: str
    definition: str

    def schema_type(self) -> int:
        return self.type_id

    def name(self) -> str:
        return self.schema_name

    def schema(self) -> str:
        return self.definition


class Schema:
    """Encodes values to payload bytes and back; ``schema_info()`` is what the broker registers."""

    def __init__(self, record_cls: type | None, type_id: int, definition: Any, name: str) -> None:
        self._record_cls = record_cls
        self._info = SchemaInfo(type_id, name, "null" if definition is None else json.dumps(definition, indent=True))

    def schema_info(self) -> SchemaInfo:
        return self._info

    def encode(self, obj: Any) -> bytes:
        raise NotImplementedError

    def decode(self, data: bytes) -> Any:
        raise NotImplementedError

    def decode_version(self, data: bytes, topic: str, version: bytes) -> Any:
        """Decode ``data`` written with schema ``version`` of ``topic`` (only Avro needs the writer's definition)."""
        return self.decode(data)

    def needs_writer(self, topic: str, version: bytes) -> bool:
        """True if decoding that version needs its definition from the registry (not yet known)."""
        return False

    def add_writer(self, topic: str, version: bytes, type_id: int, definition: str) -> None:
        """Remember the registry's definition of ``version`` (see :meth:`needs_writer`)."""

    def _check(self, obj: Any) -> None:
        if self._record_cls is not None and not isinstance(obj, self._record_cls):
            raise TypeError(f"Invalid record obj of type {type(obj)} - expected type is {self._record_cls}")

    def __str__(self) -> str:
        return f"{type(self).__name__}({self._info.schema_name})"
