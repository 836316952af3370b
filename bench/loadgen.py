"""A bounded open-loop HTTP load generator (asyncio, HTTP/1.1 keep-alive), importable by benchmarks and tests.

``run_load(base_url, pick, rate=200, duration=30)`` sends ``round(rate * duration)`` GET requests,
request ``k`` scheduled at ``start + k / rate`` whatever happened to the earlier ones (open loop:
a slow answer does not delay the next send). ``pick(k)`` says which request ``k`` is.

Two times per request:

- latency, from the request's *scheduled* send time to the end of its response body. A stall of
  the server or of this process shows up in every request scheduled during it, so it is not
  hidden (no coordinated omission);
- service time, from the moment the request was actually handed to the HTTP client.

Bounds: at most ``concurrency`` requests in flight (a request whose turn comes while the cap is
reached is not sent and counted as *dropped*), at most ``max_requests`` requests in all, a
per-request timeout, and a bounded wait for the last answers.

The HTTP client is a minimal one of its own (GET only; Content-Length, chunked or
close-delimited bodies; one request per connection at a time, idle connections reused), so
that the generator spends little CPU per request: on a small machine it shares the CPUs with
the server it measures.
"""

from __future__ import annotations

import asyncio
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: ``check(status, body, content_type) -> None`` if the answer is right, else what is wrong.
Check = Callable[[int, bytes, str], str | None]


@dataclass(frozen=True, slots=True)
class Req:
    """One request of a mix: a label (the endpoint), the path and query, and a check of the answer."""

    endpoint: str
    path: str
    check: Check | None = None


@dataclass(slots=True)
class Sample:
    """What happened to one scheduled request (times in seconds on ``time.perf_counter``)."""

    k: int
    endpoint: str
    scheduled: float
    sent: float | None = None  # None: dropped (the in-flight cap was reached)
    done: float | None = None
    status: int = 0  # 0: no HTTP answer
    error: str | None = None  # transport error, wrong status or failed check

    @property
    def latency(self) -> float | None:
        """Seconds from the scheduled send time to the end of the response."""
        return None if self.done is None else self.done - self.scheduled

    @property
    def service(self) -> float | None:
        """Seconds from the actual send to the end of the response."""
        return None if self.done is None or self.sent is None else self.done - self.sent


