"""``pulsar-txn api | txns | batches | jobs``: run the control plane, and use it over HTTP.

    pulsar-txn api [--host H --port P ...]      serve coordinator_api (needs the ``api`` extra)
    pulsar-txn txns list|show|abort ...         transactions, from the ledger and the coordinators
    pulsar-txn batches list|show|replay ...     batches; replay a parked one (--wait follows it)
    pulsar-txn jobs [JOB]                       per-job counts, volumes, latency

The client commands need only the standard library; they talk to ``--api-url`` (default
``$PULSAR_TXN_API_URL`` or http://127.0.0.1:8000) with ``--token`` (default
``$PULSAR_TXN_API_TOKEN``) as the bearer token. Tables for people, ``--json`` for scripts. Every
field is printed with its control characters escaped (:func:`escape`): records are written by
whoever can produce to a ledger topic, and must not drive the terminal.
Exit status: 0 done, 1 the API refused or is unreachable (or a replay failed), 2 usage.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import signal
import sys
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

ENV_URL = "PULSAR_TXN_API_URL"
ENV_TOKEN = "PULSAR_TXN_API_TOKEN"
DEFAULT_URL = "http://127.0.0.1:8000"
TXN_STATES = ("OPEN", "COMMITTED", "ABORTED")
BATCH_STATUSES = ("STARTED", "COMMITTED", "ABORTED", "PARKED", "REPLAYED")
REPLAY_DONE = ("succeeded", "noop", "failed")


class ApiError(Exception):
    """The API answered with an error status; ``detail`` is its explanation."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class Unreachable(Exception):
    """No answer from the API (refused, timed out, bad URL)."""


