"""Pulsar's admin REST API (stdlib only): the one request helper, and the calls the library,
the faces and the shell share (namespaces, deduplication, partitioned topics)."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

from .errors import PulsarError

if TYPE_CHECKING:
    from .auth import Authentication

__all__ = [
    "AdminError",
    "admin_request",
    "create_namespace",
    "create_partitioned_topic",
    "enable_namespace_dedup",
    "set_namespace_retention",
    "expect",
    "topic_path",
]


class AdminError(RuntimeError):
    """An admin REST call returned an unexpected status."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {str(body)[:500]}")
        self.status = status
        self.body = body


def admin_request(
    method: str,
    admin_url: str,
    path: str,
    body: Any = None,
    timeout: float = 10.0,
    token: str | Authentication | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, Any]:
    """Call the admin REST API; return ``(status, parsed JSON or text)``.

    ``token`` is sent as a bearer token, or is an :class:`~txn.auth.Authentication` whose HTTP
    headers are sent (asked for at each request, so a refreshed OAuth2 token is used);
    ``context`` verifies an ``https://`` admin URL (and may hold a client certificate). HTTP
    error statuses are returned, not raised; connection failures (and credentials that cannot be
    had) raise OSError.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(admin_url.rstrip("/") + path, data=data, method=method)
    req.add_header("Accept", "application/json")
    if isinstance(token, str):
        if token:
            req.add_header("Authorization", f"Bearer {token}")
    elif token is not None:
        for name, value in _auth_headers(token).items():
            req.add_header(name, value)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode("utf-8", "replace")
    if not text:
        return status, None
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _auth_headers(auth: Authentication) -> dict[str, str]:
    """``auth``'s HTTP headers; credentials that cannot be had raise an OSError, as an unreachable
    admin API does (ConnectionError if trying again may help, else PermissionError)."""
    try:
        return auth.http_headers()
    except PulsarError as exc:
        kind = ConnectionError if exc.retriable else PermissionError
        raise kind(f"no credentials for the admin API: {exc}") from exc


def expect(status_body: tuple[int, Any], method: str, path: str, ok: tuple[int, ...] = (200, 204)) -> Any:
    """The body of an :func:`admin_request` answer whose status is in ``ok``; else AdminError."""
    status, body = status_body
    if status not in ok:
        raise AdminError(method, path, status, body)
    return body


def topic_path(topic: str) -> str:
    """``persistent://t/ns/name`` -> ``persistent/t/ns/name`` (URL-quoted name)."""
    m = re.fullmatch(r"(persistent|non-persistent)://([^/]+)/([^/]+)/(.+)", topic)
    if not m:
        raise ValueError(f"expected a fully qualified topic name, got {topic!r}")
    domain, tenant, ns, name = m.groups()
    return f"{domain}/{tenant}/{ns}/{urllib.parse.quote(name, safe='')}"


def create_namespace(admin_url: str, namespace: str) -> None:
    """Create ``tenant/namespace`` (HTTP 409 if it already exists raises AdminError)."""
    path = f"/admin/v2/namespaces/{namespace}"
    expect(admin_request("PUT", admin_url, path, {}), "PUT", path)


def enable_namespace_dedup(admin_url: str, namespace: str) -> None:
    """Enable broker-side message deduplication for every topic in ``namespace``."""
    path = f"/admin/v2/namespaces/{namespace}/deduplication"
    expect(admin_request("POST", admin_url, path, True), "POST", path)


def set_namespace_retention(admin_url: str, namespace: str, minutes: int, size_mb: int) -> None:
    """Keep every topic's data in ``namespace`` for ``minutes`` (up to ``size_mb`` per topic) even
    once every subscription acknowledged it (Pulsar's default retention keeps nothing then)."""
    path = f"/admin/v2/namespaces/{namespace}/retention"
    body = {"retentionTimeInMinutes": minutes, "retentionSizeInMB": size_mb}
    expect(admin_request("POST", admin_url, path, body), "POST", path)


def create_partitioned_topic(admin_url: str, topic: str, n: int) -> None:
    """Create a partitioned topic with ``n`` partitions (AdminError if it exists)."""
    path = f"/admin/v2/{topic_path(topic)}/partitions"
    expect(admin_request("PUT", admin_url, path, n), "PUT", path)
