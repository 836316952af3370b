"""End-to-end encryption, interoperable with the official clients.

As the official (C++-based) client: a producer makes a random 256-bit AES data key and encrypts
it with each recipient's RSA public key (OAEP, SHA-1 and MGF1-SHA1); every entry's payload (after
compression; a whole batch at once, each chunk of a chunked message on its own) is encrypted with
AES-256-GCM under a fresh 12-byte IV, the 16-byte tag appended. The metadata carries the
encrypted data keys (``encryption_keys``: key name, value, the reader's metadata) and the IV
(``encryption_param``); ``encryption_algo`` is left unset, as there. The data key is renewed
every four hours. A consumer decrypts with the private key its :class:`CryptoKeyReader` gives,
keeping decrypted data keys for the next entries. Only RSA keys: the official client's core
cannot use EC keys either.

The crypto comes from the ``cryptography`` package (the ``crypto`` extra,
``pip install 'pulsar-txn[crypto]'``), imported only when a key reader is used.
"""

from __future__ import annotations

import logging
import os
import time
from enum import IntEnum
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .args import check_type, check_type_or_none
from .errors import CryptoError
from .protocol import CompressionType, pb

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey

log = logging.getLogger("txn.crypto")

__all__ = [
    "ConsumerCryptoFailureAction",
    "CryptoKeyReader",
    "EncryptionContext",
    "EncryptionKey",
    "MessageDecryptor",
    "MessageEncryptor",
    "consumer_decryptor",
    "producer_encryptor",
]

DATA_KEY_BYTES = 32
IV_BYTES = 12
TAG_BYTES = 16
#: how long a producer uses one data key (the official client's refresh period)
DATA_KEY_TTL_S = 4 * 3600.0


class ConsumerCryptoFailureAction(IntEnum):
    """What a consumer does with a message it cannot decrypt (names and values as the official enum).

    ``FAIL`` (the default): ``receive()`` raises :class:`~txn.EncryptedMessage` at its place, and the
    entry stays unacknowledged. ``DISCARD``: the entry is acknowledged and skipped. ``CONSUME``:
    the entry is handed over as it is stored (still encrypted and compressed; a batch as one
    message), its :meth:`~txn.Message.encryption_context` saying ``is_decryption_failed()``."""

    FAIL = 0
    DISCARD = 1
    CONSUME = 2


def _backend() -> SimpleNamespace:
    """The ``cryptography`` primitives used here, or an ``ImportError`` naming the extra."""
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding, rsa
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as exc:
        raise ImportError("end-to-end encryption (crypto_key_reader) needs the 'cryptography' package: "
                          "pip install 'pulsar-txn[crypto]'") from exc
    oaep = padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA1()), algorithm=hashes.SHA1(), label=None)
    return SimpleNamespace(serialization=serialization, rsa=rsa, AESGCM=AESGCM, oaep=oaep)


class CryptoKeyReader:
    """The keys of end-to-end encryption, read from PEM files (as ``pulsar.CryptoKeyReader``).

    ``CryptoKeyReader(public_key_path, private_key_path)``: the producer encrypts its data key
    with the public key (a ``PUBLIC KEY`` or ``RSA PUBLIC KEY`` PEM), the consumer decrypts it with
    the private key (PKCS#1 or PKCS#8 PEM, unencrypted), whatever the key name, read each time one
    is needed. Subclass and override :meth:`get_public_key` / :meth:`get_private_key` to pick
    keys by name or to attach metadata."""

    def __init__(self, public_key_path: str, private_key_path: str) -> None:
        check_type(str, public_key_path, "public_key_path")
        check_type(str, private_key_path, "private_key_path")
        self.public_key_path = public_key_path
        self.private_key_path = private_key_path

    def get_public_key(self, key_name: str, metadata: dict[str, str]) -> bytes:
        """The PEM of the public key named ``key_name``; entries put in ``metadata`` travel with it."""
        with open(self.public_key_path, "rb") as f:
            return f.read()

    def get_private_key(self, key_name: str, metadata: dict[str, str]) -> bytes:
        """The PEM of the private key for ``key_name`` (``metadata``: what the producer attached)."""
        with open(self.private_key_path, "rb") as f:
            return f.read()