class ApiClient:
    """A small JSON-over-HTTP client of the control plane (urllib; no extra dependencies)."""

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token or None
        self.timeout = timeout

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> Any:
        """The decoded JSON answer; raises :class:`ApiError` or :class:`Unreachable`."""
        query = {k: v for k, v in (params or {}).items() if v is not None}
        url = self.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        req = urllib.request.Request(url, method=method, headers={"Accept": "application/json"})
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _detail(exc.read(), exc.reason)) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            why = "connection refused" if isinstance(reason, ConnectionRefusedError) else str(reason)
            raise Unreachable(f"cannot reach the control plane at {self.base_url}: {why}") from None
        except (TimeoutError, OSError) as exc:
            raise Unreachable(f"no answer from the control plane at {self.base_url}: "
                              f"{exc or type(exc).__name__}") from None
        except ValueError as exc:  # e.g. a URL without a scheme
            raise Unreachable(f"bad API URL {self.base_url!r}: {exc}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise Unreachable(f"{url} did not answer JSON (is --api-url the control plane?)") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params)

    def post(self, path: str, **params: Any) -> Any:
        return self.request("POST", path, params)


def _detail(raw: bytes, reason: Any) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        text = raw.decode(errors="replace").strip()
        return text[:300] or str(reason)
    detail = body.get("detail") if isinstance(body, dict) else body
    return detail if isinstance(detail, str) else json.dumps(detail)


def _seg(value: str) -> str:
    """One URL path segment: ids contain ':', '(' and ',', and batch ids and job names may contain
    '/', which is encoded too (the server takes such ids to the end of the path, see coordinator_api.api)."""
    return urllib.parse.quote(value, safe="")


# ----------------------------------------------------------------------------- formatting


def fmt_time(ms: int | None) -> str:
    """Local time, to the second."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(ms: int | None, now_ms: int | None = None) -> str:
    """How long ago: ``45s ago``, ``3m05s ago``, ``2h01m ago``, ``4d03h ago``."""
    if ms is None:
        return "-"
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{fmt_span((now_ms - ms) / 1000)} ago"


def fmt_span(s: float) -> str:
    s = max(0, int(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def fmt_stamp(ms: int | None) -> str:
    """Local ISO time with milliseconds and the age: for detail views."""
    if ms is None:
        return "-"
    iso = datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    return f"{iso} ({fmt_age(ms)})"


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if isinstance(ms, float) else f"{ms} ms"


#: Characters never printed raw: C0 and C1 controls and DEL (ESC starts the terminal's escape
#: sequences: colours, cursor moves, the window title), format characters (bidirectional
#: overrides that reorder what is shown), and the Unicode line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    if unicodedata.category(c) not in _UNSAFE_CATEGORIES:
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escape(value: Any) -> str:
    """``str(value)`` with every control character written as an escape (``\\x1b``, ``\\n``,
    ``\\u202e``...): whatever a record holds, printing it cannot drive the terminal. Plain text,
    accents and other scripts are kept as they are."""
    s = str(value)
    if s.isprintable():  # the common case: nothing to do
        return s
    return "".join(_escape_char(c) for c in s)


def _cell(v: Any, width: int = 60) -> str:
    s = "-" if v is None or v == "" else escape(v)
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> str:
    """Columns two spaces apart; ``right``: indexes of right-aligned (numeric) columns."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = []
    for r in [list(headers), *cells]:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key  value`` lines, keys aligned."""
    w = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(w)}  {'-' if v is None or v == '' else escape(v)}" for k, v in pairs)


def _footer(noun: str, page: dict[str, Any]) -> str:
    n, total, off = len(page["items"]), page["total"], page["offset"]
    if n == 0:
        return f"no {noun}" + (f" at offset {off} (of {total})" if total else "")
    more = f"; --offset {off + n} for more" if off + n < total else ""
    return f"{noun} {off + 1}-{off + n} of {total}{more}"


def _out(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True))


def _records_more(d: dict[str, Any]) -> str | None:
    """A line saying which records an answer holds, when it does not hold them all."""
    n, total, off = len(d.get("records") or []), d.get("records_total"), d.get("records_offset") or 0
    if total is None or off + n >= total and off == 0:
        return None
    return f"records {off + 1}-{off + n} of {total} (the API pages them: records_offset, records_limit)"


def _records_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for r in records:
        inputs = sum(len(v) for v in (r.get("inputs") or {}).values())
        outputs = sum((r.get("outputs") or {}).values())
        rows.append([r.get("kind"), r.get("txn_id"), r.get("attempt"), inputs, outputs, fmt_time(r.get("publish_ms")),
                     fmt_ms(r.get("duration_ms")), r.get("error")])
    return table(["KIND", "TXN ID", "ATTEMPT", "IN", "OUT", "PUBLISHED", "DURATION", "ERROR"], rows, right=(2, 3, 4, 6))


# ----------------------------------------------------------------------------- commands


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient(args.api_url, args.token, args.http_timeout)


def cmd_txns_list(args: argparse.Namespace) -> int:
    page = _client(args).get("/transactions", state=args.state, job=args.job, since=args.since,
                             limit=args.limit, offset=args.offset)
    if args.json:
        _out(page)
        return 0
    rows = [[t["txn_id"], t["state"], t["job"], t["batch_id"], t["attempt"], fmt_time(t["started_at_ms"]),
             fmt_ms(t["duration_ms"]), t["error"]] for t in page["items"]]
    if rows:
        print(table(["TXN ID", "STATE", "JOB", "BATCH", "ATTEMPT", "STARTED", "DURATION", "ERROR"], rows,
                    right=(4, 6)))
    print(_footer("transactions", page))
    return 0


def cmd_txns_show(args: argparse.Namespace) -> int:
    d = _client(args).get(f"/transactions/{_seg(args.txn_id)}", ledger_topic=args.ledger_topic)
    if args.json:
        _out(d)
        return 0
    led = d.get("ledger") or {}
    pairs: list[tuple[str, Any]] = [("transaction", d["txn_id"]), ("state", d["state"])]
    if led:
        pairs += [("job", led["job"]), ("batch", led["batch_id"]), ("attempt", led["attempt"]),
                  ("started", fmt_stamp(led["started_at_ms"])), ("ended", fmt_stamp(led["ended_at_ms"])),
                  ("duration", fmt_ms(led["duration_ms"])), ("error", led["error"]),
                  ("ledger topic", led["ledger_topic"])]
    else:
        pairs.append(("ledger", "not in the ledger"))
    live = d.get("live")
    if live:
        pairs += [("coordinator", live.get("status")), ("opened", fmt_stamp(live.get("opened_at_ms"))),
                  ("timeout", fmt_ms(live.get("timeout_ms"))),
                  ("produced to", ", ".join(live.get("produced_partitions") or []) or "-"),
                  ("acked on", ", ".join(live.get("acked_subscriptions") or []) or "-")]
    print(fields(pairs))
    if d.get("records"):
        print("\nledger records:")
        print(_records_table(d["records"]))
        if more := _records_more(d):
            print(more)
    return 0


def cmd_txns_abort(args: argparse.Namespace) -> int:
    res = _client(args).post(f"/transactions/{_seg(args.txn_id)}/abort")
    if args.json:
        _out(res)
    else:
        print(escape(res["message"]))
    return 0


def _batch_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [[b["batch_id"], b["job"], b["status"], b["attempts"], b["inputs"], b["outputs"], b["txn_id"],
             fmt_time(b["started_at_ms"]), fmt_ms(b["duration_ms"]), (b.get("replay") or {}).get("status")]
            for b in items]


BATCH_HEADERS = ["BATCH ID", "JOB", "STATUS", "ATTEMPTS", "IN", "OUT", "TXN ID", "STARTED", "DURATION", "REPLAY"]
BATCH_RIGHT = (3, 4, 5, 8)


def cmd_batches_list(args: argparse.Namespace) -> int:
    page = _client(args).get("/batches", job=args.job, status=args.status, limit=args.limit, offset=args.offset)
    if args.json:
        _out(page)
        return 0
    if page["items"]:
        print(table(BATCH_HEADERS, _batch_rows(page["items"]), right=BATCH_RIGHT))
    print(_footer("batches", page))
    return 0


def _replay_line(rep: dict[str, Any]) -> str:
    """``running (run 1)``, ``failed: <why> (run 1, 812 ms)``..."""
    status = rep["status"]
    if status not in REPLAY_DONE:
        return status if status == "accepted" else f"{status} (run {rep['runs']})"
    took = ""
    if rep.get("finished_at_ms") is not None and rep.get("started_at_ms") is not None:
        took = f", {rep['finished_at_ms'] - rep['started_at_ms']} ms"
    return f"{status}: {rep.get('message') or '-'} (run {rep['runs']}{took})"


def cmd_batches_show(args: argparse.Namespace) -> int:
    b = _client(args).get(f"/batches/{_seg(args.batch_id)}", ledger_topic=args.ledger_topic)
    if args.json:
        _out(b)
        return 0
    rep = b.get("replay")
    print(fields([
        ("batch", b["batch_id"]), ("job", b["job"]), ("status", b["status"]), ("attempts", b["attempts"]),
        ("transaction", b["txn_id"]), ("inputs", b["inputs"]), ("outputs", b["outputs"]),
        ("started", fmt_stamp(b["started_at_ms"])), ("ended", fmt_stamp(b["ended_at_ms"])),
        ("duration", fmt_ms(b["duration_ms"])), ("error", b["error"]), ("ledger topic", b["ledger_topic"]),
        ("parked topic", b["parked_topic"]),
        ("replay", f"{rep['replay_id']} {_replay_line(rep)}" if rep else None),
    ]))
    if b.get("records"):
        print("\nledger records:")
        print(_records_table(b["records"]))
        if more := _records_more(b):
            print(more)
    return 0


def cmd_batches_replay(args: argparse.Namespace) -> int:
    api = _client(args)
    rep = api.post(f"/batches/{_seg(args.batch_id)}/replay", ledger_topic=args.ledger_topic)
    rid = rep["replay_id"]
    progress = sys.stderr if args.json else sys.stdout
    if not args.wait:
        if args.json:
            _out(rep)
        else:
            print(escape(f"replay {rid} of batch {rep['batch_id']}: {_replay_line(rep)}"))
        return 1 if rep["status"] == "failed" else 0
    print(escape(f"replay {rid} of batch {rep['batch_id']}: {_replay_line(rep)}"), file=progress, flush=True)
    last = (rep["status"], rep["runs"])
    deadline = time.monotonic() + args.wait_timeout
    while rep["status"] not in REPLAY_DONE:
        if time.monotonic() >= deadline:
            print(escape(f"error: replay {rid} still {rep['status']} after {args.wait_timeout:g}s "
                         f"(follow it with GET /replays/{rid})"), file=sys.stderr)
            return 1
        time.sleep(args.interval)
        rep = api.get(f"/replays/{_seg(rid)}")
        if (rep["status"], rep["runs"]) != last:
            last = (rep["status"], rep["runs"])
            print(escape(f"replay {rid}: {_replay_line(rep)}"), file=progress, flush=True)
    if args.json:
        _out(rep)
    return 1 if rep["status"] == "failed" else 0


def _job_row(j: dict[str, Any]) -> list[Any]:
    by = j["batches"]
    return [j["job"], j["total_batches"], *(by.get(s, 0) for s in ("COMMITTED", "ABORTED", "PARKED", "REPLAYED",
                                                                     "STARTED")),
            j["inputs_committed"], j["outputs_committed"], j["throughput_per_s"], _num(j["commit_p50_ms"]),
            _num(j["commit_p99_ms"]), fmt_age(j["last_commit_ms"])]


def _num(v: float | None) -> str | None:
    return None if v is None else f"{v:.0f}"


JOB_HEADERS = ["JOB", "BATCHES", "COMMITTED", "ABORTED", "PARKED", "REPLAYED", "STARTED", "INPUTS", "OUTPUTS",
               "MSG/S", "P50 MS", "P99 MS", "LAST COMMIT"]


def cmd_jobs(args: argparse.Namespace) -> int:
    api = _client(args)
    if args.job is None:
        jobs = api.get("/jobs")
        if args.json:
            _out(jobs)
            return 0
        if jobs:
            print(table(JOB_HEADERS, [_job_row(j) for j in jobs], right=tuple(range(1, 12))))
        else:
            print("no jobs in the ledger yet")
        return 0
    j = api.get(f"/jobs/{_seg(args.job)}", recent=args.recent)
    if args.json:
        _out(j)
        return 0
    by = j["batches"]
    print(fields([
        ("job", j["job"]),
        ("batches", f"{j['total_batches']} (" + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) + ")"),
        ("inputs committed", j["inputs_committed"]), ("outputs committed", j["outputs_committed"]),
        ("throughput", None if j["throughput_per_s"] is None else f"{j['throughput_per_s']} msg/s"),
        ("commit p50 / p99", f"{fmt_ms(j['commit_p50_ms'])} / {fmt_ms(j['commit_p99_ms'])}"),
        ("first commit", fmt_stamp(j["first_commit_ms"])), ("last commit", fmt_stamp(j["last_commit_ms"])),
    ]))
    if j["recent_batches"]:
        print(f"\nlatest {len(j['recent_batches'])} batches:")
        print(table(BATCH_HEADERS, _batch_rows(j["recent_batches"]), right=BATCH_RIGHT))
    return 0


#: The Host names a loopback-bound API answers to (besides the address it is bound to).
LOOPBACK_HOST_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only: ``localhost``, any address of
    127.0.0.0/8, ``::1`` (bracketed or not), or an IPv4-mapped loopback address."""
    h = host.strip().lower().removeprefix("[").removesuffix("]")
    if h in ("localhost", "localhost."):
        return True
    try:
        addr = ipaddress.ip_address(h.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def loopback_host_names(host: str) -> list[str]:
    """The Host names a server bound to loopback ``host`` accepts: the loopback names and ``host``
    itself (an IPv6 address also in brackets, as a Host header carries it)."""
    names = list(LOOPBACK_HOST_NAMES)
    h = host.strip().lower().removeprefix("[").removesuffix("]")
    for name in (h, f"[{h}]" if ":" in h else h):
        if name not in names:
            names.append(name)
    return names


def cmd_api(args: argparse.Namespace) -> int:
    """Serve the control plane (flags override the ``PULSAR_TXN_*`` environment)."""
    try:
        import uvicorn
        from pydantic import ValidationError
        from sqlalchemy.engine import make_url

        from coordinator_api.app import create_app
        from coordinator_api.server import uvicorn_options
        from coordinator_api.settings import Settings
    except ImportError as exc:
        print(f"error: the control plane needs the api extra (pip install 'pulsar-txn[api]'): {exc}",
              file=sys.stderr)
        return 1
    import logging

    given = {"service_url": args.service_url, "admin_url": args.admin_url, "database_url": args.database_url,
             "ledger_topics": args.ledger_topics}
    if is_loopback(args.host) and not os.environ.get("PULSAR_TXN_TRUSTED_HOSTS"):
        # Bound to loopback: answer the loopback names only, so a page whose name an attacker
        # rebinds to this address (DNS rebinding) is refused.
        given["trusted_hosts"] = ",".join(loopback_host_names(args.host))
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        print(f"error: invalid settings: {why}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        db = make_url(settings.database_url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - the app reports a bad URL itself
        db = "(unparsable URL)"
    print(f"control plane on http://{args.host}:{args.port}: broker {settings.service_url} "
          f"(admin {settings.admin_url}), database {db}", file=sys.stderr, flush=True)
    if not settings.tokens:
        print("note: PULSAR_TXN_API_TOKEN is not set, so replays and aborts are refused", file=sys.stderr, flush=True)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it: end with status 0 instead.
    previous = signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level,
                    **uvicorn_options(settings))
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _exit_cleanly(signum: int, frame: Any) -> None:
    raise SystemExit(0)


# ----------------------------------------------------------------------------- argument parsing


def _bounded(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo} and {hi}")
        return v
    return parse


_SPAN = re.compile(r"(\d+)(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_since(text: str) -> int:
    """Epoch milliseconds, or a span back from now: ``90s``, ``15m``, ``2h``, ``1d``."""
    if text.isdigit():
        return int(text)
    m = _SPAN.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r}: give epoch milliseconds or a span like 15m, 2h, 1d")
    return max(0, int(time.time() * 1000) - int(m.group(1)) * _UNIT_MS[m.group(2)])


def _upper(choices: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.upper() not in choices:
            raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(choices)}")
        return text.upper()
    return parse


def _first_token(value: str | None) -> str | None:
    """The server's variable may list several tokens; the client sends the first."""
    if not value:
        return None
    return next((t.strip() for t in value.split(",") if t.strip()), None)


def register(sub: Any) -> None:
    """Add ``api``, ``txns``, ``batches`` and ``jobs`` to ``pulsar-txn``'s subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("control plane")
    g.add_argument("--api-url", default=os.environ.get(ENV_URL) or DEFAULT_URL,
                   help=f"control-plane URL (default ${ENV_URL} or {DEFAULT_URL})")
    g.add_argument("--token", default=_first_token(os.environ.get(ENV_TOKEN)),
                   help=f"bearer token for replays and aborts (default ${ENV_TOKEN})")
    g.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    g.add_argument("--http-timeout", type=float, default=30.0, help="seconds to wait for each answer")

    def paging(p: argparse.ArgumentParser) -> None:
        p.add_argument("--limit", type=_bounded(1, 1000), default=50, help="rows per page (1-1000)")
        p.add_argument("--offset", type=_bounded(0, 10_000_000), default=0, help="rows to skip")

    a = sub.add_parser("api", help="run the control plane (REST API, dashboard, ledger projection)")
    a.add_argument("--host", default="127.0.0.1", help="address to listen on")
    a.add_argument("--port", type=_bounded(1, 65535), default=8000)
    a.add_argument("--service-url", default=None, help="broker URL (default $PULSAR_TXN_SERVICE_URL)")
    a.add_argument("--admin-url", default=None, help="broker admin URL (default $PULSAR_TXN_ADMIN_URL)")
    a.add_argument("--database-url", default=None, help="SQLAlchemy URL (default $PULSAR_TXN_DATABASE_URL)")
    a.add_argument("--ledger-topics", default=None,
                   help="comma-separated ledger topics (default $PULSAR_TXN_LEDGER_TOPICS; discovery only in "
                        "$PULSAR_TXN_DISCOVER_NAMESPACES)")
    a.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    a.set_defaults(func=cmd_api)

    t = sub.add_parser("txns", help="transactions: list, show, abort (via the control plane)")
    ts = t.add_subparsers(dest="txns_command", required=True)
    tl = ts.add_parser("list", parents=[common], help="transactions from the ledger, newest first")
    tl.add_argument("--state", type=_upper(TXN_STATES), default=None, help="OPEN, COMMITTED or ABORTED")
    tl.add_argument("--job", default=None)
    tl.add_argument("--since", type=parse_since, default=None, help="started at or after: epoch ms, or 15m, 2h...")
    paging(tl)
    tl.set_defaults(func=_guarded(cmd_txns_list))
    tsh = ts.add_parser("show", parents=[common], help="one transaction: ledger records and live state")
    tsh.add_argument("txn_id", metavar="TXN_ID", help="'(most,least)' or most:least")
    tsh.add_argument("--ledger-topic", default=None, help="the transaction's ledger topic (if its id is in several)")
    tsh.set_defaults(func=_guarded(cmd_txns_show))
    ta = ts.add_parser("abort", parents=[common], help="abort a stuck open transaction (needs --token)")
    ta.add_argument("txn_id", metavar="TXN_ID")
    ta.set_defaults(func=_guarded(cmd_txns_abort))

    b = sub.add_parser("batches", help="batches: list, show, replay (via the control plane)")
    bs = b.add_subparsers(dest="batches_command", required=True)
    bl = bs.add_parser("list", parents=[common], help="batches from the ledger, newest first")
    bl.add_argument("--job", default=None)
    bl.add_argument("--status", type=_upper(BATCH_STATUSES), default=None, help=", ".join(BATCH_STATUSES))
    paging(bl)
    bl.set_defaults(func=_guarded(cmd_batches_list))
    bsh = bs.add_parser("show", parents=[common], help="one batch, its ledger records and its replay")
    bsh.add_argument("batch_id", metavar="BATCH_ID")
    bsh.add_argument("--ledger-topic", default=None, help="the batch's ledger topic (if its id is in several)")
    bsh.set_defaults(func=_guarded(cmd_batches_show))
    br = bs.add_parser("replay", parents=[common], help="replay a parked batch exactly once (needs --token)")
    br.add_argument("batch_id", metavar="BATCH_ID")
    br.add_argument("--ledger-topic", default=None, help="the batch's ledger topic (if its id is in several)")
    br.add_argument("--wait", action="store_true", help="follow the replay until it ends (exit 1 if it failed)")
    br.add_argument("--wait-timeout", type=float, default=600.0, help="give up waiting after this many seconds")
    br.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    br.set_defaults(func=_guarded(cmd_batches_replay))

    j = sub.add_parser("jobs", parents=[common], help="jobs: batches by status, volumes, commit latency")
    j.add_argument("job", metavar="JOB", nargs="?", default=None, help="one job, with its latest batches")
    j.add_argument("--recent", type=_bounded(0, 1000), default=10, help="latest batches to show for JOB")
    j.set_defaults(func=_guarded(cmd_jobs))


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``func`` with API and connection errors turned into a message and exit status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except (ApiError, Unreachable) as exc:
            print(f"error: {escape(exc)}", file=sys.stderr)
            return 1

    run.__name__ = run.__qualname__ = func.__name__
    run.__doc__ = func.__doc__
    return run
