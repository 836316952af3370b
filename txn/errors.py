"""Typed exceptions raised by ``txn``.

Every exception carries what it is about: the topic, the transaction id and the
broker's own error code and message, where they apply. Nothing is swallowed.
"""

from __future__ import annotations

from enum import Enum
from typing import Any


class Result(Enum):
    """Outcome passed to ``send_async`` callbacks: the members and values of ``pulsar.Result``.

    Two extras: ``BrokerError`` (a broker error with no member of its own; the official client
    reports it as ``UnknownError``) and the earlier short names ``InvalidTxnStatus`` and
    ``CoordinatorNotFound``, aliases of ``InvalidTxnStatusError`` and
    ``TransactionCoordinatorNotFoundError``.
    """

    Ok = 0
    UnknownError = 1
    InvalidConfiguration = 2
    Timeout = 3
    LookupError = 4
    ConnectError = 5
    ReadError = 6
    AuthenticationError = 7
    AuthorizationError = 8
    ErrorGettingAuthenticationData = 9
    BrokerMetadataError = 10
    BrokerPersistenceError = 11
    ChecksumError = 12
    ConsumerBusy = 13
    NotConnected = 14
    AlreadyClosed = 15
    InvalidMessage = 16
    ConsumerNotInitialized = 17
    ProducerNotInitialized = 18
    ProducerBusy = 19
    TooManyLookupRequestException = 20
    InvalidTopicName = 21
    InvalidUrl = 22
    ServiceUnitNotReady = 23
    OperationNotSupported = 24
    ProducerBlockedQuotaExceededError = 25
    ProducerBlockedQuotaExceededException = 26
    ProducerQueueIsFull = 27
    MessageTooBig = 28
    TopicNotFound = 29
    SubscriptionNotFound = 30
    ConsumerNotFound = 31
    UnsupportedVersionError = 32
    TopicTerminated = 33
    CryptoError = 34
    IncompatibleSchema = 35
    ConsumerAssignError = 36
    CumulativeAcknowledgementNotAllowedError = 37
    TransactionCoordinatorNotFoundError = 38
    InvalidTxnStatusError = 39
    NotAllowedError = 40
    TransactionConflict = 41
    TransactionNotFound = 42
    ProducerFenced = 43
    MemoryBufferIsFull = 44
    Interrupted = 45
    BrokerError = 1000
    InvalidTxnStatus = 39
    CoordinatorNotFound = 38


class PulsarError(Exception):
    """Base of every error raised by ``txn``.

    Attributes: ``topic``, ``txn_id`` (a :class:`~txn.TxnID` or ``None``),
    ``server_error`` (the broker's error name, if the broker sent one).
    """

    result: Result = Result.UnknownError
    retriable: bool = False

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        txn_id: Any = None,
        server_error: str | None = None,
    ) -> None:
        self.message = message
        self.topic = topic
        self.txn_id = txn_id
        self.server_error = server_error
        super().__init__(self.render())

    def render(self) -> str:
        """The text ``str(exc)`` gives: the message, then the topic, transaction and broker error.

        After changing :attr:`message`, set ``exc.args = (exc.render(),)`` to refresh it."""
        parts = [self.message]
        if self.topic:
            parts.append(f"topic={self.topic}")
        if self.txn_id is not None:
            parts.append(f"txn={self.txn_id}")
        if self.server_error:
            parts.append(f"broker_error={self.server_error}")
        return " | ".join(parts)


# ------------------------------------------------------- the official client's other classes
# ``pulsar.exceptions`` has one class per ``Result`` member, each directly under
# ``PulsarException``. Those ``txn`` had no class for are below; the broker's ``ServerError``
# codes map to them in :func:`from_server_error` as the C++ client maps them to results.


class UnknownError(PulsarError):
    """An error without a more specific class (the broker's ``UnknownError``)."""

    result = Result.UnknownError


class LookupError(PulsarError):  # noqa: A001 - the official client's name
    """A topic lookup failed (official ``pulsar.LookupError``; it shadows the builtin only when
    imported by name)."""

    result = Result.LookupError


class ReadError(PulsarError):
    """Reading from the broker's connection failed."""

    result = Result.ReadError


