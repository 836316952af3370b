"""CRC32C (Castagnoli), the checksum Pulsar puts on every payload frame."""

from __future__ import annotations

import google_crc32c


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """Return the CRC32C of ``data`` as an unsigned 32-bit integer."""
    return google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
