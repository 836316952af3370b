"""Batch payloads: ``[u32 size][SingleMessageMetadata][payload]`` repeated."""

from __future__ import annotations

import importlib
import os
import struct
from typing import Any

from google.protobuf.message import DecodeError

from ..errors import ProtocolError
from . import pulsar_wire_pb2 as pb


class NullPayload(bytes):
    """The payload of a null-value message (a tombstone): empty, and marked ``null_value`` on the wire."""

    __slots__ = ()


#: The one null payload: producers send it for ``content=None``, consumers hand it out for null values.
NULL_PAYLOAD = NullPayload()

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


#: One message of a batch as the consumer needs it: ``(payload, sequence_id or None, event_time,
#: partition_key or None, properties or None, compacted_out, ordering_key or None)``.
BatchItem = tuple[bytes, "int | None", int, "str | None", "list[tuple[str, str]] | None", bool, "bytes | None"]

_INT32_SIGN = 1 << 31
_U32_WRAP = 1 << 32
_U64_MASK = (1 << 64) - 1
_U32_MASK = (1 << 32) - 1


def split_batch(data: bytes, count: int) -> list[BatchItem]:
    """Like :func:`decode_batch`, but returns plain tuples: the compiled loop of
    ``txn/protocol/_speedups.c`` where it was built (and ``TXN_PURE_PYTHON`` is not set), else
    :func:`split_batch_py`. Both give the same tuples and raise the same errors for the same bytes."""
    if _compiled_split is not None and type(data) is bytes:
        out = _compiled_split(data, count, _slow_smm, NULL_PAYLOAD)
        if out is not None:
            return out  # type: ignore[no-any-return]
    return split_batch_py(data, count)


def split_batch_py(data: bytes, count: int) -> list[BatchItem]:
    """The pure Python :func:`split_batch`: like :func:`decode_batch`, but returns plain tuples and
    costs about half as much.

    Metadata holding only the common fields (payload size, sequence id, event time,
    compacted flag, partition key) is read by the varint decoder below; anything else
    (properties, ordering keys, unknown fields, odd encodings) falls back to protobuf for
    that message, so both functions accept and reject exactly the same bytes.
    """
    if count < 0:
        raise ProtocolError(f"negative batch size {count}")
    out: list[BatchItem] = []
    append = out.append
    n = len(data)
    pos = 0
    for i in range(count):
        if n - pos < 4:
            raise ProtocolError(f"batch truncated at message {i} of {count}")
        end = pos + 4 + _U32.unpack_from(data, pos)[0]
        if end > n:
            raise ProtocolError(f"batch message {i} metadata overruns the payload")
        # ---- fast path: fields 3, 8, 5, 4 (varints) and 2 (string) with one-byte tags
        p = pos + 4
        psize = -1
        seq = None
        event_time = 0
        key = None
        compacted = False
        while p < end:
            tag = data[p]
            b = data[p + 1] if p + 1 < end else 0x80
            p += 2
            if b < 0x80:
                v = b
            else:
                v = b & 0x7F
                shift = 7
                while p < end and shift < 64:
                    b = data[p]
                    p += 1
                    v |= (b & 0x7F) << shift
                    if b < 0x80:
                        break
                    shift += 7
                if b >= 0x80:
                    p = -1  # truncated or over-long varint: protobuf decides
                    break
                v &= _U64_MASK
            if tag == 0x18:  # payload_size (int32)
                if v >= _INT32_SIGN:
                    v &= _U32_MASK
                    psize = v - _U32_WRAP if v >= _INT32_SIGN else v
                else:
                    psize = v
            elif tag == 0x40:  # sequence_id
                seq = v
            elif tag == 0x28:  # event_time
                event_time = v
            elif tag == 0x12:  # partition_key: v is its length
                if v > end - p:
                    p = -1
                    break
                try:
                    key = data[p : p + v].decode()
                except UnicodeDecodeError:
                    p = -1
                    break
                p += v
            elif tag == 0x20:  # compacted_out
                compacted = v != 0
            else:  # any other field or wire type
                p = -1
                break
        null = False
        if p != end or psize == -1:
            psize, seq, event_time, key, props, compacted, okey, null = _slow_smm(data, pos + 4, end, i)
        else:
            props = okey = None
        if psize < 0 or psize > n - end:
            raise ProtocolError(f"batch message {i} payload overruns the batch")
        pos = end + psize
        append((NULL_PAYLOAD if null else data[end:pos], seq, event_time, key, props, compacted, okey))
    return out


def _slow_smm(data: bytes, pos: int, end: int, i: int) -> tuple[int, int | None, int, str | None,
                                                                 list[tuple[str, str]] | None, bool, bytes | None,
                                                                 bool]:
    smm = pb.SingleMessageMetadata()
    try:
        smm.ParseFromString(data[pos:end])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ProtocolError(f"undecodable batch message {i}: {exc}") from exc
    if not smm.HasField("payload_size"):
        raise ProtocolError(f"batch message {i} metadata is missing required fields")
    props = [(kv.key, kv.value) for kv in smm.properties] if len(smm.properties) else None
    return (
        smm.payload_size,
        smm.sequence_id if smm.HasField("sequence_id") else None,
        smm.event_time,
        smm.partition_key if smm.HasField("partition_key") else None,
        props,
        smm.compacted_out,
        smm.ordering_key if smm.HasField("ordering_key") else None,
        smm.null_value,
    )


def _load_compiled() -> Any:
    """The compiled ``split_batch`` (None: not built here, or ``TXN_PURE_PYTHON`` is set)."""
    if os.environ.get("TXN_PURE_PYTHON"):
        return None
    try:  # an extension module: no source file for the import-graph checks to follow
        compiled = importlib.import_module(f"{__package__}._speedups").split_batch
    except ImportError:
        return None
    return compiled


_compiled_split = _load_compiled()
#: True when batches are split by the compiled extension (``txn/protocol/_speedups.c``).
COMPILED = _compiled_split is not None