class ErrorGettingAuthenticationData(PulsarError):
    """The authentication plugin could not produce its credentials (e.g. a token provider failed)."""

    result = Result.ErrorGettingAuthenticationData


class BrokerMetadataError(PulsarError):
    """The broker failed on its metadata store (``ServerError.MetadataError``)."""

    result = Result.BrokerMetadataError


class BrokerPersistenceError(PulsarError):
    """The broker failed to persist the operation (``ServerError.PersistenceError``)."""

    result = Result.BrokerPersistenceError


class ChecksumError(PulsarError):
    """A checksum failed: the broker's ``ChecksumError`` for a sent message, or (as
    :class:`ChecksumMismatch`) a received message whose CRC32C does not match."""

    result = Result.ChecksumError


class NotConnected(PulsarError):
    """The producer or consumer has no connection to its broker at the moment."""

    result = Result.NotConnected


class InvalidMessage(PulsarError):
    """The message is not valid for the operation."""

    result = Result.InvalidMessage


class ConsumerNotInitialized(PulsarError):
    """The consumer is not ready yet."""

    result = Result.ConsumerNotInitialized


class ProducerNotInitialized(PulsarError):
    """The producer is not ready yet."""

    result = Result.ProducerNotInitialized


class TooManyLookupRequestException(PulsarError):
    """The broker throttled us (its ``TooManyRequests``; see :class:`TooManyRequests`)."""

    result = Result.TooManyLookupRequestException
    retriable = True


class InvalidUrl(PulsarError, ValueError):
    """The service URL is not a ``pulsar://`` or ``pulsar+ssl://`` URL (also a ``ValueError``)."""

    result = Result.InvalidUrl


class OperationNotSupported(PulsarError):
    """The operation is not supported (by the broker, the topic or this client)."""

    result = Result.OperationNotSupported


class ProducerBlockedQuotaExceededError(PulsarError):
    """The topic's backlog quota is exceeded and its policy refuses producers (``producer_request_hold``
    fails the producer at creation)."""

    result = Result.ProducerBlockedQuotaExceededError


class ProducerBlockedQuotaExceededException(PulsarError):
    """The topic's backlog quota is exceeded and its policy (``producer_exception``) fails sends."""

    result = Result.ProducerBlockedQuotaExceededException


class ConsumerNotFound(PulsarError):
    """The broker does not know the consumer (e.g. it was closed on the broker's side)."""

    result = Result.ConsumerNotFound


class UnsupportedVersionError(PulsarError):
    """The broker does not support the protocol version or feature the request needs."""

    result = Result.UnsupportedVersionError


class TopicTerminated(PulsarError):
    """The topic was terminated (``pulsar-admin topics terminate``): no producer may write to it."""

    result = Result.TopicTerminated


class CryptoError(PulsarError):
    """Encrypting or decrypting a message failed (see :class:`EncryptedMessage`)."""

    result = Result.CryptoError


class ConsumerAssignError(PulsarError):
    """The broker could not assign the consumer (e.g. no hash range left on a Key_Shared subscription)."""

    result = Result.ConsumerAssignError


class CumulativeAcknowledgementNotAllowedError(PulsarError, ValueError):
    """Cumulative acknowledgement on a Shared or Key_Shared subscription (also a ``ValueError``)."""

    result = Result.CumulativeAcknowledgementNotAllowedError


class MemoryBufferIsFull(PulsarError):
    """The client's memory limit for pending messages is reached."""

    result = Result.MemoryBufferIsFull


class Interrupted(PulsarError):
    """The operation was interrupted (the official client raises it when a blocking call is
    interrupted by a signal)."""

    result = Result.Interrupted


class Timeout(PulsarError):
    """An operation did not complete within its time limit."""

    result = Result.Timeout


class ConnectError(PulsarError):
    """The broker could not be reached or the connection dropped."""

    result = Result.ConnectError
    retriable = True


class AuthenticationError(PulsarError):
    """The broker rejected our credentials."""

    result = Result.AuthenticationError


class AuthorizationError(PulsarError):
    """The broker refused the operation for our role."""

    result = Result.AuthorizationError


class ProtocolError(PulsarError):
    """A frame or command from the peer was malformed; the connection is closed."""


class SizeLimitExceeded(ProtocolError):
    """A size read from the wire (a frame, a declared payload size) passes the client's bound."""


