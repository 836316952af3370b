"""Message values as Spark columns, by the topic's registered schema (source and sink).

With ``decodeValue=true`` the source reads the topic's schema from the broker's registry when the
query is planned and the ``value`` column becomes:

- ``STRING`` schema: a string;
- ``AVRO`` or ``JSON`` schema (a record): a struct of the record's fields (``select("value.*")``
  makes them columns). Avro types map to Spark's: int, long, float, double, boolean, string,
  bytes / fixed -> binary, enum -> string, array, map (string keys), nested records -> structs,
  a union of null and one type -> that type, nullable.

Each message is decoded by the definition it was written with (its schema version, fetched once per
version) and resolved to the planned one by Avro's rules, so a topic written with several compatible
versions reads as the planned version. With ``encodeValue=true`` the sink does the reverse: it
encodes the ``value`` column (a struct, or a string for ``STRING``) by the topic's schema and
produces under that schema's version.
"""

from __future__ import annotations

import decimal
import io
import json
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from txn.topic import parse_topic

__all__ = ["SUPPORTED", "TopicValueSchema", "ValueSchemaError", "registry_get", "schema_path", "shape"]

#: Registry types these options handle.
SUPPORTED = ("AVRO", "JSON", "STRING")


class ValueSchemaError(ValueError):
    """The topic's schema cannot be used (none registered, an unsupported type, topics that differ),
    or a message or row does not fit it."""


def schema_path(topic: str, version: int | None = None) -> str:
    """The admin REST path of ``topic``'s schema (its latest, or ``version``)."""
    t = parse_topic(topic)
    base = t.base if t.partition_index >= 0 else str(t)
    name = base.split("://", 1)[1]
    path = f"/admin/v2/schemas/{'/'.join(urllib.parse.quote(p) for p in name.split('/'))}/schema"
    return path if version is None else f"{path}/{version}"


@dataclass(frozen=True)
class TopicValueSchema:
    """A topic's registered schema: ``kind`` (``AVRO``, ``JSON`` or ``STRING``), its definition
    (the Avro-style record definition as JSON text, empty for ``STRING``) and its version."""

    kind: str
    definition: str
    version: int

    @classmethod
    def from_registry(cls, topic: str, answer: Any) -> TopicValueSchema:
        """From the admin API's answer for ``topic`` (``ValueSchemaError`` if unusable)."""
        if not isinstance(answer, dict):
            raise ValueSchemaError(f"{topic}: the schema registry's answer is not an object: {str(answer)[:200]}")
        kind = str(answer.get("type", "")).upper()
        if kind not in SUPPORTED:
            raise ValueSchemaError(f"{topic} has a {kind or 'missing'} schema; decodeValue and encodeValue "
                                   f"handle {', '.join(SUPPORTED)}")
        definition = str(answer.get("data", "")) if kind != "STRING" else ""
        if kind != "STRING":
            d = _load(definition, topic)
            if d.get("type") != "record":
                raise ValueSchemaError(f"{topic}: the {kind} schema is not a record")
            spark_type(d)  # validates every field's type
        return cls(kind, definition, int(answer.get("version", 0) or 0))

    def parsed(self) -> dict[str, Any]:
        """The record definition (``AVRO`` and ``JSON``)."""
        return _load(self.definition, "the topic schema")

    def spark_type(self) -> Any:
        """The ``value`` column's Spark type."""
        from pyspark.sql.types import StringType

        return StringType() if self.kind == "STRING" else spark_type(self.parsed())

    def arrow_type(self) -> Any:
        """The ``value`` column's Arrow type (the same shape as :meth:`spark_type`)."""
        import pyarrow as pa

        return pa.string() if self.kind == "STRING" else arrow_type(self.parsed())

    def same_as(self, other: TopicValueSchema) -> bool:
        """Whether two topics' schemas read as one column (same kind and definition)."""
        if self.kind != other.kind:
            return False
        return self.kind == "STRING" or self.parsed() == other.parsed()

    def decoder(self, writer_definition: Callable[[int], str | None]) -> Callable[[bytes, bytes | None], Any]:
        """``decode(payload, schema_version)`` -> the column's Python value. ``writer_definition(v)``
        gives the definition of version ``v`` (or None: read as the planned one). Raises
        :class:`ValueSchemaError` for a payload that does not decode."""
        if self.kind == "STRING":
            def decode_str(data: bytes, version: bytes | None) -> Any:
                try:
                    return bytes(data).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueSchemaError(f"not UTF-8 text: {exc}") from None
            return decode_str
        reader = self.parsed()
        if self.kind == "JSON":
            def decode_json(data: bytes, version: bytes | None) -> Any:
                try:
                    obj = json.loads(data)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise ValueSchemaError(f"not JSON: {exc}") from None
                return conform(obj, reader)
            return decode_json
        import fastavro

        parsed_reader = fastavro.parse_schema(reader)
        writers: dict[int, Any] = {}

        def decode_avro(data: bytes, version: bytes | None) -> Any:
            writer = parsed_reader
            if version:
                v = int.from_bytes(version, "big", signed=True)
                if v not in writers:
                    text = writer_definition(v)
                    d = _load(text, f"schema version {v}") if text else None
                    writers[v] = parsed_reader if d is None or d == reader else fastavro.parse_schema(
                        dict(d, name=reader.get("name"), namespace=reader.get("namespace")))
                writer = writers[v]
            try:
                return fastavro.schemaless_reader(io.BytesIO(data), writer, parsed_reader)
            except Exception as exc:  # fastavro raises several kinds on bad bytes
                raise ValueSchemaError(f"not Avro of the topic's schema: {type(exc).__name__}: {exc}") from None
        return decode_avro

    def txn_schema(self) -> Any:
        """A :class:`txn.schema.Schema` that registers exactly this definition (so a producer
        gets this version, not a new one for the same schema written differently)."""
        from txn.schema import Schema, SchemaInfo, SchemaType

        class Registered(Schema):
            def __init__(self, kind: str, definition: str) -> None:
                type_id = {"AVRO": SchemaType.AVRO, "JSON": SchemaType.JSON, "STRING": SchemaType.STRING}[kind]
                super().__init__(None, type_id, None, kind)
                self._info = SchemaInfo(type_id, kind, definition)

        return Registered(self.kind, self.definition)

    def encoder(self) -> Callable[[Any], bytes]:
        """``encode(value)``: a column value (a ``Row`` or dict for a record, a str for ``STRING``)
        -> the payload. Raises :class:`ValueSchemaError` for a value that does not fit."""
        if self.kind == "STRING":
            def encode_str(value: Any) -> bytes:
                if not isinstance(value, str):
                    raise ValueSchemaError(f"a STRING topic takes string values, got {type(value).__name__}")
                return value.encode("utf-8")
            return encode_str
        reader = self.parsed()
        if self.kind == "JSON":
            def encode_json(value: Any) -> bytes:
                return json.dumps(conform(shape(value, reader), reader), separators=(",", ":")).encode()
            return encode_json
        import fastavro

        parsed = fastavro.parse_schema(reader)

        def encode_avro(value: Any) -> bytes:
            buf = io.BytesIO()
            try:
                fastavro.schemaless_writer(buf, parsed, shape(value, reader))
            except Exception as exc:  # fastavro's ValueError / TypeError on values that do not fit
                raise ValueSchemaError(f"the value does not fit the topic's Avro schema: {exc}") from None
            return buf.getvalue()
        return encode_avro