class EncryptionKey:
    """One encrypted data key of a message (as ``pulsar.EncryptionKey``)."""

    __slots__ = ("key", "value", "metadata")

    def __init__(self, key: str, value: bytes, metadata: dict[str, str]) -> None:
        #: the key's name (the producer's ``encryption_key``)
        self.key = key
        #: the data key, encrypted with that key
        self.value = value
        #: what the producer's key reader attached
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"EncryptionKey(key={self.key}, value_len={len(self.value)}, metadata={self.metadata})"


class EncryptionContext:
    """How a received message was encrypted (as ``pulsar.EncryptionContext``): its keys, IV,
    algorithm, compression, uncompressed size, batch size (-1: not a batch) and whether decrypting
    it failed (a ``ConsumerCryptoFailureAction.CONSUME`` message still encrypted)."""

    __slots__ = ("_keys", "_param", "_algorithm", "_compression", "_uncompressed", "_batch", "_failed")

    def __init__(self, meta: pb.MessageMetadata, failed: bool) -> None:
        self._keys = [EncryptionKey(k.key, k.value, {kv.key: kv.value for kv in k.metadata})
                      for k in meta.encryption_keys]
        self._param = meta.encryption_param
        self._algorithm = meta.encryption_algo
        self._compression = CompressionType(meta.compression)
        self._uncompressed = meta.uncompressed_size
        self._batch = meta.num_messages_in_batch if meta.HasField("num_messages_in_batch") else -1
        self._failed = failed

    def keys(self) -> list[EncryptionKey]:
        """The encrypted data keys, one per key name."""
        return list(self._keys)

    def param(self) -> bytes:
        """The IV."""
        return self._param

    def algorithm(self) -> str:
        """The metadata's ``encryption_algo`` (``""``: the official clients set none)."""
        return self._algorithm

    def compression_type(self) -> CompressionType:
        """The codec of the (decrypted) payload."""
        return self._compression

    def uncompressed_message_size(self) -> int:
        """The payload's size before compression (0 when not compressed)."""
        return self._uncompressed

    def batch_size(self) -> int:
        """Messages in the entry's batch, -1 if it is not a batch."""
        return self._batch

    def is_decryption_failed(self) -> bool:
        """True when the message was handed over still encrypted."""
        return self._failed

    def __repr__(self) -> str:
        return (f"EncryptionContext(algorithm={self._algorithm}, compression_type={self._compression.name}, "
                f"uncompressed_message_size={self._uncompressed}, is_decryption_failed={self._failed}, "
                f"keys=[{', '.join(map(repr, self._keys))}])")


class MessageEncryptor:
    """A producer's encryption: its data key, encrypted for each key name, and the payloads.

    As the official client, a public key that cannot be read or is not an RSA key does not stop
    the producer's creation: each send raises :class:`~txn.CryptoError` (:meth:`check`) until
    the key can be loaded."""

    def __init__(self, key_names: list[str], reader: CryptoKeyReader) -> None:
        self._b = _backend()
        self.key_names = list(key_names)
        self.reader = reader
        self._aead: Any = None
        self._keys: list[pb.EncryptionKeys] = []
        self._made = 0.0
        try:
            self._renew()
        except CryptoError as exc:
            log.error("%s", exc)

    def check(self) -> None:
        """Raise :class:`~txn.CryptoError` unless the data key is ready (loading the keys again if not)."""
        if self._aead is None:
            self._renew()

    def _renew(self) -> None:
        data_key = os.urandom(DATA_KEY_BYTES)
        keys = []
        for name in self.key_names:
            if not name:
                raise CryptoError("encryption key name is empty")
            metadata: dict[str, str] = {}
            try:
                pem = self.reader.get_public_key(name, metadata)
                public = self._b.serialization.load_pem_public_key(pem)
            except Exception as exc:
                raise CryptoError(f"cannot load public key {name!r}: {exc}") from exc
            if not isinstance(public, self._b.rsa.RSAPublicKey):
                raise CryptoError(f"public key {name!r} is not an RSA key (the official clients' core needs RSA)")
            value = public.encrypt(data_key, self._b.oaep)
            keys.append(pb.EncryptionKeys(key=name, value=value,
                                          metadata=[pb.KeyValue(key=k, value=v) for k, v in metadata.items()]))
        self._aead = self._b.AESGCM(data_key)
        self._keys = keys
        self._made = time.monotonic()

    def add_keys(self, meta: pb.MessageMetadata) -> None:
        """Put the encrypted data keys in ``meta`` (renewing the data key once it is four hours old)."""
        if time.monotonic() - self._made > DATA_KEY_TTL_S:
            try:
                self._renew()
            except CryptoError as exc:
                log.warning("keeping the current data key: %s", exc)
                self._made = time.monotonic()
        del meta.encryption_keys[:]
        meta.encryption_keys.extend(self._keys)

    def seal(self, meta: pb.MessageMetadata, payload: bytes) -> bytes:
        """``payload`` encrypted under a fresh IV, which goes into ``meta``; :meth:`add_keys` came first."""
        iv = os.urandom(IV_BYTES)
        meta.encryption_param = iv
        return self._aead.encrypt(iv, payload, None)

    def encrypt(self, meta: pb.MessageMetadata, payload: bytes) -> bytes:
        """``payload`` encrypted, its keys and IV put in ``meta``."""
        self.add_keys(meta)
        return self.seal(meta, payload)