class CorruptMessage(PulsarError):
    """A message failed its checksum, or its payload does not decode within its declared bounds.

    ``receive()`` and ``read_next()`` raise it at the message's place in the stream; the
    consumer stays usable and the next call returns the next message. The entry is left
    unacknowledged (so a durable subscription keeps it); acknowledge ``message_id`` to drop
    it. ``reason`` names the check that failed: ``checksum``, ``size`` or ``decode``.
    """

    reason = "decode"

    def __init__(self, message: str, *, topic: str | None = None, message_id: Any = None) -> None:
        self.message_id = message_id
        super().__init__(message, topic=topic)

    def render(self) -> str:
        text = super().render()
        return text if self.message_id is None else f"{text} | message_id={self.message_id}"


class ChecksumMismatch(CorruptMessage, ChecksumError):
    """The payload's CRC32C does not match the one the producer computed."""

    reason = "checksum"
    result = Result.ChecksumError


class PayloadTooLarge(CorruptMessage):
    """The payload declares or decodes to more bytes than its metadata or the client's limit allow."""

    reason = "size"


class MessageChunk(CorruptMessage, OperationNotSupported):
    """One chunk of a message that its producer split into chunks (``chunking_enabled``).

    No longer raised: consumers reassemble chunked messages (:mod:`txn.consumer.chunks`), as the
    official client. Kept so that code catching it still imports.
    """

    reason = "chunk"
    result = Result.OperationNotSupported


class EncryptedMessage(CorruptMessage, CryptoError):
    """An encrypted message the consumer could not decrypt: no ``crypto_key_reader``, or no key
    of the message opens it with the reader's private key (:mod:`txn.crypto`).

    With ``crypto_failure_action=ConsumerCryptoFailureAction.FAIL`` (the default), rather than
    hand ciphertext over as the payload, ``receive()`` raises this at the message's place (left
    unacknowledged; acknowledge ``message_id`` to drop it). The official client does not deliver
    such a message either, but says nothing to the application. ``DISCARD`` acknowledges it and
    ``CONSUME`` hands it over still encrypted instead, as there.
    """

    reason = "encrypted"
    result = Result.CryptoError


class TooManyPartitions(PulsarError):
    """The broker reported more partitions for a topic than the client's ``max_partitions``."""


class AlreadyClosed(PulsarError):
    """The client, producer or consumer was closed."""

    result = Result.AlreadyClosed


class InvalidConfiguration(PulsarError):
    """A call the consumer's or producer's configuration does not allow (e.g. ``receive()`` on a
    consumer with a ``message_listener``)."""

    result = Result.InvalidConfiguration


class InvalidTopicName(PulsarError, ValueError):
    """The topic name is not a valid Pulsar topic name."""

    result = Result.InvalidTopicName


class TopicNotFound(PulsarError):
    """The topic does not exist and could not be created."""

    result = Result.TopicNotFound


class MessageTooBig(PulsarError, ValueError):
    """The message is larger than the broker's ``maxMessageSize``."""

    result = Result.MessageTooBig


class ProducerQueueIsFull(PulsarError):
    """The producer's pending window is full and ``block_if_queue_full`` is off."""

    result = Result.ProducerQueueIsFull


class ProducerFenced(PulsarError):
    """Another producer took exclusive access to the topic."""

    result = Result.ProducerFenced


class ProducerBusy(PulsarError):
    """A producer with the same name is already connected."""

    result = Result.ProducerBusy
    retriable = True


class ConsumerBusy(PulsarError):
    """The subscription does not admit another consumer (e.g. Exclusive)."""

    result = Result.ConsumerBusy


class SubscriptionNotFound(PulsarError):
    """The subscription does not exist."""

    result = Result.SubscriptionNotFound


class ServiceNotReady(PulsarError):
    """The broker is not ready for the topic yet (retriable after a new lookup)."""

    result = Result.ServiceUnitNotReady
    retriable = True


class TooManyRequests(TooManyLookupRequestException):
    """The broker throttled us (retriable); the official client's ``TooManyLookupRequestException``."""


class BrokerError(UnknownError):
    """Any other error the broker reported (an :class:`UnknownError`, as the official client
    reports it; ``result`` is ``Result.BrokerError``)."""

    result = Result.BrokerError


