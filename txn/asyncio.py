"""``txn.asyncio``: ``from txn.asyncio import Client`` for ``from pulsar.asyncio import Client``.

The names of the official ``pulsar.asyncio`` module; they live in :mod:`txn.asyncio_compat`.
(Modules of ``txn`` get the standard library's ``asyncio`` with ``import asyncio``: imports are
absolute; nothing in ``txn`` imports this module relatively.)
"""

from .asyncio_compat import (
    BatchingType,
    Client,
    CompressionType,
    Consumer,
    ConsumerCryptoFailureAction,
    InitialPosition,
    PartitionsRoutingMode,
    Producer,
    ProducerAccessMode,
    PulsarException,
    Reader,
    RegexSubscriptionMode,
)

__all__ = [
    "BatchingType",
    "Client",
    "CompressionType",
    "Consumer",
    "ConsumerCryptoFailureAction",
    "InitialPosition",
    "PartitionsRoutingMode",
    "Producer",
    "ProducerAccessMode",
    "PulsarException",
    "Reader",
    "RegexSubscriptionMode",
]
