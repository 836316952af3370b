"""Pure protocol layer: frames, commands, checksums, batches and codecs (no I/O)."""

from . import pulsar_wire_pb2 as pb
from .batch import NULL_PAYLOAD, NullPayload, decode_batch, encode_entry, split_batch
from .checksum import crc32c
from .compression import CompressionType, compress, decompress
from .frames import (
    Frame,
    FrameDecoder,
    decode_frame,
    encode_command,
    encode_payload_frame,
)

__all__ = [
    "NULL_PAYLOAD",
    "CompressionType",
    "Frame",
    "FrameDecoder",
    "NullPayload",
    "compress",
    "crc32c",
    "decode_batch",
    "decode_frame",
    "decompress",
    "encode_command",
    "encode_entry",
    "encode_payload_frame",
    "pb",
    "split_batch",
]