# --------------------------------------------------------------------- transactions


class TransactionError(PulsarError):
    """Base of transaction errors."""


class TransactionConflict(TransactionError):
    """Another transaction already holds an ack on the same message."""

    result = Result.TransactionConflict


class TransactionNotFound(TransactionError):
    """The coordinator does not know the transaction (ended, timed out or never existed)."""

    result = Result.TransactionNotFound


class TransactionTimedOut(TransactionNotFound):
    """The transaction outlived its timeout and the broker aborted it."""


class InvalidTxnStatus(TransactionError):
    """The transaction is in a state that does not allow the operation."""

    result = Result.InvalidTxnStatusError


class CoordinatorNotFound(TransactionError):
    """No transaction coordinator is available (are transactions enabled on the broker?)."""

    result = Result.TransactionCoordinatorNotFoundError
    retriable = True


class OwnershipLost(PulsarError):
    """Another instance of the job took over an input partition (it fenced this one out).

    Raised by the exactly-once processor and the Spark runtime when a batch touches a partition
    whose fence another owner holds: the batch is abandoned (nothing of it commits) and its inputs
    are left to the new owner. ``topic`` names the input partition."""


class IncompatibleSchema(PulsarError):
    """The broker's schema registry refused the producer's or consumer's schema."""

    result = Result.IncompatibleSchema


class NotAllowed(PulsarError):
    """The broker does not allow the operation."""

    result = Result.NotAllowedError


# The official client's names for the same classes (``pulsar.PulsarException`` and friends), so
# that ported ``except`` clauses keep working.
PulsarException = PulsarError
InvalidTxnStatusError = InvalidTxnStatus
TransactionCoordinatorNotFoundError = CoordinatorNotFound
NotAllowedError = NotAllowed
ServiceUnitNotReady = ServiceNotReady


_BY_SERVER_ERROR: dict[str, type[PulsarError]] = {
    "UnknownError": BrokerError,
    "MetadataError": BrokerMetadataError,
    "PersistenceError": BrokerPersistenceError,
    "AuthenticationError": AuthenticationError,
    "AuthorizationError": AuthorizationError,
    "ConsumerBusy": ConsumerBusy,
    "ServiceNotReady": ServiceNotReady,
    "ProducerBlockedQuotaExceededError": ProducerBlockedQuotaExceededError,
    "ProducerBlockedQuotaExceededException": ProducerBlockedQuotaExceededException,
    "ChecksumError": ChecksumError,
    "UnsupportedVersionError": UnsupportedVersionError,
    "TopicNotFound": TopicNotFound,
    "SubscriptionNotFound": SubscriptionNotFound,
    "ConsumerNotFound": ConsumerNotFound,
    "TooManyRequests": TooManyRequests,
    "TopicTerminatedError": TopicTerminated,
    "ProducerBusy": ProducerBusy,
    "InvalidTopicName": InvalidTopicName,
    "IncompatibleSchema": IncompatibleSchema,
    "ConsumerAssignError": ConsumerAssignError,
    "TransactionCoordinatorNotFound": CoordinatorNotFound,
    "InvalidTxnStatus": InvalidTxnStatus,
    "NotAllowedError": NotAllowed,
    "TransactionConflict": TransactionConflict,
    "TransactionNotFound": TransactionNotFound,
    "ProducerFenced": ProducerFenced,
}


def from_server_error(
    server_error: str, message: str, *, topic: str | None = None, txn_id: Any = None
) -> PulsarError:
    """Map a broker ``ServerError`` name to the matching typed exception.

    Every ``ServerError`` has a class, the one whose ``result`` is the ``Result`` the C++ client
    maps the code to (``MetadataError`` -> ``BrokerMetadataError``, ``ServiceNotReady`` ->
    ``ServiceUnitNotReady``, ``TooManyRequests`` -> ``TooManyLookupRequestException``,
    ``TopicTerminatedError`` -> ``TopicTerminated``, ...); an unknown name is a :class:`BrokerError`."""
    cls = _BY_SERVER_ERROR.get(server_error, BrokerError)
    text = message or server_error
    # The broker reports "transaction not found" for conflicts in some paths and
    # vice versa; trust the code, but surface the message verbatim.
    return cls(text, topic=topic, txn_id=txn_id, server_error=server_error)
