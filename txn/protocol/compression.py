"""Payload codecs: LZ4 (raw block), ZLIB, ZSTD and SNAPPY (raw block), as Pulsar stores them."""

from __future__ import annotations

import zlib
from enum import IntEnum

import cramjam
import lz4.block
import zstandard

from ..errors import ProtocolError, SizeLimitExceeded


class CompressionType(IntEnum):
    """Codec of a message payload; values are the wire values."""

    NONE = 0
    LZ4 = 1
    ZLIB = 2
    ZSTD = 3
    SNAPPY = 4
    ZLib = 2  # alias: the spelling of pulsar.CompressionType


_zstd_c = zstandard.ZstdCompressor(level=3)
_zstd_d = zstandard.ZstdDecompressor()


def compress(codec: CompressionType, data: bytes) -> bytes:
    """Compress ``data`` with ``codec``."""
    if codec == CompressionType.NONE:
        return data
    if codec == CompressionType.LZ4:
        return lz4.block.compress(data, store_size=False)
    if codec == CompressionType.ZLIB:
        return zlib.compress(data)
    if codec == CompressionType.ZSTD:
        return _zstd_c.compress(data)
    if codec == CompressionType.SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    raise ValueError(f"unknown compression type {codec!r}")


#: Default bound on a declared uncompressed size when the caller gives none.
DEFAULT_DECOMPRESS_LIMIT = 64 * 1024 * 1024


def decompress(codec: int, data: bytes, uncompressed_size: int, limit: int = DEFAULT_DECOMPRESS_LIMIT) -> bytes:
    """Decompress ``data``; raise :class:`ProtocolError` if it does not decode to ``uncompressed_size``.

    No codec allocates more than ``min(uncompressed_size, limit)`` bytes of output: the declared
    size is checked against ``limit`` first (:class:`SizeLimitExceeded`), and a size the payload
    states itself (ZSTD's frame header, Snappy's length prefix) must equal the declared one
    before anything is decoded.
    """
    if codec == CompressionType.NONE:
        return data
    if not 0 <= uncompressed_size <= limit:
        raise SizeLimitExceeded(f"declared uncompressed size {uncompressed_size} exceeds the limit of {limit} bytes")
    try:
        if codec == CompressionType.LZ4:
            out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
        elif codec == CompressionType.ZLIB:
            # Never inflate past the declared size (a zlib bomb stops here).
            d = zlib.decompressobj()
            out = d.decompress(data, max(uncompressed_size, 1))
            if not d.eof or d.unconsumed_tail:
                raise SizeLimitExceeded(f"ZLIB payload inflates beyond the declared {uncompressed_size} bytes")
        elif codec == CompressionType.ZSTD:
            # python-zstandard sizes its output by the frame's content size and ignores
            # max_output_size when the frame states one, so check that size first.
            stated = zstandard.frame_content_size(data)
            if stated != -1 and stated != uncompressed_size:
                raise SizeLimitExceeded(
                    f"ZSTD frame states {stated} bytes, the metadata declares {uncompressed_size}"
                )
            out = _zstd_d.decompress(data, max_output_size=max(uncompressed_size, 1))
        elif codec == CompressionType.SNAPPY:
            stated = _snappy_length(data)
            if stated != uncompressed_size:
                raise SizeLimitExceeded(
                    f"SNAPPY payload states {stated} bytes, the metadata declares {uncompressed_size}"
                )
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            raise ProtocolError(f"unknown compression type {codec}")
    except ProtocolError:
        raise
    except Exception as exc:  # codec libraries raise assorted types
        raise ProtocolError(f"cannot decompress {CompressionType(codec).name} payload: {exc}") from exc
    if len(out) != uncompressed_size:
        raise ProtocolError(f"decompressed size {len(out)} differs from the declared {uncompressed_size}")
    return out


def _snappy_length(data: bytes) -> int:
    """The uncompressed length a raw Snappy block states in its varint prefix."""
    value = 0
    for i in range(min(len(data), 5)):
        b = data[i]
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value
    raise ProtocolError("SNAPPY payload has no valid length prefix")
