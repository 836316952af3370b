"""``ClientContext``: what producers, consumers and readers need of the client that made them.

The client (:class:`~txn.client.AsyncClient`) is a factory: it owns the connection pool and the
id counter, builds producers, consumers and readers, and hands each one this narrow context
instead of itself. So the modules below the client never import it, and the client's own
fields stay private to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .pool import ConnectionPool


@dataclass(frozen=True, slots=True, eq=False)
class ClientContext:
    """The parts of a client that its producers, consumers and readers use.

    - ``pool``: the connection pool (lookups, connections, partition counts, retries, the
      operation timeout);
    - ``next_id``: allocates a producer or consumer id, unique within the client;
    - ``register``: tells the client about a new producer or consumer, so that closing the
      client closes it;
    - ``forget``: tells the client that a producer or consumer has closed.
    """

    pool: ConnectionPool
    next_id: Callable[[], int]
    register: Callable[[Any], None]
    forget: Callable[[Any], None]

    @property
    def operation_timeout(self) -> float:
        """Seconds a broker operation may take (the client's ``operation_timeout_seconds``)."""
        return self.pool.operation_timeout
