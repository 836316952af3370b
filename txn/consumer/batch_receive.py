"""``batch_receive``: :class:`ConsumerBatchReceivePolicy`, as ``pulsar.ConsumerBatchReceivePolicy``.

A batch is complete when the receive queue holds ``max_num_message`` messages or
``max_num_bytes`` bytes of payload, or when ``timeout_ms`` has passed since the call (then it
holds what has arrived, maybe nothing). A batch never passes either limit, except that its first
message is always taken, however large."""

from __future__ import annotations

import logging

log = logging.getLogger("txn.consumer")

#: The official defaults (no policy given): no count limit, 10 MiB, 100 ms.
DEFAULT_MAX_NUM_BYTES = 10 * 1024 * 1024
DEFAULT_TIMEOUT_MS = 100


class ConsumerBatchReceivePolicy:
    """Limits of one ``batch_receive()``: message count, payload bytes and the wait (ms).

    A value below 1 means no limit. At least one must be set (else ``ValueError``); with neither
    count nor bytes set, they become the defaults (no count limit, 10 MiB)."""

    def __init__(self, max_num_message: int, max_num_bytes: int, timeout_ms: int) -> None:
        for name, value in (("max_num_message", max_num_message), ("max_num_bytes", max_num_bytes),
                            ("timeout_ms", timeout_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, not {type(value).__name__}")
        if max_num_message <= 0 and max_num_bytes <= 0 and timeout_ms <= 0:
            raise ValueError("At least one of maxNumMessages, maxNumBytes and timeoutMs must be specified.")
        if max_num_message <= 0 and max_num_bytes <= 0:
            log.warning("batch receive policy without a count or byte limit: using no count limit and 10 MiB")
            max_num_message, max_num_bytes = -1, DEFAULT_MAX_NUM_BYTES
        self._max_num_message = max_num_message
        self._max_num_bytes = max_num_bytes
        self._timeout_ms = timeout_ms

    @property
    def max_num_message(self) -> int:
        """Most messages in a batch (below 1: no limit)."""
        return self._max_num_message

    @property
    def max_num_bytes(self) -> int:
        """Most payload bytes in a batch (below 1: no limit)."""
        return self._max_num_bytes

    @property
    def timeout_ms(self) -> int:
        """How long a batch may wait for its limits (below 1: until one is reached)."""
        return self._timeout_ms

    def policy(self) -> ConsumerBatchReceivePolicy:
        """The policy itself (the official ``policy()`` returns the C++ object, with these getters)."""
        return self

    def getMaxNumMessages(self) -> int:  # noqa: N802 - the official getter's name
        """As the official policy object's getter."""
        return self._max_num_message

    def getMaxNumBytes(self) -> int:  # noqa: N802 - the official getter's name
        """As the official policy object's getter."""
        return self._max_num_bytes

    def getTimeoutMs(self) -> int:  # noqa: N802 - the official getter's name
        """As the official policy object's getter."""
        return self._timeout_ms

    def capped(self, receiver_queue_size: int) -> ConsumerBatchReceivePolicy:
        """This policy with its count limit at most ``receiver_queue_size``, as the official client caps it."""
        if self._max_num_message <= receiver_queue_size:
            return self
        return ConsumerBatchReceivePolicy(receiver_queue_size, self._max_num_bytes, self._timeout_ms)

    def __repr__(self) -> str:
        return (f"ConsumerBatchReceivePolicy({self._max_num_message}, {self._max_num_bytes}, "
                f"{self._timeout_ms})")


DEFAULT_POLICY = ConsumerBatchReceivePolicy(-1, DEFAULT_MAX_NUM_BYTES, DEFAULT_TIMEOUT_MS)
