"""How a batch attempt fails, and how a transaction that will not be used is let go.

:class:`BatchFailed` is the batch's own fault (the handler raised, or the broker refused an
output for good): it counts towards ``max_attempts``, then narrowing and parking.
:class:`_Transient` is the broker's side (a restart, a lost connection, a busy coordinator)
before anything was acknowledged: the same batch is tried again later, without counting.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...errors import InvalidTopicName, MessageTooBig, NotAllowed, OwnershipLost, PulsarError, TopicNotFound
from ...message import Message
from ...transaction import AsyncTransaction

_PERMANENT_SEND_ERRORS = (MessageTooBig, InvalidTopicName, TopicNotFound, NotAllowed, TypeError, ValueError)


class _Transient(Exception):
    """A broker-side failure before anything was acknowledged: retry the same batch later."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _Dropped(Exception):
    """The batch was abandoned because a partition changed hands (taken over, or lost); its inputs
    were handed back. Not a failure of the batch: nothing is counted and nothing is parked."""


class BatchFailed(Exception):
    """The handler (or a permanent send failure) failed a batch; carries the failing message."""

    def __init__(self, cause: BaseException, message: Message | None) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause
        self.message = message



async def _discard_txn(t: AsyncTransaction) -> None:
    try:
        await t.abort()
    except PulsarError:
        pass  # the broker's timeout aborts it


async def _settle(*futs: asyncio.Future[Any] | None) -> None:
    """Wait for every one of ``futs``; then raise the first failure: :class:`~txn.OwnershipLost` as
    it is, another broker error as :class:`_Transient` (nothing was acknowledged yet)."""
    errors: list[BaseException] = []
    for f in futs:
        if f is None:
            continue
        try:
            await f
        except PulsarError as exc:
            errors.append(exc)
    for exc in errors:
        if isinstance(exc, OwnershipLost):
            raise exc
    if errors:
        raise _Transient(errors[0]) from errors[0]


async def _discard(task: asyncio.Task[AsyncTransaction]) -> None:
    try:
        t = await task
    except BaseException:  # noqa: BLE001 - never opened
        return
    await _discard_txn(t)



def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
