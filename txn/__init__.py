"""txn: a native asyncio Apache Pulsar client with transactions.

``txn.Client`` (blocking) and ``txn.AsyncClient`` (asyncio) share one core. Where
they overlap the official ``pulsar-client`` API, names and parameters match.
"""

__version__ = "0.1.0"

from .auth import Authentication, AuthenticationToken  # noqa: E402
from .client import AsyncClient  # noqa: E402
from .consumer import AsyncConsumer, ConsumerType, InitialPosition  # noqa: E402
from .errors import (  # noqa: E402
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BrokerError,
    ChecksumMismatch,
    ConnectError,
    ConsumerBusy,
    CoordinatorNotFound,
    CorruptMessage,
    InvalidTopicName,
    InvalidTxnStatus,
    InvalidTxnStatusError,
    MessageTooBig,
    PayloadTooLarge,
    ProducerBusy,
    ProducerFenced,
    ProducerQueueIsFull,
    ProtocolError,
    PulsarError,
    PulsarException,
    Result,
    SubscriptionNotFound,
    Timeout,
    TooManyPartitions,
    TopicNotFound,
    TransactionConflict,
    TransactionCoordinatorNotFoundError,
    TransactionError,
    TransactionNotFound,
    TransactionTimedOut,
)
from .message import EARLIEST, LATEST, Message, MessageId, TxnID  # noqa: E402
from .producer import AsyncProducer, ProducerAccessMode  # noqa: E402
from .protocol import CompressionType  # noqa: E402
from .reader import AsyncReader  # noqa: E402
from .sync import Client, Consumer, Producer, Reader, Transaction  # noqa: E402
from .transaction import AsyncTransaction, TxnState  # noqa: E402

__all__ = [
    "EARLIEST",
    "LATEST",
    "AlreadyClosed",
    "AsyncClient",
    "AsyncConsumer",
    "AsyncProducer",
    "AsyncReader",
    "AsyncTransaction",
    "Authentication",
    "AuthenticationError",
    "AuthenticationToken",
    "AuthorizationError",
    "BrokerError",
    "ChecksumMismatch",
    "Client",
    "CompressionType",
    "ConnectError",
    "Consumer",
    "ConsumerBusy",
    "ConsumerType",
    "CoordinatorNotFound",
    "CorruptMessage",
    "InitialPosition",
    "InvalidTopicName",
    "InvalidTxnStatus",
    "InvalidTxnStatusError",
    "Message",
    "MessageId",
    "MessageTooBig",
    "PayloadTooLarge",
    "Producer",
    "ProducerAccessMode",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerQueueIsFull",
    "ProtocolError",
    "PulsarError",
    "PulsarException",
    "Reader",
    "Result",
    "SubscriptionNotFound",
    "Timeout",
    "TooManyPartitions",
    "TopicNotFound",
    "Transaction",
    "TransactionConflict",
    "TransactionCoordinatorNotFoundError",
    "TransactionError",
    "TransactionNotFound",
    "TransactionTimedOut",
    "TxnID",
    "TxnState",
]