def _load(text: str | None, what: str) -> dict[str, Any]:
    try:
        d = json.loads(text or "")
    except ValueError as exc:
        raise ValueSchemaError(f"{what}: the schema definition is not JSON: {exc}") from None
    if not isinstance(d, dict):
        raise ValueSchemaError(f"{what}: the schema definition is not a JSON object")
    return d


def shape(value: Any, t: Any) -> Any:
    """A Spark cell (``Row`` or dict for a struct, a list of pairs or a dict for a map, as the row
    and Arrow paths give them) as the plain value of Avro type ``t``."""
    t, _ = _nullable(t)
    if value is None:
        return value
    if not isinstance(t, dict):
        if t in ("float", "double") and isinstance(value, decimal.Decimal):
            return float(value)  # Spark's decimal arithmetic (id / 2.0) for a floating-point field
        return value
    kind = t.get("type")
    if kind == "record":
        as_dict = getattr(value, "asDict", None)
        d = as_dict() if callable(as_dict) else value
        if not isinstance(d, dict):
            raise ValueSchemaError(f"record {t.get('name')} needs a struct value, got {type(value).__name__}")
        return {f["name"]: shape(d.get(f["name"]), f["type"]) for f in t.get("fields", [])}
    if kind == "array":
        return [shape(v, t["items"]) for v in value]
    if kind == "map":
        pairs = value.items() if isinstance(value, dict) else value
        return {k: shape(v, t["values"]) for k, v in pairs}
    return value


def registry_get(admin_url: str, topic: str, admin_kwargs: dict[str, Any],
                 version: int | None = None) -> dict[str, Any] | None:
    """The schema registry's answer for ``topic`` (its latest schema, or ``version``), None if it
    has none; ``admin_kwargs`` are :meth:`txn.settings.BrokerSettings.admin_kwargs`."""
    from txn.admin import admin_request

    path = schema_path(topic, version)
    try:
        status, body = admin_request("GET", admin_url, path, timeout=30, **admin_kwargs)
    except OSError as exc:
        raise RuntimeError(f"admin_url {admin_url} is unreachable: {exc}") from None
    if status == 404:
        return None
    if not 200 <= status < 300 or not isinstance(body, dict):
        raise RuntimeError(f"admin_url {admin_url}: GET {path} -> HTTP {status} {str(body)[:300]}")
    return body


