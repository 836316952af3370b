"""Schemas, mirroring ``pulsar.schema``: ``Record`` classes and the String/Bytes/JSON/Avro/protobuf schemas.

The definitions (Avro-style JSON text, type ids, names) are byte for byte what the official client
registers, so the broker's schema registry sees one schema whichever client connects first.
``AvroSchema`` needs fastavro (the ``avro`` extra); ``ProtobufNativeSchema`` lives in
:mod:`txn.schema_protobuf`.
"""

from __future__ import annotations

import io
import json
from enum import Enum, EnumMeta
from typing import Any, ClassVar

from .schema_base import Schema, SchemaInfo, SchemaType
from .schema_protobuf import ProtobufNativeSchema

__all__ = [
    "Array", "AvroSchema", "Boolean", "Bytes", "BytesSchema", "CustomEnum", "Double", "Field", "Float", "Integer",
    "JsonSchema", "Long", "Map", "Null", "ProtobufNativeSchema", "Record", "Schema", "SchemaInfo", "SchemaType",
    "String", "StringSchema",
]

_RESERVED = ("_default", "_required", "_required_default")


# --- fields -----------------------------------------------------------------------------------------------------


class Field:
    """A typed record field; ``required`` drops the null branch, ``required_default`` emits the default."""

    _avro_type: ClassVar[str] = ""
    _py_types: ClassVar[tuple[type, ...]] = ()

    def __init__(self, default: Any = None, required: bool = False, required_default: bool = False) -> None:
        self._required = required
        self._required_default = required_default
        self._default = None if default is None else self.validate_type("default", default)

    def type(self) -> str:
        return self._avro_type

    def python_type(self) -> tuple[type, ...] | type:
        return self._py_types

    def default(self) -> Any:
        return self._default

    def required_default(self) -> bool:
        return self._required_default

    def is_required(self) -> bool:
        return self._required

    def validate_type(self, name: str, val: Any) -> Any:
        """Return ``val`` (or the default for None) after checking its Python type."""
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, self.python_type()):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: {self.python_type()}")
        return val

    def avro_definition(self, seen: set[str]) -> Any:
        return self.type()

    def schema(self) -> Any:
        return self.avro_definition(set())


class Boolean(Field):
    _avro_type = "boolean"
    _py_types = (bool,)

    def default(self) -> Any:
        return False if self._default is None else self._default


class Integer(Field):
    _avro_type = "int"
    _py_types = (int,)


class Long(Field):
    _avro_type = "long"
    _py_types = (int,)


class Float(Field):
    _avro_type = "float"
    _py_types = (float, int)


class Double(Field):
    _avro_type = "double"
    _py_types = (float, int)


class Bytes(Field):
    _avro_type = "bytes"
    _py_types = (bytes, str)

    def validate_type(self, name: str, val: Any) -> Any:
        val = super().validate_type(name, val)
        return val.encode() if isinstance(val, str) else val


class Null(Field):
    _avro_type = "null"
    _py_types = (type(None),)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is not None:
            raise TypeError(f"Field {name} is set to be None")
        return val


class String(Field):
    _avro_type = "string"
    _py_types = (str, bytes)

    def validate_type(self, name: str, val: Any) -> Any:
        val = super().validate_type(name, val)
        return val.decode() if isinstance(val, bytes) else val


class CustomEnum(Field):
    """A field holding a member of a Python ``Enum`` (an Avro ``enum`` of the member names).

    A value is a member, a member name (``str``) or a member value (exactly ``int``); None is kept
    as None, required or not. An ``Enum`` class set directly in a record body becomes this field.
    """

    _avro_type = "enum"

    def __init__(self, enum_type: type[Enum], default: Any = None, required: bool = False,
                 required_default: bool = False) -> None:
        if not (isinstance(enum_type, type) and issubclass(enum_type, Enum)):
            raise TypeError(f"{getattr(enum_type, '__name__', enum_type)} is not a valid Enum type")
        self.enum_type = enum_type
        self.values: dict[Any, Enum] = {m.value: m for m in enum_type.__members__.values()}
        super().__init__(default, required, required_default)

    def python_type(self) -> type[Enum]:
        return self.enum_type

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        members = self.enum_type.__members__
        if type(val) is str:
            if val not in members:
                raise TypeError(f"Invalid enum value '{val}' for field '{name}'. Expected: {members.keys()}")
            return members[val]
        if type(val) is int:
            if val not in self.values:
                raise TypeError(f"Invalid enum value '{val}' for field '{name}'. Expected: {self.values.keys()}")
            return self.values[val]
        if not isinstance(val, self.enum_type):
            raise TypeError(f"Invalid type '{type(val)}' for field '{name}'. Expected: {self.enum_type.__name__}")
        return val

    def avro_definition(self, seen: set[str]) -> Any:
        # Enum names share the records' set of defined names, without a namespace.
        name = self.enum_type.__name__
        if name in seen:
            return name
        seen.add(name)
        return {"type": "enum", "name": name, "symbols": [m.name for m in self.enum_type]}


def _item_definition(t: Field | Record, seen: set[str]) -> Any:
    return t.avro_definition(seen) if isinstance(t, Array | Map | Record) else t.type()


