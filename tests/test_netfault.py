"""tests/netfault.py, the fault-injecting TCP relay, against a local echo server (no broker).

Pass-through, a stall (held, then delivered; sockets open), a reset (RST on both sides), a black
hole (silence both ways, a new connection accepted but silent, then the broken connections reset
while an idle one goes on), slow fragments, and the bounds (faults and the relay end by
themselves). A few seconds in all.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from netfault import HOST, NetFault


class _Echo:
    """A threaded echo server on 127.0.0.1 that records what it received and how each peer ended."""

    def __init__(self) -> None:
        self.sock = socket.create_server((HOST, 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self.endings: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        deadline = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                c, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        c.settimeout(30)
        with c:
            while True:
                try:
                    data = c.recv(65536)
                except ConnectionResetError:
                    self.endings.append("reset")
                    return
                except OSError:
                    self.endings.append("error")
                    return
                if not data:
                    self.endings.append("eof")
                    return
                self.received.append(data)
                c.sendall(data)

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def echo():
    e = _Echo()
    yield e
    e.close()


@pytest.fixture
def relay(echo):
    r = NetFault((HOST, echo.port), lifetime_s=60).start()
    yield r
    r.close()


def _client(relay: NetFault, timeout: float = 2.0) -> socket.socket:
    s = socket.create_connection((HOST, relay.port), timeout=timeout)
    return s


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _wait(cond, timeout: float = 3.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


@pytest.mark.timeout(10)
def test_pass_and_reset(relay, echo) -> None:
    assert relay.url == f"pulsar://{HOST}:{relay.port}"
    a, b = _client(relay), _client(relay)
    a.sendall(b"hello")
    b.sendall(b"world")
    assert _recv_exact(a, 5) == b"hello" and _recv_exact(b, 5) == b"world"
    assert relay.reset() == 2
    for s in (a, b):
        with pytest.raises(ConnectionResetError):
            s.recv(10)
        s.close()
    assert _wait(lambda: echo.endings.count("reset") == 2), echo.endings
    assert relay.stats().resets == 2 and relay.stats().open == 0
    c = _client(relay)  # new connections work after a reset
    c.sendall(b"again")
    assert _recv_exact(c, 5) == b"again"
    c.close()
    assert _wait(lambda: "eof" in echo.endings)  # a normal close is passed on as a close


@pytest.mark.timeout(10)
def test_stall_holds_then_delivers(relay, echo) -> None:
    a = _client(relay)
    a.sendall(b"before")
    assert _recv_exact(a, 6) == b"before"
    relay.stall(1.0)
    t0 = time.monotonic()
    a.sendall(b"x" * 5000)
    n = _client(relay)  # accepted during the stall; connected upstream when it ends
    n.sendall(b"new")
    a.settimeout(0.5)
    with pytest.raises(TimeoutError):
        a.recv(10)
    assert relay.mode == "stall" and b"x" not in b"".join(echo.received)
    a.settimeout(3)
    assert _recv_exact(a, 5000) == b"x" * 5000  # held, not lost
    assert time.monotonic() - t0 >= 0.9
    n.settimeout(3)
    assert _recv_exact(n, 3) == b"new"
    assert relay.mode == "pass" and relay.stats().resets == 0
    a.close()
    n.close()


@pytest.mark.timeout(10)
def test_blackhole_is_silent_then_resets_the_broken_connections(relay, echo) -> None:
    busy, idle = _client(relay), _client(relay)
    for s in (busy, idle):
        s.sendall(b"ok")
        assert _recv_exact(s, 2) == b"ok"
    relay.blackhole(1.0)
    busy.sendall(b"lost")
    late = _client(relay)  # accepted, but nothing reaches the server
    late.sendall(b"silent")
    for s in (busy, late):
        s.settimeout(0.4)
        with pytest.raises(TimeoutError):
            s.recv(10)
    assert b"lost" not in b"".join(echo.received) and b"silent" not in b"".join(echo.received)
    assert relay.stats().dropped_bytes == len(b"lost") + len(b"silent")
    for s in (busy, late):  # when the hole ends: an RST (their streams have a gap)
        s.settimeout(3)
        with pytest.raises(ConnectionResetError):
            s.recv(10)
    assert relay.mode == "pass" and relay.stats().resets == 2
    idle.sendall(b"still")  # the idle one goes on
    assert _recv_exact(idle, 5) == b"still"
    fresh = _client(relay)
    fresh.sendall(b"fresh")
    assert _recv_exact(fresh, 5) == b"fresh"
    for s in (busy, idle, late, fresh):
        s.close()


@pytest.mark.timeout(10)
def test_blackhole_does_not_pass_on_a_close(relay, echo) -> None:
    a = _client(relay)
    a.sendall(b"ok")
    assert _recv_exact(a, 2) == b"ok"
    ended = len(echo.endings)
    relay.blackhole(0.8)
    a.close()  # the FIN is dropped: the server sees nothing until the hole ends, then an RST
    time.sleep(0.4)
    assert len(echo.endings) == ended
    assert _wait(lambda: echo.endings[ended:] == ["reset"]), echo.endings


@pytest.mark.timeout(10)
def test_slow_forwards_small_fragments(relay, echo) -> None:
    a = _client(relay, timeout=5)
    relay.slow(3.0, chunk=100, delay=0.005)
    payload = bytes(range(256)) * 4
    a.sendall(payload)
    assert _recv_exact(a, len(payload)) == payload
    assert max(len(d) for d in echo.received) <= 100 and len(echo.received) >= len(payload) // 100
    relay.passthrough()
    assert relay.mode == "pass"
    a.close()


@pytest.mark.timeout(10)
def test_bounded(echo) -> None:
    r = NetFault((HOST, echo.port), lifetime_s=1.0).start()
    try:
        r.stall(0.2)
        assert _wait(lambda: r.mode == "pass", 2)  # a fault ends by itself
        assert _wait(lambda: r.closed, 3)  # and so does the relay
        time.sleep(0.2)
        with pytest.raises(OSError):
            socket.create_connection((HOST, r.port), timeout=1).close()
    finally:
        r.close()
    with pytest.raises(ValueError):
        NetFault((HOST, echo.port)).slow(1, chunk=0)
