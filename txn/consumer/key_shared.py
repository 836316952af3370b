"""The Key_Shared policy of a subscription: ``ConsumerKeySharedPolicy`` and ``KeySharedMode``.

Names, defaults, checks and messages as in ``pulsar.ConsumerKeySharedPolicy``; the policy goes in
the SUBSCRIBE command's ``KeySharedMeta`` of a ``ConsumerType.KeyShared`` consumer.
"""

from __future__ import annotations

from enum import IntEnum

from ..protocol import pb

#: Key hashes (Murmur3 of the key, modulo this) fall in ``[0, HASH_RANGE_SIZE)``.
HASH_RANGE_SIZE = 65536


class KeySharedMode(IntEnum):
    """How a Key_Shared subscription splits the key-hash range among its consumers."""

    #: the broker splits the range among the consumers as they come and go
    AutoSplit = 0
    #: each consumer declares the hash ranges it takes (``sticky_ranges``)
    Sticky = 1


class ConsumerKeySharedPolicy:
    """The Key_Shared settings of ``subscribe(..., key_shared_policy=)``.

    ``sticky_ranges``: inclusive ``(start, end)`` pairs within ``[0, 65535]`` that do not overlap;
    required with ``KeySharedMode.Sticky``. ``allow_out_of_order_delivery`` lets the broker hand a
    key to a new consumer before the old one acknowledged its messages."""

    def __init__(
        self,
        key_shared_mode: KeySharedMode = KeySharedMode.AutoSplit,
        allow_out_of_order_delivery: bool = False,
        sticky_ranges: list[tuple[int, int]] | None = None,
    ) -> None:
        if key_shared_mode == KeySharedMode.Sticky and sticky_ranges is None:
            raise ValueError("When using key_shared_mode = KeySharedMode.Sticky you must also provide sticky_ranges")
        if not isinstance(key_shared_mode, KeySharedMode):
            raise TypeError(f"key_shared_mode must be a KeySharedMode, not {type(key_shared_mode).__name__}")
        self._mode = key_shared_mode
        self._out_of_order = bool(allow_out_of_order_delivery)
        self._ranges: list[tuple[int, int]] = []
        if sticky_ranges is not None:
            self._ranges = _check_ranges(sticky_ranges)

    @property
    def key_shared_mode(self) -> KeySharedMode:
        """The mode."""
        return self._mode

    @property
    def allow_out_of_order_delivery(self) -> bool:
        """Whether the broker may deliver a key's messages out of order when consumers change."""
        return self._out_of_order

    @property
    def sticky_ranges(self) -> list[tuple[int, int]]:
        """The hash ranges (``[]`` if none were given)."""
        return list(self._ranges)

    def policy(self) -> ConsumerKeySharedPolicy:
        """The policy itself (the official one returns its C++ counterpart)."""
        return self

    def to_pb(self) -> pb.KeySharedMeta:
        """The ``KeySharedMeta`` of a SUBSCRIBE command."""
        mode = pb.KeySharedMeta.STICKY if self._mode == KeySharedMode.Sticky else pb.KeySharedMeta.AUTO_SPLIT
        return pb.KeySharedMeta(
            keySharedMode=mode,
            allowOutOfOrderDelivery=self._out_of_order,
            hashRanges=[pb.IntRange(start=s, end=e) for s, e in self._ranges],
        )

    def __repr__(self) -> str:
        return (f"ConsumerKeySharedPolicy({self._mode.name}, allow_out_of_order_delivery={self._out_of_order}, "
                f"sticky_ranges={self._ranges})")


def _check_ranges(ranges: object) -> list[tuple[int, int]]:
    """``ranges`` as a list of int pairs, checked as the official client checks them."""
    try:
        pairs = [(int(s), int(e)) for s, e in ranges]  # type: ignore[attr-defined]
    except (TypeError, ValueError) as exc:
        raise TypeError(f"sticky_ranges must be a list of (int, int) pairs: {exc}") from None
    if not pairs:
        raise ValueError("Ranges for KeyShared policy must not be empty.")
    for i, (start, end) in enumerate(pairs):
        if start < 0 or end > HASH_RANGE_SIZE - 1:
            raise ValueError("KeySharedPolicy Exception: Ranges must be [0, 65535].")
        for j, (other_start, other_end) in enumerate(pairs):
            if i != j and (other_start <= start <= other_end or other_start <= end <= other_end):
                raise ValueError("Ranges for KeyShared policy with overlap.")
    return pairs