class Array(Field):
    """A list of one item type (a field or a record)."""

    _avro_type = "array"
    _py_types = (list,)

    def __init__(self, array_type: Field | Record, default: Any = None, required: bool = False,
                 required_default: bool = False) -> None:
        if not isinstance(array_type, Field | Record):
            raise TypeError("Array item type must be a field or a record")
        self.array_type = array_type
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        super().validate_type(name, val)
        if not all(isinstance(x, self.array_type.python_type()) for x in val):
            raise TypeError(f"Array field {name} items should all be of type {self.array_type.type()}")
        return val

    def avro_definition(self, seen: set[str]) -> Any:
        return {"type": "array", "items": _item_definition(self.array_type, seen)}


class Map(Field):
    """A str-keyed map of one value type."""

    _avro_type = "map"
    _py_types = (dict,)

    def __init__(self, value_type: Field | Record, default: Any = None, required: bool = False,
                 required_default: bool = False) -> None:
        if not isinstance(value_type, Field | Record):
            raise TypeError("Map value type must be a field or a record")
        self.value_type = value_type
        super().__init__(default, required, required_default)

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None:
            return None
        super().validate_type(name, val)
        for k, v in val.items():
            if not isinstance(k, str):
                raise TypeError(f"Map keys for field {name} should all be strings")
            if not isinstance(v, self.value_type.python_type()):
                raise TypeError(f"Map values for field {name} should all be of type {self.value_type.python_type()}")
        return val

    def avro_definition(self, seen: set[str]) -> Any:
        return {"type": "map", "values": _item_definition(self.value_type, seen)}


# --- records ----------------------------------------------------------------------------------------------------


class _RecordMeta(type):
    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
        fields: dict[str, Field | Record] = {}
        for base in bases:
            fields.update(getattr(base, "_fields", {}))
        for k, v in ns.items():
            if isinstance(v, EnumMeta):
                v = CustomEnum(v)  # noqa: PLW2901 - an Enum class in the body is an enum field
            if isinstance(v, Field) or isinstance(type(v), _RecordMeta):
                fields[k] = v
        ns["_fields"] = fields
        return super().__new__(mcs, name, bases, ns)


class Record(metaclass=_RecordMeta):
    """Base of user record classes; an instance of a record class is also a field type (a nested record)."""

    _fields: ClassVar[dict[str, Field | Record]]
    _avro_namespace: ClassVar[str | None] = None
    _sorted_fields: ClassVar[bool] = False

    def __init__(self, default: Any = None, required_default: bool = False, required: bool = False,
                 *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "_required_default", required_default)
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_required", required)
        for k, ftype in self._fields.items():
            if k in kwargs:
                setattr(self, k, _from_plain(ftype, kwargs[k]))
            elif isinstance(ftype, Record):
                object.__setattr__(self, k, ftype)
            else:
                object.__setattr__(self, k, ftype.default())

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The Avro-style definition, as the official client builds it."""
        return cls.record_definition(set())

    @classmethod
    def record_definition(cls, seen: set[str]) -> Any:
        full = f"{cls._avro_namespace}.{cls.__name__}" if cls._avro_namespace is not None else cls.__name__
        if full in seen:
            return full
        seen.add(full)
        out: dict[str, Any] = {"type": "record", "name": cls.__name__}
        if cls._avro_namespace is not None:
            out["namespace"] = cls._avro_namespace
        out["fields"] = []
        for name in sorted(cls._fields) if cls._sorted_fields else cls._fields:
            f = cls._fields[name]
            t = f.avro_definition(seen)
            if not f.is_required():
                t = ["null", t]
            if f.required_default():
                d = f.default()
                out["fields"].append({"name": name, "default": d.name if isinstance(d, Enum) else d, "type": t})
            else:
                out["fields"].append({"name": name, "type": t})
        return out

    def avro_definition(self, seen: set[str]) -> Any:
        return type(self).record_definition(seen)

    def __setattr__(self, key: str, value: Any) -> None:
        if key in _RESERVED:
            object.__setattr__(self, key, value)
            return
        if key not in self._fields:
            raise AttributeError(f"Cannot set undeclared field {key} on record")
        object.__setattr__(self, key, self._fields[key].validate_type(key, value))

    def __eq__(self, other: object) -> bool:
        return all(getattr(self, f) == getattr(other, f, None) for f in self._fields)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return str(self.__dict__)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)!r}' for k in self._fields)})"

    def type(self) -> str:
        return type(self).__name__

    def python_type(self) -> type:
        return type(self)

    def default(self) -> Any:
        return self._default

    def required_default(self) -> bool:
        return self._required_default

    def is_required(self) -> bool:
        return self._required

    def validate_type(self, name: str, val: Any) -> Any:
        if val is None and not self._required:
            return self.default()
        if not isinstance(val, type(self)):
            raise TypeError(f"Invalid type '{type(val)}' for sub-record field '{name}'. Expected: {type(self)}")
        return val


def _from_plain(ftype: Field | Record, v: Any) -> Any:
    """Turn decoded dicts back into records (nested, in arrays, in maps)."""
    if isinstance(ftype, Record) and isinstance(v, dict):
        return type(ftype)(**v)
    if isinstance(ftype, Array) and isinstance(v, list) and isinstance(ftype.array_type, Record):
        return [_from_plain(ftype.array_type, x) for x in v]
    if isinstance(ftype, Map) and isinstance(v, dict) and isinstance(ftype.value_type, Record):
        return {k: _from_plain(ftype.value_type, x) for k, x in v.items()}
    return v


def _plain(v: Any, for_json: bool) -> Any:
    """A record's value as plain dicts/lists. For JSON bytes become str and an enum member its
    value; for Avro an enum member is its name (as the official client writes them)."""
    if isinstance(v, Record):
        return {k: _plain(getattr(v, k), for_json) for k in v._fields}
    if isinstance(v, Enum):
        return v.value if for_json else v.name
    if isinstance(v, list):
        return [_plain(x, for_json) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x, for_json) for k, x in v.items()}
    if for_json and isinstance(v, bytes):
        return v.decode()
    return v


# --- schemas ----------------------------------------------------------------------------------------------------


class BytesSchema(Schema):
    """Raw bytes; registers nothing (the same as no schema)."""

    def __init__(self) -> None:
        super().__init__(bytes, SchemaType.BYTES, None, "BYTES")

    def encode(self, data: bytes) -> bytes:
        self._check(data)
        return data

    def decode(self, data: bytes) -> bytes:
        return data


class StringSchema(Schema):
    """UTF-8 text."""

    def __init__(self) -> None:
        super().__init__(str, SchemaType.STRING, None, "STRING")

    def encode(self, obj: str) -> bytes:
        self._check(obj)
        return obj.encode("utf-8")

    def decode(self, data: bytes) -> str:
        return data.decode("utf-8")


class JsonSchema(Schema):
    """A record class as JSON text, with the record's Avro-style definition registered."""

    def __init__(self, record_cls: type[Record]) -> None:
        super().__init__(record_cls, SchemaType.JSON, record_cls.schema(), "JSON")

    def encode(self, obj: Record) -> bytes:
        self._check(obj)
        return json.dumps(_plain(obj, True), indent=True).encode("utf-8")

    def decode(self, data: bytes) -> Record:
        assert self._record_cls is not None
        return self._record_cls(**json.loads(data))


