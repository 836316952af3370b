"""Payload codecs: LZ4 (raw block), ZLIB, ZSTD and SNAPPY (raw block), as Pulsar stores them."""

from __future__ import annotations

import zlib
from enum import IntEnum

import cramjam
import lz4.block
import zstandard

from ..errors import ProtocolError


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


def decompress(codec: int, data: bytes, uncompressed_size: int, limit: int = 64 * 1024 * 1024) -> bytes:
    """Decompress ``data``; raise :class:`ProtocolError` if it does not decode to ``uncompressed_size``.

    ``limit`` caps the declared size, so a hostile header cannot make us allocate without bound.
    """
    if codec != CompressionType.NONE and not 0 <= uncompressed_size <= limit:
        raise ProtocolError(f"declared uncompressed size {uncompressed_size} exceeds the limit of {limit} bytes")
    try:
        if codec == CompressionType.NONE:
            out = data
        elif codec == CompressionType.LZ4:
            out = lz4.block.decompress(data, uncompressed_size=uncompressed_size)
        elif codec == CompressionType.ZLIB:
            # Bounded: never inflate past the declared size (a zlib bomb stops here).
            d = zlib.decompressobj()
            out = d.decompress(data, max(uncompressed_size, 1))
            if not d.eof or d.unconsumed_tail:
                raise ProtocolError(f"ZLIB payload inflates beyond the declared {uncompressed_size} bytes")
        elif codec == CompressionType.ZSTD:
            out = _zstd_d.decompress(data, max_output_size=max(uncompressed_size, 1))
        elif codec == CompressionType.SNAPPY:
            out = bytes(cramjam.snappy.decompress_raw(data))
        else:
            raise ProtocolError(f"unknown compression type {codec}")
    except ProtocolError:
        raise
    except Exception as exc:  # codec libraries raise assorted types
        raise ProtocolError(f"cannot decompress {CompressionType(codec).name} payload: {exc}") from exc
    if codec != CompressionType.NONE and len(out) != uncompressed_size:
        raise ProtocolError(
            f"decompressed size {len(out)} differs from the declared {uncompressed_size}"
        )
    return out
