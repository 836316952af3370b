"""End-to-end encryption against the official client (issue 19): ``txn.CryptoKeyReader``,
``create_producer(encryption_key=, crypto_key_reader=)``, ``subscribe`` / ``create_reader``
``(crypto_key_reader=, crypto_failure_action=)`` and ``Message.encryption_context()``.

Messages the official producer encrypted (batched or not, compressed or not, chunked) are read by
``txn`` byte-equal, and the other way round; a message that cannot be decrypted (no key reader,
or the wrong private key) meets the same fate in both clients per ``ConsumerCryptoFailureAction``
(``FAIL``: not delivered; ``txn`` raises :class:`txn.EncryptedMessage` in its place instead of
staying silent. ``DISCARD``: acknowledged. ``CONSUME``: the stored entry handed over as it is,
with the same context). The RSA keys are made for the test run with ``cryptography``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import txn
from txn.crypto import producer_encryptor

KEY = "client-rsa.pem"
PAYLOADS = [f"msg-{i}".encode() * (i + 1) for i in range(5)]


def _write_pair(d: Path, name: str, fmt: serialization.PrivateFormat) -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = d / f"{name}-private.pem", d / f"{name}-public.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(public), str(private)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Two RSA key pairs: ``right`` (PKCS#1 private key) and ``wrong`` (PKCS#8)."""
    d = tmp_path_factory.mktemp("keys")
    return {"right": _write_pair(d, "right", serialization.PrivateFormat.TraditionalOpenSSL),
            "wrong": _write_pair(d, "wrong", serialization.PrivateFormat.PKCS8)}


@pytest.fixture(scope="module")
def clients(broker: Any) -> Iterator[tuple[Any, Any]]:
    theirs = pulsar.Client(broker.service_url, operation_timeout_seconds=10)
    ours = txn.Client(broker.service_url, operation_timeout_seconds=10)
    try:
        yield theirs, ours
    finally:
        theirs.close()
        ours.close()


def _reader(top: Any, pair: tuple[str, str]) -> Any:
    return top.CryptoKeyReader(*pair)


def _send(producer: Any) -> None:
    """PAYLOADS with properties and keys, asynchronously (one batch when batching is on)."""
    for i, data in enumerate(PAYLOADS):
        producer.send_async(data, None, properties={"i": str(i)}, partition_key=f"k{i}")
    producer.flush()


def _context(msg: Any) -> tuple[Any, ...]:
    """A message's encryption context, comparable across the clients."""
    ctx = msg.encryption_context()
    assert ctx is not None
    ks = ctx.keys()
    return ([(k.key, len(k.value), k.metadata) for k in ks], len(ctx.param()), ctx.algorithm(),
            ctx.compression_type().name, ctx.uncompressed_message_size(), ctx.batch_size(),
            ctx.is_decryption_failed())


def _receive_all(consumer: Any, n: int, read: bool = False) -> list[Any]:
    out = []
    for _ in range(n):
        msg = consumer.read_next(10000) if read else consumer.receive(timeout_millis=10000)
        if not read:
            consumer.acknowledge(msg)
        out.append(msg)
    return out


def _summary(msgs: list[Any]) -> list[tuple[Any, ...]]:
    return [(m.data(), m.properties(), m.partition_key(), _context(m)) for m in msgs]


# ====================================================================== no broker


