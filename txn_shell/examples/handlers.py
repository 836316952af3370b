"""Example handlers for ``pulsar-txn process`` (and the tests' chaos harness)."""

from __future__ import annotations

import os

from txn.message import Message
from txn.schema import Integer, Record, String


def upper(message: Message) -> bytes:
    """Upper-case the payload."""
    return message.data().upper()


def poison_aware(message: Message) -> bytes:
    """Upper-case, but raise on payloads containing ``poison`` (to demonstrate parking)."""
    if b"poison" in message.data():
        raise ValueError(f"cannot process {message.data()[:40]!r}")
    return message.data().upper()


#: Environment variable naming a flag file: while it exists, :func:`poison_while_flagged` fails.
POISON_FLAG_ENV = "PULSAR_TXN_POISON_FLAG"


def poison_while_flagged(message: Message) -> bytes:
    """Upper-case; fail on ``poison`` payloads while the file named by ``$PULSAR_TXN_POISON_FLAG``
    exists (a bug that gets fixed: park the poison, remove the flag, replay it)."""
    flag = os.environ.get(POISON_FLAG_ENV)
    if b"poison" in message.data() and flag and os.path.exists(flag):
        raise ValueError(f"cannot process {message.data()[:40]!r} (flag {flag} is set)")
    return message.data().upper()


def mod3(message: Message) -> list[bytes]:
    """``id % 3`` outputs (0, 1 or 2) for a payload holding a decimal id, each ``<id>:<index>``:
    a handler that filters and fans out, every output unique (the chaos harness checks them)."""
    i = int(message.data())
    return [b"%d:%d" % (i, k) for k in range(i % 3)]


class Order(Record):
    """An example input record (``--input-schema json:txn_shell.examples.handlers:Order``)."""

    _avro_namespace = "pulsar_txn.examples"
    id = Integer(required=True)
    item = String()
    qty = Integer(required=True)


class OrderLine(Record):
    """An example output record (``--output-schema avro:txn_shell.examples.handlers:OrderLine``)."""

    _avro_namespace = "pulsar_txn.examples"
    order = Integer(required=True)
    n = Integer(required=True)
    item = String()


def order_lines(message: Message) -> list[OrderLine]:
    """One :class:`OrderLine` per unit of an :class:`Order` (``message.value()``; none for qty 0):
    a handler of typed values, for ``--input-schema`` and ``--output-schema``."""
    o = message.value()
    return [OrderLine(order=o.id, n=k, item=o.item) for k in range(o.qty)]
