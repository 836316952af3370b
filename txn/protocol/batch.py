"""Batch payloads: ``[u32 size][SingleMessageMetadata][payload]`` repeated."""

from __future__ import annotations

import struct

from google.protobuf.message import DecodeError

from ..errors import ProtocolError
from . import pulsar_wire_pb2 as pb

_U32 = struct.Struct(">I")


def encode_entry(smm: pb.SingleMessageMetadata, payload: bytes) -> bytes:
    """Serialise one message of a batch (``smm.payload_size`` must equal ``len(payload)``)."""
    meta = smm.SerializeToString()
    return _U32.pack(len(meta)) + meta + payload


def decode_batch(data: bytes, count: int) -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    """Split a (decompressed) batch payload into ``count`` messages.

    Raises :class:`ProtocolError` if the payload holds fewer; trailing bytes are ignored.
    """
    if count < 0:
        raise ProtocolError(f"negative batch size {count}")
    out: list[tuple[pb.SingleMessageMetadata, bytes]] = []
    view = memoryview(data)
    unpack = _U32.unpack_from
    pos = 0
    n = len(data)
    for i in range(count):
        if n - pos < 4:
            raise ProtocolError(f"batch truncated at message {i} of {count}")
        (msize,) = unpack(view, pos)
        pos += 4
        if msize > n - pos:
            raise ProtocolError(f"batch message {i} metadata overruns the payload")
        smm = pb.SingleMessageMetadata()
        try:
            smm.ParseFromString(view[pos : pos + msize])
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise ProtocolError(f"undecodable batch message {i}: {exc}") from exc
        if not smm.HasField("payload_size"):
            raise ProtocolError(f"batch message {i} metadata is missing required fields")
        pos += msize
        psize = smm.payload_size
        if psize < 0 or psize > n - pos:
            raise ProtocolError(f"batch message {i} payload overruns the batch")
        out.append((smm, data[pos : pos + psize]))
        pos += psize
    return out
