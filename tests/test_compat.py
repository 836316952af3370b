"""Compatibility with the official ``pulsar-client``: the names it uses exist in ``txn`` with the
same values, and keyword names that ``txn`` renamed keep working.

Most tests need no broker; the last ones use the shared one.
"""

from __future__ import annotations

import asyncio
import inspect

import pulsar
import pytest

import txn
from txn import errors
from txn.delivery.ledger import LedgerRecord
from txn.delivery.processor import PARK_BATCH, PARK_SOURCE_TOPIC
from txn.delivery.replay import ReplayError, replay_batch

# ------------------------------------------------------------------ enums


@pytest.mark.parametrize(("ours", "theirs"), [
    (txn.CompressionType, pulsar.CompressionType),
    (txn.ConsumerType, pulsar.ConsumerType),
    (txn.InitialPosition, pulsar.InitialPosition),
    (txn.ProducerAccessMode, pulsar.ProducerAccessMode),
])
def test_enums_have_every_official_member_with_its_value(ours, theirs):
    for name, member in theirs.__members__.items():
        assert name in ours.__members__, f"{ours.__name__}.{name} is missing"
        assert int(ours[name]) == int(member), f"{ours.__name__}.{name}"


def test_compression_zlib_spellings_are_one_member():
    assert txn.CompressionType.ZLib is txn.CompressionType.ZLIB
    assert int(txn.CompressionType.ZLib) == int(pulsar.CompressionType.ZLib)


def test_result_has_every_official_member_with_its_value():
    for name, member in pulsar.Result.__members__.items():
        assert txn.Result[name].value == int(member), name
    # The extras: one member of our own, two earlier names as aliases.
    assert set(txn.Result.__members__) - set(pulsar.Result.__members__) == {
        "BrokerError", "InvalidTxnStatus", "CoordinatorNotFound"}
    assert txn.Result.InvalidTxnStatus is txn.Result.InvalidTxnStatusError
    assert txn.Result.CoordinatorNotFound is txn.Result.TransactionCoordinatorNotFoundError
    assert txn.Result.BrokerError.value not in {int(m) for m in pulsar.Result.__members__.values()}


# ------------------------------------------------------------------ errors


def test_pulsar_exception_is_the_base_error():
    assert txn.PulsarException is txn.PulsarError
    assert issubclass(txn.TransactionConflict, txn.PulsarException)


#: Exceptions both clients export under the same name.
SHARED_EXCEPTIONS = [
    "AlreadyClosed", "AuthenticationError", "AuthorizationError", "ConnectError", "ConsumerBusy",
    "InvalidTopicName", "InvalidTxnStatusError", "MessageTooBig", "ProducerBusy", "ProducerFenced",
    "ProducerQueueIsFull", "SubscriptionNotFound", "Timeout", "TopicNotFound", "TransactionConflict",
    "TransactionCoordinatorNotFoundError", "TransactionNotFound",
]


@pytest.mark.parametrize("name", SHARED_EXCEPTIONS)
def test_shared_exception_names_report_the_result_of_that_name(name):
    assert issubclass(getattr(pulsar, name), pulsar.PulsarException)  # the official one exists
    ours = getattr(txn, name)
    assert issubclass(ours, txn.PulsarError)
    assert ours.result is txn.Result[name]


def test_authorization_error_reports_authorization_not_authentication():
    assert txn.AuthorizationError.result is txn.Result.AuthorizationError
    assert txn.AuthenticationError.result is txn.Result.AuthenticationError
    exc = errors.from_server_error("AuthorizationError", "role tester may not produce", topic="t")
    assert type(exc) is txn.AuthorizationError and exc.result is txn.Result.AuthorizationError


@pytest.mark.parametrize(("server_error", "result"), [
    ("ProducerBusy", "ProducerBusy"),
    ("ConsumerBusy", "ConsumerBusy"),
    ("SubscriptionNotFound", "SubscriptionNotFound"),
    ("ServiceNotReady", "ServiceUnitNotReady"),
    ("NotAllowedError", "NotAllowedError"),
    ("TransactionCoordinatorNotFound", "TransactionCoordinatorNotFoundError"),
    ("InvalidTxnStatus", "InvalidTxnStatusError"),
    ("UnknownError", "BrokerError"),
])
def test_broker_errors_map_to_the_official_result(server_error, result):
    assert errors.from_server_error(server_error, "m").result is txn.Result[result]


def test_checksum_mismatch_reports_checksum_error():
    assert txn.ChecksumMismatch.result is txn.Result.ChecksumError


# ------------------------------------------------------------------ message ids


