"""The official client's public names in ``txn`` (issue 19): which exist, which are still missing,
and that the ones added behave like the official ones.

Broker-free: the exact set of official top-level names ``txn`` still lacks (so the test fails
when one disappears, and when one is added without updating the list and ``docs/porting.md``);
the exception classes and where the broker's ``ServerError`` codes land; the enums; the
``ConsoleLogger``/``FileLogger`` arguments. With the shared broker, side by side with the official
client: the partition each message lands on (``message_routing_mode``), key-based batching, and
``TopicTerminated`` after the admin terminates a topic.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulsar
import pulsar.exceptions
import pulsar.schema
import pytest

import txn
from txn import errors
from txn.admin import admin_request, create_partitioned_topic, topic_path
from txn.protocol import pb

#: Official top-level names that are typing or stdlib re-exports or the Pulsar Functions API: not
#: part of the client's API, so not counted; nor are modules (``schema``, ``exceptions``, and
#: ``asyncio`` once imported).
NOT_COUNTED = {
    "Callable", "List", "Optional", "Tuple", "Union", "timedelta",
    "Function", "Context", "SerDe", "IdentitySerDe", "PickleSerDe",
}

#: Official top-level names ``txn`` has no counterpart for yet (see docs/porting.md).
STILL_MISSING = {
    "AuthenticationAthenz",  # Athenz authentication
    "BatchReceivePolicy", "KeySharedPolicy",  # the C extension's classes; ours: Consumer*Policy
    "DeadLetterPolicyBuilder",  # the C extension's builder; ours: ConsumerDeadLetterPolicy
}


def _official_counted() -> set[str]:
    return {n for n in dir(pulsar) if not n.startswith("_") and not inspect.ismodule(getattr(pulsar, n))} - NOT_COUNTED


def test_exactly_these_official_names_are_still_missing() -> None:
    missing = {n for n in _official_counted() if not hasattr(txn, n)}
    assert missing == STILL_MISSING


def test_name_counts_in_the_porting_note() -> None:
    counted = _official_counted()
    present = counted - STILL_MISSING
    assert (len(present), len(counted)) == (82, 86)
    note = (Path(__file__).parents[1] / "docs" / "porting.md").read_text()
    assert f"{len(present)} of the {len(counted)} have a counterpart" in note


# ====================================================================== exceptions

OFFICIAL_EXCEPTIONS = sorted(
    name for name, cls in vars(pulsar.exceptions).items()
    if inspect.isclass(cls) and issubclass(cls, pulsar.PulsarException) and cls is not pulsar.PulsarException
)


def test_every_official_exception_is_listed() -> None:
    assert len(OFFICIAL_EXCEPTIONS) == 45


@pytest.mark.parametrize("name", OFFICIAL_EXCEPTIONS)
def test_official_exception_has_a_counterpart_under_the_base(name: str) -> None:
    ours = getattr(txn, name)
    assert issubclass(ours, txn.PulsarException)
    assert ours.result is txn.Result[name]
    assert getattr(errors, name) is ours


def test_earlier_classes_keep_working_under_the_official_ones() -> None:
    assert txn.ServiceUnitNotReady is txn.ServiceNotReady
    assert txn.NotAllowedError is txn.NotAllowed
    assert issubclass(txn.TooManyRequests, txn.TooManyLookupRequestException) and txn.TooManyRequests.retriable
    assert issubclass(txn.BrokerError, txn.UnknownError) and txn.BrokerError.result is txn.Result.BrokerError
    assert issubclass(txn.ChecksumMismatch, txn.ChecksumError) and issubclass(txn.ChecksumMismatch, txn.CorruptMessage)
    assert issubclass(txn.EncryptedMessage, txn.CryptoError)
    assert issubclass(txn.MessageChunk, txn.OperationNotSupported)
    for cls in (txn.InvalidUrl, txn.CumulativeAcknowledgementNotAllowedError, txn.InvalidTopicName):
        assert issubclass(cls, ValueError), cls  # where txn raised ValueError before


#: Every broker ServerError code and the official exception the C++ client turns it into.
SERVER_ERRORS = {
    "UnknownError": "UnknownError",
    "MetadataError": "BrokerMetadataError",
    "PersistenceError": "BrokerPersistenceError",
    "AuthenticationError": "AuthenticationError",
    "AuthorizationError": "AuthorizationError",
    "ConsumerBusy": "ConsumerBusy",
    "ServiceNotReady": "ServiceUnitNotReady",
    "ProducerBlockedQuotaExceededError": "ProducerBlockedQuotaExceededError",
    "ProducerBlockedQuotaExceededException": "ProducerBlockedQuotaExceededException",
    "ChecksumError": "ChecksumError",
    "UnsupportedVersionError": "UnsupportedVersionError",
    "TopicNotFound": "TopicNotFound",
    "SubscriptionNotFound": "SubscriptionNotFound",
    "ConsumerNotFound": "ConsumerNotFound",
    "TooManyRequests": "TooManyLookupRequestException",
    "TopicTerminatedError": "TopicTerminated",
    "ProducerBusy": "ProducerBusy",
    "InvalidTopicName": "InvalidTopicName",
    "IncompatibleSchema": "IncompatibleSchema",
    "ConsumerAssignError": "ConsumerAssignError",
    "TransactionCoordinatorNotFound": "TransactionCoordinatorNotFoundError",
    "InvalidTxnStatus": "InvalidTxnStatusError",
    "NotAllowedError": "NotAllowedError",
    "TransactionConflict": "TransactionConflict",
    "TransactionNotFound": "TransactionNotFound",
    "ProducerFenced": "ProducerFenced",
}


def test_every_server_error_code_is_mapped() -> None:
    assert set(SERVER_ERRORS) == set(pb.ServerError.keys())


@pytest.mark.parametrize(("server_error", "official"), sorted(SERVER_ERRORS.items()))
def test_server_error_raises_the_official_class(server_error: str, official: str) -> None:
    exc = errors.from_server_error(server_error, "m", topic="t")
    assert isinstance(exc, getattr(txn, official))
    assert issubclass(getattr(pulsar, official), pulsar.PulsarException)
    assert exc.server_error == server_error and exc.topic == "t"
    if server_error != "UnknownError":  # ours: BrokerError, an UnknownError with a result of its own
        assert exc.result is txn.Result[official]


@pytest.mark.parametrize("url", ["foo://x:1", "notaurl"])
def test_bad_service_url_is_invalid_url_a_value_error_as_there(url: str) -> None:
    with pytest.raises(ValueError):
        pulsar.Client(url)
    with pytest.raises(txn.InvalidUrl):
        txn.Client(url)


# ====================================================================== enums and loggers


@pytest.mark.parametrize("name", ["BatchingType", "PartitionsRoutingMode", "LoggerLevel", "RegexSubscriptionMode"])
def test_enum_members_and_values_match(name: str) -> None:
    theirs = {k: int(v) for k, v in getattr(pulsar, name).__members__.items()}
    ours = {k: int(v) for k, v in getattr(txn, name).__members__.items()}
    assert ours == theirs


def test_bytes_schema_at_the_top_level_as_there() -> None:
    assert txn.BytesSchema is txn.schema.BytesSchema
    assert pulsar.BytesSchema is pulsar.schema.BytesSchema


def test_every_official_schema_name_exists() -> None:
    """All 19 public names of ``pulsar.schema`` (its submodules aside) are in ``txn.schema``."""
    official = {n for n in dir(pulsar.schema) if not n.startswith("_")
                and not inspect.ismodule(getattr(pulsar.schema, n))}
    assert len(official) == 19
    assert {n for n in official if not hasattr(txn.schema, n)} == set()
    assert official <= set(txn.schema.__all__)


def _raises(fn: Callable[[], Any]) -> type[BaseException] | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the type is the result
        return type(exc)
    return None


def test_logger_arguments_are_checked_as_there() -> None:
    for mod in (pulsar, txn):
        assert mod.ConsoleLogger().log_level == mod.LoggerLevel.Info
        f = mod.FileLogger(mod.LoggerLevel.Warn, "/tmp/x.log")
        assert (f.log_level, f.log_file) == (mod.LoggerLevel.Warn, "/tmp/x.log")
    for make in (lambda m: m.ConsoleLogger(1), lambda m: m.FileLogger(m.LoggerLevel.Info, 5),
                 lambda m: m.FileLogger("Info", "x.log"), lambda m: m.Client("pulsar://127.0.0.1:1", logger="x")):
        assert _raises(lambda f=make: f(pulsar)) is _raises(lambda f=make: f(txn)) is ValueError


def test_file_logger_gets_the_client_records_at_its_level(tmp_path: Path) -> None:
    path = tmp_path / "client.log"
    client = txn.Client("pulsar://127.0.0.1:1", logger=txn.FileLogger(txn.LoggerLevel.Warn, str(path)))
    log = logging.getLogger("txn.test_names")
    log.info("below the level")
    log.warning("at the level")
    client.close()
    log.warning("after close")
    text = path.read_text()
    assert "at the level" in text and "WARNING" in text
    assert "below the level" not in text and "after close" not in text


def test_custom_partition_without_a_router_is_refused() -> None:
    client = txn.Client("pulsar://127.0.0.1:1")
    try:
        with pytest.raises(ValueError, match="message_router"):
            client.create_producer("t", message_routing_mode=txn.PartitionsRoutingMode.CustomPartition)
        with pytest.raises(ValueError):
            client.create_producer("t", batching_type="KeyBased")
    finally:
        client.close()


# ====================================================================== with the broker


def _partitions(producer: Any, n: int) -> list[int]:
    return [producer.send(b"x").partition() for _ in range(n)]


def _from_start(parts: list[int], n: int = 4) -> list[int]:
    """Partitions relative to the first (both clients start the round robin at a random one)."""
    return [(p - parts[0]) % n for p in parts]


def test_routing_modes_put_messages_where_the_official_client_does(broker: Any, topic: str) -> None:
    create_partitioned_topic(broker.admin_url, topic, 4)
    theirs_c, ours_c = pulsar.Client(broker.service_url), txn.Client(broker.service_url)
    keys = ["a", "b", "c", "d", "key-7"]
    results: dict[str, list[list[int]]] = {}
    try:
        for mod, client in ((pulsar, theirs_c), (txn, ours_c)):
            rr = mod.PartitionsRoutingMode.RoundRobinDistribution
            got = []
            for batching in (False, True):
                p = client.create_producer(topic, batching_enabled=batching, message_routing_mode=rr)
                got.append(_from_start(_partitions(p, 6)))
                got.append([p.send(b"k", partition_key=k).partition() for k in keys])
                p.close()
            # a burst within one publish delay shares a batch, and so a partition
            p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                       message_routing_mode=rr)
            got.append(_from_start([mid.partition() for mid in _burst(p, 5)]))
            p.close()
            single = client.create_producer(topic, message_routing_mode=mod.PartitionsRoutingMode.UseSinglePartition)
            one = set(_partitions(single, 6))
            got.append([single.send(b"k", partition_key=k).partition() for k in keys])
            single.close()
            assert len(one) == 1 and one <= {0, 1, 2, 3}, (mod.__name__, one)
            results[mod.__name__] = got
    finally:
        theirs_c.close()
        ours_c.close()
    assert results["txn"] == results["pulsar"]
    assert results["txn"][0] == results["txn"][2] == [0, 1, 2, 3, 0, 1]
    assert results["txn"][4] == [0] * 5


def _burst(producer: Any, n: int) -> list[Any]:
    """``n`` ``send_async`` calls at once; their message ids."""
    ids: list[Any] = [None] * n
    done = threading.Semaphore(0)

    def cb(i: int) -> Callable[[Any, Any], None]:
        def f(res: Any, mid: Any) -> None:
            ids[i] = mid
            done.release()
        return f

    for i in range(n):
        producer.send_async(b"b", cb(i))
    producer.flush()
    for _ in range(n):
        assert done.acquire(timeout=10)
    return ids


def test_key_based_batching_puts_one_key_in_each_batch(broker: Any, topic: str) -> None:
    runs = ["a", "a", "a", "b", "b", "c"]
    mixed = ["a", "b", "a", "c", "c", "b"]
    grouped: dict[str, list[list[tuple[str, ...]]]] = {}
    theirs_c, ours_c = pulsar.Client(broker.service_url), txn.Client(broker.service_url)
    try:
        for mod, client in ((pulsar, theirs_c), (txn, ours_c)):
            p = client.create_producer(topic, batching_enabled=True, batching_max_publish_delay_ms=1000,
                                       batching_type=mod.BatchingType.KeyBased)
            out = []
            for keys in (runs, mixed):
                ids: list[Any] = [None] * len(keys)
                for i, k in enumerate(keys):
                    p.send_async(k.encode(), lambda res, mid, i=i, ids=ids: ids.__setitem__(i, mid), partition_key=k)
                p.flush()
                entries: dict[tuple[int, int], list[str]] = {}
                for k, mid in zip(keys, ids, strict=True):
                    entries.setdefault((mid.ledger_id(), mid.entry_id()), []).append(k)
                out.append(sorted(tuple(v) for v in entries.values()))
            p.close()
            grouped[mod.__name__] = out
    finally:
        theirs_c.close()
        ours_c.close()
    assert grouped["txn"][0] == grouped["pulsar"][0] == [("a", "a", "a"), ("b", "b"), ("c",)]
    for name in ("txn", "pulsar"):  # interleaved keys: still one key per entry (ours: more entries)
        assert all(len(set(e)) == 1 for e in grouped[name][1]), name


def test_topic_terminated_is_raised_as_there(broker: Any, topic: str) -> None:
    theirs_c, ours_c = pulsar.Client(broker.service_url), txn.Client(broker.service_url)
    try:
        theirs_p, ours_p = theirs_c.create_producer(topic), ours_c.create_producer(topic)
        theirs_p.send(b"before")
        ours_p.send(b"before")
        status, body = admin_request("POST", broker.admin_url, f"/admin/v2/{topic_path(topic)}/terminate")
        assert status == 200, body
        with pytest.raises(pulsar.TopicTerminated):
            theirs_p.send(b"after")
        with pytest.raises(txn.TopicTerminated):
            ours_p.send(b"after")
        with pytest.raises(pulsar.TopicTerminated):
            theirs_c.create_producer(topic)
        with pytest.raises(txn.TopicTerminated) as ei:
            ours_c.create_producer(topic)
        assert ei.value.server_error == "TopicTerminatedError"
    finally:
        theirs_c.close()
        ours_c.close()
