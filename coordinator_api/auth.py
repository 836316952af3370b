"""Bearer-token checks: mutating endpoints always, reads when ``read_requires_token`` is set."""

from __future__ import annotations

import hmac

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer = HTTPBearer(auto_error=False, description="PULSAR_TXN_API_TOKEN")


def _check(request: Request, creds: HTTPAuthorizationCredentials | None) -> None:
    tokens: list[str] = request.app.state.core.settings.tokens
    if creds is None or not creds.credentials:
        raise HTTPException(401, "this endpoint needs 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    if not tokens:
        raise HTTPException(403, "no API token is configured on the server (set PULSAR_TXN_API_TOKEN)")
    given = creds.credentials.encode()
    if not any(hmac.compare_digest(given, t.encode()) for t in tokens):
        raise HTTPException(403, "invalid API token")


def require_write(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
    """Dependency of mutating endpoints: a valid bearer token (401 without one, 403 if wrong)."""
    _check(request, creds)


async def require_read(request: Request) -> None:
    """Dependency of read endpoints: a valid bearer token if the server requires it for reads.

    (The header is read directly rather than through a security dependency, so the setting can
    change at start-up; the OpenAPI spec declares the bearer token on reads exactly when it is set,
    see ``app.secure_reads``.)"""
    if request.app.state.core.settings.read_requires_token:
        _check(request, await bearer(request))
