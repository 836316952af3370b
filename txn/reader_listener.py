"""A reader's listener: ``reader_listener(reader, message)`` called for each message read.

A reader's listener runs on its consumer's message-listener machinery (the event-loop task of
:meth:`txn.consumer.AsyncConsumer.start_listener`, or the blocking client's listener thread);
:func:`reader_delivery` adapts it: each message is first recorded as read by the reader (the
position a reconnect resumes after; a partitioned reader skips what precedes its start in the
start's entry), then handed to the listener with the reader, as the official client's
``reader_listener``. While a listener is set, ``read_next()`` raises
:class:`~txn.InvalidConfiguration` (the consumer's receive does), as there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .message import Message


class ReadPosition(Protocol):
    """What a reader offers its listener's delivery: recording a message as read."""

    def admit(self, msg: Message) -> bool:
        """Record ``msg`` as read; False if the reader skips it."""
        ...


def check_reader_listener(listener: object) -> None:
    """``ValueError`` unless ``listener`` is None or callable (as ``message_listener``)."""
    if listener is not None and not callable(listener):
        raise ValueError("reader_listener must be callable")


def reader_delivery(position: ReadPosition, reader: Any,
                    listener: Callable[[Any, Message], Any]) -> Callable[[Any, Message], Any]:
    """The consumer listener that hands ``listener(reader, message)`` each message ``position``
    admits; what ``listener`` returns is passed on (the asyncio consumer awaits a coroutine)."""

    def deliver(_consumer: Any, msg: Message) -> Any:
        if position.admit(msg):
            return listener(reader, msg)
        return None

    return deliver
