"""Which partition a keyed message goes to: the hashing schemes of the Pulsar clients.

A message with a partition key goes to partition ``hash(key) % partitions``. The clients differ
in the hash:

- ``BoostHash`` (the default, as in the official Python client and the C++ client it wraps):
  ``boost::hash<std::string>`` of the key's UTF-8 bytes, as built into that client (Boost 1.81
  and later on 64-bit platforms: a multiply-xor hash over 8-byte little-endian words), lowered to
  31 bits.
- ``JavaStringHash`` (the Java client's default): Java's ``String.hashCode`` over the key's
  UTF-16 code units, lowered to 31 bits. (The C++ client's scheme of that name hashes bytes
  instead, which agrees for ASCII keys only.)
- ``Murmur3_32Hash``: 32-bit MurmurHash3 (seed 0) of the UTF-8 bytes, lowered to 31 bits, the
  same in the Java and C++ clients.

Choose with ``create_producer(..., hashing_scheme=HashingScheme.JavaStringHash)`` when Java
producers write to the same topic, so that a key keeps one partition.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1
_POS31 = 0x7FFFFFFF


class HashingScheme(IntEnum):
    """The partition hash of keyed messages (members and values as the C++ client's
    ``ProducerConfiguration::HashingScheme``; the official Python client has no such option)."""

    Murmur3_32Hash = 0
    BoostHash = 1
    JavaStringHash = 2


# --------------------------------------------------------------------------- BoostHash

_Q = 0x9E3779B97F4A7C15  # the golden-ratio increment of the word sequence
_K = 0xDF442D22CE4859B9  # the multiplier (its product with _Q is 1 mod 2^64)


def _mulx(a: int, b: int) -> int:
    """The 128-bit product of two 64-bit words, folded: low half xor high half."""
    r = (a & _M64) * b
    return (r & _M64) ^ (r >> 64)


def _tail_word(t: bytes) -> int:
    """The last 0..7 bytes as one word: 4..7 bytes as two overlapping 32-bit reads, 1..3 bytes
    as the first, middle and last byte."""
    n = len(t)
    if n >= 4:
        return (int.from_bytes(t[n - 4:], "little") << (8 * (n - 4))) | int.from_bytes(t[:4], "little")
    if n == 0:
        return 0
    mid, last = n >> 1, (n - 1) & 2
    return t[0] | (t[mid] << (8 * mid)) | (t[last] << (8 * last))


def boost_hash(key: str) -> int:
    """The official Python (C++) client's default partition hash of ``key`` (0 .. 2^31-1)."""
    data = key.encode("utf-8", "surrogatepass")
    n = len(data)
    w = _mulx(_Q, _K)  # the state after the seed (0)
    h = w ^ n
    whole = n - n % 8
    for p in range(0, whole, 8):
        w = (w + _Q) & _M64
        h ^= _mulx(int.from_bytes(data[p:p + 8], "little") + w, _K)
    w = (w + _Q) & _M64
    h ^= _mulx(_tail_word(data[whole:]) + w, _K)
    return _mulx(h + w, _K) & _POS31


# --------------------------------------------------------------------------- JavaStringHash


def java_string_hash(key: str) -> int:
    """Java's ``String.hashCode`` of ``key`` made non-negative, as the Java client's default
    scheme hashes a key: over its UTF-16 code units (a character outside the BMP counts twice)."""
    units = key.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & _M32
    return h & _POS31


# --------------------------------------------------------------------------- Murmur3_32Hash

_C1 = 0xCC9E2D51
_C2 = 0x1B873593


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def murmur3_32_hash(key: str) -> int:
    """32-bit MurmurHash3 (seed 0) of ``key``'s UTF-8 bytes, made non-negative."""
    data = key.encode("utf-8", "surrogatepass")
    n = len(data)
    h = 0
    whole = n - n % 4
    for p in range(0, whole, 4):
        k = int.from_bytes(data[p:p + 4], "little")
        k = (_rotl32((k * _C1) & _M32, 15) * _C2) & _M32
        h = (_rotl32(h ^ k, 13) * 5 + 0xE6546B64) & _M32
    rest = data[whole:]
    if rest:
        k = int.from_bytes(rest, "little")
        h ^= (_rotl32((k * _C1) & _M32, 15) * _C2) & _M32
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    return h & _POS31


_HASHES: dict[HashingScheme, Callable[[str], int]] = {
    HashingScheme.BoostHash: boost_hash,
    HashingScheme.JavaStringHash: java_string_hash,
    HashingScheme.Murmur3_32Hash: murmur3_32_hash,
}


def hash_function(scheme: HashingScheme) -> Callable[[str], int]:
    """The key hash of ``scheme``."""
    return _HASHES[HashingScheme(scheme)]
