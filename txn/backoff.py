"""Exponential backoff with jitter for reconnects and retries."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``initial`` up to ``maximum`` seconds, with ±20% jitter."""

    def __init__(self, initial: float = 0.1, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        """The next delay."""
        d = self._next
        self._next = min(self._next * 2, self.maximum)
        return d * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        """Start again from ``initial``."""
        self._next = self.initial
