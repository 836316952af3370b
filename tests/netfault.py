"""A TCP relay on 127.0.0.1 that injects network faults between clients and a server.

    relay = NetFault(("127.0.0.1", proxy_port)).start()   # clients connect to relay.url
    relay.stall(10)        # nothing forwarded for 10 s, sockets stay open, then everything flows
    relay.reset()          # every open connection closed with an RST, on both sides
    relay.blackhole(75)    # 75 s of silence: data dropped both ways, then the connections reset
    relay.slow(15, chunk=256, delay=0.01)   # forwarded in small fragments with pauses
    relay.close()

Modes (one at a time; a new fault replaces the current one, and each ends by itself):

- ``pass``: bytes are forwarded as they come, in both directions; a close (FIN) is passed on as a
  close, a reset (RST) as a reset.
- ``stall(seconds)``: nothing is forwarded in either direction and the sockets stay open. What was
  read is kept and forwarded when the stall ends (the relay stops reading meanwhile, so TCP flow
  control holds the rest in the kernel's buffers); a close seen during the stall is passed on
  after it. New connections are accepted; their upstream connection is opened when it ends.
- ``reset()``: every open connection is closed abruptly on both sides (``SO_LINGER`` 0, so the
  peers get an RST, not a FIN). Immediate; the mode stays what it was.
- ``blackhole(seconds)``: everything is dropped in both directions and the sockets stay open;
  closes are not passed on either (the peers see nothing at all, as behind a firewall that drops
  packets). New connections are accepted but stay silent (no upstream connection). When it ends,
  every connection that was accepted during it, dropped bytes or lost its peer is reset on both
  sides: its byte stream has a gap and cannot go on (as after a NAT or conntrack entry expired).
  A connection that was idle through it goes on.
- ``slow(seconds, chunk, delay)``: forwarded ``chunk`` bytes at a time with ``delay`` seconds
  between the fragments (a congested or lossy link).

Bounded: every fault ends by itself after its duration, the relay closes itself (resetting what is
open) after ``lifetime_s``, and ``close()`` stops it. It listens on 127.0.0.1 only. The asyncio loop
runs in a daemon thread; every method is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

HOST = "127.0.0.1"
READ_SIZE = 64 * 1024
CONNECT_TIMEOUT_S = 10.0


@dataclass
class _Conn:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    #: Its byte stream has a gap (bytes dropped, accepted silently, or a peer gone in a black hole).
    broken: bool = False
    tasks: list[asyncio.Task] = field(default_factory=list)
    closed: bool = False


@dataclass
class NetStats:
    """Counters of a relay (a snapshot)."""

    accepted: int = 0
    open: int = 0
    resets: int = 0  # connections reset by reset() or at the end of a black hole
    dropped_bytes: int = 0
    forwarded_bytes: int = 0
    upstream_failures: int = 0


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close ``writer``'s socket with an RST (SO_LINGER 0)."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class NetFault:
    """The relay: clients connect to :attr:`url` (or :attr:`port`), it connects to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0, lifetime_s: float = 3600.0,
                 scheme: str = "pulsar", log: Callable[[str], None] | None = None) -> None:
        self.upstream = upstream
        self.lifetime_s = lifetime_s
        self.scheme = scheme
        self._log = log
        self._want_port = port
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conns: dict[int, _Conn] = {}
        self._ids = itertools.count(1)
        self._mode = "pass"
        self._params: dict[str, float] = {}
        self._until = 0.0
        self._token = 0
        self._changed: asyncio.Event | None = None
        self._stats = NetStats()
        self._closed = False

    # ------------------------------------------------------------------ public API (any thread)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called or the lifetime ran out."""
        return self._closed

    def start(self) -> NetFault:
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._open())
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                error.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=run, name="netfault", daemon=True)
        self._thread.start()
        ready.wait(30)
        if error:
            raise error[0]
        return self

    def stall(self, seconds: float) -> None:
        """Forward nothing for ``seconds``, keep every socket open, then deliver what was held."""
        self._call(self._set_fault("stall", seconds, {}))

    def blackhole(self, seconds: float) -> None:
        """Drop everything for ``seconds`` (sockets stay open, new connections silent), then reset
        every connection whose stream has a gap."""
        self._call(self._set_fault("blackhole", seconds, {}))

    def slow(self, seconds: float, chunk: int = 256, delay: float = 0.01) -> None:
        """Forward in fragments of ``chunk`` bytes, ``delay`` seconds apart, for ``seconds``."""
        if chunk < 1 or delay < 0:
            raise ValueError("chunk must be >= 1 and delay >= 0")
        self._call(self._set_fault("slow", seconds, {"chunk": chunk, "delay": delay}))

    def passthrough(self) -> None:
        """End the current fault now (what a black hole broke is reset)."""
        self._call(self._set_fault("pass", 0, {}))

    def reset(self) -> int:
        """Close every open connection with an RST on both sides; returns how many."""
        return self._call(self._reset_all(lambda c: True, "reset"))

    def stats(self) -> NetStats:
        s = self._stats
        return NetStats(s.accepted, len(self._conns), s.resets, s.dropped_bytes, s.forwarded_bytes,
                        s.upstream_failures)

    def close(self) -> None:
        """Stop listening and reset every connection. Idempotent."""
        if self._closed or self._loop is None:
            return
        self._closed = True
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)

    def __enter__(self) -> NetFault:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals (loop thread)

    def _note(self, msg: str) -> None:
        if self._log is not None:
            self._log(f"netfault: {msg}")

    def _call(self, coro):  # noqa: ANN001, ANN202
        if self._loop is None or self._closed:
            coro.close()
            raise RuntimeError("the relay is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _open(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._handle, HOST, self._want_port)
        self.port = self._server.sockets[0].getsockname()[1]
        asyncio.get_running_loop().call_later(self.lifetime_s, self._expire_lifetime)

    def _expire_lifetime(self) -> None:
        self._note(f"lifetime of {self.lifetime_s:.0f}s over; closing")
        self._closed = True
        asyncio.get_running_loop().stop()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all(lambda c: True, "relay closed", count=False)
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in rest:
            t.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def _wake(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = asyncio.Event()

    async def _set_fault(self, mode: str, seconds: float, params: dict[str, float]) -> None:
        previous = self._mode
        self._token += 1
        token = self._token
        self._mode, self._params = mode, params
        self._until = time.monotonic() + seconds if mode != "pass" else 0.0
        if mode != "pass":
            asyncio.get_running_loop().call_later(seconds, lambda: asyncio.ensure_future(self._expire(token)))
        self._note(f"{previous} -> {mode}" + (f" for {seconds:g}s {params or ''}" if mode != "pass" else ""))
        if previous == "blackhole" and mode != "blackhole":
            await self._reset_all(lambda c: c.broken, "black hole over")
        self._wake()

    async def _expire(self, token: int) -> None:
        if token == self._token and self._mode != "pass":
            await self._set_fault("pass", 0, {})

    async def _reset_all(self, which: Callable[[_Conn], bool], why: str, count: bool = True) -> int:
        victims = [c for c in list(self._conns.values()) if which(c)]
        for c in victims:
            self._drop(c, rst=True)
        if count:
            self._stats.resets += len(victims)
        if victims:
            self._note(f"{why}: reset {len(victims)} connection(s)")
        return len(victims)

    def _drop(self, conn: _Conn, *, rst: bool) -> None:
        """Close both sides of ``conn`` (RST or FIN) and stop its pumps."""
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.id, None)
        for w in (conn.client, conn.upstream):
            if w is None:
                continue
            if rst:
                _rst(w)
            else:
                with contextlib.suppress(Exception):
                    w.close()
        current = asyncio.current_task()
        for t in conn.tasks:
            if t is not current:
                t.cancel()

    async def _gate(self) -> str:
        """Wait while stalled; then the mode that applies now (``pass``, ``slow`` or ``blackhole``)."""
        while self._mode == "stall":
            assert self._changed is not None
            await self._changed.wait()
        return self._mode

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(next(self._ids), writer)
        conn.tasks.append(asyncio.current_task())
        self._conns[conn.id] = conn
        self._stats.accepted += 1
        try:
            if await self._gate() == "blackhole":
                conn.broken = True  # accepted, silent: no upstream; reset when the black hole ends
                await self._discard(conn, reader)
                return
            try:
                up_reader, up_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                self._stats.upstream_failures += 1
                self._note(f"connection {conn.id}: upstream {self.upstream} refused ({exc!r}); resetting the client")
                self._drop(conn, rst=True)
                return
            if conn.closed:  # reset while connecting
                _rst(up_writer)
                return
            conn.upstream = up_writer
            up = asyncio.ensure_future(self._pump(conn, reader, up_writer))
            down = asyncio.ensure_future(self._pump(conn, up_reader, writer))
            conn.tasks += [up, down]
            await asyncio.gather(up, down, return_exceptions=True)
        except asyncio.CancelledError:
            pass
        finally:
            if not conn.closed:
                self._drop(conn, rst=False)

    async def _discard(self, conn: _Conn, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                data = await reader.read(READ_SIZE)
            except OSError:
                data = b""
            if not data:  # the client gave up: nothing is passed on; reset when the hole ends
                await asyncio.Event().wait()  # until cancelled by the reset
            self._stats.dropped_bytes += len(data)

    async def _pump(self, conn: _Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy ``src`` to ``dst`` through the fault modes until one side closes."""
        while True:
            try:
                data = await src.read(READ_SIZE)
                error = None
            except OSError as exc:  # an RST from that side
                data, error = b"", exc
            if not data:
                mode = await self._gate()
                if mode == "blackhole":
                    conn.broken = True  # the close is dropped; the other side is reset when the hole ends
                    await asyncio.Event().wait()  # until cancelled by the reset
                self._drop(conn, rst=error is not None)
                return
            await self._forward(conn, data, dst)

    async def _forward(self, conn: _Conn, data: bytes, dst: asyncio.StreamWriter) -> None:
        while data:
            mode = await self._gate()
            if mode == "blackhole":
                conn.broken = True
                self._stats.dropped_bytes += len(data)
                return
            if mode == "slow":
                n = int(self._params.get("chunk", 256))
                piece, data = data[:n], data[n:]
            else:
                piece, data = data, b""
            try:
                dst.write(piece)
                await dst.drain()
            except (OSError, RuntimeError):  # that side is gone: the pump reading it ends the connection
                return
            self._stats.forwarded_bytes += len(piece)
            if mode == "slow" and data:
                await asyncio.sleep(self._params.get("delay", 0.01))
