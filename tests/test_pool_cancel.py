"""A cancelled connection attempt never cancels the others that wait on it.

The pool shares one connection attempt per broker between every caller. When the caller that made
the attempt is cancelled (a timeout around a read, a stopping task), the callers waiting on the same
attempt must get a ``PulsarError`` they retry on, not a ``CancelledError``: that ended a producer's
reconnect loop, and the producer then waited for a connection forever (its sends timed out one
after another while the broker was up again). No broker is needed: a loopback server that accepts
and never answers the handshake holds the attempt open.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from txn.errors import ConnectError, PulsarError
from txn.pool import ConnectionPool


def test_waiters_of_a_cancelled_attempt_get_a_pulsar_error():
    async def main():
        async def silent(reader, writer):  # accepts, reads, never answers
            with contextlib.suppress(Exception):
                await reader.read()

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"pulsar://127.0.0.1:{port}", auth=None, operation_timeout=5, connection_timeout=5,
                              keepalive_interval=30)
        try:
            maker = asyncio.ensure_future(pool.get())
            await asyncio.sleep(0.2)  # the attempt is under way
            waiter = asyncio.ensure_future(pool.get())
            await asyncio.sleep(0.2)
            maker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await maker
            with pytest.raises(PulsarError) as got:
                await asyncio.wait_for(waiter, 10)
            assert isinstance(got.value, ConnectError)
            assert "CancelledError" in str(got.value)
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(main())