class HttpError(Exception):
    """A malformed or truncated HTTP answer."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.close()


class HttpPool:
    """GETs over keep-alive HTTP/1.1 connections to one ``http://host:port`` (at most one request per
    connection at a time; a connection is opened whenever none is idle)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"expected http://host:port, got {base_url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.prefix = u.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = f" HTTP/1.1\r\nHost: {u.netloc}\r\nAccept: */*\r\n{extra}\r\n".encode("latin-1")
        self._idle: list[_Conn] = []
        self.opened = 0

    async def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        """``(status, headers with lower-case names, body)``; retried once on a fresh connection if a
        reused one turns out to be closed before any answer."""
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.close()
                continue
            try:
                return await self._exchange(conn, path)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                if isinstance(exc, asyncio.IncompleteReadError) and exc.partial:
                    raise
                break  # the server closed it while idle: once more on a new connection
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.opened += 1
        return await self._exchange(_Conn(reader, writer), path)

    async def _exchange(self, conn: _Conn, path: str) -> tuple[int, dict[str, str], bytes]:
        keep = done = False
        try:
            conn.writer.write(b"GET " + (self.prefix + path).encode() + self._head)
            head = await conn.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise HttpError(f"bad status line {lines[0]!r}")
            status = int(parts[1])
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
            keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
            if "content-length" in headers:
                body = await conn.reader.readexactly(int(headers["content-length"]))
            elif "chunked" in headers.get("transfer-encoding", "").lower():
                chunks = []
                for _ in range(1_000_000):  # bounded
                    size = int((await conn.reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        while (await conn.reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                            pass
                        break
                    chunks.append((await conn.reader.readexactly(size + 2))[:-2])
                body = b"".join(chunks)
            elif status in (204, 304) or 100 <= status < 200:
                body = b""
            else:
                body = await conn.reader.read(64 * 1024 * 1024)  # close-delimited
                keep = False
            done = True
            return status, headers, body
        finally:
            if keep and done:
                self._idle.append(conn)
            else:
                conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


@dataclass
class LoadResult:
    """Every sample of one run, and its bounds."""

    base_url: str
    rate: float
    duration: float
    concurrency: int
    planned: int
    samples: list[Sample]
    start: float
    end: float  # when the last answer arrived (or the drain gave up)
    max_inflight_seen: int = 0
    unanswered: int = 0  # still in flight when the drain gave up (also counted as errors)
    client_cpu_s: float = 0.0  # this process's CPU time during the run (the generator's cost)
    connections: int = 0  # connections opened

    @property
    def sent(self) -> int:
        return sum(1 for s in self.samples if s.sent is not None)

    @property
    def dropped(self) -> int:
        return sum(1 for s in self.samples if s.sent is None)

    @property
    def errors(self) -> int:
        return sum(1 for s in self.samples if s.sent is not None and s.error is not None)

    def summary(self, endpoint: str | None = None) -> dict[str, Any]:
        """Counts, achieved rate and latency/service percentiles (ms), overall or of one endpoint."""
        ss = [s for s in self.samples if endpoint is None or s.endpoint == endpoint]
        return summarize(ss, self.start, self.end)

    def endpoints(self) -> list[str]:
        """Endpoint labels in order of first appearance."""
        return list(dict.fromkeys(s.endpoint for s in self.samples))

    def first_errors(self, n: int = 5) -> list[str]:
        """The first ``n`` error descriptions."""
        return [f"{s.endpoint} #{s.k}: {s.error}" for s in self.samples if s.error is not None][:n]


def percentile(sorted_xs: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan if empty)."""
    if not sorted_xs:
        return float("nan")
    k = max(0, min(len(sorted_xs) - 1, math.ceil(p / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[k]


def summarize(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    """Counts and percentiles (ms) of ``samples``; the achieved rate is answers / (end - start)."""
    answered = [s for s in samples if s.done is not None]
    lat = sorted(s.latency * 1000 for s in answered)  # type: ignore[operator]
    svc = sorted(s.service * 1000 for s in answered)  # type: ignore[operator]
    lag = sorted((s.sent - s.scheduled) * 1000 for s in samples if s.sent is not None)
    span = max(end - start, 1e-9)
    out: dict[str, Any] = {
        "requests": len(samples),
        "sent": sum(1 for s in samples if s.sent is not None),
        "dropped": sum(1 for s in samples if s.sent is None),
        "answered": len(answered),
        "errors": sum(1 for s in samples if s.sent is not None and s.error is not None),
        "achieved_rps": len(answered) / span,
    }
    for name, xs in (("latency", lat), ("service", svc)):
        for p in (50, 90, 99):
            out[f"{name}_p{p}_ms"] = percentile(xs, p)
        out[f"{name}_max_ms"] = xs[-1] if xs else float("nan")
    out["send_lag_p99_ms"] = percentile(lag, 99)
    out["send_lag_max_ms"] = lag[-1] if lag else float("nan")
    return out


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class _State:
    inflight: int = 0
    max_inflight: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


async def run_load(
    base_url: str,
    pick: Callable[[int], Req],
    *,
    rate: float = 200.0,
    duration: float = 30.0,
    concurrency: int = 256,
    max_requests: int = 100_000,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = _stderr,
    progress_every: float = 5.0,
    label: str = "",
) -> LoadResult:
    """Send ``round(rate * duration)`` requests open-loop at ``rate``; see the module docstring."""
    if rate <= 0 or duration <= 0 or concurrency < 1:
        raise ValueError("rate, duration and concurrency must be positive")
    planned = round(rate * duration)
    if planned > max_requests:
        raise ValueError(f"{planned} requests planned, more than max_requests={max_requests}")
    samples: list[Sample] = []
    st = _State()
    prefix = f"{label}: " if label else ""
    pool = HttpPool(base_url, headers)

    async def one(s: Sample, req: Req) -> None:
        try:
            s.sent = time.perf_counter()
            async with asyncio.timeout(timeout):
                status, hdrs, body = await pool.get(req.path)  # the whole body
            s.done = time.perf_counter()
            s.status = status
            if status != 200:
                s.error = f"HTTP {status}: {body[:200].decode(errors='replace')}"
            elif req.check is not None:
                s.error = req.check(status, body, hdrs.get("content-type", ""))
        except Exception as exc:  # noqa: BLE001 - every failure is a counted error
            s.error = f"{type(exc).__name__}: {exc}"
        finally:
            st.inflight -= 1

    async def ticker() -> None:
        t_last = start
        while True:
            await asyncio.sleep(progress_every)
            now = time.perf_counter()
            lat = sorted((s.done - s.scheduled) * 1000 for s in samples
                         if s.done is not None and t_last < s.done <= now)
            answered = sum(1 for s in samples if s.done is not None)
            errors = sum(1 for s in samples if s.sent is not None and s.error is not None)
            dropped = sum(1 for s in samples if s.sent is None)
            assert progress is not None
            progress(f"{prefix}{now - start:5.1f}s: sent {len(samples) - dropped}/{planned}, answered "
                     f"{answered} ({answered / max(now - start, 1e-9):.1f} req/s), in flight {st.inflight}, "
                     f"errors {errors}, dropped {dropped}; last {now - t_last:.1f}s: latency p50 "
                     f"{percentile(lat, 50):.1f} ms, p99 {percentile(lat, 99):.1f} ms")
            t_last = now

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter() + 0.05
    tick = asyncio.create_task(ticker()) if progress is not None else None
    interval = 1.0 / rate
    unanswered = 0
    try:
        for k in range(planned):
            scheduled = start + k * interval
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            req = pick(k)
            s = Sample(k, req.endpoint, scheduled)
            samples.append(s)
            if st.inflight >= concurrency:
                s.error = "dropped: in-flight cap reached"
                continue
            st.inflight += 1
            st.max_inflight = max(st.max_inflight, st.inflight)
            task = asyncio.create_task(one(s, req))
            st.tasks.add(task)
            task.add_done_callback(st.tasks.discard)
        if st.tasks:  # bounded drain: every request has its own timeout too
            await asyncio.wait(set(st.tasks), timeout=timeout + 5)
    finally:
        left = list(st.tasks)
        unanswered = len(left)
        for task in left:
            task.cancel()
        if left:
            await asyncio.gather(*left, return_exceptions=True)
        if tick is not None:
            tick.cancel()
            await asyncio.gather(tick, return_exceptions=True)
        pool.close()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    for s in samples:
        if s.sent is not None and s.done is None and s.error is None:
            s.error = "no answer (cancelled at the end of the drain)"
    done = [s.done for s in samples if s.done is not None]
    end = max(done) if done else time.perf_counter()
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return LoadResult(base_url, rate, duration, concurrency, planned, samples, start, end,
                      max_inflight_seen=st.max_inflight, unanswered=unanswered, client_cpu_s=cpu,
                      connections=pool.opened)


def load(base_url: str, pick: Callable[[int], Req], **kw: Any) -> LoadResult:
    """:func:`run_load` in a fresh event loop (for synchronous callers)."""
    return asyncio.run(run_load(base_url, pick, **kw))
