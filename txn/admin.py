"""A minimal client for Pulsar's admin REST API (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def admin_request(
    method: str, admin_url: str, path: str, body: Any = None, timeout: float = 10.0, token: str | None = None
) -> tuple[int, Any]:
    """Call the admin REST API; return ``(status, parsed JSON or text)``.

    ``token`` is sent as a bearer token. HTTP error statuses are returned, not raised;
    connection failures raise OSError.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(admin_url.rstrip("/") + path, data=data, method=method)
    req.add_header("Accept", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
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