def _nullable(t: Any) -> tuple[Any, bool]:
    """An Avro type without its ``null`` branch, and whether it had one (more branches: refused)."""
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        if len(rest) != 1:
            raise ValueSchemaError(f"union {t}: only a union of null and one type maps to a Spark column")
        return rest[0], len(rest) < len(t)
    return t, False


_PRIMITIVES = ("int", "long", "float", "double", "boolean", "string", "bytes")


def spark_type(t: Any) -> Any:
    """The Spark type of an Avro type (``ValueSchemaError`` for ones without a mapping)."""
    from pyspark.sql import types as st

    t, _ = _nullable(t)
    if isinstance(t, str):
        prim = {"int": st.IntegerType(), "long": st.LongType(), "float": st.FloatType(),
                "double": st.DoubleType(), "boolean": st.BooleanType(), "string": st.StringType(),
                "bytes": st.BinaryType(), "null": st.NullType()}
        if t in prim:
            return prim[t]
        raise ValueSchemaError(f"Avro type {t!r} (a named reference or unknown type) has no Spark mapping here")
    if not isinstance(t, dict):
        raise ValueSchemaError(f"Avro type {t!r} has no Spark mapping")
    kind = t.get("type")
    if t.get("logicalType"):
        raise ValueSchemaError(f"Avro logical type {t['logicalType']!r} is not mapped; read the raw value instead")
    if kind == "record":
        return st.StructType([st.StructField(f["name"], spark_type(f["type"]), True) for f in t.get("fields", [])])
    if kind == "array":
        return st.ArrayType(spark_type(t["items"]), True)
    if kind == "map":
        return st.MapType(st.StringType(), spark_type(t["values"]), True)
    if kind == "enum":
        return st.StringType()
    if kind == "fixed":
        return st.BinaryType()
    if kind in _PRIMITIVES:
        return spark_type(kind)
    raise ValueSchemaError(f"Avro type {kind!r} has no Spark mapping")


def arrow_type(t: Any) -> Any:
    """The Arrow type of an Avro type, shaped as :func:`spark_type`'s."""
    import pyarrow as pa

    t, _ = _nullable(t)
    if isinstance(t, str):
        return {"int": pa.int32(), "long": pa.int64(), "float": pa.float32(), "double": pa.float64(),
                "boolean": pa.bool_(), "string": pa.string(), "bytes": pa.binary(), "null": pa.null()}[t]
    kind = t["type"]
    if kind == "record":
        return pa.struct([(f["name"], arrow_type(f["type"])) for f in t.get("fields", [])])
    if kind == "array":
        return pa.list_(arrow_type(t["items"]))
    if kind == "map":
        return pa.map_(pa.string(), arrow_type(t["values"]))
    if kind == "enum":
        return pa.string()
    if kind == "fixed":
        return pa.binary()
    return arrow_type(kind)


def conform(obj: Any, t: Any) -> Any:
    """A decoded JSON value shaped to the Avro type ``t``: records keep their declared fields (a
    missing one is its default, else null; others are dropped), maps become lists of pairs as
    Arrow takes them. ``ValueSchemaError`` when the JSON does not fit."""
    t, _ = _nullable(t)
    if obj is None:
        return None
    if isinstance(t, dict):
        kind = t.get("type")
        if kind == "record":
            if not isinstance(obj, dict):
                raise ValueSchemaError(f"expected a JSON object for record {t.get('name')}, got {type(obj).__name__}")
            return {f["name"]: conform(obj.get(f["name"], f.get("default")), f["type"]) for f in t.get("fields", [])}
        if kind == "array":
            if not isinstance(obj, list):
                raise ValueSchemaError(f"expected a JSON array, got {type(obj).__name__}")
            return [conform(v, t["items"]) for v in obj]
        if kind == "map":
            if not isinstance(obj, dict):
                raise ValueSchemaError(f"expected a JSON object for a map, got {type(obj).__name__}")
            return {str(k): conform(v, t["values"]) for k, v in obj.items()}
        return obj
    if t in ("int", "long") and not (isinstance(obj, int) and not isinstance(obj, bool)):
        raise ValueSchemaError(f"expected an integer, got {obj!r}"[:200])
    if t in ("float", "double") and (isinstance(obj, bool) or not isinstance(obj, (int, float))):
        raise ValueSchemaError(f"expected a number, got {obj!r}"[:200])
    if t == "boolean" and not isinstance(obj, bool):
        raise ValueSchemaError(f"expected true or false, got {obj!r}"[:200])
    if t == "string" and not isinstance(obj, str):
        raise ValueSchemaError(f"expected a string, got {obj!r}"[:200])
    return float(obj) if t in ("float", "double") else obj