class AvroSchema(Schema):
    """A record class as Avro binary (fastavro); ``decode`` resolves an older writer definition if given."""

    def __init__(self, record_cls: type[Record] | None, schema_definition: dict[str, Any] | None = None) -> None:
        try:
            import fastavro
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError("AvroSchema needs fastavro: pip install 'pulsar-txn[avro]'") from e
        self._fastavro = fastavro
        if record_cls is None and schema_definition is None:
            raise ValueError("either record_cls or schema_definition must be given")
        definition = record_cls.schema() if record_cls is not None else schema_definition
        self._definition = definition
        self._parsed = fastavro.parse_schema(definition)
        self._writers: dict[tuple[str, bytes], Any] = {}  # (topic, version) -> parsed writer, or None
        super().__init__(record_cls, SchemaType.AVRO, definition, "AVRO")

    def needs_writer(self, topic: str, version: bytes) -> bool:
        return (topic, version) not in self._writers

    def add_writer(self, topic: str, version: bytes, type_id: int, definition: str) -> None:
        # Another type, or our own definition: decode with ours.
        d = json.loads(definition) if type_id == SchemaType.AVRO else None
        if d is None or d == self._definition:
            self._writers[(topic, version)] = None
        else:
            self._writers[(topic, version)] = self._fastavro.parse_schema(dict(d, name=self._definition["name"]))

    def decode_version(self, data: bytes, topic: str, version: bytes) -> Any:
        return self._read(data, self._writers.get((topic, version)) or self._parsed)

    def encode(self, obj: Record | dict[str, Any]) -> bytes:
        if isinstance(obj, dict) and self._record_cls is None:
            plain = obj
        else:
            self._check(obj)
            plain = _plain(obj, False)
        buf = io.BytesIO()
        self._fastavro.schemaless_writer(buf, self._parsed, plain)
        return buf.getvalue()

    def decode(self, data: bytes, writer_definition: dict[str, Any] | None = None) -> Any:
        """Decode ``data``; ``writer_definition`` is the definition it was written with, when older."""
        writer = self._parsed
        if writer_definition is not None:
            writer = self._fastavro.parse_schema(dict(writer_definition, name=self._definition["name"]))
        return self._read(data, writer)

    def _read(self, data: bytes, writer: Any) -> Any:
        d = self._fastavro.schemaless_reader(io.BytesIO(data), writer, self._parsed)
        return d if self._record_cls is None else self._record_cls(**d)


def schema_to_pb(schema: Schema) -> Any:
    """The wire ``Schema`` for PRODUCER/SUBSCRIBE, or None for bytes (which registers nothing)."""
    info = schema.schema_info()
    if info.schema_type() == SchemaType.BYTES:
        return None
    from .protocol import pb

    return pb.Schema(name=info.name(), schema_data=info.schema().encode(), type=info.schema_type())

