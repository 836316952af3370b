"""Pulsar frame encoding and decoding: pure functions over bytes, no I/O.

Simple frame::

    [total_size:u32][command_size:u32][BaseCommand]

Payload frame (SEND, MESSAGE)::

    [total_size][command_size][BaseCommand]
    [magic 0x0e01:u16][crc32c:u32][metadata_size:u32][MessageMetadata][payload]

The CRC32C covers everything after the checksum field. A broker may put broker
entry metadata (magic 0x0e02) before the checksummed part; we skip it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from ..errors import ProtocolError
from . import pulsar_wire_pb2 as pb
from .checksum import crc32c

MAGIC_CRC32C = 0x0E01
MAGIC_BROKER_ENTRY_METADATA = 0x0E02
#: The broker's default ``maxMessageSize`` (5 MiB); the frame limit adds headroom for headers.
DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
FRAME_HEADROOM = 10 * 1024

_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")


@dataclass(slots=True)
class Frame:
    """One decoded frame: a command, plus metadata and payload for payload frames."""

    command: pb.BaseCommand
    metadata: pb.MessageMetadata | None = None
    payload: bytes | None = None
    checksum_ok: bool = True


def encode_command(cmd: pb.BaseCommand) -> bytes:
    """Serialise a simple (payload-less) frame."""
    body = cmd.SerializeToString()
    return _U32.pack(len(body) + 4) + _U32.pack(len(body)) + body


def encode_payload_frame(cmd: pb.BaseCommand, metadata: pb.MessageMetadata, payload: bytes) -> bytes:
    """Serialise a payload frame with its CRC32C."""
    cmd_bytes = cmd.SerializeToString()
    meta_bytes = metadata.SerializeToString()
    checked = _U32.pack(len(meta_bytes)) + meta_bytes + payload
    total = 4 + len(cmd_bytes) + 2 + 4 + len(checked)
    return b"".join(
        (
            _U32.pack(total),
            _U32.pack(len(cmd_bytes)),
            cmd_bytes,
            _U16.pack(MAGIC_CRC32C),
            _U32.pack(crc32c(checked)),
            checked,
        )
    )


def decode_frame(frame: bytes | memoryview) -> Frame:
    """Decode one frame *without* its leading ``total_size`` field.

    Raises :class:`ProtocolError` on anything malformed.
    """
    buf = memoryview(frame)
    n = len(buf)
    if n < 4:
        raise ProtocolError(f"frame of {n} bytes is too short for a command size")
    (cmd_size,) = _U32.unpack_from(buf, 0)
    if cmd_size == 0 or cmd_size > n - 4:
        raise ProtocolError(f"command size {cmd_size} does not fit a frame of {n} bytes")
    cmd = pb.BaseCommand()
    try:
        cmd.ParseFromString(buf[4 : 4 + cmd_size])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ProtocolError(f"undecodable command: {exc}") from exc
    if not cmd.IsInitialized():
        raise ProtocolError("command is missing required fields")
    pos = 4 + cmd_size
    if pos == n:
        return Frame(cmd)
    # Payload frame.
    if n - pos < 2:
        raise ProtocolError("truncated payload section")
    (magic,) = _U16.unpack_from(buf, pos)
    if magic == MAGIC_BROKER_ENTRY_METADATA:
        if n - pos < 6:
            raise ProtocolError("truncated broker entry metadata")
        (bem_size,) = _U32.unpack_from(buf, pos + 2)
        pos += 6 + bem_size
        if pos + 2 > n:
            raise ProtocolError("broker entry metadata overruns the frame")
        (magic,) = _U16.unpack_from(buf, pos)
    checksum_ok = True
    if magic == MAGIC_CRC32C:
        if n - pos < 6:
            raise ProtocolError("truncated checksum")
        (expected,) = _U32.unpack_from(buf, pos + 2)
        pos += 6
        checksum_ok = crc32c(buf[pos:]) == expected
    if n - pos < 4:
        raise ProtocolError("truncated metadata size")
    (meta_size,) = _U32.unpack_from(buf, pos)
    pos += 4
    if meta_size > n - pos:
        raise ProtocolError(f"metadata size {meta_size} overruns the frame")
    meta = pb.MessageMetadata()
    try:
        meta.ParseFromString(buf[pos : pos + meta_size])
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ProtocolError(f"undecodable message metadata: {exc}") from exc
    if not meta.IsInitialized():
        raise ProtocolError("message metadata is missing required fields")
    return Frame(cmd, meta, bytes(buf[pos + meta_size :]), checksum_ok)


class FrameDecoder:
    """Incremental decoder: feed it bytes, get complete frames.

    A frame larger than ``max_frame_size`` or any malformed frame raises
    :class:`ProtocolError`; the caller must then close the connection.
    """

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_MESSAGE_SIZE + FRAME_HEADROOM) -> None:
        self._buf = bytearray()
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> list[Frame]:
        """Append ``data`` and return every frame now complete, in order."""
        buf = self._buf
        buf += data
        frames: list[Frame] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _U32.unpack_from(buf, pos)
            if size > self.max_frame_size:
                raise ProtocolError(f"frame of {size} bytes exceeds the limit of {self.max_frame_size}")
            if size < 4:
                raise ProtocolError(f"frame size {size} is too small")
            if end - pos - 4 < size:
                break
            frames.append(decode_frame(memoryview(buf)[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)
