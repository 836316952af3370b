"""``ProtobufNativeSchema``: generated protobuf message classes in their own binary encoding.

The registered definition (type PROTOBUF_NATIVE) is the JSON the Java client's
``ProtobufNativeSchemaData`` reads: the message's file and every file it imports, dependencies
first, as one base64 ``FileDescriptorSet``, with the message's full name and its file's name.
It is the text the official Python client registers for the same generated class.
"""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FileDescriptor
from google.protobuf.message import Message as ProtobufMessage

from .schema_base import Schema, SchemaType

__all__ = ["ProtobufNativeSchema", "protobuf_native_definition"]


def _add_file(fd: FileDescriptor, done: set[str], out: descriptor_pb2.FileDescriptorSet) -> None:
    """Append ``fd`` to ``out`` after the files it imports, each file once."""
    if fd.name in done:
        return
    for dep in fd.dependencies:
        _add_file(dep, done, out)
    done.add(fd.name)
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    out.file.append(proto)


def protobuf_native_definition(descriptor: Descriptor) -> dict[str, str]:
    """The PROTOBUF_NATIVE definition of the message type ``descriptor``, as a dict."""
    files = descriptor_pb2.FileDescriptorSet()
    _add_file(descriptor.file, set(), files)
    return {
        "fileDescriptorSet": base64.b64encode(files.SerializeToString()).decode("ascii"),
        "rootMessageTypeName": descriptor.full_name,
        "rootFileDescriptorName": descriptor.file.name,
    }


class ProtobufNativeSchema(Schema):
    """A generated protobuf message class, encoded with ``SerializeToString`` and decoded with ``FromString``."""

    def __init__(self, record_cls: type[ProtobufMessage]) -> None:
        if not (isinstance(record_cls, type) and issubclass(record_cls, ProtobufMessage)):
            raise TypeError(f"record_cls must be a protobuf Message subclass, got {record_cls!r}")
        super().__init__(record_cls, SchemaType.PROTOBUF_NATIVE, protobuf_native_definition(record_cls.DESCRIPTOR),
                         "PROTOBUF_NATIVE")

    def encode(self, obj: ProtobufMessage) -> bytes:
        self._check(obj)
        return obj.SerializeToString()

    def decode(self, data: bytes) -> Any:
        assert self._record_cls is not None
        return self._record_cls.FromString(data)

    def __str__(self) -> str:
        assert self._record_cls is not None
        return f"ProtobufNativeSchema({self._record_cls.__name__})"
