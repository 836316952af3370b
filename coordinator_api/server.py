"""Serving the app with bounded connections (``pulsar-txn api`` uses :func:`uvicorn_options`).

uvicorn closes a connection that stays idle between requests after ``timeout_keep_alive``, but it
has no timeout for reading a request's headers: a client that connects and sends nothing, or
sends its headers a byte at a time (slowloris), holds the connection for as long as it likes,
and enough of them exhaust the server. :func:`header_timeout_protocol` adds that timeout to
uvicorn's h11 protocol: from the moment a connection opens, and from the first byte of each
following request, the request's headers must be complete within ``header_timeout_s`` or the
connection is closed. h11 also bounds the size of the headers (``max_header_bytes``: a larger
request gets 400), and ``max_connections`` bounds the connections and requests at once (503
beyond).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .settings import Settings


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a time limit on reading each request's headers."""

    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state == h11.IDLE and self.conn.our_state != h11.ERROR:
            self._arm_header_timer()  # a request has begun (or is still being read): its headers are timed
        else:
            self._disarm_header_timer()  # its headers are in (or the connection is done with)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state == h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(header_timeout_s: float) -> type[HeaderTimeoutH11Protocol]:
    """:class:`HeaderTimeoutH11Protocol` with the given header timeout."""
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,), {"header_timeout_s": header_timeout_s})


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` bounding what a client can hold: the header timeout,
    the keep-alive timeout, the header size and the connections at once."""
    return {
        "http": header_timeout_protocol(settings.header_timeout_s),
        "timeout_keep_alive": settings.keep_alive_s,
        "h11_max_incomplete_event_size": settings.max_header_bytes,
        "limit_concurrency": settings.max_connections,
    }
