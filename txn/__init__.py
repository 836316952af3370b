"""txn: a native asyncio Apache Pulsar client with transactions.

``txn.Client`` (blocking) and ``txn.AsyncClient`` (asyncio) share one core. Where
they overlap the official ``pulsar-client`` API, names and parameters match.
"""

from . import schema as schema
from .auth import (
    Authentication,
    AuthenticationBasic,
    AuthenticationOauth2,
    AuthenticationTLS,
    AuthenticationToken,
)
from .client import AsyncClient
from .consumer import AsyncConsumer, ConsumerType, InitialPosition
from .consumer.batch_receive import ConsumerBatchReceivePolicy
from .consumer.dead_letter import ConsumerDeadLetterPolicy
from .consumer.key_shared import ConsumerKeySharedPolicy, KeySharedMode
from .errors import (
    AlreadyClosed,
    AuthenticationError,
    AuthorizationError,
    BrokerError,
    ChecksumMismatch,
    ConnectError,
    ConsumerBusy,
    CoordinatorNotFound,
    CorruptMessage,
    EncryptedMessage,
    IncompatibleSchema,
    InvalidConfiguration,
    InvalidTopicName,
    InvalidTxnStatus,
    InvalidTxnStatusError,
    MessageChunk,
    MessageTooBig,
    OwnershipLost,
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
from .message import EARLIEST, LATEST, Message, MessageId, TxnID
from .producer import AsyncProducer, HashingScheme, ProducerAccessMode
from .protocol import CompressionType
from .reader import AsyncReader
from .sync import Client, Consumer, Producer, Reader, Transaction
from .transaction import AsyncTransaction, TxnState
from .version import __version__ as __version__

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
    "AuthenticationBasic",
    "AuthenticationError",
    "AuthenticationOauth2",
    "AuthenticationTLS",
    "AuthenticationToken",
    "AuthorizationError",
    "BrokerError",
    "ChecksumMismatch",
    "Client",
    "CompressionType",
    "ConnectError",
    "Consumer",
    "ConsumerBatchReceivePolicy",
    "ConsumerBusy",
    "ConsumerType",
    "CoordinatorNotFound",
    "CorruptMessage",
    "EncryptedMessage",
    "ConsumerDeadLetterPolicy",
    "ConsumerKeySharedPolicy",
    "HashingScheme",
    "IncompatibleSchema",
    "InitialPosition",
    "InvalidConfiguration",
    "InvalidTopicName",
    "InvalidTxnStatus",
    "InvalidTxnStatusError",
    "KeySharedMode",
    "Message",
    "MessageChunk",
    "MessageId",
    "MessageTooBig",
    "PayloadTooLarge",
    "Producer",
    "ProducerAccessMode",
    "ProducerBusy",
    "ProducerFenced",
    "OwnershipLost",
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