class MessageDecryptor:
    """A consumer's decryption: data keys are decrypted with the reader's private key and kept
    (by their encrypted value) for the entries that follow."""

    #: decrypted data keys kept at most (the oldest is dropped)
    MAX_KEYS = 1000

    def __init__(self, reader: CryptoKeyReader) -> None:
        self._b = _backend()
        self.reader = reader
        self._data_keys: dict[bytes, Any] = {}

    def _private(self, name: str, metadata: dict[str, str]) -> RSAPrivateKey | None:
        try:
            key = self._b.serialization.load_pem_private_key(self.reader.get_private_key(name, metadata), None)
        except Exception as exc:
            log.warning("cannot load private key %r: %s", name, exc)
            return None
        return key if isinstance(key, self._b.rsa.RSAPrivateKey) else None

    def _try(self, meta: pb.MessageMetadata, payload: bytes) -> bytes | None:
        iv = meta.encryption_param
        for k in meta.encryption_keys:
            aead = self._data_keys.get(k.value)
            if aead is not None:
                try:
                    return aead.decrypt(iv, payload, None)
                except Exception:
                    continue
        return None

    def decrypt(self, meta: pb.MessageMetadata, payload: bytes) -> bytes | None:
        """``payload`` decrypted, or None if no key of ``meta`` opens it."""
        if len(meta.encryption_param) != IV_BYTES:
            return None
        plain = self._try(meta, payload)
        if plain is not None:
            return plain
        for k in meta.encryption_keys:
            if k.value in self._data_keys:
                continue
            private = self._private(k.key, {kv.key: kv.value for kv in k.metadata})
            if private is None:
                continue
            try:
                aead = self._b.AESGCM(private.decrypt(k.value, self._b.oaep))
            except Exception:
                continue
            if len(self._data_keys) >= self.MAX_KEYS:
                del self._data_keys[next(iter(self._data_keys))]
            self._data_keys[k.value] = aead
            return self._try(meta, payload)
        return None


def producer_encryptor(encryption_key: str | None,
                       crypto_key_reader: CryptoKeyReader | None) -> MessageEncryptor | None:
    """Check ``create_producer``'s encryption arguments (``ValueError`` as the official client); the
    producer's encryptor when both are given. As there, one without the other encrypts nothing."""
    check_type_or_none(str, encryption_key, "encryption_key")
    check_type_or_none(CryptoKeyReader, crypto_key_reader, "crypto_key_reader")
    if not encryption_key or crypto_key_reader is None:
        if encryption_key:
            log.warning("encryption_key %r without a crypto_key_reader: messages are not encrypted", encryption_key)
        return None
    return MessageEncryptor([encryption_key], crypto_key_reader)


def consumer_decryptor(crypto_key_reader: CryptoKeyReader | None,
                       crypto_failure_action: ConsumerCryptoFailureAction) -> MessageDecryptor | None:
    """Check ``subscribe``'s / ``create_reader``'s encryption arguments (``ValueError`` as the
    official client); the decryptor when a key reader is given."""
    check_type_or_none(CryptoKeyReader, crypto_key_reader, "crypto_key_reader")
    check_type(ConsumerCryptoFailureAction, crypto_failure_action, "crypto_failure_action")
    return None if crypto_key_reader is None else MessageDecryptor(crypto_key_reader)