def test_argument_types_as_the_official_client() -> None:
    for top in (pulsar, txn):
        with pytest.raises(ValueError):
            top.CryptoKeyReader(1, "private.pem")
    with pytest.raises(ValueError):
        producer_encryptor(1, None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        producer_encryptor("k", object())  # type: ignore[arg-type]
    assert {k: int(v) for k, v in txn.ConsumerCryptoFailureAction.__members__.items()} == \
        {k: int(v) for k, v in pulsar.ConsumerCryptoFailureAction.__members__.items()}


def test_without_the_extra_a_key_reader_names_it(keys: dict[str, tuple[str, str]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives", None)
    with pytest.raises(ImportError, match=r"pip install 'pulsar-txn\[crypto\]'"):
        producer_encryptor(KEY, txn.CryptoKeyReader(*keys["right"]))
    assert producer_encryptor(None, txn.CryptoKeyReader(*keys["right"])) is None  # nothing to encrypt


# ====================================================================== official producer -> txn

SHAPES = [  # (batching, compression)
    (False, "NONE"), (True, "NONE"), (False, "LZ4"), (True, "ZSTD"),
]


@pytest.mark.parametrize(("batching", "codec"), SHAPES, ids=[f"{'batch' if b else 'single'}-{c}" for b, c in SHAPES])
def test_official_producer_to_txn_consumer(clients: tuple[Any, Any], topic: str, keys: dict[str, tuple[str, str]],
                                           batching: bool, codec: str) -> None:
    theirs, ours = clients
    c_theirs = theirs.subscribe(topic, "theirs", crypto_key_reader=_reader(pulsar, keys["right"]))
    c_ours = ours.subscribe(topic, "ours", crypto_key_reader=_reader(txn, keys["right"]))
    r_ours = ours.create_reader(topic, txn.MessageId.earliest, crypto_key_reader=_reader(txn, keys["right"]))
    p = theirs.create_producer(topic, encryption_key=KEY, crypto_key_reader=_reader(pulsar, keys["right"]),
                               batching_enabled=batching, batching_max_publish_delay_ms=1000,
                               compression_type=getattr(pulsar.CompressionType, codec))
    _send(p)
    got_theirs, got_ours = _receive_all(c_theirs, 5), _receive_all(c_ours, 5)
    assert [m.data() for m in got_ours] == PAYLOADS
    assert [(m.properties(), m.partition_key()) for m in got_ours] == [({"i": str(i)}, f"k{i}") for i in range(5)]
    assert _summary(got_ours) == _summary(got_theirs)
    ctx = _context(got_ours[0])
    assert ctx[0][0][0] == KEY and ctx[1:4] == (12, "", codec) and ctx[6] is False
    assert ctx[5] == (5 if batching else -1)
    assert [m.data() for m in _receive_all(r_ours, 5, read=True)] == PAYLOADS
    with pytest.raises(txn.Timeout):
        c_ours.receive(timeout_millis=200)
    p.close()


# ====================================================================== txn producer -> official


@pytest.mark.parametrize(("batching", "codec"), SHAPES, ids=[f"{'batch' if b else 'single'}-{c}" for b, c in SHAPES])
def test_txn_producer_to_official_consumer(clients: tuple[Any, Any], topic: str, keys: dict[str, tuple[str, str]],
                                           batching: bool, codec: str) -> None:
    theirs, ours = clients
    c_theirs = theirs.subscribe(topic, "theirs", crypto_key_reader=_reader(pulsar, keys["right"]))
    r_theirs = theirs.create_reader(topic, pulsar.MessageId.earliest, crypto_key_reader=_reader(pulsar, keys["right"]))
    c_ours = ours.subscribe(topic, "ours", crypto_key_reader=_reader(txn, keys["right"]))
    c_plain = ours.subscribe(topic, "no-reader")
    p = ours.create_producer(topic, encryption_key=KEY, crypto_key_reader=_reader(txn, keys["right"]),
                             batching_enabled=batching, batching_max_publish_delay_ms=1000,
                             compression_type=getattr(txn.CompressionType, codec))
    _send(p)
    got_theirs = _receive_all(c_theirs, 5)
    assert [m.data() for m in got_theirs] == PAYLOADS
    assert [(m.properties(), m.partition_key()) for m in got_theirs] == [({"i": str(i)}, f"k{i}") for i in range(5)]
    assert _summary(_receive_all(c_ours, 5)) == _summary(got_theirs)
    assert [m.data() for m in _receive_all(r_theirs, 5, read=True)] == PAYLOADS
    with pytest.raises(txn.EncryptedMessage):  # stored encrypted: without a key reader, not readable
        c_plain.receive(timeout_millis=10000)
    p.close()


def test_chunked_encrypted_messages_both_ways(clients: tuple[Any, Any], topic: str,
                                              keys: dict[str, tuple[str, str]]) -> None:
    """Each chunk is encrypted on its own (as the official producer does); 6 MiB: two chunks."""
    theirs, ours = clients
    big = bytes(range(256)) * (6 * 4096)
    c_theirs = theirs.subscribe(topic, "theirs", crypto_key_reader=_reader(pulsar, keys["right"]))
    c_ours = ours.subscribe(topic, "ours", crypto_key_reader=_reader(txn, keys["right"]))
    p_theirs = theirs.create_producer(topic, encryption_key=KEY, crypto_key_reader=_reader(pulsar, keys["right"]),
                                      chunking_enabled=True, batching_enabled=False)
    p_ours = ours.create_producer(topic, encryption_key=KEY, crypto_key_reader=_reader(txn, keys["right"]),
                                  chunking_enabled=True, batching_enabled=False)
    p_theirs.send(big)
    p_ours.send(big[::-1])
    for c in (c_theirs, c_ours):
        got = _receive_all(c, 2)
        assert [m.data() for m in got] == [big, big[::-1]]
        assert all(";" in str(m.message_id()) for m in got)  # "first chunk;last chunk": it was chunked


def test_unusable_public_key_fails_each_send(clients: tuple[Any, Any], topic: str, tmp_path: Path) -> None:
    """As the official client: the producer is created, each send raises ``CryptoError`` (a
    missing key file, or an EC key, which the official core cannot use); an ``encryption_key``
    without a key reader sends plaintext."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.pem").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                   serialization.PublicFormat.SubjectPublicKeyInfo))
    for top, client in zip((pulsar, txn), clients, strict=True):
        for public in (str(tmp_path / "missing.pem"), str(tmp_path / "ec.pem")):
            p = client.create_producer(topic, encryption_key=KEY, crypto_key_reader=top.CryptoKeyReader(public, public),
                                       batching_enabled=False)
            with pytest.raises(top.CryptoError):
                p.send(b"x")
            p.close()
        c = client.subscribe(topic, f"plain-{top.__name__}",
                             crypto_failure_action=top.ConsumerCryptoFailureAction.CONSUME)
        p = client.create_producer(topic, encryption_key=KEY, batching_enabled=False)
        p.send(b"plain")
        msg = c.receive(timeout_millis=10000)
        assert (msg.data(), msg.encryption_context()) == (b"plain", None)
        p.close()
        c.close()


# ====================================================================== crypto_failure_action

FAILURES = ["no-reader", "wrong-key"]


def _send_failing_entries(theirs: Any, topic: str, keys: dict[str, tuple[str, str]]) -> None:
    """Two single messages, then a batch of two (LZ4), all encrypted by the official producer."""
    reader = _reader(pulsar, keys["right"])
    single = theirs.create_producer(topic, encryption_key=KEY, crypto_key_reader=reader, batching_enabled=False,
                                    compression_type=pulsar.CompressionType.LZ4)
    single.send(b"msg-0")
    single.send(b"msg-1")
    batched = theirs.create_producer(topic, encryption_key=KEY, crypto_key_reader=reader, batching_enabled=True,
                                     batching_max_publish_delay_ms=1000, compression_type=pulsar.CompressionType.LZ4)
    batched.send_async(b"msg-2", None)
    batched.send_async(b"msg-3", None)
    batched.flush()
    single.close()
    batched.close()


def _failing_reader(top: Any, failure: str, keys: dict[str, tuple[str, str]]) -> dict[str, Any]:
    if failure == "no-reader":
        return {}
    right_public, _ = keys["right"]
    return {"crypto_key_reader": top.CryptoKeyReader(right_public, keys["wrong"][1])}


@pytest.mark.parametrize("failure", FAILURES)
def test_consume_hands_over_what_the_official_hands_over(clients: tuple[Any, Any], topic: str,
                                                         keys: dict[str, tuple[str, str]], failure: str) -> None:
    """The stored entries, still encrypted and compressed (the batch as one message), with the
    context saying so; readers too."""
    theirs, ours = clients
    # Never acks: the readers and the second subscription re-read what the first acked (retention none deletes it).
    theirs.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest,
                     crypto_failure_action=pulsar.ConsumerCryptoFailureAction.CONSUME)
    _send_failing_entries(theirs, topic, keys)
    got = {}
    for name, top, client in (("theirs", pulsar, theirs), ("ours", txn, ours)):
        kw = {**_failing_reader(top, failure, keys), "crypto_failure_action": top.ConsumerCryptoFailureAction.CONSUME}
        c = client.subscribe(topic, f"consume-{name}", initial_position=top.InitialPosition.Earliest, **kw)
        r = client.create_reader(topic, top.MessageId.earliest, **kw)
        got[name] = [_summary(_receive_all(c, 3)), _summary(_receive_all(r, 3, read=True))]
        with pytest.raises(top.Timeout):
            c.receive(timeout_millis=300)
        c.close()
        r.close()
    assert got["ours"] == got["theirs"]
    consumed = got["ours"][0]
    assert [len(m[0]) > 5 and m[0] not in (b"msg-0", b"msg-1") for m in consumed] == [True] * 3
    assert [(m[3][5], m[3][6], m[3][3]) for m in consumed] == [(-1, True, "LZ4"), (-1, True, "LZ4"), (2, True, "LZ4")]


@pytest.mark.parametrize("failure", FAILURES)
def test_fail_and_discard_as_the_official(clients: tuple[Any, Any], topic: str, keys: dict[str, tuple[str, str]],
                                          failure: str) -> None:
    """``FAIL``: nothing delivered (ours raises :class:`txn.EncryptedMessage` in the message's place
    instead), the backlog kept; ``DISCARD``: nothing delivered, the backlog acknowledged."""
    theirs, ours = clients
    _send_failing_entries(theirs, topic, keys)
    for top, client in ((pulsar, theirs), (txn, ours)):
        subs = {}
        for action in ("FAIL", "DISCARD"):
            sub = f"{top.__name__}-{action}"
            subs[action] = sub
            c = client.subscribe(topic, sub, initial_position=top.InitialPosition.Earliest,
                                 crypto_failure_action=getattr(top.ConsumerCryptoFailureAction, action),
                                 **_failing_reader(top, failure, keys))
            if top is txn and action == "FAIL":
                for _ in range(3):  # each entry, in its place, left unacknowledged
                    with pytest.raises(txn.EncryptedMessage) as info:
                        c.receive(timeout_millis=10000)
                    assert info.value.reason == "encrypted" and info.value.result == txn.Result.CryptoError
            with pytest.raises(top.Timeout):
                c.receive(timeout_millis=1000)
            c.close()
        # What is left on each subscription, read with the right key.
        for action, backlog in (("FAIL", [b"msg-0", b"msg-1", b"msg-2", b"msg-3"]), ("DISCARD", [])):
            c = client.subscribe(topic, subs[action], crypto_key_reader=_reader(top, keys["right"]))
            assert [m.data() for m in _receive_all(c, len(backlog))] == backlog, (top.__name__, action)
            with pytest.raises(top.Timeout):
                c.receive(timeout_millis=300)
            c.close()