def test_message_id_earliest_and_latest():
    assert txn.MessageId.earliest is txn.EARLIEST
    assert txn.MessageId.latest is txn.LATEST
    assert str(txn.MessageId.earliest) == str(pulsar.MessageId.earliest)
    assert str(txn.MessageId.latest) == str(pulsar.MessageId.latest)
    # Ours serialize to what the official client reads as its own earliest / latest.
    assert str(pulsar.MessageId.deserialize(txn.EARLIEST.serialize())) == str(pulsar.MessageId.earliest)
    assert str(pulsar.MessageId.deserialize(txn.LATEST.serialize())) == str(pulsar.MessageId.latest)


def test_message_ids_cross_serialize():
    # Both: MessageId(partition, ledger_id, entry_id, batch_index).
    theirs = pulsar.MessageId(2, 100, 7, 3)
    ours = txn.MessageId.deserialize(theirs.serialize())
    assert (ours.ledger_id(), ours.entry_id(), ours.partition(), ours.batch_index()) == (100, 7, 2, 3)
    assert str(ours) == str(theirs)
    back = pulsar.MessageId.deserialize(txn.MessageId(2, 100, 7, 3).serialize())
    assert (back.ledger_id(), back.entry_id(), back.partition(), back.batch_index()) == (100, 7, 2, 3)


# ------------------------------------------------------------------ timeout names


def test_timeout_names_follow_the_rule():
    """Client API: ``timeout_millis``; delivery configuration: ``txn_timeout_ms`` (docs/porting.md)."""
    assert "timeout_millis" in inspect.signature(txn.AsyncClient.new_transaction).parameters
    assert "timeout_millis" in inspect.signature(txn.Client.new_transaction).parameters
    assert "timeout_millis" in inspect.signature(txn.Client.transaction_from_id).parameters
    from txn.delivery.processor import ProcessorConfig

    assert "txn_timeout_ms" in {f for f in ProcessorConfig.__dataclass_fields__}
    params = inspect.signature(replay_batch).parameters
    assert "txn_timeout_ms" in params
    assert params["timeout_ms"].kind is inspect.Parameter.KEYWORD_ONLY  # the earlier name, still accepted


def test_new_transaction_takes_milliseconds(broker):
    async def go():
        async with txn.AsyncClient(broker.service_url) as c:
            t = await c.new_transaction(timeout_millis=45_000)
            try:
                return t.timeout_ms
            finally:
                await t.abort()

    assert asyncio.run(go()) == 45_000


def test_replay_accepts_the_earlier_timeout_keyword(broker, unique_name):
    """``replay_batch(timeout_ms=...)`` still works and sets the transaction's timeout."""
    ns = "persistent://public/default/"
    ledger, parked, out = (ns + unique_name(x) for x in ("ledger", "parked", "out"))
    batch_id = unique_name("batch")

    async def go():
        async with txn.AsyncClient(broker.service_url) as client:
            p = await client.create_producer(parked)
            await p.send(b"poison", properties={PARK_BATCH: batch_id, PARK_SOURCE_TOPIC: ns + "in"})
            await p.close()
            # Written as parking writes it: inside the transaction the record names (replay trusts
            # a PARKED record only then).
            t = await client.new_transaction()
            rec = LedgerRecord(kind="PARKED", job="compat", batch_id=batch_id, txn_id=str(t.id),
                               inputs={ns + "in": ["(1,2,-1,-1)"]}, outputs={parked: 1}, parked_topic=parked)
            lp = await client.create_producer(ledger)
            await lp.send(rec.to_json(), partition_key=batch_id, txn=t)
            await t.commit()
            await lp.close()

            asked: list[int] = []
            real = client.new_transaction

            async def spy(timeout_millis: int = 60000):
                asked.append(timeout_millis)
                return await real(timeout_millis=timeout_millis)

            client.new_transaction = spy
            res = await replay_batch(client, batch_id, ledger, handler=lambda m: m.data() + b"-fixed",
                                     output=out, timeout_ms=41_000)
            again = await replay_batch(client, batch_id, ledger, handler=lambda m: m.data(), output=out,
                                       txn_timeout_ms=42_000)
            with pytest.raises(ReplayError, match="not in the ledger"):
                await replay_batch(client, batch_id + "-x", ledger, handler=lambda m: m.data(), timeout_ms=1000)
            return res, again, asked

    res, again, asked = asyncio.run(go())
    assert res.replayed and res.outputs == {out: 1}
    assert asked == [41_000]
    assert not again.replayed and "already replayed" in again.message
